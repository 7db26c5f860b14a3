//! The Kubernetes placement: one Pod per kernel through the API server
//! (kube-rs), the credential as a Secret volume owned by that Pod.
//!
//! # The Pod
//! Built from a template the user can override (`pod_template`, a Pod
//! manifest in YAML or JSON) or from `image` alone. The placement sets:
//! * `metadata.name` = the request's token (the idempotency key: a second
//!   place finds the Pod by name; a create racing another gets `409` and
//!   returns the Pod that won), `metadata.namespace`, `cellhost.io/*` labels
//!   and the queue-timeout annotation;
//! * `restartPolicy: Never` (the credential is single-use) and
//!   `automountServiceAccountToken: false` unless the template sets it (the
//!   kernel's code gets no API token by default);
//! * in the agent container (`container`, default `agent`, else the first):
//!   `command` = the agent's argv, the request's `env`, the downward-API
//!   variables `CELLHOST_POD_NAME`, `CELLHOST_POD_NAMESPACE`,
//!   `CELLHOST_NODE_NAME` (which the sandbox's environment allowlist passes
//!   to the kernel), `requests`/`limits` from the table, and a read-only
//!   mount of the credential volume at [`CREDENTIAL_DIR`].
//!
//! # The credential
//! A Secret `<token>-credential` (`immutable`, key `credential`) mounted as
//! a `secret` volume with `defaultMode: 0600` (the file is the volume's
//! `credential`, owned by root; the agent container runs as root unless the
//! template sets `fsGroup`, which is the cluster's usual way). The Secret is
//! created right after the Pod with an owner reference to it, so deleting
//! the Pod deletes the Secret (the garbage collector); the kubelet waits for
//! the Secret before starting the container. The credential is never in the
//! Pod spec, an environment variable or a command line.
//!
//! # State
//! From the Pod's phase and conditions: `Pending` is
//! [`PlacedState::Queued`] with the scheduler's reason (`Unschedulable: 0/3
//! nodes are available…`, `ImagePullBackOff: …`); an `Unschedulable` Pod
//! older than the request's `queue_timeout` (kept in the annotation
//! [`QUEUE_TIMEOUT_ANNOTATION`]) is [`PlacementError::Unschedulable`];
//! `Running` is [`PlacedState::Running`] on `spec.nodeName`; `Succeeded`,
//! `Failed` and a deleted Pod are [`PlacedState::Ended`].
//!
//! # Cancel
//! Deletes the Pod (grace `kill_grace_secs`, default 5: SIGTERM, then
//! SIGKILL to every container process) and the Secret; a Pod already gone
//! is not an error.
//!
//! RBAC: `get`, `create`, `delete` on `pods` and `secrets` in the one
//! namespace (deploy/kubernetes/rbac.yaml).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements, Secret,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams};

use crate::shell::is_token;
use crate::{CREDENTIAL_PLACEHOLDER, Placed, PlacedState, Placement, PlacementError, PlacementRequest};

/// Placement kind name.
pub const KIND: &str = "kubernetes";

/// Where the credential volume is mounted in the agent container.
pub const CREDENTIAL_DIR: &str = "/var/run/cellhost";

/// The credential file's path in the agent container.
pub const CREDENTIAL_PATH: &str = "/var/run/cellhost/credential";

/// Annotation holding the request's queue timeout, in seconds.
pub const QUEUE_TIMEOUT_ANNOTATION: &str = "cellhost.io/queue-timeout-secs";

/// Mode of the credential file in the secret volume.
pub const CREDENTIAL_MODE: i32 = 0o600;

const VOLUME: &str = "cellhost-credential";

/// The `[placement.<name>]` table of `kind = "kubernetes"`.
///
/// ```toml
/// [placement.k8s]
/// kind = "kubernetes"
/// namespace = "cellhost"
/// image = "registry.example.org/cellhost:0.1.0"
/// requests = { cpu = "1", memory = "2Gi" }
/// limits = { memory = "4Gi", "nvidia.com/gpu" = "1" }
/// # pod_template = "/etc/cellhost/pod.yaml"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesOptions {
    /// Namespace of the Pods and Secrets (default: the kubeconfig's, else
    /// `default`).
    pub namespace: Option<String>,
    /// The agent container's image (required unless the template sets it).
    pub image: Option<String>,
    /// A Pod manifest (YAML or JSON) to start from.
    pub pod_template: Option<PathBuf>,
    /// Name of the agent container in the template (default `agent`, else
    /// the template's first container).
    pub container: Option<String>,
    /// Resource requests of the agent container (`cpu`, `memory`, …).
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
    /// Resource limits of the agent container.
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
    /// `spec.serviceAccountName`.
    pub service_account: Option<String>,
    /// `spec.nodeSelector` entries.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// A kubeconfig file (default: in-cluster config, `KUBECONFIG`, then
    /// `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current one).
    pub context: Option<String>,
    /// Pod deletion grace on cancel, in seconds (default 5).
    pub kill_grace_secs: Option<u32>,
}

