// kube-derive takes one `printcolumn(...)` per column; clippy reads repeated keys as duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::Duration;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::{Pricing, TaintSelector};
use super::power_off_gates::{MaintenanceSteps, PowerOffGate};
use super::schedule::{GroupScheduleStatus, ScheduleWindow};
use super::ups::{GroupPowerStatus, UpsPolicy};

/// A pool of slots. A slot joins a pool with the label `group: <pool name>`.
///
/// The pool says who scales it (`driver`), how long a machine may take to arrive
/// (`maxNodeProvisionTime`), which bootstrap taints must clear before a machine counts as
/// ready (`nodeReadinessTaints`), and the scale-down options cluster-autoscaler asks for.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "infra.homecluster.dev",
    version = "v2alpha1",
    kind = "Group",
    namespaced,
    derive = "PartialEq",
    status = "GroupStatus",
    shortname = "hgroup",
    category = "homelab",
    doc = "A pool of homelab machines (slots) scaled together.",
    printcolumn(name = "Driver", type_ = "string", json_path = ".spec.driver"),
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.minSize"),
    printcolumn(name = "Slots", type_ = "integer", json_path = ".status.slots"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.claims.ready"),
    printcolumn(name = "Booting", type_ = "integer", json_path = ".status.claims.booting"),
    printcolumn(name = "Pending", type_ = "integer", json_path = ".status.claims.pending"),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".status.schedule.active"),
    printcolumn(name = "Power", type_ = "string", json_path = ".status.power.summary"),
    printcolumn(name = "Cost", type_ = "number", json_path = ".status.savings.cost"),
    printcolumn(name = "Saved", type_ = "number", json_path = ".status.savings.saved"),
    printcolumn(
        name = "kWh-Saved",
        type_ = "number",
        json_path = ".status.savings.energySavedKWh"
    ),
    printcolumn(
        name = "Energy-Saved",
        type_ = "number",
        json_path = ".status.savings.energySavedCost"
    ),
    printcolumn(
        name = "kWh-Used",
        type_ = "number",
        json_path = ".status.savings.energyUsedKWh",
        priority = 1
    ),
    printcolumn(
        name = "Currency",
        type_ = "string",
        json_path = ".spec.energy.currency",
        priority = 1
    ),
    printcolumn(
        name = "Hours-On",
        type_ = "number",
        json_path = ".status.savings.machineHoursOn",
        priority = 1
    ),
    printcolumn(
        name = "Provision",
        type_ = "string",
        json_path = ".spec.maxNodeProvisionTime",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct GroupSpec {
    /// Who decides how many machines run: `cluster-autoscaler` (through the externalgrpc
    /// provider) or `builtin` (the operator's own demand scaler). A builtin pool is not offered to
    /// cluster-autoscaler. Switching is refused while the pool has live claims.
    #[serde(default)]
    pub driver: ScalingDriver,

    /// The number of machines kept powered at all times. The built-in scaler keeps this many,
    /// and cluster-autoscaler is told it as the group's minimum size.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_size: i32,

    /// How long cluster-autoscaler waits for a requested machine before it gives up on it.
    /// A claim's deadline is never shorter than this (its boot budget is the floor). Like the
    /// `scaleDown` options, it is handed to cluster-autoscaler through GetOptions, so setting it
    /// overrides cluster-autoscaler's options for the pool. Go duration syntax, for example `15m`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub max_node_provision_time: Option<Duration>,

    /// Taints a booting machine carries until its networking (or other agent) is ready. A claim
    /// becomes `ready` only once the node is Ready and free of all of them.
    #[serde(default = "default_readiness_taints")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub node_readiness_taints: Vec<TaintSelector>,

    /// Scale-down options handed to cluster-autoscaler per group (GetOptions). Unset fields take
    /// cluster-autoscaler's own defaults. A pool that sets none of them (nor
    /// `maxNodeProvisionTime`) is left to cluster-autoscaler's flags entirely; one that sets any
    /// gets a startup time of 0 from cluster-autoscaler 1.35–1.36 (see docs/api.md).
    #[serde(default)]
    pub scale_down: ScaleDownOptions,

    /// Settings of the built-in demand scaler, read when `driver` is `builtin`.
    #[serde(default)]
    pub builtin: BuiltinScaler,

    /// The price of a slot that declares none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,

    /// How much more per hour a machine asleep (suspended to RAM) may cost than one that is off
    /// and still be woken first: it serves in seconds, not a boot's minutes. 0 (the default)
    /// prefers it at an equal price only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub asleep_price_margin: Option<f64>,

    /// The electricity tariff: prices the energy report, and with a slot's
    /// `spec.power.watts` gives the hourly rate of a slot that declares no pricing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy: Option<EnergyTariff>,

    /// Windows of the week during which machines of the pool are kept on, whoever scales it:
    /// the schedule holds them with `Schedule` claims that end with the window (docs/api.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub schedules: Vec<ScheduleWindow>,

    /// Conditions that must hold before a machine of the pool is powered off, whoever asked
    /// (docs/operations.md, "Storage that must not lose a replica"). Each applies to every slot
    /// of the pool unless a slot names the gates that concern it (`spec.powerOffGates`). A slot
    /// some gate applies to is a data machine: of those, one at a time is on its way off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub power_off_gates: Vec<PowerOffGate>,

    /// How long after a data machine's shutdown the gates are not yet trusted to have seen it
    /// go: the time the storage takes to notice a host down (Ceph marks an OSD down within
    /// about 30 s). The next data machine waits this long, then for every gate to hold.
    /// Go duration syntax; default `2m`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub power_off_gate_settle: Option<Duration>,

    /// Steps run around each machine's power-off: before it is cordoned, and once it is back
    /// and Ready (to set and clear a storage system's maintenance flag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceSteps>,

    /// The UPS the pool's machines run on, and what the pool does on battery
    /// (docs/operations.md, "When the power goes out").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ups: Option<UpsPolicy>,
}

impl GroupSpec {
    /// The cluster-autoscaler options this pool sets, as field paths: `spec.scaleDown.*` and
    /// `spec.maxNodeProvisionTime`, which cluster-autoscaler is handed too (it also floors the
    /// claims' deadline). With none, NodeGroupGetOptions answers UNIMPLEMENTED and
    /// cluster-autoscaler runs the pool with its own flags.
    pub fn autoscaler_option_overrides(&self) -> Vec<&'static str> {
        let s = &self.scale_down;
        [
            ("spec.scaleDown.utilizationThreshold", s.utilization_threshold.is_some()),
            ("spec.scaleDown.gpuUtilizationThreshold", s.gpu_utilization_threshold.is_some()),
            ("spec.scaleDown.unneededTime", s.unneeded_time.is_some()),
            ("spec.scaleDown.unreadyTime", s.unready_time.is_some()),
            ("spec.scaleDown.zeroOrMaxNodeScaling", s.zero_or_max_node_scaling.is_some()),
            (
                "spec.scaleDown.ignoreDaemonSetsUtilization",
                s.ignore_daemon_sets_utilization.is_some(),
            ),
            ("spec.maxNodeProvisionTime", self.max_node_provision_time.is_some()),
        ]
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
        .collect()
    }
}

