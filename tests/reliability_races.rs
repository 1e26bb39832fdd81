//! Races at scale: 100 concurrent calls on one pool through the real gRPC server and the real
//! apiserver — IncreaseSize, DecreaseTargetSize, DeleteNodes, claims created by hand (with no
//! admission in front, so only the controllers' supersede rule stands between two claims and
//! one slot) and slot deletions — with the controllers and the machine simulator running. Then
//! everything is released, and the invariants of `homelab_harness::invariants` must hold: never
//! two booting claims on a slot, never a second Job of a lifecycle for a claim, no Job left
//! running, no machine on without a wanted claim, no claim stuck Terminating.
//!
//! Run with one operator replica, and with two (two providers with caches of their own behind
//! two gRPC servers, the calls split between them, as a Service spreads them).
//!
//! Admission's own share: a burst of creates of one slot sent to one replica's webhook, before
//! the API server has stored any of them, gets one claim admitted and one denied.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::future::join_all;
use homelab_autoscaler::api::NodeClaim;
use homelab_autoscaler::grpc::proto::cloud_provider_client::CloudProviderClient;
use homelab_autoscaler::grpc::{proto, serve_on};
use homelab_autoscaler::phase;
use homelab_autoscaler::provider::{Provider, ProviderConfig};
use homelab_harness::eventually;
use homelab_harness::invariants::{self, Bounds, Ledger};
use homelab_harness::lab::{Lab, With, timeouts};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const SLOTS: usize = 8;
const CALLS: usize = 100;
const SETTLE: Duration = Duration::from_secs(120);

struct Replica {
    address: SocketAddr,
    stop: CancellationToken,
    _provider: Provider,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn replica(lab: &Lab) -> Result<Replica> {
    let config = ProviderConfig { timeouts: timeouts(), ..ProviderConfig::new(&lab.ns) };
    let provider = Provider::start(lab.client.clone(), config);
    provider.wait_synced(Duration::from_secs(30)).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let stop = CancellationToken::new();
    tokio::spawn(serve_on(listener, provider.clone(), None, Duration::from_secs(30), stop.clone()));
    Ok(Replica { address, stop, _provider: provider })
}

/// A claim made by hand and sent straight to the apiserver (no admission here).
async fn hand_claim(lab: &Lab, name: &str, slot: &str) -> Result<()> {
    let now = jiff::Timestamp::now();
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": { "name": name },
        "spec": {
            "slotRef": { "name": slot },
            "request": { "call": "Manual", "group": "pool" },
            "requestedAt": Time(now), "requestedBy": "race-suite", "attempt": 1,
            "deadlineAt": Time(timeouts().deadline_at(now, None)), "ttlSecondsAfterFinished": 3600,
        },
    }))?;
    lab.claims().create(&PostParams::default(), &claim).await?;
    Ok(())
}

fn node(slot: &str) -> proto::ExternalGrpcNode {
    proto::ExternalGrpcNode {
        provider_id: format!("homelab://{slot}"),
        name: slot.to_string(),
        ..Default::default()
    }
}

/// One of the 100 calls, chosen by its index.
async fn call(
    i: usize,
    lab: &Lab,
    mut grpc: CloudProviderClient<Channel>,
    slots: &[String],
) -> &'static str {
    let slot = &slots[i % slots.len()];
    let outcome: Result<(), String> = match i % 10 {
        0..=3 => grpc
            .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                id: "pool".into(),
                delta: 1 + (i % 2) as i32,
            })
            .await
            .map(|_| ())
            .map_err(|s| s.to_string()),
        4 | 5 => hand_claim(lab, &format!("hand-{i}"), slot).await.map_err(|e| e.to_string()),
        6 | 7 => grpc
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id: "pool".into(),
                nodes: vec![node(slot)],
            })
            .await
            .map(|_| ())
            .map_err(|s| s.to_string()),
        8 => grpc
            .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                id: "pool".into(),
                delta: -1,
            })
            .await
            .map(|_| ())
            .map_err(|s| s.to_string()),
        // Deleting a slot under whatever is happening on it (the last two slots only, so the
        // pool keeps machines to race for).
        _ if i % 20 == 9 => lab
            .slots()
            .delete(&slots[SLOTS - 1 - (i / 20) % 2], &DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => grpc
            .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "pool".into() })
            .await
            .map(|_| ())
            .map_err(|s| s.to_string()),
    };
    if outcome.is_ok() { "ok" } else { "refused" }
}

/// No claim in its boot window any more: every race has been decided.
async fn until_decided(lab: &Lab) -> Result<()> {
    let claims = lab.claims();
    eventually("every claim decided", SETTLE, || async {
        let list = claims.list(&ListParams::default()).await?.items;
        let open: Vec<_> = list
            .iter()
            .filter(|c| phase::in_boot_window(c.status.as_ref().and_then(|s| s.phase)))
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        ensure!(open.is_empty(), "still in their boot window: {open:?}");
        Ok(())
    })
    .await
}