/// Starts node agents as Pods. See the module docs.
pub struct KubernetesPlacement {
    name: String,
    options: KubernetesOptions,
    template: Pod,
    client: tokio::sync::OnceCell<(kube::Client, String)>,
}

impl std::fmt::Debug for KubernetesPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesPlacement")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl KubernetesPlacement {
    /// Checks the options of the table `name` and reads the template; the
    /// API client is made at first use.
    ///
    /// # Errors
    /// [`PlacementError::Config`] for an unreadable or invalid template, or
    /// neither `image` nor a template image.
    pub fn new(name: &str, options: KubernetesOptions) -> Result<Self, PlacementError> {
        let config = |message: String| PlacementError::Config {
            name: name.to_owned(),
            message,
        };
        let template = match &options.pod_template {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| config(format!("pod_template {}: {e}", path.display())))?;
                let value: serde_json::Value = serde_yaml_ng::from_str(&text)
                    .map_err(|e| config(format!("pod_template {}: {e}", path.display())))?;
                if value.get("kind").and_then(|k| k.as_str()) != Some("Pod") {
                    return Err(config(format!(
                        "pod_template {} is not a manifest of kind Pod",
                        path.display()
                    )));
                }
                serde_json::from_value::<Pod>(value)
                    .map_err(|e| config(format!("pod_template {}: {e}", path.display())))?
            }
            None => Pod::default(),
        };
        let placement = Self {
            name: name.to_owned(),
            options,
            template,
            client: tokio::sync::OnceCell::new(),
        };
        // Fails now, not at the first kernel, when no image can be found.
        let probe = PlacementRequest {
            token: "cellhost-check".to_owned(),
            session: String::new(),
            generation: 0,
            agent_argv: vec![CREDENTIAL_PLACEHOLDER.to_owned()],
            credential: Vec::new(),
            env: BTreeMap::new(),
            queue_timeout: Duration::ZERO,
        };
        placement.pod(&probe, "default")?;
        Ok(placement)
    }

    /// As [`KubernetesPlacement::new`] with a client already made (tests,
    /// or a host that shares one client), in `namespace`.
    ///
    /// # Errors
    /// As [`KubernetesPlacement::new`].
    pub fn with_client(
        name: &str,
        options: KubernetesOptions,
        client: kube::Client,
        namespace: &str,
    ) -> Result<Self, PlacementError> {
        let placement = Self::new(name, options)?;
        let _ = placement.client.set((client, namespace.to_owned()));
        Ok(placement)
    }

    fn config(&self, message: String) -> PlacementError {
        PlacementError::Config {
            name: self.name.clone(),
            message,
        }
    }

    async fn client(&self) -> Result<&(kube::Client, String), PlacementError> {
        self.client
            .get_or_try_init(|| async {
                let unavailable = |message: String| PlacementError::Unavailable {
                    kind: KIND.to_owned(),
                    message,
                };
                let config = match &self.options.kubeconfig {
                    Some(path) => {
                        let kubeconfig = kube::config::Kubeconfig::read_from(path)
                            .map_err(|e| self.config(format!("kubeconfig {}: {e}", path.display())))?;
                        let opts = kube::config::KubeConfigOptions {
                            context: self.options.context.clone(),
                            ..Default::default()
                        };
                        kube::Config::from_custom_kubeconfig(kubeconfig, &opts)
                            .await
                            .map_err(|e| self.config(format!("kubeconfig {}: {e}", path.display())))?
                    }
                    None if self.options.context.is_some() => {
                        let opts = kube::config::KubeConfigOptions {
                            context: self.options.context.clone(),
                            ..Default::default()
                        };
                        kube::Config::from_kubeconfig(&opts)
                            .await
                            .map_err(|e| self.config(format!("kubeconfig: {e}")))?
                    }
                    None => kube::Config::infer()
                        .await
                        .map_err(|e| unavailable(format!("no cluster configuration: {e}")))?,
                };
                let namespace = self
                    .options
                    .namespace
                    .clone()
                    .unwrap_or_else(|| config.default_namespace.clone());
                let client =
                    kube::Client::try_from(config).map_err(|e| unavailable(format!("API client: {e}")))?;
                Ok((client, namespace))
            })
            .await
    }

    /// The Pod for `request` in `namespace` (see the module docs).
    ///
    /// # Errors
    /// [`PlacementError::Config`] for a token that is not a Pod name, an
    /// argv without the placeholder, an invalid quantity, or no image.
    pub fn pod(&self, request: &PlacementRequest, namespace: &str) -> Result<Pod, PlacementError> {
        let token = &request.token;
        if !is_token(token) || token.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(self.config(format!("token {token:?} is not a Pod name ([a-z0-9-]{{1,63}})")));
        }
        let argv = crate::slurm::agent_argv(&self.name, request, CREDENTIAL_PATH)?;
        let mut pod = self.template.clone();
        let meta = &mut pod.metadata;
        meta.name = Some(token.clone());
        meta.generate_name = None;
        meta.namespace = Some(namespace.to_owned());
        let labels = meta.labels.get_or_insert_with(BTreeMap::new);
        labels.insert("app.kubernetes.io/managed-by".to_owned(), "cellhost".to_owned());
        labels.insert("cellhost.io/session".to_owned(), label_value(&request.session));
        labels.insert(
            "cellhost.io/generation".to_owned(),
            request.generation.to_string(),
        );
        meta.annotations.get_or_insert_with(BTreeMap::new).insert(
            QUEUE_TIMEOUT_ANNOTATION.to_owned(),
            request.queue_timeout.as_secs().to_string(),
        );
        let spec = pod.spec.get_or_insert_with(PodSpec::default);
        spec.restart_policy = Some("Never".to_owned());
        if spec.automount_service_account_token.is_none() {
            spec.automount_service_account_token = Some(false);
        }
        if let Some(sa) = &self.options.service_account {
            spec.service_account_name = Some(sa.clone());
        }
        if !self.options.node_selector.is_empty() {
            spec.node_selector
                .get_or_insert_with(BTreeMap::new)
                .extend(self.options.node_selector.clone());
        }
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| v.name != VOLUME);
        volumes.push(Volume {
            name: VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name(token)),
                default_mode: Some(CREDENTIAL_MODE),
                optional: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        });
        let wanted = self.options.container.as_deref().unwrap_or("agent");
        let index = match spec.containers.iter().position(|c| c.name == wanted) {
            Some(i) => i,
            None if self.options.container.is_some() => {
                return Err(self.config(format!("pod_template has no container named {wanted:?}")));
            }
            None if spec.containers.is_empty() => {
                spec.containers.push(Container {
                    name: "agent".to_owned(),
                    ..Default::default()
                });
                0
            }
            None => 0,
        };
        let container = &mut spec.containers[index];
        if let Some(image) = &self.options.image {
            container.image = Some(image.clone());
        }
        if container.image.as_deref().is_none_or(str::is_empty) {
            return Err(self.config(
                "no image: set `image` or an image in the pod_template's agent container".to_owned(),
            ));
        }
        container.command = Some(argv);
        container.args = None;
        let env = container.env.get_or_insert_with(Vec::new);
        for (k, v) in &request.env {
            env.retain(|e| &e.name != k);
            env.push(EnvVar {
                name: k.clone(),
                value: Some(v.clone()),
                value_from: None,
            });
        }
        for (name, field) in [
            ("CELLHOST_POD_NAME", "metadata.name"),
            ("CELLHOST_POD_NAMESPACE", "metadata.namespace"),
            ("CELLHOST_NODE_NAME", "spec.nodeName"),
        ] {
            env.retain(|e| e.name != name);
            env.push(EnvVar {
                name: name.to_owned(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: field.to_owned(),
                        api_version: None,
                    }),
                    ..Default::default()
                }),
            });
        }
        let resources = container
            .resources
            .get_or_insert_with(ResourceRequirements::default);
        for (table, target) in [
            (&self.options.requests, &mut resources.requests),
            (&self.options.limits, &mut resources.limits),
        ] {
            for (k, v) in table {
                if v.trim().is_empty() {
                    return Err(self.config(format!("resource {k} has an empty quantity")));
                }
                target
                    .get_or_insert_with(BTreeMap::new)
                    .insert(k.clone(), Quantity(v.clone()));
            }
        }
        let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
        mounts.retain(|m| m.name != VOLUME);
        mounts.push(VolumeMount {
            name: VOLUME.to_owned(),
            mount_path: CREDENTIAL_DIR.to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
        Ok(pod)
    }

    /// The Secret holding `credential`, owned by `pod`.
    pub fn secret(pod: &Pod, credential: &[u8]) -> Secret {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let owner = OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: name.clone(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            controller: Some(false),
            block_owner_deletion: Some(false),
        };
        Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(&name)),
                namespace: pod.metadata.namespace.clone(),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "cellhost".to_owned(),
                )])),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            type_: Some("Opaque".to_owned()),
            immutable: Some(true),
            data: Some(BTreeMap::from([(
                "credential".to_owned(),
                ByteString(credential.to_vec()),
            )])),
            ..Default::default()
        }
    }

    async fn create_secret(
        &self,
        api: &Api<Secret>,
        pod: &Pod,
        credential: &[u8],
    ) -> Result<(), PlacementError> {
        match api
            .create(&PostParams::default(), &Self::secret(pod, credential))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }
}

