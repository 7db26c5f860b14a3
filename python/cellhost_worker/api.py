"""The ``cellhost`` module that cells import: ``display``, ``call``, ``tools``."""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import itertools
import types

from . import display as _display
from . import prims, state

channel = None  # set by main
_ids = itertools.count(1)
_waiting = {}            # call id -> [event, reply]
_waiting_lock = prims.allocate_lock()
tool_names = ()


class ToolError(RuntimeError):
    """A host call failed (tool missing, budget spent, cell settled, tool error)."""


def call(name, args=None, poll=None):
    """Call host tool ``name`` with a JSON-able ``args`` dict and return its result.

    ``poll``, when given, is called about every 0.1 s while the answer is
    awaited, on the calling thread (the installer's output is streamed so).
    Raises ``ToolError`` with the host's message when the call is refused or fails.
    """
    if channel is None or channel.disabled:
        raise ToolError("host calls are not available in this process")
    cell = state.current
    if cell is None or prims.get_native_id() in state.background_idents:
        raise ToolError("host call from outside a running cell: a cell's tool authority ends when the cell settles")
    cid = "h%d" % next(_ids)
    # A lock the reader releases when the answer is in (a C primitive: no
    # Python code of ``threading`` a cell could have patched).
    done = prims.allocate_lock()
    done.acquire()
    slot = [done, None]
    with _waiting_lock:
        _waiting[cid] = slot
    try:
        sent = channel.send({"type": "host_call", "id": cid, "cell": cell, "method": name,
                             "args": args if args is not None else {}}, salvage=False)
        if not sent:
            raise ToolError("host call %r not sent: its arguments cannot be encoded as JSON or exceed the frame cap" % (name,))
        if poll is None:
            done.acquire()
        else:
            while not done.acquire(True, 0.1):
                poll()
    finally:
        with _waiting_lock:
            _waiting.pop(cid, None)
    reply = slot[1] if type(slot[1]) is dict else {}
    if reply.get("error") is not None:
        raise ToolError(reply["error"])
    return reply.get("data")


def deliver(frame):
    """Reader thread: hand a host_response to the thread waiting for it."""
    with _waiting_lock:
        slot = _waiting.get(frame.get("id"))
    if slot is not None and slot[1] is None:
        slot[1] = frame
        slot[0].release()


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
