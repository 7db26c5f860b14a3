"""The ``cellhost`` module that cells import: ``display``, ``call``, ``tools``."""
import itertools
import threading
import types

from . import display as _display
from . import state

channel = None  # set by main
_ids = itertools.count(1)
_waiting = {}            # call id -> [event, reply]
_waiting_lock = threading.Lock()
tool_names = ()


class ToolError(RuntimeError):
    """A host call failed (tool missing, budget spent, cell settled, tool error)."""


def call(name, args=None):
    """Call host tool ``name`` with a JSON-able ``args`` dict and return its result.

    Raises ``ToolError`` with the host's message when the call is refused or fails.
    """
    if channel is None or channel.disabled:
        raise ToolError("host calls are not available in this process")
    cell = state.current
    if cell is None or threading.get_ident() in state.background_idents:
        raise ToolError("host call from outside a running cell: a cell's tool authority ends when the cell settles")
    cid = "h%d" % next(_ids)
    slot = [threading.Event(), None]
    with _waiting_lock:
        _waiting[cid] = slot
    try:
        channel.send({"type": "host_call", "id": cid, "cell": cell, "method": name, "args": args if args is not None else {}})
        slot[0].wait()
    finally:
        with _waiting_lock:
            _waiting.pop(cid, None)
    reply = slot[1] or {}
    if reply.get("error") is not None:
        raise ToolError(reply["error"])
    return reply.get("data")


def deliver(frame):
    """Reader thread: hand a host_response to the thread waiting for it."""
    with _waiting_lock:
        slot = _waiting.get(frame.get("id"))
    if slot is not None:
        slot[1] = frame
        slot[0].set()


class _Tools:
    """``cellhost.tools.NAME(**kwargs)`` calls host tool NAME."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def tool(**kwargs):
            return call(name, kwargs)

        tool.__name__ = name
        return tool

    def __dir__(self):
        return list(tool_names)

    def __repr__(self):
        return "<cellhost tools: %s>" % (", ".join(tool_names) or "none enabled")


def make_module():
    mod = types.ModuleType("cellhost", "Cell-facing API of the cellhost kernel host.")
    mod.display = _display.display
    mod.call = call
    mod.tools = _Tools()
    mod.ToolError = ToolError
    return mod
