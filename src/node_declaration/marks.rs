//! The marks cluster-autoscaler reads on a machine's node (docs/decisions.md, D13 and D14):
//!
//! - while the slot's claim is in its boot window, the node carries CA's startup taint
//!   [`STARTUP_TAINT`], so CA counts a registered-but-not-ready machine as upcoming capacity
//!   instead of booting a second one for the same pods;
//! - while a pin (a person's `Manual` claim, or a Group schedule's `Schedule` claim) holds the
//!   slot, the node carries CA's [`SCALE_DOWN_DISABLED`] annotation, so CA does not power off a
//!   pinned machine once its unneeded time runs out (docs/decisions.md, D17).
//!
//! [`wanted`] decides, [`apply`] edits the node's taints and annotations (the slot controller
//! writes them with the rest of its node patch). The annotation is removed only where
//! the operator put it (it leaves [`PROTECTED_FOR`] beside it), so a person's own
//! `scale-down-disabled` survives.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use crate::api::NodeClaim;
use crate::phase;

/// cluster-autoscaler treats any taint under this prefix as a startup taint: the node counts as
/// not started (upcoming) while it carries one, and the taint is left out of its simulations.
pub const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting";
/// cluster-autoscaler never scales down a node with this annotation set to "true".
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Names the pin the operator set [`SCALE_DOWN_DISABLED`] for.
pub const PROTECTED_FOR: &str = "infra.homecluster.dev/scale-down-disabled-for";

/// What the node should carry, from the slot's live claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub startup_taint: bool,
    /// The pin whose machine CA must leave alone.
    pub protected_for: Option<String>,
}

/// The marks a node should carry while `live` (the slot's live claim, if any) holds its slot.
pub fn wanted(live: Option<&NodeClaim>) -> Marks {
    let Some(claim) = live else { return Marks::default() };
    let phase = phase::of(claim);
    Marks {
        startup_taint: phase::in_boot_window(Some(phase)) && !phase::is_marked(claim),
        protected_for: (claim.spec.request.call.is_pin() && phase::is_live(Some(phase)))
            .then(|| claim.metadata.name.clone().unwrap_or_default()),
    }
}

/// Takes a node's taints and annotations from the marks they carry to `want`, touching nothing
/// else: the startup taint is added or removed, and the annotation only where the operator put
/// it.
pub fn apply(taints: &mut Vec<Taint>, annotations: &mut BTreeMap<String, String>, want: &Marks) {
    let carries_taint = taints.iter().any(|t| t.key == STARTUP_TAINT);
    if carries_taint && !want.startup_taint {
        taints.retain(|t| t.key != STARTUP_TAINT);
    } else if !carries_taint && want.startup_taint {
        taints.push(Taint {
            key: STARTUP_TAINT.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    let operator_set = annotations.get(SCALE_DOWN_DISABLED).is_some_and(|v| v == "true");
    let protected_for = annotations.get(PROTECTED_FOR).filter(|_| operator_set).cloned();
    if protected_for == want.protected_for {
        return;
    }
    match &want.protected_for {
        Some(claim) => {
            annotations.insert(SCALE_DOWN_DISABLED.into(), "true".into());
            annotations.insert(PROTECTED_FOR.into(), claim.clone());
        }
        None => {
            // Only ours is taken off: a person's own annotation has no PROTECTED_FOR.
            annotations.remove(SCALE_DOWN_DISABLED);
            annotations.remove(PROTECTED_FOR);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ClaimCall, NodeClaimPhase};
    use crate::fixtures;

    fn claim(call: ClaimCall, phase: Option<NodeClaimPhase>, marked: bool) -> NodeClaim {
        let mut c = fixtures::claim("c1", "slot-a", "g");
        c.spec.request.call = call;
        let status = c.status.get_or_insert_with(Default::default);
        status.phase = phase;
        if marked {
            status.scale_down_requested_at =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
        }
        c
    }

    #[test]
    fn wanted_table() {
        use ClaimCall::*;
        use NodeClaimPhase::*;
        // call, phase, marked for scale-down, startup taint, protected
        type Row = (ClaimCall, Option<NodeClaimPhase>, bool, bool, bool);
        let table: &[Row] = &[
            (IncreaseSize, None, false, true, false),
            (IncreaseSize, Some(Pending), false, true, false),
            (IncreaseSize, Some(Booting), false, true, false),
            (IncreaseSize, Some(Booting), true, false, false),
            (IncreaseSize, Some(Ready), false, false, false),
            (IncreaseSize, Some(Failed), false, false, false),
            (Manual, Some(Booting), false, true, true),
            (Manual, Some(Ready), false, false, true),
            (Manual, Some(Ready), true, false, true),
            (Manual, Some(Completed), false, false, false),
            (Manual, Some(Failed), false, false, false),
            (Schedule, Some(Pending), false, true, true),
            (Schedule, Some(Ready), false, false, true),
            (Schedule, Some(Completed), false, false, false),
            (DeleteNodes, Some(Ready), false, false, false),
        ];
        for &(call, phase, marked, taint, protected) in table {
            let c = claim(call, phase, marked);
            let m = wanted(Some(&c));
            assert_eq!(m.startup_taint, taint, "{call:?} {phase:?} marked={marked}");
            assert_eq!(m.protected_for.is_some(), protected, "{call:?} {phase:?} marked={marked}");
        }
        assert_eq!(wanted(None), Marks::default());
    }

    fn taints(keys: &[&str]) -> Vec<Taint> {
        keys.iter()
            .map(|k| Taint { key: k.to_string(), effect: "NoSchedule".into(), ..Taint::default() })
            .collect()
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn keys(taints: &[Taint]) -> Vec<&str> {
        taints.iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn apply_adds_and_removes_only_the_startup_taint() {
        let booting = Marks { startup_taint: true, protected_for: None };
        let mut list = taints(&["node.cilium.io/agent-not-ready"]);
        let mut none = BTreeMap::new();
        apply(&mut list, &mut none, &booting);
        assert_eq!(keys(&list), ["node.cilium.io/agent-not-ready", STARTUP_TAINT]);
        apply(&mut list, &mut none, &booting);
        assert_eq!(list.len(), 2, "already there: unchanged");
        apply(&mut list, &mut none, &Marks::default());
        assert_eq!(keys(&list), ["node.cilium.io/agent-not-ready"], "gate passed");
        assert!(none.is_empty());
    }

    #[test]
    fn only_the_operators_scale_down_disabled_is_removed() {
        let manual = Marks { startup_taint: false, protected_for: Some("c1".into()) };
        let mut list = Vec::new();
        let mut ours = BTreeMap::new();
        apply(&mut list, &mut ours, &manual);
        assert_eq!(ours, annotations(&[(SCALE_DOWN_DISABLED, "true"), (PROTECTED_FOR, "c1")]));
        assert!(list.is_empty());
        // The operator's mark, claim gone: both annotations leave.
        apply(&mut list, &mut ours, &Marks::default());
        assert!(ours.is_empty());
        // A person's own annotation is theirs.
        let mut theirs = annotations(&[(SCALE_DOWN_DISABLED, "true")]);
        apply(&mut list, &mut theirs, &Marks::default());
        assert_eq!(theirs, annotations(&[(SCALE_DOWN_DISABLED, "true")]));
    }
}
