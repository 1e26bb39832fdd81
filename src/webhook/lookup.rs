//! What the webhooks read of the cluster. Reads go to the API server, not a cache: admission is
//! rare, and a stale cache is exactly how a slot would get two live claims. Webhooks never write.

use kube::Client;
use kube::api::{Api, ListParams};

use crate::api::{GROUP_LABEL, Group, Node, NodeClaim};

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
#[derive(Clone)]
pub struct Lookup {
    slots: Api<Node>,
    groups: Api<Group>,
    claims: Api<NodeClaim>,
}

impl Lookup {
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            slots: Api::namespaced(client.clone(), namespace),
            groups: Api::namespaced(client.clone(), namespace),
            claims: Api::namespaced(client, namespace),
        }
    }

    pub async fn slot(&self, name: &str) -> Result<Option<Node>, LookupError> {
        self.slots.get_opt(name).await.map_err(ctx(format!("slot {name}")))
    }

    pub async fn group(&self, name: &str) -> Result<Option<Group>, LookupError> {
        self.groups.get_opt(name).await.map_err(ctx(format!("group {name}")))
    }

    pub async fn claims_of_slot(&self, slot: &str) -> Result<Vec<NodeClaim>, LookupError> {
        let params = ListParams::default().fields(&format!("spec.slotRef.name={slot}"));
        Ok(self.claims.list(&params).await.map_err(ctx(format!("claims of slot {slot}")))?.items)
    }

    pub async fn claims_of_group(&self, group: &str) -> Result<Vec<NodeClaim>, LookupError> {
        let params = ListParams::default().fields(&format!("spec.request.group={group}"));
        Ok(self.claims.list(&params).await.map_err(ctx(format!("claims of group {group}")))?.items)
    }

    pub async fn slots_of_group(&self, group: &str) -> Result<Vec<Node>, LookupError> {
        let params = ListParams::default().labels(&format!("{GROUP_LABEL}={group}"));
        Ok(self.slots.list(&params).await.map_err(ctx(format!("slots of group {group}")))?.items)
    }
}
