//! The Kubernetes placement's client against a mock API server (axum on
//! loopback, plain HTTP) that keeps Pods and Secrets like the real one's
//! storage does: create (409 when the name is taken), get (404), delete.
//! The tests play the scheduler and kubelet by editing the stored Pod's
//! status.

#![cfg(feature = "kubernetes")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use cellhost_placement::kubernetes::{KubernetesOptions, KubernetesPlacement};
use cellhost_placement::{CREDENTIAL_PLACEHOLDER, PlacedState, Placement, PlacementError, PlacementRequest};
use serde_json::{Value, json};

#[derive(Default)]
struct Store {
    pods: BTreeMap<String, Value>,
    secrets: BTreeMap<String, Value>,
    /// `METHOD kind/name` of every request, in order.
    log: Vec<String>,
    /// Refuse Pod creation with this code and message.
    refuse: Option<(u16, String)>,
}

type Shared = Arc<Mutex<Store>>;

fn status(code: u16, reason: &str, message: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code
        })),
    )
}

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Store> {
    match s.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

async fn create_pod(
    State(s): State<Shared>,
    Path(ns): Path<String>,
    Json(mut pod): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut st = lock(&s);
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    st.log.push(format!("POST pods/{name}"));
    if let Some((code, message)) = st.refuse.clone() {
        return status(code, "Invalid", &message);
    }
    if st.pods.contains_key(&name) {
        return status(409, "AlreadyExists", &format!("pods \"{name}\" already exists"));
    }
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["metadata"]["namespace"] = json!(ns);
    pod["metadata"]["creationTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
    pod["status"] = json!({"phase": "Pending"});
    st.pods.insert(name, pod.clone());
    (StatusCode::CREATED, Json(pod))
}

async fn get_pod(
    State(s): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
) -> (StatusCode, Json<Value>) {
    let mut st = lock(&s);
    st.log.push(format!("GET pods/{name}"));
    match st.pods.get(&name) {
        Some(p) => (StatusCode::OK, Json(p.clone())),
        None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

async fn delete_pod(
    State(s): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
) -> (StatusCode, Json<Value>) {
    let mut st = lock(&s);
    st.log.push(format!("DELETE pods/{name}"));
    match st.pods.remove(&name) {
        Some(p) => (StatusCode::OK, Json(p)),
        None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
    }
}

async fn create_secret(
    State(s): State<Shared>,
    Path(_ns): Path<String>,
    Json(secret): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut st = lock(&s);
    let name = secret["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    st.log.push(format!("POST secrets/{name}"));
    if st.secrets.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("secrets \"{name}\" already exists"),
        );
    }
    st.secrets.insert(name, secret.clone());
    (StatusCode::CREATED, Json(secret))
}

async fn delete_secret(
    State(s): State<Shared>,
    Path((_ns, name)): Path<(String, String)>,
) -> (StatusCode, Json<Value>) {
    let mut st = lock(&s);
    st.log.push(format!("DELETE secrets/{name}"));
    match st.secrets.remove(&name) {
        Some(x) => (StatusCode::OK, Json(x)),
        None => status(404, "NotFound", &format!("secrets \"{name}\" not found")),
    }
}

/// The mock API server and a placement using it; the server task ends
/// with the runtime.
async fn cluster(options: KubernetesOptions) -> (Shared, KubernetesPlacement) {
    let store: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/api/v1/namespaces/{ns}/pods", post(create_pod))
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            get(get_pod).delete(delete_pod),
        )
        .route("/api/v1/namespaces/{ns}/secrets", post(create_secret))
        .route(
            "/api/v1/namespaces/{ns}/secrets/{name}",
            axum::routing::delete(delete_secret),
        )
        .with_state(store.clone());
    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("{e}"),
    };
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let url = match format!("http://{addr}").parse() {
        Ok(u) => u,
        Err(e) => panic!("{e}"),
    };
    let client = match kube::Client::try_from(kube::Config::new(url)) {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    };
    match KubernetesPlacement::with_client("k8s", options, client, "cellhost") {
        Ok(p) => (store, p),
        Err(e) => panic!("{e}"),
    }
}

/// Plays the scheduler or kubelet: edits the stored Pod `name`.
fn edit_pod(store: &Shared, name: &str, edit: impl FnOnce(&mut Value)) {
    match lock(store).pods.get_mut(name) {
        Some(pod) => edit(pod),
        None => panic!("no Pod {name}"),
    }
}

fn options() -> KubernetesOptions {
    KubernetesOptions {
        image: Some("registry.example.org/cellhost:0.1.0".to_owned()),
        requests: BTreeMap::from([("cpu".to_owned(), "1".to_owned())]),
        limits: BTreeMap::from([("memory".to_owned(), "2Gi".to_owned())]),
        ..KubernetesOptions::default()
    }
}

fn request(token: &str) -> PlacementRequest {
    PlacementRequest {
        token: token.to_owned(),
        session: "analysis".to_owned(),
        generation: 2,
        agent_argv: vec![
            "/usr/local/bin/cellhost".to_owned(),
            "agent".to_owned(),
            "--credential".to_owned(),
            CREDENTIAL_PLACEHOLDER.to_owned(),
        ],
        credential: b"pod-credential-99".to_vec(),
        env: BTreeMap::from([("CELLHOST_HOST".to_owned(), "host:7000".to_owned())]),
        queue_timeout: Duration::from_secs(3600),
    }
}

#[tokio::test]
async fn kubernetes_place_creates_the_pod_then_a_secret_it_owns_holding_the_credential() {
    let (store, p) = cluster(options()).await;
    let placed = match p.place(&request("cellhost-a1")).await {
        Ok(placed) => placed,
        Err(e) => panic!("place: {e}"),
    };
    assert_eq!(
        (placed.kind.as_str(), placed.job.as_str()),
        ("kubernetes", "cellhost-a1")
    );
    let st = lock(&store);
    assert_eq!(
        st.log,
        [
            "GET pods/cellhost-a1",
            "POST pods/cellhost-a1",
            "POST secrets/cellhost-a1-credential"
        ]
    );
    let pod = &st.pods["cellhost-a1"];
    let secret = &st.secrets["cellhost-a1-credential"];
    // The Secret is owned by the Pod (deleting the Pod deletes it) and
    // holds the credential, base64 as the API carries it.
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "uid-cellhost-a1");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["kind"], "Pod");
    assert_eq!(secret["data"]["credential"], "cG9kLWNyZWRlbnRpYWwtOTk=");
    assert_eq!(secret["immutable"], true);
    // The Pod names the file, never holds the credential.
    let text = pod.to_string();
    assert!(!text.contains("pod-credential-99") && !text.contains("cG9kLWNyZWRlbnRpYWwtOTk="));
    let c = &pod["spec"]["containers"][0];
    assert_eq!(
        c["command"],
        json!([
            "/usr/local/bin/cellhost",
            "agent",
            "--credential",
            "/var/run/cellhost/credential"
        ])
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["secret"]["secretName"],
        "cellhost-a1-credential"
    );
    assert_eq!(pod["spec"]["volumes"][0]["secret"]["defaultMode"], 0o600);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    assert_eq!(c["resources"]["requests"]["cpu"], "1");
    assert_eq!(c["resources"]["limits"]["memory"], "2Gi");
}

