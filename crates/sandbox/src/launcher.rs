//! The kernel init: a small, single-threaded supervisor between the host and
//! the Python worker.
//!
//! The host starts `cellhost __cellhost-kernel-init --launch-fd 0` with an
//! empty environment, the control socket as fd 0 and the output pipes as
//! fd 1/2, and writes one [`LaunchSpec`] message ([`encode_message`]) into
//! the control socket first: the host pid, the cgroups to join, the
//! sandbox, the worker's argv and environment. Nothing of it is on the
//! init's command line or in its environment, which pid 1 of a sandboxed
//! kernel (a fork of the init) would show every cell in `/proc/1/cmdline`
//! and `/proc/1/environ`. The worker is started with `execve` and the
//! environment of the message; its own configuration follows in a second
//! message on the same socket, which the worker reads before anything
//! else. The init then:
//!
//! 1. sets `PR_SET_PDEATHSIG` to SIGTERM (the signal follows the *thread*
//!    that spawned it: the host spawns from one thread that lives as long as
//!    the host) and exits if the host is already gone;
//! 2. joins the kernel's control groups, if any;
//! 3. starts a new session (`setsid`: own process group, no controlling
//!    terminal, so `/dev/tty` and terminal signals cannot reach the kernel);
//! 4. becomes a child subreaper, so every orphaned descendant — also one
//!    that called `setsid` or double-forked — is re-parented to it and can be
//!    found and reaped;
//! 5. forks Python with the control socket moved to fd 3, `/dev/null` as
//!    fd 0, and its own parent-death signal (SIGKILL);
//! 6. reaps every child that dies; when Python dies, or on SIGTERM, SIGINT,
//!    SIGHUP or SIGQUIT (the host asked, or the host died), SIGKILLs every
//!    descendant until none is left, reaps them all, and exits with Python's
//!    status: the same exit code, or death by the same signal.
//!
//! With a sandbox (an [`InitSpec`]), step 5 changes: the init lowers its
//! rlimits and unshares the namespaces, then forks an *ns-init* (pid 1 of
//! the new pid namespace) that builds the kernel's fresh root
//! ([`crate::rootfs`]), clears the capability bounding set, takes the
//! kernel's uid (root host), applies Landlock, capabilities and seccomp
//! (the order of [`crate::confine`]), reports the layers as one `sandbox`
//! frame on the control socket, forks Python (pid 2) and reaps every
//! orphan of the namespace. When Python dies the ns-init passes its raw wait status to
//! the init through a pipe and exits, which kills whatever is left in the
//! namespace; the init mirrors Python's status as before. Killing the
//! ns-init (what the init does on SIGTERM) kills the whole namespace.
//!
//! Nothing here depends on Python being responsive. The binary that embeds
//! cellhost calls [`run_if_requested`] first thing in `main` (or enables the
//! `ctor-launcher` feature).

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use crate::confine;
use crate::profile::{InitSpec, LaunchSpec, LayerStatus, kernel_id};
use crate::rootfs;
use crate::signal;
use crate::steps::{Confinement, Stage};
use crate::sys::{Linux, Sys};

/// The init's argument naming the descriptor its [`LaunchSpec`] message
/// arrives on.
pub const LAUNCH_FD_ARG: &str = "--launch-fd";

/// Largest message [`encode_message`] frames (16 MiB).
pub const MAX_MESSAGE: usize = 16 << 20;

/// Frames `payload` (JSON) for a launch channel: its length in decimal,
/// a newline, the bytes. The reader takes exactly that many bytes, so
/// whatever follows on the channel is left for the next reader.
pub fn encode_message(payload: &[u8]) -> Vec<u8> {
    let mut out = format!("{}\n", payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// A descriptor an argument of the init names, borrowed; `None` when it is
/// not open.
fn borrowed_fd(fd: i32) -> Option<BorrowedFd<'static>> {
    if fd < 0 {
        return None;
    }
    // SAFETY: the number comes from the init's own arguments: a descriptor
    // its starter opened for this process (the launch channel, a release or
    // status pipe). Probing it with F_GETFD has no effect when it is not
    // open, and the init closes such a descriptor only through
    // [`owned_fd`], after its last borrow.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(b).ok().map(|_| b)
}

/// A descriptor an argument of the init names, owned from here on (closed
/// when dropped); `None` when it is not open.
fn owned_fd(fd: i32) -> Option<OwnedFd> {
    borrowed_fd(fd)?;
    // SAFETY: open (checked above) and handed to this process for this one
    // use, so nothing else owns, closes or reuses it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes ownership of descriptor `fd`, which this process inherited open
/// across `exec` (a worker's control socket at fd 3): it is closed when the
/// result is dropped. `None` when `fd` is below 3, not open, or was taken
/// before (each number at most once per process).
///
/// For a program that starts as a worker: call it before the process opens
/// anything itself, so the number is still the inherited descriptor.
pub fn take_inherited_fd(fd: i32) -> Option<OwnedFd> {
    static TAKEN: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());
    if fd < 3 {
        return None;
    }
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if taken.contains(&fd) {
        return None;
    }
    let owned = owned_fd(fd)?;
    taken.push(fd);
    Some(owned)
}

/// `read(2)` on a borrowed descriptor, retried on `EINTR`; 0 at the end or
/// on an error.
fn read_some(fd: BorrowedFd<'_>, buf: &mut [u8]) -> usize {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return 0,
            Ok(n) => return n,
        }
    }
}

