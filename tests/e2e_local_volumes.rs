//! Pods whose data lives on one machine (docs/decisions.md, D33), end to end: the real
//! rancher local-path-provisioner makes a real PersistentVolume on one of four simulated
//! machines, the machine is powered off, and the pod that needs it is pending again. Under the
//! built-in scaler and under the real cluster-autoscaler, exactly one claim follows, for that
//! machine's slot, and the pod runs there again; no other machine boots. A pod whose selector
//! names one machine's hostname wakes that machine in a cluster-autoscaler pool. Back from a
//! power outage (a real upsd as the UPS, the return staggered one boot at a time), the machines
//! such pods wait for boot first in both pools, before the cheaper mini-1: under
//! cluster-autoscaler, its own scale-up for another pod takes a waited-for slot. Each scenario
//! runs on a control plane of its own.
//!
//! The pool (tests/harness/manifests/local-data/) prices mini-1 cheapest and mini-3 above it, and
//! the volume is made on mini-3 (a person keeps it on while the database first starts), so a
//! scaler that boots the cheapest free slot boots the wrong machine and fails the test.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{Node as Slot, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::phase;
use homelab_harness::e2e::{
    Autoscaler, AutoscalerSettings, NAMESPACE, WebhookTls, Workload, World, operator_binary,
};
use homelab_harness::power_peers::UpsPeer;
use homelab_harness::{Components, ControlPlane, eventually, stays};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;

/// A simulated boot, the gate, the provisioner's helper pod, and a scheduler retry.
const ACT: Duration = Duration::from_secs(150);
/// Two passes of the built-in scaler and more than its hold (10 s) twice over.
const SETTLED: Duration = Duration::from_secs(25);
/// A machine powered off: its shutdown Job, its kubelet silent past the grace period, its Node
/// removed.
const OFF: Duration = Duration::from_secs(180);

const GROUP: &str = "data";
const MANIFESTS: &str = "tests/harness/manifests/local-data";

