//! Pending pod → Running for one real machine booted cold and woken from sleep, side by side,
//! round after round, on the real-machine tier (homelab_harness::machine: a real kubelet and
//! containerd in a network namespace each, woken by Wake-on-LAN, put to sleep and shut down over
//! SSH by the operator's power Jobs, which run the operator's image on the lab machine).
//!
//! A round, on the demo's pool (examples/pool.yaml) with every slot sleeping when idle: every
//! machine off, one pod boots a machine cold; the pod goes and the machine sleeps, its Node
//! kept; the next pod wakes it (`World::cold_boot_sleep_and_wake`). Between rounds the slots stop
//! sleeping, the pod goes, the machine is powered off and its Node removed, and the slots sleep
//! again (`World::power_off_sleeping_pool`). Every step comes from watches in this process
//! (the World's timeline), as the demo splits a scale-up.
//!
//! Needs root (network namespaces, cgroups, mounts).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result};
use homelab_harness::e2e::{MachineSteps, Machines, ScaleUpBreakdown, SideBySide, World};

use crate::stats::Samples;

/// The goal: a resumed machine's pod Running in under a fifth of its cold boot's time.
const GOAL_RATIO: f64 = 0.2;

/// One scale-up's steps, pooled over rounds.
#[derive(Default)]
pub struct Steps {
    decided: Samples,
    claim_to_job: Samples,
    job: Samples,
    machine: Samples,
    to_usable: Samples,
    gate: Samples,
    operator: Samples,
    to_running: Samples,
    total: Samples,
}

impl Steps {
    fn push(&mut self, split: &ScaleUpBreakdown) -> Result<()> {
        let [m]: &[MachineSteps; 1] =
            split.machines.as_slice().try_into().with_context(|| {
                format!("one machine per scale-up, found {}", split.machines.len())
            })?;
        self.decided.push(m.decided + m.provider.unwrap_or_default());
        self.claim_to_job.push(m.claim_to_job);
        self.job.push(m.job);
        self.machine.push(m.boot);
        self.to_usable.push(m.registered_to_usable);
        self.gate.push(m.gate);
        self.operator.push(m.operator());
        self.to_running.push(split.ready_to_running);
        self.total.push(split.total);
        Ok(())
    }
}

/// Both scale-ups of every round, and the machines they ran on.
#[derive(Default)]
pub struct Measured {
    pub cold: Steps,
    pub resumed: Steps,
    machines: BTreeSet<String>,
}

/// `rounds` rounds on a World of its own on the shared control plane, with operator binary `bin`.
pub async fn run(bin: &Path, rounds: usize) -> Result<Measured> {
    let mut world = World::start_on_machines(bin, false, Machines::Real)
        .await
        .context("the resume section plays on real machines (root); SECTIONS leaves it out")?;
    let result = rounds_on(&mut world, rounds).await;
    result.with_context(|| {
        format!("operator log:\n{}\n{}", world.operator_log_tail(0, 40), world.plane.log_tails(20))
    })
}

async fn rounds_on(world: &mut World, rounds: usize) -> Result<Measured> {
    world.sleeping_pool().await?;
    let mut out = Measured::default();
    for round in 1..=rounds {
        let started = Instant::now();
        if round > 1 {
            world.power_off_sleeping_pool().await?;
        }
        let SideBySide { machine, cold, resumed } =
            world.cold_boot_sleep_and_wake().await.with_context(|| format!("round {round}"))?;
        out.cold.push(&cold)?;
        out.resumed.push(&resumed)?;
        out.machines.insert(machine.clone());
        eprintln!(
            "resume round {round}/{rounds} on {machine}: cold {:.1}s, resumed {:.1}s ({:.0}s)",
            cold.total.as_secs_f64(),
            resumed.total.as_secs_f64(),
            started.elapsed().as_secs_f64(),
        );
    }
    Ok(out)
}

/// The report: per step, the median and the range over rounds of each scale-up, then the
/// ratio the goal is about.
pub fn lines(m: &Measured) -> Vec<String> {
    let cell = |s: &Samples| {
        format!(
            "{:>6} [{}–{}]",
            s.quantile(0.5).as_millis(),
            s.quantile(0.0).as_millis(),
            s.quantile(1.0).as_millis()
        )
    };
    type Step = fn(&Steps) -> &Samples;
    let rows: [(&str, Step); 9] = [
        ("pod created → claim (the built-in scaler)", |s| &s.decided),
        ("claim → startup Job seen (operator: claim controller)", |s| &s.claim_to_job),
        ("startup Job → complete (its pod, the magic packet)", |s| &s.job),
        ("Job complete → Node registered (boot) or Ready (resume)", |s| &s.machine),
        ("registered → Ready, untainted (kubelet, network)", |s| &s.to_usable),
        ("usable → claim ready (operator: readiness gate)", |s| &s.gate),
        ("operator's own share", |s| &s.operator),
        ("claim ready → pod Running (scheduler, kubelet)", |s| &s.to_running),
        ("pod pending → Running", |s| &s.total),
    ];
    let machines: Vec<&str> = m.machines.iter().map(String::as_str).collect();
    let mut out = vec![
        format!(
            "{} rounds on {}; ms, median [min–max] over rounds",
            m.cold.total.len(),
            machines.join(", ")
        ),
        format!("{:<58}{:>22}{:>22}", "step", "cold", "resumed"),
    ];
    for (name, step) in rows {
        out.push(format!("{name:<58}{:>22}{:>22}", cell(step(&m.cold)), cell(step(&m.resumed))));
    }
    let (resumed, cold) = (m.resumed.total.quantile(0.5), m.cold.total.quantile(0.5));
    let ratio = crate::stats::ratio(resumed, cold);
    let verdict = if ratio < GOAL_RATIO { "met" } else { "missed" };
    out.push(format!(
        "resumed / cold, pod pending → Running at the median: {ratio:.2} (goal under \
         {GOAL_RATIO}: {verdict} on this tier, whose machines boot without firmware or OS)"
    ));
    out.push(format!(
        "with a resume this fast (a real one adds its firmware's wake and its link coming up), \
         the goal holds for a cold boot that takes a pod to Running in over {:.1}s",
        resumed.as_secs_f64() / GOAL_RATIO
    ));
    out
}
