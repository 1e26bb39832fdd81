//! Writers share a Group's status through server-side apply against a real kube-apiserver: each
//! writer's fields survive the others' writes, `managedFields` names each writer, and a field a
//! writer stops sending is gone, also on an object whose status an older operator wrote with
//! merge patches.

use anyhow::Context as _;
use homelab_autoscaler::api::Group;
use homelab_autoscaler::field_manager::{FieldManager, apply_status_of};
use homelab_harness::Components;
use homelab_harness::{TestNamespace, test_namespace};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn group(groups: &Api<Group>, name: &str) -> anyhow::Result<()> {
    let group: Group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": name },
        "spec": { "maxSize": 2 },
    }))?;
    groups.create(&PostParams::default(), &group).await.context("creating the group")?;
    Ok(())
}

/// The Group's status as stored, nulls included (a typed read shows a stored null as an absent
/// field).
async fn status(groups: &Api<Group>, name: &str) -> anyhow::Result<Value> {
    let raw: Api<DynamicObject> = Api::namespaced_with(
        groups.clone().into_client(),
        groups.namespace().context("a namespaced Api")?,
        &ApiResource::erase::<Group>(&()),
    );
    Ok(raw.get(name).await?.data.get("status").cloned().unwrap_or(Value::Null))
}

async fn managers(groups: &Api<Group>, name: &str) -> anyhow::Result<Vec<String>> {
    let group = groups.get(name).await?;
    let mut names: Vec<String> = group
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager)
        .collect();
    names.sort();
    Ok(names)
}

/// Applies `fields` as `writer`, with the status as last read as what the writer saw before
/// (the controllers pass their cache's copy).
async fn apply(groups: &Api<Group>, writer: FieldManager, fields: Value) -> anyhow::Result<()> {
    let previous = status(groups, "pool").await?;
    apply_status_of::<Group>(groups, "pool", writer, Some(&previous), fields).await?;
    Ok(())
}

fn decision(at: &str, idle_since: Option<&str>) -> Value {
    let mut decision =
        json!({ "at": at, "demand": 1, "target": 1, "action": "Hold", "reason": "r" });
    if let Some(idle) = idle_since {
        decision["idleSince"] = json!(idle);
    }
    json!({ "lastDecision": decision })
}

#[tokio::test]
async fn three_writers_share_a_groups_status_and_each_clears_only_its_own_fields()
-> anyhow::Result<()> {
    let TestNamespace { client, ns, .. } = test_namespace(Components::API, "managers").await?;
    let groups: Api<Group> = Api::namespaced(client, &ns);
    group(&groups, "pool").await?;

    apply(&groups, FieldManager::GroupController, json!({ "slots": 2, "observedGeneration": 1 }))
        .await?;
    apply(
        &groups,
        FieldManager::Scaler,
        decision("2026-12-01T10:00:00Z", Some("2026-12-01T09:00:00Z")),
    )
    .await?;
    apply(
        &groups,
        FieldManager::ScheduleController,
        json!({ "schedule": { "active": "daily", "held": "1/1" } }),
    )
    .await?;

    let all = status(&groups, "pool").await?;
    assert_eq!(all["slots"], 2, "{all}");
    assert_eq!(all["lastDecision"]["idleSince"], "2026-12-01T09:00:00Z", "{all}");
    assert_eq!(all["schedule"]["active"], "daily", "{all}");
    assert_eq!(
        managers(&groups, "pool").await?,
        vec![
            "homelab-autoscaler-groups",
            "homelab-autoscaler-scaler",
            "homelab-autoscaler-schedules"
        ]
    );

    // The scaler drops idleSince, the schedule controller its open window: only those go.
    apply(&groups, FieldManager::Scaler, decision("2026-12-01T10:01:00Z", None)).await?;
    apply(
        &groups,
        FieldManager::ScheduleController,
        json!({ "schedule": { "next": "2026-12-02T08:00:00Z" } }),
    )
    .await?;
    let after = status(&groups, "pool").await?;
    assert_eq!(after["slots"], 2, "{after}");
    assert!(after["lastDecision"].get("idleSince").is_none(), "{after}");
    assert_eq!(after["lastDecision"]["at"], "2026-12-01T10:01:00Z", "{after}");
    assert_eq!(after["schedule"], json!({ "next": "2026-12-02T08:00:00Z" }), "{after}");

    // A pool whose schedules are all removed loses status.schedule whole.
    apply(&groups, FieldManager::ScheduleController, json!({ "schedule": null })).await?;
    let cleared = status(&groups, "pool").await?;
    assert!(cleared.get("schedule").is_none(), "{cleared}");
    assert_eq!(cleared["slots"], 2, "{cleared}");
    Ok(())
}

#[tokio::test]
async fn a_status_an_older_operator_merged_is_cleared_by_the_new_writer() -> anyhow::Result<()> {
    let TestNamespace { client, ns, .. } = test_namespace(Components::API, "managers-up").await?;
    let groups: Api<Group> = Api::namespaced(client, &ns);
    group(&groups, "pool").await?;
    // What an operator before server-side apply wrote: merge patches under one manager.
    let legacy =
        PatchParams { field_manager: Some("homelab-autoscaler".into()), ..PatchParams::default() };
    let merged =
        json!({ "status": { "slots": 2, "schedule": { "active": "daily", "held": "1/1" } } });
    groups.patch_status("pool", &legacy, &Patch::Merge(&merged)).await?;

    apply(
        &groups,
        FieldManager::ScheduleController,
        json!({ "schedule": { "active": "daily", "held": "1/1" } }),
    )
    .await?;
    apply(
        &groups,
        FieldManager::ScheduleController,
        json!({ "schedule": { "next": "2026-12-02T08:00:00Z" } }),
    )
    .await?;
    let after = status(&groups, "pool").await?;
    assert_eq!(after["schedule"], json!({ "next": "2026-12-02T08:00:00Z" }), "{after}");
    assert_eq!(after["slots"], 2, "a field no new writer applies stays: {after}");
    Ok(())
}
