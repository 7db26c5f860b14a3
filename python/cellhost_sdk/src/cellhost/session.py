"""Sessions: :class:`Session` (sync) and :class:`AsyncSession` (asyncio)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Tuple

from ._host import Host, raise_for_event
from .errors import CellhostError, InvalidRequest, NotSupported
from .result import Result

#: Seconds the HTTP read waits beyond a cell's own deadline.
MARGIN_S = 30.0


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
    ``limits`` config keys for the host (``{"cell_timeout_s": 60}``),
    ``language`` ``"python"``, ``placement`` ``"local"`` (the only one this
    package starts), ``tools`` host tools as callables, called from cells as
    ``cellhost.tools.NAME(**kwargs)``. Use it as a context manager; the
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
    ):
        if language != "python":
            raise InvalidRequest("invalid_request", f"language {language!r}: this host runs python")
        if placement != "local":
            raise InvalidRequest("invalid_request", f"placement {placement!r}: this package starts local hosts only")
        self.name = name
        self._host = Host(python=python, sandbox=sandbox, limits=limits, tools=tools)
        self._path = "/v1/sessions/" + urllib.parse.quote(name, safe="")
        try:
            body: Dict[str, Any] = {"name": name}
            if sandbox:
                body["sandbox"] = sandbox
            self._host.call("POST", "/v1/sessions", body, timeout=120)
        except BaseException:
            self._host.close()
            raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the kernel and the host."""
        self._host.close()

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
        self, path: str, parameters: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None
    ) -> List[Result]:
        """Runs the code cells of an ``.ipynb`` in order in this session,
        after a cell assigning ``parameters`` (``name = repr(value)``); stops
        at the first cell whose status is not ``ok``. Returns the results."""
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
        results: List[Result] = []
        if parameters:
            for k in parameters:
                if not str(k).isidentifier():
                    raise InvalidRequest("invalid_request", f"parameter {k!r} is not an identifier")
            results.append(self.run("\n".join(f"{k} = {v!r}" for k, v in parameters.items()), timeout=timeout))
        for c in cells:
            src = c.get("source", "")
            r = self.run("".join(src) if isinstance(src, list) else str(src), timeout=timeout)
            results.append(r)
            if r.status != "ok":
                break
        return results


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

    async def interrupt(self) -> Dict[str, Any]:
        """:meth:`Session.interrupt`."""
        return await asyncio.to_thread(self.sync.interrupt)

    async def restart(self) -> Dict[str, Any]:
        """:meth:`Session.restart`."""
        return await asyncio.to_thread(self.sync.restart)

    async def variables(self) -> List[Dict[str, Any]]:
        """:meth:`Session.variables`."""
        return await asyncio.to_thread(self.sync.variables)

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
