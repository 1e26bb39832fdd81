//! Which free slots IncreaseSize boots (docs/decisions.md, D12): never an exhausted slot, then
//! a machine that pending pods wait for (their volume is on its disk, and the pool's power held
//! its wake back: D42), then the cheapest machine, a machine asleep (suspended to RAM) counting
//! its price less the Group's `asleepPriceMargin` and winning a tie (it serves in seconds:
//! D44), then the one with the fewest recent failures, then by name, so a mixed pool powers
//! its small machines before its power-hungry server, a pool back from an outage boots its
//! waiting data machines first, and the choice is deterministic.

use std::cmp::Ordering;

use jiff::Timestamp;

use crate::api::GroupSpec;
use crate::claim::{AttemptSeed, prior_of_slot, reset_of_slot, seed_attempt};

use super::error::ExhaustedSlot;
use super::groups::SlotState;
use super::slot_pricing::pricing_of;

/// A free slot as the choice sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotCandidate {
    pub name: String,
    /// What the machine costs per hour; `None` when neither the slot nor its group says, which
    /// sorts after every known price.
    pub hourly_rate: Option<f64>,
    /// The attempt a new claim would be, or why the slot takes none.
    pub seed: AttemptSeed,
    /// Pending pods only this machine can run wait for it (`status.waitingPods`).
    pub awaited: bool,
    /// The machine sleeps (suspended to RAM): it wakes in seconds.
    pub asleep: bool,
}

/// A slot picked to boot, with the attempt number its claim carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChosenSlot {
    pub name: String,
    pub attempt: i32,
}

/// Not enough bootable slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub bootable: i32,
    pub exhausted: Vec<ExhaustedSlot>,
}

