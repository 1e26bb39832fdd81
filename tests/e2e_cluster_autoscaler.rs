//! The real cluster-autoscaler drives the pool end to end: the operator binary (webhooks,
//! controllers, the externalgrpc provider over mutual TLS), the machine simulator and
//! cluster-autoscaler 1.36.1 as processes, each scenario on a control plane of its own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{ClaimCall, Node as Slot, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::simulator::kubelet::{
    DISTRIBUTION_ANNOTATION, REGISTERS_STARTUP_TAINT_ANNOTATION, STARTUP_TAINT,
};
use homelab_harness::claims::phase;
use homelab_harness::e2e::{
    Autoscaler, AutoscalerSettings, NAMESPACE, Workload, World, describe, operator_binary,
    released_by_autoscaler, sum_samples,
};
use homelab_harness::{Components, ControlPlane, eventually, stays};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// Long enough for cluster-autoscaler's loop (2 s), a simulated boot and the gate.
const ACT: Duration = Duration::from_secs(150);

/// Runs `scenario` against a fresh World and cluster-autoscaler; on failure, prints both logs.
async fn with_autoscaler<F>(settings: AutoscalerSettings, scenario: F)
where
    F: AsyncFnOnce(&mut World, &mut Autoscaler) -> anyhow::Result<()>,
{
    let bin = operator_binary(None).expect("operator binary");
    let mut world = World::start_for_autoscaler(&bin, false).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let mut ca = world.autoscaler(&settings).await.expect("cluster-autoscaler");
    if let Err(error) = scenario(&mut world, &mut ca).await {
        panic!(
            "{error:#}\n--- cluster-autoscaler ({}) ---\n{}\n--- operator ---\n{}",
            ca.log_path().display(),
            ca.log_tail(80),
            world.operator_log_tail(0, 60)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_the_pool_up_and_down_without_a_double_boot() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_scale_up_and_down(ca, 3).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backs_off_a_machine_that_never_boots_and_places_the_pod_elsewhere() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_backs_off_a_machine_that_never_boots(world, ca).await
    })
    .await;
}

/// The machine cluster-autoscaler's scale-up lands on never boots. The claim
/// fails, cluster-autoscaler sees the instance error and backs the group off, acknowledges
/// the failed instance with DeleteNodes, and the pod ends up on another slot.
async fn autoscaler_backs_off_a_machine_that_never_boots(
    world: &mut World,
    ca: &Autoscaler,
) -> Result<()> {
    let t = Instant::now();
    world.apply_example("pool-cluster-autoscaler.yaml").await?;
    world
        .annotate_slot("mini-1", homelab_autoscaler::simulator::BEHAVIOUR_ANNOTATION, "never-boots")
        .await?;
    world.deploy(&Workload::on_group("solo", "workers", 1, "3")).await?;
    world.note("pool applied, mini-1 plays a machine that never boots; 1 pod pending", t);

    let t = Instant::now();
    let failed = eventually("the claim on mini-1 failed", ACT, || async {
        let claims = world.claims_seen("workers");
        let failed = claims
            .iter()
            .find(|c| c.spec.slot_ref.name == "mini-1" && phase(c) == NodeClaimPhase::Failed)
            .cloned();
        failed.with_context(|| format!("not yet:\n{}", describe(&claims)))
    })
    .await?;
    let reason = failed.status.as_ref().and_then(|s| s.reason.clone()).unwrap_or_default();
    ensure!(
        ["NodeNotRegistered", "DeadlineExceeded"].contains(&reason.as_str()),
        "the claim failed for the machine's sake, not {reason}"
    );
    world.note(format!("the claim on mini-1 failed: {reason}"), t);

    let t = Instant::now();
    eventually("cluster-autoscaler backs the group off", ACT, || async {
        let log = ca.log();
        ensure!(
            log.contains("Disabling scale-up for node group workers"),
            "no backoff in CA's log yet"
        );
        Ok(())
    })
    .await?;
    let failures = ca.metric("cluster_autoscaler_failed_scale_ups_total").await?;
    ensure!(failures >= 1.0, "CA counts {failures} failed scale-ups");
    world.note(
        format!("cluster-autoscaler backed group workers off ({failures} failed scale-up)"),
        t,
    );

    let t = Instant::now();
    let nodes = world.pods_running("solo", 1, ACT).await?;
    ensure!(nodes != ["mini-1"], "the pod runs on {nodes:?}");
    let claims = world.claims_seen("workers");
    let acknowledged = claims
        .iter()
        .filter(|c| c.spec.slot_ref.name == "mini-1")
        .all(|c| c.status.as_ref().is_some_and(|s| s.failure_acknowledged_at.is_some()));
    ensure!(
        acknowledged,
        "CA's DeleteNodes acknowledged the failed instance:\n{}",
        describe(&claims)
    );
    ensure!(
        claims.len() == 2 && claims.iter().all(|c| c.spec.request.call == ClaimCall::IncreaseSize),
        "one failed claim and one that booted:\n{}",
        describe(&claims)
    );
    world.note(
        format!(
            "after the backoff the pod runs on {nodes:?}; the failed instance was acknowledged"
        ),
        t,
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_no_second_machine_while_registration_is_slow() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_waits_for_slow_registration(world, ca, "30s").await
    })
    .await;
}

/// Every machine's kubelet reports NotReady for `not_ready_for` after it
/// registers. cluster-autoscaler counts the registered nodes as not started (its startup
/// taint, and its own 15 m startup time since GetOptions is unanswered), so it boots no more
/// machines than the pods need.
async fn autoscaler_waits_for_slow_registration(
    world: &mut World,
    ca: &Autoscaler,
    not_ready_for: &str,
) -> Result<()> {
    let t = Instant::now();
    world.apply_example("pool-cluster-autoscaler.yaml").await?;
    world.slow_kubelets(&["mini-1", "mini-2", "mini-3"], not_ready_for).await?;
    world.deploy(&Workload::on_group("slow", "workers", 2, "3")).await?;
    world.note(
        format!("pool applied, every kubelet NotReady for {not_ready_for}; 2 pods pending"),
        t,
    );

    let t = Instant::now();
    let client = world.client.clone();
    eventually("CA counts both registered machines as not started", ACT, || async {
        let status = Autoscaler::status(&client).await?;
        let workers = status.group("workers").context("workers not in CA's status yet")?;
        let counts = &workers.health.node_counts.registered;
        ensure!(counts.not_started == 2, "CA's status: {counts:?}");
        Ok(())
    })
    .await?;
    world.note(
        "cluster-autoscaler's status ConfigMap counts both NotReady machines as not started",
        t,
    );

    let t = Instant::now();
    let nodes = world.pods_running("slow", 2, Duration::from_secs(240)).await?;
    world.settled_without_double_boot(ca, "workers", 2).await?;
    world.note(format!("2 pods Running on {nodes:?} with exactly 2 claims"), t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_from_zero_the_group_whose_template_fits() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_scales_from_zero_by_template(world, ca).await
    })
    .await;
}

