// kube-derive takes one `printcolumn(...)` per column; clippy reads repeated keys as duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::Pricing;
use super::nodeclaim::{ClaimCall, NodeClaimPhase};
use super::power::PowerSpec;

/// One physical machine of a pool: a slot. Git owns it; it says what the machine is and how
/// to power it on and off. Whether the machine is wanted is not here: it is wanted exactly
/// when a live NodeClaim names this slot.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "infra.homecluster.dev",
    version = "v2alpha1",
    kind = "Node",
    namespaced,
    derive = "PartialEq",
    status = "NodeStatus",
    shortname = "slot",
    category = "homelab",
    doc = "A homelab machine slot: what the machine is and how to power it on and off.",
    validation = kube::core::Rule::new("self.metadata.name == self.spec.kubernetesNodeName").message("metadata.name must equal spec.kubernetesNodeName: a slot is named after the Kubernetes node its machine registers as").reason(kube::core::Reason::FieldValueInvalid),
    printcolumn(name = "Group", type_ = "string", json_path = ".metadata.labels.group"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Power", type_ = "string", json_path = ".status.powerState"),
    printcolumn(name = "Claim", type_ = "string", json_path = ".status.lastClaim.name"),
    printcolumn(name = "Attempt", type_ = "integer", json_path = ".status.lastClaim.attempt"),
    printcolumn(name = "Held-By", type_ = "string", json_path = ".status.powerOffHeldBy"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.lastClaim.reason", priority = 1),
    printcolumn(name = "Watts", type_ = "number", json_path = ".status.draw.watts", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// A typed power driver (Wake-on-LAN, Redfish, IPMI, HTTP, SSH): the operator runs it as the
    /// startup and shutdown Jobs. Each direction is powered either by this or by a pod spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerSpec>,
    /// The pod that powers the machine on, when `power` does not. It runs as a Job when a claim
    /// for this slot starts booting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_pod_spec: Option<LifecyclePodSpec>,
    /// The pod that powers the machine off, when `power` does not. It runs as a Job when the
    /// machine is no longer wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_pod_spec: Option<LifecyclePodSpec>,
    /// The name the machine registers with as a Kubernetes node. Equal to this slot's name.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub kubernetes_node_name: String,
    /// The node's `spec.providerID`, when its kubelet sets one (k3s registers `k3s://<name>`).
    /// Unset means `homelab://<slot>`, which the operator writes onto the node.
    #[serde(rename = "providerID", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub provider_id: Option<String>,
    /// Taints the machine's node carries when it serves; cluster-autoscaler's template for the
    /// pool includes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub node_taints: Vec<Taint>,
    /// Labels the machine's node carries when it serves (template for scale-from-zero).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// What the machine offers (cpu, memory, pods, ...), used when no node of the pool is up.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_capacity: BTreeMap<String, Quantity>,
    /// What the machine costs. Unset takes the pool's pricing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
    /// The pool's power-off gates that concern this machine (the ones guarding data it holds),
    /// by name. Unset: every gate of its pool; empty: none (a machine holding no replicas goes
    /// off whatever the storage says). A name the pool does not define holds the machine on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Set)]
    pub power_off_gates: Option<Vec<String>>,
    /// REMOVED in v2alpha1. Desired power is no longer declared: a machine runs exactly while
    /// a live NodeClaim names its slot. Delete this field from your manifests; to start a machine
    /// by hand, create a NodeClaim. The field stays in the schema only so that an object still
    /// setting it is refused with an explanation instead of silently pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub power_state: Option<serde_json::Value>,
}

/// Any JSON value: v1alpha1 manifests wrote `powerState: on`, which YAML reads as a boolean, and
/// a type error would hide the explanation of why the field is gone. (A CEL rule cannot see an
/// untyped field, so the refusal is the validating webhook's, whose failurePolicy is Fail.)
fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// A pod that powers a machine on or off, run as a Job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecyclePodSpec {
    /// The container image.
    #[schemars(length(min = 1))]
    pub image: String,
    /// The entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment. The operator adds HOMELAB_SLOT, HOMELAB_GROUP, HOMELAB_NODECLAIM and
    /// HOMELAB_ATTEMPT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Secrets and ConfigMaps mounted read-only (credentials for IPMI, a MAC list, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub volumes: Vec<LifecycleVolume>,
    /// The ServiceAccount the pod runs as. Unset is the namespace's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Resource requests and limits of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Where the pod may run (say, a node on the machines' LAN).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub tolerations: Vec<Toleration>,
    /// The pod exits 0 only once the machine reports the state it was asked for (it reads the
    /// power state back from a BMC, or a plug's draw at standby). Read on a shutdown pod only:
    /// with it, the pod's success confirms the machine off even when its kubelet fell silent
    /// before the shutdown, and the machine's node is removed; without it, such a node is kept
    /// (a pod that exits 0 may only have sent the request).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirms_power_state: bool,
    /// How long a finished Job is kept. Defaults to 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Retries of the pod before the Job fails. Defaults to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub backoff_limit: Option<i32>,
    /// How long the Job may run. Defaults to the startup Job timeout (300) and may not exceed it,
    /// so the Job always ends inside the claim's deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 300))]
    pub active_deadline_seconds: Option<i64>,
}

/// A Secret or ConfigMap mounted read-only into a lifecycle pod. Exactly one source is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.secretName) != has(self.configMapName)").message("set exactly one of secretName and configMapName"))]
pub struct LifecycleVolume {
    /// The volume's name, unique in the pod.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Where it is mounted in the container.
    #[schemars(length(min = 1))]
    pub mount_path: String,
    /// A Secret in the slot's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// A ConfigMap in the slot's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
}

/// What the operator observes of a slot. Reported, never read to decide, except `providerID`:
/// the machine's name to cluster-autoscaler, which outlives its node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Whether the machine is observed up: `on` when its node has a kubelet that reports,
    /// `suspended` when its node says the machine sleeps (`Suspended=True`), `off` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<ObservedPower>,
    /// The derived report: off, pending, booting, ready or draining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SlotPhase>,
    /// The `spec.providerID` the machine's Kubernetes node carried when last registered (k3s
    /// writes `k3s://<name>` itself; elsewhere it is the slot's declared one or
    /// `homelab://<slot>`, which the operator writes). cluster-autoscaler knows the machine by
    /// it, including while the machine boots again and has no node yet.
    #[serde(rename = "providerID", default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// A digest of the slot's newest claim, which outlives the claim's collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_claim: Option<SlotClaimDigest>,
    /// Conditions of the slot: `CapacityMatches`, `ProviderIDMatches` (the declared providerID
    /// against the registered node's) and `NodeLabelsDeclared` (labels and taints on the node
    /// that the slot does not declare, which are lost when the operator removes the node of a
    /// machine that is off), `NodeReporting` (False while the node's kubelet is silent: the node
    /// is kept until a shutdown confirms the machine off), `MeterRead` and `BmcRead`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// What the plug's meter (`spec.power.http.meter`) last read. The energy report counts it
    /// instead of the declared watts while it is fresh; the `MeterRead` condition says why a
    /// read failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draw: Option<MeasuredDraw>,
    /// What the slot's BMC (`spec.power.redfish` or `spec.power.ipmi`) last reported of the
    /// machine's power, read by the operator while the machine's kubelet is silent: a machine
    /// its BMC reports on is cut off from the API server, not off. The `BmcRead` condition says
    /// why a read failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_reading: Option<BmcReading>,
    /// The labels the machine's node carried when last seen, less its hostname and the
    /// operator's own: what the kubelet's `--node-labels`, a CSI plugin (`topology.topolvm.io/node`,
    /// `openebs.io/nodename`) or node feature discovery put there. Placement and
    /// cluster-autoscaler's template count them as the node's while the machine is off, the
    /// declared `spec.nodeLabels` winning where both name a key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Running pods whose PersistentVolumes no other machine can serve (a `local-path` or
    /// `local` volume on this machine's disk): the machine holds their data. The built-in
    /// scaler never releases a machine that runs a pod, and when such a pod is pending with its
    /// machine off, the operator wakes this slot for it. Written by the scaler's pass for the
    /// slots of every pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_volumes: Vec<LocalVolume>,
    /// Pending pods that only this machine can run (their volume is on its disk, or their
    /// selector names it), as `namespace/name`, whose wake the pool's power holds back (on
    /// battery, or a staggered return from an outage). The pool's next boot, whoever asks for
    /// it, picks this slot first. Written by the scaler's pass, with `localVolumes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_pods: Vec<String>,
    /// The shutdowns of this machine that no claim asked for (up and unwanted, or silent, with
    /// no claim to count them on): three in a row, then a 30-minute pause from the last one.
    /// Kept here because the shutdown Jobs themselves are collected after their TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unclaimed_shutdowns: Option<ShutdownStreak>,
    /// While the pool's power-off gates hold the machine on: the gates that hold it, or the
    /// data machine whose power-off it waits for. The `PowerOffAllowed` condition says what
    /// they read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_off_held_by: Option<String>,
}

