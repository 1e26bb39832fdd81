//! NodeGroupGetOptions (docs/decisions.md, D7). A Group that overrides no option gets no answer
//! (the wire says UNIMPLEMENTED), so cluster-autoscaler runs it with its own flags. An answer is
//! not free: the contract has no field for MaxNodeStartupTime, and cluster-autoscaler 1.35–1.36
//! takes 0 for a group whose options a provider answers, so a registered machine that is not
//! Ready yet counts as unready at once (upstream issue 10245). Admission warns a Group that
//! overrides anything.
//!
//! When the Group does override something, every option is answered: the Group's, else the
//! defaults cluster-autoscaler sends, else its own flag defaults. Nothing is left unset:
//! cluster-autoscaler reads an absent duration as 0, and a maxNodeProvisionTime of 0 times out
//! every scale-up at once.

use std::time::Duration;

use crate::api::GroupSpec;

use super::error::ProviderError;
use super::{Caller, Provider};

/// cluster-autoscaler's flag defaults (1.36), the last resort for each option.
pub mod fallback {
    use std::time::Duration;

    pub const SCALE_DOWN_UTILIZATION_THRESHOLD: f64 = 0.5;
    pub const SCALE_DOWN_GPU_UTILIZATION_THRESHOLD: f64 = 0.5;
    pub const SCALE_DOWN_UNNEEDED_TIME: Duration = Duration::from_secs(10 * 60);
    pub const SCALE_DOWN_UNREADY_TIME: Duration = Duration::from_secs(20 * 60);
    pub const MAX_NODE_PROVISION_TIME: Duration = Duration::from_secs(15 * 60);
}

/// Options as a request carries them: any of them may be missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AutoscalingOptions {
    pub scale_down_utilization_threshold: Option<f64>,
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    pub scale_down_unneeded_time: Option<Duration>,
    pub scale_down_unready_time: Option<Duration>,
    pub max_node_provision_time: Option<Duration>,
    pub zero_or_max_node_scaling: Option<bool>,
    pub ignore_daemon_sets_utilization: Option<bool>,
}

/// Options with every field decided.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedOptions {
    pub scale_down_utilization_threshold: f64,
    pub scale_down_gpu_utilization_threshold: f64,
    pub scale_down_unneeded_time: Duration,
    pub scale_down_unready_time: Duration,
    pub max_node_provision_time: Duration,
    pub zero_or_max_node_scaling: bool,
    pub ignore_daemon_sets_utilization: bool,
}

/// A Group duration as a std one; a negative value reads as unset.
fn duration(d: Option<kube::core::Duration>) -> Option<Duration> {
    d.filter(|d| !d.is_negative()).map(Duration::from)
}

/// A deadline of zero means "unset" wherever it comes from: as a deadline it would fail
/// every machine at once.
fn deadline(d: Option<Duration>) -> Option<Duration> {
    d.filter(|d| !d.is_zero())
}

/// A threshold outside [0, 1] (or NaN) is not a fraction and reads as unset.
fn fraction(x: Option<f64>) -> Option<f64> {
    x.filter(|x| (0.0..=1.0).contains(x))
}

/// Fills every option: the Group's, else the request's default, else the flag default.
pub fn resolve(group: &GroupSpec, defaults: &AutoscalingOptions) -> ResolvedOptions {
    let scale_down = &group.scale_down;
    ResolvedOptions {
        scale_down_utilization_threshold: fraction(scale_down.utilization_threshold)
            .or(fraction(defaults.scale_down_utilization_threshold))
            .unwrap_or(fallback::SCALE_DOWN_UTILIZATION_THRESHOLD),
        scale_down_gpu_utilization_threshold: fraction(scale_down.gpu_utilization_threshold)
            .or(fraction(defaults.scale_down_gpu_utilization_threshold))
            .unwrap_or(fallback::SCALE_DOWN_GPU_UTILIZATION_THRESHOLD),
        scale_down_unneeded_time: duration(scale_down.unneeded_time)
            .or(defaults.scale_down_unneeded_time)
            .unwrap_or(fallback::SCALE_DOWN_UNNEEDED_TIME),
        scale_down_unready_time: duration(scale_down.unready_time)
            .or(defaults.scale_down_unready_time)
            .unwrap_or(fallback::SCALE_DOWN_UNREADY_TIME),
        max_node_provision_time: deadline(duration(group.max_node_provision_time))
            .or(deadline(defaults.max_node_provision_time))
            .unwrap_or(fallback::MAX_NODE_PROVISION_TIME),
        zero_or_max_node_scaling: scale_down
            .zero_or_max_node_scaling
            .or(defaults.zero_or_max_node_scaling)
            .unwrap_or(false),
        ignore_daemon_sets_utilization: scale_down
            .ignore_daemon_sets_utilization
            .or(defaults.ignore_daemon_sets_utilization)
            .unwrap_or(false),
    }
}