/// Reads one [`encode_message`] frame from `fd`, byte by byte for the
/// header so nothing after the frame is consumed (the rest of the channel
/// belongs to the worker).
fn read_message(fd: BorrowedFd<'_>) -> Result<Vec<u8>, String> {
    let mut header = Vec::new();
    loop {
        let mut b = [0u8; 1];
        if read_some(fd, &mut b) != 1 {
            return Err("the launch channel closed before a message".into());
        }
        if b[0] == b'\n' {
            break;
        }
        if header.len() > 20 {
            return Err("bad launch message header".into());
        }
        header.push(b[0]);
    }
    let len: usize = std::str::from_utf8(&header)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n <= MAX_MESSAGE)
        .ok_or("bad launch message length")?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = read_some(fd, &mut buf[got..]);
        if n == 0 {
            return Err("the launch message was cut short".into());
        }
        got += n;
    }
    Ok(buf)
}

/// Reads `fd` to its end (at most [`MAX_MESSAGE`] bytes) and closes it.
fn read_to_end_and_close(fd: i32) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(fd) = owned_fd(fd) else { return out };
    let mut buf = [0u8; 8192];
    while out.len() <= MAX_MESSAGE {
        let n = read_some(fd.as_fd(), &mut buf);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// The hidden subcommand that turns the process into a kernel init.
pub const INIT_ARG: &str = "__cellhost-kernel-init";

/// The hidden subcommand that turns pid 1 of a forked kernel's pid
/// namespace into its ns-init (see [`crate::forkplan`]).
pub const NS_INIT_ARG: &str = "__cellhost-ns-init";

/// Becomes a kernel init (and never returns) when `argv[1]` is [`INIT_ARG`];
/// returns at once otherwise.
pub fn run_if_requested() {
    let args: Vec<OsString> = std::env::args_os().collect();
    dispatch(&args);
}

fn dispatch(args: &[OsString]) {
    crate::workdir_disk::dispatch(args);
    if args.get(1).is_some_and(|a| a == INIT_ARG) {
        init_main(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == NS_INIT_ARG) {
        ns_init_for_fork(&args[2..]);
    }
}

/// Like [`run_if_requested`], reading the arguments from
/// `/proc/self/cmdline` (for constructors that run before the standard
/// library has stored them).
pub fn run_if_requested_from_proc() {
    let Ok(raw) = std::fs::read("/proc/self/cmdline") else {
        return;
    };
    // Every argument ends with a NUL: the split leaves one empty piece.
    let raw = raw.strip_suffix(&[0]).unwrap_or(&raw);
    let args: Vec<OsString> = raw
        .split(|&b| b == 0)
        .map(|s| std::ffi::OsStr::from_bytes(s).to_os_string())
        .collect();
    dispatch(&args);
}

fn fail(msg: &str) -> ! {
    eprintln!("cellhost kernel init: {msg}");
    std::process::exit(70)
}

/// The number after the flag at `args[i]`; exits with a usage error when
/// there is none.
fn number_arg(args: &[OsString], i: usize) -> i32 {
    args.get(i + 1)
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fail(&format!("{} needs a number", args[i].to_string_lossy())))
}

fn cstring(s: &[u8]) -> CString {
    CString::new(s).unwrap_or_else(|_| fail("argument holds a NUL byte"))
}

/// The worker's environment as `NAME=VALUE` strings (and the pointer
/// array `execve` takes, which borrows them).
struct Envp {
    _strings: Vec<CString>,
    ptrs: Vec<*const libc::c_char>,
}

fn envp(env: &[(String, String)]) -> Envp {
    let strings: Vec<CString> = env
        .iter()
        .filter(|(k, _)| !k.is_empty() && !k.contains('='))
        .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
        .collect();
    let mut ptrs: Vec<*const libc::c_char> = strings.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    Envp {
        _strings: strings,
        ptrs,
    }
}

/// The program to `execve`: `name` itself when it holds a `/`, else the
/// first executable of that name on the worker's `PATH`.
fn resolve_program(name: &str, env: &[(String, String)]) -> CString {
    if name.contains('/') || name.is_empty() {
        return cstring(name.as_bytes());
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let p = std::path::Path::new(dir).join(name);
        if let Ok(m) = std::fs::metadata(&p)
            && m.is_file()
            && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        {
            return cstring(p.as_os_str().as_bytes());
        }
    }
    cstring(name.as_bytes())
}

fn init_main(args: &[OsString]) -> ! {
    let mut host_pid: Option<i32> = None;
    let mut launch: Option<LaunchSpec> = None;
    let mut adopt: Option<i32> = None;
    let mut adopt_ns_init: Option<i32> = None;
    let mut report: Option<i32> = None;
    let mut watch_host: Option<i32> = None;
    let int_arg = |i: usize| number_arg(args, i);
    let mut i = 0;
    while i < args.len() {
        match args[i].to_str() {
            Some("--adopt") => {
                adopt = Some(int_arg(i));
                i += 2;
            }
            Some("--adopt-ns-init") => {
                adopt_ns_init = Some(int_arg(i));
                i += 2;
            }
            Some("--report-status") => {
                report = Some(int_arg(i));
                i += 2;
            }
            Some("--release-fd") => {
                // Someone waits for this init to have read its arguments.
                drop(owned_fd(int_arg(i)));
                i += 2;
            }
            Some("--host-pid") => {
                host_pid = Some(int_arg(i));
                i += 2;
            }
            Some("--watch-host") => {
                // An adopted init whose parent is not a template's init (a
                // copy-on-write fork): it ends its tree when the host is gone.
                watch_host = Some(int_arg(i));
                i += 2;
            }
            Some(LAUNCH_FD_ARG) => {
                let parsed = borrowed_fd(int_arg(i))
                    .ok_or_else(|| "the launch descriptor is not open".to_string())
                    .and_then(read_message)
                    .and_then(|m| serde_json::from_slice::<LaunchSpec>(&m).map_err(|e| e.to_string()));
                match parsed {
                    Ok(l) => launch = Some(l),
                    Err(e) => fail(&format!("bad launch message: {e}")),
                }
                i += 2;
            }
            _ => fail("usage: __cellhost-kernel-init --launch-fd FD (or the adopt-mode flags)"),
        }
    }
    let (program, env, cgroups, spec, keep_tree, spare_forks, no_new_privs) = match launch {
        Some(l) => {
            host_pid = Some(l.host_pid);
            (
                l.program,
                l.env,
                l.cgroup_procs,
                l.sandbox,
                l.keep_tree,
                l.spare_forks,
                l.no_new_privs,
            )
        }
        None => (Vec::new(), Vec::new(), Vec::new(), None, false, false, false),
    };
    // Nothing the host's caller left open without close-on-exec reaches the
    // kernel: every descriptor but the standard streams (control socket and
    // output pipes) and those the arguments name goes, before anything else.
    // The one list of descriptors an init keeps (`--release-fd` is closed
    // above, once read).
    crate::fds::close_all_except(&[report.unwrap_or(-1)]);
    if program.is_empty() && adopt.is_none() {
        fail("no program to run");
    }
    let Some(host_pid) = host_pid else {
        fail("no host pid (a launch message or --host-pid is required)")
    };
    let program_path = resolve_program(program.first().map(String::as_str).unwrap_or(""), &env);
    let argv: Vec<CString> = program.iter().map(|a| cstring(a.as_bytes())).collect();
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let devnull = CString::new("/dev/null").unwrap_or_default();

    let prelude = crate::init_prelude::Prelude {
        adopted: adopt.is_some(),
        host_pid,
        cgroups,
        no_new_privs,
    };
    if let Err(e) = crate::init_prelude::run(&Linux, &prelude) {
        fail(&e.to_string());
    }

    let mut watched: libc::sigset_t = empty_sigset();
    let mut old: libc::sigset_t = empty_sigset();
    // SAFETY: the sigset_t values are valid, initialised by sigemptyset.
    unsafe {
        for s in [
            libc::SIGCHLD,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
        ] {
            libc::sigaddset(&mut watched, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &watched, &mut old);
    }
    let init_pid = std::process::id() as i32;

    if let Some(python) = adopt {
        // A kernel forked from a template: the worker (and the ns-init,
        // pid 1 of its namespace) are already our children, started
        // before this exec with these signals blocked.
        let host = watch_host.map(|h| match host_watch(h, &watched) {
            Ok(w) => w,
            Err(e) => fail(&format!("cannot watch the host (pid {h}): {e}")),
        });
        // A copy-on-write fork's worker may be forked again: its forks
        // are spared as a sandbox-off kernel's are.
        let spare = host.is_some();
        supervise(
            init_pid,
            python,
            &watched,
            &devnull,
            None,
            report,
            adopt_ns_init,
            host,
            spare,
        )
    }
    if let Some(spec) = spec {
        let (ns_init, status_rd) =
            start_sandboxed(&spec, init_pid, &program_path, &argv_ptrs, &env, &devnull, &old);
        supervise(
            init_pid,
            ns_init,
            &watched,
            &devnull,
            Some(status_rd),
            report,
            None,
            None,
            false,
        )
    }

    let worker_env = envp(&env);
    // SAFETY: single-threaded process; the child only makes async-signal-safe
    // calls on memory prepared before the fork, then execs or _exits.
    let python = unsafe { libc::fork() };
    if python < 0 {
        fail("fork failed");
    }
    if python == 0 {
        exec_worker(
            &old,
            init_pid,
            &devnull,
            &program_path,
            &argv_ptrs,
            &worker_env.ptrs,
            None,
        );
    }

    if keep_tree {
        supervise_template(init_pid, python, &watched, &devnull)
    }
    supervise(
        init_pid,
        python,
        &watched,
        &devnull,
        None,
        report,
        None,
        None,
        spare_forks,
    )
}

/// The init of a template (`--keep-tree`): when the template dies, the
/// kernels forked from it live on; the init reaps them as they end and
/// exits when none is left. A signal (the host asked, or died) kills the
/// whole tree, kernels included.
fn supervise_template(init_pid: i32, python: i32, watched: &libc::sigset_t, devnull: &CString) -> ! {
    null_stdio(devnull);
    let mut python_status: Option<libc::c_int> = None;
    loop {
        // SAFETY: `watched` is a valid set; a null siginfo pointer is allowed.
        let sig = unsafe { libc::sigwaitinfo(watched, std::ptr::null_mut()) };
        if sig == libc::SIGCHLD {
            if !reap_nohang(python, &mut python_status) {
                mirror_exit(python_status)
            }
        } else if sig > 0 {
            kill_tree_and_reap(init_pid, python, &mut python_status, false);
            mirror_exit(python_status)
        }
    }
}

/// In the forked child: restores the signal mask, dies with its parent,
/// moves the control socket from fd 0 to fd 3, puts `/dev/null` on fd 0,
/// enters `workdir`, and execs the interpreter with exactly the
/// environment `envp`. Never returns.
fn exec_worker(
    mask: &libc::sigset_t,
    parent: i32,
    devnull: &CString,
    program: &CString,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    workdir: Option<&std::ffi::CStr>,
) -> ! {
    // SAFETY: called in the child right after fork, in a single-threaded
    // process; every pointer points to a live CString or array prepared
    // before the fork; only async-signal-safe calls are made.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        if libc::getppid() != parent {
            libc::_exit(70);
        }
        if libc::dup2(0, 3) < 0 {
            libc::_exit(71);
        }
        let null = libc::open(devnull.as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            if null > 3 {
                libc::close(null);
            }
        }
        if let Some(w) = workdir {
            libc::chdir(w.as_ptr());
        }
        libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        let msg = b"cellhost kernel init: cannot execute the interpreter\n";
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

fn null_stdio(devnull: &CString) {
    // The init keeps no end of the control channel or the output pipes, so
    // the host sees EOF as soon as the worker tree is gone.
    use rustix::fs::{Mode, OFlags, open};
    if let Ok(null) = open(devnull.as_c_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
        if std::os::fd::AsRawFd::as_raw_fd(&null) <= 2 {
            // It landed on a standard descriptor itself: that one stays.
            let _ = std::os::fd::IntoRawFd::into_raw_fd(null);
        }
    }
}

/// Waits for `python` (or the ns-init standing for it), kills the tree, and
/// exits with Python's status. `status_rd` carries Python's raw wait status
/// from an ns-init; `report`, when given, receives that raw status (4 bytes,
/// native order) just before the exit: a host that is not this process's
/// parent cannot wait for it. `ns_init`, when given, is pid 1 of the
/// worker's pid namespace but not its parent: it is killed as soon as the
/// worker is gone, which ends every process of the namespace (this init's
/// `/proc` shows that namespace, so a sweep by parent links cannot).
#[allow(clippy::too_many_arguments)]
fn supervise(
    init_pid: i32,
    python: i32,
    watched: &libc::sigset_t,
    devnull: &CString,
    status_rd: Option<i32>,
    report: Option<i32>,
    ns_init: Option<i32>,
    host: Option<HostWatch>,
    spare: bool,
) -> ! {
    null_stdio(devnull);
    let mut python_status: Option<libc::c_int> = None;
    loop {
        let sig = next_signal(watched, host.as_ref());
        if sig == libc::SIGCHLD {
            reap_nohang(python, &mut python_status);
            if python_status.is_some() {
                break;
            }
            if ns_init.is_some_and(|n| !alive_child(n)) {
                // The namespace is gone, and the worker with it.
                let _ = signal::kill(python, libc::SIGKILL);
                break;
            }
        } else if sig > 0 {
            let _ = signal::kill(python, libc::SIGKILL);
            break;
        }
    }
    if let Some(n) = ns_init {
        let _ = signal::kill(n, libc::SIGKILL);
    }
    kill_tree_and_reap(init_pid, python, &mut python_status, spare);
    if let Some(fd) = status_rd {
        let mut raw = [0u8; 4];
        // The write end is closed (its only holder, the ns-init, is
        // reaped), so this cannot block.
        let n = borrowed_fd(fd).map_or(0, |fd| read_some(fd, &mut raw));
        if n == 4 {
            python_status = Some(libc::c_int::from_ne_bytes(raw));
        } else if python_status.is_some_and(|s| libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 72) {
            // The ns-init refused to start Python (mode enforce).
            python_status = Some(72 << 8);
        }
    }
    if let (Some(fd), Some(st)) = (report, python_status) {
        write_all(fd, &st.to_ne_bytes());
    }
    mirror_exit(python_status)
}

/// Applies the layers the init itself must apply (rlimits, namespaces) and
/// forks the ns-init. Returns its pid and the read end of the status pipe.
/// `init_pid` (this process's host pid) names the kernel's uid.
fn start_sandboxed(
    spec: &InitSpec,
    init_pid: i32,
    program: &CString,
    argv: &[*const libc::c_char],
    env: &[(String, String)],
    devnull: &CString,
    old_mask: &libc::sigset_t,
) -> (i32, i32) {
    // The effective uid is read before any user namespace.
    let root = Linux.geteuid() == 0;
    let kid = (root && !spec.disabled("uid")).then(|| kernel_id(init_pid as u32));
    let mut init = Confinement::new(&Linux, spec, kid);
    init.run_stage(Stage::Init);
    let layers = init.layers;
    if let Some(port) = spec.egress_port {
        // Before anything of the kernel runs: the proxy's listener in the
        // kernel's network namespace goes to the host (fd 0, the control
        // socket), and this process keeps no copy.
        let private = layers.iter().any(|l| l.name == "netns" && l.enforced);
        if let Some(control) = borrowed_fd(0) {
            crate::egress::hand_over_listener(control, port, private);
        }
    }
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .unwrap_or_else(|e| fail(&format!("pipe2 failed: {e}")));
    // SAFETY: single-threaded process; the child goes on as the ns-init.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail("fork failed");
    }
    if pid == 0 {
        drop(rd);
        ns_init(
            spec,
            kid,
            layers,
            program,
            argv,
            env,
            devnull,
            old_mask,
            wr.into_raw_fd(),
        );
    }
    drop(wr);
    (pid, rd.into_raw_fd())
}

fn write_all(fd: i32, mut bytes: &[u8]) {
    let Some(fd) = borrowed_fd(fd) else { return };
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) | Ok(0) => return,
            Ok(n) => bytes = &bytes[n..],
        }
    }
}