/// The Secret's name for the Pod `pod`.
pub fn secret_name(pod: &str) -> String {
    format!("{pod}-credential")
}

/// `s` as a label value: `[A-Za-z0-9._-]`, at most 63, alphanumeric ends.
fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// An API error with the server's message: a refusal (4xx) is
/// [`PlacementError::Rejected`], anything else
/// [`PlacementError::Unavailable`].
fn api_error(e: kube::Error) -> PlacementError {
    match e {
        kube::Error::Api(status) if (400..500).contains(&status.code) => PlacementError::Rejected {
            kind: KIND.to_owned(),
            message: format!("{} {}: {}", status.code, status.reason, status.message),
        },
        kube::Error::Api(status) => PlacementError::Unavailable {
            kind: KIND.to_owned(),
            message: format!("{} {}: {}", status.code, status.reason, status.message),
        },
        other => PlacementError::Unavailable {
            kind: KIND.to_owned(),
            message: other.to_string(),
        },
    }
}

/// Where a Pod stands; `now` decides whether an unschedulable Pod has
/// waited past its queue timeout.
///
/// # Errors
/// [`PlacementError::Unschedulable`] with the scheduler's message once an
/// `Unschedulable` Pod is older than its queue timeout.
pub fn pod_state(pod: &Pod, now: k8s_openapi::jiff::Timestamp) -> Result<PlacedState, PlacementError> {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let terminated = || {
        status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
            .map(|t| match &t.reason {
                Some(r) => format!("{r}, exit {}", t.exit_code),
                None => format!("exit {}", t.exit_code),
            })
            .next()
    };
    match phase {
        "Running" => Ok(PlacedState::Running { node }),
        "Succeeded" | "Failed" => Ok(PlacedState::Ended {
            detail: match terminated() {
                Some(t) => format!("{phase} ({t})"),
                None => phase.to_owned(),
            },
        }),
        "Pending" => {
            let unschedulable = status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                });
            if let Some(c) = unschedulable {
                let message = format!("Unschedulable: {}", c.message.clone().unwrap_or_default());
                let timeout = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(QUEUE_TIMEOUT_ANNOTATION))
                    .and_then(|v| v.parse::<i64>().ok());
                let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
                if let (Some(timeout), Some(created)) = (timeout, created)
                    && now.as_second().saturating_sub(created.as_second()) >= timeout
                {
                    return Err(PlacementError::Unschedulable {
                        kind: KIND.to_owned(),
                        message,
                    });
                }
                return Ok(PlacedState::Queued {
                    reason: Some(message),
                });
            }
            // Scheduled but not started: the first container's waiting reason.
            let waiting = status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
                .filter_map(|w| {
                    let reason = w.reason.clone()?;
                    Some(match &w.message {
                        Some(m) => format!("{reason}: {m}"),
                        None => reason,
                    })
                })
                .next();
            Ok(PlacedState::Queued { reason: waiting })
        }
        other => Ok(PlacedState::Queued {
            reason: Some(format!("phase {other} (the node is not reporting)")),
        }),
    }
}

