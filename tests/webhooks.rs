//! The admission webhooks as a user meets them: the real webhook server runs in the test
//! process (TLS on 127.0.0.1, a certificate signed by the control plane's CA), its generated
//! configurations are registered with the real kube-apiserver (url + caBundle), and every rule is
//! asserted through the apiserver, with the kube client or the built kubectl.
//!
//! Isolation: each test runs its own server, in its own namespace, behind its own
//! configurations named `homelab-autoscaler-<namespace>` whose namespaceSelector names that
//! namespace alone; so the tests run in parallel and never see each other's webhooks. The
//! apiserver picks a configuration up from an informer a moment after it is written: every test
//! waits, with a deadline, until both configurations answer (a dry-run claim comes back stamped,
//! a dry-run claim for a missing slot is refused). No fixed sleeps.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use homelab_autoscaler::api::{
    ANNOTATION_ATTEMPTS_RESET_AT, Group, LABEL_GROUP, LABEL_SLOT, Node, NodeClaim,
};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::tls::{CertFiles, ReloadingServerConfig, install_crypto_provider};
use homelab_autoscaler::webhook::configuration::{self, Endpoint};
use homelab_autoscaler::webhook::{SystemClock, WebhookState, router, server::serve_https};
use homelab_harness::{Components, ControlPlane, WebhookConfiguration, eventually};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// How long the apiserver may take to pick a configuration up, or the cluster to act.
const ACT_TIMEOUT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// The webhook server under test.
// ---------------------------------------------------------------------------------------------

/// The product's webhook server, running in this test's runtime, with the files it serves from.
struct Webhooks {
    port: u16,
    /// `tls.crt` and `tls.key`, as cert-manager lays a Secret out.
    cert_dir: tempfile::TempDir,
    tls: Arc<ReloadingServerConfig>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    /// The authority (host:port) of every request that reached the router, in order.
    authorities: Arc<Mutex<Vec<String>>>,
    /// The name of both configurations, unique to the test's namespace.
    configuration_name: String,
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Webhooks {
    /// Starts the server on 127.0.0.1:0 with a certificate for 127.0.0.1 and localhost signed by
    /// the control plane's CA.
    async fn start(
        plane: &ControlPlane,
        namespace: &str,
        operator_usernames: &[&str],
    ) -> Result<Self> {
        install_crypto_provider();
        let cert_dir = tempfile::tempdir().context("cert dir")?;
        let cert = plane.issue_serving_cert(&["127.0.0.1", "localhost"])?;
        write_cert_files(cert_dir.path(), &cert.cert_pem, &cert.key_pem)?;
        let tls = ReloadingServerConfig::load(
            CertFiles::in_dir(cert_dir.path(), false),
            &[b"h2", b"http/1.1"],
        )
        .context("loading the serving certificate")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let client = plane.client()?;
        let state = WebhookState {
            caches: homelab_autoscaler::cache::Stores::start(&client, namespace),
            client,
            namespace: namespace.to_string(),
            operator_usernames: operator_usernames.iter().map(|u| u.to_string()).collect(),
            clock: Box::new(SystemClock),
            timeouts: Timeouts::default(),
        };
        let authorities = Arc::new(Mutex::new(Vec::new()));
        let seen = authorities.clone();
        // Records which address the caller used (HTTP/2 carries it in the URI, HTTP/1.1 in Host).
        let record =
            tower::util::MapRequestLayer::new(move |request: http::Request<axum::body::Body>| {
                let authority = request
                    .uri()
                    .authority()
                    .map(|a| a.to_string())
                    .or_else(|| {
                        request
                            .headers()
                            .get(http::header::HOST)
                            .and_then(|h| h.to_str().ok())
                            .map(str::to_string)
                    })
                    .unwrap_or_default();
                seen.lock().unwrap().push(authority);
                request
            });
        let app = router(Arc::new(state)).layer(record);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_https(listener, tls.clone(), app, shutdown.clone()));
        Ok(Self {
            port,
            cert_dir,
            tls,
            shutdown,
            server,
            authorities,
            configuration_name: format!("homelab-autoscaler-{namespace}"),
        })
    }

    fn base(&self, host: &str) -> String {
        format!("https://{host}:{}", self.port)
    }

    /// Registers the generated configurations for `namespace`, calling this server at `host`.
    async fn register(&self, plane: &ControlPlane, namespace: &str, host: &str) -> Result<()> {
        let endpoint = Endpoint::Url(self.base(host));
        let ca = plane.ca_pem();
        let mut mutating = configuration::mutating(&endpoint, namespace, Some(ca.as_bytes()), None);
        mutating.metadata.name = Some(self.configuration_name.clone());
        let mut validating =
            configuration::validating(&endpoint, namespace, Some(ca.as_bytes()), None);
        validating.metadata.name = Some(self.configuration_name.clone());
        plane
            .register_webhooks(
                vec![
                    WebhookConfiguration::Mutating(mutating),
                    WebhookConfiguration::Validating(validating),
                ],
                &self.base(host),
                &ca,
            )
            .await
    }

