//! The sandbox floor: the one rule for a sandbox mode a request carries.
//!
//! A host (the daemon, `serve`, an MCP server) is started with a sandbox
//! mode — its `--sandbox` flag, else the config's `sandbox_mode`, else
//! `auto` — and that mode is its *floor*. A request may ask for a stronger
//! mode (`enforce` on an `auto` host) and gets it; it may never lower the
//! mode below the floor (`off` on an `auto` host): that is refused with
//! [`BelowFloor`] (code `sandbox_below_floor`), never silently applied and
//! never silently raised. A request that names no mode gets the floor.

use cellhost_sandbox::profile::SandboxMode;

/// A request asked for a weaker sandbox than the host's floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "sandbox mode {requested} is below this host's floor {floor}: it was started with sandbox mode {floor} \
     (its --sandbox flag or the config's sandbox_mode), and no request may lower that; \
     start it with --sandbox {requested} to allow it"
)]
pub struct BelowFloor {
    /// The mode asked for.
    pub requested: SandboxMode,
    /// The host's floor.
    pub floor: SandboxMode,
}

impl BelowFloor {
    /// The stable error code of every surface: `sandbox_below_floor`.
    pub const CODE: &'static str = "sandbox_below_floor";
}

/// The mode a request gets on a host whose floor is `floor`: `requested`
/// when it is at least the floor, the floor when the request names none.
///
/// # Errors
/// [`BelowFloor`] when `requested` is weaker than `floor`.
pub fn sandbox_for_request(
    floor: SandboxMode,
    requested: Option<SandboxMode>,
) -> Result<SandboxMode, BelowFloor> {
    match requested {
        None => Ok(floor),
        Some(r) if r >= floor => Ok(r),
        Some(r) => Err(BelowFloor { requested: r, floor }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxMode::{Auto, Enforce, Off};

    #[test]
    fn a_request_may_raise_the_floor_but_never_lower_it() {
        assert_eq!(sandbox_for_request(Auto, None), Ok(Auto));
        assert_eq!(sandbox_for_request(Auto, Some(Enforce)), Ok(Enforce));
        assert_eq!(sandbox_for_request(Auto, Some(Auto)), Ok(Auto));
        assert_eq!(
            sandbox_for_request(Auto, Some(Off)),
            Err(BelowFloor {
                requested: Off,
                floor: Auto
            })
        );
        assert_eq!(
            sandbox_for_request(Enforce, Some(Auto)),
            Err(BelowFloor {
                requested: Auto,
                floor: Enforce
            })
        );
        assert_eq!(sandbox_for_request(Off, Some(Off)), Ok(Off));
        assert_eq!(sandbox_for_request(Off, Some(Enforce)), Ok(Enforce));
    }
}
