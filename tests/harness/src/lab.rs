//! One test's world for the operator's in-process parts: a fresh namespace on the shared real
//! control plane, the controllers (and, on request, the built-in scaler) running for it, the
//! machine simulator, and a "lab" node where lifecycle Jobs run. Stopped when dropped. Test files
//! add their own helpers in extension traits implemented for `Lab`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use homelab_autoscaler::api::{Group, Node, NodeClaim};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::clock::SystemClock;
use homelab_autoscaler::controller::hold::Hold;
use homelab_autoscaler::controller::{self, Clients, Context, MachineSettings};
use homelab_autoscaler::scaler::{self, ScalerConfig};
use homelab_autoscaler::simulator::{self, SimulateArgs};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{Components, FailureLogs, TestNamespace, test_namespace};

/// The simulated machine's boot and gate delays (the simulator's `--boot-delay`, `--gate-delay`).
pub const SIMULATED_STEP: Duration = Duration::from_secs(1);

/// What a lab boot spends outside the steps its phase timeouts time, on the two-core machine
/// under CI's load (load average 8–16, several labs on one apiserver): the claim's and the Job's
/// writes, the watch events that report the Job's end and the Node, a reconcile pass per step,
/// the uncordon. 3 s (an idle machine's figure) let a boot under load miss the deadline.
pub const LOADED_MARGIN: Duration = Duration::from_secs(20);

/// Phase timeouts of seconds, not minutes, so a suite that waits for one to fire (a Job that
/// never runs, a gate that never clears) finishes in seconds: each is its simulated step (a
/// kwok pod's run, [`SIMULATED_STEP`]) with several seconds of room. The deadline adds
/// [`LOADED_MARGIN`]: 10+8+8+20 = 46 s. A suite that takes the controllers down mid-boot adds
/// its outage to the margin (tests/reliability_crash.rs).
pub fn timeouts() -> Timeouts {
    Timeouts {
        job_timeout: Duration::from_secs(10),
        registration: Duration::from_secs(8),
        readiness_gate: Duration::from_secs(8),
        margin: LOADED_MARGIN,
    }
}

/// Which of the operator's loops a test runs besides the controllers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum With {
    Controllers,
    ControllersAndScaler,
}

pub struct Lab {
    pub client: Client,
    pub ns: String,
    /// The clients the controllers run on.
    clients: Clients,
    stop: CancellationToken,
    /// The controllers' own token, a child of `stop`, and their task, so a test can stop
    /// (or kill) and restart them.
    controllers: std::sync::Mutex<Controllers>,
    /// The timeouts the controllers run with.
    pub timeouts: Timeouts,
    /// How the controllers treat machines going down (`--drain-timeout` and the rest).
    pub settings: MachineSettings,
    _logs: FailureLogs<'static>,
}

/// The image the lab's power Jobs name (kwok-less labs never run their pods).
pub const LAB_POWER_IMAGE: &str = "registry.invalid/homelab-autoscaler:lab";

/// The lab's `--drain-timeout`: a refusing disruption budget holds a drain back this long.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The lab's meter interval: often enough that a suite sees a plug's reading within seconds.
pub const METER_INTERVAL: Duration = Duration::from_secs(2);

/// The machine settings of the lab's controllers, unless a test starts them with its own.
pub fn settings() -> MachineSettings {
    MachineSettings {
        drain_timeout: Some(DRAIN_TIMEOUT),
        off_node_grace: Duration::from_secs(10),
        // kube-controller-manager's 20 s, plus its 2 s period and kwok's 4 s heartbeat.
        node_monitor_grace: Duration::from_secs(30),
        // The operator's default: no lab scenario holds a kubelet NotReady.
        not_ready_grace: Duration::from_secs(3600),
        meter_interval: METER_INTERVAL,
    }
}

/// A run of the lab's controllers: its token, its task, and its context (for its test hooks).
struct Controllers {
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    ctx: Arc<Context>,
}

async fn start_controllers(
    clients: &Clients,
    ns: &str,
    timeouts: Timeouts,
    settings: MachineSettings,
    stop: &CancellationToken,
) -> Controllers {
    let (ctx, token, task) = spawn(clients, ns, timeouts, settings, LAB_POWER_IMAGE, stop).await;
    Controllers { token, task, ctx }
}

/// The operator's controllers for `ns`, in process, their power Jobs running `image`: stopped
/// by the returned token (a child of `stop`), or aborted through the returned task.
pub async fn spawn_controllers(
    clients: &Clients,
    ns: &str,
    timeouts: Timeouts,
    settings: MachineSettings,
    image: &str,
    stop: &CancellationToken,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let (_, token, task) = spawn(clients, ns, timeouts, settings, image, stop).await;
    (token, task)
}