impl Placement for KubernetesPlacement {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn place(&self, request: &PlacementRequest) -> Result<Placed, PlacementError> {
        let (client, namespace) = self.client().await?;
        let pod = self.pod(request, namespace)?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let placed = |p: &Pod| Placed {
            kind: KIND.to_owned(),
            job: request.token.clone(),
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        };
        let existing = pods.get_opt(&request.token).await.map_err(api_error)?;
        let created = match existing {
            Some(p) => p,
            None => match pods.create(&PostParams::default(), &pod).await {
                Ok(p) => p,
                Err(e) if status_code(&e) == Some(409) => {
                    match pods.get_opt(&request.token).await.map_err(api_error)? {
                        Some(p) => p,
                        None => return Err(api_error(e)),
                    }
                }
                Err(e) => return Err(api_error(e)),
            },
        };
        // Also for a Pod found: an earlier attempt may have ended between
        // the Pod and its Secret.
        if let Err(e) = self.create_secret(&secrets, &created, &request.credential).await {
            let _ = pods.delete(&request.token, &DeleteParams::default()).await;
            return Err(e);
        }
        Ok(placed(&created))
    }

    async fn state(&self, placed: &Placed) -> Result<PlacedState, PlacementError> {
        let (client, namespace) = self.client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        match pods.get_opt(&placed.job).await.map_err(api_error)? {
            Some(pod) => pod_state(&pod, k8s_openapi::jiff::Timestamp::now()),
            None => Ok(PlacedState::Ended {
                detail: format!("Pod {} no longer exists", placed.job),
            }),
        }
    }