/// Pid 1 of the kernel's pid namespace: finishes the confinement (in the
/// order of [`crate::confine`]), reports it, runs Python and reaps orphans
/// until Python dies. `kid`: the kernel's uid (root host).
#[allow(clippy::too_many_arguments)]
fn ns_init(
    spec: &InitSpec,
    kid: Option<u32>,
    layers: Vec<LayerStatus>,
    program: &CString,
    argv: &[*const libc::c_char],
    env: &[(String, String)],
    devnull: &CString,
    old_mask: &libc::sigset_t,
    status_wr: i32,
) -> ! {
    let _ = Linux.set_pdeathsig(libc::SIGKILL);
    // The kernel's root is built with a known umask: under the host user's
    // (077, say) its directories would be closed to the kernel's own uid.
    // The worker gets the user's umask back.
    let user_umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let mut c = Confinement::new(&Linux, spec, kid);
    c.layers = layers;
    c.run_stage(Stage::NsInit);
    let mut env = env.to_vec();
    if let Some(dir) = confine::share_mpl_cache(spec, c.private_tmp, kid) {
        env.retain(|(k, _)| k != "MPLCONFIGDIR");
        env.push(("MPLCONFIGDIR".into(), dir.to_string_lossy().into_owned()));
    }
    let worker_env = envp(&env);
    c.run_stage(Stage::Worker);
    let frame = serde_json::json!({
        "type": "sandbox",
        "mode": spec.mode.as_str(),
        "layers": c.layers,
    });
    write_all(0, format!("{frame}\n").as_bytes());
    if c.refuses() {
        // SAFETY: exiting without running atexit handlers.
        unsafe { libc::_exit(72) };
    }
    let workdir = spec
        .workdir
        .as_ref()
        .and_then(|w| CString::new(w.as_os_str().as_bytes()).ok());
    rustix::process::umask(user_umask);
    let me = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: single-threaded process; the child only makes async-signal-safe
    // calls on memory prepared before the fork, then execs or _exits.
    let python = unsafe { libc::fork() };
    if python < 0 {
        // SAFETY: as above.
        unsafe { libc::_exit(70) };
    }
    if python == 0 {
        exec_worker(
            old_mask,
            me,
            devnull,
            program,
            argv,
            &worker_env.ptrs,
            workdir.as_deref(),
        );
    }
    null_stdio(devnull);
    reap_until_worker_exits(python, status_wr)
}