#[tokio::test]
async fn kubernetes_place_twice_with_one_token_creates_one_pod() {
    let (store, p) = cluster(options()).await;
    let first = p.place(&request("cellhost-b2")).await;
    let second = p.place(&request("cellhost-b2")).await;
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(first, second);
    let st = lock(&store);
    assert_eq!(
        st.log.iter().filter(|l| l.starts_with("POST pods")).count(),
        1,
        "{:?}",
        st.log
    );
    assert_eq!(st.pods.len(), 1);
}

#[tokio::test]
async fn kubernetes_unschedulable_pod_is_queued_then_an_unschedulable_error_after_the_queue_timeout() {
    let (store, p) = cluster(options()).await;
    let placed = match p.place(&request("cellhost-c3")).await {
        Ok(placed) => placed,
        Err(e) => panic!("place: {e}"),
    };
    let why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.";
    edit_pod(&store, "cellhost-c3", |pod| {
        pod["status"] = json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
        ]});
    });
    assert_eq!(
        p.state(&placed).await,
        Ok(PlacedState::Queued {
            reason: Some(format!("Unschedulable: {why}"))
        })
    );
    // Its queue timeout (an annotation set at creation) is over.
    edit_pod(&store, "cellhost-c3", |pod| {
        pod["metadata"]["annotations"]["cellhost.io/queue-timeout-secs"] = json!("0");
    });
    match p.state(&placed).await {
        Err(PlacementError::Unschedulable { kind, message }) => {
            assert_eq!(kind, "kubernetes");
            assert!(message.contains(why), "{message}");
        }
        other => panic!("expected unschedulable, got {other:?}"),
    }
}

