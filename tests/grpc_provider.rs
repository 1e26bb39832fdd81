//! The externalgrpc provider end to end: the generated tonic client over loopback, the server,
//! the provider core and a real kube-apiserver (the homelab-harness crate). Each test gets its own
//! namespace; slot names carry the namespace because Kubernetes nodes are cluster-wide.

use std::collections::BTreeMap;
use std::time::Duration;

use homelab_autoscaler::api::{
    Group, LABEL_GROUP, LABEL_SLOT, Node as Slot, NodeClaim, NodeClaimPhase,
};
use homelab_autoscaler::claim::{BOOT_BUDGET, FINALIZER};
use homelab_autoscaler::grpc::proto::cloud_provider_client::CloudProviderClient;
use homelab_autoscaler::grpc::proto::instance_status::InstanceState;
use homelab_autoscaler::grpc::{proto, serve_on};
use homelab_autoscaler::provider::{Provider, ProviderConfig};
use homelab_harness::{Components, FailureLogs, TestNamespace, test_namespace};
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prost::Message;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

/// A slot to create: its short name and, optionally, its own hourly rate.
struct SlotDef {
    name: &'static str,
    rate: Option<f64>,
}

/// A claim to create before the provider starts, as the claim controller would have left it.
struct ClaimDef {
    slot: &'static str,
    phase: Option<NodeClaimPhase>,
    requested_at: &'static str,
    marked: bool,
    reason: Option<&'static str>,
    finalizer: bool,
}

impl ClaimDef {
    fn new(slot: &'static str, phase: Option<NodeClaimPhase>) -> Self {
        Self {
            slot,
            phase,
            requested_at: "2026-03-04T09:00:00Z",
            marked: false,
            reason: None,
            finalizer: false,
        }
    }
}

/// What a test starts from. Everything is created before the provider starts, so its caches'
/// first listing holds it all and no test waits on a watch.
#[derive(Default)]
struct Setup {
    prefix: &'static str,
    min_size: i32,
    /// The Group's `spec.scaleDown`.
    scale_down: Option<serde_json::Value>,
    slots: Vec<SlotDef>,
    claims: Vec<ClaimDef>,
    /// Slots whose machine registered a Kubernetes node.
    registered: Vec<&'static str>,
    /// More Groups, as whole objects.
    other_groups: Vec<serde_json::Value>,
}

struct Env {
    client: Client,
    ns: String,
    address: std::net::SocketAddr,
    grpc: CloudProviderClient<Channel>,
    _provider: Provider,
    _stop: Stop,
    _logs: FailureLogs<'static>,
}

struct Stop(CancellationToken);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl Env {
    /// The slot's full name: unique in the cluster, because Kubernetes nodes are cluster-wide.
    fn slot(&self, short: &str) -> String {
        format!("{}-{short}", self.ns)
    }

    fn provider_id(&self, short: &str) -> String {
        format!("homelab://{}", self.slot(short))
    }

    fn claims(&self) -> Api<NodeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn list_claims(&self) -> Vec<NodeClaim> {
        let mut claims = self.claims().list(&ListParams::default()).await.expect("list").items;
        claims.sort_by_key(|c| c.spec.slot_ref.name.clone());
        claims
    }

    async fn target_size(&mut self) -> i32 {
        let request = proto::NodeGroupTargetSizeRequest { id: "pool".into() };
        self.grpc
            .node_group_target_size(request)
            .await
            .expect("target size")
            .into_inner()
            .target_size
    }

    /// A new connection, as a restarted cluster-autoscaler makes.
    async fn reconnect(&mut self) {
        self.grpc = CloudProviderClient::connect(format!("http://{}", self.address))
            .await
            .expect("connect again");
    }

    async fn increase(&mut self, delta: i32) -> Result<(), tonic::Status> {
        let request = proto::NodeGroupIncreaseSizeRequest { delta, id: "pool".into() };
        self.grpc.node_group_increase_size(request).await.map(|_| ())
    }

    async fn decrease(&mut self, delta: i32) -> Result<(), tonic::Status> {
        let request = proto::NodeGroupDecreaseTargetSizeRequest { delta, id: "pool".into() };
        self.grpc.node_group_decrease_target_size(request).await.map(|_| ())
    }

