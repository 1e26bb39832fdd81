//! Admission, measured two ways in one run:
//!
//! - the webhook server in this process (the product's router and TLS listener), called over
//!   HTTPS on one keep-alive HTTP/2 connection, as kube-apiserver calls it, at fixed request
//!   rates (open loop: a request leaves every 1/rate s whether or not the last one came back),
//!   for the claim, slot and group rules; beside it, the same reads the claim rule makes, sent
//!   straight to the apiserver at the same rate, so the share of the reads is a ratio;
//! - kube-apiserver's own create latency for a NodeClaim in three arms: no webhooks, the same
//!   configurations calling a server that allows every review unread (the floor any admission
//!   webhook pays: [`Handler::AllowAll`]), and ours; each server records each request it answers
//!   (path, HTTP version, time in the router), so the create's time can be split with the
//!   apiserver's own metrics (`apiserver`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use homelab_autoscaler::api::{Group, Node as Slot, NodeClaim};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::tls::{CertFiles, ReloadingServerConfig};
use homelab_autoscaler::webhook::configuration::{self, Endpoint};
use homelab_autoscaler::webhook::{SystemClock, WebhookState, router, server::serve_https};
use homelab_harness::{ControlPlane, WebhookConfiguration};
use http_body_util::{BodyExt as _, Full};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::stats::Samples;

pub const GROUP: &str = "pool";

/// What a bench server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// The product's router: parse the review, read the caches, run the rules.
    Rules,
    /// The floor any admission webhook pays: the same TLS listener and HTTP/2 settings, and a
    /// handler that allows every review on any path, reading only the request's uid (the
    /// apiserver refuses an answer that does not echo it).
    AllowAll,
}

/// Which server the registered configurations call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Route {
    /// No configurations registered.
    Nowhere,
    /// The [`Handler::AllowAll`] server.
    Floor,
    /// The [`Handler::Rules`] server.
    Ours,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Nowhere => "no webhooks",
            Route::Floor => "no-op webhooks (the floor)",
            Route::Ours => "our webhooks",
        }
    }
}

/// Allows the review, echoing its uid, without decoding anything else.
async fn allow_all(body: Bytes) -> axum::response::Response {
    #[derive(serde::Deserialize)]
    struct Review {
        request: Request,
    }
    #[derive(serde::Deserialize)]
    struct Request {
        uid: String,
    }
    let uid = serde_json::from_slice::<Review>(&body).map(|r| r.request.uid).unwrap_or_default();
    let answer = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": { "uid": uid, "allowed": true },
    });
    let headers = [(http::header::CONTENT_TYPE, "application/json")];
    axum::response::IntoResponse::into_response((headers, answer.to_string()))
}

/// The webhook server, running in this process until dropped.
pub struct Server {
    pub port: u16,
    /// Every request the server answered: its path, HTTP version and time in the router.
    calls: Arc<Mutex<Vec<Served>>>,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

/// One request as the server saw it: from the router receiving it to its response built (the
/// review parsed, the rules run, the answer serialized); TLS and the connection are outside.
pub struct Served {
    pub path: String,
    pub version: http::Version,
    pub took: Duration,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Server {
    pub async fn start(plane: &ControlPlane, ns: &str, handler: Handler) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let cert = plane.issue_serving_cert(&["127.0.0.1", "localhost"])?;
        std::fs::write(dir.path().join("tls.crt"), &cert.cert_pem)?;
        std::fs::write(dir.path().join("tls.key"), &cert.key_pem)?;
        let tls = ReloadingServerConfig::load(
            CertFiles::in_dir(dir.path(), false),
            &[b"h2", b"http/1.1"],
        )?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let app = match handler {
            Handler::Rules => {
                let client = plane.client()?;
                // Admission reads these caches; the pool is written before the server starts, so
                // once they have listed they hold it.
                let caches = homelab_autoscaler::cache::Stores::start(&client, ns);
                let synced = caches.wait_synced(Duration::from_secs(60)).await;
                ensure!(synced, "the webhook's caches synced");
                router(Arc::new(WebhookState {
                    caches,
                    client,
                    namespace: ns.to_string(),
                    operator_usernames: vec!["admin".into()],
                    clock: Box::new(SystemClock),
                    timeouts: Timeouts::default(),
                }))
            }
            Handler::AllowAll => axum::Router::new().fallback(allow_all),
        };
        let shutdown = CancellationToken::new();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let record = calls.clone();
        let app = app.layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let record = record.clone();
                async move {
                    let (path, version) = (request.uri().path().to_owned(), request.version());
                    let started = Instant::now();
                    let response = next.run(request).await;
                    let took = started.elapsed();
                    record.lock().unwrap_or_else(|e| e.into_inner()).push(Served {
                        path,
                        version,
                        took,
                    });
                    response
                }
            },
        ));
        tokio::spawn(serve_https(listener, tls, app, shutdown.clone()));
        Ok(Server { port, calls, _dir: dir, shutdown })
    }

    /// The requests answered since the last call, oldest first.
    pub fn take_calls(&self) -> Vec<Served> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One HTTP/2 connection over TLS to the server, as the apiserver keeps one.
