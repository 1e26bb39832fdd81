//! The `infra.homecluster.dev/v2alpha1` API: slots ([`Node`]), pools ([`Group`]) and requests
//! for a machine ([`NodeClaim`]). These types depend on nothing else in the crate.

mod common;
pub mod duration;
mod group;
mod nodeclaim;
mod power;
mod power_off_gates;
mod schedule;
mod slot;
mod ups;

pub use common::{Pricing, TaintSelector};
pub use group::{
    BuiltinScaler, EnergyTariff, Group, GroupClaimCounts, GroupSavings, GroupSpec, GroupStatus,
    ScaleDownOptions, ScalerDecision, ScalingDriver, default_readiness_taints,
};
pub use nodeclaim::{
    ClaimCall, ClaimRequest, NodeClaim, NodeClaimPhase, NodeClaimSpec, NodeClaimStatus, SlotRef,
};
pub use power::{
    CredentialsRef, DEFAULT_DRAW_STEADY_SECONDS, DEFAULT_SSH_COMMAND, DEFAULT_STEP_TIMEOUT_SECONDS,
    DEFAULT_SUSPEND_COMMAND, DEFAULT_SUSPEND_QUIET_SECONDS, DriverChoice, HttpHeader, HttpPower,
    HttpRequest, Ipmi, IpmiOffMethod, IpmiPrivilege, PowerAction, PowerDriverKind, PowerMeter,
    PowerSpec, PowerStep, PowerWatts, Redfish, RedfishTls, SecretKeyRef, SshShutdown, Suspend,
    WakeOnLan,
};
pub use power_off_gates::{KubernetesGate, MaintenanceSteps, PowerOffGate, PrometheusGate};
pub use schedule::{GroupScheduleStatus, ScheduleWindow};
pub use slot::{
    BmcReading, LifecyclePodSpec, LifecycleVolume, LocalVolume, MeasuredDraw, Node, NodeSpec,
    NodeStatus, ObservedPower, ShutdownStreak, SlotClaimDigest, SlotPhase,
};
pub use ups::{GroupPowerStatus, OnBattery, OnMains, PowerSource, UpsPolicy};

/// The API group of every kind this operator serves.
pub const GROUP: &str = "infra.homecluster.dev";
/// The served and storage version.
pub const VERSION: &str = "v2alpha1";
/// The label a person puts on a slot to make it a member of a Group: `group: <name>` (the
/// v1alpha1 convention, kept). Read only on slots.
pub const POOL_MEMBERSHIP_LABEL: &str = "group";
/// Labels the operator writes onto the Kubernetes node, Jobs and claims, under its own prefix:
/// `LABEL_GROUP` names the Group an object belongs to (copied from the slot's membership).
pub const LABEL_GROUP: &str = "infra.homecluster.dev/group";
pub const LABEL_SLOT: &str = "infra.homecluster.dev/node";
pub const LABEL_NODECLAIM: &str = "infra.homecluster.dev/nodeclaim";
/// The label that says which lifecycle a Job runs: `startup` or `shutdown`.
pub const LABEL_LIFECYCLE: &str = "infra.homecluster.dev/lifecycle";
/// Every object the operator creates carries this.
pub const LABEL_MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "homelab-autoscaler");
/// A person writes this annotation on a slot to end its failure streak now (RFC 3339 time):
/// claims that failed before it no longer count towards the attempt bound.
pub const ANNOTATION_ATTEMPTS_RESET_AT: &str = "infra.homecluster.dev/attempts-reset-at";
/// On a shutdown Job whose success confirms the machine off (`"true"`): a typed driver, or a
/// pod spec that says `confirmsPowerState`. Written when the Job is made, so a later edit of the
/// slot does not change what a finished Job proved.
pub const ANNOTATION_CONFIRMS_OFF: &str = "infra.homecluster.dev/confirms-off";
/// On a shutdown Job that suspends the machine to RAM instead of powering it off (`"true"`):
/// its success means the machine sleeps, with its node kept, never that it is off.
pub const ANNOTATION_SUSPENDS: &str = "infra.homecluster.dev/suspends";
/// The node condition of a machine suspended to RAM (`True` while it sleeps), written by the
/// operator. cluster-autoscaler counts a node with `Suspended=True` as suspended, neither ready
/// nor unready.
pub const CONDITION_SUSPENDED: &str = "Suspended";
/// The label every node carries with its own name (set by the kubelet).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The node's operating system (set by the kubelet). A homelab pool's machines run Linux, and
/// pods (Helm charts especially) often select on it.
pub const OS_LABEL: &str = "kubernetes.io/os";
/// The category that makes `kubectl get homelab` list all three kinds.
pub const CATEGORY: &str = "homelab";
/// The namespace everything lives in unless the operator is told otherwise.
pub const DEFAULT_NAMESPACE: &str = "homelab-autoscaler-system";
