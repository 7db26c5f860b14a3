"""An E2B code-interpreter compatible facade: ``from cellhost.e2b import
Sandbox`` in place of ``from e2b_code_interpreter import Sandbox``.

``Sandbox().run_code(code)`` returns an :class:`Execution` with
``.results`` (one :class:`ResultItem` per display and the final value),
``.logs`` (``.stdout``/``.stderr`` lists), ``.error`` (``.name``,
``.value``, ``.traceback``) and ``.text`` (the final value's text).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from .result import Result as _Result
from .session import Session


@dataclass
class Logs:
    """Output of the cell by stream, as E2B gives it (lists of chunks)."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """The cell's exception."""

    name: str
    value: str
    traceback: str


@dataclass
class ResultItem:
    """One displayed value: its formats (``text``, ``png`` base64, ...)."""

    raw: Dict[str, Any]
    is_main_result: bool = False

    @property
    def text(self) -> Optional[str]:
        v = self.raw.get("text/plain")
        return v if isinstance(v, str) else None

    @property
    def png(self) -> Optional[str]:
        v = self.raw.get("image/png")
        if isinstance(v, dict) and v.get("path"):
            with open(v["path"], "rb") as f:
                return base64.b64encode(f.read()).decode()
        return None

    @property
    def html(self) -> Optional[str]:
        v = self.raw.get("text/html")
        return v if isinstance(v, str) else None

    def formats(self) -> List[str]:
        return list(self.raw)


@dataclass
class Execution:
    """What ``run_code`` did."""

    results: List[ResultItem]
    logs: Logs
    error: Optional[ExecutionError]
    execution_count: int

    @property
    def text(self) -> Optional[str]:
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


def _execution(r: _Result) -> Execution:
    items = [ResultItem(d.get("data") or {}) for d in r.raw.get("displays") or []]
    if r.result:
        items.append(ResultItem(r.result, is_main_result=True))
    err = None
    if r.error:
        err = ExecutionError(r.error.ename, r.error.evalue, "\n".join(r.error.traceback))
    elif r.status != "ok":
        err = ExecutionError(r.status, r.text, "")
    logs = Logs([r.stdout] if r.stdout else [], [r.stderr] if r.stderr else [])
    return Execution(items, logs, err, r.execution_count)


class Sandbox:
    """A local persistent kernel with E2B's ``Sandbox`` surface."""

    def __init__(self, timeout: Optional[float] = None, **kwargs: Any):
        self._session = Session(**kwargs)
        self.sandbox_id = self._session.name

    @classmethod
    def create(cls, **kwargs: Any) -> "Sandbox":
        return cls(**kwargs)

    def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        on_stdout: Optional[Callable[[Any], None]] = None,
        on_stderr: Optional[Callable[[Any], None]] = None,
        timeout: Optional[float] = None,
        **_: Any,
    ) -> Execution:
        cb = None
        if on_stdout or on_stderr:
            def cb(stream: str, text: str) -> None:
                f = on_stdout if stream == "stdout" else on_stderr
                if f:
                    f(text)
        return _execution(self._session.run(code, timeout=timeout, on_output=cb))

    def kill(self) -> None:
        self._session.close()

    close = kill

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
