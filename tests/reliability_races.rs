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
//!
//! And the two rules that keep a boot and a race apart, each forced at its worst moment by the
//! boot hold: a cancel that lands just before the booting write (D35), and a second claim of
//! the slot checked just after the first one's boot, its list as old as the rule allows (D34).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::future::join_all;
use homelab_autoscaler::api::{LABEL_NODECLAIM, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::grpc::proto::cloud_provider_client::CloudProviderClient;
use homelab_autoscaler::grpc::{proto, serve_on};
use homelab_autoscaler::phase;
use homelab_autoscaler::provider::{Provider, ProviderConfig};
use homelab_harness::invariants::{self, Bounds, Ledger};
use homelab_harness::lab::{Lab, With, timeouts};
use homelab_harness::seeded::{Rng, clock_seed, env_number};
use homelab_harness::{eventually, stays};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
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

/// A scale-up's cancel, as cluster-autoscaler sends it: DecreaseTargetSize(-1) on `pool`.
async fn decrease(grpc: &mut CloudProviderClient<Channel>) -> Result<(), tonic::Status> {
    grpc.node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
        id: "pool".into(),
        delta: -1,
    })
    .await
    .map(|_| ())
}

/// A scale-up, as cluster-autoscaler asks for it: IncreaseSize(+1) on `pool`.
async fn increase(grpc: &mut CloudProviderClient<Channel>) -> Result<(), tonic::Status> {
    grpc.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
        id: "pool".into(),
        delta: 1,
    })
    .await
    .map(|_| ())
}

/// The startup Jobs of the namespace whose claim is gone or never committed its boot.
async fn orphan_startup_jobs(lab: &Lab) -> Result<Vec<String>> {
    let claims = lab.claims().list(&ListParams::default()).await?.items;
    let committed = |name: &str| {
        claims.iter().any(|c| {
            c.metadata.name.as_deref() == Some(name)
                && c.status.as_ref().is_some_and(|s| s.boot_committed_at.is_some())
        })
    };
    Ok(lab
        .lifecycle_jobs("startup")
        .await?
        .into_iter()
        .filter(|job| {
            let labels = job.metadata.labels.as_ref();
            let claim = labels.and_then(|l| l.get(LABEL_NODECLAIM)).map(String::as_str);
            !claim.is_some_and(committed)
        })
        .filter_map(|job| job.metadata.name)
        .collect())
}

/// The cancel lands while the boot stands between its finalizer and its booting write (the
/// boot hold keeps it there): the cancel wins, and no startup Job exists for the claim, so the
/// machine never boots (docs/decisions.md, D35).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_up_cancelled_before_its_boot_commits_boots_nothing() {
    let lab = Lab::start("cancel", With::Controllers).await;
    let ledger = Ledger::start(&lab.client, &lab.ns).await.expect("ledger");
    let slot = lab.create_pool(1).await.expect("pool").remove(0);
    let server = replica(&lab).await.expect("replica");
    let mut grpc =
        CloudProviderClient::connect(format!("http://{}", server.address)).await.expect("connect");
    let hold = lab.boot_hold();
    hold.shut();

    increase(&mut grpc).await.expect("IncreaseSize(+1)");
    let held = eventually("a boot at the hold", SETTLE, || async {
        let held = hold.waiting();
        ensure!(!held.is_empty(), "no boot has reached its booting write yet");
        Ok(held)
    })
    .await
    .expect("the boot is held");
    let name = held[0].clone();
    let claim = lab.claims().get(&name).await.expect("the held claim");
    assert!(
        claim.finalizers().iter().any(|f| f == homelab_autoscaler::claim::FINALIZER),
        "the boot holds after its finalizer landed: {:?}",
        claim.metadata.finalizers
    );

    // The cancel is sent while the boot is held; the hold opens once its delete has landed.
    let cancel = tokio::spawn({
        let mut grpc = grpc.clone();
        async move { decrease(&mut grpc).await }
    });
    eventually("the cancel's delete to land", SETTLE, || async {
        let claim = lab.claims().get_opt(&name).await?;
        ensure!(
            claim.as_ref().is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
            "claim {name} not deleted yet"
        );
        Ok(())
    })
    .await
    .expect("the cancel deleted the claim");
    hold.open();
    cancel.await.expect("the cancel's task").expect("DecreaseTargetSize(-1) cancels the claim");

    eventually(&format!("claim {name} gone"), SETTLE, || async {
        let claim = lab.claims().get_opt(&name).await?;
        ensure!(claim.is_none(), "still there: {:?}", claim.map(|c| c.status));
        Ok(())
    })
    .await
    .expect("the cancelled claim is released");
    // Long enough for a startup Job to run and the simulated machine (1 s boot) to register.
    stays("no startup Job and no machine for the cancelled claim", Duration::from_secs(10), || {
        let lab = &lab;
        let slot = &slot;
        async move {
            let orphans = orphan_startup_jobs(lab).await?;
            ensure!(orphans.is_empty(), "startup Jobs left without their claim: {orphans:?}");
            let node = lab.nodes().get_opt(slot).await?;
            ensure!(node.is_none(), "the machine of slot {slot} booted for nothing");
            Ok(())
        }
    })
    .await
    .expect("a cancelled scale-up boots nothing");
    let violations = ledger.violations();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Rounds of the randomized cancel: `HOMELAB_CANCEL_ROUNDS` (default 20), seeded by
/// `HOMELAB_CANCEL_SEED` (default: from the clock, printed).
const CANCEL_ROUNDS: u64 = 20;

