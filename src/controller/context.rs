//! What every controller shares: the client, the operator's settings, an event recorder, and the
//! process's caches ([`crate::cache::Stores`]) of everything the reconcilers read.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, Patch};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use serde_json::json;

use super::error::{KubeContext, Result, is_already_exists};
use super::hold::Hold;
use super::jobs::Lifecycle;
use super::read_floor::ReadFloor;
use crate::api::{Group, LABEL_LIFECYCLE, Node, NodeClaim};
use crate::cache::{Changes, NotSynced, Stores};
use crate::claim::Timeouts;
use crate::clock::Clock;
use crate::field_manager::FieldManager;
use crate::job_outcome::{JobOutcome, outcome};
use crate::machine::TO_BE_DELETED_TAINT;
use crate::slot_locks::SlotLocks;

/// The clients the controllers use: one for every call, and one for evictions. A
/// PodDisruptionBudget refuses an eviction with 429, which the client's default retry layer
/// repeats with backoff for minutes; the eviction client has no retry layer, so a refusal comes
/// back at once and the slot's reconcile requeues itself instead of sleeping on a worker.
#[derive(Clone)]
pub struct Clients {
    pub api: Client,
    pub evictions: Client,
}

impl Clients {
    /// Both clients from one configuration.
    pub fn from_config(config: kube::Config) -> kube::Result<Self> {
        let mut no_retry = config.clone();
        no_retry.default_retry = false;
        Ok(Self { api: Client::try_from(config)?, evictions: Client::try_from(no_retry)? })
    }

    /// Both clients from the environment's configuration (in cluster, or the kubeconfig).
    pub async fn infer() -> kube::Result<Self> {
        let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
        Self::from_config(config)
    }
}

/// A meter reading older than this many meter intervals is stale: the plug stopped answering.
/// The savings report falls back to the declared watts, and the plug no longer tells whether the
/// machine is on.
pub const METER_READINGS_FRESH: u32 = 3;

/// When each slot's device (a meter, a BMC) was last tried, by slot.
type LastReads = std::sync::Mutex<std::collections::HashMap<String, jiff::Timestamp>>;

/// What the controllers share.
pub struct Context {
    pub client: Client,
    /// For evictions only: returns a budget's refusal at once (see [`Clients`]).
    pub evictions: Client,
    pub namespace: String,
    pub timeouts: Timeouts,
    /// How long a drain waits on PodDisruptionBudgets before the shutdown goes ahead anyway;
    /// `None`: for as long as a budget refuses.
    pub drain_timeout: Option<Duration>,
    /// How long a kubelet may be silent (its node Ready `Unknown`), with no claim wanting the
    /// machine, before the machine counts as off and its node is removed.
    pub off_node_grace: Duration,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a powered-off machine's
    /// node still reads Ready.
    pub node_monitor_grace: Duration,
    /// How long a ready claim's kubelet may report NotReady before the claim fails (none under
    /// a pin).
    pub not_ready_grace: Duration,
    /// How often a plug's meter is read for the energy report.
    pub meter_interval: Duration,
    /// The image power Jobs run (the operator's own).
    pub power_image: String,
    /// The PriorityClass of every lifecycle Job's pod (None: the cluster's default).
    pub power_priority_class: Option<String>,
    pub clock: Arc<dyn Clock>,
    pub recorder: Recorder,
    pub stores: Stores,
    /// One lock per slot around "may this claim boot?" and the booting write, so two claims
    /// of one slot never both pass the check (reconciles of different claims run at once).
    boot_locks: SlotLocks,
    /// The newest claim this term wrote: the boot check's list reads no older than it.
    pub claim_read_floor: ReadFloor,
    /// Passed by a boot just before its booting write; only tests shut it (docs/decisions.md,
    /// D35).
    pub boot_hold: Hold,
    /// When each slot's meter was last tried, so a reconcile every event wakes reads it at most
    /// once per `meter_interval`. A new term starts empty: one read each at its start.
    meter_reads: LastReads,
    /// The same for each slot's BMC, read while its kubelet is silent.
    bmc_reads: LastReads,
    /// The drain holds this term published, by slot: when each began and its message. The
    /// slot's status keeps both, but the pass the cordon's own node event wakes can run before
    /// the cache has the status the previous pass wrote, and must not start the hold again.
    drain_holds: PublishedHolds,
    /// The same for the power-off gates' holds.
    gate_holds: PublishedHolds,
    /// Reads the pools' power-off gates.
    pub gates: crate::gates::Reader,
    /// The data machines this term let start their power-off, by slot, and when: the turn
    /// counts before the caches show the machine's cordon or Job (`gates::one_at_a_time`).
    power_off_turns: std::sync::Mutex<std::collections::HashMap<String, jiff::Timestamp>>,
    /// When each held slot's hold was last counted in the held-time metric.
    gate_held_counted: LastReads,
}

