"""The confinement steps a kernel forked from a template applies to itself.

Every decision (flags, paths, access masks, seccomp programs) is made by the
host (``cellhost_sandbox::forkplan``); this module only makes the system
calls. The order is not kept here: the plan's ``steps`` is the one list of
``cellhost_sandbox::steps::ORDER``, and :func:`steps_of` hands each process
its steps in that order (rlimits and namespaces in the kernel init, the
mounts in the ns-init, the rest in the worker), refusing a step this module
does not know. Each function raises ``OSError`` naming the step that failed.
"""
import ctypes
import os
import resource

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int

# <linux/prctl.h>, <linux/seccomp.h>
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWUSER = 0x10000000
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SECCOMP_MODE_FILTER = 2
# Landlock's syscalls have the same numbers on every architecture.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_RULE_PATH_BENEATH = 1

_RLIMITS = {
    "core": resource.RLIMIT_CORE,
    "nofile": resource.RLIMIT_NOFILE,
    "fsize": resource.RLIMIT_FSIZE,
    "as": resource.RLIMIT_AS,
}

_UL = ctypes.c_ulong

# The steps ``cellhost_sandbox::steps::Step`` names, by the process that
# runs them (``Step::stage``).
STAGES = {
    "rlimits": "init",
    "namespaces": "init",
    "mounts": "ns_init",
    "bounding_set": "worker",
    "uid": "worker",
    "landlock": "worker",
    "capabilities": "worker",
    "seccomp": "worker",
}


def steps_of(plan, stage):
    """The plan's steps that ``stage`` runs, in the plan's order. Raises
    ``OSError`` when the plan has no step list or names a step this module
    does not know (an older worker must not confine a kernel partly)."""
    steps = plan.get("steps")
    if not isinstance(steps, list):
        raise OSError(0, "the fork plan names no confinement steps")
    for step in steps:
        if step not in STAGES:
            raise OSError(0, "unknown confinement step %r" % (step,))
    return [step for step in steps if STAGES[step] == stage]


def _fail(step):
    err = ctypes.get_errno()
    raise OSError(err, "%s: %s" % (step, os.strerror(err)))


def _prctl(option, a=0, b=0, c=0, d=0):
    return _libc.prctl(ctypes.c_int(option), _UL(a), _UL(b), _UL(c), _UL(d))


def set_parent_death_signal(sig):
    """``PR_SET_PDEATHSIG``: ``sig`` when the parent dies."""
    if _prctl(PR_SET_PDEATHSIG, sig) != 0:
        _fail("prctl(PR_SET_PDEATHSIG)")


def lower_rlimits(pairs):
    """Lowers each ``(name, value)`` limit, never above the hard limit."""
    for name, want in pairs:
        res = _RLIMITS.get(name)
        if res is None:
            raise OSError(0, "unknown rlimit %r" % name)
        _soft, hard = resource.getrlimit(res)
        v = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(res, (v, v))


def unshare(flags):
    """``unshare(2)`` with ``CLONE_NEW*`` flags."""
    if flags and _libc.unshare(ctypes.c_int(flags)) != 0:
        _fail("unshare(%#x)" % flags)


def _write_proc_self(name, text):
    try:
        fd = os.open("/proc/self/" + name, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(exc.errno, "user namespace: open /proc/self/%s: %s" % (name, exc.strerror))
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        raise OSError(exc.errno, "user namespace: write %r to /proc/self/%s: %s" % (text, name, exc.strerror))
    finally:
        os.close(fd)


def enter_user_namespace(uid, gid):
    """``unshare(CLONE_NEWUSER)`` and this process's own maps: ``deny`` to
    ``setgroups``, ``uid uid 1`` and ``gid gid 1`` (the one mapping an
    unprivileged process may write for itself; see
    ``cellhost_sandbox::forkplan::UserNsPlan``). Afterwards this process
    holds every capability in the new namespace."""
    unshare(CLONE_NEWUSER)
    _write_proc_self("setgroups", "deny")
    _write_proc_self("uid_map", "%d %d 1" % (uid, uid))
    _write_proc_self("gid_map", "%d %d 1" % (gid, gid))


def _last_cap():
    cap = 0
    while _prctl(PR_CAPBSET_READ, cap) >= 0:
        cap += 1
    if cap == 0:
        _fail("prctl(PR_CAPBSET_READ)")
    return cap - 1


def keep_capabilities_across_exec(capset_nr):
    """Raises every capability of the bounding set into the effective,
    permitted, inheritable and ambient sets, so that the next program this
    process starts keeps them through its ``execve`` although the uid is not
    0 (capabilities(7), "ambient"). Only right after
    :func:`enter_user_namespace`, where this process holds them all; undo
    with :func:`clear_ambient` once that program is started."""
    last = _last_cap()
    full = (1 << (last + 1)) - 1
    lo, hi = full & 0xFFFFFFFF, full >> 32
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    # Two struct __user_cap_data_struct: effective, permitted, inheritable.
    data = (ctypes.c_uint32 * 6)(lo, lo, lo, hi, hi, hi)
    if _libc.syscall(_UL(capset_nr), ctypes.byref(header), ctypes.byref(data)) != 0:
        _fail("capset (inheritable)")
    for cap in range(last + 1):
        if _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap) != 0:
            _fail("prctl(PR_CAP_AMBIENT_RAISE, %d)" % cap)


