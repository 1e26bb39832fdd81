//! The savings report's arithmetic (pure: no I/O, no clock). A pool's report is brought up to
//! date in steps: each step charges the time since the last one to the slots that were drawing
//! power at the last one (as on) and to every other slot still in the pool (as off), at each
//! slot's hourly rate. The cost is the on-hours priced; the always-on cost prices on- and
//! off-hours alike, as if no machine had ever been switched off; the saving is the difference.
//! docs/operations.md works one example through.

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
}

/// Stored amounts are rounded to this many decimals, so the status reads cleanly; the error
/// it adds is under a millisecond and a millionth of a currency unit per step.
const DECIMALS: i32 = 6;

fn round(value: f64) -> f64 {
    let scale = 10f64.powi(DECIMALS);
    (value * scale).round() / scale
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
pub fn accrue(
    previous: Option<&GroupSavings>,
    slots: &[SlotSample],
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
        };
    };
    let elapsed = now.duration_since(previous.observed_at.0).as_secs_f64();
    let hours = if elapsed > 0.0 { elapsed / 3600.0 } else { 0.0 };
    let (mut on, mut off, mut cost, mut always_on) = (0.0, 0.0, 0.0, 0.0);
    for slot in slots {
        if previous.powered.contains(&slot.name) {
            on += hours;
            cost += hours * slot.hourly_rate;
        } else {
            off += hours;
        }
        always_on += hours * slot.hourly_rate;
    }
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
    }
}

/// Whether the report should be written now: there is none yet, the set of powered slots
/// changed (the step must end where the power did), or `every` has passed since the last step.
pub fn due(
    previous: Option<&GroupSavings>,
    slots: &[SlotSample],
    now: Timestamp,
    every: std::time::Duration,
) -> bool {
    let Some(previous) = previous else { return true };
    if previous.powered != powered_names(slots) {
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
        SlotSample { name: name.into(), powered, hourly_rate }
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
            assert_eq!(accrue(previous.as_ref(), &slots, at(now)), want, "{case}");
        }
    }

    #[test]
    fn steps_add_up_to_the_worked_example() {
        // docs/operations.md: a server at 0.30/h and two minis at 0.02/h over one day. The
        // server runs 2 h, one mini 8 h, the other never.
        let mut report = accrue(None, &[], at(0));
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
            report = accrue(Some(&report), &slots, at(seconds));
        }
        assert_eq!(report.machine_hours_on, 10.0);
        assert_eq!(report.machine_hours_off, 62.0);
        assert_eq!(report.cost, 0.76);
        assert_eq!(report.always_on_cost, 8.16);
        assert_eq!(report.saved, 7.4);
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
        ];
        for (case, previous, slots, now, want) in table {
            assert_eq!(due(previous, &slots, at(now), every), want, "{case}");
        }
    }
}