    /// A node as cluster-autoscaler sends it: a real one (name = slot) or, for an instance
    /// that never registered, an invented one whose name is its providerID.
    fn node(&self, short: &str, registered: bool) -> proto::ExternalGrpcNode {
        let id = self.provider_id(short);
        proto::ExternalGrpcNode {
            name: if registered { self.slot(short) } else { id.clone() },
            provider_id: id,
            ..Default::default()
        }
    }

    async fn delete_nodes(
        &mut self,
        nodes: Vec<proto::ExternalGrpcNode>,
    ) -> Result<(), tonic::Status> {
        let request = proto::NodeGroupDeleteNodesRequest { nodes, id: "pool".into() };
        self.grpc.node_group_delete_nodes(request).await.map(|_| ())
    }

    async fn instances(&mut self) -> BTreeMap<String, proto::InstanceStatus> {
        let request = proto::NodeGroupNodesRequest { id: "pool".into() };
        let answer = self.grpc.node_group_nodes(request).await.expect("nodes").into_inner();
        answer
            .instances
            .into_iter()
            .map(|i| (i.id, i.status.expect("every instance has a status")))
            .collect()
    }
}

/// Creates the namespace, a cluster-autoscaler Group `pool` (maxNodeProvisionTime 20m), the
/// slots, claims and nodes of `setup`; then starts a provider and a server for that namespace
/// and connects a client.
async fn env(setup: Setup) -> Env {
    let TestNamespace { client, ns, logs, .. } =
        test_namespace(Components::API, setup.prefix).await.expect("test namespace");

    let groups: Api<Group> = Api::namespaced(client.clone(), &ns);
    let pool = json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "pool" },
        "spec": { "minSize": setup.min_size, "maxNodeProvisionTime": "20m",
                  "scaleDown": setup.scale_down.unwrap_or_else(|| json!({})),
                  "pricing": { "hourlyRate": 5.0, "podRate": 0.5 } },
    });
    for group in std::iter::once(pool).chain(setup.other_groups) {
        let group: Group = serde_json::from_value(group).expect("group");
        groups.create(&PostParams::default(), &group).await.expect("create group");
    }

    let slot_api: Api<Slot> = Api::namespaced(client.clone(), &ns);
    for def in &setup.slots {
        let name = format!("{ns}-{}", def.name);
        let mut spec = json!({
            "kubernetesNodeName": name,
            "startupPodSpec": { "image": "busybox" },
            "shutdownPodSpec": { "image": "busybox" },
            "nodeCapacity": { "cpu": "4", "memory": "8Gi" },
            "nodeLabels": { "homelab/size": "small" },
        });
        if let Some(rate) = def.rate {
            spec["pricing"] = json!({ "hourlyRate": rate, "podRate": rate / 10.0 });
        }
        let slot: Slot = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
            "metadata": { "name": name, "labels": { "group": "pool" } },
            "spec": spec,
        }))
        .expect("slot");
        slot_api.create(&PostParams::default(), &slot).await.expect("create slot");
    }

    let claim_api: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    for (i, def) in setup.claims.iter().enumerate() {
        create_claim(&claim_api, &format!("{ns}-{}", def.slot), i, def).await;
    }

    let nodes: Api<CoreNode> = Api::all(client.clone());
    for short in &setup.registered {
        let name = format!("{ns}-{short}");
        let node: CoreNode = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "providerID": format!("homelab://{name}") },
        }))
        .expect("node");
        nodes.create(&PostParams::default(), &node).await.expect("create node");
    }

    let provider = Provider::start(client.clone(), ProviderConfig::new(&ns));
    provider.wait_synced(Duration::from_secs(30)).await.expect("caches synced");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let shutdown = CancellationToken::new();
    tokio::spawn(serve_on(
        listener,
        provider.clone(),
        None,
        Duration::from_secs(30),
        shutdown.clone(),
    ));
    let grpc = CloudProviderClient::connect(format!("http://{address}")).await.expect("connect");
    Env { client, ns, address, grpc, _provider: provider, _stop: Stop(shutdown), _logs: logs }
}

