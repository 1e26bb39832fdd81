//! The end-to-end scenarios shared by `make demo` (examples/demo.rs, which narrates one) and the
//! test suite (tests/e2e_*.rs, which assert them): the real operator binary and the machine
//! simulator as separate processes against a real control plane, a pool from
//! examples/pool.yaml, and a workload that needs it.
//!
//! A [`World`] runs on the test binary's shared control plane ([`World::start`]) or on one a
//! test owns ([`World::start_on`] with [`ControlPlane::start`]), which stops with the World.

mod real_pool;
mod scenarios;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use homelab_autoscaler::api::NodeClaim;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::local_path::{LocalPathProvisioner, start_local_path_provisioner};
use crate::timeline::{self, Seen, Timeline};
use crate::{Components, ControlPlane, Plane, eventually};

pub mod autoscaler;
mod autoscaler_steps;
pub mod prometheus;
pub use autoscaler::{Autoscaler, AutoscalerSettings, GrpcEndpoint, sum_samples};
pub use autoscaler_steps::{
    MachineSteps, ScaleUpBreakdown, Workload, describe, released_by_autoscaler,
};
pub use real_pool::{AGENT_TAINT, RealPool};
pub use scenarios::SideBySide;

/// Every claim the World has seen, by name, as last seen (deleted ones stay).
pub type ClaimLedger = Arc<Mutex<BTreeMap<String, NodeClaim>>>;

pub const NAMESPACE: &str = "homelab-autoscaler-system";
/// How long a simulated machine takes to register its node after its startup Job.
pub const SIMULATED_BOOT_DELAY: Duration = Duration::from_secs(2);
/// How long a simulated machine's node carries its bootstrap taints.
pub const SIMULATED_GATE_DELAY: Duration = Duration::from_secs(2);
const ACT: Duration = Duration::from_secs(120);
/// The operator's leader-election Lease (its `--lease-name` default).
const LEADER_LEASE: &str = "homelab-autoscaler";

/// One timed step of the scenario.
pub struct Step {
    pub what: String,
    pub took: Duration,
}

/// The running world: control plane, operator and simulator processes. Dropping it kills the
/// operator replicas and the simulator, and lets go of the control plane (an owned one stops).
pub struct World {
    // Field order is drop order: the product's processes go before the control plane.
    /// The operator replicas started so far (a killed one stays, with its process gone).
    pub replicas: Vec<Replica>,
    /// The machine simulator, for a simulated pool.
    _simulator: Option<Child>,
    /// The lan, lab and machines of a real pool.
    real: Option<RealPool>,
    watch: tokio::task::JoinHandle<()>,
    /// Follows cluster-autoscaler's calls as they reach the provider (into the timeline, and
    /// narrated when narrating).
    calls: Option<tokio::task::JoinHandle<()>>,
    /// When each claim, Job, Node and pod change was first seen, at millisecond resolution.
    pub timeline: Timeline,
    _timeline_watches: timeline::Watches,
    /// Every claim seen so far, including those already released and deleted.
    pub ledger: ClaimLedger,
    /// Mutual-TLS files for the externalgrpc provider, when cluster-autoscaler is to dial it.
    grpc_cert_dir: Option<PathBuf>,
    /// A cluster-autoscaler that lives (and stops) with the World.
    kept_autoscaler: Option<Autoscaler>,
    /// rancher's local-path-provisioner, once started ([`World::start_local_path_provisioner`]).
    local_path: Option<LocalPathProvisioner>,
    pub client: Client,
    pub plane: Plane,
    started: Instant,
    steps: Vec<Step>,
    /// Tables for the summary, after the steps (a scale-up's split).
    tables: Vec<String>,
    narrate: bool,
    bin: PathBuf,
    logs: PathBuf,
    tls: WebhookTls,
    /// The kubeconfig the operator replicas run with (the admin's unless set).
    operator_kubeconfig: Option<PathBuf>,
    /// The certificate files every replica serves, when the World made them
    /// ([`World::start_with_shared_certificate`]); removed with the World.
    _shared_certificate: Option<tempfile::TempDir>,
}

