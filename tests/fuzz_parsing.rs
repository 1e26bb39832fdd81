//! Property-based fuzzing (proptest, stable Rust) of what the operator parses from outside:
//! Go-style durations (Group fields, flags), the externalgrpc durations in both layouts,
//! pricing windows, the protobuf Pod of a PricingPodPrice, the autoscaling options
//! cluster-autoscaler sends, and the slot capacities (quantities) a template node carries.
//!
//! Go durations go through `api::duration::parse_go_duration`: kube-core's own parser panics
//! on `5124095576030431h` and `1h-5m`, which this suite found (regressions in src/api/duration.rs).
//!
//! Properties: nothing panics; what parses round-trips; what is refused is refused with an
//! error, never a wrong value. Cases: `HOMELAB_FUZZ_CASES` (default 1024 per property).

mod fuzz_support;

use std::time::Duration;

use fuzz_support::cases;
use homelab_autoscaler::api::duration::parse_go_duration;
use homelab_autoscaler::grpc::convert;
use homelab_autoscaler::grpc::proto;
use homelab_autoscaler::webhook::group_rules::go_duration;
use k8s_pb::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: cases(1024), failure_persistence: None, ..Config::default() })
}

/// Strings shaped like durations, and anything else.
fn duration_text() -> impl Strategy<Value = String> {
    let unit = prop::sample::select(vec!["ns", "us", "µs", "ms", "s", "m", "h", "d", "", "x"]);
    let part =
        (any::<u64>(), prop::option::of(0u32..1_000_000), unit).prop_map(|(n, fraction, unit)| {
            match fraction {
                Some(f) => format!("{n}.{f}{unit}"),
                None => format!("{n}{unit}"),
            }
        });
    prop_oneof![
        (
            prop::option::of(prop::sample::select(vec!["-", "+", "--"])),
            prop::collection::vec(part, 1..4)
        )
            .prop_map(|(sign, parts)| format!("{}{}", sign.unwrap_or(""), parts.concat())),
        ".{0,32}",
        "[0-9.hms-]{0,16}",
    ]
}

#[test]
fn go_durations_parse_without_panics_and_print_back_to_themselves() {
    runner()
        .run(&duration_text(), |text| {
            if let Ok(parsed) = parse_go_duration(&text) {
                // What parsed prints (to the millisecond, as the rules' messages do) and parses
                // back to the same length.
                let std: Duration = parsed.into();
                let millis = Duration::from_millis(std.as_millis().min(u64::MAX as u128) as u64);
                let printed = go_duration(millis);
                let again: Duration = parse_go_duration(&printed)
                    .map_err(|e| TestCaseError::fail(format!("{printed:?} does not parse: {e}")))?
                    .into();
                prop_assert_eq!(again, millis, "{} printed as {}", text, printed);
            }
            Ok(())
        })
        .expect("go durations");
}

#[test]
fn wire_durations_round_trip_and_never_read_negative() {
    runner()
        .run(&(any::<i64>(), any::<i32>(), any::<i64>()), |(seconds, nanos, legacy)| {
            let wire = prost_types::Duration { seconds, nanos };
            match convert::duration_from_wire(Some(&wire)) {
                Some(d) => prop_assert_eq!(convert::duration_to_wire(d), wire),
                None => prop_assert!(seconds < 0 || !(0..1_000_000_000).contains(&nanos)),
            }
            let old = proto::LegacyDuration { duration: legacy };
            match convert::duration_from_legacy(Some(&old)) {
                Some(d) => prop_assert_eq!(convert::duration_to_legacy(d), old),
                None => prop_assert!(legacy < 0),
            }
            Ok(())
        })
        .expect("wire durations");
}