/// A claim named `<slot>-<index>`, with the status the claim controller would have written.
async fn create_claim(api: &Api<NodeClaim>, slot: &str, index: usize, def: &ClaimDef) {
    let mut claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": { "name": format!("{slot}-{index}") },
        "spec": {
            "slotRef": { "name": slot },
            "request": { "call": "IncreaseSize", "delta": 1, "group": "pool" },
            "requestedAt": def.requested_at,
            "attempt": 1,
        },
    }))
    .expect("claim");
    if def.finalizer {
        claim.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    }
    let made = api.create(&PostParams::default(), &claim).await.expect("create claim");
    let mut status = serde_json::Map::new();
    if let Some(phase) = def.phase {
        status.insert("phase".into(), serde_json::to_value(phase).expect("phase"));
    }
    if def.marked {
        status.insert("scaleDownRequestedAt".into(), json!("2026-03-04T09:30:00Z"));
    }
    if let Some(reason) = def.reason {
        status.insert("reason".into(), json!(reason));
        status.insert("message".into(), json!("the boot overran its deadline"));
        status.insert("finishedAt".into(), json!("2026-03-04T09:20:00Z"));
    }
    if !status.is_empty() {
        let patch = Patch::Merge(json!({ "status": status }));
        api.patch_status(&made.name_any(), &PatchParams::default(), &patch).await.expect("status");
    }
}

fn three_priced_slots() -> Vec<SlotDef> {
    vec![
        SlotDef { name: "server", rate: Some(0.9) },
        SlotDef { name: "nuc", rate: Some(0.05) },
        SlotDef { name: "pi", rate: Some(0.01) },
    ]
}

#[tokio::test]
async fn increase_by_two_claims_the_two_cheapest_of_three_slots() {
    let mut env =
        env(Setup { prefix: "grpc-increase", slots: three_priced_slots(), ..Setup::default() })
            .await;
    env.increase(2).await.expect("IncreaseSize(2)");

    let claims = env.list_claims().await;
    let slots: Vec<&str> = claims.iter().map(|c| c.spec.slot_ref.name.as_str()).collect();
    assert_eq!(slots, [env.slot("nuc"), env.slot("pi")], "the two cheapest slots");
    for claim in &claims {
        let slot = &claim.spec.slot_ref.name;
        assert!(claim.name_any().starts_with(&format!("{slot}-")), "named <slot>-<suffix>");
        let labels = claim.labels();
        assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some("pool"));
        assert_eq!(labels.get(LABEL_SLOT), Some(slot));
        let owner = &claim.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), &owner.name, owner.controller),
            ("Node", slot, Some(true))
        );

        let spec = &claim.spec;
        assert_eq!(format!("{:?}", spec.request.call), "IncreaseSize");
        assert_eq!((spec.request.delta, spec.request.group.as_str()), (Some(2), "pool"));
        assert_eq!(spec.requested_by.as_deref(), Some("cluster-autoscaler"));
        assert_eq!(spec.attempt, Some(1));
        assert_eq!(spec.ttl_seconds_after_finished, Some(3600));
        assert_eq!(
            spec.max_node_provision_time.map(Duration::from),
            Some(Duration::from_secs(1200))
        );
        let requested = spec.requested_at.as_ref().expect("requestedAt").0;
        let deadline = spec.deadline_at.as_ref().expect("deadlineAt").0;
        // 20m is longer than the 12m10s budget, so the group's provision time is the window.
        assert!(BOOT_BUDGET < Duration::from_secs(1200));
        assert_eq!(deadline.duration_since(requested).as_secs(), 1200);
        assert!(claim.status.as_ref().and_then(|s| s.phase).is_none(), "created without a phase");
    }
    assert_eq!(env.target_size().await, 2, "new claims count from their create");

    let over = env.increase(2).await.expect_err("only one slot is left");
    assert_eq!(over.code(), Code::FailedPrecondition, "{over}");
    assert!(over.message().contains("3 slots and 2 live claims"), "{over}");
    env.increase(1).await.expect("the last slot");
    assert_eq!(env.list_claims().await.len(), 3);
}

#[tokio::test]
async fn increase_refuses_what_the_pool_cannot_do() {
    let mut env =
        env(Setup { prefix: "grpc-refuse", slots: three_priced_slots(), ..Setup::default() }).await;
    let over = env.increase(4).await.expect_err("more than the slots");
    assert_eq!(over.code(), Code::FailedPrecondition, "{over}");
    let zero = env.increase(0).await.expect_err("delta 0");
    assert_eq!(zero.code(), Code::InvalidArgument, "{zero}");
    let negative = env.increase(-1).await.expect_err("negative delta");
    assert_eq!(negative.code(), Code::InvalidArgument, "{negative}");
    let request = proto::NodeGroupIncreaseSizeRequest { delta: 1, id: "no-such-group".into() };
    let unknown = env.grpc.node_group_increase_size(request).await.expect_err("unknown group");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown}");
    assert!(env.list_claims().await.is_empty(), "a refused request writes nothing");
}