impl Drop for World {
    fn drop(&mut self) {
        // The claim printer would otherwise keep watching (and retrying against a stopped
        // control plane) until the runtime ends.
        self.watch.abort();
        if let Some(calls) = &self.calls {
            calls.abort();
        }
    }
}

/// What the pool's machines are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machines {
    /// Nodes of kwok, booted by the operator's machine simulator when a startup Job succeeds:
    /// no root needed, seconds per boot.
    Simulated,
    /// Real machines ([`crate::machine`]), one per slot, powered by the slots' own drivers
    /// from power Jobs on a real lab machine ([`RealPool`]). Needs root.
    Real,
}

/// How a World is started.
struct Setup {
    narrate: bool,
    tls: WebhookTls,
    /// Serve the externalgrpc provider over mutual TLS, for cluster-autoscaler.
    grpc_mtls: bool,
    operator_kubeconfig: Option<PathBuf>,
    machines: Machines,
}

impl Setup {
    fn new(narrate: bool) -> Self {
        Self {
            narrate,
            tls: WebhookTls::SelfMade,
            grpc_mtls: false,
            operator_kubeconfig: None,
            machines: Machines::Simulated,
        }
    }
}

/// Where the operator's webhook certificate comes from.
#[derive(Clone)]
pub enum WebhookTls {
    /// Each replica makes its own CA and patches caBundle (the no-cert-manager path).
    SelfMade,
    /// Files in the cert-manager Secret layout, shared by every replica.
    Files { dir: PathBuf, ca_pem: String },
}

/// One operator process.
pub struct Replica {
    pub child: Child,
    pub pid: u32,
    pub webhook_port: u16,
    pub grpc_port: u16,
    /// The admin listener: /live, /ready, /metrics.
    pub admin_port: u16,
    /// Its POD_NAME, which is its Lease identity: a restarted replica keeps it, as a pod
    /// whose container restarts keeps its name.
    pub name: String,
    args: Vec<String>,
}

impl Replica {
    /// The Lease identity of the replica.
    pub fn identity(&self) -> String {
        self.name.clone()
    }
}

fn free_port() -> Result<u16> {
    crate::ports::free_port()
}

/// The operator binary next to the running test or example (cargo builds it first), or the one
/// `HOMELAB_OPERATOR_BINARY` names: a scenario run against another build (a release binary, or
/// an older commit's, to see what it did before a change).
pub fn operator_binary(hint: Option<&str>) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("HOMELAB_OPERATOR_BINARY") {
        return Ok(PathBuf::from(path));
    }
    if let Some(path) = hint {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("no parent")?;
    if dir.ends_with("examples") || dir.ends_with("deps") {
        dir = dir.parent().context("no parent")?;
    }
    let bin = dir.join("homelab-autoscaler");
    ensure!(bin.exists(), "{} is missing: run `cargo build --bins` first", bin.display());
    Ok(bin)
}

