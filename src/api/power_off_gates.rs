use kube::KubeSchema;

use super::slot::LifecyclePodSpec;
use serde::{Deserialize, Serialize};

/// A condition that must hold before a machine of the pool is powered off: storage whose
/// replicas the machine may hold says it is healthy. Read from the user's Prometheus or from a
/// Kubernetes object; a gate that cannot be read holds, and says why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.prometheus) != has(self.kubernetes)").message("a gate reads exactly one source: set either prometheus or kubernetes").reason(kube::core::Reason::FieldValueInvalid))]
pub struct PowerOffGate {
    /// The gate's name, which a slot's `spec.powerOffGates` names and the slot's status quotes
    /// while the gate holds a machine on.
    #[schemars(length(min = 1, max = 63))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Open while a PromQL query returns at least one sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusGate>,
    /// Open while a CEL expression over Kubernetes objects is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesGate>,
}

/// A PromQL instant query against the user's Prometheus. The gate is open while the query
/// returns at least one sample, as an alerting rule fires while its expression does: write the
/// healthy state as a filter (`ceph_health_status == 0`), so that a metric that is missing
/// (the exporter down, the series stale) holds the machine on rather than letting it go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusGate {
    /// The Prometheus server's base URL, for example
    /// `http://prometheus-operated.monitoring.svc:9090`.
    #[schemars(length(min = 1))]
    #[schemars(regex(pattern = r"^https?://"))]
    pub url: String,
    /// The PromQL expression that returns samples while the machine may go.
    #[schemars(length(min = 1))]
    pub query: String,
    /// A second query, read only while the gate is closed, whose samples the slot quotes as
    /// the storage's own words, for example `ceph_health_detail == 1` (Ceph's health checks:
    /// `OSD_DOWN`, `PG_DEGRADED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<String>,
}

/// A CEL expression over Kubernetes objects of any kind, for storage that keeps its health in
/// its own resources (Rook's `CephCluster`, Longhorn's `Volume`, CloudNativePG's `Cluster`).
/// The expression sees `objects`, the list of objects read, and, when `name` is set, `object`,
/// that one object. The gate is open while it evaluates to `true`. The operator needs `get` and
/// `list` on the kind (the chart's `powerOffGates.readResources`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesGate {
    /// The objects' API version, for example `ceph.rook.io/v1`.
    #[schemars(length(min = 1))]
    pub api_version: String,
    /// The objects' kind, for example `CephCluster`.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// The objects' namespace; unset for a cluster-scoped kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// One object by name (`object` in the expression); unset reads every object of the kind
    /// in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A label selector narrowing the objects read, for example `app=postgres`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// The CEL expression, for example `object.status.ceph.health == 'HEALTH_OK'` or
    /// `objects.all(v, v.status.robustness == 'healthy')`.
    #[schemars(length(min = 1))]
    pub expression: String,
}

/// Steps a pool runs around a machine's power-off, for storage that has its own "this host is
/// going away for a while, do not rebuild" switch (Ceph's `noout`, Longhorn's node scheduling):
/// one before the machine is cordoned, one once it is back and Ready (or wanted again before it
/// went). Each runs as a Job of the slot with `HOMELAB_SLOT` and `HOMELAB_NODE_NAME` in its
/// environment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceSteps {
    /// Runs before a serving machine of the pool is cordoned for its power-off, once its
    /// power-off gates hold. The power-off waits for it to succeed; a step that fails holds the
    /// machine on and says so, until its Job is deleted (which runs it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_power_off: Option<LifecyclePodSpec>,
    /// Runs once the machine is up and Ready again after a `beforePowerOff` step succeeded (or
    /// the machine was wanted again before it went off): clears what that step set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_ready: Option<LifecyclePodSpec>,
}
