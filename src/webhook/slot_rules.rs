//! Slot (`Node`) admission: `spec.powerState` is gone and says so; a slot is named after its
//! Kubernetes node, belongs to an existing pool, has runnable lifecycle pods or power drivers
//! (`power_rules`), declares only labels and taints a Node accepts (`node_mark_rules`), and
//! keeps its providerID while a claim is live (cluster-autoscaler matches instances by it).

use super::verdict::{Findings, Verdict};
use crate::api::{
    ANNOTATION_ATTEMPTS_RESET_AT, LifecyclePodSpec, Node, NodeClaim, POOL_MEMBERSHIP_LABEL,
};
use crate::phase;

/// Why `spec.powerState` is refused, and what to do instead, naming the slot and its pool.
pub fn power_state_removed(slot: &str, group: &str) -> String {
    format!(
        "spec.powerState was removed in infra.homecluster.dev/v2alpha1: a machine now runs exactly \
         while a NodeClaim for its slot is live (a declared power state was reverted by every GitOps \
         sync). Delete spec.powerState from this manifest. To start the machine by hand, create a \
         NodeClaim with spec.slotRef.name: {slot} and spec.request: {{call: Manual, group: {group}}} \
         (examples/manual-claim.yaml); delete that claim to power the machine off again"
    )
}

/// What the rules read of the cluster for one slot.
pub struct SlotFacts<'a> {
    pub namespace: &'a str,
    /// Whether the Group named by the slot's `group` label exists.
    pub group_exists: bool,
    /// The slot's claims (for the providerID rule).
    pub claims_of_slot: &'a [NodeClaim],
}

/// The rules of a created or changed slot. `old` is the stored slot on update.
pub fn validate(slot: &Node, old: Option<&Node>, facts: &SlotFacts<'_>) -> Verdict {
    let mut findings = Findings::default();
    let name = slot.metadata.name.as_deref().unwrap_or_default();
    let group = slot.group();
    if slot.spec.power_state.is_some() {
        findings.invalid(
            "power_state_removed",
            power_state_removed(name, group.unwrap_or("<its group>")),
        );
    }
    if !name.is_empty() && name != slot.spec.kubernetes_node_name {
        findings.invalid(
            "named_after_node",
            format!(
            "spec.kubernetesNodeName is {:?} but the slot is named {name:?}: name the slot after \
             the Kubernetes node its machine registers as",
            slot.spec.kubernetes_node_name
        ));
    }
    match group {
        None => findings.invalid(
            "group_label",
            format!(
            "metadata.labels.{POOL_MEMBERSHIP_LABEL}: a slot joins a pool by this label; add `{POOL_MEMBERSHIP_LABEL}: <group name>`"
        )),
        Some(group) if !facts.group_exists => {
            let unchanged = old.and_then(Node::group) == Some(group);
            // A slot whose pool was deleted may still be edited (or emptied) in place.
            if !unchanged {
                findings.invalid(
                    "group_exists",
                    format!(
                    "metadata.labels.{POOL_MEMBERSHIP_LABEL}: there is no group {group:?} in namespace {:?}; \
                     create the Group first",
                    facts.namespace
                ));
            }
        }
        Some(_) => {}
    }
    if let Some(spec) = &slot.spec.startup_pod_spec {
        check_pod_spec("spec.startupPodSpec", spec, &mut findings);
    }
    if let Some(spec) = &slot.spec.shutdown_pod_spec {
        check_pod_spec("spec.shutdownPodSpec", spec, &mut findings);
    }
    super::power_rules::check(slot, &mut findings);
    super::node_mark_rules::check(&slot.spec.node_labels, &slot.spec.node_taints, &mut findings);
    if let Some(value) =
        slot.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_ATTEMPTS_RESET_AT))
        && value.parse::<jiff::Timestamp>().is_err()
    {
        findings.invalid(
            "attempts_reset_time",
            format!(
            "metadata.annotations.{ANNOTATION_ATTEMPTS_RESET_AT}: {value:?} is not an RFC 3339 time such as 2026-03-04T09:38:15Z"
        ));
    }
    if let Some(old) = old
        && old.spec.provider_id != slot.spec.provider_id
        && let Some(live) = facts.claims_of_slot.iter().find(|c| phase::is_live(Some(phase::of(c))))
    {
        findings.forbidden(
            "provider_id_fixed_while_live",
            format!(
                "spec.providerID cannot change while claim {:?} is live: cluster-autoscaler \
             tracks the machine by it. Change it when the slot has no live claim",
                live.metadata.name.as_deref().unwrap_or_default()
            ),
        );
    }
    findings.verdict()
}

