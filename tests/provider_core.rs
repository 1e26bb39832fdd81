//! The provider core called directly, as the built-in scaler calls it, against a real
//! kube-apiserver (the homelab-harness crate): drivers keep their groups apart, exhausted slots are
//! skipped with an explanation, and concurrent scale-ups never claim one slot twice.

use std::time::Duration;

use homelab_autoscaler::api::{Group, Node as Slot, NodeClaim, ScalingDriver};
use homelab_autoscaler::provider::{Caller, ErrorKind, Provider, ProviderConfig, ProviderError};
use homelab_harness::{Components, FailureLogs, TestNamespace, eventually, test_namespace};
use jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// How long the provider's caches may take to list, or to show a write: a watch event from an
/// apiserver that every suite of the binary shares, on a loaded two-core machine, takes seconds.
const CACHE_LAG: Duration = Duration::from_secs(30);

struct Env {
    client: Client,
    ns: String,
    provider: Provider,
    _logs: FailureLogs<'static>,
}

/// A node named as cluster-autoscaler names it.
fn node_ref(name: &str) -> homelab_autoscaler::provider::NodeRef {
    homelab_autoscaler::provider::NodeRef { name: name.to_owned(), ..Default::default() }
}

impl Env {
    /// Waits until the provider's caches count `machines` wanted machines in the pool.
    async fn until_target(&self, caller: &Caller, machines: i32) {
        eventually("the provider to see the pool's machines", CACHE_LAG, || async {
            let target = self.provider.target_size(caller, "pool")?;
            anyhow::ensure!(target == machines, "target {target}");
            Ok(())
        })
        .await
        .expect("synced");
    }

    /// Creates `<slot>-1` as admission would have stamped it, and makes it ready.
    async fn ready_claim(
        &self,
        slot: &str,
        request: serde_json::Value,
        by: &str,
        finalizers: &[&str],
    ) {
        let api: Api<NodeClaim> = Api::namespaced(self.client.clone(), &self.ns);
        let claim: NodeClaim = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
            "metadata": { "name": format!("{slot}-1"), "finalizers": finalizers },
            "spec": { "slotRef": { "name": slot }, "request": request, "requestedBy": by },
        }))
        .expect("claim");
        api.create(&PostParams::default(), &claim).await.expect("create claim");
        let ready = Patch::Merge(json!({ "status": { "phase": "ready" } }));
        api.patch_status(&format!("{slot}-1"), &PatchParams::default(), &ready)
            .await
            .expect("ready");
    }

    async fn claims(&self) -> Vec<NodeClaim> {
        let api: Api<NodeClaim> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default()).await.expect("list claims").items
    }
}

/// A namespace with the Group `pool` driven by `driver` and `slots` (name, hourly rate); each
/// slot's optional digest JSON becomes its `status.lastClaim`.
async fn env(
    prefix: &str,
    driver: ScalingDriver,
    slots: &[(&str, f64, Option<serde_json::Value>)],
) -> Env {
    let TestNamespace { client, ns, logs, .. } =
        test_namespace(Components::API, prefix).await.expect("test namespace");

    let driver = match driver {
        ScalingDriver::ClusterAutoscaler => "cluster-autoscaler",
        ScalingDriver::Builtin => "builtin",
    };
    let group: Group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "pool" }, "spec": { "driver": driver },
    }))
    .expect("group");
    Api::<Group>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &group)
        .await
        .expect("create group");

    let slot_api: Api<Slot> = Api::namespaced(client.clone(), &ns);
    for (name, rate, digest) in slots {
        let name = format!("{ns}-{name}");
        let slot: Slot = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
            "metadata": { "name": name, "labels": { "group": "pool" } },
            "spec": {
                "kubernetesNodeName": name,
                "startupPodSpec": { "image": "busybox" },
                "shutdownPodSpec": { "image": "busybox" },
                "pricing": { "hourlyRate": rate, "podRate": 0.0 },
            },
        }))
        .expect("slot");
        slot_api.create(&PostParams::default(), &slot).await.expect("create slot");
        if let Some(digest) = digest {
            let patch = Patch::Merge(json!({ "status": { "lastClaim": digest } }));
            slot_api.patch_status(&name, &PatchParams::default(), &patch).await.expect("digest");
        }
    }

    let provider = Provider::start(client.clone(), ProviderConfig::new(&ns));
    provider.wait_synced(CACHE_LAG).await.expect("caches synced");
    Env { client, ns, provider, _logs: logs }
}

