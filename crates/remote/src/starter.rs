//! [`RemoteStarter`]: the [`KernelStarter`] of a placement. It issues the
//! credential, asks the placement to start the agent, waits for the agent
//! to dial back and be admitted, and completes the kernel over a
//! [`RemoteLink`] with the kernel crate's own handshake and driver.

use std::sync::Arc;
use std::time::Duration;

use cellhost_kernel::link::Launch;
use cellhost_kernel::{Kernel, KernelConfig, KernelError, KernelPlacement, KernelStarter, PlacementStart};
use cellhost_placement::{CREDENTIAL_PLACEHOLDER, Placed, Placement, PlacementRequest};

use crate::host::RemoteHost;
use crate::link::RemoteLink;
use crate::placements::AnyPlacement;
use crate::wire::{AgentSpec, Msg, read_msg};

/// How often the scheduler is asked about an agent that has not dialled
/// back yet.
const STATE_POLL: Duration = Duration::from_secs(1);

/// Starts kernels through one configured placement.
#[derive(Clone)]
pub struct RemoteStarter {
    name: String,
    host: RemoteHost,
    placement: Arc<AnyPlacement>,
    agent_argv: Vec<String>,
    /// How long the scheduler may queue the agent and the agent may take
    /// to dial back (10 min).
    pub dial_timeout: Duration,
}

impl std::fmt::Debug for RemoteStarter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStarter")
            .field("name", &self.name)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

impl RemoteStarter {
    /// A starter for placement `name`. `program`: the `cellhost` binary
    /// on the node (`cellhost` on its `PATH` by default).
    pub fn new(
        name: impl Into<String>,
        host: RemoteHost,
        placement: AnyPlacement,
        program: Option<String>,
    ) -> Self {
        RemoteStarter {
            name: name.into(),
            host,
            placement: Arc::new(placement),
            agent_argv: vec![
                program.unwrap_or_else(|| "cellhost".into()),
                "agent".into(),
                "--credential".into(),
                CREDENTIAL_PLACEHOLDER.into(),
            ],
            dial_timeout: Duration::from_secs(600),
        }
    }

    /// The same starter with `args` appended to the agent's command line
    /// (`--connect-grace 5s`).
    pub fn with_agent_args(mut self, args: impl IntoIterator<Item = String>) -> Self {
        self.agent_argv.extend(args);
        self
    }

    /// The placement.
    pub fn placement(&self) -> &AnyPlacement {
        &self.placement
    }

    /// The listener.
    pub fn host(&self) -> &RemoteHost {
        &self.host
    }

    fn spec(&self, config: &KernelConfig) -> AgentSpec {
        AgentSpec {
            session: config.session.clone(),
            generation: config.generation,
            language: config.runtime.name().to_string(),
            python: config.python.clone(),
            sandbox: config.sandbox.clone(),
            limits: config.limits.clone(),
            tools: config.tool_names(),
            startup_timeout_ms: config.startup_timeout.as_millis() as u64,
            heartbeat_ms: self.host.options().heartbeat.as_millis() as u64,
        }
    }

