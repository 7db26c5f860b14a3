"""The template: a worker-to-be that has imported a configuration's modules
and forks new kernels on request (a fork server).

Protocol on the control socket (fd 3), JSON lines:

* template -> host, once: ``{"type": "template_ready", "pid", "preloaded",
  "failed": {module: error}, "import_ms", "threads"}``;
* host -> template: ``{"type": "fork", "id", "launcher", "plan", "spec",
  "cgroup_procs", "env", "cwd"}`` with four descriptors attached
  (SCM_RIGHTS): the worker's end of its control socket, the write ends of
  its stdout and stderr pipes, and the write end of the status pipe;
* template -> host: ``{"type": "forked", "id", "pid"}`` (pid of the new
  kernel's init) or ``{"type": "fork_failed", "id", "error"}``.

Process tree of one fork (see ``cellhost_sandbox::forkplan``)::

    template ── A: kernel init (forked; unshares, then execs the Rust init
                 │  in adopt mode)
                 ├─ B: pid 1 of the new pid namespace: the Rust ns-init,
                 │  started with posix_spawn (no copy of the template's memory)
                 └─ C: pid 2, the worker (forked: the preloaded modules)

Only two processes are copies of the template (A and C); B mounts the
kernel's private /tmp, /dev/shm and /proc while C joins its cgroups. When
the template is not root, A first enters a user namespace of its own
(``plan["user_ns"]``: its uid and gid mapped to themselves) that owns the
kernel's other namespaces, and B keeps that namespace's capabilities
through its exec (ambient set) until its mounts are made.

The template runs no user code and keeps no state a kernel could leave
behind: each kernel is a fresh fork of it. Before forking it checks that it
is single-threaded at the Python level; BLAS pools (OpenBLAS) park their
threads in their own ``pthread_atfork`` handlers and start them again on the
next call in the child.
"""
from .prims import BUILTINS as __builtins__  # noqa: F401,E402 - see prims
import importlib
import select as _select_module
import socket
import sys
import threading
import time

# Bound before any preloaded module runs (see prims): a module that patches
# os, json or signal in the template cannot change how kernels are forked.
from . import prims

os = prims.os
signal = prims.signal
_select = _select_module.select
_recv_fds = socket.recv_fds
_socket_from_fd = socket.socket
_active_count = threading.active_count
_perf_counter = time.perf_counter
_import_module = importlib.import_module

CONTROL_FD = 3
HIGH_FD = 1000
MAX_FDS = 4
CLONE_NEWCGROUP = 0x02000000
_BLOCKED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


def _send(sock, obj):
    sock.sendall((prims.dumps(obj) + "\n").encode())


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _preload(names):
    done, failed = [], {}
    for name in names:
        try:
            _import_module(name)
            done.append(name)
        except BaseException as exc:  # noqa: B902 - report, never die on a bad module
            failed[name] = "%s: %s" % (type(exc).__name__, exc)
    if "matplotlib.pyplot" in sys.modules or "matplotlib" in sys.modules:
        try:
            # The font list is read once here, not in every kernel.
            _import_module("matplotlib.font_manager")
        except BaseException:
            pass
    return done, failed


def _reap():
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _die(err_fd, msg):
    try:
        os.write(err_fd, ("cellhost template: %s\n" % msg).encode())
    finally:
        os._exit(72)


