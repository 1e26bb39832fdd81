//! `make demo`: a local pool of simulated machines scaling up and down, narrated.
//!
//! It builds (once) and starts a real control plane from upstream Go modules, runs the operator
//! binary and the machine simulator against it, applies examples/pool.yaml, starts a workload
//! that needs the pool, prints every claim as it changes, scales the workload away, and ends with
//! a summary of each step and its duration. Everything it started stops when it exits.

use homelab_harness::e2e;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let bin = e2e::operator_binary(std::env::args().nth(1).as_deref())?;
    println!("homelab-autoscaler demo: a pool of three machines, scaled by demand\n");
    let mut world = e2e::World::start(&bin, true).await?;
    let outcome = world.builtin_scale_up_and_down(3).await;
    println!("{}", world.summary());
    if let Err(error) = &outcome {
        eprintln!("the demo did not go as expected: {error:#}\n{}", world.plane.log_tails(20));
    }
    outcome
}
