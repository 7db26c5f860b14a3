//! The first steps of a kernel init, before it forks anything: what makes
//! the init a supervisor the host can rely on. Made through [`Sys`], so
//! their order and every failure path are unit-tested with
//! [`crate::sys::record::Record`].
//!
//! Order (each step's reason):
//! 1. parent-death signal `SIGTERM` (cold inits only: a forked kernel's
//!    init is the template's child and learns of the host's death through
//!    the template's init, which kills its whole tree);
//! 2. the parent is still the host — checked after step 1, so a host that
//!    died between the fork and step 1 is noticed and not missed;
//! 3. `setsid`: the worker tree gets its own session and process group,
//!    away from the host's terminal and its job-control signals;
//! 4. child subreaper: orphaned descendants (daemonised grandchildren)
//!    are re-parented to the init, which reaps and kills them with the tree;
//! 5. core dumps off (soft `RLIMIT_CORE` 0, the hard limit kept): a crashed
//!    worker never writes its memory (secrets, data) to disk;
//! 6. the kernel's control groups joined, so every descendant is counted
//!    and limited from its first instruction;
//! 7. `no_new_privs` when asked (a kernel a process checkpoint may dump:
//!    CRIU's unprivileged restore relies on it), last, so nothing above
//!    depends on it.

use std::path::PathBuf;

use crate::sys::{Limit, Sys};

/// What the prelude needs to know.
#[derive(Debug, Clone, Default)]
pub struct Prelude {
    /// A forked kernel's init (adopt mode): no parent-death signal.
    pub adopted: bool,
    /// The host's pid, which must be this process's parent.
    pub host_pid: i32,
    /// `cgroup.procs` files to join, in order.
    pub cgroups: Vec<PathBuf>,
    /// Set `no_new_privs` for the whole tree.
    pub no_new_privs: bool,
}

/// A prelude step that failed; the init exits with status 70 and this
/// message on its stderr.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PreludeError {
    /// The host died before the init could watch it.
    #[error("the host (pid {host_pid}) is gone: this init's parent is now pid {parent}")]
    HostGone {
        /// The host's pid.
        host_pid: i32,
        /// The parent found instead (0: outside this pid namespace).
        parent: i32,
    },
    /// A step's system call failed.
    #[error("cannot {step}: {why}")]
    Step {
        /// The step (`set the parent-death signal`, `start a new session`, …).
        step: &'static str,
        /// The system's error.
        why: String,
    },
    /// A control group could not be joined.
    #[error("cannot join the kernel's cgroup {path}: {why}", path = .path.display())]
    Cgroup {
        /// Its `cgroup.procs` file.
        path: PathBuf,
        /// The system's error.
        why: String,
    },
}

