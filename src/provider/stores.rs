//! The provider's view of the cluster: reflector stores of Groups, slots and NodeClaims in the
//! operator's namespace, and the metadata of every Kubernetes node. Reads come from here, so the
//! calls cluster-autoscaler makes every loop (Refresh, TargetSize, NodeGroupNodes) cost no API
//! round trip and do not fail when the API server hiccups: a watch that breaks keeps the last
//! state and resumes with backoff.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{Group, NodeClaim};

use super::Slot;

/// How often a write waits on the stores to show it.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// The four caches, and the slots by group and claims by slot.
pub(crate) struct Stores {
    pub groups: Store<Group>,
    pub slots: Store<Slot>,
    pub claims: Store<NodeClaim>,
    pub nodes: Store<PartialObjectMeta<CoreNode>>,
    /// Slot names by their `group` label.
    pub slots_by_group: Arc<Members>,
    /// Claim names by `spec.slotRef.name`.
    pub claims_by_slot: Arc<Members>,
}

/// The group a slot joins, as [`Members`] keys it.
fn slot_key(slot: &Slot) -> Option<&str> {
    super::groups::group_of(slot)
}

/// The slot a claim names, as [`Members`] keys it.
fn claim_key(claim: &NodeClaim) -> Option<&str> {
    Some(claim.spec.slot_ref.name.as_str())
}

/// The names of one cache's objects by a key of theirs (a slot's group, a claim's slot), kept
/// by the cache's own watch, so a call about one group reads only that group's objects, however
/// large the pool. It never misses an object the store holds: a key is added before the store
/// takes the object and an old key dropped only after, and a relist is re-indexed from the
/// store once taken. It may briefly list a name under a key the object has just left, so a
/// reader checks every object it fetches by its actual key.
#[derive(Default)]
pub(crate) struct Members {
    inner: std::sync::RwLock<MembersInner>,
}

#[derive(Default)]
struct MembersInner {
    by_key: HashMap<String, BTreeSet<String>>,
    keys_of: HashMap<String, BTreeSet<String>>,
}