/// The ns-init's last duty: reaps every orphan of the namespace until
/// Python dies, passes Python's raw wait status on through `status_wr`,
/// and exits (which kills whatever is left in the namespace).
fn reap_until_worker_exits(python: i32, status_wr: i32) -> ! {
    let mut watched = empty_sigset();
    // SAFETY: valid sigset.
    unsafe { libc::sigaddset(&mut watched, libc::SIGCHLD) };
    loop {
        // SAFETY: `watched` is a valid set; SIGCHLD is blocked (inherited mask).
        let sig = unsafe { libc::sigwaitinfo(&watched, std::ptr::null_mut()) };
        if sig != libc::SIGCHLD {
            continue;
        }
        let mut python_status = None;
        reap_nohang(python, &mut python_status);
        if let Some(st) = python_status {
            write_all(status_wr, &st.to_ne_bytes());
            // Leaving kills every process left in the namespace.
            // SAFETY: exiting without running atexit handlers.
            unsafe { libc::_exit(0) };
        }
    }
}

/// What the kernel init of a forked kernel hands its ns-init on
/// `--spec-fd` (read to its end, then closed): never on the command line.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct ForkNsSpec {
    /// The sandbox (`None`: mode off).
    pub spec: Option<InitSpec>,
    /// The kernel's uid and gid (root host), see
    /// [`crate::profile::kernel_id`].
    pub kernel_id: Option<u32>,
}

