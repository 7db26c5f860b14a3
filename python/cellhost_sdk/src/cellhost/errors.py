"""Exceptions carrying the request layer's stable error codes.

Every error answer of the HTTP API is ``{"error": {"code", "message", ...}}``;
:func:`from_envelope` turns it into the subclass for its code (the table of
codes is the README's "HTTP API" section), keeping every field.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


class CellhostError(Exception):
    """A request failed. ``code`` is the stable code (``session_busy``,
    ``kernel_failed``, ...), ``status`` the HTTP status (0 when the host
    could not be reached), ``fields`` the rest of the envelope."""

    code: str

    def __init__(self, code: str, message: str, status: int = 0, fields: Optional[Dict[str, Any]] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.fields: Dict[str, Any] = dict(fields or {})


class HostError(CellhostError):
    """The host process could not be started or reached (code ``host_unavailable``)."""


class SessionBusy(CellhostError):
    """A cell is running in the session and the call did not ask to queue."""


class SessionNotFound(CellhostError):
    """No such session for this owner."""


class InvalidRequest(CellhostError):
    """A value the API does not allow (``invalid_request``, ``bad_request``)."""


class KernelFailed(CellhostError):
    """The kernel could not start or failed (``kernel_failed``)."""


class SandboxError(CellhostError):
    """``sandbox_unavailable`` or ``sandbox_below_floor``."""


class Unavailable(CellhostError):
    """``registry_full``, ``shut_down``, ``too_many_sessions``."""


class NotSupported(CellhostError):
    """The host has no such route (``not_found`` for an API route)."""


class FileError(CellhostError):
    """A request on a session's files failed (``file_io_failed``,
    ``range_not_satisfiable``, and the subclasses' codes)."""


class PathRefused(FileError):
    """``path_refused``: the path leaves the session's workdir (``..``, an
    absolute path, a symlink out) or is not a plain path."""


class FileNotFound(FileError):
    """``file_not_found``: no such file or directory in the workdir."""


class FileTooLarge(FileError):
    """``file_too_large``: the upload is over the host's ``file_max_mb``."""


_BY_CODE = {
    "session_busy": SessionBusy,
    "session_not_found": SessionNotFound,
    "invalid_request": InvalidRequest,
    "bad_request": InvalidRequest,
    "kernel_failed": KernelFailed,
    "sandbox_unavailable": SandboxError,
    "sandbox_below_floor": SandboxError,
    "registry_full": Unavailable,
    "shut_down": Unavailable,
    "too_many_sessions": Unavailable,
    "not_found": NotSupported,
    "host_unavailable": HostError,
    "path_refused": PathRefused,
    "file_not_found": FileNotFound,
    "file_too_large": FileTooLarge,
    "file_io_failed": FileError,
    "range_not_satisfiable": FileError,
    "unsupported_language": InvalidRequest,
}


def from_envelope(status: int, body: Any) -> CellhostError:
    """The exception for an error answer (``body`` parsed JSON, or text)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return CellhostError("internal", f"HTTP {status}: {str(body)[:500]}", status)
    fields = {k: v for k, v in err.items() if k not in ("code", "message")}
    code = str(err.get("code", "internal"))
    cls = _BY_CODE.get(code, CellhostError)
    return cls(code, str(err.get("message", "")), status, fields)