def _kernel_init(req, fds):
    """Process A: lowers limits, unshares, spawns the ns-init B, forks the
    worker C, then execs the Rust kernel init in adopt mode."""
    from . import confine
    ctl, out, err, report = fds
    try:
        # The init's own complaints belong to the kernel's stderr.
        os.dup2(err, 2)
        os.setsid()
        plan = req["plan"]
        flags = plan.get("unshare") or 0
        user_ns = plan.get("user_ns")
        for step in confine.steps_of(plan, "init"):
            if step == "rlimits":
                confine.lower_rlimits(plan.get("rlimits") or ())
            elif step == "namespaces":
                # Not root: a user namespace of this kernel's own first, which
                # owns the others (cellhost_sandbox::forkplan::UserNsPlan).
                if user_ns is not None:
                    confine.enter_user_namespace(user_ns["uid"], user_ns["gid"])
                # The cgroup namespace is the worker's, made once it has
                # joined its cgroups (its root is then the kernel's own group).
                confine.unshare(flags & ~CLONE_NEWCGROUP)
            else:
                raise OSError(0, "no implementation of the init step %r" % step)
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
        go_r, go_w = os.pipe()
        # Closed by the init this process becomes once it has read its
        # arguments: B mounts the new /proc only after that, since this
        # process shares B's mount namespace but not its pid namespace, and
        # an init started through a constructor reads /proc/self/cmdline.
        barrier_r, barrier_w = os.pipe()
        launcher = req["launcher"]
        # The worker joins its cgroups while B builds the kernel's new root,
        # where /sys/fs/cgroup does not exist: open the files now.
        cg_fds = [os.open(f, os.O_WRONLY | os.O_CLOEXEC) for f in req.get("cgroup_procs") or ()]
        if req.get("resume"):
            # Forked from a live kernel's worker: this process (and so the
            # ns-init and the worker after it) leaves the parent kernel's
            # cgroups for the new kernel's before anything else starts.
            for fd in cg_fds:
                os.write(fd, b"0")
        # The kernel's uid: one per kernel, from this process's host pid
        # (it becomes the kernel init), as cellhost_sandbox::profile::kernel_id.
        base = plan.get("uid_base")
        kid = None if base is None or os.geteuid() != 0 else base + (os.getpid() & 0x3FFFFF)
        # The ns-init's spec goes on a memfd, never on its command line
        # (it is pid 1 of the kernel: /proc/1/cmdline is readable there).
        spec_fd = os.memfd_create("cellhost-ns-spec", 0)
        os.write(spec_fd, prims.dumps({"spec": req.get("spec"), "kernel_id": kid}).encode())
        os.lseek(spec_fd, 0, os.SEEK_SET)
        args = ["cellhost", "__cellhost-ns-init", "--go-fd", str(go_w), "--barrier-fd", str(barrier_r),
                "--unshared", str(flags), "--spec-fd", str(spec_fd)]
        os.set_inheritable(go_w, True)
        os.set_inheritable(barrier_r, True)
        if user_ns is not None:
            # B mounts the kernel's root: it must keep this namespace's
            # capabilities through its exec (uid not 0); nothing started
            # after it gets them.
            confine.keep_capabilities_across_exec(plan["capset_nr"])
        b = os.posix_spawn(launcher, args, {})
        if user_ns is not None:
            confine.clear_ambient()
        os.close(go_w)
        os.close(barrier_r)
        os.close(spec_fd)
        c = os.fork()
        if c == 0:
            os.close(barrier_w)
            os.close(report)
            _worker(req, (ctl, out, err), old_mask, go_r, kid, cg_fds)
        for fd in cg_fds:
            os.close(fd)
        os.close(go_r)
        for fd in (ctl, out, err):
            os.close(fd)
        for fd in (report, barrier_w):
            os.set_inheritable(fd, True)
        argv = ["cellhost", "__cellhost-kernel-init", "--host-pid", str(os.getppid()),
                "--adopt", str(c), "--adopt-ns-init", str(b),
                "--report-status", str(report), "--release-fd", str(barrier_w)]
        if req.get("watch_host"):
            # Not under a template's init: the init itself ends the tree
            # when the host is gone.
            argv += ["--watch-host", str(int(req["watch_host"]))]
        os.execv(launcher, argv)
    except BaseException as exc:  # noqa: B902
        _die(err, "kernel init: %s: %s" % (type(exc).__name__, exc))


def _read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _merge_layers(plan_layers, updates):
    by_name = {l["name"]: l for l in updates}
    merged = [by_name.pop(l["name"], l) for l in plan_layers]
    return merged + list(by_name.values())