    async fn unregister(&self, client: &Client) -> Result<()> {
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(&self.configuration_name, &DeleteParams::default())
            .await?;
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&self.configuration_name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    fn saw_authority(&self, authority: &str) -> bool {
        self.authorities.lock().unwrap().iter().any(|a| a == authority)
    }

    fn assert_running(&self) {
        assert!(!self.server.is_finished(), "the webhook server task ended");
    }
}

/// Writes `tls.crt` and `tls.key` into `dir`, each by a rename so a reader never sees half a
/// file (the kubelet swaps a Secret mount atomically too).
fn write_cert_files(dir: &std::path::Path, cert_pem: &str, key_pem: &str) -> Result<()> {
    for (name, content) in [("tls.key", key_pem), ("tls.crt", cert_pem)] {
        let staging = dir.join(format!(".{name}.new"));
        std::fs::write(&staging, content)?;
        std::fs::rename(&staging, dir.join(name))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The test's world: a namespace, a pool, a slot, the webhooks registered and answering.
// ---------------------------------------------------------------------------------------------

struct World {
    plane: &'static ControlPlane,
    client: Client,
    ns: String,
    hooks: Webhooks,
    groups: Api<Group>,
    slots: Api<Node>,
    claims: Api<NodeClaim>,
    files: tempfile::TempDir,
}

impl World {
    /// A fresh namespace holding Group `pool` and its slot `machine-1` (created before the
    /// webhooks exist), the server started, the configurations registered and seen to answer.
    async fn new(plane: &'static ControlPlane, prefix: &str, operators: &[&str]) -> Self {
        plane.install_crds().await.expect("install CRDs");
        let client = plane.client().expect("client");
        let ns = plane.fresh_namespace(prefix).await.expect("namespace");
        let world = World {
            plane,
            client: client.clone(),
            hooks: Webhooks::start(plane, &ns, operators).await.expect("webhook server"),
            groups: Api::namespaced(client.clone(), &ns),
            slots: Api::namespaced(client.clone(), &ns),
            claims: Api::namespaced(client.clone(), &ns),
            files: tempfile::tempdir().expect("tempdir"),
            ns,
        };
        world.groups.create(&PostParams::default(), &group("pool", json!({}))).await.expect("pool");
        world
            .slots
            .create(&PostParams::default(), &slot("machine-1", Some("pool")))
            .await
            .expect("slot machine-1");
        world.hooks.register(plane, &world.ns, "127.0.0.1").await.expect("register webhooks");
        world.until_webhooks_answer(&world.hooks.base("127.0.0.1")).await;
        world
    }

    /// Waits until the apiserver calls both configurations: the mutating one stamps a dry-run
    /// claim, the validating one refuses a dry-run claim for a slot that does not exist.
    async fn until_webhooks_answer(&self, base: &str) {
        let dry_run = PostParams { dry_run: true, ..PostParams::default() };
        let claims = self.claims.clone();
        eventually(&format!("the mutating webhook at {base} to stamp claims"), ACT_TIMEOUT, || {
            let (claims, dry_run) = (claims.clone(), dry_run.clone());
            async move {
                let created = claims.create(&dry_run, &claim("probe", "machine-1", "pool")).await?;
                ensure!(created.spec.requested_by.is_some(), "not stamped yet");
                Ok(())
            }
        })
        .await
        .expect("the mutating configuration never took effect");
        eventually(
            &format!("the validating webhook at {base} to refuse a claim for a missing slot"),
            ACT_TIMEOUT,
            || {
                let (claims, dry_run) = (claims.clone(), dry_run.clone());
                async move {
                    match claims.create(&dry_run, &claim("probe", "no-such-slot", "pool")).await {
                        Ok(_) => bail!("accepted: the validating webhook is not active yet"),
                        Err(kube::Error::Api(s)) if s.message.contains("no slot") => Ok(()),
                        Err(other) => Err(other.into()),
                    }
                }
            },
        )
        .await
        .expect("the validating configuration never took effect");
    }

    async fn create_claim(&self, name: &str, slot: &str, group: &str) -> kube::Result<NodeClaim> {
        self.claims.create(&PostParams::default(), &claim(name, slot, group)).await
    }

    /// Writes a claim's status through the status subresource, as the claim controller does.
    async fn set_claim_status(&self, name: &str, status: Value) {
        self.claims
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .unwrap_or_else(|e| panic!("patching the status of claim {name}: {e}"));
    }

    /// Runs the built kubectl; returns (success, stdout, stderr).
    async fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let output = self.plane.kubectl(args).await.expect("run kubectl");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Writes `text` to a file for `kubectl apply -f`.
    fn manifest(&self, name: &str, text: &str) -> String {
        let path = self.files.path().join(name);
        std::fs::write(&path, text).expect("write manifest");
        path.display().to_string()
    }

    async fn finish(self) {
        self.hooks.assert_running();
        self.hooks.unregister(&self.client).await.expect("delete the configurations");
    }
}

fn group(name: &str, spec: Value) -> Group {
    serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "Group",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .expect("group")
}

fn slot(name: &str, group: Option<&str>) -> Node {
    let labels: BTreeMap<&str, &str> = group.map(|g| ("group", g)).into_iter().collect();
    serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "Node",
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "kubernetesNodeName": name,
            "startupPodSpec": { "image": "registry.invalid/wake:1" },
            "shutdownPodSpec": { "image": "registry.invalid/sleep:1" },
        },
    }))
    .expect("slot")
}

/// A claim as a person writes it: nothing but the slot and the request.
fn claim(name: &str, slot: &str, group: &str) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "NodeClaim",
        "metadata": { "name": name },
        "spec": {
            "slotRef": { "name": slot },
            "request": { "call": "Manual", "group": group, "reason": "integration test" },
        },
    }))
    .expect("claim")
}

/// The apiserver's refusal: its HTTP code and message. Panics if the request succeeded.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the apiserver to refuse, got {other:?}"),
    }
}

fn now_seconds() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).expect("timestamp")
}

