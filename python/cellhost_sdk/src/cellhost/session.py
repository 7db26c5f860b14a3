"""Sessions: :class:`Session` (sync) and :class:`AsyncSession` (asyncio)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._host import Host, raise_for_event
from .files import Files
from .errors import CellhostError, InvalidRequest, NotSupported
from .result import Result

#: Seconds the HTTP read waits beyond a cell's own deadline.
MARGIN_S = 30.0

#: Keys of ``Session(limits=...)`` sent as the session's own limits
#: (``POST /v1/sessions {"limits": ...}``); other keys configure the host.
SESSION_LIMITS = ("memory_mb", "pids", "cpu", "disk_mb", "cell_timeout_s")


class Submitted:
    """A cell submitted without waiting (``POST /v1/sessions/{name}/cells``):
    ``cell`` its id, ``raw`` the host's answer."""

    def __init__(self, raw: Dict[str, Any]):
        self.raw = raw
        self.cell = str(raw.get("cell") or raw.get("cell_id") or "")


class Session:
    """A persistent Python session on a local cellhost host.

    ``python`` is the interpreter of the kernel (default: the host's
    choice), ``sandbox`` a mode (``auto``, ``enforce``, ``off``, ...),
    ``limits`` the session's limits (``memory_mb``, ``pids``, ``cpu``,
    ``disk_mb``, ``cell_timeout_s``: sent with the session, bounded by the
    host's maximum; any other key is a config key of the host),
    ``language`` ``"python"`` or ``"r"``, ``network`` ``"off"`` (default),
    ``"on"`` or a list of ``"HOST[:PORT]"`` rules reached through the
    host's egress proxy, ``placement`` ``"local"`` or the name of a
    ``[placement.NAME]`` table of the cellhost config file (a Slurm, SSH or
    Kubernetes node), ``checkpoint`` ``"off"``, ``"namespace"`` (after
    each successful cell the picklable part of the namespace is saved; a
    lost kernel is restored from it before the next cell, whose
    :attr:`~cellhost.result.Result.restored` says what came back) or
    ``"process"`` (refused where CRIU cannot run), ``restore`` what the
    session gets back after an unexpected death of its kernel:
    ``"checkpoint"`` (its latest checkpoint), ``"replay"`` (the checkpoint if
    any, then the lost kernel's successful cells after it, run again
    silently and stopping at the first that fails; the next result's
    :attr:`~cellhost.result.Result.restored` names the cells replayed,
    failed and lost) or ``"none"``, ``tools`` host tools as callables, called from cells
    as ``cellhost.tools.NAME(**kwargs)``. Use it as a context manager; the
    kernel and its host end at :meth:`close`.
    """

    def __init__(
        self,
        python: Optional[str] = None,
        sandbox: Optional[str] = None,
        limits: Optional[Mapping[str, Any]] = None,
        language: str = "python",
        placement: str = "local",
        tools: Optional[Mapping[str, Callable[..., Any]]] = None,
        name: str = "default",
        network: Optional[Union[str, Sequence[str]]] = None,
        checkpoint: Optional[str] = None,
        restore: Optional[str] = None,
    ):
        if language not in ("python", "r"):
            raise InvalidRequest("invalid_request", f"language {language!r}: this host runs python or r")
        if not placement or not placement.replace("-", "").replace("_", "").isalnum():
            raise InvalidRequest("invalid_request", f"placement {placement!r}: not a placement name")
        self.name = name
        self._owns_host = True
        #: A fork's report (:meth:`fork`); ``None`` for a session made here.
        self.fork_report: Optional[Dict[str, Any]] = None
        session_limits = {k: v for k, v in (limits or {}).items() if k in SESSION_LIMITS}
        host_keys = {k: v for k, v in (limits or {}).items() if k not in SESSION_LIMITS}
        self._host = Host(python=python, sandbox=sandbox, limits=host_keys, tools=tools)
        self._path = "/v1/sessions/" + urllib.parse.quote(name, safe="")
        #: The session's files (:class:`~cellhost.files.Files`): upload,
        #: download, list, delete, by paths relative to its workdir.
        self.files = Files(self._host, self._path)
        try:
            body: Dict[str, Any] = {"name": name}
            if sandbox:
                body["sandbox"] = sandbox
            if language != "python":
                body["language"] = language
            if session_limits:
                body["limits"] = session_limits
            if network is not None:
                body["network"] = network if isinstance(network, str) else list(network)
            if checkpoint is not None:
                body["checkpoint"] = checkpoint
            if restore is not None:
                body["restore"] = restore
            if placement != "local":
                # The session's own property: every kernel of it runs there.
                body["placement"] = placement
            self._host.call("POST", "/v1/sessions", body, timeout=120)
        except BaseException:
            self._host.close()
            raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the kernel and the host (a fork: its own session only;
        the host is its parent's)."""
        if self._owns_host:
            self._host.close()
            return
        try:
            self._host.call("DELETE", self._path)
        except CellhostError:
            pass  # the parent's host is gone, and the fork with it

    def fork(self, name: str, threads: str = "refuse") -> "Session":
        """Forks this live, idle session into the new session ``name``
        (``POST /v1/sessions/{name}/fork``): the same variables, imports,
        execution count and a copy of the working directory, as a kernel of
        its own. Returns the new :class:`Session` on the same host (its
        :meth:`close` ends that session only; :attr:`fork_report` says what
        was carried, and ``fork_report["method"]`` how: ``"cow"``, a
        copy-on-write fork of a sandbox-off parent, or ``"pickle"``, with
        ``fork_report["pickle_reason"]``). ``threads``: ``"refuse"`` (threads of the cells make
        the fork fail with ``threads_running``) or ``"drop"``. A running cell
        raises :class:`~cellhost.errors.SessionBusy`, a taken name
        ``session_exists``."""
        report = self._host.call("POST", self._path + "/fork", {"name": name, "threads": threads}, timeout=1260)
        child = Session.__new__(Session)
        child.name = name
        child._owns_host = False
        child._host = self._host
        child._path = "/v1/sessions/" + urllib.parse.quote(name, safe="")
        child.files = Files(self._host, child._path)
        child.fork_report = report
        return child

    def run(
        self,
        code: str,
        timeout: Optional[float] = None,
        on_output: Optional[Callable[[str, str], None]] = None,
        queue: bool = False,
    ) -> Result:
        """Runs one cell and returns its :class:`~cellhost.result.Result`.

        ``timeout`` is the cell's deadline in seconds (host default 300,
        0 = none); ``on_output(stream, text)`` receives live output
        (``stdout``/``stderr``) while the cell runs. An exception in the
        cell is ``status == "error"``, not a raised exception; a request
        that fails raises :class:`~cellhost.errors.CellhostError`.
        """
        body: Dict[str, Any] = {"code": code}
        if timeout is not None:
            body["timeout_s"] = timeout
        if queue:
            body["queue"] = True
        read = None if not timeout else timeout + MARGIN_S
        if on_output is None:
            return Result.from_json(self._host.call("POST", self._path + "/execute", body, timeout=read))
        for event, data in self._host.events(self._path + "/execute", body, read):
            raise_for_event(event, data)
            if event == "stream":
                on_output(str(data.get("name")), str(data.get("text")))
            elif event == "result":
                return Result.from_json(data)
        raise CellhostError("internal", "the event stream ended without a result")

    def stream(self, code: str, timeout: Optional[float] = None):
        """The cell's events as they come: ``("stream", {"name", "text"})``,
        ``("display", {...})``, finally ``("result", Result)``."""
        body: Dict[str, Any] = {"code": code}
        if timeout is not None:
            body["timeout_s"] = timeout
        read = None if not timeout else timeout + MARGIN_S
        for event, data in self._host.events(self._path + "/execute", body, read):
            raise_for_event(event, data)
            yield (event, Result.from_json(data) if event == "result" else data)

    def pause(self) -> Dict[str, Any]:
        """Pauses the idle session: its namespace checkpointed, its kernel
        stopped (memory freed); the next :meth:`run` resumes it. The
        report: ``generation``, ``pid``, ``memory_freed_bytes``,
        ``paused_ms``, ``checkpoint``."""
        return self._host.call("POST", self._path + "/pause")

    def sessions(self) -> List[Dict[str, Any]]:
        """The sessions of this session's host: ``name``, ``state``
        (``"live"``, ``"paused"`` with ``paused_ms`` and the ``checkpoint``
        it resumes from, or ``"stopped"``), ``generation``, ``pid``, …"""
        return list(self._host.call("GET", "/v1/sessions").get("sessions", []))

    def interrupt(self) -> Dict[str, Any]:
        """Interrupts the running cell (KeyboardInterrupt in it)."""
        return self._host.call("POST", self._path + "/interrupt")

    def restart(self) -> Dict[str, Any]:
        """A fresh kernel: every variable of the session is dropped."""
        return self._host.call("POST", self._path + "/restart", timeout=120)

    def variables(self, limit: int = 200) -> List[Dict[str, Any]]:
        """The namespace: one dict a variable (name, type, shape, preview ...)."""
        return self._host.call("GET", f"{self._path}/variables?limit={int(limit)}")["variables"]

    def submit(self, code: str, timeout: Optional[float] = None) -> Submitted:
        """Submits a cell without waiting for it, where the host has the
        ``cells`` route; :class:`~cellhost.errors.NotSupported` otherwise."""
        body: Dict[str, Any] = {"code": code}
        if timeout is not None:
            body["timeout_s"] = timeout
        try:
            return Submitted(self._host.call("POST", self._path + "/cells", body))
        except NotSupported as e:
            raise NotSupported("not_found", "this host has no /cells route: " + e.message, e.status) from None

    def run_notebook(
        self,
        path: Union[str, "os.PathLike[str]"],
        parameters: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        allow_errors: bool = False,
    ) -> "NotebookRun":
        """Runs a notebook in this session through the host's
        ``POST /v1/notebooks/run``: an ``.ipynb`` (nbformat 4), or a
        percent-format script (``# %%`` cells) for any other suffix.

        ``parameters`` are injected as papermill does (a cell tagged
        ``injected-parameters`` after the cell tagged ``parameters``, else
        first; values JSON: ``None``, numbers, strings, lists, dicts).
        ``timeout`` is each cell's deadline in seconds. The run stops at the
        first failed cell unless ``allow_errors``; that is
        :attr:`NotebookRun.stop`, not an exception. The session's variables
        are seen by the notebook and kept after it."""
        with open(path, encoding="utf-8") as f:
            text = f.read()
        body: Dict[str, Any] = {"session": self.name}
        if str(path).endswith(".ipynb"):
            try:
                body["notebook"] = json.loads(text)
            except ValueError as e:
                raise InvalidRequest("invalid_request", f"{path}: not a notebook (JSON): {e}") from None
        else:
            body["script"] = text
        if parameters:
            body["parameters"] = dict(parameters)
        if timeout is not None:
            body["timeout_s"] = timeout
        if allow_errors:
            body["allow_errors"] = True
        return NotebookRun.from_json(self._host.call("POST", "/v1/notebooks/run", body, timeout=None))


@dataclass(frozen=True)
class NotebookRun:
    """What :meth:`Session.run_notebook` did: ``notebook`` the executed
    notebook (nbformat 4.5 JSON, outputs and figures embedded, as
    ``cellhost run`` writes it), ``total`` its code cells, ``ran`` those
    that ran, ``stop`` why it stopped early (``{"reason", "cell",
    "message", "status"}``; ``None``: every cell ran)."""

    notebook: Dict[str, Any]
    total: int
    ran: int
    stop: Optional[Dict[str, Any]]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "NotebookRun":
        return cls(
            notebook=dict(d.get("notebook") or {}),
            total=int(d.get("total") or 0),
            ran=int(d.get("ran") or 0),
            stop=d.get("stop"),
        )

    @property
    def ok(self) -> bool:
        """Every cell ran (no :attr:`stop`)."""
        return self.stop is None

    def outputs(self) -> List[List[Dict[str, Any]]]:
        """Each code cell's outputs (nbformat output dicts), in order."""
        return [c.get("outputs", []) for c in self.notebook.get("cells", []) if c.get("cell_type") == "code"]

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the executed notebook as an ``.ipynb`` file."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.notebook, f, indent=1, ensure_ascii=False)
            f.write("\n")


class AsyncSession:
    """:class:`Session` for asyncio: the same arguments and methods, as
    coroutines; :meth:`stream` is an async iterator of the cell's events."""

    def __init__(self, **kwargs: Any):
        self._kwargs = kwargs
        self._s: Optional[Session] = None

    async def __aenter__(self) -> "AsyncSession":
        self._s = await asyncio.to_thread(Session, **self._kwargs)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def sync(self) -> Session:
        """The underlying :class:`Session` (after ``async with``)."""
        if self._s is None:
            raise CellhostError("internal", "use `async with AsyncSession(...)` first")
        return self._s

    async def close(self) -> None:
        """Ends the kernel and the host."""
        if self._s is not None:
            await asyncio.to_thread(self._s.close)

    async def run(self, code: str, timeout: Optional[float] = None) -> Result:
        """:meth:`Session.run`."""
        return await asyncio.to_thread(self.sync.run, code, timeout)

    async def fork(self, name: str, threads: str = "refuse") -> "AsyncSession":
        """:meth:`Session.fork`: the new session as an :class:`AsyncSession`
        (``await fork.close()`` ends it)."""
        child = AsyncSession()
        child._s = await asyncio.to_thread(self.sync.fork, name, threads)
        return child

    async def interrupt(self) -> Dict[str, Any]:
        """:meth:`Session.interrupt`."""
        return await asyncio.to_thread(self.sync.interrupt)

    async def restart(self) -> Dict[str, Any]:
        """:meth:`Session.restart`."""
        return await asyncio.to_thread(self.sync.restart)

    async def variables(self) -> List[Dict[str, Any]]:
        """:meth:`Session.variables`."""
        return await asyncio.to_thread(self.sync.variables)

    async def run_notebook(
        self,
        path: Union[str, "os.PathLike[str]"],
        parameters: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        allow_errors: bool = False,
    ) -> NotebookRun:
        """:meth:`Session.run_notebook`."""
        return await asyncio.to_thread(self.sync.run_notebook, path, parameters, timeout, allow_errors)

    @property
    def files(self) -> "AsyncFiles":
        """:attr:`Session.files` with awaitable methods."""
        return AsyncFiles(self.sync.files)

    async def stream(self, code: str, timeout: Optional[float] = None) -> AsyncIterator[Tuple[str, Any]]:
        """The cell's events as :meth:`Session.stream` gives them."""
        loop = asyncio.get_running_loop()
        q: "asyncio.Queue[Any]" = asyncio.Queue()
        done = object()

        def pump() -> None:
            try:
                for ev in self.sync.stream(code, timeout):
                    loop.call_soon_threadsafe(q.put_nowait, ev)
            except BaseException as e:
                loop.call_soon_threadsafe(q.put_nowait, e)
            finally:
                loop.call_soon_threadsafe(q.put_nowait, done)

        threading.Thread(target=pump, daemon=True).start()
        while True:
            item = await q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class AsyncFiles:
    """:class:`~cellhost.files.Files` for asyncio: the same methods, as coroutines."""

    def __init__(self, files: Files):
        self._f = files

    async def upload(self, path: str, data: Any) -> Dict[str, Any]:
        """:meth:`Files.upload`."""
        return await asyncio.to_thread(self._f.upload, path, data)

    async def download(self, path: str, local: Any = None, range: Optional[Tuple[int, Optional[int]]] = None) -> bytes:
        """:meth:`Files.download`."""
        return await asyncio.to_thread(self._f.download, path, local, range)

    async def list(self, path: str = "") -> List[Any]:
        """:meth:`Files.list`."""
        return await asyncio.to_thread(self._f.list, path)

    async def delete(self, path: str) -> Dict[str, Any]:
        """:meth:`Files.delete`."""
        return await asyncio.to_thread(self._f.delete, path)