/// Picks `wanted` slots out of `candidates`, or says how many could boot and which are
/// exhausted. All or nothing: a partial scale-up is not what was asked for.
/// `asleep_margin`: how much more per hour a machine asleep may cost and still go first.
pub fn choose(
    candidates: &[SlotCandidate],
    wanted: usize,
    asleep_margin: f64,
) -> Result<Vec<ChosenSlot>, Shortfall> {
    let mut bootable: Vec<(&SlotCandidate, i32)> = candidates
        .iter()
        .filter_map(|c| match c.seed {
            AttemptSeed::Attempt(n) => Some((c, n)),
            AttemptSeed::Exhausted { .. } => None,
        })
        .collect();
    if bootable.len() < wanted {
        let exhausted = candidates
            .iter()
            .filter_map(|c| match c.seed {
                AttemptSeed::Exhausted { failures, retry_after } => {
                    Some(ExhaustedSlot { slot: c.name.clone(), failures, retry_after })
                }
                AttemptSeed::Attempt(_) => None,
            })
            .collect();
        return Err(Shortfall {
            bootable: super::groups::saturating_i32(bootable.len()),
            exhausted,
        });
    }
    // A machine asleep is priced less the margin: one order, whichever pair is compared.
    let rate =
        |c: &SlotCandidate| c.hourly_rate.map(|r| if c.asleep { r - asleep_margin } else { r });
    bootable.sort_by(|(a, attempt_a), (b, attempt_b)| {
        b.awaited
            .cmp(&a.awaited)
            .then_with(|| cheaper_first(rate(a), rate(b)))
            .then_with(|| b.asleep.cmp(&a.asleep))
            .then_with(|| attempt_a.cmp(attempt_b))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(bootable
        .into_iter()
        .take(wanted)
        .map(|(c, attempt)| ChosenSlot { name: c.name.clone(), attempt })
        .collect())
}

/// Known prices ascending, unknown prices last.
fn cheaper_first(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(&b),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// Describes a free slot for the choice. The attempt is seeded exactly as admission seeds it
/// (the slot's newest claim, else its digest, and the person's reset annotation), so the
/// provider never picks a slot admission would refuse as exhausted.
pub fn candidate(state: &SlotState, group: &GroupSpec, now: Timestamp) -> SlotCandidate {
    let slot = &state.slot;
    let prior = prior_of_slot(slot, state.claims.iter().map(|c| c.as_ref()));
    SlotCandidate {
        name: state.name().to_owned(),
        hourly_rate: pricing_of(&slot.spec, group).map(|p| p.hourly_rate),
        seed: seed_attempt(prior, reset_of_slot(slot), now),
        awaited: slot.status.as_ref().is_some_and(|s| !s.waiting_pods.is_empty()),
        asleep: state.asleep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cand(name: &str, rate: Option<f64>, seed: AttemptSeed) -> SlotCandidate {
        SlotCandidate { name: name.into(), hourly_rate: rate, seed, awaited: false, asleep: false }
    }

    fn awaited(name: &str, rate: Option<f64>) -> SlotCandidate {
        SlotCandidate { awaited: true, ..cand(name, rate, AttemptSeed::Attempt(1)) }
    }

    fn names(chosen: &[ChosenSlot]) -> Vec<&str> {
        chosen.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn choice_table() {
        use AttemptSeed::Attempt;
        let exhausted =
            AttemptSeed::Exhausted { failures: 3, retry_after: ts("2026-03-04T10:25:00Z") };
        let table: Vec<(&str, Vec<SlotCandidate>, usize, Vec<&str>)> = vec![
            (
                "cheapest first",
                vec![
                    cand("server", Some(0.9), Attempt(1)),
                    cand("nuc", Some(0.05), Attempt(1)),
                    cand("pi", Some(0.01), Attempt(1)),
                ],
                2,
                vec!["pi", "nuc"],
            ),
            (
                "an unpriced slot comes after every priced one",
                vec![cand("a", None, Attempt(1)), cand("b", Some(5.0), Attempt(1))],
                1,
                vec!["b"],
            ),
            (
                "equal prices: fewer recent failures first",
                vec![cand("a", Some(1.0), Attempt(3)), cand("b", Some(1.0), Attempt(1))],
                1,
                vec!["b"],
            ),
            (
                "all equal: by name",
                vec![cand("c", None, Attempt(1)), cand("a", None, Attempt(1))],
                2,
                vec!["a", "c"],
            ),
            (
                "an exhausted slot is skipped even when it is cheapest",
                vec![cand("cheap", Some(0.0), exhausted), cand("dear", Some(2.0), Attempt(2))],
                1,
                vec!["dear"],
            ),
            (
                "a machine pending pods wait for comes before a cheaper one",
                vec![cand("mini", Some(0.02), Attempt(1)), awaited("nas", Some(0.08))],
                1,
                vec!["nas"],
            ),
            (
                "awaited machines among themselves: cheapest first",
                vec![awaited("nas-2", Some(0.1)), awaited("nas-1", Some(0.08))],
                2,
                vec!["nas-1", "nas-2"],
            ),
            (
                "an exhausted machine is skipped even when pods wait for it",
                vec![
                    SlotCandidate { seed: exhausted, ..awaited("nas", Some(0.08)) },
                    cand("mini", Some(0.02), Attempt(1)),
                ],
                1,
                vec!["mini"],
            ),
            ("nothing wanted, nothing chosen", vec![cand("a", None, Attempt(1))], 0, vec![]),
        ];
        for (name, candidates, wanted, want) in table {
            let got = choose(&candidates, wanted, 0.0).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(names(&got), want, "{name}");
        }
    }

    #[test]
    fn a_machine_asleep_goes_first_within_the_margin() {
        use AttemptSeed::Attempt;
        let asleep =
            |name: &str, rate| SlotCandidate { asleep: true, ..cand(name, rate, Attempt(1)) };
        let table: Vec<(&str, Vec<SlotCandidate>, f64, Vec<&str>)> = vec![
            (
                "equal prices, no margin: the one asleep",
                vec![cand("a-off", Some(0.05), Attempt(1)), asleep("b-asleep", Some(0.05))],
                0.0,
                vec!["b-asleep"],
            ),
            (
                "dearer by less than the margin: the one asleep",
                vec![cand("off", Some(0.05), Attempt(1)), asleep("asleep", Some(0.06))],
                0.02,
                vec!["asleep"],
            ),
            (
                "dearer by more than the margin: the cheaper one off",
                vec![cand("off", Some(0.05), Attempt(1)), asleep("asleep", Some(0.09))],
                0.02,
                vec!["off"],
            ),
            (
                "no margin: price still decides",
                vec![cand("off", Some(0.05), Attempt(1)), asleep("asleep", Some(0.06))],
                0.0,
                vec!["off"],
            ),
            (
                "pending pods waiting for a machine still come first",
                vec![asleep("asleep", Some(0.01)), awaited("nas", Some(0.08))],
                1.0,
                vec!["nas"],
            ),
        ];
        for (name, candidates, margin, want) in table {
            let got = choose(&candidates, 1, margin).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(names(&got), want, "{name}");
        }
    }

    #[test]
    fn the_chosen_slot_carries_its_attempt() {
        let got = choose(&[cand("a", None, AttemptSeed::Attempt(2))], 1, 0.0).unwrap();
        assert_eq!(got, vec![ChosenSlot { name: "a".into(), attempt: 2 }]);
    }

    #[test]
    fn a_shortfall_names_the_exhausted_slots() {
        let retry_after = ts("2026-03-04T10:25:00Z");
        let candidates = vec![
            cand("a", None, AttemptSeed::Attempt(1)),
            cand("b", None, AttemptSeed::Exhausted { failures: 3, retry_after }),
        ];
        let err = choose(&candidates, 2, 0.0).unwrap_err();
        assert_eq!(err.bootable, 1);
        assert_eq!(
            err.exhausted,
            vec![ExhaustedSlot { slot: "b".into(), failures: 3, retry_after }]
        );
    }

    #[test]
    fn the_attempt_follows_the_newest_claim_else_the_digest() {
        use super::super::groups::tests::{claim, slot};
        use crate::api::{ClaimCall, NodeClaimPhase, NodeClaimStatus, SlotClaimDigest};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use std::sync::Arc;

        let mut with_digest = (*slot("a", "pool")).clone();
        with_digest.status = Some(crate::api::NodeStatus {
            last_claim: Some(SlotClaimDigest {
                name: "a-old".into(),
                phase: Some(NodeClaimPhase::Failed),
                attempt: 2,
                boot_committed: true,
                reached_ready: false,
                call: ClaimCall::IncreaseSize,
                group: "pool".into(),
                reason: Some("DeadlineExceeded".into()),
                deadline_at: None,
                finished_at: Some(Time(ts("2026-03-04T09:50:00Z"))),
            }),
            ..Default::default()
        });
        let no_claims = SlotState {
            slot: Arc::new(with_digest.clone()),
            claims: vec![],
            registered: false,
            asleep: false,
        };
        let now = ts("2026-03-04T10:00:00Z");
        assert_eq!(
            candidate(&no_claims, &crate::fixtures::group("pool").spec, now).seed,
            AttemptSeed::Attempt(3)
        );

        let mut failed = claim("a-new", "a", Some(NodeClaimPhase::Failed), "2026-03-04T09:55:00Z");
        failed.spec.attempt = Some(3);
        failed.status = Some(NodeClaimStatus {
            phase: Some(NodeClaimPhase::Failed),
            boot_committed_at: Some(Time(ts("2026-03-04T09:55:10Z"))),
            finished_at: Some(Time(ts("2026-03-04T09:59:00Z"))),
            ..Default::default()
        });
        let with_claim = SlotState {
            slot: Arc::new(with_digest),
            claims: vec![Arc::new(failed)],
            registered: false,
            asleep: false,
        };
        assert!(matches!(
            candidate(&with_claim, &crate::fixtures::group("pool").spec, now).seed,
            AttemptSeed::Exhausted { .. }
        ));
    }

    #[test]
    fn a_reset_annotation_ends_the_streak() {
        use super::super::groups::tests::{claim, slot};
        use crate::api::NodeClaimStatus;
        use crate::api::{ANNOTATION_ATTEMPTS_RESET_AT, NodeClaimPhase};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use std::sync::Arc;

        let mut reset = (*slot("a", "pool")).clone();
        reset.metadata.annotations = Some(
            [(ANNOTATION_ATTEMPTS_RESET_AT.to_string(), "2026-03-04T09:59:30Z".into())].into(),
        );
        let mut failed = claim("a-3", "a", Some(NodeClaimPhase::Failed), "2026-03-04T09:45:00Z");
        failed.spec.attempt = Some(3);
        failed.status = Some(NodeClaimStatus {
            phase: Some(NodeClaimPhase::Failed),
            boot_committed_at: Some(Time(ts("2026-03-04T09:45:10Z"))),
            finished_at: Some(Time(ts("2026-03-04T09:59:00Z"))),
            ..Default::default()
        });
        let state = SlotState {
            slot: Arc::new(reset),
            claims: vec![Arc::new(failed)],
            registered: false,
            asleep: false,
        };
        let now = ts("2026-03-04T10:00:00Z");
        assert_eq!(
            candidate(&state, &crate::fixtures::group("pool").spec, now).seed,
            AttemptSeed::Attempt(1)
        );
    }
}