/// Two groups at zero; only the big machine's template fits the pod (CPU and
/// nodeSelector), so cluster-autoscaler scales that group from zero.
async fn autoscaler_scales_from_zero_by_template(world: &mut World, ca: &Autoscaler) -> Result<()> {
    let t = Instant::now();
    world.apply_example("pools-by-size.yaml").await?;
    let workload = Workload {
        name: "bigjob".into(),
        replicas: 1,
        cpu: "8".into(),
        node_selector: BTreeMap::from([("homelab.demo/size".to_string(), "big".to_string())]),
    };
    world.deploy(&workload).await?;
    world.note("groups `minis` (4 CPUs) and `bigs` (32 CPUs, size=big) at zero; a pod asks 8 CPUs on size=big", t);

    let t = Instant::now();
    let nodes = world.pods_running("bigjob", 1, ACT).await?;
    world.quiet_loops(ca, 3).await?;
    ensure!(nodes == ["big-1"], "the pod runs on {nodes:?}");
    ensure!(
        world.claims_seen("minis").is_empty(),
        "no small machine booted:\n{}",
        describe(&world.claims_seen("minis"))
    );
    let claims = world.claims_made_by_increase_size("bigs", 1)?;
    ensure!(claims[0].spec.slot_ref.name == "big-1", "{}", describe(&claims));
    world.note("cluster-autoscaler picked group bigs by its template; big-1 booted", t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_scale_up_loses_and_doubles_nothing() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_restarts_mid_scale_up(world, ca).await
    })
    .await;
}

/// Cluster-autoscaler is killed and restarted while its scale-up boots. Every
/// claim goes on to ready and no machine is booted twice.
async fn autoscaler_restarts_mid_scale_up(world: &mut World, ca: &mut Autoscaler) -> Result<()> {
    let t = Instant::now();
    world.apply_example("pool-cluster-autoscaler.yaml").await?;
    // Kubelets that take 20 s to turn Ready keep the boots in flight across the restart.
    world.slow_kubelets(&["mini-1", "mini-2", "mini-3"], "20s").await?;
    world.deploy(&Workload::on_group("web", "workers", 2, "3")).await?;
    eventually("cluster-autoscaler's claims", ACT, || async {
        let claims = world.claims_seen("workers");
        ensure!(claims.len() == 2, "{} claims", claims.len());
        ensure!(claims.iter().all(|c| phase(c) != NodeClaimPhase::Ready), "already ready");
        Ok(())
    })
    .await?;
    // The kill must land mid-boot; the restart after it may take longer than the boots on a
    // loaded machine, so the boots are checked between the two.
    ca.kill().await?;
    let claims = world.claims_seen("workers");
    ensure!(
        claims.iter().all(|c| phase(c) != NodeClaimPhase::Ready),
        "the kill did not land mid-boot:\n{}",
        describe(&claims)
    );
    ca.start_again().await?;
    world.note(
        "cluster-autoscaler asked for 2 machines and was killed and restarted while they booted",
        t,
    );

    let t = Instant::now();
    let nodes = world.pods_running("web", 2, ACT).await?;
    world.settled_without_double_boot(ca, "workers", 2).await?;
    world.note(format!("2 pods Running on {nodes:?}, exactly 2 claims, all ready"), t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_started_by_hand_stays_on_past_the_unneeded_time() {
    let settings = AutoscalerSettings::default();
    let unneeded = settings.scale_down_unneeded;
    with_autoscaler(settings, async move |world, ca| {
        autoscaler_leaves_a_manual_machine_on(world, ca, unneeded).await
    })
    .await;
}

/// A machine a person started with a Manual claim on a cluster-autoscaler group
/// outlives cluster-autoscaler's unneeded time, and goes off once the claim is deleted.
async fn autoscaler_leaves_a_manual_machine_on(
    world: &mut World,
    ca: &Autoscaler,
    unneeded: Duration,
) -> Result<()> {
    let t = Instant::now();
    world.apply_example("pool-cluster-autoscaler.yaml").await?;
    let name = world.create_manual_claim().await?;
    let claims = world.claims();
    eventually("the manual claim ready", ACT, || async {
        let claim = claims.get(&name).await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "phase {:?}", phase(&claim));
        Ok(())
    })
    .await?;
    world.note(format!("a person started mini-1 with claim {name}"), t);

    let t = Instant::now();
    // Well past the unneeded time: CA would have scaled an unprotected idle node down.
    let loops = u32::try_from(unneeded.as_secs() / 2 * 3)?.max(10);
    world.quiet_loops(ca, loops).await?;
    let claim = claims.get(&name).await?;
    ensure!(
        phase(&claim) == NodeClaimPhase::Ready,
        "the manual claim is still ready: {:?}",
        phase(&claim)
    );
    world.autoscaler_left_on(ca, "mini-1").await?;
    world.note(
        format!("{loops} loops of cluster-autoscaler later mini-1 is still on, untouched"),
        t,
    );

    let t = Instant::now();
    world.kubectl(&["delete", "nodeclaim", "-n", NAMESPACE, &name, "--wait=false"]).await?;
    world.pool_at_zero("workers", ACT).await?;
    world.note("deleted the claim: mini-1 drained and powered off", t);
    Ok(())
}

/// A data machine its pool's power-off gate holds on: cluster-autoscaler finds it unneeded and
/// asks DeleteNodes, which refuses (the gate cannot be read: no Prometheus answers); CA takes its
/// ToBeDeleted taint off again and records the failure, and the machine stays on, its claim
/// ready, well past the unneeded time. Once the gate is gone, CA scales it down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_machine_its_gate_holds_stays_while_cluster_autoscaler_asks_it_down() {
    let settings = AutoscalerSettings::default();
    let unneeded = settings.scale_down_unneeded;
    with_autoscaler(settings, async move |world, ca| {
        gated_machine_outlives_autoscaler_scale_down(world, ca, unneeded).await
    })
    .await;
}

