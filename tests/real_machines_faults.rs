//! A seeded fault run on real machines (homelab_harness::fault_run): the operator binary with
//! its built-in scaler drives `examples/pool.yaml`'s three slots, each a real machine (a kubelet
//! and containerd in a network namespace, Wake-on-LAN on, an SSH shutdown off, the power Jobs
//! real pods of the operator's image on a lab machine). Demand steps and faults (cables pulled,
//! power cut, the operator SIGKILLed, kube-apiserver restarted, containerd stopped) come at
//! random moments from a seed; the invariants of a safe power-off are watched throughout, and
//! the pool must converge to the demand once the faults stop.
//!
//! `HOMELAB_FAULT_SEED` (default: a fixed seed whose schedule holds every kind of fault) and
//! `HOMELAB_FAULT_MINUTES` (default 4) size the run; `make soak SEED=… MINUTES=…` runs a long
//! one and prints what it did and every invariant's count. A failing seed replays its schedule.
//! tests/real_machines_faults_autoscaler.rs runs the same under the real cluster-autoscaler.
//!
//! The faults restart this binary's control plane, so its one World runs alone in it.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).

use std::time::Duration;

use homelab_harness::e2e::{Machines, World, operator_binary};
use homelab_harness::fault_run::{self, SHORT_RUN_MINUTES, SHORT_RUN_SEED, Schedule};

#[test]
fn the_short_runs_schedule_holds_every_kind_of_step_and_replays() {
    let length = Duration::from_secs(SHORT_RUN_MINUTES * 60);
    let schedule = Schedule::new(SHORT_RUN_SEED, length, 3);
    let kinds = schedule.kinds();
    assert_eq!(kinds.len(), 6, "{kinds:?}: {:#?}", schedule.steps);
    let again = Schedule::new(SHORT_RUN_SEED, length, 3);
    assert_eq!(schedule.steps, again.steps, "a seed replays its schedule");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_fault_run_keeps_every_invariant_and_converges() {
    let bin = operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("binary");
    let mut world = World::start_on_machines(&bin, false, Machines::Real).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    fault_run::run_example_pool(&mut world, "pool.yaml", "workers").await;
}
