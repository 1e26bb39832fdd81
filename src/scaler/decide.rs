//! The decision (docs/decisions.md, D8, with its per-node scale-in): given one pass's
//! observation of a pool and what the scaler remembers, what to do now.
//!
//! The pool is steered to `goal = max(target, floor)`, where `floor` is the Group's minSize:
//!
//! - fewer machines than the goal: Provision the difference (as far as free slots allow);
//! - as many: nothing;
//! - more, with work: release one idle machine per hold, emptiest then newest, never below the
//!   goal. A machine running work is never chosen, and neither is one still booting;
//! - more, without work: after the pool has been without work for the hold, Teardown every
//!   machine above the floor at once.
//!
//! A pinned machine (docs/decisions.md, D17) is capacity like any other: it holds pods, counts in
//! the machine count against the goal and maxNodes, and so keeps the floor. It is never released,
//! neither by scale-in nor by teardown, and the reason says when pinned machines were kept.
//!
//! The machine count is re-read every pass, never remembered. What is remembered ([`State`]) is
//! only what no single observation can show: since when the pool, and each machine, has been
//! idle, and when a machine was last released. The caller keeps the returned state only if the
//! decision was carried out (the state advances only on success).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::demand::{demand, intent};
use super::pool_view::{Machine, PoolView};
use super::target::{Limits, floor, target};
use crate::api::GroupSpec;

/// The hold when `spec.builtin.hold` is negative (the admission webhook refuses that; a pool
/// written past it gets the documented default rather than a hold of zero, which would flap).
pub const DEFAULT_HOLD: Duration = Duration::from_secs(120);

/// A pool's settings as the decision reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// How long a pool (or a machine) must be idle before machines are released.
    pub hold: Duration,
    pub limits: Limits,
    /// Machines kept powered whatever the demand (minSize within the slots).
    pub floor: i32,
}

impl Settings {
    /// The settings of a Group with `slots` slots.
    pub fn of(spec: &GroupSpec, slots: i32) -> Self {
        let hold = spec.builtin.hold;
        Self {
            hold: if hold.is_negative() { DEFAULT_HOLD } else { hold.into() },
            limits: Limits::of(&spec.builtin, slots),
            floor: floor(spec.min_size, slots),
        }
    }
}

/// What the scaler remembers of a pool between passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Since when the pool has had no work and more machines than its goal.
    pub idle_since: Option<Timestamp>,
    /// Since when each serving machine has held nothing, by slot.
    pub machine_idle_since: BTreeMap<String, Timestamp>,
    /// When a machine was last released, so per-node scale-in goes one machine per hold.
    pub last_release: Option<Timestamp>,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    /// Claim `add` more machines.
    Provision {
        add: i32,
    },
    /// Release one idle machine (work remains; the pool has more machines than it needs).
    ScaleIn {
        machine: Machine,
    },
    /// Release these machines (no work for the hold).
    Teardown {
        machines: Vec<Machine>,
    },
}

impl Action {
    /// The name `status.lastDecision.action` shows.
    pub fn name(&self) -> &'static str {
        match self {
            Action::None => "None",
            Action::Provision { .. } => "Provision",
            Action::ScaleIn { .. } => "ScaleIn",
            Action::Teardown { .. } => "Teardown",
        }
    }
}

/// One decision, with what it was based on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The pod-work count.
    pub demand: i32,
    /// The machine count the pool is steered to (the target, or the floor when higher).
    pub target: i32,
    /// The machines counted (slots held by a wanted claim).
    pub machines: i32,
    pub action: Action,
    /// Why, in a sentence.
    pub reason: String,
    /// Since when the pool (without work), or its longest-idle machine (with work), is idle.
    pub idle_since: Option<Timestamp>,
}

/// A decision and the state to keep if it is carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub next: State,
}

