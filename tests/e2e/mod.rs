// Each test binary (and the demo) uses part of this module.
#![allow(dead_code)]

//! The end-to-end scenario shared by `make demo` (examples/demo.rs, which narrates it) and the
//! test suite (tests/e2e_builtin.rs, which asserts it): the real operator binary and the machine
//! simulator as separate processes against a real control plane, a pool from
//! examples/pool.yaml, and a workload that needs it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use homelab_autoscaler::api::{NodeClaim, NodeClaimPhase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node as CoreNode, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::support::{Components, ControlPlane, WebhookConfiguration, eventually};

pub mod autoscaler;
mod autoscaler_scenarios;
pub use autoscaler::{Autoscaler, AutoscalerSettings, GrpcEndpoint};

pub const NAMESPACE: &str = "homelab-autoscaler-system";
const ACT: Duration = Duration::from_secs(120);

/// One timed step of the scenario.
pub struct Step {
    pub what: String,
    pub took: Duration,
}

/// The running world: control plane, operator and simulator processes.
pub struct World {
    pub plane: &'static ControlPlane,
    pub client: Client,
    started: Instant,
    steps: Vec<Step>,
    narrate: bool,
    bin: PathBuf,
    logs: PathBuf,
    tls: WebhookTls,
    /// The operator replicas started so far (a killed one stays, with its process gone).
    pub replicas: Vec<Replica>,
    /// Mutual-TLS files for the externalgrpc provider, when cluster-autoscaler is to dial it.
    grpc_cert_dir: Option<PathBuf>,
    _simulator: Child,
    _watch: tokio::task::JoinHandle<()>,
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
}

