//! The provider's view of the cluster: reflector stores of Groups, slots and NodeClaims in the
//! operator's namespace, and the metadata of every Kubernetes node. Reads come from here, so the
//! calls cluster-autoscaler makes every loop (Refresh, TargetSize, NodeGroupNodes) cost no API
//! round trip and do not fail when the API server hiccups: a watch that breaks keeps the last
//! state and resumes with backoff.

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{Group, NodeClaim};

use super::Slot;

/// How often a write waits on the stores to show it.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// The four caches.
pub(crate) struct Stores {
    pub groups: Store<Group>,
    pub slots: Store<Slot>,
    pub claims: Store<NodeClaim>,
    pub nodes: Store<PartialObjectMeta<CoreNode>>,
}

/// The tasks that feed the stores; they stop when the provider is dropped.
pub(crate) struct Reflectors {
    tasks: Vec<JoinHandle<()>>,
    synced: watch::Receiver<bool>,
}

impl Drop for Reflectors {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Reflectors {
    /// Whether every store has completed its first list.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until every store has completed its first list, at most `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut synced = self.synced.clone();
        matches!(tokio::time::timeout(timeout, synced.wait_for(|s| *s)).await, Ok(Ok(_)))
    }
}

/// Starts the reflectors. Must be called inside a Tokio runtime.
pub(crate) fn start(client: &Client, namespace: &str) -> (Stores, Reflectors) {
    let (groups, groups_writer) = reflector::store();
    let (slots, slots_writer) = reflector::store();
    let (claims, claims_writer) = reflector::store();
    let (nodes, nodes_writer) = reflector::store();
    let mut tasks = vec![
        tokio::spawn(drive(
            "groups",
            watcher(
                Api::<Group>::namespaced(client.clone(), namespace),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(groups_writer),
        )),
        tokio::spawn(drive(
            "slots",
            watcher(Api::<Slot>::namespaced(client.clone(), namespace), watcher::Config::default())
                .default_backoff()
                .reflect(slots_writer),
        )),
        tokio::spawn(drive(
            "nodeclaims",
            watcher(
                Api::<NodeClaim>::namespaced(client.clone(), namespace),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(claims_writer),
        )),
        tokio::spawn(drive(
            "nodes",
            watcher(
                Api::<PartialObjectMeta<CoreNode>>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(nodes_writer),
        )),
    ];
    let stores = Stores { groups, slots, claims, nodes };
    let (synced_tx, synced) = watch::channel(false);
    tasks.push(tokio::spawn(mark_synced(
        [
            ready(stores.groups.clone()),
            ready(stores.slots.clone()),
            ready(stores.claims.clone()),
            ready(stores.nodes.clone()),
        ],
        synced_tx,
    )));
    (stores, Reflectors { tasks, synced })
}

type ReadyFuture = std::pin::Pin<Box<dyn Future<Output = bool> + Send>>;

fn ready<K>(store: Store<K>) -> ReadyFuture
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    Box::pin(async move { store.wait_until_ready().await.is_ok() })
}

async fn mark_synced(stores: [ReadyFuture; 4], synced: watch::Sender<bool>) {
    let all = futures::future::join_all(stores).await;
    if all.into_iter().all(|ok| ok) {
        tracing::info!("provider caches synced");
        synced.send_replace(true);
    }
}

/// Runs a reflector stream forever, logging what breaks it; the backoff retries.
async fn drive<S, K>(kind: &'static str, stream: S)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    K: Debug,
{
    stream
        .for_each(|event| async move {
            if let Err(error) = event {
                tracing::warn!(kind, %error, "watch failed; retrying with backoff");
            }
        })
        .await;
}

impl Stores {
    /// The names of every registered Kubernetes node.
    pub fn registered_nodes(&self) -> HashSet<String> {
        self.nodes.state().iter().filter_map(|n| n.metadata.name.clone()).collect()
    }

    /// Waits, at most `timeout`, until `check` holds for the stores: a write is answered only
    /// once the caches show it, so the next read (TargetSize, a second IncreaseSize) agrees with
    /// what this call did. Returns whether it held; `what` names the write in the warning
    /// logged when it did not.
    pub async fn settle(
        &self,
        timeout: Duration,
        what: &'static str,
        check: impl Fn(&Self) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if check(self) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(?timeout, what, "the cache did not show the write in time");
                return false;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }
}
