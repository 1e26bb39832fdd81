//! The built-in demand scaler, for pools whose `spec.driver` is `builtin` (docs/decisions.md,
//! D8): a decision model (Demand, Intent, Target, Decide, the hold, per-node scale-in) applied
//! to one Group, acting through the same provider core as cluster-autoscaler's IncreaseSize and
//! DeleteNodes.
//!
//! The pure model, no I/O and no client: [`observation`] (what a pass saw of a pool, as counts),
//! [`demand`] (the pod-work count and intent), [`target`] (machines for a demand, within
//! podsPerNode and maxNodes), [`decide`] (what to do, with the hold and per-node scale-in).
//! [`classify`] turns Kubernetes objects into an observation (pure, but typed on the Kubernetes
//! API), judging where pods fit with [`crate::placement`]; [`bound_pods`] plans for the pods only
//! some machines can run, in every pool whatever its driver, remembering in [`refusals`] the
//! slots the scheduler refused a pod on once they were up. The rest does I/O: `list_cluster`
//! (the pass's lists), `act` (through the provider), `status` (`Group.status.lastDecision`) and
//! [`run`] (the loop).

mod act;
pub mod bound_pods;
pub mod classify;
pub mod decide;
pub mod demand;
mod error;
mod list_cluster;
pub mod pool_view;
pub mod refusals;
mod run;
mod status;
pub mod target;
mod wake;

pub use act::{Acted, node_ref};
pub use decide::{Action, Decision, Outcome, Settings, State, decide};
pub use demand::{demand, intent};
pub use error::ScalerError;
pub use pool_view::{Machine, PoolView, Workload};
pub use run::{DEFAULT_INTERVAL, MIN_GAP, ScalerConfig, run, run_with};
pub use target::{DEFAULT_PODS_PER_NODE, Limits, floor, target};

/// A count as an `i32`, saturating (the API's integers are 32-bit).
fn saturating_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