#[tokio::test]
async fn target_size_counts_live_claims_minus_marked_and_failures_until_acknowledged() {
    use NodeClaimPhase::*;
    let slots: Vec<SlotDef> = ["a", "b", "c", "d", "e", "f", "g"]
        .into_iter()
        .map(|name| SlotDef { name, rate: None })
        .collect();
    let claims = vec![
        ClaimDef::new("a", None),
        ClaimDef::new("b", Some(Pending)),
        ClaimDef::new("c", Some(Booting)),
        ClaimDef::new("d", Some(Ready)),
        ClaimDef { marked: true, ..ClaimDef::new("e", Some(Ready)) },
        ClaimDef { reason: Some("DeadlineExceeded"), ..ClaimDef::new("f", Some(Failed)) },
        ClaimDef::new("g", Some(Completed)),
    ];
    let mut env = env(Setup { prefix: "grpc-target", slots, claims, ..Setup::default() }).await;
    assert_eq!(
        env.target_size().await,
        5,
        "empty, pending, booting, ready, and the failure CA has not acknowledged; not marked or completed"
    );
    // cluster-autoscaler's DeleteNodes on the failed instance acknowledges it: it leaves the
    // target, as a failed cloud instance leaves the desired size when the autoscaler deletes it.
    env.delete_nodes(vec![env.node("f", false)]).await.expect("acknowledge");
    assert_eq!(env.target_size().await, 4, "the acknowledged failure no longer counts");
}

#[tokio::test]
async fn decrease_cancels_the_newest_pending_claim() {
    use NodeClaimPhase::*;
    let slots = vec![
        SlotDef { name: "a", rate: None },
        SlotDef { name: "b", rate: None },
        SlotDef { name: "c", rate: None },
    ];
    let claims = vec![
        ClaimDef { requested_at: "2026-03-04T09:00:00Z", ..ClaimDef::new("a", Some(Pending)) },
        ClaimDef { requested_at: "2026-03-04T09:05:00Z", ..ClaimDef::new("b", None) },
        ClaimDef { requested_at: "2026-03-04T09:10:00Z", ..ClaimDef::new("c", Some(Booting)) },
    ];
    let mut env = env(Setup { prefix: "grpc-decrease", slots, claims, ..Setup::default() }).await;
    assert_eq!(env.target_size().await, 3);
    env.decrease(-1).await.expect("DecreaseTargetSize(-1)");

    let left: Vec<String> =
        env.list_claims().await.into_iter().map(|c| c.spec.slot_ref.name).collect();
    assert_eq!(left, [env.slot("a"), env.slot("c")], "the newest pending claim (b) is gone");
    assert_eq!(env.target_size().await, 2);

    let under = env.decrease(-3).await.expect_err("below zero");
    assert_eq!(under.code(), Code::FailedPrecondition, "{under}");
}

#[tokio::test]
async fn decrease_is_unavailable_when_every_live_claim_is_committed() {
    use NodeClaimPhase::*;
    let slots = vec![SlotDef { name: "a", rate: None }, SlotDef { name: "b", rate: None }];
    let claims = vec![ClaimDef::new("a", Some(Booting)), ClaimDef::new("b", Some(Ready))];
    let mut env =
        env(Setup { prefix: "grpc-unavailable", slots, claims, ..Setup::default() }).await;
    let refused = env.decrease(-1).await.expect_err("nothing is cancelable");
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(refused.message().contains("1 booting, 1 ready"), "{refused}");
    assert_eq!(env.list_claims().await.len(), 2, "a committed boot is never cancelled");
    assert_eq!(env.target_size().await, 2);
}

#[tokio::test]
async fn decrease_of_a_group_with_no_live_claim_is_a_no_op() {
    let slots = vec![SlotDef { name: "a", rate: None }];
    let mut env = env(Setup { prefix: "grpc-noop", min_size: 1, slots, ..Setup::default() }).await;
    env.decrease(-1).await.expect("already at size");
}

