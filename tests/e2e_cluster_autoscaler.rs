//! The real cluster-autoscaler drives the pool end to end: the operator binary (webhooks,
//! controllers, the externalgrpc provider over mutual TLS), the machine simulator and
//! cluster-autoscaler 1.36.1 as processes, each scenario on a control plane of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use homelab_harness::e2e::{
    Autoscaler, AutoscalerSettings, REAL_MACHINE_SLOTS, World, operator_binary,
};
use homelab_harness::{Components, ControlPlane};

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
        world.autoscaler_backs_off_a_machine_that_never_boots(ca).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_no_second_machine_while_registration_is_slow() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_waits_for_slow_registration(ca, "30s").await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_from_zero_the_group_whose_template_fits() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_scales_from_zero_by_template(ca).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_scale_up_loses_and_doubles_nothing() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_restarts_mid_scale_up(ca).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_started_by_hand_stays_on_past_the_unneeded_time() {
    let settings = AutoscalerSettings::default();
    let unneeded = settings.scale_down_unneeded;
    with_autoscaler(settings, async move |world, ca| {
        world.autoscaler_leaves_a_manual_machine_on(ca, unneeded).await
    })
    .await;
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
    use anyhow::{Context, ensure};
    use homelab_autoscaler::api::{ClaimCall, NodeClaimPhase};
    use homelab_harness::e2e::{NAMESPACE, Workload};
    use homelab_harness::{eventually, stays};

    const ACT: Duration = Duration::from_secs(150);
    let live = |c: &homelab_autoscaler::api::NodeClaim| {
        homelab_autoscaler::phase::is_live(Some(homelab_autoscaler::phase::of(c)))
    };
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
        let phase = homelab_autoscaler::phase::of(claim);
        ensure!(phase == NodeClaimPhase::Ready, "pin {pin} is {phase:?}");
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
    if let Err(error) = world.autoscaler_over_machines_already_off(&mut ca, &settings).await {
        let ca_log = ca.as_ref().map(|ca| ca.log_tail(80)).unwrap_or_default();
        panic!(
            "{error:#}\n--- cluster-autoscaler ---\n{ca_log}\n--- operator ---\n{}",
            world.operator_log_tail(0, 60)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_boot_of_the_same_machine_is_upcoming_again() {
    let startup = Duration::from_secs(45);
    let flag = format!("--max-node-startup-time={}s", startup.as_secs());
    with_autoscaler(settings_with(&[&flag]), async move |world, ca| {
        world.autoscaler_second_boot_of_the_same_machine(ca, startup).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3s_provider_ids_need_no_configuration() {
    let provision = Duration::from_secs(30);
    let flag = format!("--max-node-provision-time={}s", provision.as_secs());
    with_autoscaler(settings_with(&[&flag]), async move |world, ca| {
        world.autoscaler_on_k3s_provider_ids(ca, provision).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_machines_are_off_deletes_nothing() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_restarted_while_machines_are_off(ca).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_pod_of_a_machine_gone_is_recreated_elsewhere() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_replaces_a_statefulset_pod_of_a_machine_gone(ca).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_labels_come_back_at_every_boot() {
    with_autoscaler(AutoscalerSettings::default(), async |world, ca| {
        world.autoscaler_declared_labels_come_back(ca).await
    })
    .await;
}
