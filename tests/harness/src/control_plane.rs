//! A real Kubernetes control plane on 127.0.0.1: etcd and kube-apiserver always, and on request
//! kube-controller-manager, kube-scheduler and kwok. Either one per test binary, started by the
//! first test that asks and shared by the rest ([`ControlPlane::shared`]), or one a test owns
//! ([`ControlPlane::start`]), stopped when it is dropped.
//!
//! The shared object lives in a static and outlives every test's tokio runtime, so a plane holds
//! only runtime-free things (paths, std child processes, a `kube::Config`); each test builds its
//! own `kube::Client` with [`ControlPlane::client`]. Teardown is the processes' own: see
//! `process.rs`. Dropping an owned plane stops its components and removes its directory; the
//! shared plane, never dropped, goes when the test process ends.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Config};
use tokio::sync::OnceCell;

use crate::base::{
    free_ports, load_config, spawn_apiserver, start_etcd, wait_apiserver_ready, write_kubeconfig,
};
use crate::binaries::{Binaries, Profile, binaries};
use crate::failure_logs::FailureLogs;
use crate::pki::{CertAndKey, Pki};
use crate::process::{Janitor, Process};
use crate::{progress, wait};

/// Which components beyond etcd and kube-apiserver a test needs. Asking again for a component
/// that already runs is free; a component, once started, runs as long as its control plane
/// (the shared one: until the test binary exits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Components {
    /// kube-controller-manager: Jobs, ServiceAccounts, namespace and node lifecycle.
    pub controller_manager: bool,
    /// kube-scheduler: binds pods to (kwok) nodes.
    pub scheduler: bool,
    /// kwok: plays kubelet for nodes annotated `kwok.x-k8s.io/node: fake` and their pods.
    pub kwok: bool,
}

impl Components {
    /// The API alone: CRDs, validation, webhooks, RBAC.
    pub const API: Self = Self { controller_manager: false, scheduler: false, kwok: false };
    /// A cluster in which pods run: every component.
    pub const CLUSTER: Self = Self { controller_manager: true, scheduler: true, kwok: true };

    fn profile(self) -> Profile {
        if self == Self::API { Profile::Integration } else { Profile::Cluster }
    }
}

/// A running control plane. Dropping it stops its components (each killed and reaped, so its
/// ports are free) and then removes its directory.
pub struct ControlPlane {
    // Field order is drop order: the components that talk to the apiserver go first, then the
    // apiserver, then etcd; once every process is gone the janitor removes the directory.
    pub(crate) kwok: OnceCell<Process>,
    pub(crate) scheduler: OnceCell<Process>,
    pub(crate) controller_manager: OnceCell<Process>,
    apiserver: Process,
    etcd: Process,
    _janitor: Janitor,
    api_port: u16,
    etcd_port: u16,
    dir: PathBuf,
    pki: Pki,
    kubeconfig: PathBuf,
    config: Config,
    kubectl: PathBuf,
}

static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();