/// The digest of a claim that failed its third boot in a row a minute ago.
fn three_failures() -> serde_json::Value {
    let finished = Timestamp::now() - jiff::SignedDuration::from_secs(60);
    json!({
        "name": "old-claim", "phase": "failed", "attempt": 3, "bootCommitted": true,
        "reachedReady": false, "call": "IncreaseSize", "group": "pool",
        "reason": "StartupJobFailed",
        "finishedAt": jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", finished).expect("time"),
    })
}

#[tokio::test]
async fn the_builtin_scaler_claims_through_the_same_core_with_its_own_name() {
    let env =
        env("provider-builtin", ScalingDriver::Builtin, &[("a", 1.0, None), ("b", 0.5, None)])
            .await;
    let scaler = Caller::builtin_scaler("demand 3 pods, target 1");
    let created = env.provider.increase_size(&scaler, "pool", 1).await.expect("increase");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].slot, format!("{}-b", env.ns), "the cheaper slot");

    let claims = env.claims().await;
    let spec = &claims[0].spec;
    assert_eq!(spec.requested_by.as_deref(), Some("homelab-autoscaler/scaler"));
    let reason = spec.request.reason.as_deref().unwrap_or_default();
    assert!(reason.starts_with("demand 3 pods, target 1; slot "), "{reason}");
    assert_eq!(env.provider.target_size(&scaler, "pool").expect("target"), 1);

    // cluster-autoscaler does not see, nor scale, a builtin group.
    let ca = Caller::cluster_autoscaler();
    assert!(env.provider.node_groups(&ca).expect("groups").is_empty());
    let refused = env.provider.increase_size(&ca, "pool", 1).await.expect_err("wrong driver");
    assert!(matches!(refused, ProviderError::WrongDriver { .. }), "{refused}");
    assert_eq!(refused.kind(), ErrorKind::NotFound);

    let outcome = env
        .provider
        .delete_nodes(
            &scaler,
            "pool",
            &[homelab_autoscaler::provider::NodeRef {
                name: created[0].slot.clone(),
                ..Default::default()
            }],
        )
        .await
        .expect("release");
    assert_eq!(outcome.released, [created[0].name.clone()]);
    assert!(env.claims().await.is_empty(), "a pending claim without finalizer is gone at once");
}

#[tokio::test]
async fn an_exhausted_slot_is_skipped_and_named_when_nothing_else_is_free() {
    let env = env(
        "provider-exhausted",
        ScalingDriver::ClusterAutoscaler,
        &[("cheap", 0.1, Some(three_failures())), ("dear", 2.0, None)],
    )
    .await;
    let ca = Caller::cluster_autoscaler();
    let created = env.provider.increase_size(&ca, "pool", 1).await.expect("increase");
    assert_eq!(
        created[0].slot,
        format!("{}-dear", env.ns),
        "the cheap slot failed 3 boots in a row"
    );

    let refused = env
        .provider
        .increase_size(&ca, "pool", 1)
        .await
        .expect_err("only the exhausted slot is free");
    assert_eq!(refused.kind(), ErrorKind::FailedPrecondition);
    let message = refused.to_string();
    assert!(message.contains(&format!("{}-cheap (3 failed boots", env.ns)), "{message}");
    assert!(message.contains("attempts-reset-at"), "{message}");

    // A person's reset ends the streak at once.
    let slots: Api<Slot> = Api::namespaced(env.client.clone(), &env.ns);
    let now = jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", Timestamp::now()).expect("time");
    let patch = Patch::Merge(json!({ "metadata": { "annotations": {
        "infra.homecluster.dev/attempts-reset-at": now,
    } } }));
    slots
        .patch(&format!("{}-cheap", env.ns), &PatchParams::default(), &patch)
        .await
        .expect("reset");
    // The provider's cache shows the annotation a moment after the write.
    let created = eventually("the reset slot to take a claim", CACHE_LAG, || async {
        Ok(env.provider.increase_size(&ca, "pool", 1).await?)
    })
    .await
    .expect("the reset slot boots");
    assert_eq!(created[0].attempt, 1);
}

