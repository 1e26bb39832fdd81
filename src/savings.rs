//! The savings report's arithmetic (pure: no I/O, no clock). A pool's report is brought up to
//! date in steps: each step charges the time since the last one to the slots that were drawing
//! power at the last one (as on) and to every other slot still in the pool (as off), at each
//! slot's hourly rate. The cost is the on-hours priced; the always-on cost prices on- and
//! off-hours alike, as if no machine had ever been switched off; the saving is the difference.
//! Energy is counted the same way from each slot's draw: the draw its plug's meter read at the
//! last step where there is a fresh reading, else its declared watts (a powered slot draws its
//! `whenOn`, an off one its `whenOff`); the always-on baseline is the on-draw for every slot.
//! Each step is priced at the tariff in force when it is charged. docs/operations.md works both
//! through.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::GroupSavings;

/// One slot of the pool as the group controller sees it now.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotSample {
    pub name: String,
    /// Drawing power: booting, ready, draining, or observed on.
    pub powered: bool,
    /// What one hour of the machine costs (the slot's pricing, else the pool's, else 0).
    pub hourly_rate: f64,
    /// The draw on and off, in watts: on as the meter read it while the slot was ready, else as
    /// declared; off as declared. `None` for a slot whose on-draw is not known.
    pub watts: Option<Watts>,
    /// The draw the slot's meter reads now, if it has a fresh reading.
    pub measured_watts: Option<f64>,
}

/// A slot's draw in watts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Watts {
    pub on: f64,
    pub off: f64,
}

/// The names of the slots that declare no watts, sorted.
fn without_watts(slots: &[SlotSample]) -> Vec<String> {
    let mut names: Vec<String> =
        slots.iter().filter(|s| s.watts.is_none()).map(|s| s.name.clone()).collect();
    names.sort();
    names
}

/// Stored amounts are rounded to this many decimals, so the status reads cleanly; the error
/// it adds is under a millisecond and a millionth of a currency unit per step.
const DECIMALS: i32 = 6;

fn round(value: f64) -> f64 {
    let scale = 10f64.powi(DECIMALS);
    (value * scale).round() / scale
}

/// The fresh meter readings of the slots whose draw is known, by slot.
fn measured(slots: &[SlotSample]) -> BTreeMap<String, f64> {
    slots
        .iter()
        .filter(|s| s.watts.is_some())
        .filter_map(|s| Some((s.name.clone(), s.measured_watts?)))
        .collect()
}

/// The powered slots' names, sorted, as the report stores them.
fn powered_names(slots: &[SlotSample]) -> Vec<String> {
    let mut names: Vec<String> =
        slots.iter().filter(|s| s.powered).map(|s| s.name.clone()).collect();
    names.sort();
    names
}

