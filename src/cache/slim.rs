//! What the caches keep of an object. Every cache is fed by a watch and holds each object for
//! the life of the process, so the fields no reader needs are dropped
//! before an object is stored: `managedFields` (server-side apply's bookkeeping, often larger
//! than the object's spec) and kubectl's `last-applied-configuration` annotation (a second copy
//! of the object as JSON). No reconcile or provider call reads either, and no write sends a
//! cached object back whole (writes are patches), so dropping them changes nothing but memory.

use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::Resource;

/// The annotation `kubectl apply` keeps a copy of the applied object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reader of a cache needs; for `WatchStreamExt::modify`.
pub fn slim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// [`slim`], and a Kubernetes node's list of container images: the kubelet reports every image
/// on the machine (often the largest part of a node), and no reader looks at it.
pub fn slim_node(node: &mut CoreNode) {
    slim(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
    }
}

/// Whether `new` is `old` with only its heartbeat moved: the conditions' `lastHeartbeatTime`
/// (a kubelet's periodic status report, kwok's heartbeat) and the resourceVersion. No
/// controller acts on a heartbeat, only on what a condition says, so the cache takes such a
/// version without waking a reconcile for every node every few seconds.
pub fn heartbeat_only(old: &CoreNode, new: &CoreNode) -> bool {
    let without_heartbeat = |node: &CoreNode| {
        let mut node = node.clone();
        node.metadata.resource_version = None;
        let conditions = node.status.as_mut().and_then(|s| s.conditions.as_mut());
        for condition in conditions.into_iter().flatten() {
            condition.last_heartbeat_time = None;
        }
        node
    };
    without_heartbeat(old) == without_heartbeat(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn slimming_drops_managed_fields_and_the_last_applied_copy_only() {
        let mut node = Node::default();
        node.metadata.name = Some("worker-1".into());
        node.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..Default::default()
        }]);
        node.metadata.annotations = Some(
            [(LAST_APPLIED.to_string(), "{}".to_string()), ("keep".to_string(), "me".to_string())]
                .into(),
        );
        slim(&mut node);
        assert_eq!(node.metadata.managed_fields, None);
        let kept: Vec<&str> =
            node.metadata.annotations.iter().flatten().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kept, ["keep"]);
        assert_eq!(node.metadata.name.as_deref(), Some("worker-1"));
    }

    #[test]
    fn a_heartbeat_is_no_news_and_anything_else_is() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let node = |version: &str, at: &str, status: &str, unschedulable: bool| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "mini-1", "resourceVersion": version },
                "spec": { "unschedulable": unschedulable },
                "status": { "conditions": [{ "type": "Ready", "status": status,
                    "lastHeartbeatTime": at, "lastTransitionTime": "2026-03-04T10:00:00Z" }] },
            }))
            .unwrap()
        };
        let old = node("7", "2026-03-04T10:00:04Z", "True", false);
        assert!(heartbeat_only(&old, &node("8", "2026-03-04T10:00:08Z", "True", false)));
        assert!(!heartbeat_only(&old, &node("8", "2026-03-04T10:00:08Z", "Unknown", false)));
        assert!(!heartbeat_only(&old, &node("8", "2026-03-04T10:00:04Z", "True", true)));
        let mut moved = old.clone();
        moved.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
            Some(Time("2026-03-04T10:00:05Z".parse().unwrap()));
        assert!(!heartbeat_only(&old, &moved), "a transition is news");
    }

    #[test]
    fn a_node_loses_its_image_list_and_keeps_its_conditions() {
        use k8s_openapi::api::core::v1::{ContainerImage, NodeCondition, NodeStatus};
        let mut node = Node {
            status: Some(NodeStatus {
                images: Some(vec![ContainerImage::default()]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        slim_node(&mut node);
        let status = node.status.as_ref();
        assert_eq!(status.and_then(|s| s.images.as_ref()), None);
        assert_eq!(status.and_then(|s| s.conditions.as_ref()).map(Vec::len), Some(1));
    }
}
