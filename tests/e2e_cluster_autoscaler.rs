//! The real cluster-autoscaler drives the pool end to end: the operator binary (webhooks,
//! controllers, the externalgrpc provider over mutual TLS), the machine simulator and
//! cluster-autoscaler 1.36.1 as processes against a real control plane.

mod e2e;
mod support;

use e2e::{AutoscalerSettings, World};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_scales_the_pool_up_and_down_without_a_double_boot() {
    let bin = e2e::operator_binary(None).expect("operator binary");
    let mut world = World::start_for_autoscaler(&bin, false).await.expect("world");
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    let outcome = world.autoscaler_scale_up_and_down(&ca, 3).await;
    if let Err(error) = &outcome {
        panic!(
            "{error:#}\n--- cluster-autoscaler ---\n{}\n--- operator ---\n{}",
            ca.log_tail(60),
            world
                .operator_log(0)
                .lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