async fn gated_machine_outlives_autoscaler_scale_down(
    world: &mut World,
    ca: &Autoscaler,
    unneeded: Duration,
) -> Result<()> {
    world.apply_example("pool-cluster-autoscaler.yaml").await?;
    // Nothing listens on port 1: the gate cannot be read, so it holds.
    let gate = r#"{"spec":{"powerOffGates":[{"name":"ceph","prometheus":{"url":"http://127.0.0.1:1","query":"ceph_health_status == 0"}}]}}"#;
    world
        .kubectl(&["patch", "group", "workers", "-n", NAMESPACE, "--type=merge", "-p", gate])
        .await?;
    world.deploy(&Workload::on_group("web", "workers", 1, "3")).await?;
    let ran_on = world.pods_running("web", 1, ACT).await?;
    let machine = ran_on.first().context("the pod's machine")?.clone();
    world.scale("web", 0).await?;

    let failed = "holds data its storage cannot lose now: gate ceph could not be read";
    eventually("cluster-autoscaler's DeleteNodes refused", ACT, || async {
        ensure!(ca.log().contains(failed), "CA has not logged the refusal yet");
        Ok(())
    })
    .await?;
    let on_and_ready = || async {
        let claims = world.all_claims().await?;
        let ready = claims.iter().any(|c| {
            c.spec.slot_ref.name == machine
                && phase(c) == NodeClaimPhase::Ready
                && !homelab_autoscaler::phase::is_marked(c)
        });
        ensure!(ready, "no ready, unreleased claim on {machine}:\n{}", describe(&claims));
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(nodes.contains(&machine), "{machine} is gone; Nodes {nodes:?}");
        anyhow::Ok(())
    };
    stays("the gated machine on while cluster-autoscaler runs", unneeded * 3, &on_and_ready)
        .await?;
    let scaled_down = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
    ensure!(scaled_down == 0.0, "CA counted {scaled_down} nodes scaled down");
    // CA took its taint off after each refusal: the machine is left schedulable.
    eventually("no ToBeDeleted taint left on the machine", ACT, || async {
        let node: CoreNode = Api::all(world.client.clone()).get(&machine).await?;
        let tainted = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "ToBeDeletedByClusterAutoscaler");
        ensure!(!tainted, "still tainted");
        Ok(())
    })
    .await?;

    world
        .kubectl(&[
            "patch",
            "group",
            "workers",
            "-n",
            NAMESPACE,
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/powerOffGates"}]"#,
        ])
        .await?;
    world.pool_at_zero("workers", ACT).await
}

/// A pin in a cluster-autoscaler pool (`homelab-autoscaler keep-on`, run as a person would):
/// cluster-autoscaler finds the pinned machine empty but never scales it down, well past its
/// unneeded time, while it scales its own machines down; `release` then turns the pin off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_machine_stays_while_cluster_autoscaler_scales_its_own_down() {
    let settings = AutoscalerSettings::default();
    let unneeded = settings.scale_down_unneeded;
    with_autoscaler(settings, async move |world, ca| {
        pinned_machine_outlives_autoscaler_scale_down(world, ca, unneeded).await
    })
    .await;
}

/// Runs the operator binary as a person would, with the World's kubeconfig: (ok, stdout, stderr).
async fn cli(world: &World, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"))
        .args(args)
        .env("KUBECONFIG", world.plane.kubeconfig_path())
        .output()
        .await?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok((out.status.success(), text(&out.stdout), text(&out.stderr)))
}

async fn pinned_machine_outlives_autoscaler_scale_down(
    world: &World,
    ca: &Autoscaler,
    unneeded: Duration,
) -> anyhow::Result<()> {
    let live = |c: &NodeClaim| homelab_autoscaler::phase::is_live(Some(phase(c)));
    world.apply_example("pool-cluster-autoscaler.yaml").await?;
    world.deploy(&Workload::on_group("web", "workers", 2, "3")).await?;
    let ran_on = world.pods_running("web", 2, ACT).await?;

    let free = ["mini-1", "mini-2", "mini-3"]
        .into_iter()
        .find(|s| !ran_on.iter().any(|n| n == s))
        .context("a slot cluster-autoscaler left free")?;
    let (ok, stdout, stderr) =
        cli(world, &["keep-on", "--slot", free, "--namespace", NAMESPACE, "--for", "10m"]).await?;
    ensure!(ok, "keep-on failed: {stderr}");
    let pin = stdout.split_whitespace().nth(1).context("the pin's name")?.to_owned();
    let pinned_and_on = || async {
        let claims = world.all_claims().await?;
        let claim = claims.iter().find(|c| c.metadata.name.as_deref() == Some(pin.as_str()));
        let claim = claim.context("the pin exists")?;
        ensure!(claim.spec.request.call == ClaimCall::Manual, "{:?}", claim.spec.request.call);
        let now = phase(claim);
        ensure!(now == NodeClaimPhase::Ready, "pin {pin} is {now:?}");
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(nodes.iter().any(|n| n == free), "{free} is gone; Nodes {nodes:?}");
        anyhow::Ok(())
    };
    eventually("the pin ready", ACT, &pinned_and_on).await?;

    // The work goes: cluster-autoscaler scales its two machines down and leaves the pin.
    world.scale("web", 0).await?;
    eventually("cluster-autoscaler's own machines released", ACT, || async {
        pinned_and_on().await.context("the pin was released")?;
        let theirs = world
            .all_claims()
            .await?
            .into_iter()
            .filter(|c| c.spec.request.call == ClaimCall::IncreaseSize && live(c))
            .count();
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(theirs == 0 && nodes == [free], "{theirs} live claims of CA, Nodes {nodes:?}");
        Ok(())
    })
    .await?;
    let scaled_down = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
    ensure!(scaled_down == 2.0, "CA scaled {scaled_down} nodes down, its own two");
    // Well past the unneeded time, in CA's loops: still on, still pinned.
    stays("the pin on while cluster-autoscaler runs", unneeded * 3, &pinned_and_on).await?;
    let scaled_down = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
    ensure!(scaled_down == 2.0, "CA scaled the pin down too: {scaled_down}");
    // What cluster-autoscaler made of the pinned node: it skips it every loop, never removes it.
    let log = ca.log();
    let skipped =
        format!("Skipping {free} from delete consideration - the node is marked as no scale down");
    ensure!(log.contains(&skipped), "CA never said it skips the pinned node");
    ensure!(
        !log.lines().any(|l| l.contains(free) && l.contains("Scale-down: removing")),
        "cluster-autoscaler tried to remove the pinned node"
    );

    let (ok, _, stderr) =
        cli(world, &["release", "--slot", free, "--namespace", NAMESPACE]).await?;
    ensure!(ok, "release failed: {stderr}");
    world.pool_at_zero("workers", ACT).await
}

// Machines that keep their Kubernetes Node, as real homelab machines do: the simulator's kubelet
// stops when a machine is off and finds its Node again at boot (docs/testing.md).

/// The slots of the pool, cheapest-first order being name order (they cost the same).
const REAL_MACHINE_SLOTS: [&str; 4] = ["home-1", "home-2", "home-3", "home-4"];
const POOL: &str = "tests/harness/manifests/pool-real-machines.yaml";
const GROUP: &str = "homes";
/// Down to zero: CA's unneeded time, the drain, the shutdown Job, the kubelet going silent
/// (kube-controller-manager's 20 s) and the operator removing the Node.
const BACK_TO_ZERO: Duration = Duration::from_secs(240);
/// What cluster-autoscaler logs when it falls into the traps these scenarios guard against: it
/// removes an instance it takes for unregistered, stops scaling the cluster, or builds a group's
/// template from an unready node. (Its "N unregistered nodes present" is the normal state while
/// a machine boots.)
const TRAPS: [&str; 4] = [
    "unregistered nodes for node group",
    "Marking unregistered node",
    "Cluster is not ready for autoscaling",
    "based on unready",
];

