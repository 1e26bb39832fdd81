//! Translation between the wire and the provider core, pure. Where a field exists in a legacy
//! and a current form (cluster-autoscaler ≤ 1.34 and ≥ 1.35), the current one is read first and
//! both are written.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use prost::Message;
use tonic::Status;

use crate::provider::{
    AutoscalingOptions, Instance, InstanceState, NodeGroupInfo, NodeRef, PodPlacement, PodRequests,
    PriceWindow, ResolvedOptions,
};

use super::proto;
use super::proto::instance_status::InstanceState as WireState;

/// A node as the request sends it.
pub fn node_ref(node: Option<&proto::ExternalGrpcNode>) -> NodeRef {
    let Some(node) = node else { return NodeRef::default() };
    NodeRef {
        provider_id: node.provider_id.clone(),
        name: node.name.clone(),
        labels: node.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// A group, fully described (cluster-autoscaler freezes min and max from this answer).
pub fn node_group(info: NodeGroupInfo) -> proto::NodeGroup {
    proto::NodeGroup {
        id: info.id,
        min_size: info.min_size,
        max_size: info.max_size,
        debug: info.debug,
    }
}

/// An instance; an error is sent only with a non-empty code, which is how the client reads it.
pub fn instance(instance: Instance) -> proto::Instance {
    let state = match instance.state {
        InstanceState::Running => WireState::InstanceRunning,
        InstanceState::Creating => WireState::InstanceCreating,
        InstanceState::Deleting => WireState::InstanceDeleting,
    };
    proto::Instance {
        id: instance.id,
        status: Some(proto::InstanceStatus {
            instance_state: state.into(),
            error_info: instance.error.map(|e| proto::InstanceErrorInfo {
                error_code: e.code,
                error_message: e.message,
                instance_error_class: e.class,
            }),
        }),
    }
}

/// A wire duration as a std one; a negative or malformed one reads as unset.
pub fn duration_from_wire(d: Option<&prost_types::Duration>) -> Option<Duration> {
    let d = d?;
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok()?;
    (nanos < 1_000_000_000).then(|| Duration::new(seconds, nanos))
}

/// A legacy meta/v1 duration (nanoseconds) as a std one; a negative one reads as unset.
pub fn duration_from_legacy(d: Option<&proto::LegacyDuration>) -> Option<Duration> {
    u64::try_from(d?.duration).ok().map(Duration::from_nanos)
}

pub fn duration_to_wire(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

pub fn duration_to_legacy(d: Duration) -> proto::LegacyDuration {
    proto::LegacyDuration { duration: i64::try_from(d.as_nanos()).unwrap_or(i64::MAX) }
}

/// The request's defaults. proto3 numbers and bools carry no presence, so when the message is
/// sent they are cluster-autoscaler's values; a duration is read from its current field, else its
/// legacy one.
pub fn defaults(options: Option<&proto::NodeGroupAutoscalingOptions>) -> AutoscalingOptions {
    let Some(o) = options else { return AutoscalingOptions::default() };
    let either = |current: Option<&prost_types::Duration>,
                  legacy: Option<&proto::LegacyDuration>| {
        duration_from_wire(current).or_else(|| duration_from_legacy(legacy))
    };
    AutoscalingOptions {
        scale_down_utilization_threshold: Some(o.scale_down_utilization_threshold),
        scale_down_gpu_utilization_threshold: Some(o.scale_down_gpu_utilization_threshold),
        scale_down_unneeded_time: either(
            o.scale_down_unneeded_duration.as_ref(),
            o.scale_down_unneeded_time.as_ref(),
        ),
        scale_down_unready_time: either(
            o.scale_down_unready_duration.as_ref(),
            o.scale_down_unready_time.as_ref(),
        ),
        max_node_provision_time: either(
            o.max_node_provision_duration.as_ref(),
            o.max_node_provision_time.as_ref(),
        ),
        zero_or_max_node_scaling: Some(o.zero_or_max_node_scaling),
        ignore_daemon_sets_utilization: Some(o.ignore_daemon_sets_utilization),
    }
}

/// Every option, each duration in both its current and legacy form.
pub fn options(o: ResolvedOptions) -> proto::NodeGroupAutoscalingOptions {
    proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: o.scale_down_utilization_threshold,
        scale_down_gpu_utilization_threshold: o.scale_down_gpu_utilization_threshold,
        scale_down_unneeded_time: Some(duration_to_legacy(o.scale_down_unneeded_time)),
        scale_down_unready_time: Some(duration_to_legacy(o.scale_down_unready_time)),
        max_node_provision_time: Some(duration_to_legacy(o.max_node_provision_time)),
        zero_or_max_node_scaling: o.zero_or_max_node_scaling,
        ignore_daemon_sets_utilization: o.ignore_daemon_sets_utilization,
        scale_down_unneeded_duration: Some(duration_to_wire(o.scale_down_unneeded_time)),
        scale_down_unready_duration: Some(duration_to_wire(o.scale_down_unready_time)),
        max_node_provision_duration: Some(duration_to_wire(o.max_node_provision_time)),
    }
}

fn timestamp(t: &prost_types::Timestamp, which: &str) -> Result<Timestamp, Status> {
    Timestamp::new(t.seconds, t.nanos)
        .map_err(|e| Status::invalid_argument(format!("{which} is not a valid time: {e}")))
}

/// The pricing window: the current fields, else the legacy ones. Both ends are required.
pub fn window(
    current: (Option<&prost_types::Timestamp>, Option<&prost_types::Timestamp>),
    legacy: (Option<&prost_types::Timestamp>, Option<&prost_types::Timestamp>),
) -> Result<PriceWindow, Status> {
    let start = current.0.or(legacy.0).ok_or_else(|| Status::invalid_argument("no start time"))?;
    let end = current.1.or(legacy.1).ok_or_else(|| Status::invalid_argument("no end time"))?;
    Ok(PriceWindow {
        start: timestamp(start, "the start time")?,
        end: timestamp(end, "the end time")?,
    })
}

/// Where the pod in the request runs or would run. The pod is the protobuf encoding of a
/// core/v1 Pod, in the current field or the legacy one.
pub fn pod_placement(current: &[u8], legacy: &[u8]) -> Result<PodPlacement, Status> {
    let bytes = if current.is_empty() { legacy } else { current };
    if bytes.is_empty() {
        return Err(Status::invalid_argument("the request carries no pod"));
    }
    let pod = k8s_pb::api::core::v1::Pod::decode(bytes)
        .map_err(|e| Status::invalid_argument(format!("the pod is not a core/v1 Pod: {e}")))?;
    let spec = pod.spec.unwrap_or_default();
    Ok(PodPlacement {
        requests: PodRequests::of(&resources_of(&spec)),
        node_name: spec.node_name.filter(|n| !n.is_empty()),
        node_selector: spec.node_selector.into_iter().collect::<BTreeMap<_, _>>(),
    })
}

/// The pod's containers with their resources only, in the API's types the provider reads.
fn resources_of(spec: &k8s_pb::api::core::v1::PodSpec) -> PodSpec {
    let container = |c: &k8s_pb::api::core::v1::Container| Container {
        name: c.name.clone().unwrap_or_default(),
        resources: c.resources.as_ref().map(|r| ResourceRequirements {
            limits: quantities(&r.limits),
            requests: quantities(&r.requests),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    PodSpec {
        containers: spec.containers.iter().map(container).collect(),
        init_containers: Some(spec.init_containers.iter().map(container).collect()),
        ..PodSpec::default()
    }
}

fn quantities(amounts: &BTreeMap<String, WireQuantity>) -> Option<BTreeMap<String, Quantity>> {
    let amounts: BTreeMap<String, Quantity> = amounts
        .iter()
        .map(|(name, q)| (name.clone(), Quantity(q.string.clone().unwrap_or_default())))
        .collect();
    (!amounts.is_empty()).then_some(amounts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::InstanceError;

    fn wire(seconds: i64, nanos: i32) -> prost_types::Duration {
        prost_types::Duration { seconds, nanos }
    }

    #[test]
    fn durations_round_trip_in_both_layouts() {
        let d = Duration::from_millis(90_500);
        assert_eq!(duration_from_wire(Some(&duration_to_wire(d))), Some(d));
        assert_eq!(duration_from_legacy(Some(&duration_to_legacy(d))), Some(d));
        assert_eq!(duration_to_legacy(Duration::from_secs(1)).duration, 1_000_000_000);
        assert_eq!(duration_from_wire(Some(&wire(-5, 0))), None);
        assert_eq!(duration_from_legacy(Some(&proto::LegacyDuration { duration: -1 })), None);
        assert_eq!(duration_from_wire(None), None);
    }

    #[test]
    fn defaults_read_the_current_field_first_then_the_legacy_one() {
        let sent = proto::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_unneeded_duration: Some(wire(600, 0)),
            scale_down_unneeded_time: Some(duration_to_legacy(Duration::from_secs(1))),
            scale_down_unready_time: Some(duration_to_legacy(Duration::from_secs(1200))),
            ..Default::default()
        };
        let got = defaults(Some(&sent));
        assert_eq!(got.scale_down_unneeded_time, Some(Duration::from_secs(600)));
        assert_eq!(got.scale_down_unready_time, Some(Duration::from_secs(1200)));
        assert_eq!(got.max_node_provision_time, None, "absent in both forms");
        assert_eq!(got.scale_down_utilization_threshold, Some(0.5));
        assert_eq!(defaults(None), AutoscalingOptions::default());
    }

    #[test]
    fn every_duration_is_written_in_both_layouts() {
        let resolved = ResolvedOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.5,
            scale_down_unneeded_time: Duration::from_secs(600),
            scale_down_unready_time: Duration::from_secs(1200),
            max_node_provision_time: Duration::from_secs(900),
            zero_or_max_node_scaling: false,
            ignore_daemon_sets_utilization: true,
        };
        let o = options(resolved);
        for (current, legacy) in [
            (&o.scale_down_unneeded_duration, &o.scale_down_unneeded_time),
            (&o.scale_down_unready_duration, &o.scale_down_unready_time),
            (&o.max_node_provision_duration, &o.max_node_provision_time),
        ] {
            let current = duration_from_wire(current.as_ref()).unwrap();
            assert!(!current.is_zero());
            assert_eq!(duration_from_legacy(legacy.as_ref()), Some(current));
        }
        assert!(o.ignore_daemon_sets_utilization);
    }

    #[test]
    fn instance_states_and_errors() {
        let failed = instance(Instance {
            id: "homelab://a".into(),
            state: InstanceState::Creating,
            error: Some(InstanceError {
                code: "DeadlineExceeded".into(),
                message: "m".into(),
                class: 99,
            }),
        });
        let status = failed.status.unwrap();
        assert_eq!(status.instance_state, WireState::InstanceCreating as i32);
        let info = status.error_info.unwrap();
        assert_eq!((info.error_code.as_str(), info.instance_error_class), ("DeadlineExceeded", 99));

        let running =
            instance(Instance { id: "x".into(), state: InstanceState::Running, error: None });
        let status = running.status.unwrap();
        assert_eq!(status.instance_state, WireState::InstanceRunning as i32);
        assert!(status.error_info.is_none());
        let deleting =
            instance(Instance { id: "x".into(), state: InstanceState::Deleting, error: None });
        assert_eq!(deleting.status.unwrap().instance_state, WireState::InstanceDeleting as i32);
    }

    #[test]
    fn the_window_prefers_the_current_fields() {
        let t = |s| prost_types::Timestamp { seconds: s, nanos: 0 };
        let w = window((Some(&t(3600)), Some(&t(7200))), (Some(&t(0)), Some(&t(1)))).unwrap();
        assert_eq!(w.start.as_second(), 3600);
        let w = window((None, None), (Some(&t(0)), Some(&t(1)))).unwrap();
        assert_eq!(w.end.as_second(), 1);
        assert_eq!(
            window((None, None), (None, None)).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn a_pod_is_read_from_either_field_and_garbage_is_refused() {
        let pod = k8s_pb::api::core::v1::Pod {
            spec: Some(k8s_pb::api::core::v1::PodSpec {
                node_name: Some("nuc".into()),
                node_selector: [("infra.homecluster.dev/group".to_string(), "pool".to_string())]
                    .into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let bytes = pod.encode_to_vec();
        let got = pod_placement(&[], &bytes).unwrap();
        assert_eq!(got.node_name.as_deref(), Some("nuc"));
        assert_eq!(got.node_selector["infra.homecluster.dev/group"], "pool");
        assert_eq!(pod_placement(&bytes, &[]).unwrap(), got);
        assert_eq!(pod_placement(&[], &[]).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(
            pod_placement(&[0xff, 0xff, 0xff], &[]).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn a_pods_cpu_and_memory_requests_are_read_as_the_scheduler_sums_them() {
        use k8s_pb::api::core::v1::{Container, PodSpec, ResourceRequirements};
        use k8s_pb::apimachinery::pkg::api::resource::Quantity;
        let amounts = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(n, q)| (n.to_string(), Quantity { string: Some(q.to_string()) }))
                .collect()
        };
        let container = |requests: &[(&str, &str)], limits: &[(&str, &str)]| Container {
            resources: Some(ResourceRequirements {
                requests: amounts(requests),
                limits: amounts(limits),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = k8s_pb::api::core::v1::Pod {
            spec: Some(PodSpec {
                containers: vec![
                    container(&[("cpu", "500m"), ("memory", "1Gi")], &[]),
                    // A limit without a request is the request.
                    container(&[], &[("cpu", "1"), ("nvidia.com/gpu", "1")]),
                ],
                init_containers: vec![container(&[("memory", "3Gi")], &[])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let got = pod_placement(&pod.encode_to_vec(), &[]).unwrap();
        let gib = 1024_i128 * 1024 * 1024 * 1000;
        assert_eq!(got.requests, PodRequests { cpu: 1500, memory: 3 * gib });
    }
}
