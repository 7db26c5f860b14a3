"""Worker state shared by the main thread, the reader thread and the SIGINT handler."""
import os
import threading

WORKER_PID = os.getpid()
lock = threading.Lock()

# Cell bookkeeping (guarded by ``lock``).
queued = set()          # cell ids received but not started
cancelled = set()       # cell ids interrupted before their code started
current = None          # cell id the main thread is working on
running = False         # user code of ``current`` is executing
sigint_pending = False  # SIGINT arrived while ``current`` was being prepared
ki_raised = 0           # KeyboardInterrupts raised in ``current``
execution_count = 0

# Threads alive when the current cell started: their Python-level writes are
# background output of earlier cells.
background_idents = frozenset()
# The current cell's start marker went to fd 1 and fd 2.
start_written = False

# A SIGINT that arrived while the main thread was inside a frame send is
# raised when the send completes (a frame must never be cut in half).
_critical = 0
deferred_ki = False
main_ident = threading.get_ident()


def critical_enter():
    global _critical
    if threading.get_ident() == main_ident:
        _critical += 1


def critical_exit():
    global _critical, deferred_ki
    if threading.get_ident() != main_ident:
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