#[derive(Clone)]
pub struct H2 {
    send: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    port: u16,
}

impl H2 {
    pub async fn connect(port: u16, ca_pem: &str) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert?)?;
        }
        let mut config =
            rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        // kube-apiserver's Go client sets TCP_NODELAY, as Go does on every connection.
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (send, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await?;
        tokio::spawn(connection);
        Ok(H2 { send, port })
    }

    /// POSTs `body` to `path`; errors unless the review comes back allowed.
    async fn review(&mut self, path: &str, body: Bytes) -> Result<()> {
        let request = http::Request::post(format!("https://localhost:{}{path}", self.port))
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let response = self.send.send_request(request).await?;
        ensure!(response.status() == 200, "status {}", response.status());
        let body = response.into_body().collect().await?.to_bytes();
        let review: Value = serde_json::from_slice(&body)?;
        ensure!(review["response"]["allowed"] == true, "denied: {review}");
        Ok(())
    }
}

/// The rules measured, each with the review it is sent.
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    Claim,
    Slot,
    Group,
}

impl Rule {
    pub const ALL: [Rule; 3] = [Rule::Claim, Rule::Slot, Rule::Group];

    pub fn name(self) -> &'static str {
        match self {
            Rule::Claim => "claim (validate create)",
            Rule::Slot => "slot (validate create)",
            Rule::Group => "group (validate update)",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Rule::Claim => configuration::PATH_VALIDATE_CLAIM,
            Rule::Slot => configuration::PATH_VALIDATE_SLOT,
            Rule::Group => configuration::PATH_VALIDATE_GROUP,
        }
    }

    /// The AdmissionReview: a claim for the free slot `s0`, a new slot of the pool, an update of
    /// the pool.
    fn review(self, ns: &str) -> Bytes {
        let (kind, resource, name, operation, object, old) = match self {
            Rule::Claim => (
                "NodeClaim",
                "nodeclaims",
                "bench-claim",
                "CREATE",
                claim_object(ns, "bench-claim", &format!("{ns}-s0")),
                Value::Null,
            ),
            Rule::Slot => (
                "Node",
                "nodes",
                "bench-slot",
                "CREATE",
                slot_object(&format!("{ns}-new")),
                Value::Null,
            ),
            Rule::Group => ("Group", "groups", GROUP, "UPDATE", group_object(), group_object()),
        };
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0c0ffee0-0000-4000-8000-000000000001",
                "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": kind },
                "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": resource },
                "name": name,
                "namespace": ns,
                "operation": operation,
                "userInfo": { "username": "admin" },
                "object": object,
                "oldObject": old,
            },
        });
        Bytes::from(review.to_string())
    }
}

fn claim_object(ns: &str, name: &str, slot: &str) -> Value {
    json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "slotRef": { "name": slot },
                  "request": { "call": "Manual", "group": GROUP, "reason": "bench" } },
    })
}

fn slot_object(name: &str) -> Value {
    json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": name, "labels": { "group": GROUP } },
        "spec": { "kubernetesNodeName": name, "nodeCapacity": { "cpu": "4", "memory": "16Gi" },
                  "startupPodSpec": { "image": "busybox" },
                  "shutdownPodSpec": { "image": "busybox" } },
    })
}

fn group_object() -> Value {
    json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": GROUP },
        "spec": { "driver": "cluster-autoscaler", "maxNodeProvisionTime": "20m" },
    })
}

/// Group `pool` and `slots` slots `<ns>-s<i>`, no claims.
pub async fn write_pool(client: &Client, ns: &str, slots: usize) -> Result<()> {
    let groups: Api<Group> = Api::namespaced(client.clone(), ns);
    groups.create(&PostParams::default(), &serde_json::from_value(group_object())?).await?;
    let api: Api<Slot> = Api::namespaced(client.clone(), ns);
    for i in 0..slots {
        let slot: Slot = serde_json::from_value(slot_object(&format!("{ns}-s{i}")))?;
        api.create(&PostParams::default(), &slot).await.context("creating a slot")?;
    }
    Ok(())
}

/// Sends one request every `1/rate` s for `seconds`, each on its own task, and times each.
async fn open_loop<F, Fut>(rate: u32, seconds: f64, call: F) -> Samples
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let total = (f64::from(rate) * seconds).round() as usize;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..total {
        ticks.tick().await;
        let tx = tx.clone();
        let future = call();
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = future.await;
            let _ = tx.send(outcome.map(|()| started.elapsed()));
        });
    }
    drop(tx);
    let mut samples = Samples::default();
    while let Some(outcome) = rx.recv().await {
        match outcome {
            Ok(took) => samples.push(took),
            Err(_) => samples.errors += 1,
        }
    }
    samples
}