/// What a kWh costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnergyTariff {
    /// The price of one kWh.
    #[serde(rename = "pricePerKWh")]
    #[schemars(range(min = 0.0))]
    pub price_per_kwh: f64,
    /// The currency of the price, for people reading the report (say `EUR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// Who scales a pool.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ScalingDriver {
    /// cluster-autoscaler, through the externalgrpc cloud provider.
    #[default]
    #[serde(rename = "cluster-autoscaler")]
    ClusterAutoscaler,
    /// The operator's own demand scaler.
    #[serde(rename = "builtin")]
    Builtin,
}

/// cluster-autoscaler's per-group scale-down options. Each unset field takes the value
/// cluster-autoscaler runs with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleDownOptions {
    /// A node whose requested CPU and memory are below this fraction of allocatable may be
    /// removed. Between 0 and 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub utilization_threshold: Option<f64>,
    /// As `utilizationThreshold`, for GPU nodes. Between 0 and 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub gpu_utilization_threshold: Option<f64>,
    /// How long a node must be unneeded before it is removed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub unneeded_time: Option<Duration>,
    /// How long an unready node must be unneeded before it is removed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub unready_time: Option<Duration>,
    /// Scale the pool to zero or to its maximum, never in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_or_max_node_scaling: Option<bool>,
    /// Leave DaemonSet pods out of the utilization computed for scale-down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_daemon_sets_utilization: Option<bool>,
}