fn manifest(name: &str) -> String {
    homelab_harness::repo_path(&format!("{MANIFESTS}/{name}")).to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_scaler_wakes_the_machine_a_pods_volume_is_on_and_keeps_it() {
    let bin = operator_binary(None).expect("operator binary");
    let plane = ControlPlane::start(Components::CLUSTER).await.expect("control plane");
    let mut world =
        World::start_on(plane, &bin, false, WebhookTls::SelfMade).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = builtin_scenario(&mut world).await;
    if let Err(error) = outcome {
        panic!("{error:#}\n--- operator ---\n{}", world.operator_log_tail(0, 80));
    }
}

async fn builtin_scenario(world: &mut World) -> Result<()> {
    let woken = data_on_mini_3_then_off(world, "builtin.yaml").await?;
    ensure!(
        woken.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Ready),
        "the woken claim is ready"
    );

    // Kept: the machine runs the pod whose data it holds, through more than two holds, and the
    // slot says why.
    let claim = woken.metadata.name.clone().unwrap_or_default();
    stays("mini-3 kept on while db-0 runs on it", SETTLED, || async {
        let now = world.claims().get(&claim).await?;
        ensure!(
            phase::of(&now) == NodeClaimPhase::Ready && !phase::is_marked(&now),
            "claim {claim} is {:?}, marked {}",
            phase::of(&now),
            phase::is_marked(&now)
        );
        Ok(())
    })
    .await?;
    let slots: Api<Slot> = Api::namespaced(world.client.clone(), NAMESPACE);
    eventually("slot mini-3 names the pod whose data it holds", ACT, || async {
        let slot = slots.get("mini-3").await?;
        let held = slot.status.map(|s| s.local_volumes).unwrap_or_default();
        ensure!(
            held.iter().any(|v| v.pod == "default/db-0" && v.claim == "data-db-0"),
            "status.localVolumes: {held:?}"
        );
        Ok(())
    })
    .await?;

    // Released by the pool's usual rule once no pod needs it.
    world.kubectl(&["scale", "statefulset", "db", "-n", "default", "--replicas=0"]).await?;
    world.pool_at_zero(GROUP, OFF).await?;
    eventually("slot mini-3 holds nothing once db-0 is gone", ACT, || async {
        let slot = slots.get("mini-3").await?;
        let held = slot.status.map(|s| s.local_volumes).unwrap_or_default();
        ensure!(held.is_empty(), "status.localVolumes: {held:?}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_pools_wake_the_machine_a_pods_volume_or_hostname_needs() {
    let bin = operator_binary(None).expect("operator binary");
    let ups = UpsPeer::start().await.expect("upsd with dummy-ups");
    let mut world = World::start_for_autoscaler(&bin, false).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    let outcome = autoscaler_scenario(&mut world, &ca, &ups).await;
    eprintln!("{}", world.summary());
    if let Err(error) = outcome {
        panic!(
            "{error:#}\n--- cluster-autoscaler on the pending pods ---\n{}\n--- operator ---\n{}",
            about_pending_pods(&ca),
            world.operator_log_tail(0, 80)
        );
    }
}

async fn autoscaler_scenario(world: &mut World, ca: &Autoscaler, ups: &UpsPeer) -> Result<()> {
    data_on_mini_3_then_off(world, "cluster-autoscaler.yaml").await?;

    // A pod pinned to mini-2 by its hostname, no volume: mini-2 and nothing else.
    let before = claims_of_group(world).len();
    world.kubectl(&["apply", "-f", &manifest("on-mini-2.yaml")]).await?;
    let woken = one_new_claim(world, before, "mini-2", "on-mini-2-").await?;
    let nodes = world.pods_running("on-mini-2", 1, ACT).await?;
    ensure!(nodes == ["mini-2"], "on-mini-2 runs on {nodes:?}");
    only_these_claims(world, before + 1).await?;
    eprintln!(
        "woken for the hostname pod: {} ({})",
        woken.metadata.name.unwrap_or_default(),
        woken.spec.request.reason.unwrap_or_default()
    );
    eprintln!("cluster-autoscaler on the pending pods:\n{}", about_pending_pods(ca));

    // A power outage: low battery powers mini-2 and mini-3 off. Back on mains, the two machines
    // db-0 and on-mini-2 wait for boot first, one at a time, whoever asks: cluster-autoscaler's
    // scale-up for a third pod takes a waited-for slot, not the cheaper mini-1.
    let t = Instant::now();
    world.patch_group(GROUP, &outage_policy(ups)).await?;
    ups.set(&[("ups.status", "OB LB"), ("battery.charge", "8"), ("battery.runtime", "90")]).await?;
    world.pool_at_zero(GROUP, OFF).await?;
    world.deploy(&Workload::on_group("web", GROUP, 1, "3")).await?;
    let before = claims_of_group(world).len();
    let view: &World = world;
    stays("nothing boots on battery", SETTLED, || async {
        let claims = claims_of_group(view);
        ensure!(claims.len() == before, "claims: {}", homelab_harness::e2e::describe(&claims));
        Ok(())
    })
    .await?;
    world.note("low battery: mini-2 and mini-3 off; a web pod pending, nothing booted", t);

    let t = Instant::now();
    ups.set(&[("ups.status", "OL CHRG"), ("battery.charge", "20"), ("battery.runtime", "300")])
        .await?;
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let view: &World = world;
    eventually("db-0, on-mini-2 and web running again", Duration::from_secs(300), || {
        let most = most_at_once.clone();
        async move {
            most.fetch_max(booting(view).await?, Ordering::SeqCst);
            let db = running_on(view, "db").await?;
            let pinned = running_on(view, "on-mini-2").await?;
            let web = running_on(view, "web").await?;
            ensure!(
                db == ["mini-3"] && pinned == ["mini-2"] && web.len() == 1,
                "db-0 on {db:?}, on-mini-2 on {pinned:?}, web on {web:?}"
            );
            Ok(())
        }
    })
    .await?;
    let after: Vec<NodeClaim> = claims_of_group(world).into_iter().skip(before).collect();
    let order: Vec<(&str, &str)> = after
        .iter()
        .map(|c| (c.spec.slot_ref.name.as_str(), c.spec.requested_by.as_deref().unwrap_or("")))
        .collect();
    let first_two: std::collections::BTreeSet<&str> = order.iter().take(2).map(|o| o.0).collect();
    ensure!(
        first_two == ["mini-2", "mini-3"].into(),
        "the first boots after the outage: {order:?}; want mini-2 and mini-3, which pods wait for"
    );
    let most_at_once = most_at_once.load(Ordering::SeqCst);
    ensure!(most_at_once == 1, "{most_at_once} machines booted at once after the outage");
    world.note(format!("mains back: boots {order:?}, one at a time"), t);
    Ok(())
}

/// The pool's UPS and its return: one machine booting at a time.
fn outage_policy(ups: &UpsPeer) -> serde_json::Value {
    json!({ "spec": { "ups": {
        "name": ups.address(),
        "pollInterval": "1s",
        "onMains": { "bootsAtOnce": 1, "staggerFor": "10m" },
    } } })
}

/// The pool's claims pending or booting now, read from the API server: the World's ledger keeps
/// a claim deleted before it booted (shed as the battery ran low) at its last phase, Pending.
async fn booting(world: &World) -> Result<usize> {
    let claims = world.claims().list(&ListParams::default()).await?.items;
    Ok(claims
        .iter()
        .filter(|c| c.spec.request.group == GROUP)
        .filter(|c| matches!(phase::of(c), NodeClaimPhase::Pending | NodeClaimPhase::Booting))
        .count())
}

/// A power outage on the pool, against a real upsd (Network UPS Tools): the database's data on
/// mini-3, two web pods beside it. Low battery powers every machine off, the person's pin on
/// mini-3 too; nothing boots on battery. Mains back, the pool boots one machine at a time, and
/// the first is mini-3, the one machine db-0's volume lets it run on, although mini-1 and
/// mini-2 are cheaper and the web pods wait too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_from_an_outage_the_machine_a_pods_volume_is_on_boots_first() {
    let bin = operator_binary(None).expect("operator binary");
    let ups = UpsPeer::start().await.expect("upsd with dummy-ups");
    let plane = ControlPlane::start(Components::CLUSTER).await.expect("control plane");
    let mut world =
        World::start_on(plane, &bin, false, WebhookTls::SelfMade).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = outage_scenario(&mut world, &ups).await;
    eprintln!("{}", world.summary());
    if let Err(error) = outcome {
        panic!("{error:#}\n--- operator ---\n{}", world.operator_log_tail(0, 80));
    }
}

async fn outage_scenario(world: &mut World, ups: &UpsPeer) -> Result<()> {
    let t = Instant::now();
    world.kubectl(&["apply", "-n", NAMESPACE, "-f", &manifest("builtin.yaml")]).await?;
    world.patch_group(GROUP, &outage_policy(ups)).await?;
    data_on_mini_3(world).await?;
    world.deploy(&Workload::on_group("web", GROUP, 2, "1")).await?;
    world.pods_running("web", 2, ACT).await?;
    world.note("db-0 on mini-3 with its volume there, two web pods beside it", t);

    let t = Instant::now();
    ups.set(&[("ups.status", "OB LB"), ("battery.charge", "8"), ("battery.runtime", "90")]).await?;
    world.pool_at_zero(GROUP, OFF).await?;
    let view: &World = world;
    let before = claims_of_group(view).len();
    stays("nothing boots on battery", SETTLED, || async {
        let claims = claims_of_group(view);
        ensure!(claims.len() == before, "claims: {}", homelab_harness::e2e::describe(&claims));
        Ok(())
    })
    .await?;
    world.note(
        "low battery: every machine off, the pin on mini-3 too; nothing booted on battery",
        t,
    );

    let t = Instant::now();
    ups.set(&[("ups.status", "OL CHRG"), ("battery.charge", "20"), ("battery.runtime", "300")])
        .await?;
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let view: &World = world;
    eventually("db-0 and both web pods running again", Duration::from_secs(300), || {
        let most = most_at_once.clone();
        async move {
            most.fetch_max(booting(view).await?, Ordering::SeqCst);
            let db = running_on(view, "db").await?;
            let web = running_on(view, "web").await?;
            ensure!(db == ["mini-3"] && web.len() == 2, "db-0 on {db:?}, web on {web:?}");
            Ok(())
        }
    })
    .await?;
    let after: Vec<NodeClaim> = claims_of_group(world).into_iter().skip(before).collect();
    let first = after.first().context("no claim after the outage")?;
    let by = first.spec.requested_by.clone().unwrap_or_default();
    ensure!(
        first.spec.slot_ref.name == "mini-3" && by.contains("for pod default/db-0"),
        "the first boot after the outage is slot {} by {by:?}; want mini-3 for db-0 ({})",
        first.spec.slot_ref.name,
        homelab_harness::e2e::describe(&after)
    );
    let most_at_once = most_at_once.load(Ordering::SeqCst);
    ensure!(most_at_once == 1, "{most_at_once} machines booted at once after the outage");
    world.note(
        format!(
            "mains back: mini-3 first for db-0, then {}, one at a time",
            after[1..].iter().map(|c| c.spec.slot_ref.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
        t,
    );
    Ok(())
}

/// The nodes the Running pods labelled `app=<app>` run on, sorted.
async fn running_on(world: &World, app: &str) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "default");
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?.items;
    let mut nodes: Vec<String> = list
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    nodes.sort();
    Ok(nodes)
}

/// Applies the pool with `group_file`, starts the provisioner, keeps mini-3 on by hand while the
/// database's volume is made there, powers mini-3 off, and starts the database again: returns
/// the one claim that woke mini-3 for it, ready, with db-0 Running there.
async fn data_on_mini_3_then_off(world: &mut World, group_file: &str) -> Result<NodeClaim> {
    world.kubectl(&["apply", "-n", NAMESPACE, "-f", &manifest(group_file)]).await?;
    data_on_mini_3(world).await?;

    world.kubectl(&["scale", "statefulset", "db", "-n", "default", "--replicas=0"]).await?;
    world.kubectl(&["delete", "nodeclaim", "keep-mini-3", "-n", NAMESPACE]).await?;
    world.pool_at_zero(GROUP, OFF).await?;

    let before = claims_of_group(world).len();
    world.kubectl(&["scale", "statefulset", "db", "-n", "default", "--replicas=1"]).await?;
    let woken = one_new_claim(world, before, "mini-3", "db-0").await?;
    let nodes = world.pods_running("db", 1, ACT).await?;
    ensure!(nodes == ["mini-3"], "db-0 runs again on {nodes:?}");
    only_these_claims(world, before + 1).await?;
    eventually("the woken claim ready", ACT, || async {
        let now = world.claims().get(woken.metadata.name.as_deref().unwrap_or_default()).await?;
        ensure!(phase::of(&now) == NodeClaimPhase::Ready, "{:?}", phase::of(&now));
        Ok(now)
    })
    .await
}

/// With the pool applied: the slots, the provisioner, and mini-3 kept on by hand while the
/// database's volume is made there; returns once db-0 runs on mini-3 with its volume there.
async fn data_on_mini_3(world: &mut World) -> Result<()> {
    world.kubectl(&["apply", "-n", NAMESPACE, "-f", &manifest("slots.yaml")]).await?;
    world.start_local_path_provisioner().await?;
    world.kubectl(&["apply", "-n", NAMESPACE, "-f", &manifest("pin-mini-3.yaml")]).await?;
    eventually("mini-3 kept on by hand", ACT, || async {
        let pin = world.claims().get("keep-mini-3").await?;
        ensure!(phase::of(&pin) == NodeClaimPhase::Ready, "{:?}", phase::of(&pin));
        Ok(())
    })
    .await?;

    world.kubectl(&["apply", "-f", &manifest("db.yaml")]).await?;
    let nodes = world.pods_running("db", 1, ACT).await?;
    ensure!(nodes == ["mini-3"], "db-0 first runs on {nodes:?}");
    let volume = volume_of("data-db-0", world).await?;
    let affinity = serde_json::to_string(
        &volume.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).context("node affinity")?,
    )?;
    ensure!(affinity.contains("\"mini-3\""), "the volume is on mini-3: {affinity}");
    Ok(())
}

/// Waits for the first claim of the group after the `before` already seen, and checks it is for
/// `slot`, attributed to the pod (`pod` is a part of its name).
async fn one_new_claim(world: &World, before: usize, slot: &str, pod: &str) -> Result<NodeClaim> {
    let claim = eventually(&format!("a claim waking {slot}"), ACT, || async {
        let claims = claims_of_group(world);
        ensure!(claims.len() > before, "{} claims, none new", claims.len());
        Ok(claims[before].clone())
    })
    .await?;
    let by = claim.spec.requested_by.clone().unwrap_or_default();
    ensure!(
        claim.spec.slot_ref.name == slot && by.contains("homelab-autoscaler/scaler for pod"),
        "the new claim is for slot {} requested by {by:?}; want {slot}, by the scaler for the pod",
        claim.spec.slot_ref.name
    );
    ensure!(by.contains(pod), "requestedBy {by:?} names the pod {pod}");
    Ok(claim)
}

/// No other claim appears for a while: no second machine boots.
async fn only_these_claims(world: &World, want: usize) -> Result<()> {
    stays(&format!("exactly {want} claims of the group"), SETTLED, || async {
        let claims = claims_of_group(world);
        ensure!(claims.len() == want, "claims: {}", homelab_harness::e2e::describe(&claims));
        Ok(())
    })
    .await
}

/// Every claim of the pool ever made, oldest first.
fn claims_of_group(world: &World) -> Vec<NodeClaim> {
    let mut claims = world.claims_seen(GROUP);
    claims.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    claims
}

async fn volume_of(claim: &str, world: &World) -> Result<PersistentVolume> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(world.client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(world.client.clone());
    eventually(&format!("claim {claim} bound"), ACT, || async {
        let bound = claims.get(claim).await?.spec.and_then(|s| s.volume_name);
        let name = bound.context("not bound yet")?;
        Ok(volumes.get(&name).await?)
    })
    .await
}

/// What cluster-autoscaler logged about the test's pods: why it did or did not scale up for them.
fn about_pending_pods(ca: &Autoscaler) -> String {
    let log = ca.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("db-0") || l.contains("on-mini-2"))
        .filter(|l| l.contains("scale-up") || l.contains("ScaleUp") || l.contains("predicate"))
        .collect();
    let tail = lines.len().saturating_sub(12);
    lines[tail..].join("\n")
}
