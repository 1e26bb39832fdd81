//! Which machines a pool sheds on battery, and in which order (docs/decisions.md, D42).
//!
//! Shedding starts once the outage has lasted `onBattery.shedAfter` (default 5m) or the charge
//! or runtime falls below its threshold, and keeps `onBattery.keep` machines on. The first to go
//! are the cheapest to lose: no data before data, no pin before a pin, the highest draw first.
//! A data machine goes only once no other machine of the pool is still on its way off, so the
//! storage sees one loss at a time and the machines without data have freed their share of the
//! battery first; the slot's power-off gates still decide when it actually powers off. A pin
//! that says `bootOnBattery` is kept. On low battery every machine goes, those too: the UPS
//! shuts down soon, and a clean power-off beats losing power.

use jiff::{SignedDuration, Timestamp};

use crate::api::{GroupPowerStatus, OnBattery, PowerSource};

/// Who a claim released by shedding says asked for its scale-down, before the UPS and the why.
/// A machine shed is powered off, never suspended: asleep it would lose its memory, uncleanly,
/// when the battery runs out (docs/decisions.md, D44).
pub const SHED_BY: &str = "homelab-autoscaler/ups";

/// Whether a claim's scale-down was asked for by shedding.
pub fn shed_by(scale_down_requested_by: Option<&str>) -> bool {
    scale_down_requested_by.is_some_and(|by| by.starts_with(SHED_BY))
}

/// Shedding starts after this long on battery unless the pool says.
pub const DEFAULT_SHED_AFTER: SignedDuration = SignedDuration::from_mins(5);

/// A powered machine of the pool, as shedding sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    pub slot: String,
    /// The live claim that keeps it on.
    pub claim: String,
    /// Its running draw (metered, else declared); unknown counts as the least.
    pub watts: Option<f64>,
    /// Some power-off gate of the pool concerns it.
    pub data: bool,
    pub pin: Pin,
    /// Its claim is already being released (by shedding or anyone else).
    pub releasing: bool,
}

/// What holds a machine on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pin {
    /// A scaler's claim.
    None,
    /// A person's or a schedule's pin.
    Pin,
    /// A pin that says `bootOnBattery`.
    BootOnBattery,
}

/// Whether shedding is due.
#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    /// Not on battery, or the reading is missing: nothing is shed.
    No,
    /// On battery, below every threshold yet: what would start it.
    Waiting(String),
    /// Shed down to `keep`, and why.
    Shed(String),
    /// Low battery: everything goes.
    LowBattery,
}

/// Whether the pool sheds now.
pub fn trigger(power: &GroupPowerStatus, policy: &OnBattery, now: Timestamp) -> Trigger {
    match power.source {
        PowerSource::Mains | PowerSource::Unread => return Trigger::No,
        PowerSource::LowBattery => return Trigger::LowBattery,
        PowerSource::Battery => {}
    }
    let after = policy
        .shed_after
        .and_then(|d| SignedDuration::try_from(std::time::Duration::from(d)).ok())
        .unwrap_or(DEFAULT_SHED_AFTER);
    let since = power.on_battery_since.as_ref().map_or(now, |t| t.0);
    let on_battery_for = now.duration_since(since);
    if on_battery_for >= after {
        return Trigger::Shed(format!("on battery for {}", minutes(on_battery_for)));
    }
    if let (Some(charge), Some(below)) = (power.charge_percent, policy.shed_below_charge)
        && charge < f64::from(below)
    {
        return Trigger::Shed(format!("charge {charge:.0}% is below {below}%"));
    }
    let below_runtime = policy
        .shed_below_runtime
        .and_then(|d| i64::try_from(std::time::Duration::from(d).as_secs()).ok());
    if let (Some(runtime), Some(below)) = (power.runtime_seconds, below_runtime)
        && runtime < below
    {
        return Trigger::Shed(format!("runtime {}m is below {}m", runtime / 60, below / 60));
    }
    let mut waits = vec![format!("in {}", minutes(after - on_battery_for))];
    if let Some(below) = policy.shed_below_charge {
        waits.push(format!("below {below}% charge"));
    }
    if let Some(below) = below_runtime {
        waits.push(format!("below {}m runtime", below / 60));
    }
    Trigger::Waiting(format!("sheds {}", waits.join(" or ")))
}