#[tokio::test]
async fn delete_nodes_marks_and_deletes_the_claim_and_is_idempotent() {
    use NodeClaimPhase::*;
    let slots = vec![SlotDef { name: "a", rate: None }, SlotDef { name: "b", rate: None }];
    let claims = vec![
        ClaimDef { finalizer: true, ..ClaimDef::new("a", Some(Ready)) },
        ClaimDef::new("b", Some(Ready)),
    ];
    let mut env =
        env(Setup { prefix: "grpc-delete", min_size: 1, slots, claims, ..Setup::default() }).await;
    let node = env.node("a", true);
    env.delete_nodes(vec![node.clone()]).await.expect("DeleteNodes");

    let claim =
        env.claims().get(&format!("{}-0", env.slot("a"))).await.expect("held by its finalizer");
    let status = claim.status.clone().expect("status");
    let marked_at = status.scale_down_requested_at.clone().expect("scaleDownRequestedAt");
    assert_eq!(status.scale_down_requested_by.as_deref(), Some("cluster-autoscaler (DeleteNodes)"));
    assert!(
        claim.metadata.deletion_timestamp.is_some(),
        "deleted: its finalizer runs the shutdown"
    );
    assert_eq!(env.target_size().await, 1);
    let instances = env.instances().await;
    assert_eq!(
        instances[&env.provider_id("a")].instance_state,
        InstanceState::InstanceDeleting as i32
    );

    env.delete_nodes(vec![node]).await.expect("DeleteNodes again");
    let again = env.claims().get(&claim.name_any()).await.expect("still there");
    assert_eq!(
        again.status.and_then(|s| s.scale_down_requested_at),
        Some(marked_at),
        "marked once"
    );
    assert_eq!(env.list_claims().await.len(), 2);

    let floor = env.delete_nodes(vec![env.node("b", true)]).await.expect_err("minSize 1");
    assert_eq!(floor.code(), Code::FailedPrecondition, "{floor}");
    let stranger = proto::ExternalGrpcNode { name: "elsewhere".into(), ..Default::default() };
    let refused = env.delete_nodes(vec![stranger]).await.expect_err("not in the group");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");

    // Release the finalizer (the claim controller's job) so the namespace holds no zombie.
    env.claims()
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .expect("drop the finalizer");
}

#[tokio::test]
async fn node_group_nodes_reports_each_slot_and_a_failure_until_it_is_acknowledged() {
    use NodeClaimPhase::*;
    let slots: Vec<SlotDef> = ["pending", "booting", "joined", "ready", "failed", "marked", "free"]
        .into_iter()
        .map(|name| SlotDef { name, rate: None })
        .collect();
    let claims = vec![
        ClaimDef::new("pending", Some(Pending)),
        ClaimDef::new("booting", Some(Booting)),
        ClaimDef::new("joined", Some(Booting)),
        ClaimDef::new("ready", Some(Ready)),
        ClaimDef { reason: Some("DeadlineExceeded"), ..ClaimDef::new("failed", Some(Failed)) },
        ClaimDef { marked: true, ..ClaimDef::new("marked", Some(Ready)) },
    ];
    let registered = vec!["joined", "ready", "marked"];
    let mut env =
        env(Setup { prefix: "grpc-nodes", slots, claims, registered, ..Setup::default() }).await;
    let expected = [
        ("pending", InstanceState::InstanceCreating),
        ("booting", InstanceState::InstanceCreating),
        ("joined", InstanceState::InstanceRunning),
        ("ready", InstanceState::InstanceRunning),
        ("failed", InstanceState::InstanceCreating),
        ("marked", InstanceState::InstanceDeleting),
    ];
    let want: BTreeMap<String, i32> =
        expected.iter().map(|(short, state)| (env.provider_id(short), *state as i32)).collect();
    let instances = env.instances().await;
    let got: BTreeMap<String, i32> =
        instances.iter().map(|(id, s)| (id.clone(), s.instance_state)).collect();
    assert_eq!(got, want, "one instance per slot with something to report; none for the free slot");
    let error = instances[&env.provider_id("failed")].error_info.clone().expect("errorInfo");
    assert_eq!((error.error_code.as_str(), error.instance_error_class), ("DeadlineExceeded", 99));
    for (short, _) in expected.iter().filter(|(s, _)| *s != "failed") {
        assert!(instances[&env.provider_id(short)].error_info.is_none(), "{short} has no error");
    }

    // cluster-autoscaler answers the create error with DeleteNodes on an invented node.
    env.delete_nodes(vec![env.node("failed", false)]).await.expect("acknowledge");
    let instances = env.instances().await;
    assert!(!instances.contains_key(&env.provider_id("failed")), "acknowledged: no longer listed");
    let failed = env.claims().get(&format!("{}-4", env.slot("failed"))).await.expect("claim kept");
    assert!(failed.status.and_then(|s| s.failure_acknowledged_at).is_some());
}

