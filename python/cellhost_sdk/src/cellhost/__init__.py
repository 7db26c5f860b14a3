"""cellhost: persistent Python kernels for agents, from Python.

>>> from cellhost import Session
>>> with Session() as s:
...     s.run("x = 6 * 7")
...     print(s.run("x").value)
42

:class:`Session` starts a private ``cellhost serve`` (the binary this
wheel installed) on a loopback port with a random token and talks to it
over the HTTP API; :class:`AsyncSession` is the asyncio form;
:mod:`cellhost.e2b` an E2B-compatible facade.
"""

from .errors import (
    CellhostError,
    FileError,
    FileNotFound,
    FileTooLarge,
    HostError,
    InvalidRequest,
    KernelFailed,
    NotSupported,
    PathRefused,
    SandboxError,
    SessionBusy,
    SessionNotFound,
    Unavailable,
)
from .files import FileEntry, Files
from .result import CellError, Image, Result
from .session import AsyncSession, NotebookRun, Session, Submitted

__all__ = [
    "AsyncSession", "CellError", "CellhostError", "FileEntry", "FileError", "FileNotFound", "FileTooLarge", "Files",
    "HostError", "Image", "InvalidRequest", "KernelFailed", "NotSupported", "NotebookRun", "PathRefused", "Result",
    "SandboxError", "Session", "SessionBusy", "SessionNotFound", "Submitted", "Unavailable",
]