/// Brings `previous` up to `now` (or starts a report at `now`). A slot that left the pool is no
/// longer charged; a slot that joined is charged from the step it was first seen in. A clock
/// that went backwards charges nothing.
/// `price_per_kwh` is the pool's tariff now (0 without one): it prices this step only.
pub fn accrue(
    previous: Option<&GroupSavings>,
    slots: &[SlotSample],
    price_per_kwh: f64,
    now: Timestamp,
) -> GroupSavings {
    let Some(previous) = previous else {
        return GroupSavings {
            since: Time(now),
            observed_at: Time(now),
            powered: powered_names(slots),
            machine_hours_on: 0.0,
            machine_hours_off: 0.0,
            cost: 0.0,
            always_on_cost: 0.0,
            saved: 0.0,
            energy_used_kwh: 0.0,
            energy_saved_kwh: 0.0,
            energy_cost: 0.0,
            energy_saved_cost: 0.0,
            slots_without_watts: without_watts(slots),
            measured_watts: measured(slots),
        };
    };
    let elapsed = now.duration_since(previous.observed_at.0).as_secs_f64();
    let hours = if elapsed > 0.0 { elapsed / 3600.0 } else { 0.0 };
    let (mut on, mut off, mut cost, mut always_on) = (0.0, 0.0, 0.0, 0.0);
    let (mut used_kwh, mut baseline_kwh) = (0.0, 0.0);
    for slot in slots {
        let was_on = previous.powered.contains(&slot.name);
        if was_on {
            on += hours;
            cost += hours * slot.hourly_rate;
        } else {
            off += hours;
        }
        always_on += hours * slot.hourly_rate;
        if let Some(watts) = slot.watts {
            let declared = if was_on { watts.on } else { watts.off };
            let draw = previous.measured_watts.get(&slot.name).copied().unwrap_or(declared);
            used_kwh += hours * draw / 1000.0;
            baseline_kwh += hours * watts.on / 1000.0;
        }
    }
    let saved_kwh = baseline_kwh - used_kwh;
    let cost = round(previous.cost + cost);
    let always_on_cost = round(previous.always_on_cost + always_on);
    GroupSavings {
        since: previous.since.clone(),
        observed_at: if elapsed > 0.0 { Time(now) } else { previous.observed_at.clone() },
        powered: powered_names(slots),
        machine_hours_on: round(previous.machine_hours_on + on),
        machine_hours_off: round(previous.machine_hours_off + off),
        cost,
        always_on_cost,
        saved: round(always_on_cost - cost),
        energy_used_kwh: round(previous.energy_used_kwh + used_kwh),
        energy_saved_kwh: round(previous.energy_saved_kwh + saved_kwh),
        energy_cost: round(previous.energy_cost + used_kwh * price_per_kwh),
        energy_saved_cost: round(previous.energy_saved_cost + saved_kwh * price_per_kwh),
        slots_without_watts: without_watts(slots),
        measured_watts: measured(slots),
    }
}

