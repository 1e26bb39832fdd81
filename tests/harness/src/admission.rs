//! The admission webhooks as the webhooks suites meet them: the product's webhook server running
//! in the test's process (TLS on 127.0.0.1, a certificate signed by the control plane's CA), its
//! generated configurations registered with the real kube-apiserver (url + caBundle), and an
//! [`AdmissionLab`]: a namespace with a pool and a slot whose webhooks answer.
//!
//! Isolation: each lab runs its own server, in its own namespace, behind its own configurations
//! named `homelab-autoscaler-<namespace>` whose namespaceSelector names that namespace alone; so
//! tests run in parallel and never see each other's webhooks. The apiserver picks a
//! configuration up from an informer a moment after it is written: [`AdmissionLab::new`] waits,
//! with a deadline, until both configurations answer (a dry-run claim comes back stamped, a
//! dry-run claim for a missing slot is refused).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use homelab_autoscaler::api::{Group, Node, NodeClaim};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::tls::{CertFiles, ReloadingServerConfig, install_crypto_provider};
use homelab_autoscaler::webhook::configuration::{self, Endpoint};
use homelab_autoscaler::webhook::{SystemClock, WebhookState, router, server::serve_https};
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::http::Answer;
use crate::{ControlPlane, WebhookConfiguration, eventually};

/// How long the apiserver may take to pick a configuration up, or the cluster to act.
pub const ACT_TIMEOUT: Duration = Duration::from_secs(90);

/// The product's webhook server, running in this test's runtime, with the files it serves from.
pub struct WebhookServer {
    pub port: u16,
    /// `tls.crt` and `tls.key`, as cert-manager lays a Secret out.
    pub cert_dir: tempfile::TempDir,
    pub tls: Arc<ReloadingServerConfig>,
    pub shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    /// The authority (host:port) of every request that reached the router, in order.
    authorities: Arc<Mutex<Vec<String>>>,
    /// The name of both configurations, unique to the test's namespace.
    configuration_name: String,
    /// The caches the server judges by.
    caches: homelab_autoscaler::cache::Stores,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl WebhookServer {
    /// Starts the server on 127.0.0.1:0 with a certificate for 127.0.0.1 and localhost signed by
    /// the control plane's CA.
    pub async fn start(
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
        let caches = homelab_autoscaler::cache::Stores::start(&client, namespace);
        let state = WebhookState {
            caches: caches.clone(),
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
                seen.lock().expect("the authorities lock").push(authority);
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
            caches,
        })
    }

    pub fn base(&self, host: &str) -> String {
        format!("https://{host}:{}", self.port)
    }