/// One machine to shed, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Shed {
    pub slot: String,
    pub claim: String,
    pub why: String,
}

/// The machines to release now.
pub fn plan(trigger: &Trigger, keep: i32, machines: &[Machine]) -> Vec<Shed> {
    let (why, everything) = match trigger {
        Trigger::No | Trigger::Waiting(_) => return Vec::new(),
        Trigger::Shed(why) => (why.as_str(), false),
        Trigger::LowBattery => ("the UPS reports a low battery", true),
    };
    let powered: Vec<&Machine> = machines.iter().filter(|m| !m.releasing).collect();
    let mut order: Vec<&Machine> =
        powered.iter().copied().filter(|m| everything || m.pin != Pin::BootOnBattery).collect();
    order.sort_by(|a, b| {
        (a.data, a.pin)
            .cmp(&(b.data, b.pin))
            .then(b.watts.unwrap_or(0.0).total_cmp(&a.watts.unwrap_or(0.0)))
            .then(a.slot.cmp(&b.slot))
    });
    let excess = if everything {
        order.len()
    } else {
        powered.len().saturating_sub(usize::try_from(keep.max(0)).unwrap_or(usize::MAX))
    };
    let chosen = &order[..excess.min(order.len())];
    // One data machine at a time: none while any machine is on its way off, and only the
    // first of them in a pass where nothing else goes.
    let mut data_turn = !(machines.iter().any(|m| m.releasing) || chosen.iter().any(|m| !m.data));
    chosen
        .iter()
        .filter(|m| everything || !m.data || std::mem::take(&mut data_turn))
        .map(|m| Shed {
            slot: m.slot.clone(),
            claim: m.claim.clone(),
            why: format!("{why}: {}", rank_reason(m, everything, keep)),
        })
        .collect()
}

fn rank_reason(machine: &Machine, everything: bool, keep: i32) -> String {
    if everything {
        return "every machine that may go goes".to_owned();
    }
    let draw = machine.watts.map_or_else(|| "unknown draw".to_owned(), |w| format!("{w:.0} W"));
    let kind = match (machine.data, machine.pin) {
        (false, Pin::None) => "no data, no pin",
        (false, _) => "a pin, no data",
        (true, Pin::None) => "a data machine, after the others",
        (true, _) => "a pinned data machine, after the others",
    };
    format!("{kind}, {draw}; the pool keeps {keep}")
}

