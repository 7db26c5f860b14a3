"""A session's files: :class:`Files`, over the HTTP API's ``…/files`` routes.

Paths are relative to the session's working directory (``/`` between
directories); the host refuses a path that leaves it (``..``, absolute
paths, a symlink out) with :class:`~cellhost.errors.PathRefused`. A write is
atomic (a reader sees the old file or the new one) and creates missing
directories; the host caps a file's size (``file_max_mb``, else
``file_too_large``). A file a cell wrote is there for the next
:meth:`Files.download` at once.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:
    from ._host import Host

#: Bytes read from the host at a time when a download goes to a local file.
CHUNK = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    """One entry of a listing: ``name``, ``path`` (relative to the
    workdir), ``type`` (``file``, ``dir``, ``symlink`` — never followed —
    or ``other``), ``size`` in bytes, ``mtime_ms`` (milliseconds since the
    Unix epoch) and ``url`` (its route on the host)."""

    name: str
    path: str
    type: str
    size: int
    mtime_ms: int
    url: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileEntry":
        return cls(
            name=str(d.get("name", "")),
            path=str(d.get("path", "")),
            type=str(d.get("type", "")),
            size=int(d.get("size") or 0),
            mtime_ms=int(d.get("mtime_ms") or 0),
            url=str(d.get("url", "")),
        )


def _route(path: str) -> str:
    # Each segment percent-encoded, `/` kept: the host's route spans segments.
    return "/".join(urllib.parse.quote(seg, safe="") for seg in str(path).split("/"))


class Files:
    """The files of one session (``Session.files``)."""

    def __init__(self, host: "Host", session_path: str):
        self._host = host
        self._path = session_path + "/files"

    def upload(self, path: str, data: Union[bytes, str, "os.PathLike[str]", IO[bytes]]) -> Dict[str, Any]:
        """Writes ``data`` to ``path`` in the session's workdir: ``bytes``,
        ``str`` (UTF-8), a local file's path (:class:`os.PathLike`, streamed)
        or a binary file object (streamed). Returns the host's answer:
        ``path``, ``size``, ``replaced``, ``url``."""
        if isinstance(data, os.PathLike):
            size = os.stat(data).st_size
            with open(data, "rb") as f:
                return self._put(path, f, size)
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
            return self._put(path, body, len(body))
        return self._put(path, data, None)

    def _put(self, path: str, body: Any, size: Optional[int]) -> Dict[str, Any]:
        headers = {"Content-Type": "application/octet-stream"}
        if size is not None:
            headers["Content-Length"] = str(size)
        with self._host.raw("PUT", f"{self._path}/{_route(path)}", body, headers) as resp:
            return self._host.parse(resp.read())

    def download(
        self,
        path: str,
        local: Optional[Union[str, "os.PathLike[str]"]] = None,
        range: Optional[Tuple[int, Optional[int]]] = None,
    ) -> bytes:
        """The bytes of ``path``; with ``local``, streamed into that local
        file instead (and ``b""`` returned). ``range=(start, end)`` asks for
        bytes ``start..=end`` (``end`` ``None``: to the end), as HTTP's
        ``Range``; past the end is ``range_not_satisfiable``."""
        headers = {}
        if range is not None:
            start, end = range
            headers["Range"] = f"bytes={int(start)}-{'' if end is None else int(end)}"
        with self._host.raw("GET", f"{self._path}/{_route(path)}", None, headers) as resp:
            if local is None:
                return resp.read()
            with open(local, "wb") as out:
                shutil.copyfileobj(resp, out, CHUNK)
            return b""

    def list(self, path: str = "") -> List[FileEntry]:
        """The entries of a directory of the workdir (default: the workdir
        itself), by name."""
        q = "?path=" + urllib.parse.quote(path, safe="") if path else ""
        answer = self._host.call("GET", self._path + q)
        return [FileEntry.from_json(e) for e in answer.get("entries", [])]

    def delete(self, path: str) -> Dict[str, Any]:
        """Removes a file, a link (never its target) or an empty directory.
        Returns ``{"path", "type"}`` of what was removed."""
        return self._host.call("DELETE", f"{self._path}/{_route(path)}")


__all__ = ["FileEntry", "Files"]
