//! The generations of one session: which kernel is live, its number, and
//! why the next result must say `state_reset`.
//!
//! This is the one lifecycle of a session's kernels. The sessions crate's
//! `Registry` keeps a [`Lineage`] per session (with eviction, idle reaping,
//! the warm pool and the journal around it); [`crate::Session`] is the
//! single-kernel case for library callers (a [`Lineage`] and a config).
//! Neither decides anything of its own about generations or resets.

use crate::kernel::Kernel;
use crate::result::CellResult;

/// The kernels of one session, one generation each.
///
/// Rules (the same for every caller):
/// - generations count up from 1; a new kernel gets the next number
///   ([`Lineage::next_generation`]), which a journal may raise
///   ([`Lineage::install`] takes any larger number);
/// - a kernel that is gone for any reason (died, killed by an escalated
///   interrupt, evicted, reaped, restarted) leaves a reason, and the first
///   result of a later generation carries it as `state_reset` with
///   `reset_reason` ([`Lineage::settle`]); the reason is given once.
#[derive(Debug, Default)]
pub struct Lineage {
    kernel: Option<Kernel>,
    generation: u64,
    pending_reset: Option<String>,
}

impl Lineage {
    /// A lineage whose first kernel will be generation `first` (at least 1).
    pub fn starting_at(first: u64) -> Self {
        Lineage {
            kernel: None,
            generation: first.saturating_sub(1),
            pending_reset: None,
        }
    }

    /// The generation of the latest kernel (0 before the first).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The number the next kernel gets.
    pub fn next_generation(&self) -> u64 {
        self.generation + 1
    }

    /// The latest kernel while it is alive.
    pub fn live(&self) -> Option<&Kernel> {
        self.kernel.as_ref().filter(|k| k.is_alive())
    }

    /// The latest kernel, alive or not yet noticed dead.
    pub fn held(&self) -> Option<&Kernel> {
        self.kernel.as_ref()
    }

    /// Forgets a held kernel that has died, recording why for the next
    /// result; returns its generation and the reason (for a journal's
    /// `kernel_ended`). `None` when the kernel is alive or none is held.
    pub fn forget_dead(&mut self) -> Option<(u64, String)> {
        let k = self.kernel.as_ref()?;
        if k.is_alive() {
            return None;
        }
        let why = k.exit_reason().unwrap_or_else(|| "the kernel died".into());
        self.pending_reset.get_or_insert(format!(
            "the previous kernel (generation {}) {why}",
            self.generation
        ));
        self.kernel = None;
        Some((self.generation, why))
    }

    /// Takes the kernel out (the caller kills it), recording `why` for the
    /// next result: `the previous kernel (generation N) <why>`, e.g. `was
    /// evicted to make room …`. `None` when no kernel is held.
    pub fn retire(&mut self, why: &str) -> Option<Kernel> {
        let k = self.kernel.take()?;
        self.pending_reset = Some(format!(
            "the previous kernel (generation {}) {why}",
            self.generation
        ));
        Some(k)
    }

    /// Takes the kernel out without a reason for the next result (the
    /// session itself ends: killed, disposed, replaced by a restore that
    /// reports on its own).
    pub fn take(&mut self) -> Option<Kernel> {
        self.kernel.take()
    }

    /// Makes `kernel` the live one, as generation `generation` (the caller
    /// got it from [`Lineage::next_generation`] or a larger journaled
    /// number).
    pub fn install(&mut self, kernel: Kernel, generation: u64) {
        self.kernel = Some(kernel);
        self.generation = generation;
    }

    /// Stamps the result of a cell that ran in generation `generation`: the
    /// pending reset (if this is still the latest generation) goes onto it,
    /// and a kernel that did not survive the cell (`survived` false) leaves
    /// the reason for the next one (an escalated interrupt, a crash, a
    /// death).
    pub fn settle(&mut self, generation: u64, survived: bool, r: &mut CellResult) {
        if self.generation != generation {
            return;
        }
        if let Some(why) = self.pending_reset.take() {
            r.kernel.state_reset = true;
            r.kernel.reset_reason = Some(why);
        }
        if survived {
            return;
        }
        let why = match (&r.interrupt, &r.crash) {
            (Some(i), _) if i.escalated => format!(
                "the previous kernel (generation {generation}) was killed during cell {}: {}",
                r.cell_id,
                i.reason
                    .as_deref()
                    .unwrap_or("an interrupt did not stop the cell")
            ),
            (_, Some(c)) => format!("the previous kernel (generation {generation}): {}", c.message),
            _ => format!("the previous kernel (generation {generation}) died"),
        };
        self.pending_reset = Some(why);
    }

    /// Records a reason for the next result without touching the kernel
    /// (a restart that kills the kernel itself).
    pub fn note_reset(&mut self, why: String) {
        self.pending_reset = Some(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: serde_json::Value) -> CellResult {
        let mut base = serde_json::json!({
            "cell_id": "c1", "status": "ok", "execution_count": 1,
            "stdout": "", "stderr": "", "duration_ms": 0, "result": null,
            "displays": [], "error": null,
            "kernel": {"session": "s", "generation": 1, "pid": 1, "reused": false,
                       "state_reset": false, "sandbox": {"mode": "off"}},
        });
        if let (Some(b), Some(extra)) = (base.as_object_mut(), json.as_object()) {
            b.extend(extra.clone());
        }
        serde_json::from_value(base).expect("a cell result")
    }

    #[test]
    fn a_reset_reason_reaches_one_result_of_the_latest_generation() {
        let mut l = Lineage::starting_at(1);
        assert_eq!((l.generation(), l.next_generation()), (0, 1));
        l.note_reset("restarted".into());
        // A late result of an older generation does not take it.
        let mut old = result(serde_json::json!({}));
        l.generation = 2;
        l.settle(1, true, &mut old);
        assert!(!old.kernel.state_reset);
        let mut r = result(serde_json::json!({}));
        l.settle(2, true, &mut r);
        assert!(r.kernel.state_reset);
        assert_eq!(r.kernel.reset_reason.as_deref(), Some("restarted"));
        let mut next = result(serde_json::json!({}));
        l.settle(2, true, &mut next);
        assert!(!next.kernel.state_reset, "given once");
    }

    #[test]
    fn a_kernel_lost_in_a_cell_leaves_the_reason_for_the_next() {
        let mut l = Lineage::starting_at(3);
        l.generation = 3;
        let mut r = result(serde_json::json!({
            "status": "interrupted",
            "interrupt": {"delivered": true, "escalated": true, "state_kept": false,
                          "reason": "no stop after 2 s"},
        }));
        l.settle(3, false, &mut r);
        assert!(!r.kernel.state_reset);
        let mut next = result(serde_json::json!({}));
        l.settle(3, true, &mut next);
        assert_eq!(
            next.kernel.reset_reason.as_deref(),
            Some("the previous kernel (generation 3) was killed during cell c1: no stop after 2 s")
        );
        let mut crashed = result(serde_json::json!({
            "status": "crashed", "crash": {"message": "killed by SIGKILL"},
        }));
        l.settle(3, false, &mut crashed);
        let mut after = result(serde_json::json!({}));
        l.settle(3, true, &mut after);
        assert_eq!(
            after.kernel.reset_reason.as_deref(),
            Some("the previous kernel (generation 3): killed by SIGKILL")
        );
    }
}
