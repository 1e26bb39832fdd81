//! The operator binary SIGKILLed at seeded random moments of a boot and of a shutdown, and
//! started again in place (same ports, same POD_NAME, so the same Lease identity, as a pod's
//! restarted container). Each run: a machine started by hand, a kill in its first 3 s, ready;
//! the claim deleted, a kill in the first 1.5 s of the drain and shutdown, gone. The invariants
//! of `homelab_harness::invariants` hold over the operator's namespace after every run.
//!
//! `HOMELAB_SIGKILL_RUNS` (default 4) and `HOMELAB_SIGKILL_SEED` (default: the clock, printed)
//! set the size and the schedule; a failure names the seed.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use homelab_autoscaler::api::{NodeClaim, NodeClaimPhase};
use homelab_harness::e2e::{self, NAMESPACE, World};
use homelab_harness::eventually;
use homelab_harness::invariants::{self, Bounds, Ledger};
use homelab_harness::seeded::{Rng, clock_seed, env_number};
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::Api;

const ACT: Duration = Duration::from_secs(120);

async fn kill_and_restart(world: &mut World, after: Duration, log: &mut Vec<String>) -> Result<()> {
    tokio::time::sleep(after).await;
    let started = Instant::now();
    world.restart_replica(0).await?;
    log.push(format!(
        "SIGKILL after {:.2}s, ready again in {:.1}s",
        after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

async fn run(world: &mut World, seed: &mut Rng, log: &mut Vec<String>) -> Result<()> {
    let claims: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let name = world.create_manual_claim().await?;
    let after = seed.millis(3000);
    kill_and_restart(world, after, log).await?;
    eventually(&format!("{name} ready"), ACT, || async {
        let claim = claims.get(&name).await?;
        let phase = claim.status.as_ref().and_then(|s| s.phase);
        ensure!(phase == Some(NodeClaimPhase::Ready), "{phase:?}");
        Ok(())
    })
    .await?;
    claims.delete(&name, &Default::default()).await?;
    let after = seed.millis(1500);
    kill_and_restart(world, after, log).await?;
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    eventually(&format!("{name} gone and its machine off"), ACT, || async {
        let gone = claims.get_opt(&name).await?.is_none();
        let up = nodes.get_opt("mini-1").await?.is_some();
        ensure!(gone && !up, "claim gone: {gone}, machine up: {up}");
        Ok(())
    })
    .await?;
    invariants::until_settled(&world.client, NAMESPACE, Bounds::default(), ACT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invariants_hold_when_the_operator_binary_is_sigkilled() {
    let runs = env_number("HOMELAB_SIGKILL_RUNS", 4);
    let base = env_number("HOMELAB_SIGKILL_SEED", clock_seed());
    eprintln!("sigkill suite: {runs} runs, HOMELAB_SIGKILL_SEED={base}");
    homelab_autoscaler::tls::install_crypto_provider();
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("bin");
    let mut world = World::start_with_shared_certificate(&bin).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let ledger = Ledger::start(&world.client, NAMESPACE).await.expect("ledger");
    world.apply_example("pool.yaml").await.expect("apply examples/pool.yaml");

    let started = Instant::now();
    let mut seed = Rng::new(base);
    for index in 0..runs {
        let mut log = Vec::new();
        let outcome = run(&mut world, &mut seed, &mut log).await;
        eprintln!("run {index}: {log:?}");
        if let Err(error) = outcome {
            panic!(
                "run {index} failed (HOMELAB_SIGKILL_SEED={base}): {error:#}\noperator log:\n{}",
                world.operator_log_tail(0, 60)
            );
        }
        let violations = ledger.violations();
        assert!(violations.is_empty(), "run {index} (HOMELAB_SIGKILL_SEED={base}): {violations:?}");
    }
    eprintln!("sigkill suite: {runs} runs in {:.1}s", started.elapsed().as_secs_f64());
}
