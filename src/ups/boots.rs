//! Whether a pool may boot a machine now, judged from its `status.power`: nothing boots on
//! battery but a pin that says `bootOnBattery`, and for a while after mains returns at most
//! `onMains.bootsAtOnce` machines boot at once. A status nobody has brought up to date for
//! [`STALE_AFTER`] is not trusted: a pool never stays stranded because its reader stopped.

use jiff::{SignedDuration, Timestamp};

use super::power_status::summary;
use crate::api::{Group, PowerSource};

/// How old a reading may be and still refuse a boot: three heartbeats.
pub const STALE_AFTER: SignedDuration = SignedDuration::from_mins(3);

/// Why a pool on battery boots nothing, in a sentence for the refusal; `None` when it may.
pub fn battery_refusal(group: &Group, boot_on_battery: bool, now: Timestamp) -> Option<String> {
    let policy = group.spec.ups.as_ref()?;
    let power = group.status.as_ref()?.power.as_ref()?;
    if boot_on_battery || power.ups != policy.name {
        return None;
    }
    let fresh = power.read_at.as_ref().is_some_and(|at| now.duration_since(at.0) <= STALE_AFTER);
    if !fresh || !matches!(power.source, PowerSource::Battery | PowerSource::LowBattery) {
        return None;
    }
    let name = group.metadata.name.as_deref().unwrap_or_default();
    Some(format!(
        "group {name:?} runs on battery ({}: {}), so none of its machines boots until mains \
         returns; a machine that must boot on battery is pinned with spec.bootOnBattery: true",
        power.ups,
        summary(power),
    ))
}

/// Whether the pool's power may hold its boots now (on battery, or returning from an outage):
/// a quick look at its status, before anything is counted.
pub fn may_hold_boots(group: &Group, now: Timestamp) -> bool {
    let Some(power) = group.status.as_ref().and_then(|s| s.power.as_ref()) else { return false };
    group.spec.ups.is_some()
        && (battery_refusal(group, false, now).is_some() || power.mains_returned_at.is_some())
}

/// How many more machines may start booting while the pool's return from an outage is
/// staggered, given `booting` claims not yet ready; `None`: no limit now.
pub fn stagger_room(group: &Group, booting: i32, now: Timestamp) -> Option<Stagger> {
    let policy = group.spec.ups.as_ref()?;
    let power = group.status.as_ref()?.power.as_ref()?;
    let returned = power.mains_returned_at.as_ref()?.0;
    if power.ups != policy.name
        || power.source != PowerSource::Mains
        || now >= returned + super::power_status::stagger_for(policy)
    {
        return None;
    }
    let at_once = policy.on_mains.boots_at_once.unwrap_or(1).max(1);
    Some(Stagger {
        room: (at_once - booting.max(0)).max(0),
        at_once,
        until: returned + super::power_status::stagger_for(policy),
    })
}

/// What holds a pool's boots now, and how many machines may still start booting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootRoom {
    pub room: i32,
    pub limit: Limit,
}

/// Why a pool's boots are held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// On battery: none, and the sentence that says so.
    OnBattery(String),
    /// Back from an outage: a few at a time.
    Staggered(Stagger),
}

/// The one rule both entry points of a boot follow (the provider's IncreaseSize and the
/// maximum cluster-autoscaler is told): none on battery, the stagger's room on the return;
/// `None`: no limit now. `booting` counts the pool's claims not yet ready.
pub fn boot_room(group: &Group, booting: i32, now: Timestamp) -> Option<BootRoom> {
    if let Some(why) = battery_refusal(group, false, now) {
        return Some(BootRoom { room: 0, limit: Limit::OnBattery(why) });
    }
    stagger_room(group, booting, now).map(|s| BootRoom { room: s.room, limit: Limit::Staggered(s) })
}

/// The staggered return's limit at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stagger {
    /// Machines that may start booting now.
    pub room: i32,
    /// The pool's `onMains.bootsAtOnce`.
    pub at_once: i32,
    /// When the limit ends.
    pub until: Timestamp,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::{GroupPowerStatus, GroupStatus, OnMains, UpsPolicy};
    use crate::fixtures;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    fn pool(source: PowerSource, read_at: &str, returned: Option<&str>) -> Group {
        let mut group = fixtures::group("rack");
        group.spec.ups = Some(UpsPolicy {
            name: "ups@nut:3493".into(),
            credentials_secret: None,
            poll_interval: None,
            on_battery: Default::default(),
            on_mains: OnMains { boots_at_once: Some(2), stagger_for: None },
        });
        group.status = Some(GroupStatus {
            power: Some(GroupPowerStatus {
                ups: "ups@nut:3493".into(),
                source,
                read_at: Some(Time(at(read_at))),
                mains_returned_at: returned.map(|r| Time(at(r))),
                charge_percent: Some(73.0),
                runtime_seconds: Some(1080),
                ..GroupPowerStatus::default()
            }),
            ..GroupStatus::default()
        });
        group
    }

    #[test]
    fn a_pool_on_battery_boots_only_a_battery_pin_and_only_on_a_fresh_reading() {
        use PowerSource::*;
        let now = at("2026-12-06T10:05:00Z");
        let cases = [
            (Mains, "2026-12-06T10:04:59Z", false, false),
            (Battery, "2026-12-06T10:04:59Z", false, true),
            (LowBattery, "2026-12-06T10:04:59Z", false, true),
            (Battery, "2026-12-06T10:04:59Z", true, false),
            (Battery, "2026-12-06T10:02:00Z", false, true),
            (Battery, "2026-12-06T10:01:59Z", false, false),
            (Unread, "2026-12-06T10:04:59Z", false, false),
        ];
        for (source, read_at, pin, refused) in cases {
            let refusal = battery_refusal(&pool(source, read_at, None), pin, now);
            assert_eq!(refusal.is_some(), refused, "{source:?} read {read_at}, battery pin {pin}");
            if let Some(message) = refusal {
                assert!(
                    message.contains("73%, 18m") && message.contains("bootOnBattery"),
                    "{message}"
                );
            }
        }
        let mut unconfigured = pool(Battery, "2026-12-06T10:04:59Z", None);
        unconfigured.spec.ups = None;
        assert_eq!(battery_refusal(&unconfigured, false, now), None, "no spec.ups, no rule");
    }

    #[test]
    fn the_return_lets_at_most_boots_at_once_boot() {
        let group = pool(PowerSource::Mains, "2026-12-06T10:05:00Z", Some("2026-12-06T10:00:00Z"));
        let now = at("2026-12-06T10:05:00Z");
        let room = |booting| stagger_room(&group, booting, now).map(|s| s.room);
        assert_eq!([room(0), room(1), room(2), room(5)], [Some(2), Some(1), Some(0), Some(0)]);
        assert_eq!(stagger_room(&group, 0, at("2026-12-06T10:10:00Z")), None, "the window is over");
        let on_battery =
            pool(PowerSource::Battery, "2026-12-06T10:05:00Z", Some("2026-12-06T10:00:00Z"));
        assert_eq!(stagger_room(&on_battery, 0, now), None, "battery is the other rule's");
    }
}