/// Applies the pool of four machines.
async fn apply_real_machine_pool(world: &World) -> Result<()> {
    let path = homelab_harness::repo_path(POOL);
    world.kubectl(&["apply", "-n", NAMESPACE, "-f", &path.to_string_lossy()]).await?;
    Ok(())
}

/// The Nodes of the pool's machines that exist now, Ready or not.
async fn pool_nodes(world: &World) -> Result<Vec<CoreNode>> {
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            n.metadata.name.as_deref().is_some_and(|name| REAL_MACHINE_SLOTS.contains(&name))
        })
        .collect())
}

/// Waits until no machine of the pool has a Node.
async fn no_pool_nodes(world: &World, within: Duration) -> Result<()> {
    eventually("no Node left for the pool's machines", within, || async {
        let left: Vec<String> =
            pool_nodes(world).await?.into_iter().filter_map(|n| n.metadata.name).collect();
        ensure!(left.is_empty(), "Nodes still there: {left:?}");
        Ok(())
    })
    .await
}

/// cluster-autoscaler's status says the cluster is healthy, and its log has none of the
/// lines of the traps (from byte `since` of the log on).
async fn autoscaler_unharmed(world: &World, ca: &Autoscaler, since: usize) -> Result<()> {
    let status = Autoscaler::status(&world.client).await?;
    let health = &status.cluster_wide.health;
    ensure!(
        health.status != "Unhealthy",
        "CA's status says the cluster is unhealthy: {:?}",
        health.node_counts
    );
    let log = ca.log();
    let tail = log.get(since..).unwrap_or_default();
    for trap in TRAPS {
        let hit = tail.lines().find(|l| l.contains(trap));
        ensure!(hit.is_none(), "CA logged {trap:?}: {}", hit.unwrap_or_default());
    }
    Ok(())
}

/// How many DeleteNodes calls the provider has answered (its own metric).
async fn delete_nodes_calls(world: &World) -> Result<f64> {
    let body = world.admin_get(0, "/metrics").await?;
    Ok(sum_samples(&body, "homelab_autoscaler_grpc_requests_total", "rpc=\"NodeGroupDeleteNodes\""))
}

/// The one slot every claim of the group named (the scenario boots the same machine).
fn only_slot(claims: &[NodeClaim]) -> Result<String> {
    let mut slots: Vec<&str> = claims.iter().map(|c| c.spec.slot_ref.name.as_str()).collect();
    slots.dedup();
    ensure!(slots.len() == 1, "claims on several slots:\n{}", describe(claims));
    Ok(slots[0].to_string())
}