    async fn start_kernel(&self, config: KernelConfig) -> Result<Kernel, KernelError> {
        let label = config.label();
        let requested = tokio::time::Instant::now();
        let remote = |code: &'static str, message: String| KernelError::Remote {
            kernel: label.clone(),
            code,
            message,
        };
        let mut expected = self.host.expect(self.spec(&config), self.dial_timeout);
        let request = PlacementRequest {
            token: format!("cellhost-{}", expected.credential().allocation),
            session: config.session.clone(),
            generation: config.generation,
            agent_argv: self.agent_argv.clone(),
            credential: expected.credential().to_bytes(),
            env: Default::default(),
            queue_timeout: self.dial_timeout,
        };
        let placed = self
            .placement
            .place(&request)
            .await
            .map_err(|e| remote(e.code(), e.to_string()))?;
        let mut cancel = CancelGuard::new(self.placement.clone(), placed.clone());
        let until = tokio::time::Instant::now() + self.dial_timeout;
        let mut conn = loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(remote(
                    "dial_back_timeout",
                    format!(
                        "the node agent ({} job {}) did not dial back within {} s",
                        placed.kind,
                        placed.job,
                        self.dial_timeout.as_secs()
                    ),
                ));
            }
            if let Some(c) = expected.wait(left.min(STATE_POLL)).await {
                break c;
            }
            // An agent that ended (or a job the scheduler dropped) never
            // dials back: say so now, with the scheduler's words.
            if let Ok(cellhost_placement::PlacedState::Ended { detail }) = self.placement.state(&placed).await
            {
                return Err(remote(
                    "dial_back_failed",
                    format!(
                        "the node agent ({} job {}) ended before it was admitted: {detail}",
                        placed.kind, placed.job
                    ),
                ));
            }
        };
        drop(expected);
        let admitted = tokio::time::Instant::now();
        let first = tokio::time::timeout(
            config.startup_timeout,
            read_msg(&mut conn, crate::wire::HANDSHAKE_CAP),
        )
        .await;
        let started = match first {
            Ok(Ok(Some(Msg::Started(s)))) => s,
            Ok(Ok(Some(Msg::SpawnFailed(why)))) => {
                return Err(KernelError::Spawn {
                    python: config.python.display().to_string(),
                    reason: format!("on node {}: {why}", placed.node.clone().unwrap_or_default()),
                });
            }
            Ok(Ok(other)) => {
                return Err(remote(
                    "remote_failed",
                    format!("the node agent sent {other:?} first"),
                ));
            }
            Ok(Err(e)) => {
                return Err(remote(
                    "remote_failed",
                    format!("the node agent's connection: {e}"),
                ));
            }
            Err(_) => {
                return Err(KernelError::StartupTimeout {
                    kernel: label.clone(),
                    timeout_ms: config.startup_timeout.as_millis() as u64,
                });
            }
        };
        let opts = self.host.options();
        let on_release = cancel
            .take()
            .map(|g| Box::new(move || g.spawn()) as crate::link::OnRelease);
        let launch = Launch {
            label: label.clone(),
            sandboxed: started.sandboxed,
            host_layers: started.host_layers,
            template: None,
            limits: started.limits,
            placement: Some(KernelPlacement {
                name: self.name.clone(),
                kind: placed.kind.clone(),
                node: started.node.clone(),
                job: placed.job.clone(),
                start: started
                    .admitted_after_ms
                    .map(|agent| start_split(requested, admitted, agent)),
            }),
        };
        let link = RemoteLink::new(
            conn,
            started.node,
            started.init_pid,
            opts.heartbeat,
            opts.silence,
            on_release,
        );
        Kernel::attach(config, link, launch).await
    }
}

/// The start so far, at the agent's `Started`: the host's time from the
/// request to the admission less the agent's own part is the queue wait;
/// from the admission on is the handshake (the kernel adds its `ready`).
fn start_split(
    requested: tokio::time::Instant,
    admitted: tokio::time::Instant,
    agent_ms: u64,
) -> PlacementStart {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let to_admission = ms(admitted.saturating_duration_since(requested));
    let now = tokio::time::Instant::now();
    let agent_start_ms = agent_ms.min(to_admission);
    let handshake_ms = ms(now.saturating_duration_since(admitted));
    PlacementStart {
        queue_wait_ms: to_admission - agent_start_ms,
        agent_start_ms,
        handshake_ms,
        total_ms: to_admission.saturating_add(handshake_ms),
    }
}

/// Cancels a placement unless taken (the link takes it over once built).
struct CancelGuard(Option<Cancel>);

struct Cancel {
    placement: Arc<AnyPlacement>,
    placed: Placed,
}

impl Cancel {
    fn spawn(self) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = self.placement.cancel(&self.placed).await {
                    tracing::warn!("cancelling {} job {}: {e}", self.placed.kind, self.placed.job);
                }
            });
        }
    }
}

impl CancelGuard {
    fn new(placement: Arc<AnyPlacement>, placed: Placed) -> Self {
        CancelGuard(Some(Cancel { placement, placed }))
    }

    fn take(&mut self) -> Option<Cancel> {
        self.0.take()
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.spawn();
        }
    }
}

impl KernelStarter for RemoteStarter {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(
        &self,
        config: KernelConfig,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Kernel, KernelError>> + Send + '_>> {
        Box::pin(self.start_kernel(config))
    }
}