/// Pid 1 of a forked kernel's namespaces (see [`crate::forkplan`]),
/// started by the kernel init (which also forks the worker, pid 2, that
/// waits on `--go-fd`) with an empty environment. Reads its [`ForkNsSpec`]
/// from `--spec-fd`. Once `--barrier-fd` reads EOF (the init has read its
/// arguments), sets up the mounts and the network and UTS namespaces as a
/// cold kernel's ns-init does, writes one JSON line `{"layers": [...],
/// "mplconfigdir": ..., "idmap_failures": [...]}` to the worker and closes
/// it, takes the kernel's uid itself, then reaps every orphan of the
/// namespace until the init kills it.
fn ns_init_for_fork(args: &[OsString]) -> ! {
    let mut go: Option<i32> = None;
    let mut barrier: Option<i32> = None;
    let mut unshared: libc::c_int = 0;
    let mut spec_fd: Option<i32> = None;
    let num = |i: usize| number_arg(args, i);
    let mut i = 0;
    while i < args.len() {
        match args[i].to_str() {
            Some("--go-fd") => go = Some(num(i)),
            Some("--barrier-fd") => barrier = Some(num(i)),
            Some("--unshared") => unshared = num(i),
            Some("--spec-fd") => spec_fd = Some(num(i)),
            _ => fail(
                "usage: __cellhost-ns-init --go-fd FD [--barrier-fd FD] [--unshared FLAGS] [--spec-fd FD]",
            ),
        }
        i += 2;
    }
    let Some(go) = go else { fail("--go-fd is required") };
    // Started by the template's fork with every descriptor it held: keep
    // only the standard streams and the descriptors named above (the spec's
    // is closed once read).
    crate::fds::close_all_except(&[go, barrier.unwrap_or(-1), spec_fd.unwrap_or(-1)]);
    let _ = Linux.set_pdeathsig(libc::SIGKILL);
    let ns_spec: ForkNsSpec = match spec_fd {
        Some(fd) => serde_json::from_slice(&read_to_end_and_close(fd))
            .unwrap_or_else(|e| fail(&format!("bad --spec-fd message: {e}"))),
        None => ForkNsSpec {
            spec: None,
            kernel_id: None,
        },
    };
    if let Some(fd) = barrier {
        let mut buf = [0u8; 64];
        // SAFETY: reads into a live buffer until EOF, then closes the fd.
        unsafe {
            while libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) > 0 {}
            libc::close(fd);
        }
    }
    let kid = ns_spec.kernel_id;
    // As in a cold kernel's ns-init: the root is built with a known umask
    // (this process runs no worker).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    let mut layers: Vec<LayerStatus> = Vec::new();
    let mut private_tmp = false;
    let mut idmap_failures: Vec<String> = Vec::new();
    let mut mplconfigdir = None;
    if let Some(spec) = &ns_spec.spec {
        if unshared & libc::CLONE_NEWNS != 0 {
            let done = confine::setup_mounts(&Linux, spec, kid);
            let mut m = done.mountns;
            if m.enforced {
                m.detail = format!("own mount table: {}", m.detail);
            }
            private_tmp = done.private_tmp;
            idmap_failures = done.idmap_failures;
            layers.push(m);
            layers.push(done.rootfs);
        }
        if kid.is_some() && !private_tmp {
            idmap_failures.push("the read-write paths (no fresh root to idmap them in)".into());
        }
        if unshared & libc::CLONE_NEWNET != 0 {
            let up = confine::settle_namespace(&Linux, libc::CLONE_NEWNET);
            layers.push(LayerStatus::on(
                "netns",
                format!("no network: only a private loopback{up}"),
            ));
        }
        if unshared & libc::CLONE_NEWUTS != 0 {
            confine::settle_namespace(&Linux, libc::CLONE_NEWUTS);
        }
        mplconfigdir = confine::share_mpl_cache(spec, private_tmp, kid);
    }
    let msg = serde_json::json!({
        "layers": layers,
        "mplconfigdir": mplconfigdir.map(|v| v.to_string_lossy().into_owned()),
        "idmap_failures": idmap_failures,
    });
    write_all(go, format!("{msg}\n").as_bytes());
    // SAFETY: closing the go pipe, which this process owns.
    unsafe { libc::close(go) };
    // Pid 1 holds no root either once the mounts are made.
    if let Some(k) = kid
        && rootfs::become_id(&Linux, k).is_err()
    {
        // SAFETY: exiting without running atexit handlers; the init then
        // ends the kernel (the namespace dies with its pid 1).
        unsafe { libc::_exit(72) };
    }
    // Not root: the capabilities of the kernel's user namespace, kept
    // through this process's exec for the mounts only
    // (`forkplan::UserNsPlan`), go as well.
    if ns_spec.spec.is_some() && kid.is_none() && Linux.geteuid() != 0 {
        confine::drop_bounding_set(&Linux);
        if !confine::drop_capabilities(&Linux).enforced {
            // SAFETY: as above.
            unsafe { libc::_exit(72) };
        }
    }
    let devnull = CString::new("/dev/null").unwrap_or_default();
    null_stdio(&devnull);
    let mut watched = empty_sigset();
    // SAFETY: valid sigset; SIGCHLD is blocked (inherited mask, and here).
    unsafe {
        libc::sigaddset(&mut watched, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &watched, std::ptr::null_mut());
    }
    loop {
        // SAFETY: `watched` is a valid set.
        let sig = unsafe { libc::sigwaitinfo(&watched, std::ptr::null_mut()) };
        if sig == libc::SIGCHLD {
            let mut none = None;
            reap_nohang(0, &mut none);
        }
    }
}

