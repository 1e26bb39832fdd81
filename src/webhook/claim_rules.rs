//! NodeClaim admission: what is stamped on create, and the rules judged at write time (the slot
//! exists and is in the requested pool, one live claim per slot, the attempt bound, an honest
//! request time, a deadline only the operator may clear, a pin's end that lies ahead, and no
//! boot while the pool's UPS runs on battery but a pin's that says `bootOnBattery`).

use jiff::{SignedDuration, Timestamp};
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::verdict::{Findings, Verdict};
use crate::api::{Group, LABEL_GROUP, LABEL_SLOT, Node, NodeClaim, NodeClaimPhase};
use crate::claim::{self, AttemptSeed, DEFAULT_CLAIM_TTL_SECONDS};
use crate::phase;

/// How far a client-supplied `requestedAt` may be from the API server's clock.
pub const REQUESTED_AT_SKEW: SignedDuration = SignedDuration::from_mins(5);

/// What the rules read of the cluster for one claim.
pub struct ClaimFacts<'a> {
    pub namespace: &'a str,
    pub slot: Option<&'a Node>,
    pub group: Option<&'a Group>,
    /// Every other claim of the slot (not the one under review), live or not.
    pub other_claims_of_slot: &'a [NodeClaim],
    pub now: Timestamp,
    /// The timeouts the operator runs with; the deadline follows from them.
    pub timeouts: claim::Timeouts,
}

impl ClaimFacts<'_> {
    fn seed(&self) -> Option<AttemptSeed> {
        let slot = self.slot?;
        let prior = claim::prior_of_slot(slot, self.other_claims_of_slot);
        Some(claim::seed_attempt(prior, claim::reset_of_slot(slot), self.now))
    }

    fn group_provision_time(&self) -> Option<kube::core::Duration> {
        self.group.and_then(|g| g.spec.max_node_provision_time)
    }
}

/// The values admission stamps on a new claim, given what the client sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Stamp {
    pub requested_at: Timestamp,
    pub requested_by: String,
    pub attempt: Option<i32>,
    pub deadline_at: Timestamp,
    pub max_node_provision_time: Option<kube::core::Duration>,
    pub ttl_seconds_after_finished: i32,
}

/// Computes the stamp. Fields the client set are kept where they are the client's to say
/// (requestedAt, requestedBy, the TTL); the ones that follow from the cluster are computed.
pub fn stamp(claim: &NodeClaim, username: &str, facts: &ClaimFacts<'_>) -> Stamp {
    let requested_at = claim.spec.requested_at.as_ref().map_or(facts.now, |t| t.0);
    let mnpt = facts.group_provision_time();
    Stamp {
        requested_at,
        requested_by: claim.spec.requested_by.clone().unwrap_or_else(|| username.to_string()),
        attempt: match facts.seed() {
            Some(AttemptSeed::Attempt(n)) => Some(n),
            _ => claim.spec.attempt,
        },
        deadline_at: facts.timeouts.deadline_at(requested_at, mnpt.map(Into::into)),
        max_node_provision_time: mnpt,
        ttl_seconds_after_finished: claim
            .spec
            .ttl_seconds_after_finished
            .unwrap_or(DEFAULT_CLAIM_TTL_SECONDS),
    }
}

/// The warning for a client that sent its own `spec.attempt` and got the stamp's instead: the
/// number is admission's (it follows the slot's claims), so it is replaced, not refused. The
/// operator's provider sends the number it counted from its own cache; the stamp corrects it
/// without a word.
pub fn replaced_attempt_warning(
    claim: &NodeClaim,
    stamp: &Stamp,
    is_operator: bool,
) -> Option<String> {
    let (sent, stamped) = (claim.spec.attempt?, stamp.attempt?);
    (sent != stamped && !is_operator).then(|| {
        format!(
            "spec.attempt: this claim is attempt {stamped} for slot {:?}, not {sent}: admission \
             numbers attempts from the slot's claims, so it was set to {stamped}; leave it unset",
            claim.spec.slot_ref.name
        )
    })
}

