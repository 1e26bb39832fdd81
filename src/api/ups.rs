//! A pool's UPS: which Network UPS Tools server tells the operator the house is on battery, what
//! the pool does then (`spec.ups`), and what the operator last read (`status.power`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use kube::core::Duration;
use serde::{Deserialize, Serialize};

/// The UPS that powers a pool's machines, read over the NUT network protocol, and the pool's
/// policy on battery. Several pools may name the same UPS.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpsPolicy {
    /// The UPS as NUT's own tools name it: `<ups>@<host>[:<port>]` (port 3493 when absent),
    /// the same text as `upsc` takes and `upsmon.conf`'s MONITOR line holds.
    #[schemars(length(min = 3, max = 512))]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_.-]+@[^@\s:]+(:[0-9]{1,5})?$"))]
    pub name: String,

    /// A Secret in the Group's namespace with the keys `username` and `password` of an
    /// `upsd.users` account. Absent: the server is read without logging in (most allow
    /// reading variables so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,

    /// How often the UPS is read. Go duration syntax; default `5s`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub poll_interval: Option<Duration>,

    /// What the pool does while the UPS runs on battery.
    #[serde(default)]
    pub on_battery: OnBattery,

    /// How the pool comes back once mains returns.
    #[serde(default)]
    pub on_mains: OnMains,
}

/// On battery nothing of the pool boots (but a pin that says `bootOnBattery`). Machines are
/// shed down to `keep` once any of the thresholds is crossed, and every machine goes on low
/// battery.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OnBattery {
    /// Shed once the UPS has run on battery this long. Go duration syntax; default `5m`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub shed_after: Option<Duration>,

    /// Shed as soon as the battery's charge (`battery.charge`, in percent) is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub shed_below_charge: Option<i32>,

    /// Shed as soon as the runtime the UPS estimates (`battery.runtime`) is below this.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub shed_below_runtime: Option<Duration>,

    /// How many of the pool's powered machines shedding keeps on (low battery sheds them too).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub keep: i32,
}

/// After an outage, the pool's boots come back a few at a time: a whole pool powering on at
/// once draws the inrush of every power supply together, on a circuit that just came back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OnMains {
    /// The most machines of the pool booting at once (claims pending or booting) while the
    /// return lasts. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub boots_at_once: Option<i32>,

    /// How long after mains returns the limit holds. Go duration syntax; default `10m`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::duration::deserialize_option"
    )]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub stagger_for: Option<Duration>,
}

/// Where the pool's power comes from, as its UPS last said.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum PowerSource {
    /// The UPS is on line power (`OL`).
    #[default]
    Mains,
    /// The UPS runs on its battery (`OB`).
    Battery,
    /// The UPS runs on a battery it reports low (`LB`): it shuts down soon.
    LowBattery,
    /// The UPS could not be read: nothing is shed on a missing reading, and boots go on.
    Unread,
}

/// What the operator read of a pool's UPS (`status.power`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupPowerStatus {
    /// The UPS read (`spec.ups.name`).
    pub ups: String,
    /// Mains, Battery, LowBattery or Unread.
    pub source: PowerSource,
    /// One line for `kubectl get hgroup`: `mains`, `battery 73%, 18m`, `unread since 10:02:03`.
    pub summary: String,
    /// Since when `source` holds (for Unread: since when the UPS has not been read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// When the UPS went on battery, while the pool counts the outage (kept across a moment
    /// unread, so a lost reading does not restart the shedding delay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_battery_since: Option<Time>,
    /// When mains returned after an outage, while the staggered return lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mains_returned_at: Option<Time>,
    /// When the UPS was last read. Brought up to date at least every minute while the reading
    /// stays the same, so a stale status shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<Time>,
    /// The UPS's own status flags (`ups.status`), such as `OB DISCHRG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ups_status: Option<String>,
    /// `battery.charge`, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_percent: Option<f64>,
    /// `battery.runtime`, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_seconds: Option<i64>,
    /// `ups.load`, in percent of the UPS's capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_percent: Option<f64>,
    /// The draw the pool's powered machines account for, from their meters or declared watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_watts: Option<f64>,
    /// What the pool does about it, or why the UPS is unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
