//! Crash injection: the operator's controllers are killed (their task aborted mid-reconcile,
//! as a SIGKILL leaves the cluster) at seeded random moments during boots, readiness gates,
//! drains, shutdowns, cancellations and claim deletions, and restarted with fresh caches after
//! a seeded random downtime. After each run the invariants of `homelab_harness::invariants`
//! must hold: every claim ended within its bounds, no Job left running or fired twice, no
//! machine on without a wanted claim, no claim stuck Terminating, never two booting claims on
//! a slot, no cluster-autoscaler mark left behind.
//!
//! Each run has a namespace of its own on the binary's shared control plane; runs go
//! `HOMELAB_CRASH_PARALLEL` (default 5) at a time. `HOMELAB_CRASH_RUNS` (default 50) sets
//! the number of runs and `HOMELAB_CRASH_SEED` the base seed (default: from the clock,
//! printed); a failure prints the run's seed, and `HOMELAB_CRASH_SEED=<seed>
//! HOMELAB_CRASH_RUNS=1` replays its schedule. The long run is in docs/reliability.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{ClaimCall, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::claim::Timeouts;
use homelab_harness::claims::{phase, provider_claim_for};
use homelab_harness::eventually;
use homelab_harness::invariants::{self, Bounds, Ledger};
use homelab_harness::lab::{self, Lab, With};
use homelab_harness::seeded::{Rng, clock_seed, env_number};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long a scale-down may take to end its claims: the lab's 5 s drain and 10 s shutdown Job,
/// the machine seen off, a crash in it, on a loaded machine.
const ACT: Duration = Duration::from_secs(90);

/// The boot's crashes: each falls within this long of the previous step (ms)...
const BOOT_CRASH_WITHIN_MS: u64 = 3000;
/// ...and keeps the controllers down at most this long (ms)...
const BOOT_DOWN_MS: u64 = 1500;
/// ...one of them, or two a fifth of the time.
const BOOT_CRASHES_MAX: u32 = 2;
/// How long killed controllers take to be back at work on the loaded two-core machine: started
/// (the run's log times this: under 1 s at load average 11–13), their fresh caches listed from
/// the apiserver the parallel runs share, each claim reconciled once. At that load a whole boot
/// with two crashes was ready within 7 s of its claim.
const RESTART_ON_LOAD: Duration = Duration::from_secs(5);
/// How long the invariants may take to hold once every claim is gone: the last Jobs finish and
/// the machines are seen off.
const SETTLE: Duration = Duration::from_secs(60);

/// The lab's timeouts with the boot's outages added to the deadline: the deadline runs from the
/// claim's creation, so every second the controllers are down is spent from it, while the phase
/// windows are read from the Job's and the Node's own timestamps by whichever controller comes
/// back, and need nothing more. A boot that a crash leaves stuck (a lost Job, a missed event)
/// still misses this deadline: 59 s, where one with two crashes took 7 s at load average 12.
fn crash_timeouts() -> Timeouts {
    let outage = (Duration::from_millis(BOOT_DOWN_MS) + RESTART_ON_LOAD) * BOOT_CRASHES_MAX;
    let lab = lab::timeouts();
    Timeouts { margin: lab.margin + outage, ..lab }
}

/// How long a test waits for a boot: its deadline, and a reconcile pass to report the end.
fn boot_wait() -> Duration {
    crash_timeouts().budget() + lab::LOADED_MARGIN
}

/// A claim as the provider creates it (stamped, owned by its slot), or as a person pins the
/// machine (`manual`).
async fn claim(lab: &Lab, name: &str, slot: &str, manual: bool) -> Result<()> {
    let mut claim =
        provider_claim_for(name, slot, &lab.slots(), &lab.groups(), lab.timeouts, "crash-suite")
            .await?;
    if manual {
        claim.spec.request.call = ClaimCall::Manual;
    }
    lab.claims().create(&PostParams::default(), &claim).await?;
    Ok(())
}

