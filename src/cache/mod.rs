//! The process's one set of caches: one watch per kind feeding one reflector store, the indexes
//! that replace full scans, and change streams for the controllers. The provider (every
//! replica), the admission webhooks (every replica) and the controllers (the Lease holder only)
//! all read these; nothing else in the process watches claims, slots, groups, nodes or
//! lifecycle Jobs.
//!
//! Kinds: NodeClaims, slots and Groups of the operator's namespace; every Kubernetes node (whole,
//! as the slot side reads its conditions and taints; the provider reads only names); and the
//! lifecycle Jobs (by the managed-by label). The Jobs watch runs on every replica, though only
//! the controllers read it: it is a handful of labelled objects, and a replica that wins the
//! Lease then starts its term from a synced cache instead of waiting on a list.
//!
//! Indexes: claims by slot and by group, slots by group and by Kubernetes node name, Jobs by
//! slot. Each is kept by its kind's watch around the store (see [`Index`]).

mod feed;
mod index;
pub mod slim;

pub use feed::Changes;
pub use index::{Index, KeyOf};
pub use slim::{LAST_APPLIED, heartbeat_only, slim, slim_node};

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{Group, LABEL_MANAGED_BY, LABEL_SLOT, Node, NodeClaim};
use feed::{Feed, Subscribers, always_news};

/// The caches of one namespace, and every Kubernetes node. Cheap to clone; the watches stop when
/// the last clone is dropped.
#[derive(Clone)]
pub struct Stores {
    pub claims: Store<NodeClaim>,
    pub slots: Store<Node>,
    pub groups: Store<Group>,
    pub nodes: Store<CoreNode>,
    pub jobs: Store<Job>,
    /// Claim names by `spec.slotRef.name`.
    pub claims_by_slot: Arc<Index>,
    /// Claim names by `spec.request.group`.
    pub claims_by_group: Arc<Index>,
    /// Slot names by their `group` label.
    pub slots_by_group: Arc<Index>,
    /// Slot names by `spec.kubernetesNodeName`.
    pub slots_by_node: Arc<Index>,
    /// Lifecycle Job names by their slot label.
    pub jobs_by_slot: Arc<Index>,
    shared: Arc<Shared>,
}

