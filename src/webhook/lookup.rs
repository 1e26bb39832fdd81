//! What the webhooks read of the cluster: the process's caches ([`crate::cache::Stores`]), the
//! ones the provider and the controllers read. Until the caches have listed once (the first
//! moments after start), or for a namespace they do not hold, reads go to the API server
//! instead, so an answer is never judged on an empty cache; a slot or group the caches miss is
//! looked up there too. Webhooks never write.
//!
//! A cache can be a moment behind a create another replica just admitted; the claim
//! controller's supersede-before-boot settles two live claims of one slot (docs/decisions.md,
//! D23), and this replica's own admissions are serialized and remembered (`admitted`).

use kube::Client;
use kube::api::{Api, ListParams};

use crate::api::{Group, Node, NodeClaim, POOL_MEMBERSHIP_LABEL};
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
pub struct Lookup<'a> {
    /// The caches, when they hold the namespace and have synced.
    cached: Option<&'a Stores>,
    /// The API server: every read while the caches cannot answer, and a slot or group the
    /// caches do not hold (one created a moment ago, say a slot and its claim in one
    /// `kubectl apply`, may not have reached them yet), so a "does not exist" is confirmed.
    live: Live,
}

/// The API server reads.
struct Live {
    slots: Api<Node>,
    groups: Api<Group>,
    claims: Api<NodeClaim>,
}

impl<'a> Lookup<'a> {
    /// The caches when they hold `namespace` and have synced, else the API server.
    pub fn new(caches: &'a Stores, client: &Client, namespace: &str) -> Self {
        let cached = (caches.namespace() == namespace && caches.is_synced()).then_some(caches);
        if cached.is_none() {
            tracing::debug!(namespace, "admission reads the API server: the caches cannot answer");
        }
        Lookup {
            cached,
            live: Live {
                slots: Api::namespaced(client.clone(), namespace),
                groups: Api::namespaced(client.clone(), namespace),
                claims: Api::namespaced(client.clone(), namespace),
            },
        }
    }

    /// Whether reads come from the caches.
    pub fn is_cached(&self) -> bool {
        self.cached.is_some()
    }

    pub async fn slot(&self, name: &str) -> Result<Option<Node>, LookupError> {
        if let Some(found) = self.cached.and_then(|stores| stores.slot(name)) {
            return Ok(Some(Node::clone(&found)));
        }
        self.live.slots.get_opt(name).await.map_err(ctx(format!("slot {name}")))
    }

    pub async fn group(&self, name: &str) -> Result<Option<Group>, LookupError> {
        if let Some(found) = self.cached.and_then(|stores| stores.group(name)) {
            return Ok(Some(Group::clone(&found)));
        }
        self.live.groups.get_opt(name).await.map_err(ctx(format!("group {name}")))
    }

    /// The slots whose machine registers as the Kubernetes Node `node`.
    pub async fn slots_of_node(&self, node: &str) -> Result<Vec<Node>, LookupError> {
        if let Some(stores) = self.cached {
            return Ok(owned(stores.slots_of_node(node)));
        }
        let listed = self.live.slots.list(&ListParams::default()).await;
        let slots = listed.map_err(ctx(format!("slots of node {node}")))?.items;
        Ok(slots.into_iter().filter(|s| s.spec.kubernetes_node_name == node).collect())
    }

    pub async fn claims_of_slot(&self, slot: &str) -> Result<Vec<NodeClaim>, LookupError> {
        if let Some(stores) = self.cached {
            return Ok(owned(stores.claims_of_slot(slot)));
        }
        let params = ListParams::default().fields(&format!("spec.slotRef.name={slot}"));
        let listed = self.live.claims.list(&params).await;
        Ok(listed.map_err(ctx(format!("claims of slot {slot}")))?.items)
    }

    pub async fn claims_of_group(&self, group: &str) -> Result<Vec<NodeClaim>, LookupError> {
        if let Some(stores) = self.cached {
            return Ok(owned(stores.claims_of_group(group)));
        }
        let params = ListParams::default().fields(&format!("spec.request.group={group}"));
        let listed = self.live.claims.list(&params).await;
        Ok(listed.map_err(ctx(format!("claims of group {group}")))?.items)
    }

    pub async fn slots_of_group(&self, group: &str) -> Result<Vec<Node>, LookupError> {
        if let Some(stores) = self.cached {
            return Ok(owned(stores.slots_of_group(group)));
        }
        let params = ListParams::default().labels(&format!("{POOL_MEMBERSHIP_LABEL}={group}"));
        let listed = self.live.slots.list(&params).await;
        Ok(listed.map_err(ctx(format!("slots of group {group}")))?.items)
    }
}

fn owned<K: Clone>(objects: Vec<std::sync::Arc<K>>) -> Vec<K> {
    objects.iter().map(|o| K::clone(o)).collect()
}
