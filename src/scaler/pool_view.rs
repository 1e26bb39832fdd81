//! What one pass of the scaler sees of one pool, reduced to counts. Pure data: the Kubernetes
//! objects are read and classified elsewhere (`list_cluster`, `classify`); the model below decides on
//! this alone, so its tables need no cluster.

use jiff::Timestamp;

/// One pool's share of the cluster at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolView {
    /// Unbound pods that need this pool and cannot be placed on any node outside it: one pod of
    /// work each.
    pub pending_pods: i32,
    /// Pods on a node of this pool that no wanted claim holds (a machine being released): they
    /// are work that will need a place once evicted.
    pub draining_pods: i32,
    /// Deployments, StatefulSets and bare ReplicaSets whose pods would need this pool, with the
    /// replicas they want and the pods of theirs the pass saw anywhere in the cluster.
    pub workloads: Vec<Workload>,
    /// The pool's machines: one per slot held by a wanted claim (live, not marked for
    /// scale-down), by slot name.
    pub machines: Vec<Machine>,
    /// Slots no live claim holds: the most machines a Provision can add now.
    pub free_slots: i32,
}

/// A workload whose pod template needs the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// `Deployment ns/name`, for logs.
    pub name: String,
    /// The replicas it wants.
    pub desired: i32,
    /// Its live pods, wherever they are. Each of them is counted as a pod already (or placed
    /// elsewhere), so only the replicas without a pod are the workload's own demand.
    pub observed: i32,
}

impl Workload {
    /// The replicas that have no pod yet: the work only the workload object shows.
    pub fn missing(&self) -> i32 {
        self.desired.saturating_sub(self.observed).max(0)
    }
}

/// A machine of the pool: a slot held by a wanted claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// The slot's name.
    pub slot: String,
    /// The Kubernetes node the machine registers as (the slot's `kubernetesNodeName`).
    pub node: String,
    /// The `spec.providerID` the machine registers with, by which the provider finds the slot.
    pub provider_id: String,
    /// The claim is ready: the machine booted and serves. Only a serving machine can be idle;
    /// one still booting is arriving, and a boot that started is never interrupted for idleness.
    pub ready: bool,
    /// The pods the machine holds, DaemonSet, mirror and lifecycle pods aside.
    pub held: i32,
    /// When its claim was requested; the newest machine is released first.
    pub claimed_at: Option<Timestamp>,
    /// Held by a pin (a `Manual` or `Schedule` claim): capacity that serves demand and counts
    /// toward the floor and maxNodes, but never one the scaler releases.
    pub pinned: bool,
}

impl Machine {
    /// A serving machine with nothing on it.
    pub fn is_idle(&self) -> bool {
        self.ready && self.held == 0
    }

    /// A machine the scaler may release: any but a pinned one.
    pub fn is_releasable(&self) -> bool {
        !self.pinned
    }
}