#[tokio::test]
async fn kubernetes_state_follows_the_pod_phase_and_cancel_deletes_pod_and_secret() {
    let (store, p) = cluster(options()).await;
    let placed = match p.place(&request("cellhost-d4")).await {
        Ok(placed) => placed,
        Err(e) => panic!("place: {e}"),
    };
    assert_eq!(p.state(&placed).await, Ok(PlacedState::Queued { reason: None }));
    edit_pod(&store, "cellhost-d4", |pod| {
        pod["spec"]["nodeName"] = json!("node-a");
        pod["status"] = json!({"phase": "Running"});
    });
    assert_eq!(
        p.state(&placed).await,
        Ok(PlacedState::Running {
            node: Some("node-a".to_owned())
        })
    );
    edit_pod(&store, "cellhost-d4", |pod| {
        pod["status"] = json!({"phase": "Failed", "containerStatuses": [{
            "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
        }]});
    });
    assert_eq!(
        p.state(&placed).await,
        Ok(PlacedState::Ended {
            detail: "Failed (OOMKilled, exit 137)".to_owned()
        })
    );
    assert_eq!(p.cancel(&placed).await, Ok(()));
    {
        let st = lock(&store);
        assert!(st.pods.is_empty() && st.secrets.is_empty(), "{:?}", st.log);
    }
    assert_eq!(
        p.state(&placed).await,
        Ok(PlacedState::Ended {
            detail: "Pod cellhost-d4 no longer exists".to_owned()
        })
    );
    // A Pod already gone is not an error.
    assert_eq!(p.cancel(&placed).await, Ok(()));
}

#[tokio::test]
async fn kubernetes_api_refusal_is_rejected_with_the_servers_message() {
    let (store, p) = cluster(options()).await;
    lock(&store).refuse = Some((
        403,
        "pods is forbidden: exceeded quota: compute, requested: cpu=1".to_owned(),
    ));
    match p.place(&request("cellhost-e5")).await {
        Err(PlacementError::Rejected { kind, message }) => {
            assert_eq!(kind, "kubernetes");
            assert!(message.contains("exceeded quota"), "{message}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(lock(&store).secrets.is_empty());
}

#[tokio::test]
async fn kubernetes_unreachable_api_server_is_unavailable() {
    // A port nothing listens on.
    let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => panic!("{e}"),
    };
    let url = match format!("http://127.0.0.1:{port}").parse() {
        Ok(u) => u,
        Err(e) => panic!("{e}"),
    };
    let client = match kube::Client::try_from(kube::Config::new(url)) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let p = match KubernetesPlacement::with_client("k8s", options(), client, "cellhost") {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let r = p.place(&request("cellhost-f6")).await;
    assert!(matches!(r, Err(PlacementError::Unavailable { .. })), "{r:?}");
}
