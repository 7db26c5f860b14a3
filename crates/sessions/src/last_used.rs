//! When a session was last used, kept without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When a session was last used (its kernel started, a cell settled, a
/// call on it ended): the idle reaper's and the LRU eviction's clock. An
/// atomic, not a field under the slot's lock, so the end of a call (the
/// drop of its attachment) updates it without that lock: a drop while the
/// lock is held would otherwise wait for itself.
///
/// Kept as nanoseconds since `epoch` (when the stamp was made) plus one;
/// 0 is never used. It never goes back: of two uses, the later stays,
/// whichever is stored last.
#[derive(Debug)]
pub(crate) struct LastUsed {
    epoch: Instant,
    nanos: AtomicU64,
}

impl LastUsed {
    /// Never used yet.
    pub(crate) fn new() -> Self {
        LastUsed {
            epoch: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    /// Marks the session used now.
    pub(crate) fn touch(&self) {
        // 584 years of nanoseconds fit in a u64; beyond that it saturates.
        let n = u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        self.nanos.fetch_max(n, Ordering::SeqCst);
    }

    /// When it was last used; `None` when never.
    pub(crate) fn get(&self) -> Option<Instant> {
        match self.nanos.load(Ordering::SeqCst) {
            0 => None,
            n => Some(self.epoch + Duration::from_nanos(n - 1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_used_until_touched_and_never_goes_back() {
        let l = LastUsed::new();
        assert_eq!(l.get(), None);
        l.touch();
        let first = l.get().expect("touched");
        assert!(first >= l.epoch && first <= Instant::now());
        // A stamp older than the one kept is ignored.
        l.nanos.fetch_max(1, Ordering::SeqCst);
        assert_eq!(l.get(), Some(first));
        l.touch();
        assert!(l.get().expect("touched") >= first);
    }
}
