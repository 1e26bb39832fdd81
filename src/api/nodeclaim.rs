// kube-derive takes one `printcolumn(...)` per column; clippy reads repeated keys as duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::Duration;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// One request for one machine: what was asked, by whom, with what deadline, and how it ended.
///
/// Claims are short-lived. The claim controller moves `status.phase`
/// (pending → booting → ready → completed | failed); terminal claims are collected after
/// `spec.ttlSecondsAfterFinished`. Admission stamps `requestedAt`, `requestedBy`, `attempt`,
/// `deadlineAt`, `maxNodeProvisionTime` and `ttlSecondsAfterFinished` on create; after that the
/// spec is immutable, except that the operator clears `deadlineAt` when the machine is ready and
/// a live pin's `until` may move (never into the past).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "infra.homecluster.dev",
    version = "v2alpha1",
    kind = "NodeClaim",
    namespaced,
    derive = "PartialEq",
    status = "NodeClaimStatus",
    shortname = "claim",
    shortname = "nc",
    category = "homelab",
    doc = "A request for one homelab machine.",
    selectable = ".spec.slotRef.name",
    selectable = ".spec.request.group",
    printcolumn(name = "Slot", type_ = "string", json_path = ".spec.slotRef.name"),
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.request.group"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Attempt", type_ = "integer", json_path = ".spec.attempt"),
    printcolumn(name = "Call", type_ = "string", json_path = ".spec.request.call"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(name = "Deadline", type_ = "string", json_path = ".spec.deadlineAt"),
    printcolumn(name = "Until", type_ = "string", json_path = ".spec.until", priority = 1),
    printcolumn(
        name = "Requested-By",
        type_ = "string",
        json_path = ".spec.requestedBy",
        priority = 1
    ),
    printcolumn(name = "Job", type_ = "string", json_path = ".status.startupJob", priority = 1),
    printcolumn(name = "Ready", type_ = "date", json_path = ".status.readyAt", priority = 1),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.until) || self.request.call in ['Manual', 'Schedule']").message("spec.until ends a pin: only a Manual or Schedule claim has one"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.bootOnBattery) || !self.bootOnBattery || self.request.call in ['Manual', 'Schedule']").message("spec.bootOnBattery is a pin's: only a Manual or Schedule claim may boot on battery"))]
pub struct NodeClaimSpec {
    /// The slot (a Node of this API, in the same namespace) this claim asks to power on.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.slotRef is immutable: create a new claim for another slot"))]
    pub slot_ref: SlotRef,

    /// What asked for the machine: the call, its arguments and the pool.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.request is immutable: it records what was asked"))]
    pub request: ClaimRequest,

    /// When the request was made; the boot budget runs from here. Stamped on create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.requestedAt is immutable"))]
    pub requested_at: Option<Time>,

    /// Who asked, free text for people: `cluster-autoscaler`, `homelab-autoscaler/scaler`, or the
    /// user that created a claim by hand. Stamped from the request's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.requestedBy is immutable"))]
    pub requested_by: Option<String>,

    /// The attempt this claim is for the slot: 1 after a success, one more after each failed
    /// boot in a row. Stamped on create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.attempt is immutable"))]
    pub attempt: Option<i32>,

    /// The end of the boot window: a claim still pending or booting past it fails with
    /// DeadlineExceeded and its machine is powered off. Cleared once the machine is ready.
    /// `requestedAt + max(boot budget, maxNodeProvisionTime)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Time>,

    /// The pool's maxNodeProvisionTime in force when the claim was made.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.maxNodeProvisionTime is immutable"))]
    pub max_node_provision_time: Option<Duration>,

    /// The end of a pin: once it passes, the claim controller completes the claim with the reason
    /// `Expired` and the machine is released. Only a pin (a `Manual` or `Schedule` claim) has one;
    /// `homelab-autoscaler keep-on` sets and extends it. Absent, a pin holds until it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,

    /// A pin that may boot its machine while the pool's UPS runs on battery, and that shedding
    /// leaves on until the battery is low. Only a pin (a `Manual` or `Schedule` claim) says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.bootOnBattery is immutable: release the pin and create another"))]
    pub boot_on_battery: Option<bool>,