fn time_of(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Timestamp {
    t.as_ref().expect("time set").0
}

// ---------------------------------------------------------------------------------------------
// 1. What a new claim is stamped with.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_claim_is_stamped_by_admission() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-stamp", &[]).await;
    let post = PostParams::default();
    // Pools whose maxNodeProvisionTime is below and above the 12m10s boot budget.
    w.groups
        .create(&post, &group("short", json!({ "maxNodeProvisionTime": "5m" })))
        .await
        .expect("group short");
    w.groups
        .create(&post, &group("slow", json!({ "maxNodeProvisionTime": "20m" })))
        .await
        .expect("group slow");
    w.slots.create(&post, &slot("machine-2", Some("short"))).await.expect("slot machine-2");
    w.slots.create(&post, &slot("machine-3", Some("slow"))).await.expect("slot machine-3");

    let before = now_seconds();
    let cases = [
        ("claim-pool", "machine-1", "pool", None, SignedDuration::from_secs(12 * 60 + 10)),
        ("claim-short", "machine-2", "short", Some("5m"), SignedDuration::from_secs(12 * 60 + 10)),
        ("claim-slow", "machine-3", "slow", Some("20m"), SignedDuration::from_mins(20)),
    ];
    for (name, slot_name, group_name, mnpt, window) in cases {
        let created = w.create_claim(name, slot_name, group_name).await.expect("create claim");
        // What is stored, not only what create answered.
        let stored = w.claims.get(name).await.expect("get claim");
        assert_eq!(stored.spec, created.spec);
        let spec = &stored.spec;
        assert_eq!(spec.requested_by.as_deref(), Some("admin"), "{name}: requestedBy");
        assert_eq!(spec.attempt, Some(1), "{name}: attempt");
        assert_eq!(spec.ttl_seconds_after_finished, Some(3600), "{name}: TTL");
        let requested_at = time_of(&spec.requested_at);
        let after = Timestamp::now();
        assert!(
            requested_at >= before && requested_at <= after,
            "{name}: requestedAt {requested_at} is not the time of the request ({before}..{after})"
        );
        assert_eq!(
            time_of(&spec.deadline_at).duration_since(requested_at),
            window,
            "{name}: deadlineAt = requestedAt + max(12m10s, maxNodeProvisionTime)"
        );
        assert_eq!(
            spec.max_node_provision_time,
            mnpt.map(|m| m.parse::<kube::core::Duration>().expect("duration")),
            "{name}: maxNodeProvisionTime copied from the group"
        );
        let labels = stored.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some(group_name), "{name}");
        assert_eq!(labels.get(LABEL_SLOT).map(String::as_str), Some(slot_name), "{name}");
    }

    // What the client says it is stays: its own requestedBy and TTL.
    w.set_claim_status("claim-pool", json!({ "phase": "completed" })).await;
    let mut own = claim("claim-own", "machine-1", "pool");
    own.spec.requested_by = Some("cluster-autoscaler".into());
    own.spec.ttl_seconds_after_finished = Some(60);
    let own = w.claims.create(&post, &own).await.expect("claim with its own requestedBy");
    assert_eq!(own.spec.requested_by.as_deref(), Some("cluster-autoscaler"));
    assert_eq!(own.spec.ttl_seconds_after_finished, Some(60));
    assert_eq!(own.spec.attempt, Some(1));

    // A claim created by kubectl with only a generateName is stamped just the same.
    w.set_claim_status("claim-own", json!({ "phase": "completed" })).await;
    let file = w.manifest(
        "claim.yaml",
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: NodeClaim
metadata:
  generateName: machine-1-
spec:
  slotRef: { name: machine-1 }
  request: { call: Manual, group: pool }
"#,
    );
    let (ok, stdout, stderr) = w.kubectl(&["create", "-f", &file, "-n", &w.ns, "-o", "json"]).await;
    assert!(ok, "kubectl create failed: {stderr}");
    let created: NodeClaim = serde_json::from_str(&stdout).expect("kubectl -o json");
    assert!(created.metadata.name.as_deref().is_some_and(|n| n.starts_with("machine-1-")));
    assert_eq!(created.spec.requested_by.as_deref(), Some("admin"));
    assert_eq!(created.spec.attempt, Some(1));
    assert!(created.spec.deadline_at.is_some() && created.spec.requested_at.is_some());
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 2. One live claim per slot.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_takes_one_live_claim_at_a_time() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-live", &[]).await;
    w.create_claim("first", "machine-1", "pool").await.expect("the first claim");

    // No status yet: the live claim reads as pending.
    let (code, message) = refused(w.create_claim("second", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("slot \"machine-1\" already has live claim \"first\" (phase pending)"),
        "{message}"
    );
    assert!(message.contains("delete it to cancel it"), "{message}");

    w.set_claim_status("first", json!({ "phase": "booting", "bootCommittedAt": now_seconds() }))
        .await;
    let (code, message) = refused(w.create_claim("second", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("live claim \"first\" (phase booting)"), "{message}");
    assert!(
        message.contains("delete it to release the machine: its boot runs to the end"),
        "{message}"
    );

    w.set_claim_status("first", json!({ "phase": "ready", "readyAt": now_seconds() })).await;
    let (code, message) = refused(w.create_claim("second", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("live claim \"first\" (phase ready)"), "{message}");
    assert!(
        message.contains("delete it to release the machine: it is cordoned, drained"),
        "{message}"
    );
    assert!(!message.contains("to cancel it"), "a ready claim is not cancelled: {message}");

    w.set_claim_status("first", json!({ "phase": "completed", "finishedAt": now_seconds() })).await;
    let second = w.create_claim("second", "machine-1", "pool").await.expect("allowed once ended");
    assert_eq!(second.spec.attempt, Some(1), "the first claim succeeded");
    // And the new claim holds the slot in turn.
    let (code, message) = refused(w.create_claim("third", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("live claim \"second\""), "{message}");
    // Each refusal is counted under the rule it broke (the server runs in this process).
    let (_, metrics) = homelab_autoscaler::telemetry::render(None);
    assert!(
        metrics.lines().any(|l| l.starts_with("homelab_autoscaler_webhook_denials_total{")
            && l.contains(r#"reason="Forbidden""#)
            && l.contains(r#"rule="one_live_claim_per_slot""#)),
        "no denial counted for one_live_claim_per_slot:\n{metrics}"
    );
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 3. A claim for a slot that does not exist, or for another pool.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_names_an_existing_slot_of_its_group() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-slotref", &[]).await;

    let (code, message) = refused(w.create_claim("lost", "ghost", "pool").await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains(&format!("there is no slot \"ghost\" in namespace \"{}\"", w.ns)));
    assert!(
        message.contains(&format!("kubectl get nodes.infra.homecluster.dev -n {}", w.ns)),
        "{message}"
    );

    w.groups.create(&PostParams::default(), &group("other", json!({}))).await.expect("group");
    let (code, message) = refused(w.create_claim("astray", "machine-1", "other").await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("slot \"machine-1\" belongs to group \"pool\", not \"other\""),
        "{message}"
    );

    let (code, message) = refused(w.create_claim("nowhere", "machine-1", "nowhere").await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("there is no group \"nowhere\""), "{message}");

    // Nothing refused was stored; the right claim still goes through.
    let names: Vec<String> = w
        .claims
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(names.is_empty(), "refused claims were stored: {names:?}");
    w.create_claim("right", "machine-1", "pool").await.expect("a claim for the slot's own group");
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 4. The attempt bound, and the one-command reset.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failed_boots_exhaust_a_slot_until_reset() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-attempts", &[]).await;

    // Names sort in creation order: creation timestamps have one-second resolution and the
    // newest claim (by creation, then name) carries the streak.
    for attempt in 1..=3 {
        let name = format!("attempt-{attempt}");
        let created = w.create_claim(&name, "machine-1", "pool").await.expect("create claim");
        assert_eq!(created.spec.attempt, Some(attempt), "{name}");
        let now = now_seconds();
        w.set_claim_status(
            &name,
            json!({
                "phase": "failed",
                "reason": "StartupJobFailed",
                "bootCommittedAt": now,
                "finishedAt": now,
            }),
        )
        .await;
    }

    let (code, message) = refused(w.create_claim("attempt-4", "machine-1", "pool").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("slot \"machine-1\" failed 3 boots in a row"), "{message}");
    assert!(
        message.contains(&format!(
            "kubectl annotate node.infra.homecluster.dev machine-1 -n {} \
             infra.homecluster.dev/attempts-reset-at=",
            w.ns
        )),
        "{message}"
    );

    // The reset, exactly as the message and the docs give it (with the time filled in).
    let reset = format!("{ANNOTATION_ATTEMPTS_RESET_AT}={}", now_seconds());
    let (ok, _, stderr) = w
        .kubectl(&[
            "annotate",
            "node.infra.homecluster.dev",
            "machine-1",
            "-n",
            &w.ns,
            &reset,
            "--overwrite",
        ])
        .await;
    assert!(ok, "kubectl annotate failed: {stderr}");

    let fresh = w.create_claim("attempt-5", "machine-1", "pool").await.expect("after the reset");
    assert_eq!(fresh.spec.attempt, Some(1), "the reset ends the streak");

    // A malformed reset is refused by the slot webhook rather than silently ignored.
    let (ok, _, stderr) = w
        .kubectl(&[
            "annotate",
            "node.infra.homecluster.dev",
            "machine-1",
            "-n",
            &w.ns,
            &format!("{ANNOTATION_ATTEMPTS_RESET_AT}=yesterday"),
            "--overwrite",
        ])
        .await;
    assert!(!ok, "a malformed reset annotation was accepted");
    assert!(stderr.contains("is not an RFC 3339 time"), "{stderr}");

    // The other documented reset (docs/api.md): a paused scale-down's shutdown count, through
    // the status subresource, which admission leaves to the controllers.
    w.set_claim_status(
        "attempt-5",
        json!({ "shutdownAttempts": 3, "lastShutdownAttemptAt": now_seconds() }),
    )
    .await;
    let (ok, _, stderr) = w
        .kubectl(&[
            "patch",
            "nodeclaim",
            "attempt-5",
            "-n",
            &w.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"shutdownAttempts":0,"lastShutdownAttemptAt":null}}"#,
        ])
        .await;
    assert!(ok, "kubectl patch --subresource=status failed: {stderr}");
    let status = w.claims.get("attempt-5").await.expect("get").status.unwrap_or_default();
    assert_eq!(status.shutdown_attempts, Some(0));
    assert_eq!(status.last_shutdown_attempt_at, None);
    w.finish().await;
}

/// The DEADLINE printer column is of type date, which kubectl prints as an age; a deadline in
/// the future has none, so every live claim shows `<invalid>`. Fails until the column shows the
/// time (src/api/nodeclaim.rs, then `make manifests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_a_live_claims_stamped_deadline() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-deadline-column", &[]).await;
    let created = w.create_claim("shown", "machine-1", "pool").await.expect("claim");
    assert!(created.spec.deadline_at.is_some());
    let (ok, stdout, stderr) = w.kubectl(&["get", "nodeclaims", "shown", "-n", &w.ns]).await;
    assert!(ok, "kubectl get failed: {stderr}");
    assert!(stdout.contains("DEADLINE"), "{stdout}");
    assert!(!stdout.contains("<invalid>"), "the deadline is unreadable:\n{stdout}");
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 5. spec.powerState, as kubectl apply shows it.
// ---------------------------------------------------------------------------------------------

/// A slot manifest as kubectl applies it, with `powerState_line` (say `powerState: "on"`) in
/// its spec when given.
fn slot_manifest(name: &str, power_state_line: Option<&str>) -> String {
    format!(
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: {name}
  labels: {{ group: pool }}
spec:
  kubernetesNodeName: {name}
  startupPodSpec: {{ image: registry.invalid/wake:1 }}
  shutdownPodSpec: {{ image: registry.invalid/sleep:1 }}
{}"#,
        power_state_line.map(|line| format!("  {line}\n")).unwrap_or_default()
    )
}

/// What kubectl must show for a slot that still declares powerState: that it is gone, why,
/// and what to do instead.
#[track_caller]
fn assert_power_state_explained(output: &str) {
    for needle in [
        "spec.powerState was removed",
        "a machine now runs exactly while a NodeClaim for its slot is live",
        "Delete spec.powerState",
        "create a NodeClaim with spec.slotRef.name",
    ] {
        assert!(output.contains(needle), "{needle:?} missing from kubectl's output:\n{output}");
    }
}

/// Applies `powerState_line` to a new slot and to the existing `machine-1`; both must be
/// refused with the explanation, and neither stored.
async fn assert_power_state_refused(w: &World, power_state_line: &str) {
    let file = w.manifest("new.yaml", &slot_manifest("machine-2", Some(power_state_line)));
    let (ok, stdout, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(!ok, "kubectl apply accepted {power_state_line}: {stdout}");
    assert_power_state_explained(&stderr);
    assert!(w.slots.get_opt("machine-2").await.expect("get").is_none(), "the slot was stored");

    // An existing slot edited to declare it (a v1alpha1 habit).
    let file = w.manifest("old.yaml", &slot_manifest("machine-1", Some(power_state_line)));
    let (ok, stdout, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(!ok, "kubectl apply accepted {power_state_line}: {stdout}");
    assert_power_state_explained(&stderr);
    assert_eq!(w.slots.get("machine-1").await.expect("get").spec.power_state, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_slot_with_power_state_explains_the_way_forward() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-power", &[]).await;
    assert_power_state_refused(&w, r#"powerState: "on""#).await;
    assert_power_state_refused(&w, "powerState: off-please").await;

    // The same manifest without the field applies.
    let file = w.manifest("fixed.yaml", &slot_manifest("machine-2", None));
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply of a valid slot failed: {stderr}");
    w.finish().await;
}

/// The v1alpha1 manifests wrote `powerState: on` unquoted, which YAML reads as the boolean
/// true. The v2alpha1 schema types the tombstone as a string, so the apiserver refuses it with
/// `spec.powerState in body must be of type string: "boolean"` and skips the CEL rule that
/// carries the explanation; the webhook never sees it. Fails until the tombstone accepts any
/// JSON value (src/api/slot.rs, then `make manifests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_v1alpha1_slot_with_bare_power_state_on_explains_the_way_forward() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-power-bare", &[]).await;
    assert_power_state_refused(&w, "powerState: on").await;
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 6. Slots: a pool label, an existing pool, a providerID frozen under a live claim.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_rules_are_enforced() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-slots", &[]).await;
    let post = PostParams::default();

    let (code, message) = refused(w.slots.create(&post, &slot("machine-2", None)).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("metadata.labels.group: a slot joins a pool by this label"),
        "{message}"
    );

    // spec.power: each direction powered by exactly one of a driver and a pod spec.
    let mut wol_only = slot("machine-2", Some("pool"));
    wol_only.spec.shutdown_pod_spec = None;
    wol_only.spec.startup_pod_spec = None;
    wol_only.spec.power = Some(
        serde_json::from_value(json!({ "wakeOnLan": { "mac": "52:54:00:ab:cd:ef" } }))
            .expect("power"),
    );
    let (code, message) = refused(w.slots.create(&post, &wol_only).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("nothing powers the machine off: set spec.power.ssh, .redfish, .ipmi or .http.offRequest or spec.shutdownPodSpec"),
        "{message}"
    );
    let mut both = wol_only.clone();
    both.spec.startup_pod_spec = slot("x", None).spec.startup_pod_spec;
    both.spec.shutdown_pod_spec = slot("x", None).spec.shutdown_pod_spec;
    let (code, message) = refused(w.slots.create(&post, &both).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("both spec.startupPodSpec and spec.power.wakeOnLan power the machine on: keep one of them"),
        "{message}"
    );
    let mut wol_and_pod = wol_only.clone();
    wol_and_pod.spec.shutdown_pod_spec = slot("x", None).spec.shutdown_pod_spec;
    let created = w.slots.create(&post, &wol_and_pod).await.expect("wake by WoL, a pod shuts down");
    w.slots.delete("machine-2", &DeleteParams::default()).await.expect("delete");
    assert!(created.spec.power.is_some(), "spec.power is kept by the schema");

    let (code, message) = refused(w.slots.create(&post, &slot("machine-2", Some("nowhere"))).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("there is no group \"nowhere\""), "{message}");
    assert!(message.contains("create the Group first"), "{message}");

    // The providerID is frozen while a claim is live. The edit goes through the crate's type, so
    // it names the field exactly as the schema spells it.
    w.create_claim("live", "machine-1", "pool").await.expect("claim");
    let edit = |provider_id: &'static str, image: &'static str| {
        let slots = w.slots.clone();
        async move {
            let mut slot = slots.get("machine-1").await.expect("get slot");
            slot.spec.provider_id = Some(provider_id.into());
            slot.spec.startup_pod_spec.get_or_insert_default().image = image.into();
            slots.replace("machine-1", &PostParams::default(), &slot).await
        }
    };
    let (code, message) = refused(edit("k3s://machine-1", "registry.invalid/wake:1").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("cannot change while claim \"live\" is live"), "{message}");
    assert!(message.contains("cluster-autoscaler tracks the machine by it"), "{message}");
    // Other edits of the slot still pass while the claim is live.
    let edited = w.slots.get("machine-1").await.expect("get slot");
    let kept = edited.spec.provider_id.clone();
    let mut image = edited;
    image.spec.startup_pod_spec.get_or_insert_default().image = "registry.invalid/wake:2".into();
    let image = w.slots.replace("machine-1", &post, &image).await.expect("edit the image");
    assert_eq!(image.spec.provider_id, kept);

    w.set_claim_status("live", json!({ "phase": "completed" })).await;
    let changed = edit("k3s://machine-1", "registry.invalid/wake:2")
        .await
        .expect("the providerID may change once no claim is live");
    assert_eq!(changed.spec.provider_id.as_deref(), Some("k3s://machine-1"));
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 7. Groups: no driver switch under live claims; a floor above the slots warns.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_rules_are_enforced() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-groups", &[]).await;

    w.create_claim("live", "machine-1", "pool").await.expect("claim");
    let switch = Patch::Merge(json!({ "spec": { "driver": "builtin" } }));
    let (code, message) = refused(w.groups.patch("pool", &PatchParams::default(), &switch).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("spec.driver cannot change while the group has 1 live claim(s)"),
        "{message}"
    );
    w.set_claim_status("live", json!({ "phase": "completed" })).await;
    let switched = w
        .groups
        .patch("pool", &PatchParams::default(), &switch)
        .await
        .expect("the driver may change once no claim is live");
    assert_eq!(serde_json::to_value(switched.spec.driver).unwrap(), json!("builtin"));

    let manifest = |name: &str, min: u32| {
        format!(
            "apiVersion: infra.homecluster.dev/v2alpha1\nkind: Group\nmetadata:\n  name: {name}\n\
             spec:\n  minSize: {min}\n"
        )
    };
    // A floor the pool cannot reach is allowed, with a warning kubectl shows.
    let file = w.manifest("big.yaml", &manifest("big", 2));
    let (ok, stdout, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply failed: {stderr}");
    assert!(stdout.contains("group.infra.homecluster.dev/big created"), "{stdout}");
    assert!(
        stderr.contains("Warning: spec.minSize is 2 but the group has 0 slot(s)"),
        "no warning in kubectl's output:\n{stderr}"
    );
    assert_eq!(w.groups.get("big").await.expect("stored").spec.min_size, 2);

    // A floor the pool reaches draws no warning.
    let file = w.manifest("small.yaml", &manifest("small", 0));
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply failed: {stderr}");
    assert!(!stderr.contains("spec.minSize"), "an unexpected warning:\n{stderr}");
    // A pool without slots is accepted, with a word about it.
    assert!(
        stderr.contains("Warning: group small has no slots"),
        "no empty-group warning in kubectl's output:\n{stderr}"
    );
    assert!(!stderr.contains("MaxNodeStartupTime"), "an unexpected warning:\n{stderr}");

    // Overriding a cluster-autoscaler option is allowed, with a warning that it costs the pool
    // its startup time and which flag to set instead.
    let tuned = format!("{}  scaleDown:\n    unneededTime: 5m\n", manifest("tuned", 0));
    let file = w.manifest("tuned.yaml", &tuned);
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply failed: {stderr}");
    assert!(
        stderr.contains(
            "Warning: this group overrides cluster-autoscaler options (spec.scaleDown.unneededTime)"
        ) && stderr.contains("MaxNodeStartupTime")
            && stderr.contains("--scale-down-unneeded-time"),
        "no startup-time warning in kubectl's output:\n{stderr}"
    );

    // Nonsense durations are refused with the field named.
    let (code, message) = refused(
        w.groups
            .create(
                &PostParams::default(),
                &group("eternal", json!({ "maxNodeProvisionTime": "48h" })),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.maxNodeProvisionTime: "), "{message}");
    assert!(message.contains("48h is longer than 24h"), "{message}");
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 8. The deadline: cleared only by the operator, never moved.
// ---------------------------------------------------------------------------------------------

/// A client that acts as `user` (with the admin's permissions, through impersonation).
async fn client_as(plane: &ControlPlane, user: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(plane.kubeconfig_path()).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(vec!["system:masters".into()]);
    Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_clears_a_deadline_and_nobody_moves_it() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    // The operator runs as "admin" here; "alice" is a person.
    let w = World::new(plane, "wh-deadline", &["admin"]).await;
    let alice: Api<NodeClaim> = Api::namespaced(client_as(plane, "alice").await, &w.ns);

    // alice's own claim is stamped with her name.
    let mine = alice.create(&PostParams::default(), &claim("mine", "machine-1", "pool")).await;
    let mine = mine.expect("alice creates a claim");
    assert_eq!(mine.spec.requested_by.as_deref(), Some("alice"));
    let deadline = time_of(&mine.spec.deadline_at);

    let clear = Patch::Merge(json!({ "spec": { "deadlineAt": null } }));
    let (code, message) = refused(alice.patch("mine", &PatchParams::default(), &clear).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("spec.deadlineAt is cleared only by the operator"), "{message}");
    assert!(message.contains("to cancel the claim, delete it"), "{message}");

    let later = deadline.checked_add(SignedDuration::from_hours(1)).expect("time");
    let moved = Patch::Merge(json!({ "spec": { "deadlineAt": later } }));
    for (who, api) in [("alice", &alice), ("the operator", &w.claims)] {
        let (code, message) = refused(api.patch("mine", &PatchParams::default(), &moved).await);
        assert_eq!(code, 403, "{who}: {message}");
        assert!(message.contains("spec.deadlineAt is set once, at admission"), "{who}: {message}");
    }
    assert_eq!(time_of(&w.claims.get("mine").await.expect("get").spec.deadline_at), deadline);

    let cleared = w
        .claims
        .patch("mine", &PatchParams::default(), &clear)
        .await
        .expect("the operator clears the deadline");
    assert_eq!(cleared.spec.deadline_at, None);
    assert_eq!(w.claims.get("mine").await.expect("get").spec.deadline_at, None);

    // Once cleared it cannot be set again, by anyone.
    let (code, message) = refused(w.claims.patch("mine", &PatchParams::default(), &moved).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("set once, at admission"), "{message}");
    w.finish().await;
}

/// A pin's end as a person meets it: a `spec.until` that is not ahead is refused on create
/// (through kubectl) and on update, with what to do; a live pin's end moves either way; an
/// IncreaseSize claim cannot carry one (the CRD's CEL rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pins_end_must_lie_ahead_and_only_a_pin_has_one() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-until", &[]).await;
    let past = now_seconds().checked_sub(SignedDuration::from_mins(5)).expect("time");
    let manifest = |name: &str, call: &str, until: Timestamp| {
        let delta = if call == "IncreaseSize" { ", delta: 1" } else { "" };
        format!(
            "apiVersion: infra.homecluster.dev/v2alpha1\nkind: NodeClaim\nmetadata:\n  name: \
             {name}\n  namespace: {}\nspec:\n  slotRef: {{ name: machine-1 }}\n  request: {{ \
             call: {call}, group: pool{delta} }}\n  until: \"{until}\"\n",
            w.ns
        )
    };
    let file = w.manifest("past.yaml", &manifest("past", "Manual", past));
    let (ok, _, stderr) = w.kubectl(&["create", "-f", &file]).await;
    assert!(!ok, "a pin that ended already is refused");
    assert!(stderr.contains("spec.until") && stderr.contains("is not after now"), "{stderr}");
    assert!(stderr.contains("homelab-autoscaler keep-on --slot machine-1"), "{stderr}");

    let ahead = now_seconds().checked_add(SignedDuration::from_hours(1)).expect("time");
    let file = w.manifest("scaled.yaml", &manifest("scaled", "IncreaseSize", ahead));
    let (ok, _, stderr) = w.kubectl(&["create", "-f", &file]).await;
    assert!(!ok, "an IncreaseSize claim has no end of its own");
    assert!(stderr.contains("only a Manual or Schedule claim has one"), "{stderr}");

    let file = w.manifest("pin.yaml", &manifest("pin", "Manual", ahead));
    let (ok, _, stderr) = w.kubectl(&["create", "-f", &file]).await;
    assert!(ok, "a pin ending in an hour is admitted: {stderr}");
    let (ok, stdout, stderr) =
        w.kubectl(&["get", "nodeclaim", "pin", "-n", &w.ns, "-o", "wide"]).await;
    assert!(ok && stdout.contains("UNTIL"), "kubectl get -o wide shows the end: {stdout}{stderr}");

    let set = |t: Option<Timestamp>| Patch::Merge(json!({ "spec": { "until": t } }));
    let params = PatchParams::default();
    let (code, message) = refused(w.claims.patch("pin", &params, &set(Some(past))).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("is not after now"), "{message}");
    for until in [ahead.checked_add(SignedDuration::from_hours(2)).ok(), Some(ahead), None] {
        let moved =
            w.claims.patch("pin", &params, &set(until)).await.expect("a live pin's end moves");
        assert_eq!(moved.spec.until.map(|t| t.0), until);
    }

    // An ended pin keeps its end.
    w.set_claim_status("pin", json!({ "phase": "completed", "reason": "DeletedByHand" })).await;
    let (code, message) = refused(w.claims.patch("pin", &params, &set(Some(ahead))).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("has ended"), "{message}");
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 9. Requests that are not AdmissionReviews, sent straight to the server.
// ---------------------------------------------------------------------------------------------

/// A TLS connection to the webhook server that trusts only the control plane's CA and checks
/// the certificate against `server_name`.
async fn connect(
    plane: &ControlPlane,
    port: u16,
    server_name: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(plane.ca_pem().as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config =
        rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from(server_name.to_string())?;
    Ok(connector.connect(name, tcp).await?)
}

/// The DER of the leaf certificate the server presents to a new handshake now.
async fn served_certificate(plane: &ControlPlane, port: u16, server_name: &str) -> Result<Vec<u8>> {
    let stream = connect(plane, port, server_name).await?;
    let (_, session) = stream.get_ref();
    let chain = session.peer_certificates().context("no certificate presented")?;
    Ok(chain.first().context("empty chain")?.as_ref().to_vec())
}

struct Answer {
    status: u16,
    body: String,
}

/// One HTTP/1.1 request over TLS, read to the end (`Connection: close`).
async fn https(
    plane: &ControlPlane,
    port: u16,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Result<Answer> {
    let mut stream = connect(plane, port, "127.0.0.1").await?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    if let Some(content_type) = content_type {
        request.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw).await {
        Ok(_) => {}
        // A peer that closes without close_notify after a complete answer is fine here.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e.into()),
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no status line in {head:?}"))?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(Answer { status, body })
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_is_not_an_admission_review_gets_a_clear_error() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-garbage", &[]).await;
    let port = w.hooks.port;
    let json = Some("application/json");
    let validate = configuration::PATH_VALIDATE_CLAIM;

    // Not JSON at all.
    let answer = https(plane, port, "POST", validate, json, "this is not json").await.unwrap();
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("JSON"), "{}", answer.body);

    // JSON, but not shaped like a review.
    let answer = https(plane, port, "POST", validate, json, r#"{"hello":"world"}"#).await.unwrap();
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert!(answer.body.contains("missing field `apiVersion`"), "{}", answer.body);

    // Not declared as JSON.
    let answer = https(plane, port, "POST", validate, Some("text/plain"), "{}").await.unwrap();
    assert_eq!(answer.status, 415, "{}", answer.body);
    assert!(answer.body.contains("application/json"), "{}", answer.body);

    // A review that carries no request: answered as a review, refused, saying why.
    let empty = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
    let answer = https(plane, port, "POST", validate, json, empty).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let review: Value = serde_json::from_str(&answer.body).expect("an AdmissionReview");
    assert_eq!(review["kind"], "AdmissionReview", "{review}");
    assert_eq!(review["response"]["allowed"], false, "{review}");
    let message = review["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("malformed AdmissionReview"), "{review}");

    // A review whose object is not a NodeClaim: refused with the schema named, its uid echoed.
    let bad_object = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c0ffee0-0000-4000-8000-000000000001",
            "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": "NodeClaim" },
            "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": "nodeclaims" },
            "name": "odd",
            "namespace": w.ns,
            "operation": "CREATE",
            "userInfo": { "username": "admin" },
            "object": {
                "apiVersion": "infra.homecluster.dev/v2alpha1",
                "kind": "NodeClaim",
                "metadata": { "name": "odd", "namespace": w.ns },
                "spec": "not a spec",
            },
        },
    });
    for path in [configuration::PATH_MUTATE_CLAIM, validate] {
        let answer = https(plane, port, "POST", path, json, &bad_object.to_string()).await.unwrap();
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let review: Value = serde_json::from_str(&answer.body).expect("an AdmissionReview");
        let response = &review["response"];
        assert_eq!(response["uid"], "0c0ffee0-0000-4000-8000-000000000001", "{path}: {review}");
        assert_eq!(response["allowed"], false, "{path}: {review}");
        assert_eq!(response["status"]["code"], 422, "{path}: {review}");
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("does not match the v2alpha1 schema"), "{path}: {review}");
    }

    // A well-formed review of a slot still declaring powerState: the webhook's own refusal (the
    // CRD's CEL rule refuses it first through the apiserver, so it is asked directly here).
    let power = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c0ffee0-0000-4000-8000-000000000002",
            "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": "Node" },
            "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": "nodes" },
            "name": "machine-9",
            "namespace": w.ns,
            "operation": "CREATE",
            "userInfo": { "username": "admin" },
            "object": serde_json::to_value({
                let mut s = slot("machine-9", Some("pool"));
                s.spec.power_state = Some("on".into());
                s
            }).unwrap(),
        },
    });
    let answer =
        https(plane, port, "POST", configuration::PATH_VALIDATE_SLOT, json, &power.to_string())
            .await
            .unwrap();
    let review: Value = serde_json::from_str(&answer.body).expect("an AdmissionReview");
    let response = &review["response"];
    assert_eq!(response["allowed"], false, "{review}");
    assert_eq!(response["status"]["code"], 422, "{review}");
    assert_eq!(response["status"]["status"], "Failure", "{review}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    for needle in ["spec.powerState was removed", "Delete spec.powerState", "create a NodeClaim"] {
        assert!(message.contains(needle), "{needle:?} missing: {review}");
    }

    // The wrong method, an unknown path.
    let answer = https(plane, port, "GET", validate, None, "").await.unwrap();
    assert_eq!(answer.status, 405, "{}", answer.body);
    let answer = https(plane, port, "POST", "/nowhere", json, "{}").await.unwrap();
    assert_eq!(answer.status, 404, "{}", answer.body);

    // Plain HTTP on the TLS port: the handshake fails, the server carries on.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    let mut sink = Vec::new();
    let _ = plain.read_to_end(&mut sink).await;

    // Nothing panicked: the server still answers, directly and through the apiserver.
    w.hooks.assert_running();
    let answer = https(plane, port, "GET", "/healthz", None, "").await.unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));
    let claim = w.create_claim("after", "machine-1", "pool").await.expect("admission still works");
    assert_eq!(claim.spec.requested_by.as_deref(), Some("admin"));
    w.finish().await;
}

// ---------------------------------------------------------------------------------------------
// 10. Certificate rotation without a restart.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_follows_a_rotated_certificate() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let w = World::new(plane, "wh-rotate", &[]).await;
    let port = w.hooks.port;
    let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem").to_vec();
    let first = std::fs::read_to_string(w.hooks.cert_dir.path().join("tls.crt")).expect("read");
    assert_eq!(served_certificate(plane, port, "127.0.0.1").await.unwrap(), der(&first));
    w.create_claim("before", "machine-1", "pool").await.expect("admission before the rotation");
    w.set_claim_status("before", json!({ "phase": "completed" })).await;

    // The rotation: the files are replaced by a new certificate and key from the same CA, and
    // the server's watcher (as the operator runs it, on a short interval) picks them up.
    let _watch = tokio::spawn(
        w.hooks.tls.clone().watch(Duration::from_millis(100), w.hooks.shutdown.clone()),
    );
    let second = plane.issue_serving_cert(&["127.0.0.1", "localhost"]).expect("new cert");
    assert_ne!(der(&second.cert_pem), der(&first));
    write_cert_files(w.hooks.cert_dir.path(), &second.cert_pem, &second.key_pem).expect("rotate");
    eventually("the server to present the rotated certificate", ACT_TIMEOUT, || async {
        let served = served_certificate(plane, port, "127.0.0.1").await?;
        ensure!(served == der(&second.cert_pem), "still the old certificate");
        Ok(())
    })
    .await
    .expect("the rotated certificate was never served");

    // The apiserver may keep its connection from before the rotation; calling the server by
    // another name forces a new one, whose handshake sees only the new certificate.
    w.hooks.register(plane, &w.ns, "localhost").await.expect("re-register at localhost");
    let authority = format!("localhost:{port}");
    let claims = w.claims.clone();
    let hooks = &w.hooks;
    eventually("the apiserver to call the server at localhost", ACT_TIMEOUT, || {
        let claims = claims.clone();
        let authority = authority.clone();
        async move {
            let dry_run = PostParams { dry_run: true, ..PostParams::default() };
            let probe = claims.create(&dry_run, &claim("probe", "machine-1", "pool")).await?;
            ensure!(probe.spec.requested_by.is_some(), "not stamped");
            ensure!(hooks.saw_authority(&authority), "not called at {authority} yet");
            Ok(())
        }
    })
    .await
    .expect("the apiserver never called the rotated server");
    let after = w.create_claim("after", "machine-1", "pool").await.expect("admission after");
    assert_eq!(after.spec.requested_by.as_deref(), Some("admin"));
    assert_eq!(after.spec.attempt, Some(1));
    let (code, message) = refused(w.create_claim("again", "machine-1", "pool").await);
    assert_eq!((code, message.contains("live claim \"after\"")), (403, true), "{message}");

    // A broken rotation keeps the good certificate in service.
    std::fs::write(w.hooks.cert_dir.path().join("tls.crt"), "not a certificate").expect("break");
    assert!(w.hooks.tls.reload_if_changed().is_err(), "a broken certificate file was loaded");
    assert_eq!(
        served_certificate(plane, port, "localhost").await.unwrap(),
        der(&second.cert_pem),
        "the server stopped presenting the last good certificate"
    );
    w.set_claim_status("after", json!({ "phase": "completed" })).await;
    w.create_claim("still", "machine-1", "pool").await.expect("admission with the kept cert");
    w.finish().await;
}
