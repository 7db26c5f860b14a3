//! The confinement steps of a kernel, as one ordered list defined once.
//!
//! A cold kernel's init ([`crate::launcher`]) runs them through
//! [`crate::sys::Sys`] in [`ORDER`]; a forked kernel gets the same list in
//! its fork plan ([`crate::forkplan::ForkPlan::steps`]) and `confine.py`
//! runs the steps it is given, in the order given, refusing a step it does
//! not know.

use serde::{Deserialize, Serialize};

use crate::confine;
use crate::profile::{InitSpec, LayerStatus, SandboxMode};
use crate::rootfs;
use crate::sys::Sys;

/// One confinement step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Lower the rlimits ([`crate::confine::apply_rlimits`]).
    Rlimits,
    /// Unshare the namespaces ([`crate::confine::unshare_namespaces`]).
    Namespaces,
    /// Build the kernel's fresh root in its mount namespace
    /// ([`crate::rootfs::build_root`]).
    Mounts,
    /// Clear the capability bounding set (needs `CAP_SETPCAP`: before the
    /// uid changes).
    BoundingSet,
    /// Take the kernel's uid ([`crate::rootfs::take_kernel_id`]).
    Uid,
    /// Restrict the file system ([`crate::confine::apply_landlock`]).
    Landlock,
    /// Drop every capability ([`crate::confine::drop_capabilities`]).
    Capabilities,
    /// Install the seccomp filters (last: they forbid the calls of the
    /// earlier steps).
    Seccomp,
}

/// Which process of a kernel runs a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The kernel init, before it forks pid 1 of the new pid namespace.
    Init,
    /// Pid 1 of the new pid namespace (the ns-init), in the new mount
    /// namespace.
    NsInit,
    /// The process that becomes the worker (a cold kernel's ns-init before
    /// it forks Python; a forked kernel's worker itself).
    Worker,
}

/// The steps, in the one order every kernel applies them.
pub const ORDER: &[Step] = &[
    Step::Rlimits,
    Step::Namespaces,
    Step::Mounts,
    Step::BoundingSet,
    Step::Uid,
    Step::Landlock,
    Step::Capabilities,
    Step::Seccomp,
];

impl Step {
    /// The process that runs the step.
    pub fn stage(self) -> Stage {
        match self {
            Step::Rlimits | Step::Namespaces => Stage::Init,
            Step::Mounts => Stage::NsInit,
            Step::BoundingSet | Step::Uid | Step::Landlock | Step::Capabilities | Step::Seccomp => {
                Stage::Worker
            }
        }
    }

    /// The step's name (as in the fork plan and `confine.py`).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Rlimits => "rlimits",
            Step::Namespaces => "namespaces",
            Step::Mounts => "mounts",
            Step::BoundingSet => "bounding_set",
            Step::Uid => "uid",
            Step::Landlock => "landlock",
            Step::Capabilities => "capabilities",
            Step::Seccomp => "seccomp",
        }
    }
}

/// The steps of [`ORDER`] a stage runs, in order.
pub fn of_stage(stage: Stage) -> impl Iterator<Item = Step> {
    ORDER.iter().copied().filter(move |s| s.stage() == stage)
}

/// A cold kernel's confinement under way: the layers reported so far and
/// what the mounts leave for the later steps.
pub struct Confinement<'a> {
    /// The calls.
    pub sys: &'a dyn Sys,
    /// The sandbox.
    pub spec: &'a InitSpec,
    /// The kernel's uid when the host is root (see
    /// [`crate::profile::kernel_id`]).
    pub kid: Option<u32>,
    /// The layers so far, in the order of the frame the host reads.
    pub layers: Vec<LayerStatus>,
    /// Read-write paths the mounts could not idmap to `kid`.
    pub idmap_failures: Vec<String>,
    /// The fresh root, with its private `/tmp`, is in place.
    pub private_tmp: bool,
}

fn disabled(name: &str) -> LayerStatus {
    LayerStatus::missing(name, "disabled by the sandbox profile")
}

impl<'a> Confinement<'a> {
    /// Nothing applied yet.
    pub fn new(sys: &'a dyn Sys, spec: &'a InitSpec, kid: Option<u32>) -> Self {
        Confinement {
            sys,
            spec,
            kid,
            layers: Vec::new(),
            idmap_failures: Vec::new(),
            private_tmp: false,
        }
    }

