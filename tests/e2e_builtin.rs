//! End to end with the built-in scaler and no cluster-autoscaler: the real operator binary and
//! the machine simulator against a real control plane (docs/decisions.md, D8).

use homelab_harness::e2e;

/// Two pods that only the pool can run, each worth one machine (`podsPerNode: 1`): exactly two
/// claims, and still two after two more passes of the scaler. The pool has three slots, so a
/// claim too many would find a free machine and show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_scales_the_pool_up_and_back_to_zero() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let mut world = e2e::World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = world.builtin_scale_up_and_down(2).await;
    eprintln!("{}", world.summary());
    outcome.expect("the scenario");
}