fn minutes(d: SignedDuration) -> String {
    let secs = d.as_secs().max(0);
    if secs >= 60 { format!("{}m{}s", secs / 60, secs % 60) } else { format!("{secs}s") }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    fn machine(slot: &str, watts: Option<f64>, data: bool, pin: Pin) -> Machine {
        Machine {
            slot: slot.into(),
            claim: format!("{slot}-claim"),
            watts,
            data,
            pin,
            releasing: false,
        }
    }

    fn battery(since: &str, charge: f64, runtime: i64) -> GroupPowerStatus {
        GroupPowerStatus {
            source: PowerSource::Battery,
            on_battery_since: Some(Time(at(since))),
            charge_percent: Some(charge),
            runtime_seconds: Some(runtime),
            ..GroupPowerStatus::default()
        }
    }

    fn slots(shed: &[Shed]) -> Vec<&str> {
        shed.iter().map(|s| s.slot.as_str()).collect()
    }

    #[test]
    fn shedding_starts_after_the_delay_or_below_a_threshold() {
        let policy = OnBattery {
            shed_after: Some(std::time::Duration::from_secs(300).into()),
            shed_below_charge: Some(50),
            shed_below_runtime: Some(std::time::Duration::from_secs(600).into()),
            keep: 0,
        };
        let now = at("2026-12-06T10:04:00Z");
        let cases: [(GroupPowerStatus, &str); 6] = [
            (battery("2026-12-06T10:00:00Z", 90.0, 1800), "Waiting"),
            (battery("2026-12-06T09:59:00Z", 90.0, 1800), "Shed on battery for 5m0s"),
            (battery("2026-12-06T10:00:00Z", 49.0, 1800), "Shed charge 49% is below 50%"),
            (battery("2026-12-06T10:00:00Z", 90.0, 540), "Shed runtime 9m is below 10m"),
            (
                GroupPowerStatus {
                    source: PowerSource::LowBattery,
                    ..battery("2026-12-06T10:00:00Z", 90.0, 1800)
                },
                "LowBattery",
            ),
            (
                GroupPowerStatus {
                    source: PowerSource::Unread,
                    ..battery("2026-12-06T09:00:00Z", 1.0, 1)
                },
                "No",
            ),
        ];
        for (power, expected) in cases {
            let got = match trigger(&power, &policy, now) {
                Trigger::No => "No".to_owned(),
                Trigger::Waiting(w) => {
                    assert_eq!(w, "sheds in 1m0s or below 50% charge or below 10m runtime");
                    "Waiting".to_owned()
                }
                Trigger::Shed(why) => format!("Shed {why}"),
                Trigger::LowBattery => "LowBattery".to_owned(),
            };
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn the_cheapest_to_lose_go_first_and_the_floor_stays() {
        let machines = [
            machine("nas", Some(60.0), true, Pin::None),
            machine("gpu", Some(300.0), false, Pin::None),
            machine("mini", Some(15.0), false, Pin::None),
            machine("desk", Some(120.0), false, Pin::Pin),
            machine("router", Some(10.0), false, Pin::BootOnBattery),
        ];
        let shed = Trigger::Shed("on battery for 5m0s".into());
        assert_eq!(slots(&plan(&shed, 3, &machines)), ["gpu", "mini"], "5 powered, keep 3");
        assert_eq!(slots(&plan(&shed, 2, &machines)), ["gpu", "mini", "desk"], "a pin after them");
        assert_eq!(
            slots(&plan(&shed, 0, &machines)),
            ["gpu", "mini", "desk"],
            "the data machine waits for the others; the battery pin stays"
        );
        assert_eq!(slots(&plan(&shed, 5, &machines)), Vec::<&str>::new());
        let others_gone: Vec<Machine> =
            machines.iter().filter(|m| m.slot == "nas" || m.slot == "router").cloned().collect();
        assert_eq!(slots(&plan(&shed, 0, &others_gone)), ["nas"], "then the data machine");
        let mut still_going = others_gone.clone();
        still_going
            .push(Machine { releasing: true, ..machine("gpu", Some(300.0), false, Pin::None) });
        assert_eq!(
            slots(&plan(&shed, 0, &still_going)),
            Vec::<&str>::new(),
            "not while one is still going"
        );
        assert_eq!(
            slots(&plan(&Trigger::LowBattery, 3, &machines)),
            ["gpu", "mini", "desk", "router", "nas"],
            "low battery: everything, the floor and the battery pin too"
        );
        assert!(plan(&Trigger::Waiting("x".into()), 0, &machines).is_empty());
        let why = &plan(&shed, 4, &machines)[0].why;
        assert_eq!(why, "on battery for 5m0s: no data, no pin, 300 W; the pool keeps 4");
    }

    #[test]
    fn data_machines_go_one_at_a_time() {
        let data = [
            machine("nas-1", Some(40.0), true, Pin::None),
            machine("nas-2", Some(60.0), true, Pin::None),
        ];
        let shed = Trigger::Shed("x".into());
        assert_eq!(slots(&plan(&shed, 0, &data)), ["nas-2"], "one, the higher draw");
        let one_going = [Machine { releasing: true, ..data[1].clone() }, data[0].clone()];
        assert!(plan(&shed, 0, &one_going).is_empty(), "not while the first is going");
        assert_eq!(slots(&plan(&Trigger::LowBattery, 0, &data)), ["nas-2", "nas-1"]);
    }

    #[test]
    fn unknown_draw_counts_as_the_least() {
        let machines =
            [machine("a", None, false, Pin::None), machine("b", Some(5.0), false, Pin::None)];
        assert_eq!(slots(&plan(&Trigger::Shed("x".into()), 1, &machines)), ["b"]);
    }
}