/// CA with `extra` flags on top of the defaults.
fn settings_with(extra: &[&str]) -> AutoscalerSettings {
    AutoscalerSettings {
        extra: extra.iter().map(|f| f.to_string()).collect(),
        ..AutoscalerSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_over_machines_that_are_already_off() {
    let bin = operator_binary(None).expect("operator binary");
    let plane = ControlPlane::start(Components::CLUSTER).await.expect("control plane");
    let off = REAL_MACHINE_SLOTS.map(|slot| plane.add_stopped_machine(slot, BTreeMap::new()));
    for machine in futures::future::join_all(off).await {
        machine.expect("a machine that joined long ago and is off now");
    }
    let mut world = World::start_for_autoscaler_on(plane, &bin, false).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let mut ca = None;
    let settings = AutoscalerSettings::default();
    if let Err(error) = autoscaler_over_machines_already_off(&mut world, &mut ca, &settings).await {
        let ca_log = ca.as_ref().map(|ca| ca.log_tail(80)).unwrap_or_default();
        panic!(
            "{error:#}\n--- cluster-autoscaler ---\n{ca_log}\n--- operator ---\n{}",
            world.operator_log_tail(0, 60)
        );
    }
}

/// The operator is installed over four machines that joined the cluster long ago
/// and are off now (their Nodes Unknown), beside a Ready node outside the pool. Their
/// Nodes are removed, and cluster-autoscaler, started then, is never unhealthy and boots
/// exactly one machine for each of two pods.
async fn autoscaler_over_machines_already_off(
    world: &mut World,
    ca: &mut Option<Autoscaler>,
    settings: &AutoscalerSettings,
) -> Result<()> {
    let t = Instant::now();
    let before = pool_nodes(world).await?;
    ensure!(before.len() == REAL_MACHINE_SLOTS.len(), "the off machines' Nodes exist first");
    apply_real_machine_pool(world).await?;
    no_pool_nodes(world, ACT).await?;
    world.note("pool applied over 4 Unknown Nodes: the operator removed every one", t);

    let t = Instant::now();
    let started = ca.insert(world.autoscaler(settings).await?);
    world.deploy(&Workload::on_group("web", GROUP, 2, "3")).await?;
    let nodes = world.pods_running("web", 2, ACT).await?;
    world.settled_without_double_boot(started, GROUP, 2).await?;
    autoscaler_unharmed(world, started, 0).await?;
    world.note(format!("2 pods Running on {nodes:?} with exactly 2 claims; CA healthy"), t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_boot_of_the_same_machine_is_upcoming_again() {
    let startup = Duration::from_secs(45);
    let flag = format!("--max-node-startup-time={}s", startup.as_secs());
    with_autoscaler(settings_with(&[&flag]), async move |world, ca| {
        autoscaler_second_boot_of_the_same_machine(world, ca, startup).await
    })
    .await;
}

/// The same machine boots, goes off and boots again, its kubelet NotReady for a
/// while after registering. cluster-autoscaler (its startup time cut to 45 s, shorter than
/// a round) counts the rebooting node as not started both times, and each round takes
/// exactly one claim.
async fn autoscaler_second_boot_of_the_same_machine(
    world: &mut World,
    ca: &Autoscaler,
    startup_time: Duration,
) -> Result<()> {
    apply_real_machine_pool(world).await?;
    world.slow_kubelets(&REAL_MACHINE_SLOTS, "15s").await?;
    world.deploy(&Workload::on_group("web", GROUP, 0, "3")).await?;
    let mut first_registered: Option<Instant> = None;
    for round in 1..=2usize {
        let t = Instant::now();
        if let Some(at) = first_registered {
            // Round 2 must begin past CA's startup time of the first registration, or a kept Node
            // would still count as starting: a fast machine gets there first and waits for it.
            eventually("CA's startup time past the first registration", startup_time, || async {
                ensure!(at.elapsed() > startup_time, "{:?} since", at.elapsed());
                Ok(())
            })
            .await?;
        }
        world.scale("web", 1).await?;
        let client = world.client.clone();
        eventually("CA counts the booting machine as not started", ACT, || async {
            let status = Autoscaler::status(&client).await?;
            let group = status.group(GROUP).context("homes not in CA's status yet")?;
            let counts = &group.health.node_counts.registered;
            ensure!(
                counts.not_started == 1 && counts.unready.total == 0,
                "CA's status: {counts:?}"
            );
            Ok(())
        })
        .await?;
        first_registered.get_or_insert_with(Instant::now);
        let nodes = world.pods_running("web", 1, ACT).await?;
        world.quiet_loops(ca, 5).await?;
        let claims = world.claims_made_by_increase_size(GROUP, round)?;
        let slot = only_slot(&claims)?;
        let live: Vec<&NodeClaim> =
            claims.iter().filter(|c| phase(c) != NodeClaimPhase::Completed).collect();
        ensure!(
            live.len() == 1 && phase(live[0]) == NodeClaimPhase::Ready,
            "round {round}: one ready claim:\n{}",
            describe(&claims)
        );
        autoscaler_unharmed(world, ca, 0).await?;
        world.note(
            format!("round {round}: {slot} booted once, not started to CA, pod on {nodes:?}"),
            t,
        );
        if round == 1 {
            let t = Instant::now();
            world.scale("web", 0).await?;
            world.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
            no_pool_nodes(world, ACT).await?;
            world.note("scaled to 0: the machine is off and has no Node", t);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3s_provider_ids_need_no_configuration() {
    let provision = Duration::from_secs(30);
    let flag = format!("--max-node-provision-time={}s", provision.as_secs());
    with_autoscaler(settings_with(&[&flag]), async move |world, ca| {
        autoscaler_on_k3s_provider_ids(world, ca, provision).await
    })
    .await;
}

/// K3s machines write `k3s://<name>` on their Nodes and the slots declare nothing.
/// Instances follow the Nodes' providerIDs, so cluster-autoscaler (its provision time cut
/// to `provision_time`) never takes a serving machine for an unregistered one.
async fn autoscaler_on_k3s_provider_ids(
    world: &mut World,
    ca: &Autoscaler,
    provision_time: Duration,
) -> Result<()> {
    let t = Instant::now();
    apply_real_machine_pool(world).await?;
    for slot in REAL_MACHINE_SLOTS {
        world.annotate_slot(slot, DISTRIBUTION_ANNOTATION, "k3s").await?;
    }
    world.deploy(&Workload::on_group("web", GROUP, 2, "3")).await?;
    let nodes = world.pods_running("web", 2, ACT).await?;
    world.settled_without_double_boot(ca, GROUP, 2).await?;
    let slots: Api<Slot> = Api::namespaced(world.client.clone(), NAMESPACE);
    for node in &nodes {
        let slot = slots.get(node).await?;
        let recorded = slot.status.and_then(|s| s.provider_id);
        ensure!(
            recorded.as_deref() == Some(format!("k3s://{node}").as_str()),
            "slot {node} records providerID {recorded:?}"
        );
    }
    world.note(format!("2 k3s machines up ({nodes:?}), providerIDs followed"), t);

    let t = Instant::now();
    let busy = Instant::now();
    while busy.elapsed() <= provision_time + Duration::from_secs(10) {
        world.quiet_loops(ca, 5).await?;
    }
    let claims = world.claims_made_by_increase_size(GROUP, 2)?;
    ensure!(
        claims.iter().all(|c| phase(c) == NodeClaimPhase::Ready),
        "both machines still serve after CA's provision time:\n{}",
        describe(&claims)
    );
    world.pods_running("web", 2, Duration::from_secs(5)).await?;
    let status = Autoscaler::status(&world.client).await?;
    let group = status.group(GROUP).context("homes in CA's status")?;
    ensure!(
        group.health.node_counts.unregistered == 0
            && group.health.node_counts.registered.ready == 2,
        "CA's counts: {:?}",
        group.health.node_counts
    );
    autoscaler_unharmed(world, ca, 0).await?;
    world.note(format!("busy past CA's {provision_time:?} provision time: nothing deleted"), t);

    let t = Instant::now();
    world.scale("web", 0).await?;
    world.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
    world.note("scaled to 0", t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_machines_are_off_deletes_nothing() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_restarted_while_machines_are_off(world, ca).await
    })
    .await;
}

/// Cluster-autoscaler restarts (as after a certificate renewal) while the pool's
/// machines are off. It calls no DeleteNodes for them, logs nothing about unregistered or
/// unready nodes, and the next scale-up is exact.
async fn autoscaler_restarted_while_machines_are_off(
    world: &mut World,
    ca: &mut Autoscaler,
) -> Result<()> {
    let t = Instant::now();
    apply_real_machine_pool(world).await?;
    world.deploy(&Workload::on_group("web", GROUP, 2, "3")).await?;
    world.pods_running("web", 2, ACT).await?;
    world.settled_without_double_boot(ca, GROUP, 2).await?;
    world.scale("web", 0).await?;
    world.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
    no_pool_nodes(world, ACT).await?;
    world.note("2 machines up and off again: no Node left", t);

    let t = Instant::now();
    let deletes = delete_nodes_calls(world).await?;
    let since = ca.log().len();
    ca.restart().await?;
    world.quiet_loops(ca, 10).await?;
    let after = delete_nodes_calls(world).await?;
    ensure!(after == deletes, "CA called DeleteNodes {} times after its restart", after - deletes);
    autoscaler_unharmed(world, ca, since).await?;
    world.note("CA restarted: 10 loops, no DeleteNodes, nothing unready or unregistered", t);

    let t = Instant::now();
    world.scale("web", 1).await?;
    let nodes = world.pods_running("web", 1, ACT).await?;
    world.quiet_loops(ca, 5).await?;
    let claims = world.claims_made_by_increase_size(GROUP, 3)?;
    let live = claims.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).count();
    ensure!(live == 1, "one ready claim after the restart:\n{}", describe(&claims));
    world.note(format!("the next scale-up took exactly one claim: pod on {nodes:?}"), t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_of_a_machine_gone_is_recreated_elsewhere() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_replaces_a_statefulset_pod_of_a_machine_gone(world, ca).await
    })
    .await;
}

/// The machine a StatefulSet's pod runs on crashes (its kubelet stops). The claim
/// fails MachineGone (or cluster-autoscaler releases it), the machine's Node is removed, and
/// the pod is recreated and runs on a fresh Node (a pod bound to a Node that exists is never
/// replaced). The fresh Node may be the same machine booted again: it costs the same as the
/// others and a crash is not a failed boot.
async fn autoscaler_replaces_a_statefulset_pod_of_a_machine_gone(
    world: &mut World,
    ca: &Autoscaler,
) -> Result<()> {
    let t = Instant::now();
    apply_real_machine_pool(world).await?;
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": { "name": "db", "namespace": "default" },
        "spec": {
            "replicas": 1,
            "serviceName": "db",
            "selector": { "matchLabels": { "app": "db" } },
            "template": {
                "metadata": { "labels": { "app": "db" } },
                "spec": {
                    "nodeSelector": { homelab_autoscaler::api::LABEL_GROUP: GROUP },
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{ "name": "db", "image": "postgres:17", "resources": { "requests": { "cpu": "3" } } }],
                },
            },
        },
    }))?;
    Api::<StatefulSet>::namespaced(world.client.clone(), "default")
        .create(&PostParams::default(), &set)
        .await?;
    let first = world.pods_running("db", 1, ACT).await?.remove(0);
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "default");
    let old_uid = pods.get("db-0").await?.metadata.uid;
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    let crashed_node = nodes.get(&first).await?.metadata.uid;
    world.note(format!("StatefulSet db: pod db-0 Running on {first}"), t);

    let t = Instant::now();
    world.plane.stop_kubelet(&first).await?;
    eventually(
        &format!("the Node of the crashed machine {first} to be removed"),
        Duration::from_secs(420),
        || async {
            ensure!(nodes.get_opt(&first).await?.is_none(), "Node {first} still there");
            Ok(())
        },
    )
    .await
    .with_context(|| ca.log_tail(30))?;
    world.note(format!("{first} crashed: its claim failed, its Node was removed"), t);

    let t = Instant::now();
    let placed = eventually("db-0 recreated and Running on a fresh Node", ACT, || async {
        let pod = pods.get("db-0").await?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        ensure!(pod.metadata.uid != old_uid, "still the old pod, on {node}");
        ensure!(running, "the new pod is on {node:?}, not running yet");
        let host = nodes.get(&node).await?.metadata.uid;
        ensure!(host != crashed_node, "the new pod is on the crashed machine's old Node");
        Ok(node)
    })
    .await
    .with_context(|| ca.log_tail(30))?;
    let claims = world.claims_seen(GROUP);
    let machine_gone =
        |c: &NodeClaim| c.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("MachineGone");
    ensure!(
        claims
            .iter()
            .filter(|c| c.spec.slot_ref.name == first)
            .any(|c| machine_gone(c) || released_by_autoscaler(c)),
        "the crashed machine's claim ended MachineGone or by CA:\n{}",
        describe(&claims)
    );
    world.note(format!("db-0 recreated on a fresh Node of {placed}"), t);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_labels_come_back_at_every_boot() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_declared_labels_come_back(world, ca).await
    })
    .await;
}