/// Marks a claim for scale-down and deletes it, as DeleteNodes does.
async fn scale_down(lab: &Lab, name: &str) -> Result<()> {
    let patch = json!({ "status": { "scaleDownRequestedAt": Time(jiff::Timestamp::now()), "scaleDownRequestedBy": "crash-suite" } });
    lab.claims().patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    lab.claims().delete(name, &DeleteParams::default()).await?;
    Ok(())
}

async fn claim_ends(lab: &Lab, name: &str, what: &str, done: fn(&NodeClaim) -> bool) -> Result<()> {
    let claims = lab.claims();
    eventually(&format!("claim {name}: {what}"), boot_wait(), || async {
        let claim = claims.get(name).await?;
        ensure!(done(&claim), "not yet: {:?}", claim.status);
        Ok(())
    })
    .await
}

async fn claim_gone(lab: &Lab, name: &str) -> Result<()> {
    let claims = lab.claims();
    eventually(&format!("claim {name} gone"), ACT, || async {
        ensure!(claims.get_opt(name).await?.is_none(), "still there");
        Ok(())
    })
    .await
}

/// Kills the controllers after `after`, keeps them down for `down`, starts them again.
async fn crash(
    lab: &Lab,
    after: Duration,
    down: Duration,
    log: &mut Vec<String>,
    started: Instant,
) {
    tokio::time::sleep(after).await;
    lab.kill_controllers();
    let at = match lab.claims().get_opt("c0").await {
        Ok(Some(c)) if c.metadata.deletion_timestamp.is_some() => {
            format!("{:?}, deleting", phase(&c))
        }
        Ok(Some(c)) => format!("{:?}", phase(&c)),
        Ok(None) => "gone".into(),
        Err(error) => format!("unknown ({error})"),
    };
    log.push(format!(
        "killed at {:.2}s with c0 {at}, down {:.2}s",
        started.elapsed().as_secs_f64(),
        down.as_secs_f64()
    ));
    tokio::time::sleep(down).await;
    let restarting = Instant::now();
    lab.start_controllers().await;
    log.push(format!("restarted in {:.2}s", restarting.elapsed().as_secs_f64()));
}