/// What GetOptions answers for a group.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupOptions {
    /// The group overrides no option: cluster-autoscaler's own flags apply to it.
    FlagsApply,
    /// The group overrides these options (field paths); every option, filled.
    Overridden { overrides: Vec<&'static str>, options: ResolvedOptions },
}

/// Answers only for a group that overrides something.
pub fn decide(group: &GroupSpec, defaults: &AutoscalingOptions) -> GroupOptions {
    let overrides = group.autoscaler_option_overrides();
    if overrides.is_empty() {
        GroupOptions::FlagsApply
    } else {
        GroupOptions::Overridden { overrides, options: resolve(group, defaults) }
    }
}

impl Provider {
    /// The group's options, or that cluster-autoscaler's flags apply: read from the Group
    /// alone, at the same cost at any pool size.
    #[tracing::instrument(skip(self, caller, defaults))]
    pub fn options(
        &self,
        caller: &Caller,
        group: &str,
        defaults: &AutoscalingOptions,
    ) -> Result<GroupOptions, ProviderError> {
        Ok(decide(&self.group(caller, group)?.spec, defaults))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ScaleDownOptions;

    fn minutes(m: u64) -> Duration {
        Duration::from_secs(m * 60)
    }

    fn group(scale_down: ScaleDownOptions, provision: Option<Duration>) -> GroupSpec {
        let mut spec: GroupSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        spec.scale_down = scale_down;
        spec.max_node_provision_time = provision.map(Into::into);
        spec
    }

    fn ca_defaults() -> AutoscalingOptions {
        AutoscalingOptions {
            scale_down_utilization_threshold: Some(0.6),
            scale_down_gpu_utilization_threshold: Some(0.7),
            scale_down_unneeded_time: Some(minutes(11)),
            scale_down_unready_time: Some(minutes(21)),
            max_node_provision_time: Some(minutes(16)),
            zero_or_max_node_scaling: Some(false),
            ignore_daemon_sets_utilization: Some(true),
        }
    }

    #[test]
    fn options_table() {
        let overrides = ScaleDownOptions {
            utilization_threshold: Some(0.3),
            gpu_utilization_threshold: Some(0.2),
            unneeded_time: Some(minutes(2).into()),
            unready_time: Some(minutes(3).into()),
            zero_or_max_node_scaling: Some(true),
            ignore_daemon_sets_utilization: Some(false),
        };
        let table: Vec<(&str, GroupSpec, AutoscalingOptions, ResolvedOptions)> = vec![
            (
                "the group's overrides win",
                group(overrides, Some(minutes(20))),
                ca_defaults(),
                ResolvedOptions {
                    scale_down_utilization_threshold: 0.3,
                    scale_down_gpu_utilization_threshold: 0.2,
                    scale_down_unneeded_time: minutes(2),
                    scale_down_unready_time: minutes(3),
                    max_node_provision_time: minutes(20),
                    zero_or_max_node_scaling: true,
                    ignore_daemon_sets_utilization: false,
                },
            ),
            (
                "unset in the group: the request's defaults",
                group(ScaleDownOptions::default(), None),
                ca_defaults(),
                ResolvedOptions {
                    scale_down_utilization_threshold: 0.6,
                    scale_down_gpu_utilization_threshold: 0.7,
                    scale_down_unneeded_time: minutes(11),
                    scale_down_unready_time: minutes(21),
                    max_node_provision_time: minutes(16),
                    zero_or_max_node_scaling: false,
                    ignore_daemon_sets_utilization: true,
                },
            ),
            (
                "unset everywhere: cluster-autoscaler's flag defaults, never zero",
                group(ScaleDownOptions::default(), None),
                AutoscalingOptions::default(),
                ResolvedOptions {
                    scale_down_utilization_threshold: 0.5,
                    scale_down_gpu_utilization_threshold: 0.5,
                    scale_down_unneeded_time: minutes(10),
                    scale_down_unready_time: minutes(20),
                    max_node_provision_time: minutes(15),
                    zero_or_max_node_scaling: false,
                    ignore_daemon_sets_utilization: false,
                },
            ),
        ];
        for (name, spec, defaults, want) in table {
            assert_eq!(resolve(&spec, &defaults), want, "{name}");
        }
    }

    #[test]
    fn only_a_group_that_overrides_something_is_answered() {
        let some = |edit: fn(&mut GroupSpec)| {
            let mut spec = group(ScaleDownOptions::default(), None);
            edit(&mut spec);
            spec
        };
        let table: Vec<(&str, GroupSpec, &[&str])> = vec![
            ("nothing set", some(|_| {}), &[]),
            (
                "not options: driver, floor, readiness taints, builtin, pricing",
                some(|g| {
                    g.min_size = 2;
                    g.node_readiness_taints.clear();
                    g.builtin.pods_per_node = 3;
                    g.pricing = Some(crate::api::Pricing { hourly_rate: 1.0, pod_rate: 0.1 });
                }),
                &[],
            ),
            (
                "a threshold",
                some(|g| g.scale_down.utilization_threshold = Some(0.4)),
                &["spec.scaleDown.utilizationThreshold"],
            ),
            (
                "a GPU threshold",
                some(|g| g.scale_down.gpu_utilization_threshold = Some(0.4)),
                &["spec.scaleDown.gpuUtilizationThreshold"],
            ),
            (
                "the unneeded time",
                some(|g| g.scale_down.unneeded_time = Some(minutes(5).into())),
                &["spec.scaleDown.unneededTime"],
            ),
            (
                "the unready time",
                some(|g| g.scale_down.unready_time = Some(minutes(5).into())),
                &["spec.scaleDown.unreadyTime"],
            ),
            (
                "zero-or-max, even false",
                some(|g| g.scale_down.zero_or_max_node_scaling = Some(false)),
                &["spec.scaleDown.zeroOrMaxNodeScaling"],
            ),
            (
                "DaemonSets ignored",
                some(|g| g.scale_down.ignore_daemon_sets_utilization = Some(true)),
                &["spec.scaleDown.ignoreDaemonSetsUtilization"],
            ),
            (
                "the provision time: cluster-autoscaler is handed it too",
                some(|g| g.max_node_provision_time = Some(minutes(20).into())),
                &["spec.maxNodeProvisionTime"],
            ),
            (
                "two of them",
                some(|g| {
                    g.scale_down.unneeded_time = Some(minutes(5).into());
                    g.max_node_provision_time = Some(minutes(20).into());
                }),
                &["spec.scaleDown.unneededTime", "spec.maxNodeProvisionTime"],
            ),
        ];
        for (name, spec, want) in table {
            match decide(&spec, &ca_defaults()) {
                GroupOptions::FlagsApply => assert!(want.is_empty(), "{name}: not answered"),
                GroupOptions::Overridden { overrides, options } => {
                    assert_eq!(overrides, want, "{name}");
                    assert_eq!(options, resolve(&spec, &ca_defaults()), "{name}: every field");
                }
            }
        }
    }

    #[test]
    fn a_zero_deadline_is_never_passed_on() {
        let spec = group(ScaleDownOptions::default(), Some(Duration::ZERO));
        let defaults = AutoscalingOptions {
            max_node_provision_time: Some(Duration::ZERO),
            ..AutoscalingOptions::default()
        };
        let got = resolve(&spec, &defaults);
        assert_eq!(got.max_node_provision_time, fallback::MAX_NODE_PROVISION_TIME);
    }

    #[test]
    fn a_threshold_outside_zero_to_one_is_ignored() {
        let defaults = AutoscalingOptions {
            scale_down_utilization_threshold: Some(70.0),
            scale_down_gpu_utilization_threshold: Some(f64::NAN),
            ..AutoscalingOptions::default()
        };
        let got = resolve(&group(ScaleDownOptions::default(), None), &defaults);
        assert_eq!(got.scale_down_utilization_threshold, 0.5);
        assert_eq!(got.scale_down_gpu_utilization_threshold, 0.5);
    }
}