/// A pod selects a label that only the slots declare (no kubelet registers it).
/// It runs on the machine after its first and after its second boot, one claim each: the
/// operator writes the label onto every fresh Node.
async fn autoscaler_declared_labels_come_back(world: &mut World, ca: &Autoscaler) -> Result<()> {
    apply_real_machine_pool(world).await?;
    let workload = Workload {
        node_selector: BTreeMap::from([
            (homelab_autoscaler::api::LABEL_GROUP.to_string(), GROUP.to_string()),
            ("homelab.test/accelerator".to_string(), "coral".to_string()),
        ]),
        ..Workload::on_group("inference", GROUP, 1, "3")
    };
    world.deploy(&workload).await?;
    for round in 1..=2usize {
        let t = Instant::now();
        let nodes = world.pods_running("inference", 1, ACT).await?;
        world.quiet_loops(ca, 5).await?;
        let claims = world.claims_made_by_increase_size(GROUP, round)?;
        let slot = only_slot(&claims)?;
        world.note(format!("boot {round} of {slot}: the pod runs on {nodes:?}"), t);
        if round == 1 {
            let t = Instant::now();
            world.scale("inference", 0).await?;
            world.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
            no_pool_nodes(world, ACT).await?;
            world.scale("inference", 1).await?;
            world.note("off (Node removed, label gone with it), then asked for again", t);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3s_nodes_carry_their_declaration_through_registration_churn() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_through_registration_churn(world, ca, Some("k3s")).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_nodes_carry_their_declaration_through_registration_churn() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        autoscaler_through_registration_churn(world, ca, None).await
    })
    .await;
}

/// The label every slot of the pool declares and no kubelet registers.
const DECLARED_LABEL: (&str, &str) = ("homelab.test/accelerator", "coral");

/// Fresh Nodes change every ~250 ms in their first seconds (kube-controller-manager, the
/// kubelet's status, a CNI), and the Group declares no readiness taints, so a machine is Ready
/// the moment it registers. Its kubelet registers without CA's startup taint (a user who did
/// not follow the docs' `--register-with-taints`) and, on k3s, with its own providerID, so
/// cluster-autoscaler matches the Node to its group at once. Two pods that select a label only
/// the slots declare need a machine each: cluster-autoscaler makes exactly two claims, every
/// fresh Node carries the declaration and the startup taint from its first watch event (the
/// node webhook puts them on at creation), and no Node loses the startup taint before it
/// carries the declaration.
async fn autoscaler_through_registration_churn(
    world: &mut World,
    ca: &Autoscaler,
    distribution: Option<&str>,
) -> Result<()> {
    let t = Instant::now();
    apply_real_machine_pool(world).await?;
    let no_gate = r#"{"spec":{"nodeReadinessTaints":[]}}"#;
    world
        .kubectl(&[
            "patch",
            "-n",
            NAMESPACE,
            "group.infra.homecluster.dev",
            GROUP,
            "--type=merge",
            "-p",
            no_gate,
        ])
        .await?;
    for slot in REAL_MACHINE_SLOTS {
        world.annotate_slot(slot, REGISTERS_STARTUP_TAINT_ANNOTATION, "false").await?;
        if let Some(distribution) = distribution {
            world.annotate_slot(slot, DISTRIBUTION_ANNOTATION, distribution).await?;
        }
    }
    let churn = Churn::start(world.client.clone());
    let workload = Workload {
        node_selector: BTreeMap::from([
            (homelab_autoscaler::api::LABEL_GROUP.to_string(), GROUP.to_string()),
            (DECLARED_LABEL.0.to_string(), DECLARED_LABEL.1.to_string()),
        ]),
        ..Workload::on_group("inference", GROUP, 2, "3")
    };
    world.deploy(&workload).await?;
    let settled = match world.pods_running("inference", 2, ACT).await {
        Ok(nodes) => world.settled_without_double_boot(ca, GROUP, 2).await.map(|()| nodes),
        Err(error) => Err(error),
    };
    let fresh = churn.stop();
    let conflicts = node_write_conflicts(world);
    println!("fresh Nodes: {fresh:#?}\nNode writes that lost with 409: {}", conflicts.len());
    for line in &conflicts {
        println!("  {line}");
    }
    let nodes = settled?;
    ensure!(fresh.len() == 2, "two fresh Nodes registered: {fresh:#?}");
    for node in &fresh {
        let name = &node.name;
        // The premise: the Node changed under every write of its registration, from the
        // webhook's at creation to the slot controller's that lifts the startup taint once the
        // claim is ready. How many patches fit in that window is the machine's speed, not the
        // operator's behaviour.
        let lifted =
            node.untainted.with_context(|| format!("{name} never lost CA's startup taint"))?;
        ensure!(
            node.first_churn.is_some_and(|first| first < lifted),
            "{name} was not patched before its startup taint was lifted ({} patches): the churn \
             did not run under the operator's writes",
            node.churned
        );
        ensure!(
            node.last_churn.is_some_and(|last| last > lifted),
            "{name}'s churn ended before its startup taint was lifted ({} patches)",
            node.churned
        );
        let took = node.declared_after.with_context(|| format!("{name} never declared"))?;
        ensure!(
            took == Duration::ZERO,
            "{name} was created without its declaration, which came {took:?} later"
        );
        ensure!(
            node.tainted_when_declared,
            "{name} first carried the declaration without CA's startup taint: its claim was Ready first"
        );
        ensure!(!node.untainted_undeclared, "{name} lost the startup taint before its declaration");
    }
    let latencies: Vec<Duration> = fresh.iter().filter_map(|n| n.declared_after).collect();
    world.note(
        format!(
            "2 pods on {nodes:?}, 2 claims; fresh Nodes declared after {latencies:?}; {} Node write conflicts",
            conflicts.len()
        ),
        t,
    );
    Ok(())
}