impl ControlPlane {
    /// The test binary's control plane, started on first use, with at least `components`
    /// running. It is never dropped: its processes and directory go when the test process ends.
    pub async fn shared(components: Components) -> Result<&'static ControlPlane> {
        let plane = SHARED.get_or_try_init(|| Self::boot(components.profile())).await?;
        plane.ensure(components).await?;
        Ok(plane)
    }

    /// A control plane of the caller's own, with at least `components` running: its own ports,
    /// PKI and directory, shared with no other test. For a test that must see a whole cluster
    /// to itself (cluster-autoscaler looks at every pending pod and node). Dropping it stops
    /// every component and removes its directory; wrap it in an `Arc` (or [`crate::Plane`]) to
    /// share it, and it stops when the last handle goes.
    pub async fn start(components: Components) -> Result<ControlPlane> {
        let plane = Self::boot(components.profile()).await?;
        plane.ensure(components).await?;
        Ok(plane)
    }

    /// Starts `components` that are not running yet.
    pub async fn ensure(&self, components: Components) -> Result<()> {
        if components.controller_manager {
            self.controller_manager.get_or_try_init(|| self.start_controller_manager()).await?;
        }
        if components.scheduler {
            self.scheduler.get_or_try_init(|| self.start_scheduler()).await?;
        }
        if components.kwok {
            self.kwok.get_or_try_init(|| self.start_kwok()).await?;
        }
        Ok(())
    }

    /// Kills kube-apiserver (SIGKILL) and starts it again on the same port, certificates and
    /// etcd; returns once it is ready. Clients and watches must find their way back.
    pub async fn restart_apiserver(&self) -> Result<()> {
        let started = Instant::now();
        self.apiserver.restart()?;
        wait_apiserver_ready(&self.apiserver, &self.config).await?;
        progress(&format!("kube-apiserver restarted in place in {:.1?}", started.elapsed()));
        Ok(())
    }

    /// Kills etcd (SIGKILL) and starts it again on the same ports and data directory; returns
    /// once it is healthy and kube-apiserver is ready through it again.
    pub async fn restart_etcd(&self) -> Result<()> {
        let started = Instant::now();
        self.etcd.restart()?;
        let port = self.etcd_port;
        crate::wait::until(
            "etcd /health after a restart",
            crate::wait::start_timeout(),
            || self.etcd.ensure_running(),
            || crate::base::etcd_health(port),
        )
        .await?;
        wait_apiserver_ready(&self.apiserver, &self.config).await?;
        progress(&format!("etcd restarted in place in {:.1?}", started.elapsed()));
        Ok(())
    }

    /// Kills kwok (the fake kubelet of every test machine) and starts it again. kwok 0.8
    /// does not resume its watches after etcd restarts (a pod bound to its node stayed Pending
    /// for a minute, measured), where a real kubelet reconnects on its own.
    pub fn restart_kwok(&self) -> Result<()> {
        match self.kwok.get() {
            Some(kwok) => kwok.restart(),
            None => Ok(()),
        }
    }

    /// A new client for the admin user. Call it in each test: a client belongs to the tokio
    /// runtime it was made in, and every `#[tokio::test]` has its own.
    pub fn client(&self) -> Result<Client> {
        Client::try_from(self.config.clone()).context("building a kube client")
    }

    /// The admin clients the operator's controllers run on (their evictions without retries),
    /// made in the calling test's runtime like [`ControlPlane::client`].
    pub fn controller_clients(&self) -> Result<homelab_autoscaler::controller::Clients> {
        homelab_autoscaler::controller::Clients::from_config(self.config.clone())
            .context("building the controllers' clients")
    }

    /// The admin kubeconfig (certificate files next to it), for kubectl or a product binary.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Where kube-apiserver listens (HTTPS, on 127.0.0.1).
    pub fn api_address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.api_port))
    }

    /// The control plane's temporary directory: logs, certificates, etcd data, kubeconfig.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubectl built with the control plane (same version as the apiserver).
    pub fn kubectl_path(&self) -> &Path {
        &self.kubectl
    }

    /// The control plane's certificates (a real machine's kubelet uses the admin one).
    pub(crate) fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The CA that signed the apiserver's certificate, PEM encoded.
    pub fn ca_pem(&self) -> String {
        self.pki.ca_pem()
    }

    /// A serving certificate for `names` signed by the control plane's CA, for a webhook server
    /// a test runs; pass [`ControlPlane::ca_pem`] as the webhook's CA bundle.
    pub fn issue_serving_cert(&self, names: &[&str]) -> Result<CertAndKey> {
        self.pki.serving_cert(names)
    }

    /// `kubectl apply -n NAMESPACE -f` of a manifest written as a user writes it (YAML text),
    /// so kubectl, not a Rust parser, reads it. Like [`Self::kubectl`], the caller judges the
    /// outcome.
    pub async fn kubectl_apply(&self, namespace: &str, manifest: &str) -> Result<Output> {
        let file = tempfile::Builder::new().suffix(".yaml").tempfile()?;
        std::fs::write(file.path(), manifest)?;
        let path = file.path().to_string_lossy().into_owned();
        self.kubectl(["apply", "-n", namespace, "-f", path.as_str()]).await
    }

    /// Runs the built kubectl against this control plane. A failing kubectl is not an error
    /// here: the caller inspects the status and output.
    pub async fn kubectl<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<S> = args.into_iter().collect();
        let shown: Vec<String> =
            args.iter().map(|arg| arg.as_ref().to_string_lossy().into_owned()).collect();
        tokio::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"))
            .args(&args)
            .env_clear()
            .env("HOME", self.dir.join("home"))
            .output()
            .await
            .with_context(|| format!("running kubectl {}", shown.join(" ")))
    }

    /// Creates a namespace named `<prefix>-<unique suffix>` and returns its name. With
    /// kube-controller-manager running it also waits for the namespace's `default`
    /// ServiceAccount, without which no pod (so no Job) can be created there. Namespaces are
    /// never deleted: the whole control plane goes away with the test binary (an owned one when
    /// it is dropped).
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<String> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let name = format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let namespace = Namespace {
            metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
            ..Namespace::default()
        };
        let client = self.client()?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        if let Some(controller_manager) = self.controller_manager.get() {
            let accounts: Api<ServiceAccount> = Api::namespaced(client, &name);
            wait::until(
                &format!("ServiceAccount {name}/default"),
                wait::start_timeout(),
                || controller_manager.ensure_running(),
                || async {
                    accounts.get_opt("default").await?.context("not there yet")?;
                    Ok(())
                },
            )
            .await?;
        }
        Ok(name)
    }

    /// The last `lines` lines of every running component's log.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for process in self.processes() {
            out.push_str(&format!(
                "\n===== {} ({}) =====\n{}\n",
                process.name(),
                process.log_path().display(),
                process.log_tail(lines)
            ));
        }
        out
    }

    /// A guard that prints the components' log tails if the test panics while it is alive.
    /// Bind it first thing in a test: `let _logs = plane.logs_on_failure();`
    pub fn logs_on_failure(&self) -> FailureLogs<'_> {
        FailureLogs::borrowing(self)
    }

    fn processes(&self) -> impl Iterator<Item = &Process> {
        let optional = [&self.controller_manager, &self.scheduler, &self.kwok];
        [&self.etcd, &self.apiserver]
            .into_iter()
            .chain(optional.into_iter().filter_map(OnceCell::get))
    }

    /// Starts etcd and kube-apiserver, retrying with fresh ports: a port found free can be
    /// taken by someone else before the component binds it.
    async fn boot(profile: Profile) -> Result<Self> {
        let binaries = binaries(profile).await?;
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            match Self::start_once(&binaries).await {
                Ok(plane) => {
                    progress(&format!(
                        "control plane ready in {:.1?} (kubeconfig {})",
                        started.elapsed(),
                        plane.kubeconfig.display()
                    ));
                    return Ok(plane);
                }
                Err(err) if attempt < 3 => {
                    progress(&format!("control plane start failed, retrying: {err:#}"));
                    attempt += 1;
                }
                Err(err) => return Err(err.context("starting the test control plane")),
            }
        }
    }

    async fn start_once(binaries: &Binaries) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("homelab-control-plane-")
            .tempdir()
            .context("creating the control plane's directory")?
            .keep();
        let janitor = Janitor::start(&dir)?;
        let pki = Pki::generate(&dir.join("pki"))?;
        let [etcd_port, peer_port, api_port] = free_ports()?;

        let etcd = start_etcd(binaries, &dir, etcd_port, peer_port).await?;
        let apiserver = spawn_apiserver(binaries, &dir, &pki, etcd_port, api_port)?;
        let kubeconfig = write_kubeconfig(&dir, &pki, api_port)?;
        let config = load_config(&kubeconfig).await?;
        wait_apiserver_ready(&apiserver, &config).await?;
        Ok(Self {
            kwok: OnceCell::new(),
            scheduler: OnceCell::new(),
            controller_manager: OnceCell::new(),
            apiserver,
            etcd,
            _janitor: janitor,
            api_port,
            etcd_port,
            dir,
            pki,
            kubeconfig,
            config,
            kubectl: binaries.path("kubectl"),
        })
    }

    /// Spawns a component of the cluster profile, logging into the control plane's directory.
    pub(crate) async fn spawn(&self, name: &str, args: Vec<String>) -> Result<Process> {
        let binaries = binaries(Profile::Cluster).await?;
        Process::spawn(
            name,
            &binaries.path(name),
            &args,
            &self.dir.join("home").join(name),
            &self.dir.join("logs"),
        )
    }

    pub(crate) fn kubeconfig_arg(&self) -> String {
        format!("--kubeconfig={}", self.kubeconfig.display())
    }

    async fn start_controller_manager(&self) -> Result<Process> {
        let started = Instant::now();
        let process = self
            .spawn(
                "kube-controller-manager",
                vec![
                    self.kubeconfig_arg(),
                    "--leader-elect=false".into(),
                    // 0 turns the HTTPS endpoint off; its default port binds 0.0.0.0.
                    "--secure-port=0".into(),
                    "--controllers=*".into(),
                    // Signs legacy tokens and publishes kube-root-ca.crt in every namespace.
                    format!(
                        "--service-account-private-key-file={}",
                        self.pki.service_account_private.display()
                    ),
                    format!("--root-ca-file={}", self.pki.ca_cert.display()),
                    // A machine whose kubelet stopped (powered off, crashed) turns Ready=Unknown
                    // within seconds rather than the default 50 s. kwok's heartbeat stages post
                    // every 4 s, so a healthy node misses five before it is marked; the period
                    // is how often the node lifecycle controller looks.
                    "--node-monitor-grace-period=20s".into(),
                    "--node-monitor-period=2s".into(),
                ],
            )
            .await?;
        // Effective once its ServiceAccount controller has created default/default.
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client()?, "default");
        wait::until(
            "kube-controller-manager to create ServiceAccount default/default",
            wait::start_timeout(),
            || process.ensure_running(),
            || async {
                accounts.get_opt("default").await?.context("not there yet")?;
                Ok(())
            },
        )
        .await?;
        progress(&format!("kube-controller-manager ready in {:.1?}", started.elapsed()));
        Ok(process)
    }

    async fn start_scheduler(&self) -> Result<Process> {
        // Its effect is visible only once there is a node and a pod; tests see it then.
        let process = self
            .spawn(
                "kube-scheduler",
                vec![
                    self.kubeconfig_arg(),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                ],
            )
            .await?;
        process.ensure_running()?;
        progress("kube-scheduler started");
        Ok(process)
    }
}