/// The holds a term published, by slot.
#[derive(Default)]
struct PublishedHolds(std::sync::Mutex<std::collections::HashMap<String, PublishedHold>>);

impl PublishedHolds {
    fn get(&self, slot: &str) -> Option<PublishedHold> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(slot).cloned()
    }

    fn set(&self, slot: &str, hold: Option<PublishedHold>) {
        let mut holds = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match hold {
            Some(hold) => holds.insert(slot.to_owned(), hold),
            None => holds.remove(slot),
        };
    }
}

/// A hold as published: since when, and what its condition and event said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedHold {
    pub since: jiff::Timestamp,
    pub message: String,
}

/// The change streams of every controller's inputs, taken from the caches when a leadership
/// term starts. Each starts with every object its store holds (so every object is reconciled
/// once at the start of a term) and then yields each change once the store and its indexes
/// have taken it, deletions included, so a reconcile a change wakes always reads it.
pub struct Subscriptions {
    pub claim_controller: ClaimInputs,
    pub slot_controller: SlotInputs,
    pub group_controller: GroupInputs,
    pub schedule_controller: GroupInputs,
    pub power_source_controller: GroupInputs,
}

pub struct ClaimInputs {
    pub claims: Changes<NodeClaim>,
    pub jobs: Changes<Job>,
    pub nodes: Changes<CoreNode>,
    pub slots: Changes<Node>,
}

pub struct SlotInputs {
    pub slots: Changes<Node>,
    pub claims: Changes<NodeClaim>,
    pub nodes: Changes<CoreNode>,
    pub jobs: Changes<Job>,
}

/// The inputs of a controller keyed by Group (the group and schedule controllers): the pool,
/// and its slots and claims, which wake it.
pub struct GroupInputs {
    pub groups: Changes<Group>,
    pub slots: Changes<Node>,
    pub claims: Changes<NodeClaim>,
}

/// How the slot side treats machines going down.
#[derive(Clone, Copy, Debug)]
pub struct MachineSettings {
    /// How long a drain waits on PodDisruptionBudgets before the shutdown goes ahead anyway;
    /// `None`: for as long as a budget refuses.
    pub drain_timeout: Option<Duration>,
    /// How long a silent kubelet is given before its machine counts as off.
    pub off_node_grace: Duration,
    /// How long kube-controller-manager waits for a silent kubelet before it marks the node
    /// Unknown (its `--node-monitor-grace-period`): until then a powered-off machine's node
    /// still reads Ready.
    pub node_monitor_grace: Duration,
    /// How long a ready claim's kubelet may report NotReady (on and talking, not Ready) before
    /// the claim fails `MachineNotReady`. A pin has no such bound.
    pub not_ready_grace: Duration,
    /// How often a plug's meter is read for the energy report.
    pub meter_interval: Duration,
}

/// How lifecycle Jobs' pods are run: the image power Jobs run (the operator's own), and the
/// PriorityClass of every lifecycle pod.
#[derive(Clone, Debug, Default)]
pub struct PowerPods {
    pub image: String,
    pub priority_class: Option<String>,
}

impl From<&str> for PowerPods {
    fn from(image: &str) -> Self {
        PowerPods { image: image.to_string(), priority_class: None }
    }
}

impl Subscriptions {
    /// New streams of the caches' changes, one per controller input.
    pub fn of(stores: &Stores) -> Self {
        let group_inputs = || GroupInputs {
            groups: stores.group_changes(),
            slots: stores.slot_changes(),
            claims: stores.claim_changes(),
        };
        Subscriptions {
            claim_controller: ClaimInputs {
                claims: stores.claim_changes(),
                jobs: stores.job_changes(),
                nodes: stores.node_changes(),
                slots: stores.slot_changes(),
            },
            slot_controller: SlotInputs {
                slots: stores.slot_changes(),
                claims: stores.claim_changes(),
                nodes: stores.node_changes(),
                jobs: stores.job_changes(),
            },
            group_controller: group_inputs(),
            schedule_controller: group_inputs(),
            power_source_controller: group_inputs(),
        }
    }
}

impl Context {
    /// Starts caches of its own (for tests and tools that run the controllers alone), then
    /// [`Context::begin`]s a term on them.
    pub async fn start(
        clients: Clients,
        namespace: &str,
        timeouts: Timeouts,
        machines: MachineSettings,
        power: PowerPods,
        clock: Arc<dyn Clock>,
    ) -> std::result::Result<(Arc<Self>, Subscriptions), NotSynced> {
        let stores = Stores::start(&clients.api, namespace);
        Self::begin(stores, clients, timeouts, machines, power, clock).await
    }

