//! The seeded fault run of tests/real_machines_faults.rs under the real cluster-autoscaler: the
//! operator binary serves its externalgrpc provider over mutual TLS to cluster-autoscaler, both
//! processes on a control plane of their own, and `examples/pool-cluster-autoscaler.yaml`'s
//! three slots are real machines. The same seeded steps (demand, cables pulled, a power cut, the
//! operator SIGKILLed, kube-apiserver restarted, containerd stopped), the same invariants
//! watched throughout, and the same convergence once the faults stop, now with
//! cluster-autoscaler's scale-up and scale-down deciding. `HOMELAB_FAULT_SEED` and
//! `HOMELAB_FAULT_MINUTES` size it (`make soak DRIVER=cluster-autoscaler`).
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).

use homelab_harness::e2e::{AutoscalerSettings, Machines, World, operator_binary};
use homelab_harness::fault_run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_fault_run_under_cluster_autoscaler_keeps_every_invariant_and_converges() {
    let bin = operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("binary");
    let mut world =
        World::start_for_autoscaler_with(&bin, false, Machines::Real).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    world.keep_alongside(ca);
    fault_run::run_example_pool(&mut world, "pool-cluster-autoscaler.yaml", "workers").await;
}