/// A run of shutdown attempts with no claim to count them on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownStreak {
    /// Shutdown Jobs created in this run.
    pub attempts: i32,
    /// When the last of them was created.
    pub last_attempt_at: Time,
}

/// A running pod's volume that only one machine can serve.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct LocalVolume {
    /// The pod, as `namespace/name`.
    pub pod: String,
    /// Its PersistentVolumeClaim (in the pod's namespace).
    pub claim: String,
    /// The PersistentVolume the claim is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

/// A slot's draw as its plug's meter reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasuredDraw {
    /// The draw at `readAt`, in watts.
    pub watts: f64,
    /// When the meter answered.
    pub read_at: Time,
    /// The last draw read while the slot was ready (wanted, up and serving): the always-on
    /// baseline of the energy report, in place of `spec.power.watts.whenOn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_on_watts: Option<f64>,
}

/// A machine's power as its BMC reported it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcReading {
    /// What the BMC reported: `on` or `off`.
    pub power: ObservedPower,
    /// When it answered.
    pub read_at: Time,
}

/// Whether a machine is observed up; `suspended`: asleep (suspended to RAM), its node marked
/// `Suspended=True`. (No doc on a variant: it would turn the schema's enum into a oneOf.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ObservedPower {
    On,
    Off,
    Suspended,
}