/// Decides for one pool.
pub fn decide(o: &PoolView, settings: &Settings, state: &State, now: Timestamp) -> Outcome {
    let demand = demand(o);
    let work = intent(o);
    let target = target(demand, &settings.limits);
    let goal = target.max(settings.floor);
    let count = super::saturating_i32(o.machines.len());

    let mut next = State {
        idle_since: None,
        machine_idle_since: idle_clocks(&o.machines, state, now),
        last_release: state.last_release,
    };
    if !work && count > goal {
        next.idle_since = Some(state.idle_since.unwrap_or(now));
    }
    let idle_since =
        if work { next.machine_idle_since.values().min().copied() } else { next.idle_since };
    let (action, reason) = match count.cmp(&goal) {
        Ordering::Less => provision(o, settings, demand, target, goal, count),
        Ordering::Equal => (
            Action::None,
            format!("at target: demand {demand}, {count} of {goal} machine(s) claimed"),
        ),
        Ordering::Greater if !work => teardown(o, settings, &next, goal, count, now),
        Ordering::Greater => scale_in(o, settings, &next, demand, goal, count, now),
    };
    if matches!(action, Action::ScaleIn { .. } | Action::Teardown { .. }) {
        next.last_release = Some(now);
    }
    Outcome {
        decision: Decision { demand, target: goal, machines: count, action, reason, idle_since },
        next,
    }
}

/// Each serving, releasable machine that holds nothing keeps the clock it had, or starts one
/// now; any other machine (busy, booting, pinned, or gone) has none.
fn idle_clocks(machines: &[Machine], state: &State, now: Timestamp) -> BTreeMap<String, Timestamp> {
    machines
        .iter()
        .filter(|m| m.is_idle() && m.is_releasable())
        .map(|m| {
            let since = state.machine_idle_since.get(&m.slot).copied().unwrap_or(now);
            (m.slot.clone(), since)
        })
        .collect()
}

fn provision(
    o: &PoolView,
    settings: &Settings,
    demand: i32,
    target: i32,
    goal: i32,
    count: i32,
) -> (Action, String) {
    let why = if target >= goal {
        format!(
            "demand {demand} pod(s) at {} per machine needs {target} machine(s) (maxNodes {})",
            settings.limits.pods_per_node, settings.limits.max_nodes
        )
    } else {
        format!("minSize keeps {goal} machine(s) powered (demand {demand})")
    };
    let wanted = goal - count;
    let add = wanted.min(o.free_slots.max(0));
    if add <= 0 {
        let reason = format!(
            "{why}; {count} claimed, but no slot is free (the others are still being released)"
        );
        return (Action::None, reason);
    }
    let short = if add < wanted {
        format!(" (only {} slot(s) free now)", o.free_slots)
    } else {
        String::new()
    };
    (Action::Provision { add }, format!("{why}; {count} claimed, claiming {add} more{short}"))
}

fn teardown(
    o: &PoolView,
    settings: &Settings,
    next: &State,
    goal: i32,
    count: i32,
    now: Timestamp,
) -> (Action, String) {
    let since = next.idle_since.unwrap_or(now);
    let hold = signed(settings.hold);
    if now.duration_since(since) < hold {
        let reason = format!(
            "no demand since {since}: {count} machine(s) for a floor of {goal}, released once \
             the hold of {hold:#} has passed"
        );
        return (Action::None, reason);
    }
    let mut order: Vec<&Machine> = o.machines.iter().filter(|m| m.is_releasable()).collect();
    order.sort_by(|a, b| release_order(a, b));
    let release = usize::try_from(count - goal).unwrap_or(0);
    let machines: Vec<Machine> = order.into_iter().take(release).cloned().collect();
    let kept = kept_pinned(o);
    if machines.is_empty() {
        let reason = format!(
            "no demand since {since}, longer than the hold of {hold:#}: {count} machine(s) for a \
             floor of {goal}, but {kept}"
        );
        return (Action::None, reason);
    }
    let also =
        if o.machines.iter().any(|m| m.pinned) { format!("; {kept}") } else { String::new() };
    let reason = format!(
        "no demand since {since}, longer than the hold of {hold:#}: releasing {} machine(s) \
         down to {}{also}",
        machines.len(),
        count - super::saturating_i32(machines.len())
    );
    (Action::Teardown { machines }, reason)
}

