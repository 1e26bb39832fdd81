//! The real cluster-autoscaler drives the pool end to end: the operator binary (webhooks,
//! controllers, the externalgrpc provider over mutual TLS), the machine simulator and
//! cluster-autoscaler 1.36.1 as processes, each scenario on a control plane of its own.

use homelab_harness::e2e::{Autoscaler, AutoscalerSettings, World, operator_binary};

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