/// The JSON patch that writes the stamp (and the selection labels) onto a new claim. Empty when
/// the claim already carries it, so a reinvocation changes nothing.
pub fn stamp_patch(claim: &NodeClaim, stamp: &Stamp) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    let mut set = |path: &[&str], value: serde_json::Value| {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(path.iter().copied()),
            value,
        }));
    };
    let spec = &claim.spec;
    if spec.requested_at.as_ref().map(|t| t.0) != Some(stamp.requested_at) {
        set(&["spec", "requestedAt"], json!(Time(stamp.requested_at)));
    }
    if spec.requested_by.as_deref() != Some(stamp.requested_by.as_str()) {
        set(&["spec", "requestedBy"], json!(stamp.requested_by));
    }
    if let Some(attempt) = stamp.attempt.filter(|a| spec.attempt != Some(*a)) {
        set(&["spec", "attempt"], json!(attempt));
    }
    if spec.deadline_at.as_ref().map(|t| t.0) != Some(stamp.deadline_at) {
        set(&["spec", "deadlineAt"], json!(Time(stamp.deadline_at)));
    }
    if let Some(mnpt) =
        stamp.max_node_provision_time.filter(|m| spec.max_node_provision_time != Some(*m))
    {
        set(&["spec", "maxNodeProvisionTime"], json!(mnpt));
    }
    if spec.ttl_seconds_after_finished != Some(stamp.ttl_seconds_after_finished) {
        set(&["spec", "ttlSecondsAfterFinished"], json!(stamp.ttl_seconds_after_finished));
    }
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    let wanted =
        [(LABEL_GROUP, spec.request.group.as_str()), (LABEL_SLOT, spec.slot_ref.name.as_str())];
    if claim.metadata.labels.is_none() {
        set(
            &["metadata", "labels"],
            json!(wanted.iter().cloned().collect::<std::collections::BTreeMap<_, _>>()),
        );
    } else {
        for (key, value) in wanted {
            if labels.get(key).map(String::as_str) != Some(value) {
                set(&["metadata", "labels", key], json!(value));
            }
        }
    }
    ops
}

/// The rules of a new claim.
pub fn validate_create(claim: &NodeClaim, facts: &ClaimFacts<'_>) -> Verdict {
    let mut findings = Findings::default();
    let ns = facts.namespace;
    let slot_name = &claim.spec.slot_ref.name;
    let group_name = &claim.spec.request.group;

    let Some(slot) = facts.slot else {
        findings.invalid(
            "slot_exists",
            format!(
                "spec.slotRef.name: there is no slot {slot_name:?} in namespace {ns:?}; \
             list the slots with `kubectl get nodes.infra.homecluster.dev -n {ns}`"
            ),
        );
        return findings.verdict();
    };
    let slot_group = slot.group();
    if slot_group != Some(group_name.as_str()) {
        findings.invalid(
            "group_matches_slot",
            format!(
                "spec.request.group: slot {slot_name:?} belongs to group {:?}, not {group_name:?}; \
             set spec.request.group to the slot's group",
                slot_group.unwrap_or("<none>")
            ),
        );
    }
    if facts.group.is_none() {
        findings.invalid(
            "group_exists",
            format!("spec.request.group: there is no group {group_name:?} in namespace {ns:?}"),
        );
    }
    if slot.metadata.deletion_timestamp.is_some() {
        findings.forbidden(
            "slot_not_deleting",
            format!("slot {slot_name:?} is being deleted and takes no new claim"),
        );
    }
    if let Some(requested_at) = claim.spec.requested_at.as_ref().map(|t| t.0) {
        let skew = requested_at.duration_since(facts.now).abs();
        if skew > REQUESTED_AT_SKEW {
            findings.invalid(
                "requested_now",
                format!(
                "spec.requestedAt: {requested_at} is {} from the API server's clock; the deadline \
                 runs from it, so it must be the time of the request: leave it unset",
                format_duration(skew)
            ));
        }
    }
    if let Some(message) = until_not_ahead(claim, facts.now) {
        findings.invalid("until_ahead", message);
    }
    let live_others: Vec<&NodeClaim> =
        facts.other_claims_of_slot.iter().filter(|c| phase::is_live(phase::of(c).into())).collect();
    for other in &live_others {
        findings.forbidden(
            "one_live_claim_per_slot",
            format!(
                "slot {slot_name:?} already has live claim {:?} (phase {}); a slot takes one live \
             claim at a time: {}",
                other.metadata.name.as_deref().unwrap_or(""),
                phase_name(other),
                what_to_do_about(other, slot)
            ),
        );
    }
    if !live_others.is_empty() {
        // The live claim decides; the streak is judged once it has ended.
        return findings.verdict();
    }
    // A claim on a free slot boots its machine: not while the pool runs on battery.
    let boot_on_battery = claim.spec.boot_on_battery == Some(true);
    if let Some(why) =
        facts.group.and_then(|g| crate::ups::boots::battery_refusal(g, boot_on_battery, facts.now))
    {
        findings.forbidden("no_boot_on_battery", why);
    }
    // Only the bound is judged here. The number itself is the stamp's: the mutating call wrote
    // it from the claims it saw, and a failure written between the two calls of this request
    // would make any comparison here refuse a claim whose client never chose a number.
    if let Some(AttemptSeed::Exhausted { failures, retry_after }) = facts.seed() {
        findings.forbidden(
            "attempts_not_exhausted",
            format!(
                "slot {slot_name:?} failed {failures} boots in a row and takes no claim until \
                 {retry_after}; fix its startup Job, then reset the streak now with \
                 `kubectl annotate node.infra.homecluster.dev {slot_name} -n {ns} \
                 infra.homecluster.dev/attempts-reset-at=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite`"
            ),
        );
    }
    findings.verdict()
}