async fn spawn(
    clients: &Clients,
    ns: &str,
    timeouts: Timeouts,
    settings: MachineSettings,
    image: &str,
    stop: &CancellationToken,
) -> (Arc<Context>, CancellationToken, tokio::task::JoinHandle<()>) {
    let token = stop.child_token();
    let (ctx, inputs) = Context::start(
        clients.clone(),
        ns,
        timeouts,
        settings,
        image.into(),
        Arc::new(SystemClock),
    )
    .await
    .expect("controller context");
    let task = tokio::spawn(controller::run(ctx.clone(), inputs, token.clone()));
    (ctx, token, task)
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Lab {
    pub async fn start(prefix: &str, with: With) -> Lab {
        Self::start_with_timeouts(prefix, with, timeouts()).await
    }

    /// [`Lab::start`] with controllers (and scaler) running on `timeouts`.
    pub async fn start_with_timeouts(prefix: &str, with: With, timeouts: Timeouts) -> Lab {
        Self::start_with(prefix, with, timeouts, settings()).await
    }

    /// [`Lab::start`] with controllers treating machines going down by `settings`.
    pub async fn start_with_settings(prefix: &str, with: With, settings: MachineSettings) -> Lab {
        Self::start_with(prefix, with, timeouts(), settings).await
    }

    async fn start_with(
        prefix: &str,
        with: With,
        timeouts: Timeouts,
        settings: MachineSettings,
    ) -> Lab {
        homelab_autoscaler::tls::install_crypto_provider();
        let TestNamespace { plane, client, ns, logs } =
            test_namespace(Components::CLUSTER, prefix).await.expect("test namespace");
        plane
            .add_machine(
                &format!("{ns}-lab"),
                vec![],
                BTreeMap::from([("homelab.test/lab".into(), ns.clone())]),
            )
            .await
            .expect("lab node");
        let stop = CancellationToken::new();
        let clients = plane.controller_clients().expect("the controllers' clients");
        let controllers = start_controllers(&clients, &ns, timeouts, settings, &stop).await;
        let args = SimulateArgs {
            namespace: ns.clone(),
            boot_delay: SIMULATED_STEP.into(),
            gate_delay: SIMULATED_STEP.into(),
        };
        tokio::spawn(simulator::run(client.clone(), args, stop.clone()));
        if with == With::ControllersAndScaler {
            let config = ScalerConfig {
                interval: Duration::from_secs(1),
                timeouts,
                ..ScalerConfig::new(ns.clone())
            };
            tokio::spawn(scaler::run(client.clone(), config, stop.clone()));
        }
        Lab {
            client,
            ns,
            clients,
            stop,
            controllers: std::sync::Mutex::new(controllers),
            timeouts,
            settings,
            _logs: logs,
        }
    }

    /// Stops the controllers (as a crashed or demoted operator would).
    pub fn stop_controllers(&self) {
        self.controllers.lock().expect("lock").token.cancel();
    }

    /// Kills the controllers where they stand, as a SIGKILL of the operator would: their task
    /// is aborted at its next await point (a reconcile in flight is dropped half done, with no
    /// graceful shutdown), then their caches and helpers are stopped.
    pub fn kill_controllers(&self) {
        let guard = self.controllers.lock().expect("lock");
        guard.task.abort();
        guard.token.cancel();
    }

    /// Starts the controllers again, with fresh caches.
    pub async fn start_controllers(&self) {
        let fresh =
            start_controllers(&self.clients, &self.ns, self.timeouts, self.settings, &self.stop)
                .await;
        *self.controllers.lock().expect("lock") = fresh;
    }

    /// The hold the running controllers' boots pass just before their booting write: shut, it
    /// keeps every boot there until opened (docs/decisions.md, D35).
    pub fn boot_hold(&self) -> Hold {
        self.controllers.lock().expect("lock").ctx.boot_hold.clone()
    }

    /// From now on the running controllers' boot checks list their slot's claims at exactly
    /// the floor of the claim and their own writes, their cache left out (docs/decisions.md,
    /// D34).
    pub fn serve_boot_checks_exactly_at_floor(&self) {
        self.controllers.lock().expect("lock").ctx.claim_read_floor.serve_exactly_for_tests();
    }

    pub fn claims(&self) -> Api<NodeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn slots(&self) -> Api<Node> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn groups(&self) -> Api<Group> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    pub fn nodes(&self) -> Api<CoreNode> {
        Api::all(self.client.clone())
    }

    /// A Group `pool` (with a readiness taint the simulator clears) and `slots` slots in it,
    /// named `<namespace>-m<i>`, whose lifecycle Jobs run on this Lab's node. Returns the
    /// slot names.
    pub async fn create_pool(&self, slots: usize) -> anyhow::Result<Vec<String>> {
        let group: Group = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
            "metadata": { "name": "pool" },
            "spec": { "nodeReadinessTaints": [{ "key": "bootstrap.test/not-ready", "effect": "NoSchedule" }] },
        }))?;
        self.groups().create(&PostParams::default(), &group).await?;
        let mut names = Vec::new();
        for i in 0..slots {
            let name = format!("{}-m{i}", self.ns);
            // The simulator powers the machine off when the shutdown pod runs: it confirms it off.
            let pod = json!({
                "image": "registry.invalid/power:1",
                "nodeSelector": { "homelab.test/lab": self.ns },
                "confirmsPowerState": true,
            });
            let slot: Node = serde_json::from_value(json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
                "metadata": { "name": name, "labels": { "group": "pool" } },
                "spec": { "kubernetesNodeName": name, "startupPodSpec": pod, "shutdownPodSpec": pod },
            }))?;
            self.slots().create(&PostParams::default(), &slot).await?;
            names.push(name);
        }
        Ok(names)
    }

    /// The test namespace's lifecycle Jobs of one kind (`startup` or `shutdown`).
    pub async fn lifecycle_jobs(&self, lifecycle: &str) -> kube::Result<Vec<Job>> {
        let params = kube::api::ListParams::default()
            .labels(&format!("infra.homecluster.dev/lifecycle={lifecycle}"));
        Ok(self.jobs().list(&params).await?.items)
    }
}