#[tokio::test]
async fn node_group_for_node_finds_managed_nodes_and_leaves_others_unmanaged() {
    let slots = vec![SlotDef { name: "a", rate: None }, SlotDef { name: "b", rate: None }];
    let mut env =
        env(Setup { prefix: "grpc-for-node", min_size: 1, slots, ..Setup::default() }).await;
    for node in [env.node("a", true), env.node("b", false)] {
        let answer = env
            .grpc
            .node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(node) })
            .await
            .expect("NodeGroupForNode")
            .into_inner();
        let group = answer.node_group.expect("a group");
        assert_eq!((group.id.as_str(), group.min_size, group.max_size), ("pool", 1, 2));
        assert!(!group.debug.is_empty());
    }
    let unmanaged = proto::ExternalGrpcNode {
        name: "control-plane-1".into(),
        provider_id: "k3s://control-plane-1".into(),
        ..Default::default()
    };
    let answer = env
        .grpc
        .node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(unmanaged) })
        .await
        .expect("an unmanaged node is not an error")
        .into_inner();
    assert_eq!(answer.node_group.map(|g| g.id), Some(String::new()));
}

#[tokio::test]
async fn get_options_is_unimplemented_for_a_group_that_overrides_nothing() {
    // A cluster-autoscaler group with neither scaleDown options nor maxNodeProvisionTime.
    let plain = json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "plain" }, "spec": { "minSize": 1, "pricing": { "hourlyRate": 1.0, "podRate": 0.1 } },
    });
    let mut env =
        env(Setup { prefix: "grpc-no-options", other_groups: vec![plain], ..Setup::default() })
            .await;
    let defaults = proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        max_node_provision_duration: Some(prost_types::Duration { seconds: 900, nanos: 0 }),
        ..Default::default()
    };
    let status = env
        .grpc
        .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
            id: "plain".into(),
            defaults: Some(defaults),
        })
        .await
        .expect_err("no answer: cluster-autoscaler's own flags apply");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert!(status.message().contains("cluster-autoscaler's own flags"), "{}", status.message());
}

#[tokio::test]
async fn get_options_fills_every_field() {
    let slots = vec![SlotDef { name: "a", rate: None }];
    let scale_down = Some(json!({ "utilizationThreshold": 0.3, "unneededTime": "2m" }));
    let mut env =
        env(Setup { prefix: "grpc-options", slots, scale_down, ..Setup::default() }).await;
    // The group overrides two scale-down options (and maxNodeProvisionTime), so every field is
    // answered. cluster-autoscaler ≥ 1.35 sends its defaults without the legacy durations.
    let defaults = proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.6,
        scale_down_unready_duration: Some(prost_types::Duration { seconds: 1200, nanos: 0 }),
        ..Default::default()
    };
    let options = env
        .grpc
        .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
            id: "pool".into(),
            defaults: Some(defaults),
        })
        .await
        .expect("GetOptions")
        .into_inner()
        .node_group_autoscaling_options
        .expect("options");
    let secs = |d: &Option<prost_types::Duration>| d.as_ref().map(|d| d.seconds);
    let legacy_secs =
        |d: &Option<proto::LegacyDuration>| d.as_ref().map(|d| d.duration / 1_000_000_000);
    assert_eq!(options.scale_down_utilization_threshold, 0.3, "the group's override");
    assert_eq!(options.scale_down_gpu_utilization_threshold, 0.6, "the request's default");
    assert_eq!(secs(&options.scale_down_unneeded_duration), Some(120), "the group's override");
    assert_eq!(secs(&options.scale_down_unready_duration), Some(1200), "the request's default");
    assert_eq!(secs(&options.max_node_provision_duration), Some(1200), "the group's 20m");
    assert_eq!(legacy_secs(&options.scale_down_unneeded_time), Some(120));
    assert_eq!(legacy_secs(&options.scale_down_unready_time), Some(1200));
    assert_eq!(legacy_secs(&options.max_node_provision_time), Some(1200));
}

