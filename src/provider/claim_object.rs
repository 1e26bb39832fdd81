//! The NodeClaim object IncreaseSize creates. The provider stamps everything admission would
//! (requestedAt, attempt, deadlineAt, maxNodeProvisionTime, ttlSecondsAfterFinished), because
//! the claim must be complete even where the webhook is not installed; the webhook stamps the
//! same fields only when they are absent.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;

use crate::api::{
    ClaimCall, ClaimRequest, Group, LABEL_GROUP, LABEL_SLOT, NodeClaim, NodeClaimSpec, SlotRef,
};
use crate::claim::{DEFAULT_CLAIM_TTL_SECONDS, Timeouts};

use super::groups::slot_name;
use super::{Caller, Slot};

/// The longest `spec.request.reason` the CRD accepts.
const MAX_REASON_LEN: usize = 1024;

/// One claim to create: which slot, for which request.
#[derive(Clone, Copy, Debug)]
pub struct ClaimIntent<'a> {
    pub slot: &'a Slot,
    pub group: &'a Group,
    /// The IncreaseSize delta the claim is part of.
    pub delta: i32,
    pub caller: &'a Caller,
    /// The attempt number seeded from the slot's history.
    pub attempt: i32,
    pub requested_at: Timestamp,
    /// The operator's boot deadlines, which the claim's deadline is measured with.
    pub timeouts: Timeouts,
    /// Why this slot was chosen, in a sentence.
    pub choice: &'a str,
}

/// The pool's maxNodeProvisionTime as a std duration; a negative value reads as unset.
pub fn max_node_provision_time(group: &Group) -> Option<std::time::Duration> {
    group.spec.max_node_provision_time.filter(|d| !d.is_negative()).map(std::time::Duration::from)
}

/// Builds the claim; the API server names it `<slot>-<suffix>`.
pub fn new_claim(intent: &ClaimIntent<'_>) -> NodeClaim {
    let slot = slot_name(intent.slot);
    let group = intent.group.metadata.name.clone().unwrap_or_default();
    let provision_time = max_node_provision_time(intent.group);
    let labels = BTreeMap::from([
        (LABEL_GROUP.to_owned(), group.clone()),
        (LABEL_SLOT.to_owned(), slot.to_owned()),
    ]);
    let reason = match &intent.caller.reason {
        Some(why) => format!("{why}; {}", intent.choice),
        None => intent.choice.to_owned(),
    };
    NodeClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!("{slot}-")),
            namespace: intent.slot.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: intent.caller.session.as_ref().map(|session| {
                BTreeMap::from([(super::adoption::SESSION_ANNOTATION.to_owned(), session.clone())])
            }),
            owner_references: intent.slot.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: NodeClaimSpec {
            slot_ref: SlotRef { name: slot.to_owned() },
            request: ClaimRequest {
                call: ClaimCall::IncreaseSize,
                delta: Some(intent.delta),
                group,
                nodes: Vec::new(),
                reason: Some(truncate(reason, MAX_REASON_LEN)),
            },
            requested_at: Some(Time(intent.requested_at)),
            requested_by: Some(intent.caller.requested_by.clone()),
            attempt: Some(intent.attempt),
            deadline_at: Some(Time(
                intent.timeouts.deadline_at(intent.requested_at, provision_time),
            )),
            max_node_provision_time: intent.group.spec.max_node_provision_time,
            until: None,
            boot_on_battery: None,
            ttl_seconds_after_finished: Some(DEFAULT_CLAIM_TTL_SECONDS),
        },
        status: None,
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::groups::tests::{group, slot};
    use super::*;

    #[test]
    fn a_claim_is_attributed_owned_labelled_and_carries_its_deadline() {
        let mut s = (*slot("nuc-1", "pool")).clone();
        s.metadata.uid = Some("uid-1".into());
        s.metadata.namespace = Some("homelab".into());
        let mut g = (*group("pool", 0)).clone();
        g.spec.max_node_provision_time = Some(std::time::Duration::from_secs(20 * 60).into());
        let caller = Caller::cluster_autoscaler();
        let at: Timestamp = "2026-03-04T09:38:15Z".parse().unwrap();
        let claim = new_claim(&ClaimIntent {
            slot: &s,
            group: &g,
            delta: 2,
            caller: &caller,
            attempt: 2,
            requested_at: at,
            timeouts: Timeouts::default(),
            choice: "cheapest free slot",
        });

        assert_eq!(claim.metadata.generate_name.as_deref(), Some("nuc-1-"));
        assert_eq!(claim.metadata.name, None);
        assert_eq!(claim.metadata.namespace.as_deref(), Some("homelab"));
        let labels = claim.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_GROUP], "pool");
        assert_eq!(labels[LABEL_SLOT], "nuc-1");
        let owner = &claim.metadata.owner_references.clone().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", "nuc-1"));
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.api_version, "infra.homecluster.dev/v2alpha1");

        let spec = &claim.spec;
        assert_eq!(spec.slot_ref.name, "nuc-1");
        assert_eq!(spec.request.call, ClaimCall::IncreaseSize);
        assert_eq!(spec.request.delta, Some(2));
        assert_eq!(spec.request.group, "pool");
        assert_eq!(spec.requested_by.as_deref(), Some("cluster-autoscaler"));
        assert_eq!(spec.attempt, Some(2));
        assert_eq!(spec.requested_at.as_ref().map(|t| t.0), Some(at));
        // 20m is longer than the 12m10s budget, so it is the deadline.
        let want: Timestamp = "2026-03-04T09:58:15Z".parse().unwrap();
        assert_eq!(spec.deadline_at.as_ref().map(|t| t.0), Some(want));
        assert_eq!(spec.max_node_provision_time, g.spec.max_node_provision_time);
        assert_eq!(spec.ttl_seconds_after_finished, Some(DEFAULT_CLAIM_TTL_SECONDS));
        assert!(claim.status.is_none());
    }

    #[test]
    fn the_scalers_reason_leads_and_the_text_fits_the_schema() {
        let s = slot("a", "pool");
        let g = group("pool", 0);
        let caller = Caller::builtin_scaler("x".repeat(2000));
        let claim = new_claim(&ClaimIntent {
            slot: &s,
            group: &g,
            delta: 1,
            caller: &caller,
            attempt: 1,
            requested_at: Timestamp::UNIX_EPOCH,
            timeouts: Timeouts::default(),
            choice: "only free slot",
        });
        let reason = claim.spec.request.reason.unwrap();
        assert_eq!(reason.len(), MAX_REASON_LEN);
        assert!(reason.starts_with("xxx"));
        // No maxNodeProvisionTime: the budget alone sets the deadline.
        assert_eq!(
            claim.spec.deadline_at.map(|t| t.0),
            Some(crate::claim::deadline_at(Timestamp::UNIX_EPOCH, None))
        );
    }
}
