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
    /// Reads a pool's UPS into `status.power` and sheds machines on battery.
    PowerSource,
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
    pub const ALL: [FieldManager; 10] = [
        FieldManager::ClaimController,
        FieldManager::SlotController,
        FieldManager::GroupController,
        FieldManager::ScheduleController,
        FieldManager::Scaler,
        FieldManager::PowerSource,
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
            FieldManager::PowerSource => "homelab-autoscaler-power-source",
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

/// The apply configuration of `status` for the object `name` of kind `K`: the writer's fields
/// (the top-level members of `status`) without their nulls. A member left out is released,
/// and the API server removes it unless another manager owns it too.
pub fn status_apply<K>(name: &str, status: &Value) -> Value
where
    K: Resource<DynamicType = ()>,
{
    let mut object = Map::new();
    object.insert("apiVersion".into(), Value::String(K::api_version(&()).into_owned()));
    object.insert("kind".into(), Value::String(K::kind(&()).into_owned()));
    object.insert("metadata".into(), serde_json::json!({ "name": name }));
    object.insert("status".into(), without_nulls(status.clone()));
    Value::Object(object)
}

/// Applies `status` to the object `name` as `writer`, then clears what the writer dropped and
/// another manager still holds. `previous` is the status the writer last saw. A member it had
/// and `status` lacks (or sets to null) is released by the apply; where the object still
/// carries it afterwards, it was co-owned, which is the case on an object an older operator
/// wrote with merge patches, and a merge patch of nulls removes it.
pub async fn apply_status_of<K>(
    api: &kube::Api<K>,
    name: &str,
    writer: FieldManager,
    previous: Option<&Value>,
    status: Value,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let applied = status_apply::<K>(name, &status);
    let written =
        api.patch_status(name, &writer.apply(), &kube::api::Patch::Apply(&applied)).await?;
    let now =
        serde_json::to_value(&written).ok().and_then(|mut o| o.get_mut("status").map(Value::take));
    let Some(now) = now else { return Ok(written) };
    match leftovers(previous, &status, &now) {
        Some(nulls) => {
            let patch = serde_json::json!({ "status": nulls });
            api.patch_status(name, &writer.patch(), &kube::api::Patch::Merge(&patch)).await
        }
        None => Ok(written),
    }
}

/// The members of the writer's fields (the top-level members of `status`) that `status` sets
/// to null, or lacks where `previous` had them, and that `now` still carries: as a merge patch
/// of nulls.
pub fn leftovers(previous: Option<&Value>, status: &Value, now: &Value) -> Option<Value> {
    fn walk(before: Option<&Value>, wanted: Option<&Value>, now: Option<&Value>) -> Option<Value> {
        let now = now.filter(|n| !n.is_null())?;
        match wanted {
            Some(Value::Null) => Some(Value::Null),
            None => before.filter(|b| !b.is_null()).map(|_| Value::Null),
            Some(Value::Object(wanted)) => {
                let before = before.and_then(Value::as_object);
                let keys = wanted.keys().chain(before.into_iter().flat_map(|b| b.keys()));
                let mut nulls = Map::new();
                for key in keys {
                    let old = before.and_then(|b| b.get(key));
                    if let Some(null) = walk(old, wanted.get(key), now.get(key)) {
                        nulls.insert(key.clone(), null);
                    }
                }
                (!nulls.is_empty()).then_some(Value::Object(nulls))
            }
            Some(_) => None,
        }
    }
    let mut nulls = Map::new();
    for (key, wanted) in status.as_object()? {
        let old = previous.and_then(|p| p.get(key));
        if let Some(null) = walk(old, Some(wanted), now.get(key)) {
            nulls.insert(key.clone(), null);
        }
    }
    (!nulls.is_empty()).then_some(Value::Object(nulls))
}

/// `value` with every null member of every object left out.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .filter(|(_, member)| !member.is_null())
                .map(|(key, member)| (key, without_nulls(member)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
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
    fn a_status_apply_names_the_object_and_leaves_nulls_out() {
        let applied = status_apply::<Group>(
            "pool",
            &json!({ "lastDecision": { "demand": 2, "idleSince": null }, "schedule": null }),
        );
        assert_eq!(
            applied,
            json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1",
                "kind": "Group",
                "metadata": { "name": "pool" },
                "status": { "lastDecision": { "demand": 2 } },
            })
        );
        assert_eq!(
            FieldManager::Scaler.apply().field_manager.as_deref(),
            Some("homelab-autoscaler-scaler")
        );
        assert!(FieldManager::Scaler.apply().force);
    }

    #[test]
    fn leftovers_are_what_the_writer_dropped_and_the_object_still_has() {
        // (previous, status applied, status after the apply, the nulls to send)
        let cases = [
            (json!({ "a": { "b": 1 } }), json!({ "a": {} }), json!({ "a": {} }), None),
            (
                json!({ "a": { "b": 1 } }),
                json!({ "a": {} }),
                json!({ "a": { "b": 1 } }),
                Some(json!({ "a": { "b": null } })),
            ),
            (
                json!({ "a": { "b": 1 } }),
                json!({ "a": { "b": null } }),
                json!({ "a": { "b": 1 } }),
                Some(json!({ "a": { "b": null } })),
            ),
            (
                json!({ "a": { "b": 1 } }),
                json!({ "a": null }),
                json!({ "a": { "b": 1 } }),
                Some(json!({ "a": null })),
            ),
            (
                json!({ "a": { "b": 1 } }),
                json!({ "a": { "b": 2 } }),
                json!({ "a": { "b": 2 } }),
                None,
            ),
            // Another writer's member is never touched, whatever the object holds.
            (json!({ "a": 1, "other": 1 }), json!({ "a": 1 }), json!({ "a": 1, "other": 1 }), None),
            (json!({ "a": [1, 2] }), json!({ "a": [1] }), json!({ "a": [1, 2] }), None),
        ];
        // Without a previous status, an explicit null still clears what another manager holds.
        assert_eq!(
            leftovers(
                None,
                &json!({ "d": { "idle": null, "at": 2 } }),
                &json!({ "d": { "idle": 1, "at": 2 } })
            ),
            Some(json!({ "d": { "idle": null } }))
        );
        assert_eq!(
            leftovers(None, &json!({ "d": { "at": 2 } }), &json!({ "d": { "idle": 1, "at": 2 } })),
            None
        );
        for (previous, status, now, want) in cases {
            assert_eq!(
                leftovers(Some(&previous), &status, &now),
                want,
                "{previous} -> {status}, now {now}"
            );
        }
    }
}
