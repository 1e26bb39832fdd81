//! What a pool's schedule asks for at one instant, pure: for each open window, the pins it
//! counts on its eligible slots, the claims to create for the deficit (candidates in the order
//! they are tried), its own claims to extend to the end of the opening, the status to report
//! and when to look again.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{GroupScheduleStatus, ScheduleWindow};
use crate::schedule::{State, Window};

/// A slot of the pool, as the schedule sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotView {
    pub name: String,
    /// Its hourly price as the provider prices it (its own, else its declared draw at the
    /// pool's tariff, else the pool's); unknown sorts after every known price.
    pub hourly_rate: Option<f64>,
}

/// A live claim on one of the pool's slots.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveClaim {
    pub name: String,
    pub slot: String,
    /// Manual or Schedule: a claim no scaler releases.
    pub pin: bool,
    pub requested_by: Option<String>,
    pub until: Option<Timestamp>,
}

/// A claim the schedule would create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewClaim {
    pub name: String,
    pub slot: String,
    pub window: usize,
    pub requested_by: String,
    pub reason: String,
    pub until: Timestamp,
}

/// The claims to create for one window: up to `wanted` of `candidates`, tried in order (a
/// candidate admission refuses, an exhausted slot say, is passed over).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fill {
    pub window: usize,
    pub wanted: usize,
    pub candidates: Vec<NewClaim>,
}

/// What the schedule does now.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub fills: Vec<Fill>,
    /// Own claims whose `spec.until` is short of the current opening's end: (claim, new until).
    pub extend: Vec<(String, Timestamp)>,
    pub status: GroupScheduleStatus,
    /// When to look again: at the next boundary of any window.
    pub requeue: Duration,
}

/// The longest the controller waits without looking (a clock that jumps is caught up).
pub const MAX_REQUEUE: Duration = Duration::from_secs(3600);
/// Added to a boundary so the look lands just past it (openings are half-open).
pub const BOUNDARY_MARGIN: Duration = Duration::from_millis(200);

/// Who a window's claims are requested by: `schedule/<group>/<index>`.
pub fn requested_by(group: &str, window: usize) -> String {
    format!("schedule/{group}/{window}")
}

/// The inputs of one pass.
pub struct Inputs<'a> {
    pub group: &'a str,
    pub windows: &'a [ScheduleWindow],
    pub slots: &'a [SlotView],
    pub live: &'a [LiveClaim],
    /// The names of every claim in the namespace (live or not): a new claim's name is free.
    pub taken_names: &'a BTreeSet<String>,
    pub now: Timestamp,
}

pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let now = inputs.now;
    let mut fills = Vec::new();
    let mut extend = Vec::new();
    let mut active = Vec::new();
    let mut held = Vec::new();
    let mut messages = Vec::new();
    let mut until: Option<Timestamp> = None;
    let mut next: Option<Timestamp> = None;
    let mut boundary: Option<Timestamp> = None;
    let mut taken = inputs.taken_names.clone();
    for (index, written) in inputs.windows.iter().enumerate() {
        let window = match Window::parse(written) {
            Ok(window) => window,
            Err(errors) => {
                let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                messages.push(format!("window {index} is ignored: {}", errors.join("; ")));
                continue;
            }
        };
        let state = window.state_at(now);
        boundary = earliest(boundary, state.boundary());
        let (since, end) = match state {
            State::Closed { next: after } => {
                next = earliest(next, after);
                continue;
            }
            State::Open { since, until: end, next: after } => {
                next = earliest(next, after);
                (since, end)
            }
        };
        until = earliest(until, Some(end));
        active.push(window.label.clone());
        let by = requested_by(inputs.group, index);
        let eligible = eligible(written, inputs.slots);
        let pinned = eligible
            .iter()
            .filter(|slot| inputs.live.iter().any(|c| c.slot == slot.name && c.pin))
            .count();
        let min = usize::try_from(written.min_machines).unwrap_or(0);
        held.push(format!("{pinned}/{min}"));
        for claim in inputs.live {
            let own = claim.requested_by.as_deref() == Some(by.as_str());
            if own && claim.until.is_some_and(|u| u < end) {
                extend.push((claim.name.clone(), end));
            }
        }
        let wanted = min.saturating_sub(pinned);
        if wanted == 0 {
            continue;
        }
        let free: Vec<&SlotView> = eligible
            .into_iter()
            .filter(|slot| !inputs.live.iter().any(|c| c.slot == slot.name))
            .collect();
        if free.len() < wanted {
            messages.push(format!(
                "window {index} ({}) holds {pinned} of {min} machines and has {} free slot(s) to \
                 start; the others are held by a scaler or missing",
                window.label,
                free.len()
            ));
        }
        let opening_start = since.as_second();
        let candidates = free
            .into_iter()
            .map(|slot| {
                let name = free_name(
                    &format!("{}-{}-w{index}-{opening_start}", inputs.group, slot.name),
                    &mut taken,
                );
                NewClaim {
                    name,
                    slot: slot.name.clone(),
                    window: index,
                    requested_by: by.clone(),
                    reason: format!(
                        "schedule window {index} ({}) keeps {min} machine(s) on until {}",
                        window.label,
                        end.to_zoned(window.zone.clone()).strftime("%a %Y-%m-%d %H:%M:%S %Z")
                    ),
                    until: end,
                }
            })
            .collect();
        fills.push(Fill { window: index, wanted, candidates });
    }
    let join = |parts: Vec<String>| (!parts.is_empty()).then(|| parts.join("; "));
    let status = GroupScheduleStatus {
        active: join(active),
        until: until.map(Time),
        next: next.map(Time),
        held: join(held),
        message: join(messages),
    };
    Plan { fills, extend, status, requeue: requeue_after(boundary, now) }
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The window's eligible slots in the order they are started: the named ones in the order
/// named (those of the pool), else every slot of the pool, the cheapest first, then by name.
fn eligible<'a>(window: &ScheduleWindow, slots: &'a [SlotView]) -> Vec<&'a SlotView> {
    if !window.slots.is_empty() {
        return window.slots.iter().filter_map(|n| slots.iter().find(|s| &s.name == n)).collect();
    }
    let mut all: Vec<&SlotView> = slots.iter().collect();
    all.sort_by(|a, b| {
        let price = match (a.hourly_rate, b.hourly_rate) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        };
        price.then_with(|| a.name.cmp(&b.name))
    });
    all
}