/// Runs the prelude.
///
/// # Errors
/// The first step that failed ([`PreludeError`]). `setsid` failing with
/// `EPERM` is not one: the init already leads a process group (it was
/// started as one), which is what the step is for.
pub fn run(sys: &dyn Sys, p: &Prelude) -> Result<(), PreludeError> {
    let step = |step: &'static str| {
        move |e: std::io::Error| PreludeError::Step {
            step,
            why: e.to_string(),
        }
    };
    if !p.adopted {
        sys.set_pdeathsig(libc::SIGTERM)
            .map_err(step("set the parent-death signal"))?;
    }
    let parent = sys.getppid();
    if parent != p.host_pid {
        return Err(PreludeError::HostGone {
            host_pid: p.host_pid,
            parent,
        });
    }
    match sys.setsid() {
        Err(e) if e.raw_os_error() != Some(libc::EPERM) => return Err(step("start a new session")(e)),
        _ => {}
    }
    sys.set_child_subreaper()
        .map_err(step("become the child subreaper"))?;
    let (_, hard) = sys.getrlimit(Limit::Core);
    sys.setrlimit(Limit::Core, Some(0), hard)
        .map_err(step("turn core dumps off"))?;
    for f in &p.cgroups {
        sys.join_cgroup(f).map_err(|e| PreludeError::Cgroup {
            path: f.clone(),
            why: e.to_string(),
        })?;
    }
    if p.no_new_privs {
        sys.set_no_new_privs().map_err(step("set no_new_privs"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::record::Record;

    fn prelude(adopted: bool) -> Prelude {
        Prelude {
            adopted,
            host_pid: 1,
            cgroups: vec![
                "/cg/memory/k/cgroup.procs".into(),
                "/cg/pids/k/cgroup.procs".into(),
            ],
            no_new_privs: false,
        }
    }

    #[test]
    fn no_new_privs_comes_last_when_asked() {
        let sys = Record::new(0);
        let p = Prelude {
            no_new_privs: true,
            ..prelude(false)
        };
        assert_eq!(run(&sys, &p), Ok(()));
        assert_eq!(sys.names().last(), Some(&"set_no_new_privs"));
        assert_eq!(sys.names().len(), 8);
        let sys = Record::failing(0, &["set_no_new_privs"]);
        let e = run(&sys, &p).expect_err("refused");
        assert!(
            matches!(
                e,
                PreludeError::Step {
                    step: "set no_new_privs",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn steps_run_in_order() {
        let sys = Record::new(0);
        assert_eq!(run(&sys, &prelude(false)), Ok(()));
        assert_eq!(
            sys.names(),
            [
                "set_pdeathsig",
                "getppid",
                "setsid",
                "set_child_subreaper",
                "setrlimit",
                "join_cgroup",
                "join_cgroup"
            ]
        );
        let calls = sys.calls.borrow();
        assert_eq!(calls[0].1, libc::SIGTERM.to_string());
        assert_eq!(calls[4].1, "Core Some(0) None", "soft 0, the hard limit kept");
        assert_eq!(calls[5].1, "/cg/memory/k/cgroup.procs");
    }

    #[test]
    fn an_adopted_init_sets_no_parent_death_signal() {
        let sys = Record::new(0);
        assert_eq!(run(&sys, &prelude(true)), Ok(()));
        assert_eq!(sys.names().first(), Some(&"getppid"));
    }

    #[test]
    fn a_host_gone_before_the_check_stops_the_init() {
        let mut sys = Record::new(0);
        sys.ppid = 0;
        let e = run(&sys, &prelude(false)).expect_err("refused");
        assert_eq!(
            e,
            PreludeError::HostGone {
                host_pid: 1,
                parent: 0
            }
        );
        assert_eq!(
            sys.names(),
            ["set_pdeathsig", "getppid"],
            "nothing after the check"
        );
    }

    #[test]
    fn every_failing_step_stops_the_init_there() {
        for (fails, last) in [
            ("set_pdeathsig", "set_pdeathsig"),
            ("set_child_subreaper", "set_child_subreaper"),
            ("setrlimit", "setrlimit"),
            ("join_cgroup", "join_cgroup"),
        ] {
            let sys = Record::failing(0, &[fails]);
            let e = run(&sys, &prelude(false)).expect_err(fails);
            assert_eq!(sys.names().last(), Some(&last), "{fails}");
            match (fails, e) {
                ("join_cgroup", PreludeError::Cgroup { path, .. }) => {
                    assert_eq!(path, PathBuf::from("/cg/memory/k/cgroup.procs"));
                }
                ("join_cgroup", other) => panic!("{other:?}"),
                (_, PreludeError::Step { why, .. }) => assert!(why.contains("ermitted"), "{why}"),
                (_, other) => panic!("{fails}: {other:?}"),
            }
        }
    }

    #[test]
    fn setsid_as_a_group_leader_is_not_a_failure() {
        // Record fails with EPERM: the init already leads its group.
        let sys = Record::failing(0, &["setsid"]);
        assert_eq!(run(&sys, &prelude(false)), Ok(()));
        assert_eq!(sys.names().len(), 7);
    }
}