fn check_pod_spec(field: &str, spec: &LifecyclePodSpec, findings: &mut Findings) {
    if spec.image.trim().is_empty() {
        findings.invalid(
            "pod_spec",
            format!("{field}.image: set the container image that powers the machine"),
        );
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, volume) in spec.volumes.iter().enumerate() {
        if !names.insert(volume.name.as_str()) {
            findings.invalid(
                "pod_spec",
                format!("{field}.volumes[{i}].name: {:?} is used twice", volume.name),
            );
        }
        if !volume.mount_path.starts_with('/') {
            findings.invalid(
                "pod_spec",
                format!(
                    "{field}.volumes[{i}].mountPath: {:?} must be an absolute path",
                    volume.mount_path
                ),
            );
        }
        if volume.secret_name.is_some() == volume.config_map_name.is_some() {
            findings.invalid(
                "pod_spec",
                format!("{field}.volumes[{i}]: set exactly one of secretName and configMapName"),
            );
        }
    }
    for (i, env) in spec.env.iter().enumerate() {
        if env.name.starts_with("HOMELAB_") {
            findings.invalid(
                "pod_spec",
                format!(
                "{field}.env[{i}].name: {:?} is reserved; the operator sets HOMELAB_* for the pod",
                env.name
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LifecycleVolume, NodeClaimPhase};
    use crate::fixtures::{claim_in, slot};

    fn facts<'a>(group_exists: bool, claims: &'a [NodeClaim]) -> SlotFacts<'a> {
        SlotFacts { namespace: "ns", group_exists, claims_of_slot: claims }
    }

    fn denied(v: Verdict) -> (u16, String) {
        match v {
            Verdict::Deny(d) => (d.code, d.message),
            Verdict::Allow { .. } => panic!("expected a denial"),
        }
    }

    #[test]
    fn a_valid_slot_is_allowed() {
        assert!(validate(&slot("m1", "pool"), None, &facts(true, &[])).is_allowed());
    }

    #[test]
    fn power_state_is_refused_with_the_way_forward() {
        let mut s = slot("m1", "pool");
        s.spec.power_state = Some("on".into());
        let (code, msg) = denied(validate(&s, None, &facts(true, &[])));
        assert_eq!(code, 422);
        for needle in
            ["spec.powerState was removed", "Delete spec.powerState", "create a NodeClaim"]
        {
            assert!(msg.contains(needle), "{needle:?} missing from {msg}");
        }
    }

    #[test]
    fn table_of_invalid_slots() {
        type Edit = fn(&mut Node);
        let table: &[(&str, Edit, &str)] = &[
            (
                "name differs",
                |s| s.spec.kubernetes_node_name = "other".into(),
                "spec.kubernetesNodeName",
            ),
            ("no group label", |s| s.metadata.labels = None, "metadata.labels.group"),
            (
                "empty image",
                |s| s.spec.startup_pod_spec.get_or_insert_default().image = " ".into(),
                "spec.startupPodSpec.image",
            ),
            (
                "two volume sources",
                |s| {
                    s.spec.shutdown_pod_spec.get_or_insert_default().volumes =
                        vec![LifecycleVolume {
                            name: "creds".into(),
                            mount_path: "/creds".into(),
                            secret_name: Some("a".into()),
                            config_map_name: Some("b".into()),
                        }]
                },
                "exactly one of secretName and configMapName",
            ),
            (
                "relative mount path",
                |s| {
                    s.spec.startup_pod_spec.get_or_insert_default().volumes =
                        vec![LifecycleVolume {
                            name: "creds".into(),
                            mount_path: "creds".into(),
                            secret_name: Some("a".into()),
                            config_map_name: None,
                        }]
                },
                "absolute path",
            ),
            (
                "taint effect in the wrong case",
                |s| {
                    s.spec.node_taints = vec![k8s_openapi::api::core::v1::Taint {
                        key: "dedicated".into(),
                        value: Some("gpu".into()),
                        effect: "Noschedule".into(),
                        time_added: None,
                    }]
                },
                "spec.nodeTaints[0].effect: \"Noschedule\" is not a taint effect",
            ),
            (
                "label value with a space",
                |s| s.spec.node_labels = [("role".to_string(), "big gpu".to_string())].into(),
                "spec.nodeLabels.role: the value \"big gpu\" contains ' '",
            ),
            (
                "bad reset annotation",
                |s| {
                    s.metadata.annotations = Some(
                        [(
                            crate::api::ANNOTATION_ATTEMPTS_RESET_AT.to_string(),
                            "yesterday".to_string(),
                        )]
                        .into(),
                    )
                },
                "RFC 3339",
            ),
        ];
        for (name, edit, needle) in table {
            let mut s = slot("m1", "pool");
            edit(&mut s);
            let (code, msg) = denied(validate(&s, None, &facts(true, &[])));
            assert_eq!(code, 422, "{name}");
            assert!(msg.contains(needle), "{name}: {msg}");
        }
    }

    #[test]
    fn a_missing_group_blocks_joining_but_not_editing_in_place() {
        let s = slot("m1", "pool");
        assert_eq!(denied(validate(&s, None, &facts(false, &[]))).0, 422);
        assert!(validate(&s, Some(&s), &facts(false, &[])).is_allowed());
    }

    #[test]
    fn provider_id_is_frozen_while_a_claim_is_live() {
        let old = slot("m1", "pool");
        let mut new = old.clone();
        new.spec.provider_id = Some("k3s://m1".into());
        let live = [claim_in("m1-a", "m1", Some(NodeClaimPhase::Ready), "2026-03-04T09:00:00Z")];
        let (code, msg) = denied(validate(&new, Some(&old), &facts(true, &live)));
        assert_eq!(code, 403);
        assert!(msg.contains("m1-a"), "{msg}");
        let ended =
            [claim_in("m1-a", "m1", Some(NodeClaimPhase::Completed), "2026-03-04T09:00:00Z")];
        assert!(validate(&new, Some(&old), &facts(true, &ended)).is_allowed());
    }
}