/// A directory for the operator's and simulator's logs, one per World (a test binary may run
/// several on planes of their own): `homelab-demo-<pid>`, then `homelab-demo-<pid>-<n>`.
fn log_dir() -> Result<PathBuf> {
    static WORLDS: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    let name = match WORLDS.fetch_add(1, Ordering::Relaxed) {
        0 => format!("homelab-demo-{pid}"),
        n => format!("homelab-demo-{pid}-{n}"),
    };
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The status code and body of `GET path` from a plain-HTTP endpoint (an operator's or
/// cluster-autoscaler's admin port, Prometheus).
pub async fn http_answer(addr: &str, path: &str) -> Result<(u16, String)> {
    let answer = crate::http::get(addr, path).await?;
    Ok((answer.status, answer.body))
}

/// The body of `GET path` from a plain-HTTP endpoint, or an error unless it answers 200.
pub(crate) async fn http_get(addr: &str, path: &str) -> Result<String> {
    let (code, body) = http_answer(addr, path).await?;
    ensure!(code == 200, "GET {path}: {code} {body}");
    Ok(body)
}

async fn http_ok(addr: &str, path: &str) -> Result<()> {
    http_get(addr, path).await.map(|_| ())
}

pub(crate) fn spawn(bin: &Path, args: &[String], kubeconfig: &Path, log: &Path) -> Result<Child> {
    spawn_as(bin, args, kubeconfig, std::fs::File::create(log)?, None)
}

/// [`spawn`] into an open log, with a POD_NAME when given.
fn spawn_as(
    bin: &Path,
    args: &[String],
    kubeconfig: &Path,
    out: std::fs::File,
    pod_name: Option<&str>,
) -> Result<Child> {
    let err = out.try_clone()?;
    let mut command = Command::new(bin);
    if let Some(name) = pod_name {
        command.env("POD_NAME", name);
    }
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,homelab_autoscaler=info")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

impl World {
    pub fn note(&mut self, what: impl Into<String>, since: Instant) {
        self.record(what, since.elapsed());
    }

    /// A table for the summary, printed now too when narrating.
    pub fn table(&mut self, table: String) {
        if self.narrate {
            println!("{table}");
        }
        self.tables.push(table);
    }

    /// A step whose duration was measured elsewhere.
    pub fn record(&mut self, what: impl Into<String>, took: Duration) {
        let step = Step { what: what.into(), took };
        if self.narrate {
            println!(
                "[{:>6.1}s] {} ({:.1}s)",
                self.started.elapsed().as_secs_f64(),
                step.what,
                step.took.as_secs_f64()
            );
        }
        self.steps.push(step);
    }

    /// Starts everything on the test binary's shared control plane: the CRDs, the operator
    /// (webhooks with its own CA, controllers, built-in scaler), the machine simulator, and a
    /// "lab" node where lifecycle Jobs run.
    pub async fn start(bin: &Path, narrate: bool) -> Result<World> {
        Self::start_with(bin, narrate, WebhookTls::SelfMade).await
    }

    /// [`World::start`] with the pool's machines as `machines` says: simulated, or real
    /// machines (root only) whose power Jobs run on a real "lab" machine.
    pub async fn start_on_machines(bin: &Path, narrate: bool, machines: Machines) -> Result<World> {
        let started = Instant::now();
        let plane = ControlPlane::shared(Components::CLUSTER).await?;
        Self::build(plane.into(), bin, Setup { machines, ..Setup::new(narrate) }, started).await
    }

    /// [`World::start`] with the webhook certificate from `tls`.
    pub async fn start_with(bin: &Path, narrate: bool, tls: WebhookTls) -> Result<World> {
        let started = Instant::now();
        let plane = ControlPlane::shared(Components::CLUSTER).await?;
        Self::build(plane.into(), bin, Setup { tls, ..Setup::new(narrate) }, started).await
    }

    /// [`World::start_with`] on the shared control plane, every replica serving one self-signed
    /// certificate from files (as replicas mounting one Secret do), so a second replica or a
    /// restarted one is trusted through the same caBundle.
    pub async fn start_with_shared_certificate(bin: &Path) -> Result<World> {
        homelab_autoscaler::tls::install_crypto_provider();
        let certs = tempfile::tempdir()?;
        let bundle = homelab_autoscaler::tls::issue_self_signed(&["localhost".into()], &[])?;
        bundle.write_secret_layout(certs.path())?;
        let tls = WebhookTls::Files { dir: certs.path().to_path_buf(), ca_pem: bundle.ca_pem };
        let mut world = Self::start_with(bin, false, tls).await?;
        world._shared_certificate = Some(certs);
        Ok(world)
    }

    /// A World on a control plane of its own, with the externalgrpc provider served over
    /// mutual TLS for the real cluster-autoscaler to dial ([`World::autoscaler`]). It needs a
    /// cluster of its own: cluster-autoscaler acts on every pending pod and node it sees.
    pub async fn start_for_autoscaler(bin: &Path, narrate: bool) -> Result<World> {
        Self::start_for_autoscaler_with(bin, narrate, Machines::Simulated).await
    }

    /// [`World::start_for_autoscaler`] with the pool's machines as `machines` says.
    pub async fn start_for_autoscaler_with(
        bin: &Path,
        narrate: bool,
        machines: Machines,
    ) -> Result<World> {
        let started = Instant::now();
        let plane = Plane::from(ControlPlane::start(Components::CLUSTER).await?);
        let setup = Setup { grpc_mtls: true, machines, ..Setup::new(narrate) };
        Self::build(plane, bin, setup, started).await
    }

    /// [`World::start_for_autoscaler`] on `plane`, a control plane of the test's own that may
    /// already hold machines (say, machines that joined long ago and are off now).
    pub async fn start_for_autoscaler_on(
        plane: impl Into<Plane>,
        bin: &Path,
        narrate: bool,
    ) -> Result<World> {
        let started = Instant::now();
        let plane = plane.into();
        plane.ensure(Components::CLUSTER).await?;
        Self::build(plane, bin, Setup { grpc_mtls: true, ..Setup::new(narrate) }, started).await
    }

    /// [`World::start_with`] on `plane`: an owned control plane
    /// (`ControlPlane::start(Components::CLUSTER)`, alone or in an `Arc`) gives the World a
    /// cluster no other test sees, stopped when the World (and every other handle) is dropped.
    /// Components the World needs and `plane` lacks are started on it.
    pub async fn start_on(
        plane: impl Into<Plane>,
        bin: &Path,
        narrate: bool,
        tls: WebhookTls,
    ) -> Result<World> {
        let started = Instant::now();
        let plane = plane.into();
        plane.ensure(Components::CLUSTER).await?;
        Self::build(plane, bin, Setup { tls, ..Setup::new(narrate) }, started).await
    }

    /// [`World::start_on`] with the operator replicas running as whoever `operator_kubeconfig`
    /// authenticates (for example the chart's ServiceAccount, by a TokenRequest token), while
    /// the simulator and the test's own client stay admin.
    pub async fn start_on_as(
        plane: impl Into<Plane>,
        bin: &Path,
        tls: WebhookTls,
        operator_kubeconfig: &Path,
    ) -> Result<World> {
        let started = Instant::now();
        let plane = plane.into();
        plane.ensure(Components::CLUSTER).await?;
        let setup = Setup {
            tls,
            operator_kubeconfig: Some(operator_kubeconfig.to_path_buf()),
            ..Setup::new(false)
        };
        Self::build(plane, bin, setup, started).await
    }

    async fn build(plane: Plane, bin: &Path, setup: Setup, started: Instant) -> Result<World> {
        let Setup { narrate, tls, grpc_mtls, operator_kubeconfig, machines } = setup;
        homelab_autoscaler::tls::install_crypto_provider();
        plane.install_crds().await?;
        let client = plane.client()?;
        let up = started.elapsed();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(NAMESPACE).await?.is_none() {
            let ns: Namespace =
                serde_json::from_value(json!({ "metadata": { "name": NAMESPACE } }))?;
            namespaces.create(&PostParams::default(), &ns).await?;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
        eventually("the namespace's default ServiceAccount", ACT, || async {
            ensure!(sas.get_opt("default").await?.is_some(), "not yet");
            Ok(())
        })
        .await?;

        let logs = log_dir()?;
        let kubeconfig = plane.kubeconfig_path();
        let (simulator, real) = match machines {
            Machines::Simulated => {
                plane
                    .add_machine(
                        "lab",
                        vec![],
                        [("homelab.demo/role".to_string(), "lab".to_string())].into(),
                    )
                    .await?;
                let simulator = spawn(
                    bin,
                    &[
                        "simulate".into(),
                        format!("--namespace={NAMESPACE}"),
                        format!("--boot-delay={}s", SIMULATED_BOOT_DELAY.as_secs()),
                        format!("--gate-delay={}s", SIMULATED_GATE_DELAY.as_secs()),
                    ],
                    kubeconfig,
                    &logs.join("simulator.log"),
                )?;
                (Some(simulator), None)
            }
            Machines::Real => (None, Some(RealPool::start(&plane, &client).await?)),
        };
        let ledger = ClaimLedger::default();
        let timeline = Timeline::default();
        let watch = tokio::spawn(record_claims(
            client.clone(),
            ledger.clone(),
            timeline.clone(),
            narrate,
            started,
        ));
        // The examples' pools gate on the Group's default readiness taint.
        let gate = homelab_autoscaler::api::default_readiness_taints();
        let timeline_watches = timeline
            .watch_jobs_and_nodes(&client, NAMESPACE, gate)
            .and(timeline.watch_pods(&client, "default"));
        let grpc_cert_dir = if grpc_mtls {
            // One CA signs both sides, as cluster-autoscaler's cloud-config expects; the server
            // name is the host part of the cloud-config's address.
            let dir = logs.join("grpc-tls");
            homelab_autoscaler::tls::issue_self_signed(
                &["localhost".into()],
                &["127.0.0.1".parse()?],
            )?
            .write_secret_layout(&dir)?;
            Some(dir)
        } else {
            None
        };
        let mut world = World {
            replicas: Vec::new(),
            _simulator: simulator,
            real,
            watch,
            calls: grpc_mtls.then(|| {
                let log = logs.join("operator-0.log");
                tokio::spawn(follow_calls(log, started, timeline.clone(), narrate))
            }),
            timeline,
            _timeline_watches: timeline_watches,
            ledger,
            grpc_cert_dir,
            kept_autoscaler: None,
            local_path: None,
            client,
            plane,
            started,
            steps: Vec::new(),
            tables: Vec::new(),
            narrate,
            bin: bin.to_path_buf(),
            logs: logs.clone(),
            tls,
            operator_kubeconfig,
            _shared_certificate: None,
        };
        world.steps.push(Step { what: "control plane up, CRDs installed".into(), took: up });
        world.start_replica().await?;
        let machines = match machines {
            Machines::Simulated => "the simulator",
            Machines::Real => "the lab machine",
        };
        world
            .note(format!("operator and {machines} running (logs in {})", logs.display()), started);
        Ok(world)
    }

    /// Starts one more operator replica and waits until it is ready; the admission
    /// configurations are pointed at the newest replica (as a Service would route to a live
    /// pod).
    pub async fn start_replica(&mut self) -> Result<usize> {
        let index = self.replicas.len();
        let (webhook_port, admin_port, grpc_port) = (free_port()?, free_port()?, free_port()?);
        let mut args: Vec<String> = vec![
            "run".into(),
            format!("--namespace={NAMESPACE}"),
            format!("--webhook-addr=127.0.0.1:{webhook_port}"),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--grpc-addr=127.0.0.1:{grpc_port}"),
            format!(
                "--operator-usernames=admin,system:serviceaccount:{NAMESPACE}:homelab-autoscaler"
            ),
            // A power Job on a real machine may wait for its SSH peer's 30 s connect timeout.
            format!("--startup-job-timeout={}s", if self.real.is_some() { 60 } else { 30 }),
            "--registration-timeout=30s".into(),
            "--readiness-gate-timeout=60s".into(),
            "--drain-timeout=10s".into(),
            // The lab's kubelets go silent within seconds of a power-off (see docs/testing.md).
            "--off-node-grace=15s".into(),
            // The harness's kube-controller-manager marks a silent kubelet Unknown after 20 s
            // (plus its 2 s period and kwok's 4 s heartbeat).
            "--node-monitor-grace-period=30s".into(),
        ];
        let ca_pem = match &self.tls {
            WebhookTls::SelfMade => {
                args.push("--webhook-dns-names=localhost".into());
                // The replica patches its own CA in once it starts.
                String::new()
            }
            WebhookTls::Files { dir, ca_pem } => {
                args.push(format!("--webhook-cert-dir={}", dir.display()));
                ca_pem.clone()
            }
        };
        if let Some(dir) = &self.grpc_cert_dir {
            args.push(format!("--grpc-cert-dir={}", dir.display()));
        }
        self.point_webhooks_at(webhook_port, &ca_pem).await?;
        let log = self.logs.join(format!("operator-{index}.log"));
        let name = format!("homelab-autoscaler-replica-{index}");
        let out = std::fs::File::create(&log)?;
        let child = spawn_as(&self.bin, &args, &self.operator_kubeconfig(), out, Some(&name))?;
        let pid = child.id().context("the operator exited at once")?;
        let admin = format!("127.0.0.1:{admin_port}");
        eventually("the operator to be ready", ACT, || http_ok(&admin, "/ready"))
            .await
            .with_context(|| {
                format!("operator log: {}", std::fs::read_to_string(&log).unwrap_or_default())
            })?;
        self.replicas.push(Replica { child, pid, webhook_port, grpc_port, admin_port, name, args });
        Ok(index)
    }

    /// SIGKILLs replica `index` and starts it again in place: the same ports, arguments and
    /// POD_NAME (so the same Lease identity), its log continued. Returns once it is ready.
    pub async fn restart_replica(&mut self, index: usize) -> Result<()> {
        let log = self.logs.join(format!("operator-{index}.log"));
        let kubeconfig = self.operator_kubeconfig();
        let replica = self.replicas.get_mut(index).context("no such replica")?;
        replica.child.kill().await.context("SIGKILL of the operator")?;
        let out = std::fs::OpenOptions::new().append(true).open(&log)?;
        replica.child = spawn_as(&self.bin, &replica.args, &kubeconfig, out, Some(&replica.name))?;
        replica.pid = replica.child.id().context("the operator exited at once")?;
        let admin = format!("127.0.0.1:{}", replica.admin_port);
        eventually("the restarted operator to be ready", ACT, || http_ok(&admin, "/ready"))
            .await
            .with_context(|| format!("operator log: {}", crate::process::file_tail(&log, 40)))
    }

    /// Starts the real cluster-autoscaler against this world, dialing the first replica's
    /// provider over mutual TLS.
    pub async fn autoscaler(&self, settings: &AutoscalerSettings) -> Result<Autoscaler> {
        let cert_dir = self
            .grpc_cert_dir
            .clone()
            .context("start the world with World::start_for_autoscaler")?;
        let replica = self.replicas.first().context("no operator replica")?;
        let grpc = GrpcEndpoint { port: replica.grpc_port, cert_dir };
        Autoscaler::start(
            self.plane.kubeconfig_path(),
            &grpc,
            &self.logs.join("cluster-autoscaler"),
            settings,
        )
        .await
    }

    /// Creates examples/manual-claim.yaml (a person starting mini-1 by hand, through
    /// admission) and returns the claim's generated name.
    pub async fn create_manual_claim(&self) -> Result<String> {
        let manifest = crate::repo_path("examples/manual-claim.yaml");
        let created = self
            .kubectl(&["create", "-n", NAMESPACE, "-f", &manifest.to_string_lossy(), "-o", "name"])
            .await?;
        Ok(created.trim().rsplit('/').next().unwrap_or_default().to_string())
    }

    /// Applies examples/`file`, a pool, into the operator's namespace: as it is on simulated
    /// machines; on real machines with each slot's power its machine's own ([`RealPool`]).
    pub async fn apply_pool(&mut self, file: &str) -> Result<()> {
        let path = crate::repo_path(&format!("examples/{file}"));
        let path = path.to_string_lossy();
        if self.real.is_none() {
            self.kubectl(&["apply", "-n", NAMESPACE, "-f", &path]).await?;
            return Ok(());
        }
        // kubectl reads the YAML, as it does a user's; the harness edits only its JSON.
        let objects = self
            .kubectl(&["create", "--dry-run=client", "-o", "json", "-n", NAMESPACE, "-f", &path])
            .await?;
        let real = self.real.as_mut().context("a real pool")?;
        let list = real.realize(&self.plane, &objects).await?;
        let output = self.plane.kubectl_apply(NAMESPACE, &list.to_string()).await?;
        ensure!(
            output.status.success(),
            "kubectl apply of {file} on real machines: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// The pool's real machines, when the World runs on them.
    pub fn real_pool(&self) -> Option<&RealPool> {
        self.real.as_ref()
    }

    /// The pool's real machines, to change how the next pool applied is powered.
    pub fn real_pool_mut(&mut self) -> Option<&mut RealPool> {
        self.real.as_mut()
    }

    /// Keeps `ca` running for as long as the World.
    pub fn keep_alongside(&mut self, ca: Autoscaler) {
        self.kept_autoscaler = Some(ca);
    }

    /// Starts rancher's local-path-provisioner on the World's control plane, once: claims of
    /// StorageClass `local-path` then get a real PersistentVolume on the machine their first pod
    /// is scheduled to ([`crate::local_path`]). It lives (and stops) with the World; its log is
    /// `local-path-provisioner.log` in [`World::logs_dir`].
    pub async fn start_local_path_provisioner(&mut self) -> Result<&LocalPathProvisioner> {
        if self.local_path.is_none() {
            let provisioner = start_local_path_provisioner(&self.plane, &self.logs).await?;
            self.local_path = Some(provisioner);
        }
        self.local_path.as_ref().context("the local-path-provisioner just started")
    }

    /// The directory of this World's logs: `operator-<n>.log`, `simulator.log`, and
    /// cluster-autoscaler's and local-path-provisioner's when they ran.
    pub fn logs_dir(&self) -> &Path {
        &self.logs
    }

    /// The kubeconfig the operator replicas run with: the chart's ServiceAccount's when the
    /// World was started that way, else the control plane's admin.
    fn operator_kubeconfig(&self) -> PathBuf {
        self.operator_kubeconfig
            .clone()
            .unwrap_or_else(|| self.plane.kubeconfig_path().to_path_buf())
    }

    /// How the replicas' webhook certificate is made.
    pub fn webhook_tls(&self) -> &WebhookTls {
        &self.tls
    }

    /// Points the admission configurations at replica `index`, as a Service routes to a live
    /// pod once another died. Needs a certificate every replica shares.
    pub async fn route_webhooks_to(&self, index: usize) -> Result<()> {
        let replica = self.replicas.get(index).context("no such operator replica")?;
        let WebhookTls::Files { ca_pem, .. } = &self.tls else {
            anyhow::bail!("each self-made replica patches in a CA of its own: nothing to route");
        };
        self.point_webhooks_at(replica.webhook_port, ca_pem).await
    }

    /// The identity holding the operators' leader-election Lease ("" while nobody does).
    pub async fn lease_holder(&self) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let lease = leases.get(LEADER_LEASE).await?;
        Ok(lease.spec.and_then(|s| s.holder_identity).unwrap_or_default())
    }

    /// `host:port` of operator replica `index`'s admin listener.
    pub fn admin_addr(&self, index: usize) -> Result<String> {
        let replica = self.replicas.get(index).context("no such operator replica")?;
        Ok(format!("127.0.0.1:{}", replica.admin_port))
    }

    /// The body of `GET path` from operator replica `index`'s admin listener (200 only).
    pub async fn admin_get(&self, index: usize, path: &str) -> Result<String> {
        http_get(&self.admin_addr(index)?, path).await
    }

    /// The last `lines` lines of operator replica `index`'s log.
    pub fn operator_log_tail(&self, index: usize, lines: usize) -> String {
        crate::process::file_tail(&self.logs.join(format!("operator-{index}.log")), lines)
    }

    /// Registers the generated admission configurations with `url: https://localhost:<port>`.
    pub async fn point_webhooks_at(&self, port: u16, ca_pem: &str) -> Result<()> {
        let admission = crate::repo_path("webhooks/admission.yaml");
        let configurations = self.plane.webhook_configurations(&admission).await?;
        self.plane
            .register_webhooks(configurations, &format!("https://localhost:{port}"), ca_pem)
            .await
    }

    pub fn claims(&self) -> Api<NodeClaim> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Makes the machine of Node `node` crash: its kubelet stops without any Job, the Node
    /// stays and kube-controller-manager marks it Ready=Unknown after its grace period.
    pub async fn stop_kubelet(&self, node: &str) -> Result<()> {
        self.plane.stop_kubelet(node).await
    }

    /// The Nodes of `group`'s slots that exist, Ready or not. The operator deletes the Node of
    /// a machine it powered off, so a pool at zero has none.
    pub async fn nodes_of_group(&self, group: &str) -> Result<Vec<String>> {
        let slots: Api<homelab_autoscaler::api::Node> =
            Api::namespaced(self.client.clone(), NAMESPACE);
        let of_group = ListParams::default()
            .labels(&format!("{}={group}", homelab_autoscaler::api::POOL_MEMBERSHIP_LABEL));
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let mut present = Vec::new();
        for slot in slots.list(&of_group).await?.items {
            let name = slot.spec.kubernetes_node_name;
            if nodes.get_opt(&name).await?.is_some() {
                present.push(name);
            }
        }
        Ok(present)
    }

    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.plane.kubectl(args).await?;
        ensure!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The final summary.
    pub fn summary(&self) -> String {
        let mut out = String::from("\nSummary\n");
        for step in &self.steps {
            out.push_str(&format!("  {:>7.1}s  {}\n", step.took.as_secs_f64(), step.what));
        }
        out.push_str(&format!("  {:>7.1}s  total\n", self.started.elapsed().as_secs_f64()));
        for table in &self.tables {
            out.push('\n');
            for line in table.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }
}

/// Follows each call cluster-autoscaler makes that changes a pool, as the operator logs it
/// (`cluster-autoscaler called IncreaseSize(workers, +3)`): an IncreaseSize goes into the
/// timeline at the log line's own timestamp, and when narrating every call is printed.
async fn follow_calls(log: PathBuf, started: Instant, timeline: Timeline, narrate: bool) {
    const MARK: &str = "cluster-autoscaler called ";
    let mut offset = 0;
    let mut ticks = tokio::time::interval(Duration::from_millis(200));
    loop {
        ticks.tick().await;
        let Ok(text) = tokio::fs::read(&log).await else { continue };
        let fresh = String::from_utf8_lossy(text.get(offset..).unwrap_or_default()).into_owned();
        // Only whole lines; a partial one is read again next time.
        let Some(end) = fresh.rfind('\n') else { continue };
        offset += end + 1;
        for line in fresh[..end].lines() {
            let Some((_, call)) = line.split_once(MARK) else { continue };
            if let (Some(group), Some((stamp, at))) = (increase_size_group(call), logged_at(line)) {
                // Each call is its own sighting: the log line's timestamp tells them apart.
                timeline.note_at(Seen::IncreaseSizeCalled, group, stamp, at);
            }
            if narrate {
                println!(
                    "[{:>6.1}s]   cluster-autoscaler → {}",
                    started.elapsed().as_secs_f64(),
                    call.trim_end()
                );
            }
        }
    }
}

/// The group of a logged `IncreaseSize(workers, +3)`.
fn increase_size_group(call: &str) -> Option<&str> {
    call.strip_prefix("IncreaseSize(")?.split_once(',').map(|(group, _)| group)
}

/// When a line of the operator's text log was written: its leading RFC 3339 timestamp, as
/// written and on this process's monotonic clock (taken back from now).
fn logged_at(line: &str) -> Option<(&str, Instant)> {
    let text = line.split_whitespace().next()?;
    let stamp: jiff::Timestamp = text.parse().ok()?;
    let ago = Duration::try_from(jiff::Timestamp::now().duration_since(stamp)).unwrap_or_default();
    Some((text, Instant::now().checked_sub(ago)?))
}

/// Records every claim into the ledger and the timeline and, when narrating, prints each
/// claim's phase as it changes.
async fn record_claims(
    client: Client,
    ledger: ClaimLedger,
    timeline: Timeline,
    narrate: bool,
    started: Instant,
) {
    let claims: Api<NodeClaim> = Api::namespaced(client, NAMESPACE);
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut stream =
        watcher(claims, watcher::Config::default()).default_backoff().applied_objects().boxed();
    // A watch error (the apiserver busy, a list that failed) is retried with backoff; only the
    // stream's end stops the ledger, which the assertions read.
    while let Some(next) = stream.next().await {
        let Ok(claim) = next else { continue };
        let name = claim.metadata.name.clone().unwrap_or_default();
        timeline.note_claim(&claim);
        if let Ok(mut ledger) = ledger.lock() {
            ledger.insert(name.clone(), claim.clone());
        }
        if !narrate {
            continue;
        }
        let status = claim.status.clone().unwrap_or_default();
        let phase = status.phase.map_or("(new)".to_string(), |p| format!("{p:?}").to_lowercase());
        let line = format!(
            "{phase}{}",
            status.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
        );
        if seen.get(&name) != Some(&line) {
            println!(
                "[{:>6.1}s]   claim {name:<14} slot {:<7} attempt {} {line}",
                started.elapsed().as_secs_f64(),
                claim.spec.slot_ref.name,
                claim.spec.attempt.unwrap_or(1),
            );
            seen.insert(name, line);
        }
    }
}
