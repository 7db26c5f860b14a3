"""A cell's result: :class:`Result`, built from the HTTP API's ``CellResult``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class Image:
    """A figure or displayed image the host saved: its MIME type, the path
    of the file on the host, and its bytes (read when first asked for)."""

    mime: str
    path: str

    @property
    def bytes(self) -> bytes:
        """The image file's bytes."""
        with open(self.path, "rb") as f:
            return f.read()


@dataclass(frozen=True)
class CellError:
    """The exception a cell raised: ``ename``, ``evalue``, ``traceback`` lines."""

    ename: str
    evalue: str
    traceback: List[str]


@dataclass(frozen=True)
class Result:
    """What one cell did.

    ``status`` is ``ok``, ``error``, ``timeout``, ``interrupted`` or
    ``crashed``; ``stdout``/``stderr`` the rendered (and possibly cut) streams;
    ``result`` the MIME bundle of the last expression (``None`` without one);
    ``images`` every figure, displays first; ``error`` the exception;
    ``truncated`` the cut streams (``{stream: {total_bytes, shown_bytes, ...}}``);
    ``kernel`` session, generation, pid, ``state_reset``; ``text`` the
    agent-facing text (status first), as the MCP tool gives it; ``raw`` the
    whole ``CellResult`` JSON.
    """

    status: str
    stdout: str
    stderr: str
    result: Optional[Dict[str, Any]]
    images: List[Image]
    error: Optional[CellError]
    truncated: Dict[str, Any]
    kernel: Dict[str, Any]
    cell_id: str
    execution_count: int
    raw: Dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        """The cell finished without an exception."""
        return self.status == "ok"

    @property
    def restored(self) -> Optional[Dict[str, Any]]:
        """What a restore brought back before this cell (the session keeps
        checkpoints or replays, and its kernel was lost or paused):
        ``source`` (``"checkpoint"``, ``"replay"``, ``"checkpoint+replay"``),
        ``execution_count``, ``restored`` names, ``lost`` names with the
        reason, ``lost_cells``, ``resumed`` (a paused session), and for a
        replay ``replay`` (``replayed`` cells, the ``failed`` one, ``cut``
        when a bound stopped it); ``None`` when no restore preceded the
        cell."""
        r = self.raw.get("restored")
        return r if isinstance(r, dict) else None

    @property
    def value(self) -> Optional[str]:
        """The ``text/plain`` form of the last expression's value."""
        if self.result and isinstance(self.result.get("text/plain"), str):
            return self.result["text/plain"]
        return None

    @property
    def text(self) -> str:
        """Status line, stdout, stderr, the value, the error with its
        traceback, figures and truncation notes: the text an agent reads."""
        return render_text(self.raw)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Result":
        """A result from the ``CellResult`` JSON of the HTTP API."""
        images: List[Image] = []
        bundles = [x.get("data") or {} for x in d.get("displays") or []]
        if d.get("result"):
            bundles.append(d["result"])
        for b in bundles:
            for mime in ("image/png", "image/jpeg", "image/svg+xml"):
                v = b.get(mime)
                if isinstance(v, dict) and isinstance(v.get("path"), str):
                    images.append(Image(mime, v["path"]))
                    break
        e = d.get("error")
        return cls(
            status=str(d.get("status", "")),
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            result=d.get("result"),
            images=images,
            error=CellError(e.get("ename", ""), e.get("evalue", ""), list(e.get("traceback") or [])) if e else None,
            truncated=dict(d.get("truncated") or {}),
            kernel=dict(d.get("kernel") or {}),
            cell_id=str(d.get("cell_id", "")),
            execution_count=int(d.get("execution_count") or 0),
            raw=d,
        )


def _section(out: List[str], name: str, body: str) -> None:
    if body:
        out.append(f"--- {name} ---\n" + (body if body.endswith("\n") else body + "\n"))


def render_text(d: Dict[str, Any]) -> str:
    """The agent-facing text of a ``CellResult`` (the layout of the MCP
    server's ``render::text``)."""
    k = d.get("kernel") or {}
    out = [
        f"status: {d.get('status')} (execution_count {d.get('execution_count')}, {d.get('duration_ms')} ms, "
        f"session \"{k.get('session')}\", kernel generation {k.get('generation')})\n"
    ]
    if k.get("state_reset"):
        why = k.get("reset_reason") or "a new kernel"
        out.append(f"STATE RESET: variables of earlier cells are gone ({why}); re-run the cells that define them.\n")
    _section(out, "stdout", d.get("stdout") or "")
    _section(out, "stderr", d.get("stderr") or "")
    res = d.get("result")
    if res:
        shown = res.get("text/plain") if isinstance(res.get("text/plain"), str) else f"(a value shown as {', '.join(res)})"
        _section(out, "result", shown)
    e = d.get("error")
    if e:
        body = f"{e.get('ename')}: {e.get('evalue')}"
        if e.get("traceback"):
            body += "\n" + "\n".join(e["traceback"])
        _section(out, "error", body)
    for stream, t in (d.get("truncated") or {}).items():
        out.append(
            f"[{stream} truncated: {t.get('shown_bytes')} of {t.get('total_bytes')} bytes shown, "
            f"{t.get('omitted_bytes')} omitted from the middle.]\n"
        )
    if d.get("hint"):
        out.append(f"hint: {d['hint']}\n")
    out.append(f"cell id: {d.get('cell_id')}")
    return "".join(out)
