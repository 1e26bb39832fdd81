//! Which slot a Kubernetes node is the machine of, and so which group it belongs to
//! (NodeGroupForNode). cluster-autoscaler sends real nodes and, for instances that never
//! registered, invented nodes whose name and providerID are both the instance id; both resolve
//! by providerID first, then by name. A node of no group is unmanaged, never an error.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::ProviderError;
use super::groups::{GroupSnapshot, NodeGroupInfo, group_of, provider_id_of, slot_name};
use super::{Caller, Provider, Slot};
use crate::machine;

/// The parts of a Kubernetes node a caller identifies it by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRef {
    /// `spec.providerID`; may be empty for a node that has none yet.
    pub provider_id: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

impl NodeRef {
    /// The node's name, or its providerID when it has no name.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() { &self.provider_id } else { &self.name }
    }
}

/// The slot whose machine the node is: by providerID (the one its node last registered with,
/// or the declared one), else by name.
pub fn find_slot<'a>(slots: &'a [Arc<Slot>], node: &NodeRef) -> Option<&'a Arc<Slot>> {
    let by_provider_id = || {
        slots.iter().find(|s| {
            !node.provider_id.is_empty()
                && (provider_id_of(s) == node.provider_id
                    || machine::declared_provider_id(s) == node.provider_id)
        })
    };
    let by_name = || {
        slots.iter().find(|s| {
            !node.name.is_empty()
                && (slot_name(s) == node.name || s.spec.kubernetes_node_name == node.name)
        })
    };
    by_provider_id().or_else(by_name)
}

impl Provider {
    /// The group (as the caller scales it) and slot name a node belongs to, or `None` for a node
    /// that is not a machine of any such group.
    pub(crate) fn resolve_node(
        &self,
        caller: &Caller,
        node: &NodeRef,
    ) -> Result<Option<(GroupSnapshot, String)>, ProviderError> {
        self.ensure_synced()?;
        let slots = self.stores().slots.state();
        let Some(slot) = find_slot(&slots, node) else { return Ok(None) };
        let Some(group) = group_of(slot) else { return Ok(None) };
        match self.snapshot(caller, group) {
            Ok(snapshot) => Ok(Some((snapshot, slot_name(slot).to_owned()))),
            Err(ProviderError::GroupNotFound { .. } | ProviderError::WrongDriver { .. }) => {
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    /// NodeGroupForNode: the node's group, fully described, or `None` when the node is not a
    /// machine of a group the caller scales, or is the node of a machine asleep (suspended to
    /// RAM) until its kubelet is back. A sleeping machine counts as off: in no group,
    /// cluster-autoscaler neither removes its node nor counts it present, so a wake of it is
    /// upcoming capacity until the node is Ready again (docs/decisions.md, D44).
    #[tracing::instrument(skip_all, fields(node = %node.display_name()))]
    pub fn node_group_for_node(
        &self,
        caller: &Caller,
        node: &NodeRef,
    ) -> Result<Option<NodeGroupInfo>, ProviderError> {
        let Some((snapshot, slot)) = self.resolve_node(caller, node)? else { return Ok(None) };
        if snapshot.slot(&slot).is_some_and(|s| s.asleep) {
            tracing::debug!(%slot, "the node of a machine asleep: in no group");
            return Ok(None);
        }
        Ok(Some(snapshot.info()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::groups::tests::slot;
    use super::*;

    fn node(provider_id: &str, name: &str) -> NodeRef {
        NodeRef { provider_id: provider_id.into(), name: name.into(), ..NodeRef::default() }
    }

    #[test]
    fn lookup_table() {
        let mut k3s = (*slot("k3s-box", "pool")).clone();
        k3s.spec.provider_id = Some("k3s://k3s-box".into());
        let mut learned = (*slot("k3s-learned", "pool")).clone();
        learned.status = Some(crate::api::NodeStatus {
            provider_id: Some("k3s://k3s-learned".into()),
            ..Default::default()
        });
        let slots = vec![slot("nuc", "pool"), Arc::new(k3s), Arc::new(learned)];
        let table = [
            ("a registered node by providerID", node("homelab://nuc", "nuc"), Some("nuc")),
            (
                "an invented node of an unregistered instance",
                node("homelab://nuc", "homelab://nuc"),
                Some("nuc"),
            ),
            ("a declared providerID", node("k3s://k3s-box", "k3s://k3s-box"), Some("k3s-box")),
            ("a node without providerID yet, by name", node("", "nuc"), Some("nuc")),
            (
                "an invented node under the id the machine registered with last",
                node("k3s://k3s-learned", "k3s://k3s-learned"),
                Some("k3s-learned"),
            ),
            (
                "a registered k3s node whose slot declares nothing",
                node("k3s://nuc", "nuc"),
                Some("nuc"),
            ),
            ("an unmanaged node", node("aws:///eu-west-1a/i-0abc", "ip-10-0-0-1"), None),
            ("nothing to go by", node("", ""), None),
        ];
        for (name, n, want) in table {
            let got = find_slot(&slots, &n).map(|s| slot_name(s));
            assert_eq!(got, want, "{name}");
        }
    }
}