    async fn cancel(&self, placed: &Placed) -> Result<(), PlacementError> {
        let (client, namespace) = self.client().await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(self.options.kill_grace_secs.unwrap_or(5)),
            ..DeleteParams::background()
        };
        match pods.delete(&placed.job, &params).await {
            Ok(_) => {}
            Err(e) if status_code(&e) == Some(404) => {}
            Err(e) => return Err(api_error(e)),
        }
        match secrets
            .delete(&secret_name(&placed.job), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> PlacementRequest {
        PlacementRequest {
            token: "cellhost-0a".to_owned(),
            session: "s p".to_owned(),
            generation: 1,
            agent_argv: vec![
                "cellhost".to_owned(),
                "agent".to_owned(),
                format!("--credential={CREDENTIAL_PLACEHOLDER}"),
            ],
            credential: b"x".to_vec(),
            env: BTreeMap::new(),
            queue_timeout: Duration::from_secs(90),
        }
    }

    fn template() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/pod-template.yaml")
    }

    #[test]
    fn the_shipped_template_is_kept_and_its_agent_container_overridden() {
        let options = KubernetesOptions {
            pod_template: Some(template()),
            requests: BTreeMap::from([("cpu".to_owned(), "2".to_owned())]),
            ..KubernetesOptions::default()
        };
        let p = match KubernetesPlacement::new("k", options) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let pod = match p.pod(&request(), "ns") {
            Ok(pod) => pod,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(pod.metadata.name.as_deref(), Some("cellhost-0a"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/name").map(String::as_str),
            Some("cellhost-kernel")
        );
        assert_eq!(labels.get("cellhost.io/session").map(String::as_str), Some("s_p"));
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(spec.enable_service_links, Some(false));
        let c = &spec.containers[0];
        // The template's image and security context stay; the command is the agent's.
        assert_eq!(c.image.as_deref(), Some("registry.example.org/cellhost:0.1.0"));
        assert!(c.security_context.is_some());
        assert_eq!(
            c.command.clone().unwrap_or_default(),
            ["cellhost", "agent", "--credential=/var/run/cellhost/credential"]
        );
        let res = c.resources.clone().unwrap_or_default();
        assert_eq!(
            res.requests.unwrap_or_default().get("cpu"),
            Some(&Quantity("2".to_owned()))
        );
        assert_eq!(
            res.limits.unwrap_or_default().get("memory"),
            Some(&Quantity("4Gi".to_owned()))
        );
        let env: Vec<_> = c
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(env.contains(&"CELLHOST_POD_NAME".to_owned()), "{env:?}");
    }

    #[test]
    fn no_image_an_upper_case_token_or_a_template_of_another_kind_is_a_config_error() {
        assert!(matches!(
            KubernetesPlacement::new("k", KubernetesOptions::default()),
            Err(PlacementError::Config { .. })
        ));
        let p = match KubernetesPlacement::new(
            "k",
            KubernetesOptions {
                image: Some("i".to_owned()),
                ..KubernetesOptions::default()
            },
        ) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let mut r = request();
        r.token = "Cellhost-0A".to_owned();
        assert!(matches!(p.pod(&r, "ns"), Err(PlacementError::Config { .. })));
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        let path = dir.path().join("t.yaml");
        assert!(std::fs::write(&path, "apiVersion: v1\nkind: Secret\n").is_ok());
        let r = KubernetesPlacement::new(
            "k",
            KubernetesOptions {
                image: Some("i".to_owned()),
                pod_template: Some(path),
                ..KubernetesOptions::default()
            },
        );
        assert!(matches!(r, Err(PlacementError::Config { .. })), "{r:?}");
    }
}