    /// How long a finished claim is kept before it is collected. Defaults to 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("spec.ttlSecondsAfterFinished is immutable"))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// The slot a claim is for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotRef {
    /// The slot's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Which call asked for a machine, with its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.call != 'IncreaseSize' || (has(self.delta) && self.delta > 0)").message("an IncreaseSize request carries a positive delta"))]
#[x_kube(validation = kube::core::Rule::new("self.call != 'DecreaseTargetSize' || (has(self.delta) && self.delta < 0)").message("a DecreaseTargetSize request carries a negative delta"))]
#[x_kube(validation = kube::core::Rule::new("self.call == 'DeleteNodes' || !has(self.nodes) || size(self.nodes) == 0").message("only a DeleteNodes request names nodes"))]
pub struct ClaimRequest {
    /// The entry point that asked: IncreaseSize (cluster-autoscaler or the built-in scaler),
    /// Manual (a person's `kubectl create` or `homelab-autoscaler keep-on`), or Schedule (a
    /// Group's schedule window).
    pub call: ClaimCall,
    /// The request's signed delta: +N for IncreaseSize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<i32>,
    /// The pool the request was for.
    #[schemars(length(min = 1, max = 253))]
    pub group: String,
    /// Kubernetes node names, for DeleteNodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub nodes: Vec<String>,
    /// Why, in a sentence (the built-in scaler records its decision here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
}

/// The entry point that created a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ClaimCall {
    IncreaseSize,
    DecreaseTargetSize,
    DeleteNodes,
    /// A person created the claim by hand to start the machine.
    Manual,
    /// A Group's schedule keeps the machine on during one of its windows.
    Schedule,
}

impl ClaimCall {
    /// A pin: a claim no scaler made. Neither the built-in scaler nor cluster-autoscaler's
    /// DeleteNodes releases its machine; only its owner (a person, the schedule) or its
    /// `spec.until` ends it.
    pub fn is_pin(self) -> bool {
        matches!(self, Self::Manual | Self::Schedule)
    }
}

/// The phase of a claim. An absent phase reads as pending everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeClaimPhase {
    /// No lifecycle Job yet. The only cancelable phase.
    Pending,
    /// The startup Job exists; the boot is committed and is never interrupted.
    Booting,
    /// The machine is up, joined, Ready and free of the pool's readiness taints.
    Ready,
    /// The request ended with its machine delivered and then released. Terminal.
    Completed,
    /// The attempt did not produce a usable machine. Terminal.
    Failed,
}

/// What happened to a claim. Written only by the claim controller's phase chokepoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// The claim's phase; absent reads as pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodeClaimPhase>,
    /// The attempt this claim spent, written by the pending → booting move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i32>,
    /// The one-line outcome: DeadlineExceeded, StartupJobFailed, ReadinessGateTimeout,
    /// MachineGone, Superseded, CancelledByDecreaseTargetSize, DeletedByHand, SlotDeleted, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A sentence for people to go with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The startup Job of this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_job: Option<String>,
    /// When the boot was committed (pending → booting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_committed_at: Option<Time>,
    /// When the machine became ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<Time>,
    /// When a scale-down asked for this claim's machine (DeleteNodes, or a deletion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_requested_at: Option<Time>,
    /// Who asked for the scale-down, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_requested_by: Option<String>,
    /// Since when a ready claim's machine has been observed off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_observed_off: Option<Time>,
    /// Shutdown Jobs fired for this claim in the current streak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_attempts: Option<i32>,
    /// Shutdown Jobs fired for this claim in all (never reset); it numbers the next one, so a
    /// reset streak starts a new Job instead of finding an old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_jobs: Option<i32>,
    /// When the last shutdown Job was fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_shutdown_attempt_at: Option<Time>,
    /// When cluster-autoscaler acknowledged this failed claim (a DeleteNodes on its instance);
    /// from then on it is no longer listed to cluster-autoscaler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_acknowledged_at: Option<Time>,
    /// When the claim reached a terminal phase; its TTL runs from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Conditions of the claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