fn scale_in(
    o: &PoolView,
    settings: &Settings,
    next: &State,
    demand: i32,
    goal: i32,
    count: i32,
    now: Timestamp,
) -> (Action, String) {
    let hold = signed(settings.hold);
    let over = format!("demand {demand} needs {goal} machine(s) and {count} are claimed");
    if let Some(last) = next.last_release.filter(|t| now.duration_since(*t) < hold) {
        let reason =
            format!("{over}; one machine is released per hold of {hold:#}, the last at {last}");
        return (Action::None, reason);
    }
    let mut candidates: Vec<&Machine> = o
        .machines
        .iter()
        .filter(|m| {
            m.is_idle()
                && next
                    .machine_idle_since
                    .get(&m.slot)
                    .is_some_and(|since| now.duration_since(*since) >= hold)
        })
        .collect();
    candidates.sort_by(|a, b| release_order(a, b));
    let Some(chosen) = candidates.first() else {
        let pinned_idle = o.machines.iter().any(|m| m.pinned && m.is_idle());
        let also = if pinned_idle { format!("; {}", kept_pinned(o)) } else { String::new() };
        let reason = format!("{over}; none has been idle for the hold of {hold:#}{also}");
        return (Action::None, reason);
    };
    let since = next.machine_idle_since.get(&chosen.slot).copied().unwrap_or(now);
    let reason = format!(
        "{over}: releasing {} (emptiest, then newest), idle since {since}, longer than the hold \
         of {hold:#}",
        chosen.slot
    );
    (Action::ScaleIn { machine: (*chosen).clone() }, reason)
}

/// The clause a reason adds when pinned machines were kept.
fn kept_pinned(o: &PoolView) -> String {
    let pinned: Vec<&str> =
        o.machines.iter().filter(|m| m.pinned).map(|m| m.slot.as_str()).collect();
    if pinned.is_empty() {
        return "nothing above it can be released".to_owned();
    }
    format!("pinned machine(s) kept: {} (released only by their owner or end)", pinned.join(", "))
}