/// The derived report of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SlotPhase {
    /// No live claim, no machine observed.
    Off,
    /// A live claim that has not started its boot yet.
    Pending,
    /// A boot is in flight, or a wanted machine is not (yet) usable.
    Booting,
    /// A live ready claim, node Ready and free of the readiness taints.
    Ready,
    /// The machine is being released: marked for scale-down, or up and no longer wanted.
    Draining,
}

/// The slot's record of its newest claim: who asked, how many attempts, how it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotClaimDigest {
    /// The claim's name.
    pub name: String,
    /// The claim's phase when last seen; empty reads as pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodeClaimPhase>,
    /// The claim's attempt number.
    pub attempt: i32,
    /// Whether the claim started a boot (spent an attempt).
    #[serde(default)]
    pub boot_committed: bool,
    /// Whether the claim's machine ever became ready.
    #[serde(default)]
    pub reached_ready: bool,
    /// The call that asked for the machine.
    pub call: ClaimCall,
    /// The pool the request was for.
    pub group: String,
    /// The one-line outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The claim's boot deadline, while it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Time>,
    /// When the claim ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}

impl Node {
    /// The pool the slot joins by its `group` label, if any.
    pub fn group(&self) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(super::POOL_MEMBERSHIP_LABEL).map(String::as_str)
    }

    /// The machine's running draw: what its meter read while it served, else its declared
    /// `whenOn`.
    pub fn running_watts(&self) -> Option<f64> {
        let measured = self.status.as_ref().and_then(|s| s.draw.as_ref()?.when_on_watts);
        measured.or(self.declared_watts().map(|w| w.when_on))
    }

    /// The machine's declared standby draw (`whenOff`), if any.
    pub fn standby_watts(&self) -> Option<f64> {
        self.declared_watts().and_then(|w| w.when_off)
    }

    /// The machine's draw while no claim wants it: its `spec.power.suspend.watts` while it
    /// sleeps (`asleep`), else its standby draw. A sleep without declared watts draws the
    /// standby figure.
    pub fn idle_watts(&self, asleep: bool) -> Option<f64> {
        let suspended = self.spec.power.as_ref().and_then(|p| p.suspend.as_ref()?.watts);
        if asleep { suspended.or(self.standby_watts()) } else { self.standby_watts() }
    }

    fn declared_watts(&self) -> Option<&super::PowerWatts> {
        self.spec.power.as_ref().and_then(|p| p.watts.as_ref())
    }
}
