//! An index of one cache: the names of its objects by a key of theirs.

use std::collections::{BTreeSet, HashMap};

use kube::Resource;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

/// How an index keys an object: a slot's group, a claim's slot.
pub type KeyOf<K> = fn(&K) -> Option<&str>;

/// The names of one cache's objects by a key of theirs (a slot's group, a claim's slot), kept
/// by the cache's own watch, so a call about one group reads only that group's objects, however
/// large the pool. It never misses an object the store holds: a key is added before the store
/// takes the object and an old key dropped only after, and a relist is re-indexed from the
/// store once taken. It may briefly list a name under a key the object has just left, so a
/// reader checks every object it fetches by its actual key.
#[derive(Default)]
pub struct Index {
    inner: std::sync::RwLock<Entries>,
}

#[derive(Default)]
struct Entries {
    by_key: HashMap<String, BTreeSet<String>>,
    keys_of: HashMap<String, BTreeSet<String>>,
}

impl Entries {
    /// Lists `name` under `key`.
    fn list(&mut self, key: &str, name: &str) {
        self.by_key.entry(key.to_owned()).or_default().insert(name.to_owned());
        self.keys_of.entry(name.to_owned()).or_default().insert(key.to_owned());
    }
}

impl Index {
    /// The names listed under `key` (a superset of the objects the store has there).
    pub fn of(&self, key: &str) -> Vec<String> {
        let inner = self.inner.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.by_key.get(key).map(|names| names.iter().cloned().collect()).unwrap_or_default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Entries> {
        self.inner.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before the store takes `event`: list every object it brings under its key.
    pub(super) fn before<K: Resource>(&self, event: &watcher::Event<K>, key: KeyOf<K>) {
        if let watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) = event
            && let (Some(k), Some(name)) = (key(obj), obj.meta().name.as_deref())
        {
            self.write().list(k, name);
        }
    }

    /// After the store took `event`: drop the keys its objects no longer have.
    pub(super) fn after<K>(&self, event: &watcher::Event<K>, key: KeyOf<K>, store: &Store<K>)
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        match event {
            watcher::Event::Apply(obj) => self.keep_only(obj, key(obj)),
            watcher::Event::Delete(obj) => self.keep_only(obj, None),
            watcher::Event::InitDone => {
                let mut fresh = Entries::default();
                for obj in store.state() {
                    if let (Some(k), Some(name)) = (key(&obj), obj.meta().name.as_deref()) {
                        fresh.list(k, name);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Node as Slot;
    use kube::runtime::reflector;
    use watcher::Event;

    fn slot_key(slot: &Slot) -> Option<&str> {
        slot.group()
    }

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
        let members = Index::default();
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
