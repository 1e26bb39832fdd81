//! What every controller shares: the client, the operator's settings, an event recorder, and
//! read-only caches (reflector stores) of everything the reconcilers read.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use super::error::{KubeContext, Result, is_already_exists};
use super::jobs::Lifecycle;
use crate::api::{GROUP_LABEL, Group, LABEL_LIFECYCLE, LABEL_MANAGED_BY, Node, NodeClaim};
use crate::claim::Timeouts;
use crate::clock::Clock;
use crate::job_outcome::{JobOutcome, outcome};

/// Read-only caches of the objects the reconcilers read.
#[derive(Clone)]
pub struct Stores {
    pub claims: Store<NodeClaim>,
    pub slots: Store<Node>,
    pub groups: Store<Group>,
    pub nodes: Store<CoreNode>,
    pub jobs: Store<Job>,
}

/// What the controllers share.
pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub timeouts: Timeouts,
    /// How long a drain waits on PodDisruptionBudgets before the shutdown goes ahead.
    pub drain_timeout: Duration,
    /// How long a kubelet may be silent (its node Ready `Unknown`), with no claim wanting the
    /// machine, before the machine counts as off and its node is removed.
    pub off_node_grace: Duration,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a powered-off machine's
    /// node still reads Ready.
    pub node_monitor_grace: Duration,
    /// The image power Jobs run (the operator's own).
    pub power_image: String,
    /// The PriorityClass of every lifecycle Job's pod (None: the cluster's default).
    pub power_priority_class: Option<String>,
    pub clock: Arc<dyn Clock>,
    pub recorder: Recorder,
    pub stores: Stores,
    /// One lock per slot around "may this claim boot?" and the booting write, so two claims
    /// of one slot never both pass the check (reconciles of different claims run at once).
    boot_locks: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A stream of changed objects (applied or deleted) of one kind, for one controller. Shared:
/// every controller that watches a kind gets the same object, and the initial list is sent as
/// the store's own objects, not copies.
pub type Changes<K> = UnboundedReceiverStream<Arc<K>>;

/// The change streams of one controller's inputs. Each comes from the same watch that fills
/// the context's store and yields an object only after the store has taken the change, so a
/// reconcile triggered by a change always reads it (two separate watches would race), and
/// deletions are delivered too.
pub struct Subscriptions {
    pub claim_controller: ClaimInputs,
    pub slot_controller: SlotInputs,
    pub group_controller: GroupInputs,
    pub schedule_controller: GroupInputs,
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
    /// How long a drain waits on PodDisruptionBudgets before the shutdown goes ahead.
    pub drain_timeout: Duration,
    /// How long a silent kubelet is given before its machine counts as off.
    pub off_node_grace: Duration,
    /// How long kube-controller-manager waits for a silent kubelet before it marks the node
    /// Unknown (its `--node-monitor-grace-period`): until then a powered-off machine's node
    /// still reads Ready.
    pub node_monitor_grace: Duration,
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

/// Why the controllers' inputs could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("a cache stopped before it listed: {0}")]
pub struct StartError(#[from] reflector::store::WriterDropped);

/// A store for `K`, fed by one watch, and `N` streams of its changes. Each change is applied
/// to the store first and then sent to every stream; the objects of the initial list are sent
/// once the list is complete (before that, the store still holds the previous list).
fn fan_out<K, const N: usize>(
    api: Api<K>,
    config: watcher::Config,
    shutdown: &CancellationToken,
) -> (Store<K>, [Changes<K>; N])
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, mut writer) = reflector::store();
    type Channel<K> = (UnboundedSender<Arc<K>>, UnboundedReceiver<Arc<K>>);
    let channels: [Channel<K>; N] = std::array::from_fn(|_| unbounded_channel());
    let (senders, receivers): (Vec<_>, Vec<_>) = channels.into_iter().unzip();
    let streams = receivers.map_array::<N>();
    let mut events = watcher(api, config).default_backoff().modify(crate::cache::slim::<K>).boxed();
    let shutdown = shutdown.clone();
    let store = reader.clone();
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = events.next() => match next {
                    Some(Ok(event)) => event,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "watch error; the watcher retries");
                        continue;
                    }
                    None => return,
                },
            };
            writer.apply_watcher_event(&event);
            let changed: Vec<Arc<K>> = match event {
                watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => vec![Arc::new(obj)],
                watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
                // The store has just taken the whole list: its objects are the list.
                watcher::Event::InitDone => store.state(),
            };
            for obj in changed {
                for sender in &senders {
                    // A controller that stopped has dropped its receiver; nothing to tell it.
                    let _ = sender.send(Arc::clone(&obj));
                }
            }
        }
    });
    (reader, streams)
}

/// Turns the receivers into an array of streams.
trait MapArray<K> {
    fn map_array<const N: usize>(self) -> [Changes<K>; N];
}

