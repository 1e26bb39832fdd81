//! A restarted cluster-autoscaler takes over the boots its predecessor started.
//!
//! cluster-autoscaler keeps its scale-up requests in memory, and counts a group's booting
//! machines as upcoming capacity only while such a request is active. A cluster-autoscaler that
//! restarts (a crash, an upgrade, a new leader) mid scale-up therefore sees the pods still
//! pending, no upcoming machines, and asks again: measured with CA 1.36.1, two pods that had
//! two machines booting got a third machine after a restart.
//!
//! So each claim IncreaseSize creates records the connection the call came over
//! ([`SESSION_ANNOTATION`]). An IncreaseSize over another connection first takes over the claims
//! that earlier connections started and that are still in their boot window, and creates claims
//! only for the rest. The call then registers, in the new process, a scale-up request that
//! covers machines already on their way, which is what they are. A connection that merely
//! reconnects costs at most one loop: its next IncreaseSize finds nothing left to take over.

use std::sync::Arc;

use crate::api::{ClaimCall, NodeClaim};
use crate::phase;

use super::groups::GroupSnapshot;

/// The cluster-autoscaler connection (its peer address) whose IncreaseSize a claim serves.
pub const SESSION_ANNOTATION: &str = "infra.homecluster.dev/autoscaler-session";

/// The session a claim serves, if recorded.
pub fn session_of(claim: &NodeClaim) -> Option<&str> {
    claim.metadata.annotations.as_ref()?.get(SESSION_ANNOTATION).map(String::as_str)
}

/// The claims an IncreaseSize of `delta` from `session` takes over, oldest first: claims of
/// the same requester, made by IncreaseSize, still in their boot window and not marked for
/// scale-down, that serve another session (or none recorded).
pub fn to_adopt(
    snapshot: &GroupSnapshot,
    requested_by: &str,
    session: &str,
    delta: i32,
) -> Vec<Arc<NodeClaim>> {
    let mut orphans: Vec<Arc<NodeClaim>> = snapshot
        .slots
        .iter()
        .filter_map(|s| s.live_claim())
        .filter(|c| {
            c.spec.request.call == ClaimCall::IncreaseSize
                && c.spec.requested_by.as_deref() == Some(requested_by)
                && phase::in_boot_window(Some(phase::of(c)))
                && !phase::is_marked(c)
                && session_of(c) != Some(session)
        })
        .cloned()
        .collect();
    orphans.sort_by_key(|c| {
        let requested = c.spec.requested_at.as_ref().or(c.metadata.creation_timestamp.as_ref());
        (requested.map(|t| t.0), c.metadata.name.clone())
    });
    orphans.truncate(usize::try_from(delta.max(0)).unwrap_or(usize::MAX));
    orphans
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::super::groups::tests::{claim, group, slot};
    use super::*;
    use crate::api::NodeClaimPhase;

    const CA: &str = "cluster-autoscaler";

    fn from(mut c: NodeClaim, by: &str, session: Option<&str>) -> Arc<NodeClaim> {
        c.spec.requested_by = Some(by.into());
        c.metadata.annotations =
            session.map(|s| BTreeMap::from([(SESSION_ANNOTATION.to_string(), s.to_string())]));
        Arc::new(c)
    }

    #[test]
    fn a_new_session_takes_over_boots_in_flight_oldest_first() {
        use NodeClaimPhase::*;
        let slots: Vec<_> =
            ["a", "b", "c", "d", "e", "f"].iter().map(|s| slot(s, "pool")).collect();
        let claims = vec![
            from(claim("a-1", "a", Some(Booting), "2026-03-04T09:02:00Z"), CA, Some("old:1")),
            from(claim("b-1", "b", Some(Pending), "2026-03-04T09:01:00Z"), CA, None),
            // Not taken over: ready, another requester, already this session's, marked.
            from(claim("c-1", "c", Some(Ready), "2026-03-04T09:00:00Z"), CA, Some("old:1")),
            from(claim("d-1", "d", Some(Booting), "2026-03-04T09:00:00Z"), "alice", None),
            from(claim("e-1", "e", Some(Booting), "2026-03-04T09:00:00Z"), CA, Some("new:2")),
            {
                let mut c = claim("f-1", "f", Some(Booting), "2026-03-04T09:00:00Z");
                c.status.get_or_insert_with(Default::default).scale_down_requested_at =
                    Some(crate::fixtures::at("2026-03-04T09:03:00Z"));
                from(c, CA, Some("old:1"))
            },
        ];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &claims, &HashSet::new());
        let names = |v: Vec<Arc<NodeClaim>>| -> Vec<String> {
            v.iter().filter_map(|c| c.metadata.name.clone()).collect()
        };
        assert_eq!(names(to_adopt(&snap, CA, "new:2", 5)), ["b-1", "a-1"]);
        assert_eq!(names(to_adopt(&snap, CA, "new:2", 1)), ["b-1"]);
        assert!(to_adopt(&snap, CA, "new:2", 0).is_empty());
        // The session that started them has nothing to take over but the unrecorded one.
        assert_eq!(names(to_adopt(&snap, CA, "old:1", 5)), ["e-1", "b-1"]);
    }
}
