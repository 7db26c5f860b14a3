//! The placements the host knows, keyed by the `kind` of a
//! `[placement.<name>]` table: [`AnyPlacement`]. [`Placement`] is not
//! object-safe (its methods return `impl Future`), so the registry is an
//! enum; a scheduler is one more variant and one more arm in
//! [`AnyPlacement::from_config`] and in the `Placement` impl below.

use std::sync::Arc;

use cellhost_placement::{
    Placed, PlacedState, Placement, PlacementError, PlacementOptions, PlacementRequest,
};

use crate::loopback::LoopbackPlacement;

/// Kinds [`AnyPlacement::from_config`] knows.
pub const KINDS: &[&str] = &["loopback", "slurm", "ssh", "kubernetes"];

/// One configured placement.
#[derive(Debug, Clone)]
pub enum AnyPlacement {
    /// The agent as a local child process.
    Loopback(LoopbackPlacement),
    /// A cluster scheduler of `cellhost-placement` (Slurm, SSH,
    /// Kubernetes), its options parsed from the table by that crate.
    Scheduler(Arc<cellhost_placement::config::AnyPlacement>),
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
            "slurm" | "ssh" | "kubernetes" => {
                // Keys of the host's own (`agent`: the agent binary on
                // the node; `agent_grace_s`: its `--connect-grace`) are not
                // the scheduler's options.
                let mut options = table.clone();
                options.remove("agent");
                if let Some(v) = options.remove("agent_grace_s") {
                    agent_grace(name, &v)?;
                }
                let options = PlacementOptions::from_value(name, toml::Value::Table(options))?;
                cellhost_placement::config::AnyPlacement::new(name, options)
                    .map(|p| AnyPlacement::Scheduler(Arc::new(p)))
            }
            other => Err(PlacementError::Config {
                name: name.into(),
                message: format!("unknown kind `{other}` (known: {})", KINDS.join(", ")),
            }),
        }
    }
}

/// `agent_grace_s` of a placement table: seconds, more than 0, at most a
/// day (the agent's own bound).
///
/// # Errors
/// [`PlacementError::Config`] naming the key.
pub fn agent_grace(name: &str, value: &toml::Value) -> Result<f64, PlacementError> {
    let secs = match value {
        toml::Value::Integer(i) => *i as f64,
        toml::Value::Float(f) => *f,
        _ => f64::NAN,
    };
    if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 {
        Ok(secs)
    } else {
        Err(PlacementError::Config {
            name: name.into(),
            message: format!("`agent_grace_s` must be seconds in (0, 86400], not {value}"),
        })
    }
}

impl Placement for AnyPlacement {
    fn kind(&self) -> &'static str {
        match self {
            AnyPlacement::Loopback(p) => p.kind(),
            AnyPlacement::Scheduler(p) => p.kind(),
        }
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        match self {
            AnyPlacement::Loopback(p) => p.place(request).await,
            AnyPlacement::Scheduler(p) => p.place(request).await,
        }
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        match self {
            AnyPlacement::Loopback(p) => p.state(placed).await,
            AnyPlacement::Scheduler(p) => p.state(placed).await,
        }
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        match self {
            AnyPlacement::Loopback(p) => p.cancel(placed).await,
            AnyPlacement::Scheduler(p) => p.cancel(placed).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_grace_is_seconds_in_range_and_not_a_scheduler_option() {
        for ok in [
            toml::Value::Integer(1),
            toml::Value::Float(2.5),
            toml::Value::Integer(86_400),
        ] {
            assert!(agent_grace("box", &ok).is_ok(), "{ok}");
        }
        for bad in [
            toml::Value::Integer(0),
            toml::Value::Integer(-3),
            toml::Value::Float(f64::NAN),
            toml::Value::Integer(86_401),
            toml::Value::String("5s".into()),
        ] {
            let e = agent_grace("box", &bad).expect_err("refused");
            assert!(e.to_string().contains("agent_grace_s"), "{e}");
        }
        // The ssh placement's own options refuse unknown keys: the host's
        // key is taken out before they are read.
        let table: toml::Table =
            "kind = \"ssh\"\nhost = \"box\"\nagent = \"/opt/cellhost\"\nagent_grace_s = 5\n"
                .parse()
                .expect("table");
        assert!(AnyPlacement::from_config("box", &table).is_ok());
        let table: toml::Table = "kind = \"ssh\"\nhost = \"box\"\nagent_grace_s = \"soon\"\n"
            .parse()
            .expect("table");
        assert!(AnyPlacement::from_config("box", &table).is_err());
    }
}
