use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// What a machine costs, used by cluster-autoscaler's price expander and by the provider to
/// power cheap machines on first. Plain numbers in any currency, as long as a pool uses one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pricing {
    /// The cost of running the machine for one hour.
    #[schemars(range(min = 0.0))]
    #[serde(default)]
    pub hourly_rate: f64,
    /// The cost attributed to one pod on the machine for one hour. 0 (the default) prices a pod
    /// at its share of the machine: the larger of its CPU and memory requests over the slot's
    /// declared capacity, times the hourly rate.
    #[schemars(range(min = 0.0))]
    #[serde(default)]
    pub pod_rate: f64,
}

/// A taint by key and effect (and optionally value), as named in a Group's readiness gate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaintSelector {
    /// The taint key, for example `node.cilium.io/agent-not-ready`.
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    /// The taint effect. Empty matches any effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(NoSchedule|PreferNoSchedule|NoExecute)$"))]
    pub effect: Option<String>,
    /// The taint value. Empty matches any value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl TaintSelector {
    /// Whether a node taint is the one this selector names.
    pub fn matches(&self, taint: &k8s_openapi::api::core::v1::Taint) -> bool {
        taint.key == self.key
            && self.effect.as_deref().is_none_or(|e| e == taint.effect)
            && self.value.as_deref().is_none_or(|v| taint.value.as_deref().unwrap_or("") == v)
    }
}