#[tokio::test]
async fn node_groups_template_and_prices() {
    let slots =
        vec![SlotDef { name: "dear", rate: Some(2.0) }, SlotDef { name: "cheap", rate: Some(0.5) }];
    let builtin = json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "builtin-pool" }, "spec": { "driver": "builtin" },
    });
    let mut env = env(Setup {
        prefix: "grpc-template",
        slots,
        other_groups: vec![builtin],
        ..Setup::default()
    })
    .await;

    let groups =
        env.grpc.node_groups(proto::NodeGroupsRequest {}).await.expect("groups").into_inner();
    let ids: Vec<&str> = groups.node_groups.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(ids, ["pool"], "a builtin group is not offered to cluster-autoscaler");
    assert_eq!(groups.node_groups[0].max_size, 2);

    let template = env
        .grpc
        .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
            id: "pool".into(),
        })
        .await
        .expect("template")
        .into_inner();
    assert_eq!(template.node_bytes, template.node_info, "both client generations get the node");
    let node = k8s_pb::api::core::v1::Node::decode(template.node_bytes.as_slice()).expect("a Node");
    let labels = node.metadata.expect("metadata").labels;
    assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some("pool"));
    assert_eq!(labels.get("homelab/size").map(String::as_str), Some("small"));
    assert!(!labels.contains_key("kubernetes.io/hostname"));
    let status = node.status.expect("status");
    assert_eq!(status.allocatable["cpu"].string.as_deref(), Some("4"));

    let window = |hours: i64| {
        (
            Some(prost_types::Timestamp { seconds: 0, nanos: 0 }),
            Some(prost_types::Timestamp { seconds: hours * 3600, nanos: 0 }),
        )
    };
    let (start, end) = window(2);
    let price = env
        .grpc
        .pricing_node_price(proto::PricingNodePriceRequest {
            node: Some(env.node("dear", true)),
            start_timestamp: start,
            end_timestamp: end,
            ..Default::default()
        })
        .await
        .expect("node price")
        .into_inner()
        .price;
    assert!((price - 4.0).abs() < 1e-9, "2 hours at 2.0: {price}");

    // A template node carries only the group label; it is priced as the slot it describes.
    let template_node = proto::ExternalGrpcNode {
        name: "template-node-for-pool-1234".into(),
        labels: [(LABEL_GROUP.to_string(), "pool".to_string())].into(),
        ..Default::default()
    };
    let (start, end) = window(1);
    let price = env
        .grpc
        .pricing_node_price(proto::PricingNodePriceRequest {
            node: Some(template_node),
            start_timestamp: start,
            end_timestamp: end,
            ..Default::default()
        })
        .await
        .expect("template price")
        .into_inner()
        .price;
    assert!((price - 0.5).abs() < 1e-9, "the cheap slot is the template: {price}");
}

#[tokio::test]
async fn a_new_connection_takes_over_the_boots_the_one_before_started() {
    const SESSION: &str = "infra.homecluster.dev/autoscaler-session";
    let session = |c: &NodeClaim| {
        c.metadata.annotations.as_ref().and_then(|a| a.get(SESSION)).cloned().unwrap_or_default()
    };
    let mut env =
        env(Setup { prefix: "grpc-adopt", slots: three_priced_slots(), ..Setup::default() }).await;
    env.increase(2).await.expect("the first cluster-autoscaler asks for 2");
    let first = env.list_claims().await;
    assert_eq!(first.len(), 2);
    let old = session(&first[0]);
    assert!(!old.is_empty() && first.iter().all(|c| session(c) == old), "both carry the session");

    // A restarted cluster-autoscaler asks again for the same pods while both still boot.
    env.reconnect().await;
    env.increase(2).await.expect("the restarted one asks for 2 again");
    let taken_over = env.list_claims().await;
    assert_eq!(taken_over.len(), 2, "no machine is booted twice");
    let new = session(&taken_over[0]);
    assert!(
        new != old && taken_over.iter().all(|c| session(c) == new),
        "taken over: {new} was {old}"
    );

    // Real new demand from the same connection still gets a machine.
    env.increase(1).await.expect("one more");
    assert_eq!(env.list_claims().await.len(), 3);
}
