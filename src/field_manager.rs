//! Who writes what: one field manager per writer, so an object's `managedFields` names the part
//! of the operator that set each field (`kubectl get hgroup -o yaml --show-managed-fields`).
//!
//! A status that several writers share is written with server-side apply: each writer applies
//! only the fields it owns (the group controller a pool's counts and savings, the scaler its
//! last decision, the schedule controller `status.schedule`) and the API server merges them, so
//! no writer can drop another's fields and a field a writer stops sending is removed. Claims
//! keep merge patches guarded by the resourceVersion (the chokepoint's compare-and-swap), and
//! a Kubernetes node keeps its guarded merge patch: its taint list is atomic and shared with the
//! kubelet and kubectl cordon, which an apply would fight over (decisions.md, D26).

use kube::Resource;
use kube::api::{PatchParams, PostParams};
use serde_json::{Map, Value};

/// A part of the operator (or its CLI) that writes to the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldManager {
    /// Moves claims through their phases, starts boots, marks nodes ready to schedule.
    ClaimController,
    /// Runs the shutdown path, syncs the machine's node, writes a slot's status.
    SlotController,
    /// Counts a pool into its Group's status.
    GroupController,
    /// Keeps scheduled windows' pins and writes `status.schedule`.
    ScheduleController,
    /// The built-in scaler's decision in the Group's status.
    Scaler,
    /// Claims cluster-autoscaler and the built-in scaler ask for, and their marks.
    Provider,
    /// The `keep-on`/`release` and `power` commands.
    Cli,
    /// The machine simulator's kubelet (tests and the demo).
    Simulator,
    /// Serving certificates, webhook CA bundles and restarts of cluster-autoscaler.
    Certificates,
}

impl FieldManager {
    pub const ALL: [FieldManager; 9] = [
        FieldManager::ClaimController,
        FieldManager::SlotController,
        FieldManager::GroupController,
        FieldManager::ScheduleController,
        FieldManager::Scaler,
        FieldManager::Provider,
        FieldManager::Cli,
        FieldManager::Simulator,
        FieldManager::Certificates,
    ];

    /// The name in `managedFields`.
    pub const fn field_manager(self) -> &'static str {
        match self {
            FieldManager::ClaimController => "homelab-autoscaler-claims",
            FieldManager::SlotController => "homelab-autoscaler-slots",
            FieldManager::GroupController => "homelab-autoscaler-groups",
            FieldManager::ScheduleController => "homelab-autoscaler-schedules",
            FieldManager::Scaler => "homelab-autoscaler-scaler",
            FieldManager::Provider => "homelab-autoscaler-provider",
            FieldManager::Cli => "homelab-autoscaler-cli",
            FieldManager::Simulator => "homelab-autoscaler-simulator",
            FieldManager::Certificates => "homelab-autoscaler-certificates",
        }
    }

    /// Parameters of a merge or JSON patch.
    pub fn patch(self) -> PatchParams {
        PatchParams { field_manager: Some(self.field_manager().into()), ..PatchParams::default() }
    }

    /// Parameters of a server-side apply. Forced: each field applied has one owner by design,
    /// so a conflict can only come from a person's edit, which the writer's view overrides.
    pub fn apply(self) -> PatchParams {
        PatchParams::apply(self.field_manager()).force()
    }

    /// Parameters of a create or replace.
    pub fn post(self) -> PostParams {
        PostParams { field_manager: Some(self.field_manager().into()), ..PostParams::default() }
    }
}

/// The apply configuration of `status` for the object `name` of kind `K`. The writer's fields
/// are the top-level members of `status`; within them, a member `previous` had and `status`
/// lacks is sent as null. The API server removes a field applied as null and takes it from
/// every other owner, while a field merely left out is removed only if no one else owns it:
/// an object an older operator wrote with merge patches has its fields owned by that
/// operator's update too, so only the null clears them.
pub fn status_apply<K>(name: &str, previous: Option<&Value>, status: Value) -> Value
where
    K: Resource<DynamicType = ()>,
{
    let mut object = Map::new();
    object.insert("apiVersion".into(), Value::String(K::api_version(&()).into_owned()));
    object.insert("kind".into(), Value::String(K::kind(&()).into_owned()));
    object.insert("metadata".into(), serde_json::json!({ "name": name }));
    let status = match (status, previous) {
        (Value::Object(mut fields), Some(Value::Object(before))) => {
            for (key, value) in fields.iter_mut() {
                if let Some(old) = before.get(key) {
                    null_what_was_dropped(value, old);
                }
            }
            Value::Object(fields)
        }
        (status, _) => status,
    };
    object.insert("status".into(), status);
    Value::Object(object)
}

/// Applies `status` to the object `name` as `writer` (see [`status_apply`]).
pub async fn apply_status_of<K>(
    api: &kube::Api<K>,
    name: &str,
    writer: FieldManager,
    previous: Option<&Value>,
    status: Value,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let applied = status_apply::<K>(name, previous, status);
    api.patch_status(name, &writer.apply(), &kube::api::Patch::Apply(&applied)).await
}

/// Adds a null to `now` for every object member `before` had and `now` lacks, at any depth.
fn null_what_was_dropped(now: &mut Value, before: &Value) {
    if let (Value::Object(now), Value::Object(before)) = (now, before) {
        for (key, old) in before {
            match now.get_mut(key) {
                Some(value) => null_what_was_dropped(value, old),
                None => {
                    now.insert(key.clone(), Value::Null);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Group;
    use serde_json::json;

    #[test]
    fn every_writer_has_its_own_field_manager() {
        let mut names: Vec<_> = FieldManager::ALL.iter().map(|w| w.field_manager()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FieldManager::ALL.len(), "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("homelab-autoscaler-") && n.len() < 128));
    }

    #[test]
    fn a_status_apply_names_the_object_and_nulls_what_the_writer_dropped() {
        let previous = json!({
            "lastDecision": { "demand": 3, "idleSince": "2026-12-01T09:00:00Z" },
            "schedule": { "active": "daily" },
            "slots": 4,
        });
        let applied = status_apply::<Group>(
            "pool",
            Some(&previous),
            json!({ "lastDecision": { "demand": 2 } }),
        );
        assert_eq!(
            applied,
            json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1",
                "kind": "Group",
                "metadata": { "name": "pool" },
                "status": { "lastDecision": { "demand": 2, "idleSince": null } },
            }),
            "another writer's fields (schedule, slots) are not touched"
        );
        let cases = [
            (json!({ "a": 1 }), json!({}), json!({ "a": null })),
            (
                json!({ "a": { "b": 1, "c": 2 } }),
                json!({ "a": { "b": 1 } }),
                json!({ "a": { "b": 1, "c": null } }),
            ),
            (json!({ "a": [1, 2] }), json!({ "a": [1] }), json!({ "a": [1] })),
            (json!({ "a": 1 }), json!({ "a": null }), json!({ "a": null })),
        ];
        for (before, now, want) in cases {
            let mut got = json!({ "x": now });
            null_what_was_dropped(&mut got, &json!({ "x": before }));
            assert_eq!(got, json!({ "x": want }));
        }
        assert_eq!(
            FieldManager::Scaler.apply().field_manager.as_deref(),
            Some("homelab-autoscaler-scaler")
        );
        assert!(FieldManager::Scaler.apply().force);
    }
}
