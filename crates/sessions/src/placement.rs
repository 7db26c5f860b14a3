//! Where kernels run: `placement = "local"` (default) or the name of a
//! `[placement.<name>]` table, whose `kind` picks the implementation
//! (`cellhost_remote::AnyPlacement`). A remote placement becomes the
//! kernel config's [`KernelStarter`]; the host's TLS listener for agents
//! starts once per process, at the first remote kernel.
//!
//! In the config file, `placement = "NAME"` names the default; with
//! placement tables, the same is `[placement]` `default = "NAME"` (TOML
//! cannot hold a key that is both a string and a table). Listener options
//! in `[placement]`: `listen` (`"0.0.0.0:7400"`, default
//! `"127.0.0.1:0"`), `advertise` (`"head-node:7400"`, what credentials
//! name).
//!
//! Keys of a `[placement.<name>]` table the host reads itself, next to the
//! placement's own: `agent` (the `cellhost` binary on the node) and
//! `agent_grace_s` (seconds the agent waits for a lost host connection
//! before it kills its worker; the agent's default is 30).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use cellhost_kernel::{Kernel, KernelConfig, KernelError, KernelStarter};
use cellhost_remote::{
    AnyPlacement, HostIdentity, HostOptions, MemoryNonces, NonceStore, RemoteHost, RemoteStarter,
};

/// The name of the default, local placement.
pub const LOCAL: &str = "local";

/// The configured placements.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Placements {
    /// The default placement's name (`local` when none is set).
    pub default: String,
    /// `[placement.<name>]` tables.
    pub tables: BTreeMap<String, toml::Table>,
    /// `listen` of the `[placement]` table.
    pub listen: Option<String>,
    /// `advertise` of the `[placement]` table.
    pub advertise: Option<String>,
}

impl Placements {
    /// No placement tables: every kernel runs locally.
    pub fn local() -> Placements {
        Placements {
            default: LOCAL.into(),
            ..Placements::default()
        }
    }

    /// From the config file's `placement` value: a string (the default's
    /// name) or a table (`default`, `listen`, `advertise`, sub-tables).
    ///
    /// # Errors
    /// A message for a value of the wrong shape or an invalid table.
    pub fn parse(value: Option<toml::Value>) -> Result<Placements, String> {
        let mut p = Placements::local();
        match value {
            None => {}
            Some(toml::Value::String(s)) => p.default = s,
            Some(toml::Value::Table(t)) => {
                for (k, v) in t {
                    match (k.as_str(), v) {
                        ("default", toml::Value::String(s)) => p.default = s,
                        ("listen", toml::Value::String(s)) => p.listen = Some(s),
                        ("advertise", toml::Value::String(s)) => p.advertise = Some(s),
                        (name, toml::Value::Table(t)) => {
                            if name == LOCAL {
                                return Err("`[placement.local]` is reserved for the local placement".into());
                            }
                            AnyPlacement::from_config(name, &t).map_err(|e| e.to_string())?;
                            p.tables.insert(name.to_string(), t);
                        }
                        (k, _) => {
                            return Err(format!(
                                "`placement.{k}`: expected `default`, `listen`, `advertise` (strings) or a [placement.NAME] table"
                            ));
                        }
                    }
                }
            }
            Some(_) => return Err("`placement` must be a name or a table".into()),
        }
        p.check(&p.default.clone())?;
        Ok(p)
    }

    /// `name` is `local` or a configured table.
    ///
    /// # Errors
    /// A message naming the known placements.
    pub fn check(&self, name: &str) -> Result<(), String> {
        if name == LOCAL || self.tables.contains_key(name) {
            return Ok(());
        }
        let mut known: Vec<&str> = vec![LOCAL];
        known.extend(self.tables.keys().map(String::as_str));
        Err(format!(
            "unknown placement `{name}` (configured: {})",
            known.join(", ")
        ))
    }

    /// The kind of placement `name` (`local`, or its table's `kind`:
    /// `slurm`, `kubernetes`, `ssh`, `loopback`); empty for a name not
    /// configured.
    pub fn kind(&self, name: &str) -> String {
        if name == LOCAL {
            return LOCAL.into();
        }
        self.tables
            .get(name)
            .and_then(|t| t.get("kind"))
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_string()
    }

