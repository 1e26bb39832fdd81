//! What the install tests share: the chart installed by the real helm as a user installs it, the
//! live webhook configurations pointed at the operator on loopback, the installed Deployment's
//! arguments for a process, Secrets written the way the kubelet mounts them, the operator
//! started as a process with a kubeconfig of the test's choosing, and the certificate a server
//! presents.

pub mod pool;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::process::{Child, Command};

use crate::binaries::{Profile, binaries};
use crate::{ControlPlane, eventually};

/// What admission answers a slot that sets `spec.powerState`.
pub const POWER_STATE_REFUSAL: &str = "spec.powerState was removed";

/// A slot in `namespace` that sets the removed `spec.powerState`: admission must refuse it.
pub fn slot_with_power_state(namespace: &str) -> String {
    format!(
        "apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata: {{ name: mini-9, namespace: {namespace}, labels: {{ group: workers }} }}
spec:
  kubernetesNodeName: mini-9
  powerState: on
  startupPodSpec: {{ image: busybox:1.36, command: [\"true\"] }}
  shutdownPodSpec: {{ image: busybox:1.36, command: [\"true\"] }}
"
    )
}

/// `kubectl apply` of `file` (a [`slot_with_power_state`]): Ok(()) when admission refused it
/// with our message, Err with what kubectl said otherwise (a TLS failure, a timeout, an
/// acceptance).
pub async fn refused_with_our_message(plane: &ControlPlane, file: &Path) -> Result<(), String> {
    let path = file.display().to_string();
    let out = plane.kubectl(["apply", "-f", path.as_str()]).await.map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() && stderr.contains(POWER_STATE_REFUSAL) {
        Ok(())
    } else {
        Err(format!("{}: {stderr}{}", out.status, String::from_utf8_lossy(&out.stdout)))
    }
}

/// The chart in the repository.
pub fn chart_dir() -> PathBuf {
    crate::repo_path("charts/homelab-autoscaler")
}

/// Runs the pinned helm with a throwaway home; its stdout, or an error with its stderr.
pub async fn helm(args: &[&str]) -> Result<String> {
    let helm = binaries(Profile::E2e).await?.path("helm");
    let home = tempfile::tempdir()?;
    let out = Command::new(&helm)
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .await
        .with_context(|| format!("running {}", helm.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "helm {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// `helm template homelab-autoscaler <chart> --namespace <ns>` with `--set` for each of `sets`.
pub async fn render(namespace: &str, sets: &[&str]) -> Result<String> {
    let chart = chart_dir().display().to_string();
    let mut args = vec!["template", "homelab-autoscaler", chart.as_str(), "--namespace", namespace];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(&args).await
}

/// `helm install homelab-autoscaler <chart> --namespace <ns>` into `plane` with `--set` for each
/// of `sets`: the chart's manifests reach the apiserver as a user's do, parsed by helm (Go's
/// YAML). The webhook configurations then point at the chart's Service, which has no endpoints
/// here (no pods run): call [`point_webhooks_at`] before creating any object they admit.
pub async fn helm_install(plane: &ControlPlane, namespace: &str, sets: &[&str]) -> Result<String> {
    let chart = chart_dir().display().to_string();
    let kubeconfig = plane.kubeconfig_path().display().to_string();
    let mut args = vec![
        "install",
        "homelab-autoscaler",
        chart.as_str(),
        "--namespace",
        namespace,
        "--kubeconfig",
        kubeconfig.as_str(),
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(&args).await
}

/// The objects of a multi-document YAML stream, as kubectl reads it (as Go does: an unquoted
/// `on` is a boolean), for the chart tests that inspect `helm template`'s output.
pub async fn documents(yaml: &str) -> Result<Vec<serde_json::Value>> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), yaml)?;
    crate::yaml_readers::read_as_go(file.path()).await
}

/// The kind of an object.
pub fn kind(doc: &serde_json::Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// Applies `objects` with the control plane's kubectl (server-side, so CRDs and the objects
/// after them go in one call), failing with kubectl's message.
pub async fn apply(plane: &ControlPlane, objects: &[serde_json::Value]) -> Result<String> {
    let list = serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), serde_json::to_vec(&list)?)?;
    let path = file.path().display().to_string();
    let out = plane.kubectl(["apply", "--server-side", "-f", path.as_str()]).await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "kubectl apply: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// The installed admission configurations, both named `homelab-autoscaler`.
const WEBHOOK_CONFIGURATIONS: [&str; 2] =
    ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"];

/// Points every webhook of the installed admission configurations at `url_base` (the operator
/// on loopback, as the e2e World does) in place of the chart's Service, keeping each path and
/// leaving caBundle to whoever fills it (cainjector, or the operator). A JSON patch of the live
/// objects: it swaps `service` for `url` and nothing else, so a caBundle injected meanwhile stays.
pub async fn point_webhooks_at(client: &Client, url_base: &str) -> Result<()> {
    for kind in WEBHOOK_CONFIGURATIONS {
        let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        let resource = kube::api::ApiResource::from_gvk(&gvk);
        let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
        let config = api
            .get("homelab-autoscaler")
            .await
            .with_context(|| format!("reading the installed {kind}"))?;
        let webhooks = config.data["webhooks"].as_array().cloned().unwrap_or_default();
        ensure!(!webhooks.is_empty(), "the installed {kind} has no webhooks");
        let mut ops = Vec::new();
        for (i, webhook) in webhooks.iter().enumerate() {
            let path = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .with_context(|| format!("{kind} webhook {i} has no Service path"))?;
            ops.extend([
                serde_json::json!({ "op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook["name"] }),
                serde_json::json!({ "op": "remove", "path": format!("/webhooks/{i}/clientConfig/service") }),
                serde_json::json!({ "op": "add", "path": format!("/webhooks/{i}/clientConfig/url"), "value": format!("{url_base}{path}") }),
            ]);
        }
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))?;
        api.patch("homelab-autoscaler", &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .with_context(|| format!("pointing the {kind}'s webhooks at {url_base}"))?;
    }
    Ok(())
}

/// The container arguments of the installed operator Deployment, read back from the apiserver:
/// what the chart renders for its pods.
pub async fn deployment_args(client: &Client, namespace: &str) -> Result<Vec<String>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deployment =
        deployments.get("homelab-autoscaler").await.context("reading the installed Deployment")?;
    let containers = deployment.spec.template.spec.map(|s| s.containers);
    let operator = containers
        .into_iter()
        .flatten()
        .find(|c| c.name == "operator")
        .context("the Deployment has no `operator` container")?;
    operator.args.context("the operator container has no args")
}

/// The installed Deployment's `installed` arguments for a replica serving the webhooks on
/// `webhook_port` and the gRPC provider on `grpc_port` of 127.0.0.1, `localhost` standing for the
/// Services' names.
pub fn replica_on_loopback(
    installed: &[String],
    webhook_port: u16,
    grpc_port: u16,
) -> Result<Vec<String>> {
    on_loopback(
        installed,
        &[
            ("--webhook-addr", format!("127.0.0.1:{webhook_port}")),
            ("--webhook-dns-names", "localhost".into()),
            ("--grpc-addr", format!("127.0.0.1:{grpc_port}")),
            ("--grpc-dns-names", "localhost".into()),
        ],
    )
}

/// `args` (a Deployment's, from [`deployment_args`]) for a process on loopback: `run` goes
/// ([`Operator::start`] adds it), as does `--admin-addr` ([`Operator::start`] picks a free port),
/// and each flag named in `overrides` takes the given value in place of the rendered one
/// (listen addresses, the Service's DNS names, the Secret mounts). Every overridden flag must
/// be among `args`: a chart that stops rendering one fails here rather than passing unseen.
pub fn on_loopback(args: &[String], overrides: &[(&str, String)]) -> Result<Vec<String>> {
    let flag = |arg: &str| arg.split_once('=').map_or(arg, |(f, _)| f).to_string();
    for (name, _) in overrides {
        ensure!(
            args.iter().any(|a| flag(a) == *name),
            "the Deployment does not pass {name}: {args:?}"
        );
    }
    Ok(args
        .iter()
        .filter(|a| a.as_str() != "run" && flag(a) != "--admin-addr")
        .map(|a| match overrides.iter().find(|(name, _)| flag(a) == *name) {
            Some((name, value)) => format!("{name}={value}"),
            None => a.clone(),
        })
        .collect())
}

/// Waits for Secret `name` in `namespace` to hold `tls.crt`, `tls.key` and `ca.crt`.
pub async fn issued_secret(client: &Client, namespace: &str, name: &str) -> Result<Secret> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    eventually(
        &format!("Secret {namespace}/{name} issued"),
        crate::cert_manager::ISSUE_TIMEOUT,
        || async {
            let secret = secrets.get_opt(name).await?.context("not there yet")?;
            let data = secret.data.clone().unwrap_or_default();
            for key in ["tls.crt", "tls.key", "ca.crt"] {
                ensure!(data.get(key).is_some_and(|v| !v.0.is_empty()), "no {key} yet");
            }
            Ok(secret)
        },
    )
    .await
}

/// Writes `secret`'s data under `dir` as the kubelet mounts a Secret: the files in a fresh
/// timestamped directory, `..data` a symlink to it swapped atomically, and each key a symlink
/// through `..data`. Called again, it swaps the content in one rename.
pub fn mount_secret(dir: &Path, data: &BTreeMap<String, ByteString>) -> Result<()> {
    static GENERATION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    std::fs::create_dir_all(dir)?;
    let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let payload = format!("..{}_{generation}", std::process::id());
    std::fs::create_dir(dir.join(&payload))?;
    for (key, value) in data {
        std::fs::write(dir.join(&payload).join(key), &value.0)?;
    }
    let staging = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&staging);
    std::os::unix::fs::symlink(&payload, &staging)?;
    std::fs::rename(&staging, dir.join("..data"))?;
    for key in data.keys() {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{key}"), &link)?;
        }
    }
    Ok(())
}

/// A free loopback port (see [`crate::ports`]).
pub fn free_port() -> Result<u16> {
    crate::ports::free_port()
}

/// The leaf certificate (DER) a TLS server on `127.0.0.1:port` presents for `name`, verified
/// against `ca_pem`.
pub async fn served_certificate(port: u16, ca_pem: &[u8], name: &str) -> Result<Vec<u8>> {
    homelab_autoscaler::tls::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert?)?;
    }
    let config =
        rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let tls = tokio::time::timeout(
        Duration::from_secs(10),
        connector.connect(ServerName::try_from(name.to_string())?, tcp),
    )
    .await
    .context("TLS handshake timed out")??;
    let (_, session) = tls.get_ref();
    let leaf = session.peer_certificates().and_then(|c| c.first()).context("no certificate")?;
    Ok(leaf.to_vec())
}

/// The first certificate of a PEM chain, DER.
pub fn first_certificate(pem: &[u8]) -> Result<Vec<u8>> {
    Ok(CertificateDer::pem_slice_iter(pem).next().context("no certificate in PEM")??.to_vec())
}

/// The operator binary run as a process with its own kubeconfig and arguments.
pub struct Operator {
    pub child: Child,
    pub admin_port: u16,
    pub log: PathBuf,
}

impl Operator {
    /// Starts `bin run <args> --admin-addr=127.0.0.1:<free>` with `kubeconfig`, logging to
    /// `log`, and waits until /ready answers.
    pub async fn start(
        bin: &Path,
        kubeconfig: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Operator> {
        let admin_port = free_port()?;
        let out = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .arg("run")
            .args(args)
            .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,homelab_autoscaler=info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let operator = Operator { child, admin_port, log: log.to_path_buf() };
        let admin = format!("127.0.0.1:{admin_port}");
        // A component's start budget: its caches list from an apiserver on a loaded machine.
        let child = std::sync::Mutex::new(operator);
        let exited = || {
            let mut operator = child.lock().map_err(|_| anyhow::anyhow!("the operator lock"))?;
            if let Some(status) = operator.child.try_wait()? {
                anyhow::bail!("the operator exited ({status}):\n{}", operator.log_tail(40));
            }
            Ok(())
        };
        let ready = crate::wait::until(
            "the operator's /ready",
            crate::wait::start_timeout(),
            exited,
            || {
                let admin = admin.clone();
                async move { crate::e2e::http_get(&admin, "/ready").await.map(|_| ()) }
            },
        )
        .await;
        let operator = child.into_inner().map_err(|_| anyhow::anyhow!("the operator lock"))?;
        ready.with_context(|| operator.log_tail(40))?;
        Ok(operator)
    }

    /// Two replicas started at once, racing as a Deployment's two pods do: replica `i` runs
    /// with `args(i)` and logs to `dir/operator-{i}.log`.
    pub async fn start_two(
        bin: &Path,
        kubeconfig: &Path,
        dir: &Path,
        args: impl Fn(usize) -> Vec<String>,
    ) -> Result<(Operator, Operator)> {
        let (first, second) = (args(0), args(1));
        let (logs0, logs1) = (dir.join("operator-0.log"), dir.join("operator-1.log"));
        let (a, b) = tokio::join!(
            Operator::start(bin, kubeconfig, &first, &logs0),
            Operator::start(bin, kubeconfig, &second, &logs1)
        );
        Ok((a.context("replica 0")?, b.context("replica 1")?))
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::file_tail(&self.log, lines)
    }
}

/// A stand-in for a Service in front of several replicas: a TCP proxy on a loopback port that
/// sends each connection to the next backend in turn, and to the one after when a backend
/// refuses (a killed pod leaves the endpoints). Stops when dropped.
pub struct ServiceProxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceProxy {
    pub async fn start(backends: Vec<u16>) -> Result<ServiceProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let start = next;
                next = next.wrapping_add(1);
                let backends = backends.clone();
                tokio::spawn(async move {
                    for i in 0..backends.len() {
                        let backend = backends[(start + i) % backends.len()];
                        if let Ok(mut outbound) =
                            tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                        {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(ServiceProxy { port, task })
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Speaks HTTP/2's preface to a gRPC server over TLS with no client certificate: Ok with what
/// it read if the server answered, Err if the handshake or the read was refused.
pub async fn without_client_certificate(port: u16, ca: &[u8]) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    homelab_autoscaler::tls::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let mut config =
        rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp =
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = connector.connect(name, tcp).await.map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = vec![0u8; 64];
    match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await {
        Err(_) => Err("no answer within 10s".into()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Ok(Ok(0)) => Err("closed".into()),
        Ok(Ok(n)) => Ok(buf[..n].to_vec()),
    }
}

/// A kubeconfig at `path` that authenticates as the ServiceAccount `account` of `namespace`
/// with a TokenRequest token (never admin): what the chart's pods run as.
pub async fn service_account_kubeconfig(
    plane: &ControlPlane,
    namespace: &str,
    account: &str,
    path: &Path,
) -> Result<()> {
    let out = plane
        .kubectl(["create", "token", account, "-n", namespace, "--duration=2h"])
        .await
        .context("kubectl create token")?;
    ensure!(out.status.success(), "kubectl create token: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let ca = path.with_extension("ca.crt");
    std::fs::write(&ca, plane.ca_pem())?;
    std::fs::write(
        path,
        format!(
            "apiVersion: v1
kind: Config
clusters: [{{ name: lab, cluster: {{ server: 'https://{}', certificate-authority: '{}' }} }}]
users: [{{ name: {account}, user: {{ token: '{token}' }} }}]
contexts: [{{ name: {account}, context: {{ cluster: lab, user: {account}, namespace: {namespace} }} }}]
current-context: {account}
",
            plane.api_address(),
            ca.display()
        ),
    )?;
    Ok(())
}

/// The client-certificate digest the operator stamped into the pod template of the Deployment
/// `name` (`--cluster-autoscaler-deployment`), if any.
pub async fn certificate_stamp(
    deployments: &Api<k8s_openapi::api::apps::v1::Deployment>,
    name: &str,
) -> Result<Option<String>> {
    let deployment = deployments.get(name).await?;
    Ok(deployment.spec.template.metadata.and_then(|m| m.annotations).and_then(|mut a| {
        a.remove(homelab_autoscaler::operator::autoscaler_restart::CERTIFICATE_DIGEST)
    }))
}

/// How many times `needle` occurs in the files `logs` (a missing file counts none): which of
/// several replicas did something, from their logs.
pub fn count_in_logs(logs: &[PathBuf], needle: &str) -> usize {
    logs.iter()
        .map(|log| std::fs::read_to_string(log).unwrap_or_default().matches(needle).count())
        .sum()
}

/// `kubectl apply -n namespace -f` the repository's file `path` (an example pool, say).
pub async fn apply_repo_file(plane: &ControlPlane, namespace: &str, path: &str) -> Result<()> {
    let file = crate::repo_path(path);
    let out = plane.kubectl(["apply", "-n", namespace, "-f", &file.display().to_string()]).await?;
    ensure!(out.status.success(), "applying {path}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