def clear_ambient():
    """Empties the ambient set: programs started later get no capability."""
    if _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL) != 0:
        _fail("prctl(PR_CAP_AMBIENT_CLEAR_ALL)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _no_new_privs():
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        _fail("prctl(PR_SET_NO_NEW_PRIVS)")


def apply_landlock(plan):
    """Creates the ruleset of ``plan`` (``handled_fs``, ``scoped``,
    ``rules`` of ``[path, access]``) and restricts this process to it.
    A path that does not exist here is skipped, as the Rust init does."""
    attr = _RulesetAttr(plan["handled_fs"], 0, plan["scoped"])
    fd = _libc.syscall(_UL(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                       _UL(ctypes.sizeof(attr)), _UL(0))
    if fd < 0:
        _fail("landlock_create_ruleset")
    try:
        for path, access in plan["rules"]:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = _PathBeneath(access, pfd)
                if _libc.syscall(_UL(SYS_LANDLOCK_ADD_RULE), _UL(fd), _UL(LANDLOCK_RULE_PATH_BENEATH),
                                 ctypes.byref(rule), _UL(0)) != 0:
                    _fail("landlock_add_rule(%s)" % path)
            finally:
                os.close(pfd)
        _no_new_privs()
        if _libc.syscall(_UL(SYS_LANDLOCK_RESTRICT_SELF), _UL(fd), _UL(0)) != 0:
            _fail("landlock_restrict_self")
    finally:
        os.close(fd)


def drop_bounding_set():
    """Clears the capability bounding set as far as this process may (it
    needs ``CAP_SETPCAP``: before the uid changes)."""
    cap = 0
    while _prctl(PR_CAPBSET_READ, cap) >= 0:
        _prctl(PR_CAPBSET_DROP, cap)
        cap += 1


def become_id(k):
    """``setgroups([])``, ``setresgid(k)``, ``setresuid(k)``: the kernel's
    uid and gid, no supplementary groups. The process stays dumpable (it is
    the worker; a cold kernel's worker is dumpable after its exec)."""
    os.setgroups([])
    os.setresgid(k, k, k)
    os.setresuid(k, k, k)
    if os.getuid() != k or os.geteuid() != k or os.getegid() != k or os.getgroups():
        raise OSError(0, "setresuid(%d): the ids did not change" % k)
    _prctl(PR_SET_DUMPABLE, 1)


def drop_capabilities(capset_nr):
    """Clears the ambient set, the bounding set (what is left of it), and
    the effective, permitted and inheritable sets."""
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    cap = 0
    while True:
        held = _prctl(PR_CAPBSET_READ, cap)
        if held < 0:
            break
        if held == 1 and _prctl(PR_CAPBSET_DROP, cap) != 0:
            _fail("prctl(PR_CAPBSET_DROP, %d)" % cap)
        cap += 1
    if cap == 0:
        _fail("prctl(PR_CAPBSET_READ)")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)  # this process
    data = (ctypes.c_uint32 * 6)()
    if _libc.syscall(_UL(capset_nr), ctypes.byref(header), ctypes.byref(data)) != 0:
        _fail("capset")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def apply_seccomp(programs):
    """Installs each program (hex of a ``struct sock_filter`` array)."""
    _no_new_privs()
    for hexed in programs:
        raw = bytes.fromhex(hexed)
        if not raw or len(raw) % 8:
            raise OSError(0, "seccomp: malformed program (%d bytes)" % len(raw))
        buf = ctypes.create_string_buffer(raw, len(raw))
        prog = _SockFprog(len(raw) // 8, ctypes.addressof(buf))
        if _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), _UL(SECCOMP_MODE_FILTER), ctypes.byref(prog),
                       _UL(0), _UL(0)) != 0:
            _fail("prctl(PR_SET_SECCOMP)")