/// IncreaseSize(+1), then DecreaseTargetSize(-1) 0–50 ms later, round after round on a pool with
/// a slot per round: each cancel either wins (the claim is gone and no startup Job exists) or
/// loses to a committed boot (answered `Unavailable`, the claim boots); never a startup Job
/// without its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_ups_cancelled_at_random_delays_leave_no_startup_job_without_its_claim() {
    let rounds = env_number("HOMELAB_CANCEL_ROUNDS", CANCEL_ROUNDS);
    let seed = env_number("HOMELAB_CANCEL_SEED", clock_seed());
    eprintln!("randomized cancel: {rounds} rounds, HOMELAB_CANCEL_SEED={seed}");
    let lab = Lab::start("cancels", With::Controllers).await;
    let ledger = Ledger::start(&lab.client, &lab.ns).await.expect("ledger");
    lab.create_pool(usize::try_from(rounds).expect("rounds")).await.expect("pool");
    let server = replica(&lab).await.expect("replica");
    let mut grpc =
        CloudProviderClient::connect(format!("http://{}", server.address)).await.expect("connect");

    let mut rng = Rng::new(seed);
    let (mut cancelled, mut booted) = (0, 0);
    for round in 0..rounds {
        let delay = rng.millis(50);
        increase(&mut grpc).await.unwrap_or_else(|s| panic!("round {round}: IncreaseSize: {s}"));
        // The delay is the schedule under test, not a wait for anything.
        tokio::time::sleep(delay).await;
        match decrease(&mut grpc).await {
            Ok(()) => cancelled += 1,
            Err(status) if status.code() == tonic::Code::Unavailable => booted += 1,
            Err(status) => panic!(
                "round {round} (HOMELAB_CANCEL_SEED={seed}): DecreaseTargetSize answered {status}"
            ),
        }
    }
    eprintln!("{rounds} rounds: {cancelled} cancels won, {booted} boots won");

    // Every cancelled claim released, every other one past its boot window.
    until_decided(&lab).await.expect("decided");
    eventually("no claim terminating", SETTLE, || async {
        let list = lab.claims().list(&ListParams::default()).await?.items;
        let terminating: Vec<_> = list
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_some())
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        ensure!(terminating.is_empty(), "still terminating: {terminating:?}");
        Ok(())
    })
    .await
    .expect("cancelled claims released");
    stays("no startup Job without its claim", Duration::from_secs(5), || async {
        let orphans = orphan_startup_jobs(&lab).await?;
        ensure!(orphans.is_empty(), "HOMELAB_CANCEL_SEED={seed}: startup Jobs left: {orphans:?}");
        Ok(())
    })
    .await
    .expect("no startup Job without its claim");
    let violations = ledger.violations();
    assert!(violations.is_empty(), "HOMELAB_CANCEL_SEED={seed}: {}", violations.join("\n"));
}

/// Rounds of the boot check's floor test, each on a slot of its own.
const FLOOR_ROUNDS: usize = 3;

/// Waits for the start of the next second of the clock: the two claims of a round must be
/// created within one second, and a round started early in a second has most of it.
async fn start_of_a_second() {
    let into = jiff::Timestamp::now().subsec_nanosecond();
    let left = 1_000_000_000 - i64::from(into);
    tokio::time::sleep(Duration::from_nanos(u64::try_from(left).unwrap_or(0))).await;
}

/// Two claims of one slot, created in the same second, the later one with the smaller name: it
/// counts as the older, because claims are ordered by creation second and name, not by version.
/// The first is held just before its booting write while the second is created, so the second's
/// check runs after the first's boot, under the slot's lock. The checks list at exactly their
/// floor with the process's cache left out, the oldest view the rule allows: only the floor of
/// the controller's own writes shows the second check that the first is booting. The first
/// boots and the second gives way (docs/decisions.md, D34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_check_after_a_boot_sees_it_through_the_controllers_own_writes() {
    let lab = Lab::start("floor", With::Controllers).await;
    let ledger = Ledger::start(&lab.client, &lab.ns).await.expect("ledger");
    lab.serve_boot_checks_exactly_at_floor();
    let slots = lab.create_pool(FLOOR_ROUNDS).await.expect("pool");
    let hold = lab.boot_hold();
    let committed =
        |c: &NodeClaim| matches!(phase::of(c), NodeClaimPhase::Booting | NodeClaimPhase::Ready);
    let mut same_second = 0;
    for (round, slot) in slots.iter().enumerate() {
        let (first, second) = (format!("z-{round}"), format!("a-{round}"));
        hold.shut();
        start_of_a_second().await;
        hand_claim(&lab, &first, slot).await.expect("the first claim");
        eventually(&format!("claim {first} at the hold"), SETTLE, || async {
            ensure!(hold.waiting().contains(&first), "waiting: {:?}", hold.waiting());
            Ok(())
        })
        .await
        .expect("the first boot held");
        hand_claim(&lab, &second, slot).await.expect("the second claim");
        let created = |c: NodeClaim| c.metadata.creation_timestamp.map(|t| t.0);
        let first_at = created(lab.claims().get(&first).await.expect("first"));
        let second_at = created(lab.claims().get(&second).await.expect("second"));
        same_second += usize::from(first_at == second_at);
        hold.open();
        eventually(&format!("{first} booting and {second} superseded"), SETTLE, || async {
            let (one, two) = (lab.claims().get(&first).await?, lab.claims().get(&second).await?);
            ensure!(!committed(&two), "{second} booted too, on slot {slot}: {:?}", two.status);
            ensure!(committed(&one), "{first}: {:?}", one.status);
            let reason = two.status.and_then(|s| s.reason);
            ensure!(reason.as_deref() == Some("Superseded"), "{second}: {reason:?}");
            Ok(())
        })
        .await
        .expect("one boot per slot");
    }
    assert!(same_second > 0, "no round created its two claims within one second");
    let violations = ledger.violations();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