impl Replica {
    /// The Lease identity of the replica (no POD_NAME outside a pod).
    pub fn identity(&self) -> String {
        format!("homelab-autoscaler-{}", self.pid)
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The operator binary next to the running test or example (cargo builds it first).
pub fn operator_binary(hint: Option<&str>) -> Result<PathBuf> {
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

async fn http_ok(addr: &str, path: &str) -> Result<()> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    ensure!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "not ready: {}",
        response.lines().next().unwrap_or("")
    );
    Ok(())
}

fn spawn(bin: &Path, args: &[String], kubeconfig: &Path, log: &Path) -> Result<Child> {
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    Command::new(bin)
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
    fn note(&mut self, what: impl Into<String>, since: Instant) {
        let step = Step { what: what.into(), took: since.elapsed() };
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

    /// Starts everything: the control plane, the CRDs, the operator (webhooks with its own CA,
    /// controllers, built-in scaler), the machine simulator, and a "lab" node where lifecycle
    /// Jobs run.
    pub async fn start(bin: &Path, narrate: bool) -> Result<World> {
        Self::start_with(bin, narrate, WebhookTls::SelfMade).await
    }

    /// [`World::start`] with the webhook certificate from `tls`.
    pub async fn start_with(bin: &Path, narrate: bool, tls: WebhookTls) -> Result<World> {
        Self::start_configured(bin, narrate, tls, false).await
    }

    /// [`World::start`] with the externalgrpc provider served over mutual TLS, for
    /// cluster-autoscaler to dial ([`World::autoscaler`]).
    pub async fn start_for_autoscaler(bin: &Path, narrate: bool) -> Result<World> {
        Self::start_configured(bin, narrate, WebhookTls::SelfMade, true).await
    }

    async fn start_configured(
        bin: &Path,
        narrate: bool,
        tls: WebhookTls,
        grpc_mtls: bool,
    ) -> Result<World> {
        let started = Instant::now();
        homelab_autoscaler::tls::install_crypto_provider();
        let plane = ControlPlane::shared(Components::CLUSTER).await?;
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
        plane
            .add_machine(
                "lab",
                vec![],
                [("homelab.demo/role".to_string(), "lab".to_string())].into(),
            )
            .await?;

        let logs = std::env::temp_dir().join(format!("homelab-demo-{}", std::process::id()));
        std::fs::create_dir_all(&logs)?;
        let kubeconfig = plane.kubeconfig_path();
        let simulator = spawn(
            bin,
            &[
                "simulate".into(),
                format!("--namespace={NAMESPACE}"),
                "--boot-delay=2s".into(),
                "--gate-delay=2s".into(),
            ],
            kubeconfig,
            &logs.join("simulator.log"),
        )?;
        let watch = tokio::spawn(print_claims(client.clone(), narrate, started));
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
            plane,
            client,
            started,
            steps: Vec::new(),
            narrate,
            bin: bin.to_path_buf(),
            logs: logs.clone(),
            tls,
            replicas: Vec::new(),
            grpc_cert_dir,
            _simulator: simulator,
            _watch: watch,
        };
        world.steps.push(Step { what: "control plane up, CRDs installed".into(), took: up });
        world.start_replica().await?;
        world.note(format!("operator and simulator running (logs in {})", logs.display()), started);
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
            "--operator-usernames=admin".into(),
            "--startup-job-timeout=30s".into(),
            "--registration-timeout=30s".into(),
            "--readiness-gate-timeout=30s".into(),
            "--drain-timeout=10s".into(),
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
        let child = spawn(&self.bin, &args, self.plane.kubeconfig_path(), &log)?;
        let pid = child.id().context("the operator exited at once")?;
        let admin = format!("127.0.0.1:{admin_port}");
        eventually("the operator to be ready", ACT, || http_ok(&admin, "/ready"))
            .await
            .with_context(|| {
                format!("operator log: {}", std::fs::read_to_string(&log).unwrap_or_default())
            })?;
        self.replicas.push(Replica { child, pid, webhook_port, grpc_port });
        Ok(index)
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

    /// The operator's log (replica `index`).
    pub fn operator_log(&self, index: usize) -> String {
        std::fs::read_to_string(self.logs.join(format!("operator-{index}.log"))).unwrap_or_default()
    }

    /// Registers the generated admission configurations with `url: https://localhost:<port>`.
    pub async fn point_webhooks_at(&self, port: u16, ca_pem: &str) -> Result<()> {
        let admission = std::fs::read_to_string(repo().join("webhooks/admission.yaml"))?;
        let configurations = WebhookConfiguration::from_yaml(&admission)?;
        self.plane
            .register_webhooks(configurations, &format!("https://localhost:{port}"), ca_pem)
            .await
    }

    fn claims(&self) -> Api<NodeClaim> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.plane.kubectl(args).await?;
        ensure!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Scenario: a Deployment of `replicas` pods that fit only the pool scales it up, and scaling
    /// the Deployment to zero brings the pool back to zero.
    pub async fn builtin_scale_up_and_down(&mut self, replicas: i32) -> Result<()> {
        let t = Instant::now();
        let pool = repo().join("examples/pool.yaml");
        self.kubectl(&["apply", "-n", NAMESPACE, "-f", &pool.to_string_lossy()]).await?;
        self.note("applied examples/pool.yaml: group `workers`, slots mini-1, mini-2, big-1", t);

        let t = Instant::now();
        let web: Deployment = serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "default" },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "app": "web" } },
                "template": {
                    "metadata": { "labels": { "app": "web" } },
                    "spec": {
                        "nodeSelector": { "infra.homecluster.dev/group": "workers" },
                        "containers": [{ "name": "web", "image": "nginx:1.27", "resources": { "requests": { "cpu": "1" } } }],
                    },
                },
            },
        }))?;
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), "default");
        deployments.create(&PostParams::default(), &web).await?;
        self.note(
            format!("created Deployment web with {replicas} pods that only the pool can run"),
            t,
        );

        let t = Instant::now();
        let claims = self.claims();
        let want = usize::try_from(replicas)?;
        eventually("claims for every pending pod", ACT, || async {
            let n = claims.list(&ListParams::default()).await?.items.len();
            ensure!(n >= want, "{n} claims");
            Ok(())
        })
        .await?;
        self.note(format!("the built-in scaler created {want} claims"), t);

        let t = Instant::now();
        eventually("every claim ready", ACT, || async {
            let list = claims.list(&ListParams::default()).await?.items;
            let ready = list
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Ready))
                .count();
            ensure!(ready == want, "{ready} of {want} ready");
            Ok(())
        })
        .await?;
        self.note(format!("{want} machines booted, passed the readiness gate, claims ready"), t);

        let t = Instant::now();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        eventually("every pod running", ACT, || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await?.items;
            let running = list
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            ensure!(running == want, "{running} of {want} running");
            Ok(())
        })
        .await?;
        self.note(format!("{want} pods Running on the pool"), t);

        let t = Instant::now();
        deployments
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": { "replicas": 0 } })),
            )
            .await?;
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        eventually("the pool back at zero", Duration::from_secs(240), || async {
            let live = claims.list(&ListParams::default()).await?.items.into_iter().filter(|c| {
                matches!(
                    c.status.as_ref().and_then(|s| s.phase),
                    None | Some(
                        NodeClaimPhase::Pending | NodeClaimPhase::Booting | NodeClaimPhase::Ready
                    )
                )
            });
            let live = live.count();
            let machines = nodes
                .list(&ListParams::default().labels("infra.homecluster.dev/group=workers"))
                .await?
                .items
                .len();
            ensure!(live == 0 && machines == 0, "{live} live claims, {machines} machines up");
            Ok(())
        })
        .await?;
        self.note(
            "scaled web to 0: after the hold, machines drained and powered off, pool at 0",
            t,
        );
        Ok(())
    }

    /// Scenario: a person starts a machine by hand with a bare NodeClaim (admission stamps it),
    /// and powers it off again by deleting the claim.
    pub async fn manual_claim(&mut self) -> Result<()> {
        let t = Instant::now();
        let pool = repo().join("examples/pool.yaml");
        self.kubectl(&["apply", "-n", NAMESPACE, "-f", &pool.to_string_lossy()]).await?;
        self.note("applied examples/pool.yaml", t);

        let t = Instant::now();
        let manifest = repo().join("examples/manual-claim.yaml");
        let created = self
            .kubectl(&["create", "-n", NAMESPACE, "-f", &manifest.to_string_lossy(), "-o", "name"])
            .await?;
        let name = created.trim().rsplit('/').next().unwrap_or_default().to_string();
        let claims = self.claims();
        let claim = claims.get(&name).await?;
        ensure!(
            claim.spec.requested_by.as_deref() == Some("admin"),
            "admission stamps the requester: {:?}",
            claim.spec.requested_by
        );
        ensure!(
            claim.spec.attempt == Some(1) && claim.spec.deadline_at.is_some(),
            "admission stamps attempt and deadline: {:?}",
            claim.spec
        );
        self.note(
            format!(
                "created {name} by hand; admission stamped requestedBy, attempt 1 and the deadline"
            ),
            t,
        );

        let t = Instant::now();
        let second = self
            .plane
            .kubectl(["create", "-n", NAMESPACE, "-f", &manifest.to_string_lossy()])
            .await?;
        let refusal = String::from_utf8_lossy(&second.stderr).into_owned();
        ensure!(
            !second.status.success() && refusal.contains("already has live claim"),
            "a second live claim is refused: {refusal}"
        );
        self.note("a second claim for the same slot was refused at admission", t);

        let t = Instant::now();
        eventually("the manual claim ready", ACT, || async {
            let claim = claims.get(&name).await?;
            let phase = claim.status.as_ref().and_then(|s| s.phase);
            ensure!(
                phase == Some(NodeClaimPhase::Ready) && claim.spec.deadline_at.is_none(),
                "phase {phase:?}"
            );
            Ok(())
        })
        .await?;
        self.note("the machine booted and the claim is ready (its deadline cleared)", t);

        let t = Instant::now();
        self.kubectl(&["delete", "nodeclaim", "-n", NAMESPACE, &name, "--wait=false"]).await?;
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        eventually("the machine off and the claim released", ACT, || async {
            let gone = claims.get_opt(&name).await?.is_none();
            let up = nodes
                .list(&ListParams::default().labels("infra.homecluster.dev/group=workers"))
                .await?
                .items
                .len();
            ensure!(gone && up == 0, "claim gone: {gone}, machines up: {up}");
            Ok(())
        })
        .await?;
        self.note(
            "deleted the claim: the machine was drained and powered off, the claim released",
            t,
        );
        Ok(())
    }

    /// The final summary.
    pub fn summary(&self) -> String {
        let mut out = String::from("\nSummary\n");
        for step in &self.steps {
            out.push_str(&format!("  {:>7.1}s  {}\n", step.took.as_secs_f64(), step.what));
        }
        out.push_str(&format!("  {:>7.1}s  total\n", self.started.elapsed().as_secs_f64()));
        out
    }
}

/// Prints each claim's phase as it changes.
async fn print_claims(client: Client, narrate: bool, started: Instant) {
    if !narrate {
        return;
    }
    let claims: Api<NodeClaim> = Api::namespaced(client, NAMESPACE);
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut stream =
        watcher(claims, watcher::Config::default()).default_backoff().applied_objects().boxed();
    while let Ok(Some(claim)) = stream.try_next().await {
        let name = claim.metadata.name.clone().unwrap_or_default();
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