/// Why a claim's `spec.until` is refused at `now`: it ends the pin, so it must lie ahead.
fn until_not_ahead(claim: &NodeClaim, now: Timestamp) -> Option<String> {
    let until = claim.spec.until.as_ref()?.0;
    (until <= now).then(|| {
        format!(
            "spec.until: {until} is not after now ({now}); it is when the pin ends and its machine \
             is released, so it must lie ahead: set a later time (`homelab-autoscaler keep-on \
             --slot {slot} --for 2h`), leave it unset to keep the machine on until the claim is \
             deleted, or delete the claim to release the machine now",
            slot = claim.spec.slot_ref.name
        )
    })
}

/// The rules of a changed claim (the schema already keeps the request immutable). `spec.until`
/// may move, earlier or later, while the claim is live, never into the past.
pub fn validate_update(
    old: &NodeClaim,
    new: &NodeClaim,
    is_operator: bool,
    now: Timestamp,
) -> Verdict {
    let mut findings = Findings::default();
    if old.spec.until != new.spec.until {
        if !phase::is_live(Some(phase::of(old))) {
            findings.forbidden(
                "until_while_live",
                format!(
                    "spec.until: claim {:?} has ended (phase {}); its end can no longer move: \
                     create a new claim (`homelab-autoscaler keep-on --slot {}`)",
                    old.metadata.name.as_deref().unwrap_or(""),
                    phase_name(old),
                    old.spec.slot_ref.name
                ),
            );
        } else if let Some(message) = until_not_ahead(new, now) {
            findings.invalid("until_ahead", message);
        }
    }
    if old.spec.deadline_at != new.spec.deadline_at {
        if new.spec.deadline_at.is_some() {
            findings.forbidden(
                "deadline_set_once",
                "spec.deadlineAt is set once, at admission; it can only be cleared, by the operator, when the machine is ready",
            );
        } else if !is_operator {
            findings.forbidden(
                "deadline_cleared_by_operator",
                "spec.deadlineAt is cleared only by the operator, when the machine is ready; to cancel the claim, delete it",
            );
        }
    }
    findings.verdict()
}

/// What a person can do about the live claim `other` that keeps `slot` from a new one. A claim
/// already being deleted is on its way out: its machine is drained and powered off first, and
/// a disruption budget may hold that drain (the slot's `Drained` condition says which).
fn what_to_do_about(other: &NodeClaim, slot: &Node) -> String {
    if other.metadata.deletion_timestamp.is_none() {
        return format!("wait for it to end, or {}", deletion_effect(phase::of(other)));
    }
    let held = slot
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Drained" && c.status == "False"));
    match held {
        Some(hold) => format!(
            "it is being deleted, and the slot takes a new claim once its machine is off, but a \
             disruption budget holds the machine on: {}",
            hold.message
        ),
        None => "it is being deleted: its machine is drained and powered off, and the slot takes \
                 a new claim once its machine is off: wait for it"
            .to_string(),
    }
}