/// One seeded run: a boot (and sometimes a second one, or a cancelled one) with a crash in
/// it, a scale-down with a crash in it, then the invariants.
async fn run(index: u64, seed: u64) -> Result<Vec<String>> {
    let mut rng = Rng::new(seed);
    let lab =
        Lab::start_with_timeouts(&format!("crash{index}"), With::Controllers, crash_timeouts())
            .await;
    let ledger = Ledger::start(&lab.client, &lab.ns).await?;
    let slots = lab.create_pool(2).await?;
    let started = Instant::now();
    let mut log = Vec::new();

    // Boot: one claim, a second one on the other slot half the time (a Manual one a quarter
    // of the time, for the scale-down-disabled mark), and one crash (two, a fifth of the time)
    // within the first three seconds each: Job creation, boot commit, registration, the gate.
    let manual = rng.chance(25);
    claim(&lab, "c0", &slots[0], manual).await?;
    let second = rng.chance(50);
    if second {
        claim(&lab, "c1", &slots[1], false).await?;
    }
    let crashes = if rng.chance(20) { BOOT_CRASHES_MAX } else { 1 };
    for _ in 0..crashes {
        let (after, down) = (rng.millis(BOOT_CRASH_WITHIN_MS), rng.millis(BOOT_DOWN_MS));
        crash(&lab, after, down, &mut log, started).await;
    }
    claim_ends(&lab, "c0", "ready", |c| phase(c) == NodeClaimPhase::Ready).await?;
    log.push(format!("c0 ready at {:.2}s", started.elapsed().as_secs_f64()));
    if second {
        claim_ends(&lab, "c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await?;
    }

    // A claim cancelled while pending, a third of the time: deleted at once, unmarked.
    if rng.chance(33) && !second {
        claim(&lab, "c2", &slots[1], false).await?;
        let cancel_after = rng.millis(300);
        tokio::time::sleep(cancel_after).await;
        lab.claims().delete("c2", &DeleteParams::default()).await?;
        let (after, down) = (rng.millis(1500), rng.millis(1000));
        crash(&lab, after, down, &mut log, started).await;
        claim_gone(&lab, "c2").await?;
    }

    // Scale-down: drain and shutdown of every claim, with a crash in it.
    scale_down(&lab, "c0").await?;
    if second {
        scale_down(&lab, "c1").await?;
    }
    let (after, down) = (rng.millis(1500), rng.millis(1500));
    crash(&lab, after, down, &mut log, started).await;
    claim_gone(&lab, "c0").await?;
    if second {
        claim_gone(&lab, "c1").await?;
    }

    invariants::until_settled(&lab.client, &lab.ns, Bounds::default(), SETTLE)
        .await
        .with_context(|| format!("schedule: {log:?}"))?;
    let violations = ledger.violations();
    ensure!(violations.is_empty(), "{} (schedule: {log:?})", violations.join("; "));
    log.push(format!("settled in {:.1}s", started.elapsed().as_secs_f64()));
    drop(lab);
    Ok(log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invariants_hold_through_seeded_crashes() {
    let runs = env_number("HOMELAB_CRASH_RUNS", 50);
    let parallel = env_number("HOMELAB_CRASH_PARALLEL", 5).max(1) as usize;
    let base = env_number("HOMELAB_CRASH_SEED", clock_seed());
    eprintln!("crash suite: {runs} runs, {parallel} at a time, HOMELAB_CRASH_SEED={base}");
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut tasks = Vec::new();
    for index in 0..runs {
        // Run 0 replays the base seed itself, so HOMELAB_CRASH_RUNS=1 reproduces a failure.
        let seed = if index == 0 { base } else { Rng::new(base ^ index).next_u64() };
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore");
            (index, seed, run(index, seed).await)
        }));
    }
    let mut failures = Vec::new();
    for task in tasks {
        let (index, seed, outcome) = task.await.expect("run task");
        match outcome {
            Ok(log) => eprintln!("run {index} (seed {seed}): {log:?}"),
            Err(error) => {
                eprintln!(
                    "run {index} FAILED (reproduce: HOMELAB_CRASH_SEED={seed} HOMELAB_CRASH_RUNS=1): {error:#}"
                );
                failures.push(format!("run {index}, HOMELAB_CRASH_SEED={seed}: {error:#}"));
            }
        }
    }
    eprintln!("crash suite: {runs} runs in {:.1}s", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The checker can fail: with the controllers dead, two claims forced to Booting on one slot
/// and a claim held Terminating by a finalizer are reported, by the ledger and by `settled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invariant_checker_reports_what_it_must() {
    let lab = Lab::start("crash-control", With::Controllers).await;
    lab.kill_controllers();
    let ledger = Ledger::start(&lab.client, &lab.ns).await.expect("ledger");
    let slots = lab.create_pool(1).await.expect("pool");
    for name in ["twin-a", "twin-b"] {
        claim(&lab, name, &slots[0], false).await.expect("claim");
        let booting = json!({ "status": { "phase": "booting", "attempt": 1 } });
        lab.claims()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&booting))
            .await
            .expect("force booting");
    }
    let hold = json!({ "metadata": { "finalizers": ["test.homecluster.dev/hold"] } });
    lab.claims()
        .patch("twin-a", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold");
    lab.claims().delete("twin-a", &DeleteParams::default()).await.expect("delete");

    let strict = Bounds { terminating: Duration::ZERO, ..Bounds::default() };
    let found = eventually("the checker to see both faults", ACT, || async {
        let found = invariants::settled(&lab.client, &lab.ns, strict).await?;
        ensure!(found.iter().any(|f| f.contains("stuck Terminating")), "{found:?}");
        Ok(found)
    })
    .await
    .expect("settled reports");
    assert!(found.iter().any(|f| f.contains("stuck Terminating")), "{found:?}");
    let seen = ledger.violations();
    assert!(seen.iter().any(|v| v.contains("two booting claims")), "{seen:?}");

    // Let the held claim go so the namespace can be cleaned up.
    let release = json!({ "metadata": { "finalizers": null } });
    lab.claims()
        .patch("twin-a", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release");
}
