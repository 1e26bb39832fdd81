//! A pool's schedule: windows of the week during which some of its machines are kept on.
//! The types hold what the user wrote; `crate::schedule` reads them (grammar and arithmetic).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// One window of a pool's schedule: on the listed days, from `from` to `to` local time in
/// `timeZone`, at least `minMachines` of the eligible slots are held on by a pin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleWindow {
    /// The days an opening starts on: `daily`, or a comma-separated list of days (`Mon` ..
    /// `Sun`) and ranges (`Mon-Fri`; `Fri-Mon` wraps over the weekend), e.g. `Mon,Wed-Fri`.
    #[schemars(length(min = 1, max = 64))]
    pub days: String,
    /// Local start time, `HH:MM` or `HH:MM:SS`.
    #[schemars(length(min = 1, max = 8))]
    pub from: String,
    /// Local end time, `HH:MM` or `HH:MM:SS`. Earlier than `from`: the opening runs over
    /// midnight into the next day. Equal to `from`: the opening lasts a whole day.
    #[schemars(length(min = 1, max = 8))]
    pub to: String,
    /// The IANA time zone the times are read in, e.g. `Europe/Berlin`.
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
    /// How many of the eligible slots are held on while the window is open.
    #[schemars(range(min = 1))]
    pub min_machines: i32,
    /// The slots (of this pool) the window may hold, in the order they are started. Absent:
    /// any slot of the pool, the cheapest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Atomic)]
    pub slots: Vec<String>,
}

/// What the schedule controller reports of a pool's schedule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupScheduleStatus {
    /// The open windows, as `<days> <from>-<to> <timeZone>` (several joined by `; `).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
    /// When the first of the open windows closes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
    /// When the next window opens (one that is not open now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Time>,
    /// Pins on the open windows' eligible slots, against the minimum they ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// Why a window's minimum is not met, or why a window is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
