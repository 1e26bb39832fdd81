//! Group admission: durations and thresholds that make sense, no driver switch under live
//! claims, and warnings (not denials) for a floor the pool cannot reach and for options that
//! make cluster-autoscaler give the pool's booting machines no startup time.

use std::time::Duration;

use super::verdict::{Findings, Verdict};
use crate::api::{Group, ScalingDriver};

/// The longest a machine may be given to arrive. Past a day a deadline protects nothing.
pub const MAX_PROVISION_TIME: Duration = Duration::from_secs(24 * 3600);
/// The shortest hold of the built-in scaler; shorter flaps machines on passing pods.
pub const MIN_HOLD: Duration = Duration::from_secs(10);

/// What the rules read of the cluster for one group.
pub struct GroupFacts {
    /// Slots labelled with the group.
    pub slots: usize,
    /// Live claims of the group.
    pub live_claims: usize,
    /// The moment of admission: schedule windows are compared from here on.
    pub now: jiff::Timestamp,
}

pub use crate::api::duration::go_duration;

pub fn validate(group: &Group, old: Option<&Group>, facts: &GroupFacts) -> Verdict {
    let mut findings = Findings::default();
    let spec = &group.spec;
    let mut duration = |field: &str, value: Option<kube::core::Duration>, max: Duration| {
        if let Some(value) = value {
            if value.is_negative() {
                findings.invalid(
                    "duration_in_range",
                    format!("{field}: {} is negative", go_duration(value.into())),
                );
            } else if Duration::from(value) > max {
                findings.invalid(
                    "duration_in_range",
                    format!(
                        "{field}: {} is longer than {}",
                        go_duration(value.into()),
                        go_duration(max)
                    ),
                );
            }
        }
    };
    duration("spec.maxNodeProvisionTime", spec.max_node_provision_time, MAX_PROVISION_TIME);
    duration("spec.scaleDown.unneededTime", spec.scale_down.unneeded_time, MAX_PROVISION_TIME);
    duration("spec.scaleDown.unreadyTime", spec.scale_down.unready_time, MAX_PROVISION_TIME);
    duration("spec.builtin.hold", Some(spec.builtin.hold), MAX_PROVISION_TIME);
    duration("spec.powerOffGateSettle", spec.power_off_gate_settle, MAX_PROVISION_TIME);
    // A gate whose expression cannot compile would hold every machine of the pool on forever.
    for (i, gate) in spec.power_off_gates.iter().enumerate() {
        let Some(objects) = &gate.kubernetes else { continue };
        if let Some(error) = crate::gates::kubernetes::compile_error(&objects.expression) {
            findings.invalid(
                "gate_expression_compiles",
                format!(
                    "spec.powerOffGates[{i}] ({}): the CEL expression {:?} does not compile: {error}. It sees `objects` (the list read) and, with a name, `object`; for example object.status.ceph.health == 'HEALTH_OK'",
                    gate.name, objects.expression
                ),
            );
        }
    }
    if spec.builtin.hold < MIN_HOLD {
        findings.invalid(
            "hold_long_enough",
            format!(
            "spec.builtin.hold: {} is shorter than {}; a shorter hold powers machines off under passing pods",
            go_duration(spec.builtin.hold.into()),
            go_duration(MIN_HOLD)
        ));
    }
    for (field, value) in [
        ("spec.scaleDown.utilizationThreshold", spec.scale_down.utilization_threshold),
        ("spec.scaleDown.gpuUtilizationThreshold", spec.scale_down.gpu_utilization_threshold),
    ] {
        if let Some(v) = value.filter(|v| !(0.0..=1.0).contains(v)) {
            findings.invalid(
                "fraction_in_range",
                format!("{field}: {v} is not a fraction between 0 and 1"),
            );
        }
    }
    if let Some(max) = spec.builtin.max_nodes
        && spec.driver == ScalingDriver::Builtin
        && spec.min_size > max
    {
        findings.invalid(
            "min_size_within_max",
            format!("spec.minSize ({}) is above spec.builtin.maxNodes ({max})", spec.min_size),
        );
    }
    if let Some(old) = old
        && old.spec.driver != spec.driver
        && facts.live_claims > 0
    {
        findings.forbidden(
            "driver_fixed_while_live",
            format!(
                "spec.driver cannot change while the group has {} live claim(s): the new driver \
             would not know the old one's machines. Scale the group to zero (or wait for its \
             claims to end), then switch",
                facts.live_claims
            ),
        );
    }
    if spec.driver == ScalingDriver::ClusterAutoscaler {
        let overrides = spec.autoscaler_option_overrides();
        if !overrides.is_empty() {
            findings.warn(startup_time_warning(&overrides));
        }
    }
    super::schedule_rules::check(&spec.schedules, facts.slots, facts.now, &mut findings);
    let name = group.metadata.name.as_deref().unwrap_or_default();
    if facts.slots == 0 {
        findings.warn(format!(
            "group {name} has no slots: no slot (nodes.infra.homecluster.dev) carries the label \
             `group: {name}`, so this pool cannot power any machine until one does"
        ));
    }
    if spec.min_size as usize > facts.slots {
        findings.warn(format!(
            "spec.minSize is {} but the group has {} slot(s); add slots labelled `group: {}`",
            spec.min_size, facts.slots, name
        ));
    }
    findings.verdict()
}

