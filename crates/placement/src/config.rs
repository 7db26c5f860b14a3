//! The `[placement.<name>]` tables of cellhost's config file: one
//! [`PlacementOptions`] per name, its `kind` choosing the scheduler.
//!
//! ```toml
//! [placement.cluster]
//! kind = "slurm"
//! partition = "gpu"
//!
//! [placement.box]
//! kind = "ssh"
//! host = "box.example.org"
//! ```

use crate::slurm::{SlurmOptions, SlurmPlacement};
use crate::ssh::{SshOptions, SshPlacement};
use crate::{Placed, PlacedState, Placement, PlacementError, PlacementRequest};

/// One `[placement.<name>]` table, by its `kind`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PlacementOptions {
    /// `kind = "slurm"`: [`SlurmOptions`].
    Slurm(SlurmOptions),
    /// `kind = "ssh"`: [`SshOptions`].
    Ssh(SshOptions),
    /// `kind = "kubernetes"`:
    /// [`KubernetesOptions`](crate::kubernetes::KubernetesOptions).
    #[cfg(feature = "kubernetes")]
    Kubernetes(crate::kubernetes::KubernetesOptions),
}

impl PlacementOptions {
    /// Parses one table given as TOML text (the table's body, `kind` included).
    ///
    /// # Errors
    /// [`PlacementError::Config`] with TOML's message (unknown kind, unknown
    /// or mistyped field).
    pub fn from_toml(name: &str, text: &str) -> Result<Self, PlacementError> {
        toml::from_str(text).map_err(|e| PlacementError::Config {
            name: name.to_owned(),
            message: e.message().to_owned(),
        })
    }

    /// Parses one table already read as a TOML value.
    ///
    /// # Errors
    /// As [`PlacementOptions::from_toml`].
    pub fn from_value(name: &str, value: toml::Value) -> Result<Self, PlacementError> {
        value
            .try_into()
            .map_err(|e: toml::de::Error| PlacementError::Config {
                name: name.to_owned(),
                message: e.message().to_owned(),
            })
    }

    /// The table's kind: `slurm`, `ssh`, `kubernetes`.
    pub fn kind(&self) -> &'static str {
        match self {
            PlacementOptions::Slurm(_) => crate::slurm::KIND,
            PlacementOptions::Ssh(_) => crate::ssh::KIND,
            #[cfg(feature = "kubernetes")]
            PlacementOptions::Kubernetes(_) => crate::kubernetes::KIND,
        }
    }
}

/// A placement built from its table, ready to place.
#[derive(Debug)]
pub enum AnyPlacement {
    /// A [`SlurmPlacement`].
    Slurm(SlurmPlacement),
    /// An [`SshPlacement`].
    Ssh(SshPlacement),
    /// A [`KubernetesPlacement`](crate::kubernetes::KubernetesPlacement)
    /// (boxed: its Pod template is large).
    #[cfg(feature = "kubernetes")]
    Kubernetes(Box<crate::kubernetes::KubernetesPlacement>),
}

impl AnyPlacement {
    /// Builds the placement of table `name`.
    ///
    /// # Errors
    /// [`PlacementError::Config`] when the options are invalid.
    pub fn new(name: &str, options: PlacementOptions) -> Result<Self, PlacementError> {
        Ok(match options {
            PlacementOptions::Slurm(o) => AnyPlacement::Slurm(SlurmPlacement::new(name, o)?),
            PlacementOptions::Ssh(o) => AnyPlacement::Ssh(SshPlacement::new(name, o)?),
            #[cfg(feature = "kubernetes")]
            PlacementOptions::Kubernetes(o) => {
                AnyPlacement::Kubernetes(Box::new(crate::kubernetes::KubernetesPlacement::new(name, o)?))
            }
        })
    }
}

/// Dispatches to the placement inside.
impl Placement for AnyPlacement {
    fn kind(&self) -> &'static str {
        match self {
            AnyPlacement::Slurm(p) => p.kind(),
            AnyPlacement::Ssh(p) => p.kind(),
            #[cfg(feature = "kubernetes")]
            AnyPlacement::Kubernetes(p) => p.kind(),
        }
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        match self {
            AnyPlacement::Slurm(p) => p.place(request).await,
            AnyPlacement::Ssh(p) => p.place(request).await,
            #[cfg(feature = "kubernetes")]
            AnyPlacement::Kubernetes(p) => p.place(request).await,
        }
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        match self {
            AnyPlacement::Slurm(p) => p.state(placed).await,
            AnyPlacement::Ssh(p) => p.state(placed).await,
            #[cfg(feature = "kubernetes")]
            AnyPlacement::Kubernetes(p) => p.state(placed).await,
        }
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        match self {
            AnyPlacement::Slurm(p) => p.cancel(placed).await,
            AnyPlacement::Ssh(p) => p.cancel(placed).await,
            #[cfg(feature = "kubernetes")]
            AnyPlacement::Kubernetes(p) => p.cancel(placed).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slurm_table_parses_and_unknown_fields_are_refused() {
        let parsed = PlacementOptions::from_toml(
            "c",
            "kind = \"slurm\"\npartition = \"gpu\"\nextra_args = [\"--mem=1G\"]\n",
        );
        match parsed {
            Ok(PlacementOptions::Slurm(o)) => {
                assert_eq!(o.partition.as_deref(), Some("gpu"));
                assert_eq!(o.extra_args, vec!["--mem=1G".to_owned()]);
            }
            other => panic!("{other:?}"),
        }
        let bad = PlacementOptions::from_toml("c", "kind = \"slurm\"\npartiton = \"gpu\"\n");
        assert!(
            matches!(&bad, Err(PlacementError::Config { message, .. }) if message.contains("partiton")),
            "{bad:?}"
        );
        let ssh = PlacementOptions::from_toml("b", "kind = \"ssh\"\nhost = \"box\"\nport = 2222\n");
        assert!(
            matches!(&ssh, Ok(PlacementOptions::Ssh(o)) if o.host == "box" && o.port == Some(2222)),
            "{ssh:?}"
        );
        let unknown = PlacementOptions::from_toml("c", "kind = \"pbs\"\n");
        assert!(matches!(unknown, Err(PlacementError::Config { .. })));
    }
}