def _confine_worker(plan, kid, idmap_failures):
    """The worker's steps of the plan (bounding set, uid, Landlock,
    capabilities, seccomp), in the plan's order. Returns the layers as
    ``LayerStatus`` objects."""
    from . import confine
    layers = []

    def bounding_set():
        if plan.get("drop_capabilities"):
            confine.drop_bounding_set()

    def uid():
        layers.append(_take_uid(plan, kid, idmap_failures))

    def landlock():
        ll = plan.get("landlock")
        if ll is None:
            layers.append({"name": "landlock", "enforced": False,
                           "detail": plan.get("landlock_missing") or "not applied"})
            return
        try:
            confine.apply_landlock(ll)
            layers.append({"name": "landlock", "enforced": True, "detail": ll["detail"]})
        except OSError as exc:
            layers.append({"name": "landlock", "enforced": False, "detail": "ruleset failed: %s" % exc})

    def capabilities():
        if not plan.get("drop_capabilities"):
            layers.append({"name": "capabilities", "enforced": False,
                           "detail": "disabled by the sandbox profile"})
            return
        try:
            confine.drop_capabilities(plan["capset_nr"])
            layers.append({"name": "capabilities", "enforced": True,
                           "detail": "all dropped (bounding set cleared)"})
        except OSError as exc:
            layers.append({"name": "capabilities", "enforced": False, "detail": str(exc)})

    def seccomp():
        if not plan.get("seccomp"):
            layers.append({"name": "seccomp", "enforced": False,
                           "detail": plan.get("seccomp_detail") or "disabled by the sandbox profile"})
            return
        try:
            confine.apply_seccomp(plan["seccomp"])
            layers.append({"name": "seccomp", "enforced": True, "detail": plan["seccomp_detail"]})
        except OSError as exc:
            layers.append({"name": "seccomp", "enforced": False,
                           "detail": "cannot install the filter: %s" % exc})

    run = {"bounding_set": bounding_set, "uid": uid, "landlock": landlock,
           "capabilities": capabilities, "seccomp": seccomp}
    for step in confine.steps_of(plan, "worker"):
        if step not in run:
            raise OSError(0, "no implementation of the worker step %r" % step)
        run[step]()
    return layers


def _take_uid(plan, kid, idmap_failures):
    """The ``uid`` layer: as root, the kernel's own uid (see
    ``cellhost_sandbox::rootfs::take_kernel_id``)."""
    from . import confine
    euid = os.geteuid()
    if euid != 0:
        return {"name": "uid", "enforced": True, "detail": "runs as host uid %d, not root" % euid}
    if kid is None:
        return {"name": "uid", "enforced": False,
                "detail": plan.get("uid_missing") or "no kernel uid was chosen: the kernel runs as root"}
    try:
        confine.become_id(kid)
    except OSError as exc:
        return {"name": "uid", "enforced": False, "detail": "cannot take uid %d: %s" % (kid, exc)}
    if idmap_failures:
        return {"name": "uid", "enforced": False,
                "detail": "runs as uid %d, but cannot write %s (no idmapped mount)"
                          % (kid, "; ".join(idmap_failures))}
    return {"name": "uid", "enforced": True,
            "detail": "runs as uid %d and gid %d (one per kernel, no host account, not root), "
                      "no supplementary groups; read-write paths idmapped to it" % (kid, kid)}


def _reseed():
    """A fork shares its parent's random state: give every kernel its own."""
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:
            pass


def _worker(req, fds, old_mask, go_r, kid, cg_fds):
    """Process C: waits for the ns-init's go, puts its descriptors in place,
    confines itself and becomes the worker."""
    ctl, out, err = fds
    try:
        from . import confine
        # While the ns-init mounts: join the kernel's cgroups (the first
        # write can wait for an RCU grace period), then take a cgroup
        # namespace rooted at the kernel's own group.
        for fd in cg_fds:
            os.write(fd, b"0")
            os.close(fd)
        confine.unshare((req["plan"].get("unshare") or 0) & CLONE_NEWCGROUP)
        go_raw = _read_all(go_r)
        os.close(go_r)
        if not go_raw.strip():
            _die(err, "the ns-init ended before the mounts were ready")
        go = prims.loads_line(go_raw)
        if go is None:
            _die(err, "the ns-init's go message is not a JSON object")
        confine.set_parent_death_signal(signal.SIGKILL)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(ctl, CONTROL_FD)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        for fd in {null, ctl, out, err} - {0, 1, 2, CONTROL_FD}:
            os.close(fd)
        err = 2
        # A copy of the template holds whatever the template held: nothing
        # but the protocol's descriptors reaches the kernel.
        if req.get("resume"):
            _occupy_others()
        else:
            _close_others()
        os.environ.clear()
        os.environ.update(req.get("env") or {})
        if go.get("mplconfigdir"):
            os.environ["MPLCONFIGDIR"] = go["mplconfigdir"]
        cwd = req.get("cwd")
        if cwd:
            os.chdir(cwd)
        plan = req["plan"]
        if plan.get("mode", "off") != "off":
            layers = _merge_layers(plan.get("layers") or [], go.get("layers") or [])
            layers += _confine_worker(plan, kid, go.get("idmap_failures") or [])
            frame = {"type": "sandbox", "mode": plan["mode"], "layers": layers}
            os.write(CONTROL_FD, (prims.dumps(frame) + "\n").encode())
            if plan["mode"] == "enforce" and any(
                    not l["enforced"] and not l.get("optional") for l in layers):
                os._exit(72)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from . import main, state
        state.WORKER_PID = os.getpid()
        state.main_ident = prims.get_ident()
        if req.get("resume"):
            # A copy-on-write fork of a live worker: its namespace is here
            # already; it goes on as a worker on the new channel.
            main.resume_forked()
        _reseed()
        sys.stdout.flush()
        main.run()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: B902
        _die(err, "worker: %s: %s" % (type(exc).__name__, exc))
    os._exit(0)


