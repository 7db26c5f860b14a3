//! The placements the host knows, keyed by the `kind` of a
//! `[placement.<name>]` table: [`AnyPlacement`]. [`Placement`] is not
//! object-safe (its methods return `impl Future`), so the registry is an
//! enum; a scheduler is one more variant and one more arm in
//! [`AnyPlacement::from_config`] and in the `Placement` impl below.

use cellhost_placement::{Placed, PlacedState, Placement, PlacementError, PlacementRequest};

use crate::loopback::LoopbackPlacement;

/// Kinds [`AnyPlacement::from_config`] knows.
pub const KINDS: &[&str] = &["loopback"];

/// One configured placement.
#[derive(Debug, Clone)]
pub enum AnyPlacement {
    /// The agent as a local child process.
    Loopback(LoopbackPlacement),
}

impl AnyPlacement {
    /// The placement of table `[placement.<name>]` (`kind` and the kind's
    /// own options).
    ///
    /// # Errors
    /// [`PlacementError::Config`]: no or unknown `kind`, bad options.
    pub fn from_config(name: &str, table: &toml::Table) -> Result<AnyPlacement, PlacementError> {
        let kind = match table.get("kind") {
            Some(toml::Value::String(k)) => k.as_str(),
            _ => {
                return Err(PlacementError::Config {
                    name: name.into(),
                    message: format!("`kind` is required (one of {})", KINDS.join(", ")),
                });
            }
        };
        match kind {
            "loopback" => LoopbackPlacement::from_options(name, table).map(AnyPlacement::Loopback),
            other => Err(PlacementError::Config {
                name: name.into(),
                message: format!("unknown kind `{other}` (known: {})", KINDS.join(", ")),
            }),
        }
    }
}

impl Placement for AnyPlacement {
    fn kind(&self) -> &'static str {
        match self {
            AnyPlacement::Loopback(p) => p.kind(),
        }
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        match self {
            AnyPlacement::Loopback(p) => p.place(request).await,
        }
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        match self {
            AnyPlacement::Loopback(p) => p.state(placed).await,
        }
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        match self {
            AnyPlacement::Loopback(p) => p.cancel(placed).await,
        }
    }
}