#[test]
fn autoscaling_options_of_any_value_resolve_without_panics() {
    let duration = prop::option::of((any::<i64>(), any::<i32>()))
        .prop_map(|d| d.map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }));
    let legacy = prop::option::of(any::<i64>())
        .prop_map(|d| d.map(|duration| proto::LegacyDuration { duration }));
    let options = (
        any::<f64>(),
        any::<f64>(),
        (duration.clone(), duration.clone(), duration),
        (legacy.clone(), legacy.clone(), legacy),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(u, g, (d1, d2, d3), (l1, l2, l3), z, i)| {
            proto::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: u,
                scale_down_gpu_utilization_threshold: g,
                scale_down_unneeded_duration: d1,
                scale_down_unready_duration: d2,
                max_node_provision_duration: d3,
                scale_down_unneeded_time: l1,
                scale_down_unready_time: l2,
                max_node_provision_time: l3,
                zero_or_max_node_scaling: z,
                ignore_daemon_sets_utilization: i,
            }
        });
    runner()
        .run(&options, |options| {
            let resolved = convert::defaults(Some(&options));
            for d in [
                resolved.scale_down_unneeded_time,
                resolved.scale_down_unready_time,
                resolved.max_node_provision_time,
            ]
            .into_iter()
            .flatten()
            {
                // A duration read off the wire is one the wire can carry back.
                prop_assert_eq!(
                    convert::duration_from_wire(Some(&convert::duration_to_wire(d))),
                    Some(d)
                );
            }
            Ok(())
        })
        .expect("options");
}

#[test]
fn pricing_windows_of_any_timestamps_are_read_or_refused() {
    let stamp = prop::option::of((any::<i64>(), any::<i32>()))
        .prop_map(|t| t.map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }));
    runner()
        .run(&(stamp.clone(), stamp.clone(), stamp.clone(), stamp), |(a, b, c, d)| {
            if let Ok(window) = convert::window((a.as_ref(), b.as_ref()), (c.as_ref(), d.as_ref()))
            {
                match window.hours() {
                    Ok(hours) => prop_assert!(hours.is_finite() && hours >= 0.0, "{hours}"),
                    Err(_) => prop_assert!(window.end < window.start),
                }
            }
            Ok(())
        })
        .expect("windows");
}

/// A Pod with arbitrary placement and arbitrary quantity strings in its requests.
fn pod() -> impl Strategy<Value = Pod> {
    let quantity = prop_oneof![
        prop::sample::select(vec!["1", "500m", "16Gi", "1e3", "-1", "", "0.5", "1Ei", "x"])
            .prop_map(str::to_string),
        ".{0,12}",
    ];
    (
        prop::option::of(".{0,20}"),
        prop::collection::btree_map(".{0,12}", ".{0,12}", 0..4),
        prop::collection::btree_map("[a-z]{1,8}", quantity, 0..4),
    )
        .prop_map(|(node_name, selector, requests)| Pod {
            spec: Some(PodSpec {
                node_name,
                node_selector: selector,
                containers: vec![Container {
                    resources: Some(ResourceRequirements {
                        requests: requests
                            .into_iter()
                            .map(|(k, v)| (k, Quantity { string: Some(v) }))
                            .collect(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
}

#[test]
fn pods_of_pricing_requests_decode_or_are_refused() {
    let bytes = prop_oneof![
        pod().prop_map(|p| p.encode_to_vec()),
        prop::collection::vec(any::<u8>(), 0..512),
        // A valid pod with a few bytes flipped.
        (pod(), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)).prop_map(
            |(p, flips)| {
                let mut bytes = p.encode_to_vec();
                if !bytes.is_empty() {
                    for (at, value) in flips {
                        let i = at.index(bytes.len());
                        bytes[i] = value;
                    }
                }
                bytes
            }
        ),
    ];
    runner()
        .run(&(bytes, any::<bool>()), |(bytes, legacy)| {
            let placed = if legacy {
                convert::pod_placement(&[], &bytes)
            } else {
                convert::pod_placement(&bytes, &[])
            };
            if let Err(status) = placed {
                prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
            }
            Ok(())
        })
        .expect("pods");
}

/// Regressions found by this suite.
#[test]
fn go_duration_keeps_a_fraction_of_a_second_after_whole_minutes() {
    // Printed as `1182667h53m` (the millisecond dropped) before the fix.
    assert_eq!(go_duration(Duration::from_millis(60_500)), "1m0.500s");
    assert_eq!(go_duration(Duration::from_millis(3_600_001)), "1h0.001s");
    assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(go_duration(Duration::ZERO), "0s");
    for text in ["5124095576030431h", "1h-5m"] {
        assert!(parse_go_duration(text).is_err(), "{text}");
    }
}