def _occupy_others():
    """A copy-on-write fork of a live worker: every descriptor above the
    control socket is the parent's (its channel, pipes and rings, the
    cells' files and sockets). Each is replaced by an ``O_PATH`` descriptor
    of ``/``, on which reads and writes fail (EBADF): the file objects of
    the cells that named them fail as on a closed file, and their numbers
    stay taken, so closing such an object later never closes a descriptor
    this kernel opens."""
    hole = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = []
    for fd in fds:
        if fd > CONTROL_FD and fd != hole:
            try:
                os.dup2(hole, fd, inheritable=False)
            except OSError:
                pass
    os.close(hole)


def _close_others():
    """Closes every descriptor above the control socket (fd 3)."""
    try:
        top = os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        top = 65536
    os.closerange(CONTROL_FD + 1, max(CONTROL_FD + 1, min(top, 1 << 16)))


def _fork(sock, req, fds, check_threads=True):
    """Forks the kernel init of one kernel (process A) from this process.
    ``check_threads`` false: the caller has accounted for the threads
    (a live worker's fork, ``cellhost_worker.forkstate.cow_fork``)."""
    if len(fds) != MAX_FDS:
        for fd in fds:
            os.close(fd)
        return {"type": "fork_failed", "id": req.get("id"),
                "error": "expected %d descriptors, got %d" % (MAX_FDS, len(fds))}
    if check_threads and _active_count() != 1:
        for fd in fds:
            os.close(fd)
        return {"type": "fork_failed", "id": req.get("id"),
                "error": "the template has %d Python threads; forking would copy their locks"
                         % _active_count()}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            sock.close()
            _kernel_init(req, fds)
        finally:
            os._exit(72)
    for fd in fds:
        os.close(fd)
    return {"type": "forked", "id": req.get("id"), "pid": pid}


def run():
    # The template's configuration is the first message on its control
    # socket, like a worker's: its environment is what every forked kernel's
    # /proc/self/environ shows.
    from .main import _read_config
    config = _read_config(CONTROL_FD)
    import fcntl
    ctl = fcntl.fcntl(CONTROL_FD, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    os.close(CONTROL_FD)
    sock = _socket_from_fd(fileno=ctl)
    sock.setblocking(True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    t0 = _perf_counter()
    # The worker's own modules first, so a fork starts its main loop at once.
    from . import main  # noqa: F401
    from . import confine  # noqa: F401
    done, failed = _preload(config.get("preload") or ())
    _send(sock, {"type": "template_ready", "pid": os.getpid(), "preloaded": done, "failed": failed,
                 "import_ms": round((_perf_counter() - t0) * 1000, 1), "threads": _threads()})
    buf = b""
    fds = []
    while True:
        ready, _, _ = _select([sock], [], [], 1.0)
        _reap()
        if not ready:
            continue
        try:
            data, got, _flags, _addr = _recv_fds(sock, 1 << 20, MAX_FDS)
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the host is gone
        fds.extend(got)
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = prims.loads_line(line)
            if req is None:
                _send(sock, {"type": "fork_failed", "id": None, "error": "bad request: not one JSON object"})
                continue
            if req.get("type") != "fork":
                _send(sock, {"type": "fork_failed", "id": req.get("id"),
                             "error": "unknown request %r" % req.get("type")})
                continue
            taken, fds = fds, []
            _send(sock, _fork(sock, req, taken))