    /// The starter of placement `name` (`None` for `local`).
    ///
    /// # Errors
    /// As [`Placements::check`], or the table's own error.
    pub fn starter(&self, name: &str) -> Result<Option<Arc<dyn KernelStarter>>, String> {
        self.check(name)?;
        let Some(table) = self.tables.get(name) else {
            return Ok(None);
        };
        let placement = AnyPlacement::from_config(name, table).map_err(|e| e.to_string())?;
        let program = table.get("agent").and_then(|v| v.as_str()).map(str::to_string);
        let grace = match table.get("agent_grace_s") {
            Some(v) => Some(cellhost_remote::placements::agent_grace(name, v).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Some(Arc::new(LazyStarter {
            name: name.to_string(),
            placement,
            program,
            grace,
            listen: self.listen.clone(),
            advertise: self.advertise.clone(),
        })))
    }
}

static NONCES: OnceLock<Arc<dyn NonceStore>> = OnceLock::new();
static IDENTITY_DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
static HOST: tokio::sync::OnceCell<RemoteHost> = tokio::sync::OnceCell::const_new();

/// Keeps the host's certificate and key in `dir` (made on first use,
/// the key 0600) instead of a fresh certificate per process. Takes effect
/// when called before the first remote kernel starts.
pub fn keep_identity_in(dir: std::path::PathBuf) {
    let _ = IDENTITY_DIR.set(dir);
}

/// Burns the credential nonces of this process's remote agents in
/// `journal` (durably) instead of in memory. Takes effect when called
/// before the first remote kernel starts.
pub fn burn_nonces_in(journal: Arc<crate::journal::Journal>) {
    let _ = NONCES.set(Arc::new(JournalNonces(journal)));
}

struct JournalNonces(Arc<crate::journal::Journal>);

impl NonceStore for JournalNonces {
    fn burn<'a>(&'a self, nonce: &'a str) -> cellhost_remote::host::BurnFuture<'a> {
        Box::pin(async move { self.0.burn_nonce(nonce).await.map_err(|e| e.to_string()) })
    }
}

/// A placement's starter that starts the process's listener on first use.
struct LazyStarter {
    name: String,
    placement: AnyPlacement,
    program: Option<String>,
    /// The agent's `--connect-grace`, seconds (`agent_grace_s`).
    grace: Option<f64>,
    listen: Option<String>,
    advertise: Option<String>,
}

impl LazyStarter {
    async fn host(&self, label: &str) -> Result<RemoteHost, KernelError> {
        let fail = |message: String| KernelError::Remote {
            kernel: label.to_string(),
            code: "placement_config",
            message,
        };
        HOST.get_or_try_init(|| async {
            let mut opts = HostOptions::default();
            if let Some(l) = &self.listen {
                opts.listen = l
                    .parse()
                    .map_err(|e| fail(format!("placement.listen {l:?}: {e}")))?;
            }
            opts.advertise = self.advertise.clone();
            let identity = match IDENTITY_DIR.get() {
                Some(dir) => HostIdentity::load_or_create(dir),
                None => HostIdentity::generate(),
            }
            .map_err(&fail)?;
            let nonces = NONCES
                .get()
                .cloned()
                .unwrap_or_else(|| Arc::new(MemoryNonces::default()) as Arc<dyn NonceStore>);
            RemoteHost::start(opts, identity, nonces).await.map_err(&fail)
        })
        .await
        .cloned()
    }
}

impl KernelStarter for LazyStarter {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(
        &self,
        config: KernelConfig,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Kernel, KernelError>> + Send + '_>> {
        Box::pin(async move {
            let host = self.host(&config.label()).await?;
            let starter = RemoteStarter::new(
                self.name.clone(),
                host,
                self.placement.clone(),
                self.program.clone(),
            )
            .with_agent_args(
                self.grace
                    .map(|g| ["--connect-grace".to_string(), format!("{g}s")])
                    .into_iter()
                    .flatten(),
            );
            starter.start(config).await
        })
    }
}