/// The webhook at `rate` for `rule`.
pub async fn rule_at(h2: &H2, ns: &str, rule: Rule, rate: u32, seconds: f64) -> Samples {
    let body = rule.review(ns);
    open_loop(rate, seconds, || {
        let (mut h2, body) = (h2.clone(), body.clone());
        async move { h2.review(rule.path(), body).await }
    })
    .await
}

/// The claim rule's reads alone, straight to the apiserver at `rate`: the slot, the group and
/// the slot's claims, concurrently (as `webhook::handlers::claim_facts` reads them).
pub async fn claim_reads_at(client: &Client, ns: &str, rate: u32, seconds: f64) -> Samples {
    let slots: Api<Slot> = Api::namespaced(client.clone(), ns);
    let groups: Api<Group> = Api::namespaced(client.clone(), ns);
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), ns);
    let slot = format!("{ns}-s0");
    open_loop(rate, seconds, || {
        let (slots, groups, claims, slot) =
            (slots.clone(), groups.clone(), claims.clone(), slot.clone());
        async move {
            let by_slot = ListParams::default().fields(&format!("spec.slotRef.name={slot}"));
            tokio::try_join!(slots.get_opt(&slot), groups.get_opt(GROUP), claims.list(&by_slot))?;
            Ok(())
        }
    })
    .await
}

/// Registers the generated configurations for `ns`, calling the server on `port`.
pub async fn register(plane: &ControlPlane, ns: &str, port: u16) -> Result<()> {
    let base = format!("https://127.0.0.1:{port}");
    let endpoint = Endpoint::Url(base.clone());
    let ca = plane.ca_pem();
    let mut mutating = configuration::mutating(&endpoint, ns, Some(ca.as_bytes()), None);
    mutating.metadata.name = Some(format!("bench-{ns}"));
    let mut validating = configuration::validating(&endpoint, ns, Some(ca.as_bytes()), None);
    validating.metadata.name = Some(format!("bench-{ns}"));
    plane
        .register_webhooks(
            vec![
                WebhookConfiguration::Mutating(mutating),
                WebhookConfiguration::Validating(validating),
            ],
            &base,
            &ca,
        )
        .await
}

/// Deletes the configurations for `ns`, if there are any.
pub async fn unregister(client: &Client, ns: &str) -> Result<()> {
    let name = format!("bench-{ns}");
    delete_if_present(Api::<MutatingWebhookConfiguration>::all(client.clone()), &name).await?;
    delete_if_present(Api::<ValidatingWebhookConfiguration>::all(client.clone()), &name).await
}

async fn delete_if_present<K>(api: Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Points the configurations for `ns` where `route` says (registers them at `ours` or `floor`,
/// or deletes them), and waits until a dry-run claim for a missing slot shows it: refused
/// after calls to `ours` only, allowed after calls to `floor` only, or allowed with no call to
/// either. The apiserver picks configurations up from an informer a moment after they change,
/// and the mutating and the validating one separately.
pub async fn route(
    plane: &ControlPlane,
    ns: &str,
    to: Route,
    ours: &Server,
    floor: &Server,
) -> Result<()> {
    let client = plane.client()?;
    match to {
        Route::Nowhere => unregister(&client, ns).await?,
        Route::Floor => register(plane, ns, floor.port).await?,
        Route::Ours => register(plane, ns, ours.port).await?,
    }
    let claims: Api<NodeClaim> = Api::namespaced(client, ns);
    let probe: NodeClaim = serde_json::from_value(claim_object(ns, "probe", "no-such-slot"))?;
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    homelab_harness::eventually(
        "the webhook configurations to take effect",
        Duration::from_secs(60),
        || async {
            ours.take_calls();
            floor.take_calls();
            let refused = claims.create(&dry, &probe).await.is_err();
            let called = (!ours.take_calls().is_empty(), !floor.take_calls().is_empty());
            let now = match (refused, called) {
                (true, (true, false)) => Route::Ours,
                (false, (false, true)) => Route::Floor,
                (false, (false, false)) => Route::Nowhere,
                _ => anyhow::bail!("between two routes: refused {refused}, called {called:?}"),
            };
            ensure!(now == to, "still routed {now:?}");
            Ok(())
        },
    )
    .await
}

/// Creates a claim for each of `slots` (each free), one after another, timing each create.
pub async fn time_creates(client: &Client, ns: &str, slots: std::ops::Range<usize>) -> Samples {
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), ns);
    let mut samples = Samples::default();
    for i in slots {
        let Ok(claim) = serde_json::from_value::<NodeClaim>(claim_object(
            ns,
            &format!("c{i}"),
            &format!("{ns}-s{i}"),
        )) else {
            samples.errors += 1;
            continue;
        };
        let started = Instant::now();
        match claims.create(&PostParams::default(), &claim).await {
            Ok(_) => samples.push(started.elapsed()),
            Err(_) => samples.errors += 1,
        }
    }
    samples
}