/// cluster-autoscaler's flag for a Group option, where it has one.
fn flag_of(field: &str) -> Option<&'static str> {
    match field {
        "spec.scaleDown.utilizationThreshold" => Some("--scale-down-utilization-threshold"),
        "spec.scaleDown.gpuUtilizationThreshold" => Some("--scale-down-gpu-utilization-threshold"),
        "spec.scaleDown.unneededTime" => Some("--scale-down-unneeded-time"),
        "spec.scaleDown.unreadyTime" => Some("--scale-down-unready-time"),
        "spec.scaleDown.ignoreDaemonSetsUtilization" => Some("--ignore-daemonsets-utilization"),
        "spec.maxNodeProvisionTime" => Some("--max-node-provision-time"),
        _ => None,
    }
}

/// Why overriding an option costs the pool its startup time (upstream issue 10245;
/// docs/decisions.md, D7).
fn startup_time_warning(overrides: &[&str]) -> String {
    let flags: Vec<&str> = overrides.iter().filter_map(|f| flag_of(f)).collect();
    let flagless: Vec<&str> = overrides.iter().copied().filter(|f| flag_of(f).is_none()).collect();
    let mut instead = String::from("Unless the group needs values of its own");
    if !flags.is_empty() {
        instead.push_str(&format!(", use the flags {} instead", flags.join(", ")));
    }
    if !flagless.is_empty() {
        instead.push_str(&format!(", leave {} unset (it has no flag)", flagless.join(", ")));
    }
    format!(
        "this group overrides cluster-autoscaler options ({}), so the operator answers \
         GetOptions, and cluster-autoscaler 1.35-1.36 then uses a MaxNodeStartupTime of 0 for it: \
         a registered machine that is not Ready yet counts as unready, not upcoming, and a second \
         machine may boot for the same pods (kubernetes/autoscaler issue 10245). {instead}.",
        overrides.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::group;

    fn verdict_of(
        edit: impl Fn(&mut Group),
        old: Option<&Group>,
        slots: usize,
        live_claims: usize,
    ) -> Verdict {
        let mut g = group("pool");
        edit(&mut g);
        validate(&g, old, &GroupFacts { slots, live_claims, now: jiff::Timestamp::UNIX_EPOCH })
    }

    #[test]
    fn group_rules_table() {
        let deny = |v: Verdict| match v {
            Verdict::Deny(d) => (d.code, d.message),
            Verdict::Allow { .. } => (200, String::new()),
        };
        assert!(verdict_of(|_| {}, None, 3, 0).is_allowed());
        let (code, msg) = deny(verdict_of(
            |g| g.spec.max_node_provision_time = Some("48h".parse().unwrap()),
            None,
            3,
            0,
        ));
        assert_eq!((code, msg.contains("spec.maxNodeProvisionTime")), (422, true), "{msg}");
        let (code, msg) =
            deny(verdict_of(|g| g.spec.builtin.hold = "1s".parse().unwrap(), None, 3, 0));
        assert_eq!((code, msg.contains("spec.builtin.hold")), (422, true), "{msg}");
        let (code, msg) =
            deny(verdict_of(|g| g.spec.scale_down.utilization_threshold = Some(1.5), None, 3, 0));
        assert_eq!((code, msg.contains("utilizationThreshold")), (422, true), "{msg}");
        let (code, msg) = deny(verdict_of(
            |g| {
                g.spec.driver = ScalingDriver::Builtin;
                g.spec.min_size = 3;
                g.spec.builtin.max_nodes = Some(2);
            },
            None,
            3,
            0,
        ));
        assert_eq!((code, msg.contains("maxNodes")), (422, true), "{msg}");
        let gate = |expression: &str| {
            let expression = expression.to_owned();
            move |g: &mut Group| {
                g.spec.power_off_gates = serde_json::from_value(serde_json::json!([{
                    "name": "ceph",
                    "kubernetes": { "apiVersion": "ceph.rook.io/v1", "kind": "CephCluster", "expression": expression },
                }]))
                .unwrap();
            }
        };
        let (code, msg) = deny(verdict_of(gate("object.status.("), None, 3, 0));
        assert_eq!((code, msg.contains("spec.powerOffGates[0] (ceph)")), (422, true), "{msg}");
        assert!(msg.contains("does not compile"), "{msg}");
        let ok = verdict_of(gate("object.status.ceph.health == 'HEALTH_OK'"), None, 3, 0);
        assert!(ok.is_allowed());
    }

    #[test]
    fn durations_read_as_written() {
        let table = [(172800, "48h"), (5400, "1h30m"), (90, "1m30s"), (10, "10s"), (0, "0s")];
        for (secs, want) in table {
            assert_eq!(go_duration(Duration::from_secs(secs)), want);
        }
    }

    #[test]
    fn the_driver_is_not_switched_under_live_claims() {
        let old = group("pool");
        let switch = |g: &mut Group| g.spec.driver = ScalingDriver::Builtin;
        match verdict_of(switch, Some(&old), 3, 2) {
            Verdict::Deny(d) => {
                assert!(d.code == 403 && d.message.contains("2 live claim"), "{}", d.message)
            }
            other => panic!("expected a denial, got {other:?}"),
        }
        assert!(verdict_of(switch, Some(&old), 3, 0).is_allowed());
    }

    #[test]
    fn overriding_an_autoscaler_option_is_a_warning() {
        let warnings = |v: Verdict| match v {
            Verdict::Allow { warnings, .. } => warnings,
            other => panic!("expected an admission, got {other:?}"),
        };
        // name, the edit, what the one warning says (None: no warning)
        type Row = (&'static str, fn(&mut Group), Option<&'static [&'static str]>);
        let table: Vec<Row> = vec![
            ("no option", |_| {}, None),
            (
                "a scale-down option",
                |g| g.spec.scale_down.unneeded_time = Some("5m".parse().unwrap()),
                Some(&[
                    "options (spec.scaleDown.unneededTime)",
                    "the flags --scale-down-unneeded-time instead",
                ]),
            ),
            (
                "the provision time",
                |g| g.spec.max_node_provision_time = Some("20m".parse().unwrap()),
                Some(&[
                    "options (spec.maxNodeProvisionTime)",
                    "the flags --max-node-provision-time instead",
                ]),
            ),
            (
                "an option without a flag",
                |g| g.spec.scale_down.zero_or_max_node_scaling = Some(true),
                Some(&["leave spec.scaleDown.zeroOrMaxNodeScaling unset (it has no flag)"]),
            ),
            (
                "a builtin pool: cluster-autoscaler never asks",
                |g| {
                    g.spec.driver = ScalingDriver::Builtin;
                    g.spec.scale_down.unneeded_time = Some("5m".parse().unwrap());
                },
                None,
            ),
        ];
        for (name, edit, want) in table {
            let got = warnings(verdict_of(edit, None, 3, 0));
            match want {
                None => assert!(got.is_empty(), "{name}: {got:?}"),
                Some(parts) => {
                    assert_eq!(got.len(), 1, "{name}: {got:?}");
                    for part in parts.iter().chain(&["MaxNodeStartupTime", "10245"]) {
                        assert!(got[0].contains(part), "{name}: {:?} lacks {part:?}", got[0]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_group_without_slots_is_a_warning() {
        match verdict_of(|_| {}, None, 0, 0) {
            Verdict::Allow { warnings, .. } => {
                assert_eq!(warnings.len(), 1, "{warnings:?}");
                assert!(warnings[0].contains("group pool has no slots"), "{}", warnings[0]);
                assert!(warnings[0].contains("`group: pool`"), "{}", warnings[0]);
            }
            other => panic!("expected a warning, got {other:?}"),
        }
    }

    #[test]
    fn a_floor_above_the_slots_is_a_warning() {
        match verdict_of(|g| g.spec.min_size = 4, None, 3, 0) {
            Verdict::Allow { warnings, .. } => {
                assert_eq!(warnings.len(), 1);
                assert!(warnings[0].contains("minSize is 4") && warnings[0].contains("3 slot"));
            }
            other => panic!("expected a warning, got {other:?}"),
        }
    }
}