/// Which machine goes first: the emptiest, then the newest claim, then by name so the order is
/// total. A machine whose claim time is unknown counts as the oldest.
pub fn release_order(a: &Machine, b: &Machine) -> Ordering {
    a.held
        .cmp(&b.held)
        .then_with(|| b.claimed_at.cmp(&a.claimed_at))
        .then_with(|| a.slot.cmp(&b.slot))
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

#[cfg(test)]
mod tests {
    use super::super::target::Limits;
    use super::*;

    const HOLD: Duration = Duration::from_secs(120);

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn now() -> Timestamp {
        at("2026-03-04T10:00:00Z")
    }

    fn ago(secs: i64) -> Timestamp {
        now().checked_sub(SignedDuration::from_secs(secs)).unwrap()
    }

    fn settings(max_nodes: i32, pods_per_node: i32, floor: i32) -> Settings {
        Settings { hold: HOLD, limits: Limits::new(pods_per_node, Some(max_nodes), 10), floor }
    }

    fn machine(slot: &str, ready: bool, held: i32, claimed_secs_ago: i64) -> Machine {
        Machine {
            slot: slot.into(),
            node: slot.into(),
            provider_id: format!("homelab://{slot}"),
            ready,
            held,
            claimed_at: Some(ago(claimed_secs_ago)),
            pinned: false,
        }
    }

    fn pinned(slot: &str, held: i32, claimed_secs_ago: i64) -> Machine {
        Machine { pinned: true, ..machine(slot, true, held, claimed_secs_ago) }
    }

    fn obs(pending: i32, machines: Vec<Machine>) -> PoolView {
        let free = 10 - super::super::saturating_i32(machines.len());
        PoolView { pending_pods: pending, machines, free_slots: free, ..Default::default() }
    }

    fn idle(slot: &str, secs_ago: i64) -> State {
        State { machine_idle_since: [(slot.to_owned(), ago(secs_ago))].into(), ..State::default() }
    }

    fn pool_idle(secs_ago: i64) -> State {
        State { idle_since: Some(ago(secs_ago)), ..State::default() }
    }

    fn released(machines: &[Machine]) -> Vec<&str> {
        machines.iter().map(|m| m.slot.as_str()).collect()
    }

    /// The cases at maxNodes 1: zero or one machine, the hold, the teardown.
    #[test]
    fn max_nodes_one_reproduces_the_zero_or_one_behaviour() {
        let one = settings(1, 8, 0);
        let a = || machine("a", true, 0, 600);
        // name, observation, state, action, target
        let table: Vec<(&str, PoolView, State, Action, i32)> = vec![
            (
                "work and no machine: provision one",
                obs(1, vec![]),
                State::default(),
                Action::Provision { add: 1 },
                1,
            ),
            (
                "fifty pods still need one",
                obs(50, vec![]),
                State::default(),
                Action::Provision { add: 1 },
                1,
            ),
            ("work and the machine: nothing", obs(1, vec![a()]), State::default(), Action::None, 1),
            ("no work, no machine: nothing", obs(0, vec![]), State::default(), Action::None, 0),
            (
                "no work, a machine: the hold starts",
                obs(0, vec![a()]),
                State::default(),
                Action::None,
                0,
            ),
            (
                "no work inside the hold: nothing",
                obs(0, vec![a()]),
                pool_idle(119),
                Action::None,
                0,
            ),
            (
                "no work past the hold: teardown",
                obs(0, vec![a()]),
                pool_idle(120),
                Action::Teardown { machines: vec![a()] },
                0,
            ),
        ];
        for (name, o, state, want, target) in table {
            let out = decide(&o, &one, &state, now());
            assert_eq!(out.decision.action, want, "{name}: {}", out.decision.reason);
            assert_eq!(out.decision.target, target, "{name}");
        }
    }

    #[test]
    fn the_hold_clock_starts_on_the_first_idle_pass_and_is_kept() {
        let one = settings(1, 8, 0);
        let o = obs(0, vec![machine("a", true, 0, 600)]);
        let first = decide(&o, &one, &State::default(), now());
        assert_eq!(first.next.idle_since, Some(now()));
        assert_eq!(first.decision.idle_since, Some(now()));
        let later = decide(&o, &one, &pool_idle(30), now());
        assert_eq!(later.next.idle_since, Some(ago(30)), "the clock is not restarted");
        assert!(later.decision.reason.contains("hold"), "{}", later.decision.reason);

        let back = decide(&obs(1, vec![machine("a", true, 1, 600)]), &one, &pool_idle(119), now());
        assert_eq!(back.next.idle_since, None, "work ends the pool's idle clock");
    }

    #[test]
    fn three_pods_at_one_per_machine_provision_three() {
        let out = decide(&obs(3, vec![]), &settings(3, 1, 0), &State::default(), now());
        assert_eq!(out.decision.action, Action::Provision { add: 3 });
        assert_eq!((out.decision.demand, out.decision.target), (3, 3));
        assert!(out.decision.reason.contains("demand 3"), "{}", out.decision.reason);
        let part = decide(
            &obs(3, vec![machine("a", false, 0, 5)]),
            &settings(3, 1, 0),
            &State::default(),
            now(),
        );
        assert_eq!(
            part.decision.action,
            Action::Provision { add: 2 },
            "up to the target, not past it"
        );
    }

    #[test]
    fn provision_is_bounded_by_the_free_slots() {
        let mut o = obs(3, vec![]);
        o.free_slots = 1;
        let out = decide(&o, &settings(3, 1, 0), &State::default(), now());
        assert_eq!(out.decision.action, Action::Provision { add: 1 });
        o.free_slots = 0;
        let out = decide(&o, &settings(3, 1, 0), &State::default(), now());
        assert_eq!(out.decision.action, Action::None);
        assert!(out.decision.reason.contains("no slot is free"), "{}", out.decision.reason);
    }

    #[test]
    fn min_size_is_a_floor_kept_powered() {
        let floored = settings(3, 8, 1);
        let out = decide(&obs(0, vec![]), &floored, &State::default(), now());
        assert_eq!(out.decision.action, Action::Provision { add: 1 });
        assert_eq!(out.decision.target, 1);
        assert!(out.decision.reason.contains("minSize"), "{}", out.decision.reason);

        let at_floor =
            decide(&obs(0, vec![machine("a", true, 0, 600)]), &floored, &pool_idle(900), now());
        assert_eq!(at_floor.decision.action, Action::None, "no teardown below the floor");
        assert_eq!(at_floor.next.idle_since, None, "nothing is over the floor, so nothing idles");

        let two = obs(0, vec![machine("a", true, 0, 600), machine("b", true, 0, 60)]);
        let out = decide(&two, &floored, &pool_idle(120), now());
        match out.decision.action {
            Action::Teardown { machines } => {
                assert_eq!(released(&machines), ["b"], "the newest goes")
            }
            other => panic!("expected a teardown to the floor, got {other:?}"),
        }
    }

    #[test]
    fn per_node_scale_in_releases_one_idle_machine_per_hold_emptiest_then_newest() {
        // 9 pods at 8 per machine: target 2. Four machines: one busy, three idle.
        let s = settings(4, 8, 0);
        let machines = vec![
            machine("busy", true, 9, 900),
            machine("old", true, 0, 800),
            machine("new", true, 0, 100),
            machine("booting", false, 0, 10),
        ];
        let o = PoolView { machines: machines.clone(), free_slots: 6, ..Default::default() };
        assert_eq!(demand(&o), 9);

        let fresh = decide(&o, &s, &State::default(), now());
        assert_eq!(fresh.decision.action, Action::None, "{}", fresh.decision.reason);
        assert_eq!(
            fresh.next.machine_idle_since.keys().collect::<Vec<_>>(),
            ["new", "old"],
            "only serving idle machines get a clock"
        );

        let state = State {
            machine_idle_since: [("old".to_owned(), ago(300)), ("new".to_owned(), ago(300))].into(),
            ..State::default()
        };
        let out = decide(&o, &s, &state, now());
        assert_eq!(out.decision.target, 2);
        match &out.decision.action {
            Action::ScaleIn { machine } => {
                assert_eq!(machine.slot, "new", "the newest of the idle")
            }
            other => panic!("expected a scale-in, got {other:?}"),
        }
        assert_eq!(out.next.last_release, Some(now()));

        // The next pass, with the released machine gone: one per hold.
        let after: Vec<Machine> = machines.iter().filter(|m| m.slot != "new").cloned().collect();
        let o2 = PoolView { machines: after, free_slots: 7, ..Default::default() };
        let soon = now().checked_add(SignedDuration::from_secs(10)).unwrap();
        let out2 = decide(&o2, &s, &out.next, soon);
        assert_eq!(out2.decision.action, Action::None);
        assert!(
            out2.decision.reason.contains("one machine is released per hold"),
            "{}",
            out2.decision.reason
        );
        let later = now().checked_add(SignedDuration::from_secs(120)).unwrap();
        let out3 = decide(&o2, &s, &out.next, later);
        assert!(
            matches!(&out3.decision.action, Action::ScaleIn { machine } if machine.slot == "old"),
            "{:?}",
            out3.decision.action
        );
    }

    #[test]
    fn scale_in_never_goes_below_the_target_nor_takes_a_busy_machine() {
        let s = settings(4, 1, 0);
        // Two pods on two machines, one idle machine that has not idled for the hold.
        let o = obs(
            0,
            vec![
                machine("a", true, 1, 900),
                machine("b", true, 1, 800),
                machine("c", true, 0, 100),
            ],
        );
        let out = decide(&o, &s, &idle("c", 60), now());
        assert_eq!(out.decision.action, Action::None);
        assert!(out.decision.reason.contains("none has been idle"), "{}", out.decision.reason);
        // Three busy machines at target 3: nothing to release.
        let full = obs(
            0,
            vec![
                machine("a", true, 1, 900),
                machine("b", true, 1, 800),
                machine("c", true, 1, 100),
            ],
        );
        assert_eq!(decide(&full, &s, &State::default(), now()).decision.action, Action::None);
    }

    /// Pods being garbage-collected (or any passing spike) inflate one pass. The clamp
    /// bounds it at maxNodes; the next passes correct it, releasing the surplus one idle machine
    /// per hold, never below the real target, and never a machine still booting.
    #[test]
    fn a_transiently_inflated_observation_is_bounded_and_corrected() {
        let s = settings(3, 8, 0);
        let serving = machine("a", true, 1, 900);
        let inflated = obs(40, vec![serving.clone()]);
        let spike = decide(&inflated, &s, &State::default(), now());
        assert_eq!(spike.decision.target, 3, "bounded by maxNodes");
        assert_eq!(spike.decision.action, Action::Provision { add: 2 });

        // The true observation: one pod. The two new machines are booting: nothing is released.
        let t1 = now().checked_add(SignedDuration::from_secs(10)).unwrap();
        let booting =
            obs(0, vec![serving.clone(), machine("b", false, 0, 5), machine("c", false, 0, 4)]);
        let pass1 = decide(&booting, &s, &spike.next, t1);
        assert_eq!((pass1.decision.target, pass1.decision.action.clone()), (1, Action::None));

        // They serve and stay empty: after the hold, one goes; after another, the other.
        let serving_all =
            obs(0, vec![serving.clone(), machine("b", true, 0, 5), machine("c", true, 0, 4)]);
        let t2 = t1.checked_add(SignedDuration::from_secs(30)).unwrap();
        let pass2 = decide(&serving_all, &s, &pass1.next, t2);
        assert_eq!(pass2.decision.action, Action::None, "the machines' clocks just started");
        let t3 = t2.checked_add(signed(HOLD)).unwrap();
        let pass3 = decide(&serving_all, &s, &pass2.next, t3);
        assert!(
            matches!(&pass3.decision.action, Action::ScaleIn { machine } if machine.slot == "c")
        );
        let left = obs(0, vec![serving.clone(), machine("b", true, 0, 5)]);
        let t4 = t3.checked_add(signed(HOLD)).unwrap();
        let pass4 = decide(&left, &s, &pass3.next, t4);
        assert!(
            matches!(&pass4.decision.action, Action::ScaleIn { machine } if machine.slot == "b")
        );
        let last =
            decide(&obs(0, vec![serving]), &s, &pass4.next, t4.checked_add(signed(HOLD)).unwrap());
        assert_eq!(
            (last.decision.target, last.decision.action),
            (1, Action::None),
            "never below the target"
        );
    }

    #[test]
    fn teardown_releases_every_machine_booting_or_not_and_clocks_are_dropped_for_gone_machines() {
        let s = settings(3, 1, 0);
        let o = obs(0, vec![machine("a", true, 0, 900), machine("b", false, 0, 30)]);
        let mut state = pool_idle(200);
        state.machine_idle_since.insert("gone".into(), ago(999));
        let out = decide(&o, &s, &state, now());
        match &out.decision.action {
            Action::Teardown { machines } => assert_eq!(released(machines), ["b", "a"]),
            other => panic!("expected a teardown, got {other:?}"),
        }
        assert!(!out.next.machine_idle_since.contains_key("gone"));
        assert_eq!(out.decision.action.name(), "Teardown");
    }

    #[test]
    fn a_pinned_machine_serves_and_counts_but_is_never_released() {
        // name, settings, observation, state, expected action, reason must contain
        let s = settings(3, 1, 0);
        let table: Vec<(&str, Settings, PoolView, State, Action, &str)> = vec![
            (
                "no work past the hold, only a pin: nothing, and the reason says why",
                s,
                obs(0, vec![pinned("p", 0, 900)]),
                pool_idle(900),
                Action::None,
                "pinned machine(s) kept: p",
            ),
            (
                "no work past the hold: the scaler's machine goes, the pin stays",
                s,
                obs(0, vec![pinned("p", 0, 900), machine("a", true, 0, 100)]),
                pool_idle(900),
                Action::Teardown { machines: vec![machine("a", true, 0, 100)] },
                "pinned machine(s) kept: p",
            ),
            (
                "a pin keeps the floor: teardown releases down to it, the pin counting",
                settings(3, 1, 1),
                obs(0, vec![machine("a", true, 0, 100), pinned("p", 0, 900)]),
                pool_idle(900),
                Action::Teardown { machines: vec![machine("a", true, 0, 100)] },
                "down to 1",
            ),
            (
                "the pin counts toward the floor: nothing to provision",
                settings(3, 1, 1),
                obs(0, vec![pinned("p", 0, 900)]),
                State::default(),
                Action::None,
                "at target",
            ),
            (
                "a pin holding pods serves demand: nothing to provision",
                s,
                obs(0, vec![pinned("p", 1, 900)]),
                State::default(),
                Action::None,
                "at target",
            ),
            (
                "the pin counts against maxNodes: one more, not two",
                settings(2, 1, 0),
                obs(3, vec![pinned("p", 0, 900)]),
                State::default(),
                Action::Provision { add: 1 },
                "claiming 1 more",
            ),
            (
                "scale-in passes over an idle pin, however long it idles",
                s,
                obs(0, vec![machine("a", true, 1, 900), pinned("p", 0, 10)]),
                State {
                    machine_idle_since: [("p".to_owned(), ago(900))].into(),
                    ..State::default()
                },
                Action::None,
                "pinned machine(s) kept: p",
            ),
            (
                "scale-in releases the scaler's idle machine, not the newer pin",
                s,
                obs(
                    0,
                    vec![
                        machine("a", true, 1, 900),
                        machine("b", true, 0, 500),
                        pinned("p", 0, 10),
                    ],
                ),
                idle("b", 300),
                Action::ScaleIn { machine: machine("b", true, 0, 500) },
                "releasing b",
            ),
        ];
        for (name, settings, o, state, want, says) in table {
            let out = decide(&o, &settings, &state, now());
            assert_eq!(out.decision.action, want, "{name}: {}", out.decision.reason);
            assert!(out.decision.reason.contains(says), "{name}: {}", out.decision.reason);
            assert!(!out.next.machine_idle_since.contains_key("p"), "{name}: a pin has no clock");
        }
    }

    #[test]
    fn release_order_is_emptiest_then_newest_then_name() {
        let mut ms = vec![
            machine("x", true, 2, 10),
            machine("old", true, 0, 900),
            machine("new", true, 0, 10),
            machine("twin-b", true, 0, 500),
            machine("twin-a", true, 0, 500),
        ];
        ms.sort_by(release_order);
        assert_eq!(released(&ms), ["new", "twin-a", "twin-b", "old", "x"]);
    }

    #[test]
    fn settings_from_a_group_spec() {
        let spec: GroupSpec = serde_json::from_value(serde_json::json!({
            "minSize": 5, "builtin": { "hold": "10s", "podsPerNode": 1, "maxNodes": 9 },
        }))
        .unwrap();
        let s = Settings::of(&spec, 3);
        assert_eq!(s.hold, Duration::from_secs(10));
        assert_eq!(s.limits, Limits { pods_per_node: 1, max_nodes: 3 });
        assert_eq!(s.floor, 3);
        let negative: GroupSpec =
            serde_json::from_value(serde_json::json!({ "builtin": { "hold": "-5s" } })).unwrap();
        assert_eq!(Settings::of(&negative, 1).hold, DEFAULT_HOLD);
    }
}