/// What every clone shares: the namespace, the subscribers, the sync flag and the watch tasks.
struct Shared {
    namespace: String,
    claims: Arc<Subscribers<NodeClaim>>,
    slots: Arc<Subscribers<Node>>,
    groups: Arc<Subscribers<Group>>,
    nodes: Arc<Subscribers<CoreNode>>,
    jobs: Arc<Subscribers<Job>>,
    synced: watch::Receiver<bool>,
    /// Bumped by every feed after each event it took.
    changed: Arc<watch::Sender<u64>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The caches stopped before they had listed (their tasks ended).
#[derive(Debug, thiserror::Error)]
#[error("the caches of namespace {namespace} stopped before they had listed")]
pub struct NotSynced {
    pub namespace: String,
}

fn claim_slot(claim: &NodeClaim) -> Option<&str> {
    Some(claim.spec.slot_ref.name.as_str())
}

fn claim_group(claim: &NodeClaim) -> Option<&str> {
    Some(claim.spec.request.group.as_str())
}

fn slot_group(slot: &Node) -> Option<&str> {
    slot.group()
}

fn slot_node(slot: &Node) -> Option<&str> {
    Some(slot.spec.kubernetes_node_name.as_str())
}

fn job_slot(job: &Job) -> Option<&str> {
    job.metadata.labels.as_ref()?.get(LABEL_SLOT).map(String::as_str)
}

impl Stores {
    /// Starts one watch per kind (spawned on the current Tokio runtime). Reads answer from
    /// empty stores until [`Stores::is_synced`].
    #[tracing::instrument(skip(client))]
    pub fn start(client: &Client, namespace: &str) -> Self {
        let (claims, claims_writer) = reflector::store();
        let (slots, slots_writer) = reflector::store();
        let (groups, groups_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let (jobs, jobs_writer) = reflector::store();
        let claims_by_slot = Arc::new(Index::default());
        let claims_by_group = Arc::new(Index::default());
        let slots_by_group = Arc::new(Index::default());
        let slots_by_node = Arc::new(Index::default());
        let jobs_by_slot = Arc::new(Index::default());
        let claim_subscribers = Arc::new(Subscribers::new(claims.clone()));
        let slot_subscribers = Arc::new(Subscribers::new(slots.clone()));
        let group_subscribers = Arc::new(Subscribers::new(groups.clone()));
        let node_subscribers = Arc::new(Subscribers::new(nodes.clone()));
        let job_subscribers = Arc::new(Subscribers::new(jobs.clone()));
        let all = watcher::Config::default;
        let changed = Arc::new(watch::Sender::new(0));
        let managed = watcher::Config::default()
            .labels(&format!("{}={}", LABEL_MANAGED_BY.0, LABEL_MANAGED_BY.1));
        let mut tasks = vec![
            Feed {
                kind: "nodeclaims",
                api: Api::namespaced(client.clone(), namespace),
                config: all(),
                slim: slim::<NodeClaim>,
                writer: claims_writer,
                indexes: vec![
                    (claims_by_slot.clone(), claim_slot as KeyOf<NodeClaim>),
                    (claims_by_group.clone(), claim_group),
                ],
                subscribers: claim_subscribers.clone(),
                same_for_readers: always_news,
                changed: changed.clone(),
            }
            .spawn(),
            Feed {
                kind: "slots",
                api: Api::namespaced(client.clone(), namespace),
                config: all(),
                slim: slim::<Node>,
                writer: slots_writer,
                indexes: vec![
                    (slots_by_group.clone(), slot_group as KeyOf<Node>),
                    (slots_by_node.clone(), slot_node),
                ],
                subscribers: slot_subscribers.clone(),
                same_for_readers: always_news,
                changed: changed.clone(),
            }
            .spawn(),
            Feed {
                kind: "groups",
                api: Api::namespaced(client.clone(), namespace),
                config: all(),
                slim: slim::<Group>,
                writer: groups_writer,
                indexes: Vec::new(),
                subscribers: group_subscribers.clone(),
                same_for_readers: always_news,
                changed: changed.clone(),
            }
            .spawn(),
            Feed {
                kind: "nodes",
                api: Api::all(client.clone()),
                config: all(),
                slim: slim_node,
                writer: nodes_writer,
                indexes: Vec::new(),
                subscribers: node_subscribers.clone(),
                same_for_readers: heartbeat_only,
                changed: changed.clone(),
            }
            .spawn(),
            Feed {
                kind: "jobs",
                api: Api::namespaced(client.clone(), namespace),
                config: managed,
                slim: slim::<Job>,
                writer: jobs_writer,
                indexes: vec![(jobs_by_slot.clone(), job_slot as KeyOf<Job>)],
                subscribers: job_subscribers.clone(),
                same_for_readers: always_news,
                changed: changed.clone(),
            }
            .spawn(),
        ];
        let (synced_tx, synced) = watch::channel(false);
        tasks.push(tokio::spawn(mark_synced(
            [
                ready(claims.clone()),
                ready(slots.clone()),
                ready(groups.clone()),
                ready(nodes.clone()),
                ready(jobs.clone()),
            ],
            synced_tx,
        )));
        Stores {
            claims,
            slots,
            groups,
            nodes,
            jobs,
            claims_by_slot,
            claims_by_group,
            slots_by_group,
            slots_by_node,
            jobs_by_slot,
            shared: Arc::new(Shared {
                namespace: namespace.to_owned(),
                claims: claim_subscribers,
                slots: slot_subscribers,
                groups: group_subscribers,
                nodes: node_subscribers,
                jobs: job_subscribers,
                synced,
                changed,
                tasks,
            }),
        }
    }

    /// The namespace of the claims, slots, groups and Jobs.
    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    /// Whether every store has completed its first list.
    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow()
    }

    /// Waits until every store has completed its first list, at most `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.synced()).await.is_ok_and(|synced| synced.is_ok())
    }

    /// Waits until every store has completed its first list.
    pub async fn synced(&self) -> Result<(), NotSynced> {
        let mut synced = self.shared.synced.clone();
        match synced.wait_for(|s| *s).await {
            Ok(_) => Ok(()),
            Err(_) => Err(NotSynced { namespace: self.namespace().to_owned() }),
        }
    }