impl Members {
    /// The names listed under `key` (a superset of the objects the store has there).
    pub fn of(&self, key: &str) -> Vec<String> {
        let inner = self.inner.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.by_key.get(key).map(|names| names.iter().cloned().collect()).unwrap_or_default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, MembersInner> {
        self.inner.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before the store takes `event`: list every object it brings under its key.
    fn before<K: Resource>(&self, event: &watcher::Event<K>, key: fn(&K) -> Option<&str>) {
        if let watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) = event
            && let (Some(k), Some(name)) = (key(obj), obj.meta().name.as_deref())
        {
            let mut inner = self.write();
            inner.by_key.entry(k.to_owned()).or_default().insert(name.to_owned());
            inner.keys_of.entry(name.to_owned()).or_default().insert(k.to_owned());
        }
    }

    /// After the store took `event`: drop the keys its objects no longer have.
    fn after<K>(&self, event: &watcher::Event<K>, key: fn(&K) -> Option<&str>, store: &Store<K>)
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        match event {
            watcher::Event::Apply(obj) => self.keep_only(obj, key(obj)),
            watcher::Event::Delete(obj) => self.keep_only(obj, None),
            watcher::Event::InitDone => {
                let mut fresh = MembersInner::default();
                for obj in store.state() {
                    if let (Some(k), Some(name)) = (key(&obj), obj.meta().name.as_deref()) {
                        fresh.by_key.entry(k.to_owned()).or_default().insert(name.to_owned());
                        fresh.keys_of.entry(name.to_owned()).or_default().insert(k.to_owned());
                    }
                }
                *self.write() = fresh;
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn keep_only<K: Resource>(&self, obj: &K, current: Option<&str>) {
        let Some(name) = obj.meta().name.as_deref() else { return };
        let mut inner = self.write();
        let Some(keys) = inner.keys_of.remove(name) else { return };
        for k in keys {
            if Some(k.as_str()) == current {
                inner.keys_of.entry(name.to_owned()).or_default().insert(k);
            } else if let Some(names) = inner.by_key.get_mut(&k) {
                names.remove(name);
                if names.is_empty() {
                    inner.by_key.remove(&k);
                }
            }
        }
    }
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
    let (slots_by_group, claims_by_slot): (Arc<Members>, Arc<Members>) = Default::default();
    let mut tasks = vec![
        tokio::spawn(drive(
            "groups",
            watcher(
                Api::<Group>::namespaced(client.clone(), namespace),
                watcher::Config::default(),
            )
            .default_backoff()
            .modify(crate::cache::slim)
            .reflect(groups_writer),
        )),
        tokio::spawn(drive(
            "slots",
            indexed(
                watcher(Api::<Slot>::namespaced(client.clone(), namespace), Default::default()),
                slots_writer,
                slots_by_group.clone(),
                slot_key,
            ),
        )),
        tokio::spawn(drive(
            "nodeclaims",
            indexed(
                watcher(
                    Api::<NodeClaim>::namespaced(client.clone(), namespace),
                    Default::default(),
                ),
                claims_writer,
                claims_by_slot.clone(),
                claim_key,
            ),
        )),
        tokio::spawn(drive(
            "nodes",
            watcher(
                Api::<PartialObjectMeta<CoreNode>>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .modify(crate::cache::slim)
            .reflect(nodes_writer),
        )),
    ];
    let stores = Stores { groups, slots, claims, nodes, slots_by_group, claims_by_slot };
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

/// A watch feeding `writer`'s store and `members` around it (see [`Members`]).
fn indexed<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    writer: reflector::store::Writer<K>,
    members: Arc<Members>,
    key: fn(&K) -> Option<&str>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    let store = writer.as_reader();
    let before = members.clone();
    events
        .default_backoff()
        .modify(crate::cache::slim)
        .map_ok(move |event| {
            before.before(&event, key);
            event
        })
        .reflect(writer)
        .map_ok(move |event| {
            members.after(&event, key, &store);
            event
        })
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
    /// Whether a Kubernetes node of this name is registered.
    pub fn is_registered(&self, node: &str) -> bool {
        self.nodes.get(&ObjectRef::new(node)).is_some()
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

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    fn slot(name: &str, group: Option<&str>) -> Slot {
        let mut slot = crate::fixtures::slot(name, group.unwrap_or("unused"));
        if group.is_none() {
            slot.metadata.labels = None;
        }
        slot
    }

    /// Feeds `events` through the store and the index as the watch does, checking after each
    /// that the index lists every object the store holds under its key, and returns the index's
    /// final listing of `keys`.
    /// Names by key, in key order as asked.
    type Listing = Vec<(String, Vec<String>)>;

    fn feed(events: Vec<Event<Slot>>, keys: &[&str]) -> Listing {
        let (store, mut writer) = reflector::store::<Slot>();
        let members = Members::default();
        for event in events {
            members.before(&event, slot_key);
            writer.apply_watcher_event(&event);
            // Between the store and the index's cleanup: nothing the store holds is missing.
            for obj in store.state() {
                if let Some(group) = slot_key(&obj) {
                    let name = obj.metadata.name.clone().unwrap_or_default();
                    assert!(members.of(group).contains(&name), "{name} missing from {group}");
                }
            }
            members.after(&event, slot_key, &store);
        }
        keys.iter().map(|k| (k.to_string(), members.of(k))).collect()
    }

    fn listing(pairs: &[(&str, &[&str])]) -> Listing {
        pairs
            .iter()
            .map(|(k, names)| (k.to_string(), names.iter().map(|n| n.to_string()).collect()))
            .collect()
    }

    #[test]
    fn the_index_follows_adds_moves_deletes_and_relists_exactly() {
        use Event::*;
        let cases: Vec<(&str, Vec<Event<Slot>>, Listing)> = vec![
            (
                "initial list",
                vec![
                    Init,
                    InitApply(slot("a", Some("g1"))),
                    InitApply(slot("b", Some("g2"))),
                    InitApply(slot("c", Some("g1"))),
                    InitDone,
                ],
                listing(&[("g1", &["a", "c"]), ("g2", &["b"])]),
            ),
            (
                "a slot moves to another group, another loses its label",
                vec![
                    Init,
                    InitApply(slot("a", Some("g1"))),
                    InitApply(slot("b", Some("g1"))),
                    InitDone,
                    Apply(slot("a", Some("g2"))),
                    Apply(slot("b", None)),
                ],
                listing(&[("g1", &[]), ("g2", &["a"])]),
            ),
            (
                "added, then deleted",
                vec![
                    Init,
                    InitDone,
                    Apply(slot("a", Some("g1"))),
                    Apply(slot("b", Some("g1"))),
                    Delete(slot("a", Some("g1"))),
                ],
                listing(&[("g1", &["b"]), ("g2", &[])]),
            ),
            (
                "a relist drops what is gone and moves what moved",
                vec![
                    Init,
                    InitApply(slot("a", Some("g1"))),
                    InitApply(slot("b", Some("g1"))),
                    InitDone,
                    Init,
                    InitApply(slot("b", Some("g2"))),
                    InitApply(slot("c", Some("g1"))),
                    InitDone,
                ],
                listing(&[("g1", &["c"]), ("g2", &["b"])]),
            ),
        ];
        for (name, events, want) in cases {
            let keys: Vec<&str> = want.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(feed(events, &keys), want, "{name}");
        }
    }
}
