//! The core of the control plane, etcd and kube-apiserver: their flags, the admin kubeconfig,
//! and how each is known to be ready.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::binaries::Binaries;
use crate::pki::Pki;
use crate::process::Process;
use crate::{progress, wait};

/// The Service ClusterIP range; kwok's pod CIDR is chosen outside it.
pub(crate) const SERVICE_CIDR: &str = "10.96.0.0/16";

/// Three distinct free ports on 127.0.0.1 (see [`crate::ports`]).
pub(crate) fn free_ports() -> Result<[u16; 3]> {
    crate::ports::free_ports()
}

pub(crate) async fn start_etcd(
    binaries: &Binaries,
    dir: &Path,
    client_port: u16,
    peer_port: u16,
) -> Result<Process> {
    let started = Instant::now();
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let args = vec![
        "--name=test".into(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=test={peer_url}"),
        // Nothing a test writes must survive a crash; fsync is most of etcd's write latency.
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
    ];
    let etcd = Process::spawn(
        "etcd",
        &binaries.path("etcd"),
        &args,
        &dir.join("home/etcd"),
        &dir.join("logs"),
    )?;
    wait::until(
        "etcd /health",
        wait::start_timeout(),
        || etcd.ensure_running(),
        || etcd_health(client_port),
    )
    .await?;
    progress(&format!("etcd ready in {:.1?}", started.elapsed()));
    Ok(etcd)
}

/// GET /health on etcd's plain-HTTP client port. A raw HTTP/1.0 request over a std socket (on
/// a blocking thread) keeps an HTTP client crate out of the test dependencies.
pub(crate) async fn etcd_health(port: u16) -> Result<()> {
    let response = tokio::task::spawn_blocking(move || -> Result<String> {
        use std::io::{Read, Write};
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })
    .await??;
    if response.contains(r#""health":"true""#) {
        Ok(())
    } else {
        bail!("etcd answered: {}", response.lines().last().unwrap_or_default())
    }
}

pub(crate) fn spawn_apiserver(
    binaries: &Binaries,
    dir: &Path,
    pki: &Pki,
    etcd_port: u16,
    api_port: u16,
) -> Result<Process> {
    let args = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".into(),
        // Without it the apiserver looks for a default route to pick its address, and a
        // machine with none makes it exit.
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--cert-dir={}", dir.join("apiserver-certs").display()),
        format!("--tls-cert-file={}", pki.apiserver_cert.display()),
        format!("--tls-private-key-file={}", pki.apiserver_key.display()),
        format!("--client-ca-file={}", pki.ca_cert.display()),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", pki.service_account_public.display()),
        format!("--service-account-signing-key-file={}", pki.service_account_private.display()),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        // As kubeadm and k3s run it: a kubelet's identity (system:node:<name>) is judged by the
        // Node authorizer, and NodeRestriction refuses the labels a kubelet may not set itself.
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--allow-privileged=true".into(),
        // Keeps 127.0.0.1 out of the `kubernetes` Endpoints, where it means nothing.
        "--endpoint-reconciler-type=none".into(),
        // The other admission plugins stay at their defaults: the webhook plugins must run.
    ];
    Process::spawn(
        "kube-apiserver",
        &binaries.path("kube-apiserver"),
        &args,
        &dir.join("home/kube-apiserver"),
        &dir.join("logs"),
    )
}

/// Writes the admin kubeconfig, as JSON (a kubeconfig kubectl, the Go components and kube-rs all
/// read). Certificates are referenced by path.
pub(crate) fn write_kubeconfig(dir: &Path, pki: &Pki, api_port: u16) -> Result<PathBuf> {
    let path = dir.join("admin.kubeconfig");
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "homelab-test",
            "cluster": {
                "server": format!("https://127.0.0.1:{api_port}"),
                "certificate-authority": pki.ca_cert,
            },
        }],
        "users": [{
            "name": "admin",
            "user": {
                "client-certificate": pki.admin_cert,
                "client-key": pki.admin_key,
            },
        }],
        "contexts": [{
            "name": "homelab-test",
            "context": { "cluster": "homelab-test", "user": "admin", "namespace": "default" },
        }],
        "current-context": "homelab-test",
    });
    let text = serde_json::to_string_pretty(&kubeconfig).context("rendering the kubeconfig")?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

pub(crate) async fn load_config(kubeconfig: &Path) -> Result<Config> {
    let file = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", kubeconfig.display()))
}

/// Ready means /readyz answers ok (etcd reachable, post-start hooks done, bootstrap RBAC in
/// place) and Namespace `default` exists (the bootstrap controller has run).
pub(crate) async fn wait_apiserver_ready(apiserver: &Process, config: &Config) -> Result<()> {
    let started = Instant::now();
    let client = Client::try_from(config.clone()).context("building a kube client")?;
    wait::until(
        "kube-apiserver /readyz",
        wait::start_timeout(),
        || apiserver.ensure_running(),
        || {
            let client = client.clone();
            async move {
                let request = http::Request::get("/readyz").body(Vec::new())?;
                let body = client.request_text(request).await?;
                if body.trim() == "ok" { Ok(()) } else { bail!("/readyz said {body}") }
            }
        },
    )
    .await?;
    let namespaces: Api<Namespace> = Api::all(client);
    wait::until(
        "Namespace default",
        wait::start_timeout(),
        || apiserver.ensure_running(),
        || {
            let namespaces = namespaces.clone();
            async move {
                namespaces.get_opt("default").await?.context("not there yet")?;
                Ok(())
            }
        },
    )
    .await?;
    progress(&format!("kube-apiserver ready in {:.1?}", started.elapsed()));
    Ok(())
}
