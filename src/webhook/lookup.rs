//! What the webhooks read of the cluster: the process's caches ([`crate::cache::Stores`]), the
//! ones the provider and the controllers read. Until the caches have listed once (the first
//! moments after start), or for a namespace they do not hold, reads go to the API server
//! instead, so an answer is never judged on an empty cache. Webhooks never write.
//!
//! A cache can be a moment behind a create another replica just admitted; the claim
//! controller's supersede-before-boot settles two live claims of one slot (docs/decisions.md,
//! D23), and this replica's own admissions are serialized and remembered (`admitted`).

use kube::Client;
use kube::api::{Api, ListParams};

use crate::api::{GROUP_LABEL, Group, Node, NodeClaim};
use crate::cache::Stores;

#[derive(Debug, thiserror::Error)]
#[error("reading {what}: {source}")]
pub struct LookupError {
    what: String,
    #[source]
    source: kube::Error,
}

fn ctx(what: impl Into<String>) -> impl FnOnce(kube::Error) -> LookupError {
    let what = what.into();
    move |source| LookupError { what, source }
}

/// Reads slots, groups and claims of one namespace.
pub enum Lookup<'a> {
    /// From the caches: no round trip.
    Cached(&'a Stores),
    /// From the API server, while the caches cannot answer.
    Live(Box<Live>),
}

/// The API server reads.
pub struct Live {
    slots: Api<Node>,
    groups: Api<Group>,
    claims: Api<NodeClaim>,
}

impl<'a> Lookup<'a> {
    /// The caches when they hold `namespace` and have synced, else the API server.
    pub fn new(caches: &'a Stores, client: &Client, namespace: &str) -> Self {
        if caches.namespace() == namespace && caches.is_synced() {
            return Lookup::Cached(caches);
        }
        tracing::debug!(namespace, "admission reads the API server: the caches cannot answer");
        Lookup::Live(Box::new(Live {
            slots: Api::namespaced(client.clone(), namespace),
            groups: Api::namespaced(client.clone(), namespace),
            claims: Api::namespaced(client.clone(), namespace),
        }))
    }

    /// Whether reads come from the caches.
    pub fn is_cached(&self) -> bool {
        matches!(self, Lookup::Cached(_))
    }

    pub async fn slot(&self, name: &str) -> Result<Option<Node>, LookupError> {
        match self {
            Lookup::Cached(stores) => Ok(stores.slot(name).map(|s| (*s).clone())),
            Lookup::Live(live) => {
                live.slots.get_opt(name).await.map_err(ctx(format!("slot {name}")))
            }
        }
    }

    pub async fn group(&self, name: &str) -> Result<Option<Group>, LookupError> {
        match self {
            Lookup::Cached(stores) => Ok(stores.group(name).map(|g| (*g).clone())),
            Lookup::Live(live) => {
                live.groups.get_opt(name).await.map_err(ctx(format!("group {name}")))
            }
        }
    }

    pub async fn claims_of_slot(&self, slot: &str) -> Result<Vec<NodeClaim>, LookupError> {
        match self {
            Lookup::Cached(stores) => Ok(owned(stores.claims_of_slot(slot))),
            Lookup::Live(live) => {
                let params = ListParams::default().fields(&format!("spec.slotRef.name={slot}"));
                let listed = live.claims.list(&params).await;
                Ok(listed.map_err(ctx(format!("claims of slot {slot}")))?.items)
            }
        }
    }

    pub async fn claims_of_group(&self, group: &str) -> Result<Vec<NodeClaim>, LookupError> {
        match self {
            Lookup::Cached(stores) => Ok(owned(stores.claims_of_group(group))),
            Lookup::Live(live) => {
                let params = ListParams::default().fields(&format!("spec.request.group={group}"));
                let listed = live.claims.list(&params).await;
                Ok(listed.map_err(ctx(format!("claims of group {group}")))?.items)
            }
        }
    }

    pub async fn slots_of_group(&self, group: &str) -> Result<Vec<Node>, LookupError> {
        match self {
            Lookup::Cached(stores) => Ok(owned(stores.slots_of_group(group))),
            Lookup::Live(live) => {
                let params = ListParams::default().labels(&format!("{GROUP_LABEL}={group}"));
                let listed = live.slots.list(&params).await;
                Ok(listed.map_err(ctx(format!("slots of group {group}")))?.items)
            }
        }
    }
}

fn owned<K: Clone>(objects: Vec<std::sync::Arc<K>>) -> Vec<K> {
    objects.iter().map(|o| K::clone(o)).collect()
}