#[tokio::test]
async fn concurrent_scale_ups_never_claim_a_slot_twice() {
    let slots: Vec<(&str, f64, Option<serde_json::Value>)> =
        vec![("a", 1.0, None), ("b", 1.0, None), ("c", 1.0, None)];
    let env = env("provider-race", ScalingDriver::ClusterAutoscaler, &slots).await;
    let ca = Caller::cluster_autoscaler();
    let calls = (0..3).map(|_| env.provider.increase_size(&ca, "pool", 1));
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut claimed: Vec<String> =
        env.claims().await.into_iter().map(|c| c.spec.slot_ref.name).collect();
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), 3, "three claims on three different slots");
    assert_eq!(env.provider.target_size(&ca, "pool").expect("target"), 3);

    let fourth = env.provider.increase_size(&ca, "pool", 1).await.expect_err("the pool is full");
    assert_eq!(fourth.kind(), ErrorKind::FailedPrecondition);
    let names: Vec<String> = env.claims().await.iter().map(|c| c.name_any()).collect();
    assert_eq!(names.len(), 3);
}

#[tokio::test]
async fn delete_nodes_naming_a_pinned_machine_is_refused_and_releases_nothing() {
    let env = env(
        "provider-pinned",
        ScalingDriver::ClusterAutoscaler,
        &[("pinned", 1.0, None), ("scaled", 1.0, None)],
    )
    .await;
    let (pinned, scaled) = (format!("{}-pinned", env.ns), format!("{}-scaled", env.ns));
    // A person's pin on one slot (no admission in this suite: the fields it would stamp are
    // written here), cluster-autoscaler's own claim on the other; both ready.
    for (slot, call, by) in [(&pinned, "Manual", "alice"), (&scaled, "IncreaseSize", "ca")] {
        let mut request = json!({ "call": call, "group": "pool" });
        if call == "IncreaseSize" {
            request["delta"] = json!(1);
        }
        env.ready_claim(slot, request, by, &[]).await;
    }
    let ca = Caller::cluster_autoscaler();
    env.until_target(&ca, 2).await;
    let node = node_ref;
    let refused = env
        .provider
        .delete_nodes(&ca, "pool", &[node(&scaled), node(&pinned)])
        .await
        .expect_err("a pinned machine is not cluster-autoscaler's to release");
    assert!(matches!(refused, ProviderError::Pinned(_)), "{refused}");
    assert_eq!(refused.kind(), ErrorKind::FailedPrecondition);
    let message = refused.to_string();
    for part in [
        format!("node \"{pinned}\""),
        format!("claim \"{pinned}-1\""),
        "Manual claim of alice".to_owned(),
        format!("homelab-autoscaler release --slot {pinned} --namespace {}", env.ns),
        "nothing was released".to_owned(),
    ] {
        assert!(message.contains(&part), "{part:?} in {message}");
    }
    // All or nothing: the scaled machine named beside it was not released either.
    for claim in env.claims().await {
        let status = claim.status.as_ref().expect("status");
        assert!(
            status.scale_down_requested_at.is_none() && claim.metadata.deletion_timestamp.is_none(),
            "{} was left alone: {status:?}",
            claim.name_any()
        );
    }
    let outcome =
        env.provider.delete_nodes(&ca, "pool", &[node(&scaled)]).await.expect("its own machine");
    assert_eq!(outcome.released, [format!("{scaled}-1")]);
}