    /// Applies the steps of `stage`, in [`ORDER`].
    pub fn run_stage(&mut self, stage: Stage) {
        for step in of_stage(stage) {
            self.run(step);
        }
    }

    /// Applies one step, best-effort: a failure becomes a missing layer.
    pub fn run(&mut self, step: Step) {
        let (sys, spec) = (self.sys, self.spec);
        let layer = |name: &str, f: &dyn Fn() -> LayerStatus| {
            if spec.disabled(name) { disabled(name) } else { f() }
        };
        match step {
            Step::Rlimits => {
                let l = layer("rlimits", &|| confine::apply_rlimits(sys, &spec.rlimits));
                self.layers.push(l);
            }
            Step::Namespaces => {
                // The session's workdir tmpfs: the namespaces unshared next
                // are made from its holder's.
                if let Some(h) = &spec.workdir_disk {
                    self.layers.push(crate::workdir_disk::enter(sys, h));
                }
                let l = confine::unshare_namespaces(sys, spec.network, &spec.disable);
                self.layers.extend(l);
            }
            Step::Mounts => self.mounts(),
            Step::BoundingSet => {
                if !spec.disabled("capabilities") {
                    confine::drop_bounding_set(sys);
                }
            }
            Step::Uid => {
                let l = rootfs::take_kernel_id(sys, self.kid, spec.disabled("uid"), &self.idmap_failures);
                self.layers.push(l);
            }
            Step::Landlock => {
                let l = layer("landlock", &|| confine::apply_landlock(sys, spec));
                self.layers.push(l);
            }
            Step::Capabilities => {
                let l = layer("capabilities", &|| confine::drop_capabilities(sys));
                self.layers.push(l);
            }
            Step::Seccomp => {
                let l = layer("seccomp", &|| confine::apply_seccomp(sys));
                self.layers.push(l);
            }
        }
    }

    /// The fresh root, in the mount namespace when there is one.
    fn mounts(&mut self) {
        let mut rootfs_layer =
            LayerStatus::missing("rootfs", "no mount namespace: the kernel sees the host's files");
        if let Some(m) = self.layers.iter_mut().find(|l| l.name == "mountns")
            && m.enforced
        {
            let done = confine::setup_mounts(self.sys, self.spec, self.kid);
            let mut mountns = done.mountns;
            if mountns.enforced {
                mountns.detail = format!("{}: {}", m.detail, mountns.detail);
            }
            *m = mountns;
            rootfs_layer = done.rootfs;
            self.idmap_failures = done.idmap_failures;
            self.private_tmp = done.private_tmp;
        }
        if self.kid.is_some() && !rootfs_layer.enforced {
            self.idmap_failures
                .push("the read-write paths (no fresh root to idmap them in)".into());
        }
        self.layers.push(rootfs_layer);
    }

    /// Mode `enforce` refuses to start the worker: a layer that is not
    /// optional is missing.
    pub fn refuses(&self) -> bool {
        refuses(self.spec.mode, &self.layers)
    }
}

/// Mode `enforce` and a missing layer that is not optional: the worker
/// must not start. Mode `auto` starts it and reports.
pub fn refuses(mode: SandboxMode, layers: &[LayerStatus]) -> bool {
    mode == SandboxMode::Enforce && layers.iter().any(|l| !l.enforced && !l.optional)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_never_go_back() {
        let stages: Vec<Stage> = ORDER.iter().map(|s| s.stage()).collect();
        assert!(stages.windows(2).all(|w| w[0] <= w[1]), "{stages:?}");
        assert_eq!(ORDER.last(), Some(&Step::Seccomp));
        let bs = ORDER.iter().position(|s| *s == Step::BoundingSet);
        let uid = ORDER.iter().position(|s| *s == Step::Uid);
        assert!(
            bs < uid,
            "the bounding set needs CAP_SETPCAP, before the uid changes"
        );
    }

    #[test]
    fn names_are_the_serialized_names() {
        for s in ORDER {
            let json = serde_json::to_string(s).expect("serialize");
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
    }
}

#[cfg(test)]
#[path = "steps_tests.rs"]
mod recorded;