impl<K> MapArray<K> for Vec<UnboundedReceiver<Arc<K>>> {
    fn map_array<const N: usize>(self) -> [Changes<K>; N] {
        let mut receivers = self.into_iter();
        std::array::from_fn(|_| match receivers.next() {
            Some(receiver) => UnboundedReceiverStream::new(receiver),
            // `fan_out` made exactly N; an empty stream is the harmless alternative to a panic.
            None => UnboundedReceiverStream::new(unbounded_channel().1),
        })
    }
}

impl Context {
    /// Starts one watch per kind, and waits until each store has listed once. The returned
    /// subscriptions must each be consumed by a controller: an unread one stalls its watch.
    pub async fn start(
        client: Client,
        namespace: &str,
        timeouts: Timeouts,
        machines: MachineSettings,
        power: PowerPods,
        clock: Arc<dyn Clock>,
        shutdown: &CancellationToken,
    ) -> std::result::Result<(Arc<Self>, Subscriptions), StartError> {
        let managed = watcher::Config::default()
            .labels(&format!("{}={}", LABEL_MANAGED_BY.0, LABEL_MANAGED_BY.1));
        let all = watcher::Config::default;
        let (claims, [claims_a, claims_b, claims_c, claims_d]) =
            fan_out(Api::namespaced(client.clone(), namespace), all(), shutdown);
        let (slots, [slots_a, slots_b, slots_c, slots_d]) =
            fan_out(Api::namespaced(client.clone(), namespace), all(), shutdown);
        let (groups, [groups_a, groups_b]) =
            fan_out(Api::namespaced(client.clone(), namespace), all(), shutdown);
        let (nodes, [nodes_a, nodes_b]) = fan_out(Api::all(client.clone()), all(), shutdown);
        let (jobs, [jobs_a, jobs_b]) =
            fan_out(Api::namespaced(client.clone(), namespace), managed, shutdown);
        let subscriptions = Subscriptions {
            claim_controller: ClaimInputs {
                claims: claims_a,
                jobs: jobs_a,
                nodes: nodes_a,
                slots: slots_a,
            },
            slot_controller: SlotInputs {
                slots: slots_b,
                claims: claims_b,
                nodes: nodes_b,
                jobs: jobs_b,
            },
            group_controller: GroupInputs { groups: groups_a, slots: slots_c, claims: claims_c },
            schedule_controller: GroupInputs { groups: groups_b, slots: slots_d, claims: claims_d },
        };
        let stores = Stores { claims, slots, groups, nodes, jobs };
        stores.claims.wait_until_ready().await?;
        stores.slots.wait_until_ready().await?;
        stores.groups.wait_until_ready().await?;
        stores.nodes.wait_until_ready().await?;
        stores.jobs.wait_until_ready().await?;
        let reporter = Reporter {
            controller: "homelab-autoscaler".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let ctx = Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: namespace.to_string(),
            timeouts,
            drain_timeout: machines.drain_timeout,
            off_node_grace: machines.off_node_grace,
            node_monitor_grace: machines.node_monitor_grace,
            power_image: power.image,
            power_priority_class: power.priority_class,
            clock,
            stores,
            boot_locks: std::sync::Mutex::default(),
        });
        Ok((ctx, subscriptions))
    }

    /// Holds the slot's boot lock until the guard is dropped.
    pub async fn lock_slot_for_boot(&self, slot: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.boot_locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            locks.entry(slot.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    pub fn now(&self) -> jiff::Timestamp {
        self.clock.now()
    }

    pub fn slot(&self, name: &str) -> Option<Arc<Node>> {
        self.stores.slots.get(&ObjectRef::new(name).within(&self.namespace))
    }

    pub fn group(&self, name: &str) -> Option<Arc<Group>> {
        self.stores.groups.get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The group a slot belongs to, by its label.
    pub fn group_of(&self, slot: &Node) -> Option<Arc<Group>> {
        slot.metadata.labels.as_ref().and_then(|l| l.get(GROUP_LABEL)).and_then(|g| self.group(g))
    }

    pub fn core_node(&self, name: &str) -> Option<Arc<CoreNode>> {
        self.stores.nodes.get(&ObjectRef::new(name))
    }

    pub fn job(&self, name: &str) -> Option<Arc<Job>> {
        self.stores.jobs.get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The cached claims of a slot.
    pub fn claims_of_slot(&self, slot: &str) -> Vec<Arc<NodeClaim>> {
        self.stores.claims.state().into_iter().filter(|c| c.spec.slot_ref.name == slot).collect()
    }

    /// The cached lifecycle Jobs of a slot.
    pub fn jobs_of_slot(&self, slot: &str) -> Vec<Arc<Job>> {
        self.stores
            .jobs
            .state()
            .into_iter()
            .filter(|j| {
                j.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::api::LABEL_SLOT))
                    .is_some_and(|s| s == slot)
            })
            .collect()
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

    /// Creates a lifecycle Job. Returns false when it already existed: Job names are
    /// deterministic, so a create repeated after a crash or a conflict is a no-op.
    pub async fn create_job(&self, job: &Job) -> Result<bool> {
        let name = job.metadata.name.clone().unwrap_or_default();
        match Api::<Job>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), job)
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