async fn race(prefix: &str, replicas: usize) {
    let lab = Lab::start(prefix, With::Controllers).await;
    let ledger = Ledger::start(&lab.client, &lab.ns).await.expect("ledger");
    let slots = lab.create_pool(SLOTS).await.expect("pool");
    let mut servers = Vec::new();
    for _ in 0..replicas {
        servers.push(replica(&lab).await.expect("replica"));
    }
    let mut clients = Vec::new();
    for server in &servers {
        let client = CloudProviderClient::connect(format!("http://{}", server.address))
            .await
            .expect("connect");
        clients.push(client);
    }

    let started = Instant::now();
    let outcomes =
        join_all((0..CALLS).map(|i| call(i, &lab, clients[i % clients.len()].clone(), &slots)))
            .await;
    let accepted = outcomes.iter().filter(|o| **o == "ok").count();
    eprintln!(
        "{CALLS} concurrent calls on {replicas} replica(s): {accepted} accepted, {} refused, in {:.2}s",
        CALLS - accepted,
        started.elapsed().as_secs_f64()
    );
    until_decided(&lab).await.expect("decided");

    // Release everything still live, as cluster-autoscaler would, and let the pool settle.
    let live: Vec<NodeClaim> = lab
        .claims()
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items
        .into_iter()
        .filter(|c| phase::is_live(c.status.as_ref().and_then(|s| s.phase)))
        .collect();
    let mut grpc = clients[0].clone();
    for claim in &live {
        let slot = &claim.spec.slot_ref.name;
        if claim.spec.request.call == homelab_autoscaler::api::ClaimCall::Manual {
            let name = claim.metadata.name.clone().unwrap_or_default();
            let _ = lab.claims().delete(&name, &DeleteParams::default()).await;
        } else {
            let _ = grpc
                .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                    id: "pool".into(),
                    nodes: vec![node(slot)],
                })
                .await;
        }
    }
    invariants::until_settled(&lab.client, &lab.ns, Bounds::default(), SETTLE)
        .await
        .expect("the invariants after the race");
    let violations = ledger.violations();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    let seen = ledger.claims();
    let ready = seen
        .values()
        .filter(|c| c.status.as_ref().and_then(|s| s.ready_at.as_ref()).is_some())
        .count();
    eprintln!(
        "{} claims in all, {ready} reached ready; settled in {:.1}s",
        seen.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(ready > 0, "the race booted nothing: the suite proves nothing");
}

/// A validating review of the create of claim `name` of `slot`, as the API server sends it.
fn create_review(ns: &str, name: &str, slot: &str, dry_run: bool) -> serde_json::Value {
    let claim = json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": { "name": name, "namespace": ns, "uid": format!("uid-{name}") },
        "spec": {
            "slotRef": { "name": slot },
            "request": { "call": "Manual", "group": "pool" },
            "requestedAt": Time(jiff::Timestamp::now()), "requestedBy": "burst",
        },
    });
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("review-{name}"),
            "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": "NodeClaim" },
            "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": "nodeclaims" },
            "name": name, "namespace": ns, "operation": "CREATE", "dryRun": dry_run,
            "userInfo": { "username": "someone" },
            "object": claim,
        },
    })
}

/// Whether the webhook admitted the review, and its message.
async fn judged(router: axum::Router, review: serde_json::Value) -> Result<(bool, String)> {
    use tower::ServiceExt as _;
    let request =
        http::Request::post(homelab_autoscaler::webhook::configuration::PATH_VALIDATE_CLAIM)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(review.to_string()))?;
    let response = router.oneshot(request).await?;
    let body = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    let allowed = answer["response"]["allowed"].as_bool().unwrap_or(false);
    let message = answer["response"]["status"]["message"].as_str().unwrap_or("").to_owned();
    Ok((allowed, message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_two_creates_of_one_slot_to_one_replica_gets_one_denial() {
    use homelab_autoscaler::webhook::{SystemClock, WebhookState};
    homelab_autoscaler::tls::install_crypto_provider();
    let lab = Lab::start("burst", With::Controllers).await;
    let slots = lab.create_pool(2).await.expect("pool");
    let caches = homelab_autoscaler::cache::Stores::start(&lab.client, &lab.ns);
    assert!(caches.wait_synced(Duration::from_secs(30)).await, "the caches synced");
    // The pool as the caches hold it, so the reviews are judged on the caches.
    let slot = slots[0].clone();
    eventually("the caches show the pool", Duration::from_secs(30), || async {
        ensure!(caches.slot(&slot).is_some() && caches.group("pool").is_some());
        Ok(())
    })
    .await
    .expect("pool cached");
    let router = homelab_autoscaler::webhook::router(std::sync::Arc::new(WebhookState {
        client: lab.client.clone(),
        caches,
        namespace: lab.ns.clone(),
        operator_usernames: Vec::new(),
        clock: Box::new(SystemClock),
        timeouts: timeouts(),
    }));

    // A dry run is judged, and never remembered.
    let dry = judged(router.clone(), create_review(&lab.ns, "dry", &slot, true)).await;
    assert!(dry.expect("dry run answered").0, "a dry run of a free slot is admitted");

    let burst = join_all(
        ["first", "second"]
            .map(|name| judged(router.clone(), create_review(&lab.ns, name, &slot, false))),
    )
    .await;
    let verdicts: Vec<(bool, String)> = burst.into_iter().collect::<Result<_>>().expect("answers");
    let denied: Vec<&String> = verdicts.iter().filter(|(ok, _)| !ok).map(|(_, m)| m).collect();
    assert_eq!(denied.len(), 1, "one of the two is denied: {verdicts:?}");
    assert!(denied[0].contains("already has live claim"), "{}", denied[0]);
    // The other slot is untouched by what this one remembers.
    let other = judged(router.clone(), create_review(&lab.ns, "third", &slots[1], false)).await;
    assert!(other.expect("answered").0, "another slot is free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_calls_on_one_replica_keep_the_invariants() {
    race("race1", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_calls_on_two_replicas_keep_the_invariants() {
    race("race2", 2).await;
}
