//! One watch feeding one store, its indexes and the change streams of its subscribers.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::index::{Index, KeyOf};

/// A stream of changed objects (applied or deleted) of one kind, for one subscriber. The
/// objects are the store's own, not copies.
pub type Changes<K> = UnboundedReceiverStream<Arc<K>>;

/// The change streams of one kind's subscribers.
pub struct Subscribers<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store: Store<K>,
    senders: Mutex<Vec<UnboundedSender<Arc<K>>>>,
}

impl<K> Subscribers<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    pub fn new(store: Store<K>) -> Self {
        Self { store, senders: Mutex::default() }
    }

    fn senders(&self) -> std::sync::MutexGuard<'_, Vec<UnboundedSender<Arc<K>>>> {
        self.senders.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new stream of changes that starts with every object the store holds now, so a
    /// subscriber that joins late (a new leadership term) sees each object once before any
    /// change. The snapshot and the registration happen under the lock [`Self::publish`] sends
    /// under, after the store took its change: no change falls between the two (one may come
    /// twice, which a reconcile takes as a no-op).
    pub fn subscribe(&self) -> Changes<K> {
        let (sender, receiver) = unbounded_channel();
        let mut senders = self.senders();
        for object in self.store.state() {
            // The receiver is still in hand: the send cannot fail.
            let _ = sender.send(object);
        }
        senders.push(sender);
        UnboundedReceiverStream::new(receiver)
    }

    /// Sends what `event` changed to every subscriber, once the store has taken it. The
    /// channels are unbounded: the watch never waits on a subscriber, and a subscriber that
    /// stopped (its controller ended with its term) is dropped here.
    fn publish(&self, event: &watcher::Event<K>) {
        let mut senders = self.senders();
        if senders.is_empty() {
            return;
        }
        let changed: Vec<Arc<K>> = match event {
            watcher::Event::Apply(object) => vec![
                self.store
                    .get(&ObjectRef::from_obj(object))
                    .unwrap_or_else(|| Arc::new(object.clone())),
            ],
            watcher::Event::Delete(object) => vec![Arc::new(object.clone())],
            watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
            // The store has just taken the whole list: its objects are the list.
            watcher::Event::InitDone => self.store.state(),
        };
        senders.retain(|sender| changed.iter().all(|object| sender.send(object.clone()).is_ok()));
    }
}

/// For [`Feed::same_for_readers`]: every new version is news.
pub fn always_news<K>(_: &K, _: &K) -> bool {
    false
}

/// What one kind's watch keeps current.
pub struct Feed<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub kind: &'static str,
    pub api: Api<K>,
    pub config: watcher::Config,
    pub slim: fn(&mut K),
    pub writer: Writer<K>,
    pub indexes: Vec<(Arc<Index>, KeyOf<K>)>,
    pub subscribers: Arc<Subscribers<K>>,
    /// Whether a new version of a stored object differs from it only in what no controller
    /// acts on (a node's heartbeat): the store takes it, and no subscriber hears of it.
    pub same_for_readers: fn(&K, &K) -> bool,
    /// Counts the events every feed has taken, so a waiter on the caches wakes on a change.
    pub changed: Arc<watch::Sender<u64>>,
}

impl<K> Feed<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// Runs the watch until the task is aborted. Per event: the indexes list the new keys, the
    /// store takes the change, the indexes drop the old keys, and then the subscribers hear of
    /// it, so a reconcile a change wakes reads the change in the store and in every index.
    pub fn spawn(self) -> JoinHandle<()> {
        let Feed {
            kind,
            api,
            config,
            slim,
            mut writer,
            indexes,
            subscribers,
            same_for_readers,
            changed,
        } = self;
        let store = writer.as_reader();
        tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().modify(slim).boxed();
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        tracing::warn!(kind, %error, "watch failed; retrying with backoff");
                        continue;
                    }
                };
                let unchanged = match &event {
                    watcher::Event::Apply(new) => store
                        .get(&ObjectRef::from_obj(new))
                        .is_some_and(|old| same_for_readers(&old, new)),
                    _ => false,
                };
                for (index, key) in &indexes {
                    index.before(&event, *key);
                }
                writer.apply_watcher_event(&event);
                for (index, key) in &indexes {
                    index.after(&event, *key, &store);
                }
                if !unchanged {
                    subscribers.publish(&event);
                }
                changed.send_modify(|count| *count = count.wrapping_add(1));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Node as Slot;
    use futures::FutureExt;
    use kube::runtime::reflector;
    use watcher::Event;

    fn slot(name: &str) -> Slot {
        crate::fixtures::slot(name, "pool")
    }

    /// The names a stream has ready now, in order.
    fn drain(changes: &mut Changes<Slot>) -> Vec<String> {
        let mut names = Vec::new();
        while let Some(Some(object)) = changes.next().now_or_never() {
            names.push(object.metadata.name.clone().unwrap_or_default());
        }
        names
    }

    #[test]
    fn a_late_subscriber_starts_from_the_store_and_then_follows_the_changes() {
        let (store, mut writer) = reflector::store::<Slot>();
        let subscribers = Subscribers::new(store);
        let mut feed = |event: Event<Slot>| {
            writer.apply_watcher_event(&event);
            subscribers.publish(&event);
        };
        let mut early = subscribers.subscribe();
        feed(Event::Init);
        feed(Event::InitApply(slot("a")));
        feed(Event::InitDone);
        assert_eq!(drain(&mut early), ["a"], "the initial list, once it is complete");

        feed(Event::Apply(slot("b")));
        let mut late = subscribers.subscribe();
        assert_eq!(drain(&mut late).len(), 2, "a late subscriber first gets every object held");
        feed(Event::Delete(slot("a")));
        assert_eq!(drain(&mut early), ["b", "a"], "applied, then deleted");
        assert_eq!(drain(&mut late), ["a"], "then only the changes");

        drop(early);
        feed(Event::Apply(slot("c")));
        assert_eq!(subscribers.senders().len(), 1, "a stopped subscriber is dropped");
        assert_eq!(drain(&mut late), ["c"]);
    }
}
