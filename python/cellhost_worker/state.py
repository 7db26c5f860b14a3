"""Worker state shared by the main thread, the reader thread and the SIGINT handler."""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
from . import prims

WORKER_PID = prims.os.getpid()
lock = prims.allocate_lock()

# Cell bookkeeping (guarded by ``lock``).
queued = set()          # cell ids received but not started
cancelled = set()       # cell ids interrupted before their code started
current = None          # cell id the main thread is working on
running = False         # user code of ``current`` is executing
sigint_pending = False  # SIGINT arrived while ``current`` was being prepared
ki_raised = 0           # KeyboardInterrupts raised in ``current``
execution_count = 0

# Native thread ids (``/proc/self/task``) alive when the current cell
# started, other than the main thread: their Python-level writes are
# background output of earlier cells.
background_idents = frozenset()
# The current cell's start marker went to fd 1 and fd 2.
start_written = False

# A SIGINT that arrived while the main thread was inside a frame send is
# raised when the send completes (a frame must never be cut in half).
_critical = 0
deferred_ki = False
main_ident = prims.get_ident()


def critical_enter():
    global _critical
    if prims.get_ident() == main_ident:
        _critical += 1


def critical_exit():
    global _critical, deferred_ki
    if prims.get_ident() != main_ident:
        return
    _critical -= 1
    if _critical == 0 and deferred_ki:
        deferred_ki = False
        if running:
            raise KeyboardInterrupt


def in_critical():
    return _critical > 0


def after_fork_in_child():
    global WORKER_PID
    # Keep WORKER_PID: comparing it with os.getpid() is how a forked child
    # knows it is not the worker.
    return WORKER_PID