/// `pid` is a child of this process that has not died yet.
fn alive_child(pid: i32) -> bool {
    let mut info: libc::siginfo_t = empty_siginfo();
    // SAFETY: waitid writes one siginfo_t into a live struct; WNOWAIT
    // leaves the child to be reaped later.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: reading the pid field of a siginfo_t that waitid filled (or
    // that is zeroed).
    rc == 0 && unsafe { info.si_pid() } == 0
}

fn empty_siginfo() -> libc::siginfo_t {
    // SAFETY: an all-zero siginfo_t is a valid value.
    unsafe { std::mem::zeroed() }
}

fn empty_sigset() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the whole set.
    unsafe {
        let mut s: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut s);
        s
    }
}

/// Reaps every dead child without blocking. Returns false when no child is left.
fn reap_nohang(python: i32, python_status: &mut Option<libc::c_int>) -> bool {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            if pid == python {
                *python_status = Some(status);
            }
            continue;
        }
        return pid == 0;
    }
}

fn kill_tree_and_reap(init_pid: i32, python: i32, python_status: &mut Option<libc::c_int>, spare: bool) {
    // Every descendant is ours to find (subreaper); a process forked while a
    // sweep runs is caught by the next one once its parent is gone.
    loop {
        if spare {
            // Subtrees of adopted kernel inits (copy-on-write forks) live
            // on: done once nothing else is left, not even a zombie (one
            // whose other threads still exit is not yet waitable; leaving
            // it hands it to whoever adopts orphans).
            let left = signal::kill_descendants_sparing(init_pid, is_adopted_init);
            let children = reap_nohang(python, python_status);
            if left == 0 || !children {
                return;
            }
        } else {
            signal::kill_descendants(init_pid, 1);
            if !reap_nohang(python, python_status) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `pid` is a kernel init in adopt mode running this init's own program
/// (`/proc/<pid>/exe` the same file as ours, `__cellhost-kernel-init` and
/// `--adopt` in its arguments): the init of another kernel.
fn is_adopted_init(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let same_exe = match (
        std::fs::metadata(format!("/proc/{pid}/exe")),
        std::fs::metadata("/proc/self/exe"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    if !same_exe {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|b| *b == 0);
    args.nth(1) == Some(b"__cellhost-kernel-init".as_slice()) && args.any(|a| a == b"--adopt")
}

/// The host watched through a pidfd, beside the init's signals (a
/// signalfd of the watched set, which is blocked).
struct HostWatch {
    pidfd: OwnedFd,
    sigfd: OwnedFd,
}

fn host_watch(host: i32, watched: &libc::sigset_t) -> std::io::Result<HostWatch> {
    let pid = rustix::process::Pid::from_raw(host).ok_or_else(|| std::io::Error::other("pid 0"))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    // SAFETY: `watched` is a valid, initialised set; -1 asks for a new
    // descriptor, which we own from here on.
    let raw = unsafe { libc::signalfd(-1, watched, libc::SFD_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let sigfd = unsafe { OwnedFd::from_raw_fd(raw) };
    Ok(HostWatch { pidfd, sigfd })
}

/// The next watched signal; with a host watch, the host's end counts as a
/// SIGTERM (the host asked for the tree to end).
fn next_signal(watched: &libc::sigset_t, host: Option<&HostWatch>) -> i32 {
    use std::os::fd::AsRawFd;
    let Some(w) = host else {
        // SAFETY: `watched` is a valid set; a null siginfo pointer is allowed.
        return unsafe { libc::sigwaitinfo(watched, std::ptr::null_mut()) };
    };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: w.sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: w.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd structures.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n <= 0 {
            continue;
        }
        if fds[1].revents != 0 {
            return libc::SIGTERM;
        }
        if fds[0].revents != 0 {
            // SAFETY: signalfd_siginfo is plain data; all zeroes is valid.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reads at most `size` bytes into `info`, which is that large.
            let got = unsafe {
                libc::read(
                    w.sigfd.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if got as usize == size {
                return info.ssi_signo as i32;
            }
        }
    }
}

fn mirror_exit(status: Option<libc::c_int>) -> ! {
    let Some(status) = status else {
        std::process::exit(70)
    };
    if libc::WIFEXITED(status) {
        std::process::exit(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        // SAFETY: resetting a disposition and unblocking it, then raising it
        // at ourselves: no memory is shared. Core dumps are off (RLIMIT_CORE 0).
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set = empty_sigset();
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        std::process::exit(128 + sig);
    }
    std::process::exit(70)
}
