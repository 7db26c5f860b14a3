//! One-line hints for a language model after common failures: the
//! runtime's for its errors, then the host's own.

use crate::config::KernelConfig;
use crate::result::{CellResult, CellStatus};

/// The hint for a result, if one applies.
pub(crate) fn hint_for(r: &CellResult, config: &KernelConfig, truncated: bool) -> Option<String> {
    if let Some(e) = &r.error
        && let Some(h) = config.runtime.error_hint(e, r, &config.python)
    {
        return Some(h);
    }
    if r.status == CellStatus::Crashed {
        return Some(
            "The worker died, so the session's variables are gone; the next cell starts a fresh kernel."
                .into(),
        );
    }
    if truncated {
        return Some(
            "Output was cut; read the full stream from the spill file by offset (read_output / `cellhost output`) instead of re-running the cell."
                .into(),
        );
    }
    None
}