/// Settings of the built-in demand scaler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuiltinScaler {
    /// How long demand must be gone (or a machine idle) before machines are released.
    #[serde(default = "default_hold", deserialize_with = "super::duration::deserialize")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub hold: Duration,
    /// How many pending pods one machine is assumed to absorb.
    #[serde(default = "default_pods_per_node")]
    #[schemars(range(min = 1))]
    pub pods_per_node: i32,
    /// The most machines the scaler powers at once. Unset means every slot of the pool; a value
    /// above the slot count is capped to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_nodes: Option<i32>,
}

impl Default for BuiltinScaler {
    fn default() -> Self {
        Self { hold: default_hold(), pods_per_node: default_pods_per_node(), max_nodes: None }
    }
}

/// The default readiness gate: Cilium's agent-not-ready taint.
pub fn default_readiness_taints() -> Vec<TaintSelector> {
    vec![TaintSelector {
        key: "node.cilium.io/agent-not-ready".into(),
        effect: Some("NoExecute".into()),
        value: None,
    }]
}

fn default_hold() -> Duration {
    std::time::Duration::from_secs(120).into()
}

fn default_pods_per_node() -> i32 {
    8
}

/// What the operator observes of a pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many slots carry this pool's label.
    #[serde(default)]
    pub slots: i32,
    /// Live claims of the pool, by phase.
    #[serde(default)]
    pub claims: GroupClaimCounts,
    /// The built-in scaler's last decision, when `driver` is `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<ScalerDecision>,
    /// What powering machines on demand cost, and saved against keeping every slot on
    /// (docs/operations.md explains the arithmetic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savings: Option<GroupSavings>,
    /// The schedule's open windows and its next opening, when `spec.schedules` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<GroupScheduleStatus>,
    /// What the pool's UPS last said, when `spec.ups` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<GroupPowerStatus>,
    /// Conditions of the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The savings report of a pool: machine-hours on and off since `since`, priced with each
/// slot's `pricing.hourlyRate` (else the pool's), against the cost of every slot always on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupSavings {
    /// When the accounting started (the first time the operator saw the pool).
    pub since: Time,
    /// When the report was last brought up to date.
    pub observed_at: Time,
    /// The slots drawing power at `observedAt`: the time until the next update is charged to
    /// them as on, to every other slot as off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub powered: Vec<String>,
    /// Machine-hours spent powered (booting, ready or draining).
    pub machine_hours_on: f64,
    /// Machine-hours spent off.
    pub machine_hours_off: f64,
    /// What the powered hours cost, in the pricing's currency.
    pub cost: f64,
    /// What the same hours would have cost with every slot always on.
    pub always_on_cost: f64,
    /// `alwaysOnCost - cost`.
    pub saved: f64,
    /// Energy drawn, in kWh: each slot's draw as its plug's meter read it where there is a fresh
    /// reading, else its `spec.power.watts` (`whenOn` while powered, `whenOff` while off).
    #[serde(default, rename = "energyUsedKWh")]
    pub energy_used_kwh: f64,
    /// Energy not drawn against every slot always on (its on-draw around the clock: as read
    /// while ready, else `whenOn`), in kWh.
    #[serde(default, rename = "energySavedKWh")]
    pub energy_saved_kwh: f64,
    /// What the energy drawn cost at the pool's tariff (`spec.energy`), step by step: a tariff
    /// change prices the time after it.
    #[serde(default)]
    pub energy_cost: f64,
    /// What the energy saved would have cost at the tariff.
    #[serde(default)]
    pub energy_saved_cost: f64,
    /// Slots of the pool whose draw is not known: they declare no `spec.power.watts` and their
    /// meter has not read them ready. They count no energy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots_without_watts: Vec<String>,
    /// The draw each metered slot's plug read at `observedAt` (its `status.draw`, when fresh),
    /// in watts: the time until the next update is charged to these slots at it. Every other
    /// slot is counted from its declared watts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measured_watts: BTreeMap<String, f64>,
}

/// Live claims of a pool by phase; an empty phase counts as pending.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupClaimCounts {
    #[serde(default)]
    pub pending: i32,
    #[serde(default)]
    pub booting: i32,
    #[serde(default)]
    pub ready: i32,
}

/// One decision of the built-in scaler, as an operator reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalerDecision {
    /// When the decision was taken.
    pub at: Time,
    /// The pod-work count the decision saw.
    pub demand: i32,
    /// The machine count the pool is steered to.
    pub target: i32,
    /// What was done: None, Provision, ScaleIn or Teardown.
    pub action: String,
    /// Why, in a sentence.
    pub reason: String,
    /// Since when the pool (or its emptiest machine) has been idle, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Time>,
}