/// The operator's log lines of a Node write that lost to a concurrent one (409 Conflict).
fn node_write_conflicts(world: &World) -> Vec<String> {
    let log = std::fs::read_to_string(world.logs_dir().join("operator-0.log")).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("for its slot") && (l.contains("409") || l.contains("Conflict")))
        .map(str::to_owned)
        .collect()
}

/// What the churn saw of one fresh pool Node.
#[derive(Debug, Clone)]
struct Fresh {
    name: String,
    /// The first watch event of the Node.
    seen: Instant,
    /// From the first watch event to the first that carries the slot's identity and declaration:
    /// zero when the first did.
    declared_after: Option<Duration>,
    /// Watch events observed.
    events: u32,
    /// The Node carried CA's startup taint at some point.
    tainted: bool,
    /// The first event that carried the declaration carried CA's startup taint too.
    tainted_when_declared: bool,
    /// An event showed the Node without the startup taint it had carried, and without the
    /// declaration: what cluster-autoscaler reads as a ready machine the pods cannot use.
    untainted_undeclared: bool,
    /// How long the Node showed Ready, without the startup taint and without the declaration,
    /// from the event that showed it so to the next that did not.
    exposed: Duration,
    exposed_since: Option<Instant>,
    /// The first event that showed the Node without the startup taint it had carried: the
    /// slot controller's write once the claim was ready, the last write of the registration.
    untainted: Option<Instant>,
    /// Merge patches the churn made, and when the first and the last of them were answered.
    churned: u32,
    first_churn: Option<Instant>,
    last_churn: Option<Instant>,
}

/// Patches each freshly registered pool Node every [`CHURN_EVERY`], from its first watch event
/// until the churn is stopped, with a merge patch that carries no resourceVersion (as a
/// kubelet's status updates and a CNI's annotations do), and records what each watch event
/// showed.
struct Churn {
    fresh: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Fresh>>>,
    task: tokio::task::JoinHandle<()>,
    stop: tokio_util::sync::CancellationToken,
}

const CHURN_EVERY: Duration = Duration::from_millis(200);

impl Churn {
    fn start(client: kube::Client) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let fresh = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let seen = fresh.clone();
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let nodes: Api<CoreNode> = Api::all(client.clone());
            let mut events =
                watcher(nodes.clone(), watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(node)) = events.next().await {
                let (Some(uid), Some(name)) =
                    (node.metadata.uid.clone(), node.metadata.name.clone())
                else {
                    continue;
                };
                if !REAL_MACHINE_SLOTS.contains(&name.as_str()) {
                    continue;
                }
                let Ok(mut fresh) = seen.lock() else { return };
                let new = !fresh.contains_key(&uid);
                let entry = fresh.entry(uid.clone()).or_insert_with(|| Fresh {
                    name: name.clone(),
                    seen: Instant::now(),
                    declared_after: None,
                    events: 0,
                    tainted: false,
                    tainted_when_declared: false,
                    untainted_undeclared: false,
                    exposed: Duration::ZERO,
                    exposed_since: None,
                    untainted: None,
                    churned: 0,
                    first_churn: None,
                    last_churn: None,
                });
                observe(entry, &node);
                drop(fresh);
                if new {
                    let churn = churn_node(nodes.clone(), name, uid, seen.clone());
                    tokio::spawn(stopped.clone().run_until_cancelled_owned(churn));
                }
            }
        });
        Self { fresh, task, stop }
    }

    /// Stops watching and patching; what was seen of each fresh Node.
    fn stop(self) -> Vec<Fresh> {
        self.stop.cancel();
        self.task.abort();
        self.fresh.lock().map(|f| f.values().cloned().collect()).unwrap_or_default()
    }
}

/// Records one watch event of a fresh Node.
fn observe(fresh: &mut Fresh, node: &CoreNode) {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let declared = labels.get(DECLARED_LABEL.0).map(String::as_str) == Some(DECLARED_LABEL.1)
        && labels.get(homelab_autoscaler::api::LABEL_GROUP).map(String::as_str) == Some(GROUP)
        && node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).is_some();
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == STARTUP_TAINT));
    if declared && fresh.declared_after.is_none() {
        let first = fresh.events == 0;
        fresh.declared_after = Some(if first { Duration::ZERO } else { fresh.seen.elapsed() });
        fresh.tainted_when_declared = tainted;
    }
    fresh.events += 1;
    if fresh.tainted && !tainted {
        fresh.untainted.get_or_insert_with(Instant::now);
        if !declared {
            fresh.untainted_undeclared = true;
        }
    }
    fresh.tainted |= tainted;
    let exposed = homelab_autoscaler::machine::is_ready(node) && !tainted && !declared;
    match (exposed, fresh.exposed_since) {
        (true, None) => fresh.exposed_since = Some(Instant::now()),
        (false, Some(since)) => {
            fresh.exposed += since.elapsed();
            fresh.exposed_since = None;
        }
        _ => {}
    }
}