    /// Waits, at most `timeout`, until `check` holds for the stores: a write is answered only
    /// once the caches show it, so the next read agrees with what the write did. Returns
    /// whether it held; `what` names the write in the warning logged when it did not.
    pub async fn settle(
        &self,
        timeout: Duration,
        what: &'static str,
        check: impl Fn(&Self) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribed before the first check: a change after it wakes the wait below.
        let mut changed = self.shared.changed.subscribe();
        loop {
            if check(self) {
                return true;
            }
            if !matches!(tokio::time::timeout_at(deadline, changed.changed()).await, Ok(Ok(()))) {
                let held = check(self);
                if !held {
                    tracing::warn!(?timeout, what, "the cache did not show the write in time");
                }
                return held;
            }
        }
    }

    fn key<K: Resource<DynamicType = ()>>(&self, name: &str) -> ObjectRef<K> {
        ObjectRef::new(name).within(self.namespace())
    }

    pub fn claim(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.claims.get(&self.key(name))
    }

    pub fn slot(&self, name: &str) -> Option<Arc<Node>> {
        self.slots.get(&self.key(name))
    }

    pub fn group(&self, name: &str) -> Option<Arc<Group>> {
        self.groups.get(&self.key(name))
    }

    pub fn job(&self, name: &str) -> Option<Arc<Job>> {
        self.jobs.get(&self.key(name))
    }

    /// A Kubernetes node, by name.
    pub fn core_node(&self, name: &str) -> Option<Arc<CoreNode>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// Whether a Kubernetes node of this name is registered.
    pub fn is_registered(&self, node: &str) -> bool {
        self.core_node(node).is_some()
    }

    /// The objects `index` lists under `key` that the store holds with that key now (an index
    /// may briefly list a name under a key its object has just left).
    fn listed<K>(&self, index: &Index, key: &str, store: &Store<K>, key_of: KeyOf<K>) -> Vec<Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        index
            .of(key)
            .iter()
            .filter_map(|name| store.get(&self.key(name)))
            .filter(|object| key_of(object) == Some(key))
            .collect()
    }

    /// The claims naming `slot`.
    pub fn claims_of_slot(&self, slot: &str) -> Vec<Arc<NodeClaim>> {
        self.listed(&self.claims_by_slot, slot, &self.claims, claim_slot)
    }

    /// The claims asking for a machine of `group`.
    pub fn claims_of_group(&self, group: &str) -> Vec<Arc<NodeClaim>> {
        self.listed(&self.claims_by_group, group, &self.claims, claim_group)
    }

    /// The slots labelled into `group`.
    pub fn slots_of_group(&self, group: &str) -> Vec<Arc<Node>> {
        self.listed(&self.slots_by_group, group, &self.slots, slot_group)
    }

    /// The slots whose machine registers as Kubernetes node `node`.
    pub fn slots_of_node(&self, node: &str) -> Vec<Arc<Node>> {
        self.listed(&self.slots_by_node, node, &self.slots, slot_node)
    }

    /// The lifecycle Jobs of `slot`.
    pub fn jobs_of_slot(&self, slot: &str) -> Vec<Arc<Job>> {
        self.listed(&self.jobs_by_slot, slot, &self.jobs, job_slot)
    }

    /// Changes of claims, starting with every claim the store holds now.
    pub fn claim_changes(&self) -> Changes<NodeClaim> {
        self.shared.claims.subscribe()
    }

    /// Changes of slots, starting with every slot the store holds now.
    pub fn slot_changes(&self) -> Changes<Node> {
        self.shared.slots.subscribe()
    }

    /// Changes of Groups, starting with every Group the store holds now.
    pub fn group_changes(&self) -> Changes<Group> {
        self.shared.groups.subscribe()
    }

    /// Changes of Kubernetes nodes, starting with every node the store holds now.
    pub fn node_changes(&self) -> Changes<CoreNode> {
        self.shared.nodes.subscribe()
    }

    /// Changes of lifecycle Jobs, starting with every Job the store holds now.
    pub fn job_changes(&self) -> Changes<Job> {
        self.shared.jobs.subscribe()
    }
}

type ReadyFuture = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

fn ready<K>(store: Store<K>) -> ReadyFuture
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    Box::pin(async move { store.wait_until_ready().await.is_ok() })
}

async fn mark_synced(stores: [ReadyFuture; 5], synced: watch::Sender<bool>) {
    let all = futures::future::join_all(stores).await;
    if all.into_iter().all(|ok| ok) {
        tracing::info!("caches synced");
        synced.send_replace(true);
    }
}