/// What deleting a live claim does, so a person knows what a delete costs before running it.
fn deletion_effect(phase: NodeClaimPhase) -> &'static str {
    match phase {
        NodeClaimPhase::Pending => "delete it to cancel it (nothing has started yet)",
        NodeClaimPhase::Booting => {
            "delete it to release the machine: its boot runs to the end, then the machine is \
             drained and powered off, and the slot takes a new claim once it is off"
        }
        // Terminal claims are not live; listed so the match stays exhaustive.
        NodeClaimPhase::Ready | NodeClaimPhase::Completed | NodeClaimPhase::Failed => {
            "delete it to release the machine: it is cordoned, drained (its pods are evicted) \
             and powered off, and the slot takes a new claim once it is off"
        }
    }
}

fn phase_name(claim: &NodeClaim) -> String {
    serde_json::to_value(phase::of(claim))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn format_duration(d: SignedDuration) -> String {
    format!("{}s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ClaimCall, NodeClaimPhase, NodeClaimStatus, SlotClaimDigest};
    use crate::fixtures::{at, claim, claim_in, group, slot};

    const NOW: &str = "2026-03-04T09:38:15Z";

    fn facts<'a>(
        slot: Option<&'a Node>,
        group: Option<&'a Group>,
        others: &'a [NodeClaim],
    ) -> ClaimFacts<'a> {
        ClaimFacts {
            namespace: "ns",
            slot,
            group,
            other_claims_of_slot: others,
            now: NOW.parse().unwrap(),
            timeouts: claim::Timeouts::default(),
        }
    }

    fn failed_claim(name: &str, attempt: i32, finished: &str) -> NodeClaim {
        let mut c = claim_in(name, "slot-a", Some(NodeClaimPhase::Failed), "2026-03-04T09:00:00Z");
        c.spec.attempt = Some(attempt);
        c.status = Some(NodeClaimStatus {
            phase: Some(NodeClaimPhase::Failed),
            boot_committed_at: Some(at("2026-03-04T09:01:00Z")),
            finished_at: Some(at(finished)),
            reason: Some("StartupJobFailed".into()),
            ..NodeClaimStatus::default()
        });
        c
    }

    #[test]
    fn a_new_claim_is_stamped_with_the_computed_fields() {
        let (s, mut g) = (slot("slot-a", "pool"), group("pool"));
        g.spec.max_node_provision_time = Some("20m".parse().unwrap());
        let c = claim("slot-a-x", "slot-a", "pool");
        let stamp = stamp(&c, "system:serviceaccount:ns:ca", &facts(Some(&s), Some(&g), &[]));
        assert_eq!(stamp.requested_at, NOW.parse::<Timestamp>().unwrap());
        assert_eq!(stamp.requested_by, "system:serviceaccount:ns:ca");
        assert_eq!(stamp.attempt, Some(1));
        assert_eq!(stamp.deadline_at, "2026-03-04T09:58:15Z".parse::<Timestamp>().unwrap());
        assert_eq!(stamp.max_node_provision_time, Some("20m".parse().unwrap()));
        assert_eq!(stamp.ttl_seconds_after_finished, DEFAULT_CLAIM_TTL_SECONDS);
        assert!(!stamp_patch(&c, &stamp).is_empty());
    }

    #[test]
    fn stamping_is_idempotent() {
        let (s, g) = (slot("slot-a", "pool"), group("pool"));
        let mut c = claim("slot-a-x", "slot-a", "pool");
        let f = facts(Some(&s), Some(&g), &[]);
        let first = stamp(&c, "alice", &f);
        let patch = json_patch::Patch(stamp_patch(&c, &first));
        let mut value = serde_json::to_value(&c).unwrap();
        json_patch::patch(&mut value, &patch).expect("patch applies");
        c = serde_json::from_value(value).unwrap();
        assert_eq!(c.spec.requested_by.as_deref(), Some("alice"));
        assert_eq!(c.metadata.labels.as_ref().unwrap()[LABEL_SLOT], "slot-a");
        let second = stamp(&c, "bob", &f);
        assert_eq!(second, first, "a reinvocation computes the same stamp");
        assert!(stamp_patch(&c, &second).is_empty(), "and patches nothing");
    }

    #[test]
    fn the_attempt_follows_the_slots_last_claim() {
        let (s, g) = (slot("slot-a", "pool"), group("pool"));
        let others = [failed_claim("old", 2, "2026-03-04T09:30:00Z")];
        let c = claim("slot-a-x", "slot-a", "pool");
        assert_eq!(stamp(&c, "u", &facts(Some(&s), Some(&g), &others)).attempt, Some(3));
        // With every claim collected, the slot's digest carries the streak.
        let mut s = s;
        s.status = Some(crate::api::NodeStatus {
            last_claim: Some(SlotClaimDigest {
                name: "gone".into(),
                phase: Some(NodeClaimPhase::Failed),
                attempt: 1,
                boot_committed: true,
                reached_ready: false,
                call: ClaimCall::IncreaseSize,
                group: "pool".into(),
                reason: None,
                deadline_at: None,
                finished_at: Some(at("2026-03-04T09:30:00Z")),
            }),
            ..Default::default()
        });
        assert_eq!(stamp(&c, "u", &facts(Some(&s), Some(&g), &[])).attempt, Some(2));
    }

    fn denial(v: Verdict) -> (u16, String) {
        match v {
            Verdict::Deny(d) => (d.code, d.message),
            Verdict::Allow { .. } => panic!("expected a denial"),
        }
    }

    #[test]
    fn a_pool_on_battery_takes_only_a_battery_pin() {
        use crate::api::{
            ClaimCall, GroupPowerStatus, GroupStatus, OnBattery, OnMains, PowerSource, UpsPolicy,
        };
        let s = slot("slot-a", "pool");
        let mut g = group("pool");
        g.spec.ups = Some(UpsPolicy {
            name: "ups@nut:3493".into(),
            credentials_secret: None,
            poll_interval: None,
            on_battery: OnBattery::default(),
            on_mains: OnMains::default(),
        });
        let facts_now = facts(Some(&s), Some(&g), &[]);
        g.status = Some(GroupStatus {
            power: Some(GroupPowerStatus {
                ups: "ups@nut:3493".into(),
                source: PowerSource::Battery,
                read_at: Some(Time(facts_now.now)),
                charge_percent: Some(80.0),
                ..GroupPowerStatus::default()
            }),
            ..GroupStatus::default()
        });
        let scaler = claim("slot-a-x", "slot-a", "pool");
        let (code, msg) = denial(validate_create(&scaler, &facts(Some(&s), Some(&g), &[])));
        assert_eq!(code, 403);
        assert!(
            msg.contains("runs on battery") && msg.contains("spec.bootOnBattery: true"),
            "{msg}"
        );
        let mut pin = claim("slot-a-pin", "slot-a", "pool");
        pin.spec.request.call = ClaimCall::Manual;
        pin.spec.request.delta = None;
        assert!(!validate_create(&pin, &facts(Some(&s), Some(&g), &[])).is_allowed());
        pin.spec.boot_on_battery = Some(true);
        assert!(validate_create(&pin, &facts(Some(&s), Some(&g), &[])).is_allowed());
    }

    #[test]
    fn create_rules_table() {
        let s = slot("slot-a", "pool");
        let g = group("pool");
        let ok = claim("slot-a-x", "slot-a", "pool");
        assert_eq!(validate_create(&ok, &facts(Some(&s), Some(&g), &[])), Verdict::allow());

        let (code, msg) = denial(validate_create(&ok, &facts(None, Some(&g), &[])));
        assert_eq!(code, 422);
        assert!(
            msg.contains("no slot \"slot-a\"")
                && msg.contains("kubectl get nodes.infra.homecluster.dev"),
            "{msg}"
        );

        let other_group = claim("slot-a-x", "slot-a", "other");
        let (code, msg) = denial(validate_create(&other_group, &facts(Some(&s), None, &[])));
        assert_eq!(code, 422);
        assert!(
            msg.contains("belongs to group \"pool\"") && msg.contains("no group \"other\""),
            "{msg}"
        );

        let live = [claim_in(
            "slot-a-old",
            "slot-a",
            Some(NodeClaimPhase::Booting),
            "2026-03-04T09:00:00Z",
        )];
        let (code, msg) = denial(validate_create(&ok, &facts(Some(&s), Some(&g), &live)));
        assert_eq!(code, 403);
        assert!(msg.contains("slot-a-old") && msg.contains("phase booting"), "{msg}");

        let ended = [claim_in(
            "slot-a-old",
            "slot-a",
            Some(NodeClaimPhase::Completed),
            "2026-03-04T09:00:00Z",
        )];
        assert!(validate_create(&ok, &facts(Some(&s), Some(&g), &ended)).is_allowed());

        let exhausted = [failed_claim("slot-a-old", 3, "2026-03-04T09:30:00Z")];
        let (code, msg) = denial(validate_create(&ok, &facts(Some(&s), Some(&g), &exhausted)));
        assert_eq!(code, 403);
        assert!(msg.contains("failed 3 boots") && msg.contains("attempts-reset-at"), "{msg}");

        let mut stale = ok.clone();
        stale.spec.requested_at = Some(at("2026-03-04T08:00:00Z"));
        let (code, msg) = denial(validate_create(&stale, &facts(Some(&s), Some(&g), &[])));
        assert_eq!(code, 422);
        assert!(msg.contains("spec.requestedAt"), "{msg}");

        // The number is the stamp's: validation does not compare it (see the next test).
        let mut other_number = ok.clone();
        other_number.spec.attempt = Some(2);
        assert!(validate_create(&other_number, &facts(Some(&s), Some(&g), &[])).is_allowed());
    }

    #[test]
    fn a_sent_attempt_is_replaced_by_the_stamp_with_a_warning_for_people() {
        let (s, g) = (slot("slot-a", "pool"), group("pool"));
        let f = facts(Some(&s), Some(&g), &[]);
        let mut sent = claim("c", "slot-a", "pool");
        sent.spec.attempt = Some(5);
        let stamped = stamp(&sent, "alice", &f);
        assert_eq!(stamped.attempt, Some(1), "the slot's next number, not the sent one");
        let warning = replaced_attempt_warning(&sent, &stamped, false).expect("a warning");
        assert!(
            warning.contains("attempt 1")
                && warning.contains("not 5")
                && warning.contains("leave it unset"),
            "{warning}"
        );
        assert_eq!(
            replaced_attempt_warning(&sent, &stamped, true),
            None,
            "the operator's provider"
        );
        sent.spec.attempt = Some(1);
        assert_eq!(replaced_attempt_warning(&sent, &stamped, false), None, "the right number");
        sent.spec.attempt = None;
        assert_eq!(replaced_attempt_warning(&sent, &stamped, false), None, "left unset");
    }

    #[test]
    fn only_the_operator_clears_the_deadline_and_nobody_moves_it() {
        let mut old = claim("c", "slot-a", "pool");
        old.spec.deadline_at = Some(at("2026-03-04T09:50:25Z"));
        let mut cleared = old.clone();
        cleared.spec.deadline_at = None;
        let mut moved = old.clone();
        moved.spec.deadline_at = Some(at("2026-03-04T10:50:25Z"));
        let now = NOW.parse().unwrap();
        assert!(validate_update(&old, &cleared, true, now).is_allowed());
        assert_eq!(denial(validate_update(&old, &cleared, false, now)).0, 403);
        assert_eq!(denial(validate_update(&old, &moved, true, now)).0, 403);
        assert!(validate_update(&old, &old, false, now).is_allowed());
    }

    /// A claim already being deleted is not told to be deleted: its machine is on its way off,
    /// and where a disruption budget holds the drain, the refusal says what holds it.
    #[test]
    fn a_slot_whose_claim_is_being_released_says_what_it_waits_for() {
        let g = group("pool");
        let ok = claim("slot-a-x", "slot-a", "pool");
        let mut releasing =
            claim_in("slot-a-old", "slot-a", Some(NodeClaimPhase::Ready), "2026-03-04T09:00:00Z");
        releasing.metadata.deletion_timestamp = Some(at("2026-03-04T09:30:00Z"));
        let held = "eviction refused for pod data/db-0 (refused by PodDisruptionBudget data/db): \
                    the machine stays on, cordoned, until the budget allows it. To let it go: run \
                    another replica elsewhere, relax the budget, or delete the pod";
        let mut holding = slot("slot-a", "pool");
        holding.status = Some(crate::api::NodeStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "Drained".into(),
                status: "False".into(),
                reason: "DisruptionBudget".into(),
                message: held.into(),
                last_transition_time: at("2026-03-04T09:30:05Z"),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let plain = slot("slot-a", "pool");
        let ready = claim_in("slot-a-old", "slot-a", Some(NodeClaimPhase::Ready), NOW);
        // (case, slot, the live claim, what the refusal says, what it must not say)
        let table = [
            ("held by a budget", &holding, &releasing, vec!["being deleted", held], "delete it"),
            (
                "on its way off",
                &plain,
                &releasing,
                vec!["being deleted", "once its machine is off: wait"],
                "delete it",
            ),
            ("live and wanted", &plain, &ready, vec!["delete it to release the machine"], "held"),
        ];
        for (case, s, live, says, not) in table {
            let others = [live.clone()];
            let (code, msg) = denial(validate_create(&ok, &facts(Some(s), Some(&g), &others)));
            assert_eq!(code, 403, "{case}");
            for part in says {
                assert!(msg.contains(part), "{case}: {msg}");
            }
            assert!(!msg.contains(not), "{case}: {msg}");
        }
    }

    fn pin(until: Option<&str>, phase: Option<NodeClaimPhase>) -> NodeClaim {
        let mut c = claim_in("pin", "slot-a", phase, "2026-03-04T09:00:00Z");
        c.spec.request.call = ClaimCall::Manual;
        c.spec.request.delta = None;
        c.spec.until = until.map(at);
        c
    }

    #[test]
    fn a_new_pin_must_end_after_now() {
        let (s, g) = (slot("slot-a", "pool"), group("pool"));
        let f = facts(Some(&s), Some(&g), &[]);
        // (until, allowed)
        let table = [
            (None, true),
            (Some("2026-03-04T09:38:16Z"), true),
            (Some(NOW), false),
            (Some("2026-03-04T08:00:00Z"), false),
        ];
        for (until, allowed) in table {
            let verdict = validate_create(&pin(until, None), &f);
            if allowed {
                assert!(verdict.is_allowed(), "until {until:?}");
            } else {
                let (code, msg) = denial(verdict);
                assert_eq!(code, 422, "until {until:?}");
                assert!(msg.contains("spec.until") && msg.contains("is not after now"), "{msg}");
                assert!(msg.contains("keep-on --slot slot-a"), "{msg}");
            }
        }
    }

    #[test]
    fn a_live_pin_may_move_its_end_but_not_into_the_past() {
        let now: Timestamp = NOW.parse().unwrap();
        let ready = Some(NodeClaimPhase::Ready);
        let old = pin(Some("2026-03-04T10:00:00Z"), ready);
        // (new until, phase of the old claim, expected: None = allowed, Some(code))
        let table = [
            (Some("2026-03-04T12:00:00Z"), ready, None),
            (Some("2026-03-04T09:40:00Z"), ready, None),
            (None, ready, None),
            (Some("2026-03-04T10:00:00Z"), ready, None),
            (Some("2026-03-04T09:00:00Z"), ready, Some(422)),
            (Some(NOW), Some(NodeClaimPhase::Pending), Some(422)),
            (Some("2026-03-04T12:00:00Z"), Some(NodeClaimPhase::Completed), Some(403)),
        ];
        for (until, phase, expected) in table {
            let mut old = old.clone();
            old.status.as_mut().unwrap().phase = phase;
            let mut new = old.clone();
            new.spec.until = until.map(at);
            let verdict = validate_update(&old, &new, false, now);
            match expected {
                None => assert!(verdict.is_allowed(), "{until:?} on {phase:?}"),
                Some(code) => assert_eq!(denial(verdict).0, code, "{until:?} on {phase:?}"),
            }
        }
        // An unchanged end that has passed does not block other updates (a finalizer's removal).
        let passed = pin(Some("2026-03-04T09:00:00Z"), ready);
        assert!(validate_update(&passed, &passed, true, now).is_allowed());
    }
}