/// Patches one fresh Node's annotation every [`CHURN_EVERY`] until it is cancelled.
async fn churn_node(
    nodes: Api<CoreNode>,
    name: String,
    uid: String,
    fresh: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Fresh>>>,
) {
    for n in 1u64.. {
        let patch =
            json!({ "metadata": { "annotations": { "homelab.test/churn": n.to_string() } } });
        let params = kube::api::PatchParams::default();
        let patched = nodes.patch(&name, &params, &kube::api::Patch::Merge(&patch)).await;
        if let (Ok(_), Ok(mut fresh)) = (patched, fresh.lock())
            && let Some(entry) = fresh.get_mut(&uid)
        {
            let now = Instant::now();
            entry.churned += 1;
            entry.first_churn.get_or_insert(now);
            entry.last_churn = Some(now);
        }
        tokio::time::sleep(CHURN_EVERY).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_machine_boots_only_for_gpu_work_and_is_upcoming_until_its_device_plugin_registers() {
    with_autoscaler(settings_with(&["--expander=price"]), async |world, ca| {
        autoscaler_boots_the_gpu_machine_only_for_gpu_work(world, ca).await
    })
    .await;
}

/// The label both pools' slots declare, which the workloads select (it keeps them off the lab).
const WORKERS_LABEL: (&str, &str) = ("homelab.test/pool", "workers");
/// How long after its kubelet the GPU machine's device plugin registers the GPU.
const DEVICE_PLUGIN_AFTER: &str = "40s";

/// Two groups at zero, as docs/operations.md sets a GPU box up: `desks` (two 4-CPU machines at
/// 0.02/h) and `gpus` (one 16-CPU machine with `nvidia.com/gpu: 1` at 0.12/h, its GPU type under
/// the GPULabel `accelerator`), scaled by the real cluster-autoscaler with its price expander.
/// No slot declares a pod rate: a pod costs its share of the machine (D41); at 0 the expander
/// scored every option alike and booted the GPU box for a CPU pod in one run of two.
/// A pod that asks no GPU boots a desk and never the GPU box; a pod that asks for the GPU boots
/// the GPU box and nothing else. The GPU box's Node registers without the GPU, which its device
/// plugin registers 40 s later: all that time cluster-autoscaler counts the machine as not
/// started (upcoming), never as unready, and boots nothing more for the pod.
async fn autoscaler_boots_the_gpu_machine_only_for_gpu_work(
    world: &mut World,
    ca: &Autoscaler,
) -> Result<()> {
    let t = Instant::now();
    homelab_harness::install::apply(&world.plane, &gpu_pools()).await?;
    world.note("groups desks (2 × 4 CPUs, 0.02/h) and gpus (16 CPUs and a GPU, 0.12/h) at zero", t);

    let t = Instant::now();
    homelab_harness::install::apply(&world.plane, &[worker_deployment("cpu-work", None)]).await?;
    let nodes = world.pods_running("cpu-work", 1, ACT).await?;
    world.quiet_loops(ca, 3).await?;
    ensure!(nodes == ["desk-1"] || nodes == ["desk-2"], "the CPU pod runs on {nodes:?}");
    ensure!(
        world.claims_seen("gpus").is_empty(),
        "the GPU box booted for CPU work:\n{}",
        describe(&world.claims_seen("gpus"))
    );
    world.note(
        format!("a pod without a GPU: cluster-autoscaler booted {nodes:?}, not the GPU box"),
        t,
    );

    let t = Instant::now();
    homelab_harness::install::apply(&world.plane, &[worker_deployment("gpu-work", Some("1"))])
        .await?;
    let nodes_api: Api<CoreNode> = Api::all(world.client.clone());
    let client = world.client.clone();
    // From the GPU box's registration until its device plugin registers the GPU, every reading
    // of CA's status counts it as not started; one that counts it ready or unready ends the
    // wait with that reading. The status is read before the Node: a GPU does not go once
    // allocatable, so a Node still without one means the status was made without one too.
    let seen_not_started = AtomicBool::new(false);
    let miscounted = eventually("the GPU box's device plugin to register", ACT, || async {
        let status = Autoscaler::status(&client).await?;
        let counts = status
            .group("gpus")
            .map(|g| g.health.node_counts.registered.clone())
            .unwrap_or_default();
        let node = nodes_api.get_opt("gpu-1").await?.context("gpu-1 has no Node yet")?;
        let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
        let has_gpu = allocatable.get("nvidia.com/gpu").is_some_and(|q| q.0 != "0");
        if !has_gpu && (counts.ready > 0 || counts.unready.total > 0) {
            return Ok(Some(format!("{counts:?}")));
        }
        if !has_gpu && counts.not_started == 1 {
            seen_not_started.store(true, Ordering::Relaxed);
        }
        ensure!(has_gpu, "no GPU allocatable on gpu-1 yet; CA's status for gpus: {counts:?}");
        Ok(None)
    })
    .await?;
    if let Some(counts) = miscounted {
        anyhow::bail!("before its GPU registered, CA counted the GPU box as started: {counts}");
    }
    ensure!(
        seen_not_started.into_inner(),
        "CA's status never counted the GPU box before its GPU registered"
    );
    let nodes = world.pods_running("gpu-work", 1, ACT).await?;
    ensure!(nodes == ["gpu-1"], "the GPU pod runs on {nodes:?}");
    world.quiet_loops(ca, 5).await?;
    let gpu_claims = world.claims_made_by_increase_size("gpus", 1)?;
    ensure!(gpu_claims[0].spec.slot_ref.name == "gpu-1", "{}", describe(&gpu_claims));
    world.claims_made_by_increase_size("desks", 1)?;
    autoscaler_unharmed(world, ca, 0).await?;
    world.note(
        format!(
            "the GPU pod: the GPU box booted, not started to CA for the {DEVICE_PLUGIN_AFTER} its \
             device plugin took, the pod on {nodes:?}, one claim per pool"
        ),
        t,
    );
    Ok(())
}

/// The two pools, as JSON for kubectl.
fn gpu_pools() -> Vec<serde_json::Value> {
    let lab = json!({ "image": "busybox:1.36", "nodeSelector": { "homelab.demo/role": "lab" } });
    let group = |name: &str| {
        json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
            "metadata": { "name": name, "namespace": NAMESPACE },
            "spec": { "driver": "cluster-autoscaler", "nodeReadinessTaints": [] },
        })
    };
    let slot = |name: &str,
                group: &str,
                rate: f64,
                capacity: serde_json::Value,
                labels: serde_json::Value| {
        json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
            "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "group": group } },
            "spec": {
                "kubernetesNodeName": name,
                "pricing": { "hourlyRate": rate },
                "nodeLabels": labels,
                "nodeCapacity": capacity,
                "startupPodSpec": lab,
                "shutdownPodSpec": lab,
            },
        })
    };
    let desk = json!({ "cpu": "4", "memory": "16Gi", "pods": "110" });
    let workers = json!({ WORKERS_LABEL.0: WORKERS_LABEL.1 });
    let mut gpu_box = slot(
        "gpu-1",
        "gpus",
        0.12,
        json!({ "cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "1" }),
        json!({ WORKERS_LABEL.0: WORKERS_LABEL.1, "accelerator": "rtx-3060" }),
    );
    gpu_box["metadata"]["annotations"] = json!({ homelab_autoscaler::simulator::DEVICE_PLUGIN_AFTER_ANNOTATION: DEVICE_PLUGIN_AFTER });
    vec![
        group("desks"),
        group("gpus"),
        slot("desk-1", "desks", 0.02, desk.clone(), workers.clone()),
        slot("desk-2", "desks", 0.02, desk, workers),
        gpu_box,
    ]
}

/// A one-replica Deployment on the workers' machines, asking for `gpus` of `nvidia.com/gpu`.
fn worker_deployment(name: &str, gpus: Option<&str>) -> serde_json::Value {
    let mut resources = json!({ "requests": { "cpu": "1" } });
    if let Some(gpus) = gpus {
        resources["limits"] = json!({ "nvidia.com/gpu": gpus });
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "nodeSelector": { WORKERS_LABEL.0: WORKERS_LABEL.1 },
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{ "name": "app", "image": "nginx:1.27", "resources": resources }],
                },
            },
        },
    })
}
