//! Which pods take a place on a machine, and how a pod is named across the pass.
//!
//! A pod is *work* unless it is finished, being deleted, a DaemonSet's (it runs wherever a
//! machine is and dies with it), a mirror pod, or one of the operator's own lifecycle pods
//! (they run on the machines' LAN, never on the pool).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::{LABEL_LIFECYCLE, LABEL_MANAGED_BY};

/// A pod, as `namespace/name`.
pub type PodKey = (String, String);

/// The annotation the kubelet puts on the API mirror of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The pod's key.
pub fn pod_key(pod: &Pod) -> PodKey {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether a pod takes a place on a machine (see the module docs).
pub fn is_work(pod: &Pod) -> bool {
    let meta = &pod.metadata;
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let daemon = controller_of(meta).is_some_and(|o| o.kind == "DaemonSet");
    let mirror = meta.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
    let labels = meta.labels.as_ref();
    let lifecycle = labels.is_some_and(|l| {
        l.get(LABEL_MANAGED_BY.0).is_some_and(|v| v == LABEL_MANAGED_BY.1)
            && l.contains_key(LABEL_LIFECYCLE)
    });
    !finished && meta.deletion_timestamp.is_none() && !daemon && !mirror && !lifecycle
}

/// The object's controller, if it has one.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|o| o.controller == Some(true))
}