/// Whether the report should be written now: there is none yet, the set of powered slots or of
/// slots counted from a reading changed (the step must end where the power or its source did),
/// or `every` has passed since the last step.
pub fn due(
    previous: Option<&GroupSavings>,
    slots: &[SlotSample],
    now: Timestamp,
    every: std::time::Duration,
) -> bool {
    let Some(previous) = previous else { return true };
    if previous.powered != powered_names(slots)
        || !previous.measured_watts.keys().eq(measured(slots).keys())
    {
        return true;
    }
    now.duration_since(previous.observed_at.0).as_secs_f64() >= every.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn slot(name: &str, powered: bool, hourly_rate: f64) -> SlotSample {
        SlotSample {
            name: name.into(),
            powered,
            hourly_rate,
            watts: Some(Watts { on: 0.0, off: 0.0 }),
            measured_watts: None,
        }
    }

    fn report(
        observed: i64,
        powered: &[&str],
        on: f64,
        off: f64,
        cost: f64,
        always: f64,
    ) -> GroupSavings {
        GroupSavings {
            since: Time(at(0)),
            observed_at: Time(at(observed)),
            powered: powered.iter().map(|s| s.to_string()).collect(),
            machine_hours_on: on,
            machine_hours_off: off,
            cost,
            always_on_cost: always,
            saved: round(always - cost),
            energy_used_kwh: 0.0,
            energy_saved_kwh: 0.0,
            energy_cost: 0.0,
            energy_saved_cost: 0.0,
            slots_without_watts: Vec::new(),
            measured_watts: BTreeMap::new(),
        }
    }

    #[test]
    fn accrual_table() {
        let server = |p| slot("server", p, 0.30);
        let mini = |p| slot("mini", p, 0.02);
        #[allow(clippy::type_complexity)]
        let table: [(&str, Option<GroupSavings>, Vec<SlotSample>, i64, GroupSavings); 7] = [
            (
                "the first sight starts an empty report",
                None,
                vec![server(true), mini(false)],
                0,
                report(0, &["server"], 0.0, 0.0, 0.0, 0.0),
            ),
            (
                "an hour charges the powered slot as on, the other as off",
                Some(report(0, &["server"], 0.0, 0.0, 0.0, 0.0)),
                vec![server(true), mini(false)],
                3600,
                report(3600, &["server"], 1.0, 1.0, 0.30, 0.32),
            ),
            (
                "the step is charged to the slots powered at its start, not at its end",
                Some(report(0, &[], 0.0, 0.0, 0.0, 0.0)),
                vec![server(true), mini(true)],
                1800,
                report(1800, &["mini", "server"], 0.0, 1.0, 0.0, 0.16),
            ),
            (
                "a pool all off saves everything",
                Some(report(0, &[], 0.0, 0.0, 0.0, 0.0)),
                vec![server(false), mini(false)],
                7200,
                report(7200, &[], 0.0, 4.0, 0.0, 0.64),
            ),
            (
                "a slot that left the pool is not charged",
                Some(report(0, &["gone", "mini"], 0.0, 0.0, 0.0, 0.0)),
                vec![mini(true)],
                3600,
                report(3600, &["mini"], 1.0, 0.0, 0.02, 0.02),
            ),
            (
                "a slot without pricing counts hours and costs nothing",
                Some(report(0, &["free"], 0.0, 0.0, 0.0, 0.0)),
                vec![slot("free", true, 0.0)],
                3600,
                report(3600, &["free"], 1.0, 0.0, 0.0, 0.0),
            ),
            (
                "a clock that went backwards charges nothing and keeps the last step's time",
                Some(report(100, &["server"], 1.0, 0.0, 0.30, 0.30)),
                vec![server(true)],
                50,
                report(100, &["server"], 1.0, 0.0, 0.30, 0.30),
            ),
        ];
        for (case, previous, slots, now, want) in table {
            assert_eq!(accrue(previous.as_ref(), &slots, 0.0, at(now)), want, "{case}");
        }
    }

    #[test]
    fn steps_add_up_to_the_worked_example() {
        // docs/operations.md: a server at 0.30/h and two minis at 0.02/h over one day. The
        // server runs 2 h, one mini 8 h, the other never.
        let mut report = accrue(None, &[], 0.0, at(0));
        let plan = [
            (0, ["server", "mini-a"].as_slice()),
            (2 * 3600, ["mini-a"].as_slice()),
            (8 * 3600, [].as_slice()),
            (24 * 3600, [].as_slice()),
        ];
        for (seconds, powered) in plan {
            let slots: Vec<SlotSample> = [("server", 0.30), ("mini-a", 0.02), ("mini-b", 0.02)]
                .into_iter()
                .map(|(name, rate)| slot(name, powered.contains(&name), rate))
                .collect();
            report = accrue(Some(&report), &slots, 0.0, at(seconds));
        }
        assert_eq!(report.machine_hours_on, 10.0);
        assert_eq!(report.machine_hours_off, 62.0);
        assert_eq!(report.cost, 0.76);
        assert_eq!(report.always_on_cost, 8.16);
        assert_eq!(report.saved, 7.4);
    }

    /// A UTC instant from a civil date and hour.
    fn utc(date: &str) -> Timestamp {
        date.parse().unwrap()
    }

    fn metered(name: &str, powered: bool, on: f64, off: f64) -> SlotSample {
        SlotSample {
            name: name.into(),
            powered,
            hourly_rate: 0.0,
            watts: Some(Watts { on, off }),
            measured_watts: None,
        }
    }

    /// Runs `plan` (instant, powered slots, tariff) through `accrue` over the slots `watts`
    /// declares, and returns (kWh used, kWh saved, energy cost, energy saved cost).
    fn energy_of(
        watts: &[(&str, f64, f64)],
        plan: &[(&str, &[&str], f64)],
    ) -> (f64, f64, f64, f64) {
        let mut report: Option<GroupSavings> = None;
        for (when, powered, price) in plan {
            let slots: Vec<SlotSample> = watts
                .iter()
                .map(|(name, on, off)| metered(name, powered.contains(name), *on, *off))
                .collect();
            report = Some(accrue(report.as_ref(), &slots, *price, utc(when)));
        }
        let r = report.unwrap();
        (r.energy_used_kwh, r.energy_saved_kwh, r.energy_cost, r.energy_saved_cost)
    }

    #[test]
    fn energy_table() {
        // A server of 95 W on and 4 W off, a mini of 12 W on and 0 W off.
        let pool = [("server", 95.0, 4.0), ("mini", 12.0, 0.0)];
        #[allow(clippy::type_complexity)]
        let table: [(&str, Vec<(&str, &[&str], f64)>, (f64, f64, f64, f64)); 6] = [
            (
                "an hour on draws whenOn and saves nothing",
                vec![
                    ("2026-03-10T10:00Z", &["server"], 0.32),
                    ("2026-03-10T11:00Z", &["server"], 0.32),
                ],
                // the mini, off, draws 0 and saves its 12 Wh
                (0.095, 0.012, 0.0304, 0.00384),
            ),
            (
                "an hour off draws the standby and saves the rest",
                vec![("2026-03-10T10:00Z", &[], 0.32), ("2026-03-10T11:00Z", &[], 0.32)],
                (0.004, 0.103, 0.00128, 0.03296),
            ),
            (
                "a step across a month boundary is charged whole",
                vec![("2026-01-31T23:00Z", &[], 0.30), ("2026-02-01T01:00Z", &[], 0.30)],
                (0.008, 0.206, 0.0024, 0.0618),
            ),
            (
                "each step is priced at the tariff read when it is charged; earlier cost stays",
                vec![
                    ("2026-03-10T00:00Z", &[], 0.30),
                    ("2026-03-10T10:00Z", &[], 0.30),
                    // the pool's tariff reads 0.40 when the second step is charged
                    ("2026-03-10T20:00Z", &[], 0.40),
                ],
                // 20 h x 4 W = 0.08 kWh; 10 h at 0.30 and 10 h at 0.40
                (0.08, 2.06, 0.028, 0.721),
            ),
            (
                "a pinned or scheduled hour is powered: it draws whenOn and saves nothing",
                vec![
                    ("2026-03-10T08:00Z", &["server", "mini"], 0.32),
                    ("2026-03-10T09:00Z", &["server", "mini"], 0.32),
                ],
                (0.107, 0.0, 0.03424, 0.0),
            ),
            (
                "without a tariff the energy counts and costs nothing",
                vec![("2026-03-10T10:00Z", &["mini"], 0.0), ("2026-03-10T12:00Z", &["mini"], 0.0)],
                (0.032, 0.182, 0.0, 0.0),
            ),
        ];
        for (case, plan, want) in table {
            assert_eq!(energy_of(&pool, &plan), want, "{case}");
        }
    }

    #[test]
    fn energy_adds_up_to_the_worked_example() {
        // docs/operations.md: the server at 95 W on, 4 W off; the minis at 12 W on, 0.5 W off;
        // 0.32 per kWh; the day of the cost example.
        let pool = [("server", 95.0, 4.0), ("mini-a", 12.0, 0.5), ("mini-b", 12.0, 0.5)];
        let plan: [(&str, &[&str], f64); 4] = [
            ("2026-12-01T00:00Z", &["server", "mini-a"], 0.32),
            ("2026-12-01T02:00Z", &["mini-a"], 0.32),
            ("2026-12-01T08:00Z", &[], 0.32),
            ("2026-12-02T00:00Z", &[], 0.32),
        ];
        assert_eq!(energy_of(&pool, &plan), (0.394, 2.462, 0.12608, 0.78784));
    }

    #[test]
    fn a_slot_without_watts_counts_no_energy_and_is_named() {
        let slots = [
            metered("server", true, 95.0, 4.0),
            SlotSample {
                name: "bare".into(),
                powered: true,
                hourly_rate: 0.1,
                watts: None,
                measured_watts: Some(40.0),
            },
        ];
        let start = accrue(None, &slots, 0.3, at(0));
        assert_eq!(start.slots_without_watts, vec!["bare".to_string()]);
        let hour = accrue(Some(&start), &slots, 0.3, at(3600));
        assert_eq!((hour.energy_used_kwh, hour.cost), (0.095, 0.1));
        assert_eq!(hour.slots_without_watts, vec!["bare".to_string()]);
        assert!(hour.measured_watts.is_empty(), "a reading without an on-draw counts nothing");
    }

    /// A step of one slot: hours from the start, its on/off draw if known, powered, its fresh
    /// reading.
    type Step = (i64, Option<(f64, f64)>, bool, Option<f64>);

    /// One slot through `steps`; returns (kWh used, kWh saved, the readings the last report
    /// holds).
    fn measured_energy(steps: &[Step]) -> (f64, f64, BTreeMap<String, f64>) {
        let mut report: Option<GroupSavings> = None;
        for (hour, watts, powered, reading) in steps {
            let slot = SlotSample {
                name: "server".into(),
                powered: *powered,
                hourly_rate: 0.0,
                watts: watts.map(|(on, off)| Watts { on, off }),
                measured_watts: *reading,
            };
            report = Some(accrue(report.as_ref(), &[slot], 0.0, at(hour * 3600)));
        }
        let r = report.unwrap();
        (r.energy_used_kwh, r.energy_saved_kwh, r.measured_watts)
    }

    #[test]
    fn measured_draw_table() {
        let declared = Some((95.0, 4.0));
        let read = |w: f64| BTreeMap::from([("server".to_string(), w)]);
        let table: [(&str, Vec<Step>, _); 5] = [
            (
                "a fresh reading is charged instead of the declared draw",
                vec![(0, declared, true, Some(80.0)), (1, declared, true, Some(80.0))],
                (0.08, 0.015, read(80.0)),
            ),
            (
                "without a fresh reading the declared draw counts",
                vec![(0, declared, true, None), (1, declared, true, None)],
                (0.095, 0.0, BTreeMap::new()),
            ),
            (
                "a step is charged at the reading taken at its start",
                vec![
                    (0, declared, true, Some(80.0)),
                    (1, declared, false, Some(3.0)),
                    (2, declared, false, Some(3.0)),
                ],
                // 80 Wh, then 3 Wh, against 2 x 95 Wh always on
                (0.083, 0.107, read(3.0)),
            ),
            (
                "a slot that declares nothing counts once its meter read it ready",
                vec![(0, Some((90.0, 0.0)), false, Some(2.0)), (1, Some((90.0, 0.0)), false, None)],
                (0.002, 0.088, BTreeMap::new()),
            ),
            (
                "a reading that stops falls back to the declared standby",
                vec![
                    (0, declared, false, Some(2.5)),
                    (1, declared, false, None),
                    (2, declared, false, None),
                ],
                (0.0065, 0.1835, BTreeMap::new()),
            ),
        ];
        for (case, steps, want) in table {
            assert_eq!(measured_energy(&steps), want, "{case}");
        }
    }

    #[test]
    fn due_table() {
        let every = std::time::Duration::from_secs(60);
        let last = report(0, &["server"], 0.0, 0.0, 0.0, 0.0);
        let table = [
            ("no report yet", None, vec![slot("server", true, 0.3)], 0, true),
            ("nothing changed, too soon", Some(&last), vec![slot("server", true, 0.3)], 30, false),
            (
                "nothing changed, a minute passed",
                Some(&last),
                vec![slot("server", true, 0.3)],
                60,
                true,
            ),
            ("the power changed", Some(&last), vec![slot("server", false, 0.3)], 1, true),
            (
                "a meter started answering",
                Some(&last),
                vec![SlotSample { measured_watts: Some(90.0), ..slot("server", true, 0.3) }],
                1,
                true,
            ),
        ];
        for (case, previous, slots, now, want) in table {
            assert_eq!(due(previous, &slots, at(now), every), want, "{case}");
        }
    }
}