/// cluster-autoscaler names every empty node of a group in one DeleteNodes: of the data
/// machines among them, one is released and the others are refused with why; a machine whose
/// turn has not come (another is on its way off) or whose gate holds is not released either.
/// The gate here is CEL over a ConfigMap the storage would keep its health in.
#[tokio::test]
async fn delete_nodes_releases_one_data_machine_at_a_time_and_none_a_gate_holds() {
    use k8s_openapi::api::core::v1::{ConfigMap, Node as CoreNode};
    let env = env(
        "provider-gates",
        ScalingDriver::ClusterAutoscaler,
        &[("a", 1.0, None), ("b", 1.0, None), ("c", 1.0, None)],
    )
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let health = |healthy: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": { "name": "storage-health" }, "data": { "healthy": healthy },
        }))
        .expect("configmap")
    };
    maps.create(&PostParams::default(), &health("true")).await.expect("health");
    let gates = json!({ "spec": { "powerOffGates": [{ "name": "storage", "kubernetes": {
        "apiVersion": "v1", "kind": "ConfigMap", "namespace": env.ns, "name": "storage-health",
        "expression": "object.data.healthy == 'true'",
    } }] } });
    Api::<Group>::namespaced(env.client.clone(), &env.ns)
        .patch("pool", &PatchParams::default(), &Patch::Merge(&gates))
        .await
        .expect("gates");
    let nodes: Api<CoreNode> = Api::all(env.client.clone());
    let name = |s: &str| format!("{}-{s}", env.ns);
    for slot in ["a", "b", "c"].map(name) {
        // The finalizer admission adds: a released claim stays until its machine is off.
        let request = json!({ "call": "IncreaseSize", "group": "pool", "delta": 1 });
        env.ready_claim(&slot, request, "ca", &[homelab_autoscaler::claim::FINALIZER]).await;
        let node: CoreNode =
            serde_json::from_value(json!({ "metadata": { "name": slot } })).expect("node");
        nodes.create(&PostParams::default(), &node).await.expect("node");
        let up = Patch::Merge(
            json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } }),
        );
        nodes.patch_status(&slot, &PatchParams::default(), &up).await.expect("node ready");
    }
    let ca = Caller::cluster_autoscaler();
    env.until_target(&ca, 3).await;
    let node = |slot: &str| node_ref(&name(slot));
    let released = |slot: &str| {
        let claims = env.claims();
        let slot = name(slot);
        async move {
            claims.await.iter().any(|c| {
                c.spec.slot_ref.name == slot
                    && c.status.as_ref().is_some_and(|s| s.scale_down_requested_at.is_some())
            })
        }
    };

    // Two data machines in one call: the first goes, the second is refused with why.
    let refused = env.provider.delete_nodes(&ca, "pool", &[node("a"), node("b")]).await;
    let refused = refused.expect_err("one data machine at a time");
    assert_eq!(refused.kind(), ErrorKind::FailedPrecondition);
    let message = refused.to_string();
    assert!(message.contains(&format!("slot \"{}\"", name("b"))), "{message}");
    assert!(message.contains(&format!("data machine {} goes off first", name("a"))), "{message}");
    assert!(released("a").await && !released("b").await, "a released, b kept");

    // The next, while the first is on its way off: its turn has not come.
    eventually("the provider to see a released", CACHE_LAG, || async {
        let refused = env.provider.delete_nodes(&ca, "pool", &[node("c")]).await;
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        anyhow::ensure!(message.contains("its release is under way"), "{message}");
        Ok(())
    })
    .await
    .expect("refused for its turn");
    assert!(!released("c").await);

    // The first is off (no Node), but the storage says it is not healthy: the gate holds.
    nodes.delete(&name("a"), &Default::default()).await.expect("a off");
    let set = |healthy: &str| Patch::Merge(json!({ "data": { "healthy": healthy } }));
    maps.patch("storage-health", &PatchParams::default(), &set("false")).await.expect("sick");
    eventually("refused by the gate", CACHE_LAG, || async {
        let refused = env.provider.delete_nodes(&ca, "pool", &[node("c")]).await;
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        anyhow::ensure!(
            message.contains("gate storage is closed: object.data.healthy == 'true' is false of ConfigMap storage-health"),
            "{message}"
        );
        Ok(())
    })
    .await
    .expect("refused by the gate");
    assert!(!released("c").await);
    maps.patch("storage-health", &PatchParams::default(), &set("true")).await.expect("healthy");
    let outcome = env.provider.delete_nodes(&ca, "pool", &[node("c")]).await.expect("released");
    assert_eq!(outcome.released, [format!("{}-1", name("c"))]);
}
