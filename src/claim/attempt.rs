//! The attempt number of a new claim. Attempts are a property of the request: a claim is
//! attempt 1 after a success (or with no history), one more than the last after a failed boot,
//! and the same as the last when the last claim never started a boot (it bought no machine).
//! A streak ends with a success, a person's reset, or a quiet spell of
//! [`ATTEMPT_RESET_GRACE`](super::ATTEMPT_RESET_GRACE).

use jiff::{SignedDuration, Timestamp};

use super::{ATTEMPT_RESET_GRACE, MAX_CONSECUTIVE_ATTEMPTS};
use crate::api::{ANNOTATION_ATTEMPTS_RESET_AT, Node, NodeClaim, NodeClaimPhase, SlotClaimDigest};

/// What the new claim's number depends on: the slot's newest claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PriorClaim {
    pub attempt: i32,
    /// The claim started a boot (pending → booting): it spent its attempt.
    pub boot_committed: bool,
    /// Its machine became ready at some point: the attempt succeeded.
    pub reached_ready: bool,
    /// When it ended, if it has.
    pub finished_at: Option<Timestamp>,
}

impl From<&SlotClaimDigest> for PriorClaim {
    fn from(d: &SlotClaimDigest) -> Self {
        Self {
            attempt: d.attempt,
            boot_committed: d.boot_committed,
            reached_ready: d.reached_ready,
            finished_at: d.finished_at.as_ref().map(|t| t.0),
        }
    }
}

impl From<&NodeClaim> for PriorClaim {
    fn from(claim: &NodeClaim) -> Self {
        let status = claim.status.as_ref();
        let phase = crate::phase::of(claim);
        Self {
            attempt: claim.spec.attempt.unwrap_or(1),
            boot_committed: status.is_some_and(|s| s.boot_committed_at.is_some())
                || phase == NodeClaimPhase::Booting,
            reached_ready: status.is_some_and(|s| s.ready_at.is_some())
                || phase == NodeClaimPhase::Ready,
            finished_at: status.and_then(|s| s.finished_at.as_ref()).map(|t| t.0),
        }
    }
}

/// The claim a new claim's number follows: the slot's newest existing claim (by creation, then
/// name), or, when every claim has been collected, the digest the slot kept of the last one.
pub fn prior_of_slot<'a>(
    slot: &Node,
    claims_of_slot: impl IntoIterator<Item = &'a NodeClaim>,
) -> Option<PriorClaim> {
    let newest = claims_of_slot.into_iter().max_by(|a, b| {
        let key = |c: &'a NodeClaim| {
            (c.metadata.creation_timestamp.as_ref().map(|t| t.0), c.metadata.name.clone())
        };
        key(a).cmp(&key(b))
    });
    match newest {
        Some(claim) => Some(PriorClaim::from(claim)),
        None => slot.status.as_ref().and_then(|s| s.last_claim.as_ref()).map(PriorClaim::from),
    }
}

/// A person's reset of the slot's failure streak, from its annotation. An unparsable value is
/// ignored (and reported by the slot webhook).
pub fn reset_of_slot(slot: &Node) -> Option<Timestamp> {
    slot.metadata.annotations.as_ref()?.get(ANNOTATION_ATTEMPTS_RESET_AT)?.parse().ok()
}

/// The number of the next claim, or why there is none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptSeed {
    Attempt(i32),
    /// The slot failed `failures` boots in a row; it takes no claim until `retry_after` (or
    /// a reset by hand).
    Exhausted {
        failures: i32,
        retry_after: Timestamp,
    },
}

/// Seeds the attempt of a new claim on a slot. `reset_at` is a person's reset of the streak
/// (the slot's attempts-reset-at annotation).
pub fn seed_attempt(
    last: Option<PriorClaim>,
    reset_at: Option<Timestamp>,
    now: Timestamp,
) -> AttemptSeed {
    let Some(last) = last else { return AttemptSeed::Attempt(1) };
    if last.reached_ready {
        return AttemptSeed::Attempt(1);
    }
    if !last.boot_committed {
        // Cancelled or superseded before it booted: it spent nothing, its number is still free.
        return AttemptSeed::Attempt(last.attempt.max(1));
    }
    let grace = SignedDuration::try_from(ATTEMPT_RESET_GRACE).unwrap_or(SignedDuration::MAX);
    if let Some(finished) = last.finished_at {
        let cooled_off = finished.checked_add(grace).is_ok_and(|end| end <= now);
        let reset_by_hand = reset_at.is_some_and(|r| r >= finished);
        if cooled_off || reset_by_hand {
            return AttemptSeed::Attempt(1);
        }
    }
    let next = last.attempt.max(1) + 1;
    if next > MAX_CONSECUTIVE_ATTEMPTS {
        let retry_after = last
            .finished_at
            .and_then(|f| f.checked_add(grace).ok())
            .unwrap_or_else(|| now.checked_add(grace).unwrap_or(Timestamp::MAX));
        return AttemptSeed::Exhausted { failures: last.attempt, retry_after };
    }
    AttemptSeed::Attempt(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn failed(attempt: i32, at: &str) -> PriorClaim {
        PriorClaim { attempt, boot_committed: true, reached_ready: false, finished_at: Some(t(at)) }
    }

    #[test]
    fn seed_table() {
        let now = t("2026-03-04T10:00:00Z");
        let table: &[(&str, Option<PriorClaim>, Option<Timestamp>, AttemptSeed)] = &[
            ("no history", None, None, AttemptSeed::Attempt(1)),
            (
                "after a success",
                Some(PriorClaim {
                    attempt: 3,
                    boot_committed: true,
                    reached_ready: true,
                    finished_at: Some(now),
                }),
                None,
                AttemptSeed::Attempt(1),
            ),
            (
                "after one failure",
                Some(failed(1, "2026-03-04T09:55:00Z")),
                None,
                AttemptSeed::Attempt(2),
            ),
            (
                "after two failures",
                Some(failed(2, "2026-03-04T09:55:00Z")),
                None,
                AttemptSeed::Attempt(3),
            ),
            (
                "a cancelled pending claim spends nothing",
                Some(PriorClaim {
                    attempt: 2,
                    boot_committed: false,
                    reached_ready: false,
                    finished_at: Some(now),
                }),
                None,
                AttemptSeed::Attempt(2),
            ),
            (
                "three failures exhaust the slot",
                Some(failed(3, "2026-03-04T09:55:00Z")),
                None,
                AttemptSeed::Exhausted { failures: 3, retry_after: t("2026-03-04T10:25:00Z") },
            ),
            (
                "the streak cools off after the grace",
                Some(failed(3, "2026-03-04T09:30:00Z")),
                None,
                AttemptSeed::Attempt(1),
            ),
            (
                "a person's reset after the failure ends the streak",
                Some(failed(3, "2026-03-04T09:55:00Z")),
                Some(t("2026-03-04T09:58:00Z")),
                AttemptSeed::Attempt(1),
            ),
            (
                "a reset older than the failure does not",
                Some(failed(2, "2026-03-04T09:55:00Z")),
                Some(t("2026-03-04T09:00:00Z")),
                AttemptSeed::Attempt(3),
            ),
            (
                "a boot still in flight counts as spent",
                Some(PriorClaim {
                    attempt: 1,
                    boot_committed: true,
                    reached_ready: false,
                    finished_at: None,
                }),
                None,
                AttemptSeed::Attempt(2),
            ),
        ];
        for (name, last, reset, want) in table {
            assert_eq!(seed_attempt(*last, *reset, now), *want, "{name}");
        }
    }
}
