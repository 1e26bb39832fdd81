//! `Group.status.lastDecision`: the pass's decision, for people (`kubectl get hgroup -o yaml`).
//! Applied (server-side apply) as the scaler's one field, so the group controller's counts and
//! the schedule status are never touched. Every member is sent, `idleSince` as null when there
//! is none, so it is cleared even where an older operator's merge patch also holds it.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};

use super::decide::Decision;
use super::error::ScalerError;
use crate::api::Group;
use crate::field_manager::{FieldManager, apply_status_of};

/// The longest reason written (the API server's limits are generous; a status is read by people).
const MAX_REASON_LEN: usize = 1024;

/// The status patch for a decision; `note` is appended to the reason (say, why it was not
/// carried out).
pub fn patch_for(decision: &Decision, at: Timestamp, note: Option<&str>) -> Value {
    let mut reason = decision.reason.clone();
    if let Some(note) = note {
        reason = format!("{reason}; {note}");
    }
    if reason.len() > MAX_REASON_LEN {
        let mut end = MAX_REASON_LEN;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    json!({ "status": { "lastDecision": {
        "at": Time(at),
        "demand": decision.demand,
        "target": decision.target,
        "action": decision.action.name(),
        "reason": reason,
        "idleSince": decision.idle_since.map(Time),
    }}})
}

/// Writes the patch onto the Group.
pub async fn write(
    client: &Client,
    namespace: &str,
    group: &str,
    patch: &Value,
) -> Result<(), ScalerError> {
    let api: Api<Group> = Api::namespaced(client.clone(), namespace);
    let status = patch.get("status").cloned().unwrap_or_default();
    apply_status_of(&api, group, FieldManager::Scaler, None, status)
        .await
        .map_err(|source| ScalerError::Status { group: group.to_owned(), source })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::decide::Action;
    use super::*;
    use crate::api::GroupStatus;

    fn decision(idle: Option<&str>) -> Decision {
        Decision {
            demand: 3,
            target: 3,
            machines: 1,
            action: Action::Provision { add: 2 },
            reason: "demand 3".into(),
            idle_since: idle.map(|t| t.parse().unwrap()),
        }
    }

    #[test]
    fn the_patch_reads_back_as_the_groups_status_and_clears_idle_since() {
        let at: Timestamp = "2026-03-04T10:00:00Z".parse().unwrap();
        let patch = patch_for(&decision(None), at, Some("not carried out: no slot"));
        assert!(patch["status"]["lastDecision"]["idleSince"].is_null(), "written as null");
        let status: GroupStatus = serde_json::from_value(patch["status"].clone()).unwrap();
        let last = status.last_decision.unwrap();
        assert_eq!((last.demand, last.target, last.action.as_str()), (3, 3, "Provision"));
        assert_eq!(last.reason, "demand 3; not carried out: no slot");
        assert_eq!(last.at.0, at);

        let idle = patch_for(&decision(Some("2026-03-04T09:58:00Z")), at, None);
        assert_eq!(idle["status"]["lastDecision"]["idleSince"], "2026-03-04T09:58:00Z");
    }
}
