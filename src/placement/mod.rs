//! Placement: where a pod could run, judged before any machine is up. Below both scalers: the
//! built-in scaler's count (`scaler::classify`) and the planner that wakes a machine for a pod
//! only some machines can run (`scaler::bound_pods`) read it, and none of it reads them.
//!
//! - [`pods`]: which pods take a place on a machine, and their keys;
//! - [`shape`]: a node or a slot's template as placement sees it, and whether a pod fits it
//!   (selectors, affinity, taints);
//! - [`volumes`]: where a pod's volumes let it run.
//!
//! The well-known node labels (`kubernetes.io/hostname`, `kubernetes.io/os`) are in
//! [`crate::api`], shared with cluster-autoscaler's template nodes.

pub mod pods;
pub mod shape;
pub mod volumes;