/// `base`, or `base-r2`, `base-r3`, ... : the first name no claim has (a claim that ended in
/// this opening keeps its name until it is collected). Names are deterministic, so a pass that
/// runs on a cache that has not seen its own last create gets AlreadyExists, not a second claim.
fn free_name(base: &str, taken: &mut BTreeSet<String>) -> String {
    let mut name = base.to_string();
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{base}-r{n}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// How long until `boundary` (plus the margin), at most [`MAX_REQUEUE`].
fn requeue_after(boundary: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(boundary) = boundary else { return MAX_REQUEUE };
    let millis = boundary.as_millisecond().saturating_sub(now.as_millisecond()).max(0);
    let wait = Duration::from_millis(u64::try_from(millis).unwrap_or(0)) + BOUNDARY_MARGIN;
    wait.min(MAX_REQUEUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Monday 2026-12-07, 10:00 in Berlin.
    const NOW: &str = "2026-12-07T09:00:00Z";

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn window(days: &str, from: &str, to: &str, min: i32, slots: &[&str]) -> ScheduleWindow {
        ScheduleWindow {
            days: days.into(),
            from: from.into(),
            to: to.into(),
            time_zone: "Europe/Berlin".into(),
            min_machines: min,
            slots: slots.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn slot(name: &str, rate: Option<f64>) -> SlotView {
        SlotView { name: name.into(), hourly_rate: rate }
    }

    fn live(name: &str, slot: &str, pin: bool, by: &str, until: Option<&str>) -> LiveClaim {
        LiveClaim {
            name: name.into(),
            slot: slot.into(),
            pin,
            requested_by: Some(by.into()),
            until: until.map(ts),
        }
    }

    fn taken() -> &'static BTreeSet<String> {
        static TAKEN: std::sync::OnceLock<BTreeSet<String>> = std::sync::OnceLock::new();
        TAKEN.get_or_init(|| BTreeSet::from(["home-nuc-w0-1796626800".to_string()]))
    }

    fn inputs_of<'a>(windows: &'a [ScheduleWindow], slots: &'a [SlotView]) -> Inputs<'a> {
        Inputs { group: "home", windows, slots, live: &[], taken_names: taken(), now: ts(NOW) }
    }

    fn plan_of(windows: &[ScheduleWindow], slots: &[SlotView], claims: &[LiveClaim]) -> Plan {
        plan(&Inputs { live: claims, ..inputs_of(windows, slots) })
    }

    /// (window, slots of its candidates, wanted) of a fill.
    type Expected<'a> = (usize, Vec<&'a str>, usize);

    fn fills(plan: &Plan) -> Vec<Expected<'_>> {
        plan.fills
            .iter()
            .map(|f| (f.window, f.candidates.iter().map(|c| c.slot.as_str()).collect(), f.wanted))
            .collect()
    }

    #[test]
    fn an_open_window_fills_its_deficit_on_free_slots() {
        let office = window("Mon-Fri", "08:00", "18:00", 2, &[]);
        let named = window("Mon-Fri", "08:00", "18:00", 2, &["big", "nuc", "gone"]);
        let slots = [
            slot("big", Some(0.25)),
            slot("nuc", Some(0.02)),
            slot("free", None),
            slot("mini", Some(0.02)),
        ];
        let scaler = live("s", "nuc", false, "cluster-autoscaler", None);
        let manual = live("m", "big", true, "alice", None);
        // (case, window, claims, expected fills)
        let table: Vec<(&str, &ScheduleWindow, Vec<LiveClaim>, Vec<Expected>)> = vec![
            (
                "cheapest first, unpriced last",
                &office,
                vec![],
                vec![(0, vec!["mini", "nuc", "big", "free"], 2)],
            ),
            (
                "a scaler's slot is neither counted nor taken",
                &office,
                vec![scaler.clone()],
                vec![(0, vec!["mini", "big", "free"], 2)],
            ),
            (
                "a person's pin counts",
                &office,
                vec![manual.clone()],
                vec![(0, vec!["mini", "nuc", "free"], 1)],
            ),
            (
                "named slots in the order named, missing ones skipped",
                &named,
                vec![],
                vec![(0, vec!["big", "nuc"], 2)],
            ),
            (
                "held: nothing to do",
                &named,
                vec![
                    manual.clone(),
                    live("x", "nuc", true, "schedule/home/0", Some("2026-12-07T17:00:00Z")),
                ],
                vec![],
            ),
        ];
        for (case, w, claims, want) in table {
            let plan = plan_of(std::slice::from_ref(w), &slots, &claims);
            assert_eq!(fills(&plan), want, "{case}");
        }
    }

    #[test]
    fn a_new_claim_says_who_why_and_until_when() {
        let windows = [window("Mon-Fri", "08:00", "18:00", 1, &["nuc"])];
        let slots = [slot("nuc", None)];
        let early = plan(&inputs_of(&windows, &slots));
        let claim = &early.fills[0].candidates[0];
        // 08:00 CET on 2026-12-07 is 1796626800; that name is taken by a claim of this opening.
        assert_eq!(claim.name, "home-nuc-w0-1796626800-r2");
        assert_eq!(claim.requested_by, "schedule/home/0");
        assert_eq!(claim.until, ts("2026-12-07T17:00:00Z"));
        assert_eq!(
            claim.reason,
            "schedule window 0 (Mon-Fri 08:00-18:00 Europe/Berlin) keeps 1 machine(s) on until \
             Mon 2026-12-07 18:00:00 CET"
        );
        assert_eq!(early.status.active.as_deref(), Some("Mon-Fri 08:00-18:00 Europe/Berlin"));
        assert_eq!(early.status.held.as_deref(), Some("0/1"));
        assert_eq!(early.status.until, Some(Time(ts("2026-12-07T17:00:00Z"))));
        assert_eq!(early.status.next, Some(Time(ts("2026-12-08T07:00:00Z"))));
        // Looks again when the window closes, eight hours on, but at least hourly.
        assert_eq!(early.requeue, MAX_REQUEUE);
        let late = plan(&Inputs { now: ts("2026-12-07T16:30:00Z"), ..inputs_of(&windows, &slots) });
        assert_eq!(late.requeue, Duration::from_secs(1800) + BOUNDARY_MARGIN);
    }

    #[test]
    fn a_closed_window_does_nothing_and_looks_again_when_it_opens() {
        let backup = window("daily", "23:30", "02:00", 1, &["nas"]);
        let own = live("old", "nas", true, "schedule/home/0", Some("2026-12-07T01:00:00Z"));
        let plan = plan_of(&[backup], &[slot("nas", None)], &[own]);
        assert!(plan.fills.is_empty() && plan.extend.is_empty(), "{plan:?}");
        assert_eq!(plan.status.active, None);
        assert_eq!(plan.status.next, Some(Time(ts("2026-12-07T22:30:00Z"))));
        assert_eq!(plan.requeue, Duration::from_secs(13 * 3600 + 1800).min(MAX_REQUEUE));
    }

    #[test]
    fn own_claims_are_extended_to_the_opening_end_never_shortened() {
        let office = window("Mon-Fri", "08:00", "18:00", 1, &[]);
        let end = "2026-12-07T17:00:00Z";
        let table = [
            (
                live("a", "nuc", true, "schedule/home/0", Some("2026-12-07T12:00:00Z")),
                vec![("a".to_string(), ts(end))],
            ),
            (live("b", "nuc", true, "schedule/home/0", Some("2026-12-07T19:00:00Z")), vec![]),
            (live("c", "nuc", true, "schedule/home/1", Some("2026-12-07T12:00:00Z")), vec![]),
            (live("d", "nuc", true, "alice", Some("2026-12-07T12:00:00Z")), vec![]),
        ];
        for (claim, want) in table {
            let plan = plan_of(
                std::slice::from_ref(&office),
                &[slot("nuc", None)],
                std::slice::from_ref(&claim),
            );
            assert_eq!(plan.extend, want, "{}", claim.name);
        }
    }

    #[test]
    fn a_shortfall_and_a_window_that_does_not_read_are_reported() {
        let windows = [
            window("Mon-Fri", "08:00", "18:00", 2, &["nuc", "big"]),
            window("Mon-Fry", "08:00", "18:00", 1, &[]),
        ];
        let scaler = live("s", "big", false, "cluster-autoscaler", None);
        let plan = plan_of(&windows, &[slot("nuc", None), slot("big", None)], &[scaler]);
        assert_eq!(fills(&plan), vec![(0, vec!["nuc"], 2)]);
        let message = plan.status.message.unwrap_or_default();
        assert!(message.contains("window 0 (Mon-Fri 08:00-18:00 Europe/Berlin) holds 0 of 2 machines and has 1 free slot(s)"), "{message}");
        assert!(message.contains("window 1 is ignored: days: \"Mon-Fry\""), "{message}");
    }

    #[test]
    fn no_window_looks_again_within_the_hour() {
        assert_eq!(requeue_after(None, ts(NOW)), MAX_REQUEUE);
        assert_eq!(requeue_after(Some(ts("2026-12-07T08:00:00Z")), ts(NOW)), BOUNDARY_MARGIN);
    }
}