    /// Registers the generated configurations for `namespace`, calling this server at `host`.
    pub async fn register(&self, plane: &ControlPlane, namespace: &str, host: &str) -> Result<()> {
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

    pub async fn unregister(&self, client: &Client) -> Result<()> {
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(&self.configuration_name, &DeleteParams::default())
            .await?;
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&self.configuration_name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    pub fn saw_authority(&self, authority: &str) -> bool {
        self.authorities.lock().expect("the authorities lock").iter().any(|a| a == authority)
    }

    pub fn assert_running(&self) {
        assert!(!self.server.is_finished(), "the webhook server task ended");
    }
}

/// Writes `tls.crt` and `tls.key` into `dir`, each by a rename so a reader never sees half a
/// file (the kubelet swaps a Secret mount atomically too).
pub fn write_cert_files(dir: &std::path::Path, cert_pem: &str, key_pem: &str) -> Result<()> {
    for (name, content) in [("tls.key", key_pem), ("tls.crt", cert_pem)] {
        let staging = dir.join(format!(".{name}.new"));
        std::fs::write(&staging, content)?;
        std::fs::rename(&staging, dir.join(name))?;
    }
    Ok(())
}

pub struct AdmissionLab {
    pub plane: &'static ControlPlane,
    pub client: Client,
    pub ns: String,
    pub hooks: WebhookServer,
    pub groups: Api<Group>,
    pub slots: Api<Node>,
    pub claims: Api<NodeClaim>,
    files: tempfile::TempDir,
    /// Prints the control plane's logs if the test fails while the lab lives.
    _logs: Option<crate::failure_logs::FailureLogs<'static>>,
}

impl AdmissionLab {
    /// A fresh namespace holding Group `pool` and its slot `machine-1` (created before the
    /// webhooks exist), the server started, the configurations registered and seen to answer.
    /// [`AdmissionLab::new`] on the test binary's shared API-only control plane, printing its
    /// logs if the test fails.
    pub async fn start(prefix: &str, operators: &[&str]) -> Self {
        let plane = ControlPlane::shared(crate::Components::API).await.expect("control plane");
        let mut lab = Self::new(plane, prefix, operators).await;
        lab._logs = Some(plane.logs_on_failure());
        lab
    }

    pub async fn new(plane: &'static ControlPlane, prefix: &str, operators: &[&str]) -> Self {
        plane.install_crds().await.expect("install CRDs");
        let client = plane.client().expect("client");
        let ns = plane.fresh_namespace(prefix).await.expect("namespace");
        let world = AdmissionLab {
            plane,
            client: client.clone(),
            hooks: WebhookServer::start(plane, &ns, operators).await.expect("webhook server"),
            groups: Api::namespaced(client.clone(), &ns),
            slots: Api::namespaced(client.clone(), &ns),
            claims: Api::namespaced(client.clone(), &ns),
            files: tempfile::tempdir().expect("tempdir"),
            ns,
            _logs: None,
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

    pub async fn create_claim(
        &self,
        name: &str,
        slot: &str,
        group: &str,
    ) -> kube::Result<NodeClaim> {
        self.claims.create(&PostParams::default(), &claim(name, slot, group)).await
    }

    /// Writes a claim's status through the status subresource, as the claim controller does, and returns once the webhook server's
    /// caches hold it: admission judges the next request by what its caches have seen, and a
    /// test that writes a failure and then creates the next claim means the two in that order.
    pub async fn set_claim_status(&self, name: &str, status: Value) {
        let written = self
            .claims
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .unwrap_or_else(|e| panic!("patching the status of claim {name}: {e}"));
        let version = written.metadata.resource_version;
        let claims = self.hooks.caches.claims.clone();
        let key = kube::runtime::reflector::ObjectRef::<NodeClaim>::new(name).within(&self.ns);
        eventually(
            &format!("admission's cache holding claim {name}'s status"),
            ACT_TIMEOUT,
            || {
                let seen = claims.get(&key).and_then(|c| c.metadata.resource_version.clone());
                let version = version.clone();
                async move {
                    ensure!(seen == version, "cache at {seen:?}, written {version:?}");
                    Ok(())
                }
            },
        )
        .await
        .expect("admission's cache");
    }

    /// Runs the built kubectl; returns (success, stdout, stderr).
    pub async fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let output = self.plane.kubectl(args).await.expect("run kubectl");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Writes `text` to a file for `kubectl apply -f`.
    pub fn manifest(&self, name: &str, text: &str) -> String {
        let path = self.files.path().join(name);
        std::fs::write(&path, text).expect("write manifest");
        path.display().to_string()
    }

    pub async fn finish(self) {
        self.hooks.assert_running();
        self.hooks.unregister(&self.client).await.expect("delete the configurations");
    }
}

pub fn group(name: &str, spec: Value) -> Group {
    serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "Group",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .expect("group")
}

pub fn slot(name: &str, group: Option<&str>) -> Node {
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
pub fn claim(name: &str, slot: &str, group: &str) -> NodeClaim {
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
pub fn refused<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the apiserver to refuse, got {other:?}"),
    }
}

pub fn now_seconds() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).expect("timestamp")
}

pub fn time_of(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Timestamp {
    t.as_ref().expect("time set").0
}

/// A client that acts as `user` (with the admin's permissions, through impersonation).
pub async fn client_as(plane: &ControlPlane, user: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(plane.kubeconfig_path()).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(vec!["system:masters".into()]);
    Client::try_from(config).expect("client")
}

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
pub async fn served_certificate(
    plane: &ControlPlane,
    port: u16,
    server_name: &str,
) -> Result<Vec<u8>> {
    let stream = connect(plane, port, server_name).await?;
    let (_, session) = stream.get_ref();
    let chain = session.peer_certificates().context("no certificate presented")?;
    Ok(chain.first().context("empty chain")?.as_ref().to_vec())
}

/// One HTTPS request to the server on `port` at 127.0.0.1, trusting only the control plane's
/// CA, read to the end whatever its status.
pub async fn https(
    plane: &ControlPlane,
    port: u16,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Result<Answer> {
    let client = crate::http::tls_client(&plane.ca_pem())?;
    let method = reqwest::Method::from_bytes(method.as_bytes())?;
    let mut request = client.request(method, format!("https://127.0.0.1:{port}{path}"));
    if let Some(content_type) = content_type {
        request = request.header(reqwest::header::CONTENT_TYPE, content_type);
    }
    crate::http::send(request.body(body.to_string())).await
}