    /// Waits until the caches have listed once, and subscribes the controllers to their
    /// changes: a term starts from the caches as they are, and every object is reconciled once.
    pub async fn begin(
        stores: Stores,
        clients: Clients,
        timeouts: Timeouts,
        machines: MachineSettings,
        power: PowerPods,
        clock: Arc<dyn Clock>,
    ) -> std::result::Result<(Arc<Self>, Subscriptions), NotSynced> {
        stores.synced().await?;
        let subscriptions = Subscriptions::of(&stores);
        let reporter = Reporter {
            controller: "homelab-autoscaler".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let Clients { api: client, evictions } = clients;
        let ctx = Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            gates: crate::gates::Reader::new(client.clone()),
            client,
            evictions,
            namespace: stores.namespace().to_owned(),
            timeouts,
            drain_timeout: machines.drain_timeout,
            off_node_grace: machines.off_node_grace,
            node_monitor_grace: machines.node_monitor_grace,
            not_ready_grace: machines.not_ready_grace,
            meter_interval: machines.meter_interval,
            power_image: power.image,
            power_priority_class: power.priority_class,
            clock,
            stores,
            boot_locks: SlotLocks::default(),
            claim_read_floor: ReadFloor::default(),
            boot_hold: Hold::default(),
            meter_reads: std::sync::Mutex::default(),
            bmc_reads: std::sync::Mutex::default(),
            drain_holds: PublishedHolds::default(),
            gate_holds: PublishedHolds::default(),
            power_off_turns: std::sync::Mutex::default(),
            gate_held_counted: std::sync::Mutex::default(),
        });
        Ok((ctx, subscriptions))
    }

    /// How long a plug meter's reading counts: [`METER_READINGS_FRESH`] meter intervals.
    pub fn meter_reading_max_age(&self) -> Duration {
        self.meter_interval * METER_READINGS_FRESH
    }

    /// `--off-node-grace`, as a span of time to add to a timestamp.
    pub fn off_node_grace_span(&self) -> jiff::SignedDuration {
        jiff::SignedDuration::try_from(self.off_node_grace).unwrap_or(jiff::SignedDuration::MAX)
    }

    /// How long after a shutdown ends its machine may take to look off: the machine going down
    /// (the registration timeout, as long as one is given to come up) and its node saying so
    /// (`--node-monitor-grace-period`).
    pub fn shutdown_settle(&self) -> jiff::SignedDuration {
        jiff::SignedDuration::try_from(self.timeouts.registration + self.node_monitor_grace)
            .unwrap_or(jiff::SignedDuration::MAX)
    }

    /// Whether `slot`'s meter is due a read (none within `meter_interval`); if so, the read
    /// counts as tried now.
    pub fn meter_read_due(&self, slot: &str) -> bool {
        self.read_due(&self.meter_reads, slot)
    }

    /// Whether `slot`'s BMC is due a read (none within `meter_interval`); if so, the read
    /// counts as tried now.
    pub fn bmc_read_due(&self, slot: &str) -> bool {
        self.read_due(&self.bmc_reads, slot)
    }

    fn read_due(&self, reads: &LastReads, slot: &str) -> bool {
        let now = self.now();
        let mut reads = reads.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let due = reads.get(slot).is_none_or(|last| {
            now.duration_since(*last).as_secs_f64() >= self.meter_interval.as_secs_f64()
        });
        if due {
            reads.insert(slot.to_owned(), now);
        }
        due
    }

    /// The drain hold this term last published for `slot`.
    pub fn published_hold(&self, slot: &str) -> Option<PublishedHold> {
        self.drain_holds.get(slot)
    }

    /// Records the hold published for `slot`, or that none holds it any more.
    pub fn set_published_hold(&self, slot: &str, hold: Option<PublishedHold>) {
        self.drain_holds.set(slot, hold);
    }

    /// The power-off gate hold this term last published for `slot`.
    pub fn published_gate_hold(&self, slot: &str) -> Option<PublishedHold> {
        self.gate_holds.get(slot)
    }

    /// Records the gate hold published for `slot`, or that none holds it any more.
    pub fn set_published_gate_hold(&self, slot: &str, hold: Option<PublishedHold>) {
        self.gate_holds.set(slot, hold);
    }

    /// Decides, under one lock for every slot, whether `slot`'s data machine may start its
    /// power-off: `decide` reads when this term gave each other slot its turn; a turn it gives
    /// is recorded for `slot` before the lock is let go, so two slots never both take one.
    pub fn take_power_off_turn(
        &self,
        slot: &str,
        decide: impl FnOnce(
            &dyn Fn(&str) -> Option<jiff::Timestamp>,
        ) -> crate::gates::one_at_a_time::Turn,
    ) -> crate::gates::one_at_a_time::Turn {
        let now = self.now();
        let mut turns =
            self.power_off_turns.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let turn = decide(&|other| turns.get(other).copied());
        if turn == crate::gates::one_at_a_time::Turn::Mine {
            turns.insert(slot.to_owned(), now);
        }
        turn
    }

    /// Gives back a turn `slot` took and did not use (a gate held it).
    pub fn give_back_power_off_turn(&self, slot: &str) {
        let mut turns =
            self.power_off_turns.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        turns.remove(slot);
    }

    /// How long `slot` has been held since its hold was last counted (zero the first time),
    /// and counts it now; `held: false` forgets it.
    pub fn gate_held_for(&self, slot: &str, held: bool) -> Duration {
        let now = self.now();
        let mut counted =
            self.gate_held_counted.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !held {
            counted.remove(slot);
            return Duration::ZERO;
        }
        let last = counted.insert(slot.to_owned(), now);
        last.map_or(Duration::ZERO, |last| {
            Duration::from_secs_f64(now.duration_since(last).as_secs_f64().max(0.0))
        })
    }

    /// Holds the slot's boot lock until the guard is dropped.
    pub async fn lock_slot_for_boot(&self, slot: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.boot_locks.lock(slot).await
    }

    pub fn now(&self) -> jiff::Timestamp {
        self.clock.now()
    }

    pub fn slot(&self, name: &str) -> Option<Arc<Node>> {
        self.stores.slot(name)
    }

    pub fn group(&self, name: &str) -> Option<Arc<Group>> {
        self.stores.group(name)
    }

    /// The group a slot belongs to, by its label.
    pub fn group_of(&self, slot: &Node) -> Option<Arc<Group>> {
        slot.group().and_then(|g| self.group(g))
    }

    pub fn core_node(&self, name: &str) -> Option<Arc<CoreNode>> {
        self.stores.core_node(name)
    }

    pub fn job(&self, name: &str) -> Option<Arc<Job>> {
        self.stores.job(name)
    }

    /// The cached claims of a slot.
    pub fn claims_of_slot(&self, slot: &str) -> Vec<Arc<NodeClaim>> {
        self.stores.claims_of_slot(slot)
    }

    /// The cached lifecycle Jobs of a slot.
    pub fn jobs_of_slot(&self, slot: &str) -> Vec<Arc<Job>> {
        self.stores.jobs_of_slot(slot)
    }

    /// The cached lifecycle Jobs of a slot of one kind.
    pub fn lifecycle_jobs_of_slot(&self, slot: &str, lifecycle: Lifecycle) -> Vec<Arc<Job>> {
        self.jobs_of_slot(slot)
            .into_iter()
            .filter(|j| {
                j.metadata.labels.as_ref().and_then(|l| l.get(LABEL_LIFECYCLE)).map(String::as_str)
                    == Some(lifecycle.as_str())
            })
            .collect()
    }

    /// Whether a shutdown Job of the slot is still running.
    pub fn shutdown_in_flight(&self, slot: &str) -> bool {
        self.lifecycle_jobs_of_slot(slot, Lifecycle::Shutdown)
            .iter()
            .any(|j| outcome(j) == JobOutcome::Running)
    }

    /// Takes cluster-autoscaler's deletion taint off a node: a machine coming back must not
    /// carry it from its last scale-down, or nothing schedules onto it, and a machine asleep
    /// that carries it is counted as deleted rather than suspended. CA leaves it on after a
    /// DeleteNodes that succeeded, expecting the node to go with its instance.
    pub async fn clear_to_be_deleted_taint(
        &self,
        node_name: &str,
        writer: FieldManager,
    ) -> Result<()> {
        let Some(node) = self.core_node(node_name) else { return Ok(()) };
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        if !taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT) {
            return Ok(());
        }
        let kept: Vec<_> = taints.into_iter().filter(|t| t.key != TO_BE_DELETED_TAINT).collect();
        // Guarded by the version the list was read from: the taint list is replaced whole.
        let patch = json!({ "metadata": { "resourceVersion": node.metadata.resource_version }, "spec": { "taints": kept } });
        Api::<CoreNode>::all(self.client.clone())
            .patch(node_name, &writer.patch(), &Patch::Merge(&patch))
            .await
            .during(|| format!("removing {TO_BE_DELETED_TAINT} from node {node_name}"))?;
        Ok(())
    }

    /// Creates a lifecycle Job. Returns false when it already existed: Job names are
    /// deterministic, so a create repeated after a crash or a conflict is a no-op.
    pub async fn create_job(&self, job: &Job, writer: FieldManager) -> Result<bool> {
        let name = job.metadata.name.clone().unwrap_or_default();
        match Api::<Job>::namespaced(self.client.clone(), &self.namespace)
            .create(&writer.post(), job)
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if is_already_exists(&error) => Ok(false),
            Err(error) => Err(error).during(|| format!("creating Job {name}")),
        }
    }

    /// Publishes an event on `object`; a failure to publish is logged, never fatal.
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%error, reason, "publishing an event failed");
        }
    }
}
