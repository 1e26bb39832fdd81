//! Admission of a Group's schedule windows: each window reads (days, times, zone, a minimum of
//! at least one), names no slot twice, asks for no more machines than it may hold, and no two
//! windows can hold the same slot at the same instant.
//!
//! Two windows **overlap** when they share an eligible slot (a window without `slots` may hold
//! any slot of the pool, so it shares with every window) and some instant in the coming year lies
//! within an opening of each (openings are half-open, so one that ends at 18:00 does not overlap
//! one that starts at 18:00). Overlapping windows would each count the other's pins, and which
//! one's claim holds a machine would depend on which came first.

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::verdict::Findings;
use crate::api::ScheduleWindow;
use crate::schedule::{Window, first_shared_instant};

/// Checks `spec.schedules` of a pool with `pool_slots` slots, as of `now`.
pub fn check(
    windows: &[ScheduleWindow],
    pool_slots: usize,
    now: Timestamp,
    findings: &mut Findings,
) {
    let mut read: Vec<(usize, &ScheduleWindow, Window)> = Vec::new();
    for (index, written) in windows.iter().enumerate() {
        let field = format!("spec.schedules[{index}]");
        match Window::parse(written) {
            Ok(window) => read.push((index, written, window)),
            Err(errors) => {
                for error in errors {
                    findings.invalid("schedule_window_reads", format!("{field}.{error}"));
                }
            }
        }
        let named: BTreeSet<&str> = written.slots.iter().map(String::as_str).collect();
        if named.len() != written.slots.len() {
            findings.invalid(
                "schedule_slots_distinct",
                format!("{field}.slots names a slot twice; list each slot once"),
            );
        }
        let eligible = if written.slots.is_empty() { pool_slots } else { named.len() };
        let min = usize::try_from(written.min_machines).unwrap_or(0);
        // A pool with no slot yet is warned about by the group rules; its slots may follow.
        let countable = !written.slots.is_empty() || pool_slots > 0;
        if countable && min > eligible {
            let (what, instead) = if written.slots.is_empty() {
                (
                    format!("the pool has {eligible} slot(s)"),
                    "lower minMachines or add slots labelled with the group",
                )
            } else {
                (format!("slots names {eligible} slot(s)"), "lower minMachines or name more slots")
            };
            findings.invalid(
                "schedule_min_within_slots",
                format!(
                    "{field}.minMachines is {} but {what}; {instead} (minMachines: {eligible} at most)",
                    written.min_machines
                ),
            );
        }
    }
    for (a, (i, wa, first)) in read.iter().enumerate() {
        for (j, wb, second) in read.iter().skip(a + 1) {
            if !share_slots(wa, wb) {
                continue;
            }
            if let Some(at) = first_shared_instant(first, second, now) {
                let local = at.to_zoned(first.zone.clone());
                findings.invalid(
                    "schedule_windows_disjoint",
                    format!(
                        "spec.schedules[{i}] ({}) and spec.schedules[{j}] ({}) are both open at \
                         {} and can hold the same slots; make them one window, move one so they \
                         do not meet (one may end when the other starts), or give them slots \
                         lists with no slot in common",
                        first.label,
                        second.label,
                        local.strftime("%a %Y-%m-%d %H:%M:%S %Z"),
                    ),
                );
            }
        }
    }
}

/// Whether two windows may hold a common slot.
fn share_slots(a: &ScheduleWindow, b: &ScheduleWindow) -> bool {
    a.slots.is_empty() || b.slots.is_empty() || a.slots.iter().any(|s| b.slots.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::window;

    fn messages(windows: &[ScheduleWindow], pool_slots: usize) -> Vec<String> {
        let mut findings = Findings::default();
        check(windows, pool_slots, "2026-12-02T00:00:00Z".parse().unwrap(), &mut findings);
        findings.messages()
    }

    #[test]
    fn schedule_rules_table() {
        let office = window("Mon-Fri", "08:00", "18:00", "Europe/Berlin", 1, &["desktop"]);
        let backup = window("daily", "01:00", "03:00", "Europe/Berlin", 1, &["nas"]);
        let table: Vec<(&str, Vec<ScheduleWindow>, usize, Vec<&str>)> = vec![
            ("a desktop and a backup", vec![office.clone(), backup.clone()], 3, vec![]),
            (
                "bad days, time, zone",
                vec![window("Mon-Fry", "8:00", "25:00", "Berlin", 1, &[])],
                3,
                vec![
                    "spec.schedules[0].days: \"Mon-Fry\" is not a day list",
                    "spec.schedules[0].from: \"8:00\" is not a time of day",
                    "spec.schedules[0].to: \"25:00\" is not a time of day",
                    "spec.schedules[0].timeZone: \"Berlin\" is not an IANA time zone",
                ],
            ),
            (
                "min below one",
                vec![window("daily", "08:00", "09:00", "UTC", 0, &[])],
                3,
                vec!["spec.schedules[0].minMachines: 0 is below 1"],
            ),
            (
                "more machines than the pool has",
                vec![window("daily", "08:00", "09:00", "UTC", 4, &[])],
                3,
                vec![
                    "spec.schedules[0].minMachines is 4 but the pool has 3 slot(s); lower minMachines or add slots labelled with the group (minMachines: 3 at most)",
                ],
            ),
            (
                "a pool with no slot yet",
                vec![window("daily", "08:00", "09:00", "UTC", 4, &[])],
                0,
                vec![],
            ),
            (
                "more machines than named",
                vec![window("daily", "08:00", "09:00", "UTC", 2, &["desktop"])],
                3,
                vec![
                    "spec.schedules[0].minMachines is 2 but slots names 1 slot(s); lower minMachines or name more slots (minMachines: 1 at most)",
                ],
            ),
            (
                "a slot named twice",
                vec![window("daily", "08:00", "09:00", "UTC", 1, &["a", "a"])],
                3,
                vec!["spec.schedules[0].slots names a slot twice"],
            ),
            (
                "overlapping on a shared slot",
                vec![
                    office.clone(),
                    window("Fri", "17:00", "20:00", "Europe/Berlin", 1, &["nas", "desktop"]),
                ],
                3,
                vec![
                    "spec.schedules[0] (Mon-Fri 08:00-18:00 Europe/Berlin) and spec.schedules[1] (Fri 17:00-20:00 Europe/Berlin) are both open at Fri 2026-12-04 17:00:00 CET",
                ],
            ),
            (
                "overlapping with a pool-wide window",
                vec![backup.clone(), window("Sun", "02:30", "04:00", "Europe/Berlin", 1, &[])],
                3,
                vec!["spec.schedules[0] (daily 01:00-03:00 Europe/Berlin) and spec.schedules[1]"],
            ),
            (
                "overlapping in time on other slots",
                vec![
                    office.clone(),
                    window("Mon-Fri", "08:00", "18:00", "Europe/Berlin", 1, &["nas"]),
                ],
                3,
                vec![],
            ),
            (
                "touching windows",
                vec![
                    office.clone(),
                    window("Mon-Fri", "18:00", "08:00", "Europe/Berlin", 1, &["desktop"]),
                ],
                3,
                vec![],
            ),
        ];
        for (name, windows, pool_slots, want) in table {
            let got = messages(&windows, pool_slots);
            assert_eq!(got.len(), want.len(), "{name}: {got:#?}");
            for (got, want) in got.iter().zip(&want) {
                assert!(got.starts_with(want), "{name}: {got}\n  wanted: {want}");
            }
        }
    }
}
