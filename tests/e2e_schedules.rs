//! A Group's schedule end to end, with the real operator binary and the machine simulator: a
//! window that opens seconds from now holds a machine of the pool with a `Schedule` claim, and
//! when it closes the claim ends `Expired` and the machine goes off. Once with the built-in
//! scaler (the cheapest slot), once with the real cluster-autoscaler (a named slot), which must
//! leave the scheduled machine on while the window is open (docs/decisions.md, D22).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{ClaimCall, Group, NodeClaim, NodeClaimPhase};
use homelab_harness::e2e::autoscaler::{LOOP_ON_LOAD, SCAN_INTERVAL};
use homelab_harness::e2e::{self, AutoscalerSettings, NAMESPACE, World};
use homelab_harness::eventually;
use kube::api::{Api, ListParams};

/// Long enough for a simulated boot, the readiness gate, a drain and a shutdown Job.
const ACT: Duration = Duration::from_secs(150);
/// How long after it is written a window opens: the Group's `kubectl apply` must land before
/// it, and takes seconds on the loaded two-core machine.
const OPENS_IN: Duration = Duration::from_secs(15);
/// How long a window must stay open for its machine to boot to Ready and the checks made while
/// it is open, on the loaded machine: the Schedule claim, the Job, the simulated boot and gate
/// (2 s each), the writes between them. Idle, it takes about 10 s.
const BOOT_ON_LOAD: Duration = Duration::from_secs(60);

/// A window on today's (UTC) weekday that opens `opens_in` from now and stays open `open_for`;
/// its opening and closing instants.
struct Window {
    days: String,
    from: String,
    to: String,
    opens: jiff::Timestamp,
    closes: jiff::Timestamp,
}

fn window(opens_in: Duration, open_for: Duration) -> Result<Window> {
    let now = jiff::Timestamp::now();
    // Whole seconds, as the window is written.
    let opens = jiff::Timestamp::from_second(
        now.checked_add(jiff::SignedDuration::try_from(opens_in)?)?.as_second(),
    )?;
    let closes = opens.checked_add(jiff::SignedDuration::try_from(open_for)?)?;
    let local = |t: jiff::Timestamp| t.to_zoned(jiff::tz::TimeZone::UTC);
    Ok(Window {
        // The opening belongs to the day it starts, even if it runs over midnight.
        days: local(opens).strftime("%a").to_string(),
        from: local(opens).strftime("%H:%M:%S").to_string(),
        to: local(closes).strftime("%H:%M:%S").to_string(),
        opens,
        closes,
    })
}

/// Applies `manifest` with kubectl, as a user would.
async fn apply(world: &World, manifest: &str) -> Result<()> {
    let out = world.plane.kubectl_apply(NAMESPACE, manifest).await?;
    ensure!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// The `workers` Group of `driver` with one schedule window (holding one machine, of `slots`
/// when given).
fn group_with_window(driver: &str, w: &Window, slots: &str) -> String {
    format!(
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata:
  name: workers
spec:
  driver: {driver}
  builtin:
    hold: 15s
    podsPerNode: 1
  nodeReadinessTaints:
    - key: node.cilium.io/agent-not-ready
      effect: NoExecute
  schedules:
    - days: {days}
      from: "{from}"
      to: "{to}"
      timeZone: UTC
      minMachines: 1
{slots}"#,
        days = w.days,
        from = w.from,
        to = w.to,
    )
}

fn claims(world: &World) -> Api<NodeClaim> {
    Api::namespaced(world.client.clone(), NAMESPACE)
}

/// The schedule's claims (any phase).
async fn schedule_claims(world: &World) -> Result<Vec<NodeClaim>> {
    Ok(claims(world)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.request.call == ClaimCall::Schedule)
        .collect())
}

/// `kubectl get hgroup workers` as a person reads it: the SCHEDULE column's value.
async fn schedule_column(world: &World) -> Result<String> {
    let out = world.plane.kubectl(["get", "hgroup", "workers", "-n", NAMESPACE]).await?;
    ensure!(out.status.success(), "kubectl get hgroup: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = table.lines();
    let header = lines.next().context("no header")?;
    let row = lines.next().context("no row")?;
    let at = header.find("SCHEDULE").with_context(|| format!("no SCHEDULE column: {table}"))?;
    let end = header[at..].find("COST").map_or(row.len(), |n| at + n);
    Ok(row.get(at..end.min(row.len())).unwrap_or_default().trim().to_string())
}

/// The scenario both drivers share: the window opens, a Schedule claim holds `slot` until the
/// window's end, the machine comes up, `kubectl get hgroup` shows the window; at the end the
/// claim is completed `Expired` and the machine goes off. `during` runs while the window is
/// open and the machine is ready.
async fn window_holds_a_machine(
    world: &mut World,
    w: &Window,
    slot: &str,
    during: impl AsyncFnOnce(&World) -> Result<()>,
) -> Result<()> {
    let t = Instant::now();
    // The Group was there before its window opened (else nothing shows the claim waited for it),
    // and the claim was made at the opening or after, whenever this test gets to look.
    let group: Group = Api::namespaced(world.client.clone(), NAMESPACE).get("workers").await?;
    let applied = group.metadata.creation_timestamp.context("the Group's creation time")?.0;
    ensure!(
        applied < w.opens,
        "the Group was applied at {applied}, after its window opened at {}: OPENS_IN too short",
        w.opens
    );
    let claim = eventually("a Schedule claim once the window opens", ACT, || async {
        let mut found = schedule_claims(world).await?;
        ensure!(found.len() == 1, "{} schedule claims", found.len());
        Ok(found.remove(0))
    })
    .await?;
    let made = claim.metadata.creation_timestamp.as_ref().context("the claim's creation time")?.0;
    ensure!(made >= w.opens, "the claim came at {made}, before the window opened at {}", w.opens);
    ensure!(claim.spec.slot_ref.name == slot, "the claim is for {}", claim.spec.slot_ref.name);
    ensure!(
        claim.spec.requested_by.as_deref() == Some("schedule/workers/0"),
        "admission keeps the schedule's requestedBy: {:?}",
        claim.spec.requested_by
    );
    ensure!(
        claim.spec.until.as_ref().map(|u| u.0) == Some(w.closes),
        "the claim ends with the window ({}): {:?}",
        w.closes,
        claim.spec.until
    );
    let reason = claim.spec.request.reason.clone().unwrap_or_default();
    ensure!(reason.contains("schedule window 0"), "the reason names the window: {reason}");
    let name = claim.metadata.name.clone().unwrap_or_default();
    eprintln!("[{:>5.1}s] window open: claim {name} on {slot}", t.elapsed().as_secs_f64());

    eventually("the scheduled machine ready", ACT, || async {
        let claim = claims(world).get(&name).await?;
        let phase = homelab_autoscaler::phase::of(&claim);
        ensure!(phase == NodeClaimPhase::Ready, "phase {phase:?}");
        Ok(())
    })
    .await?;
    let column = schedule_column(world).await?;
    ensure!(
        column == format!("{} {}-{} UTC", w.days, w.from, w.to),
        "kubectl get hgroup shows the open window: {column:?}"
    );
    let group: Group = Api::namespaced(world.client.clone(), NAMESPACE).get("workers").await?;
    let status = group.status.and_then(|s| s.schedule).context("no status.schedule")?;
    ensure!(
        status.until.as_ref().map(|u| u.0) == Some(w.closes),
        "status.schedule.until: {status:?}"
    );
    ensure!(status.held.as_deref() == Some("1/1"), "status.schedule.held: {status:?}");
    eprintln!("[{:>5.1}s] {slot} ready; SCHEDULE column {column:?}", t.elapsed().as_secs_f64());

    during(world).await?;
    let now = jiff::Timestamp::now();
    ensure!(now < w.closes, "the checks during the window ran past its end ({now})");

    eventually("the claim completed Expired after the window", ACT, || async {
        let claim = claims(world).get(&name).await?;
        let status = claim.status.clone().unwrap_or_default();
        ensure!(
            status.phase == Some(NodeClaimPhase::Completed)
                && status.reason.as_deref() == Some("Expired"),
            "phase {:?}, reason {:?}",
            status.phase,
            status.reason
        );
        Ok(())
    })
    .await?;
    let expired = jiff::Timestamp::now();
    ensure!(expired >= w.closes, "expired at {expired}, before the window closed at {}", w.closes);
    eventually("the machine off after the window", ACT, || async {
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(nodes.is_empty(), "Nodes left: {nodes:?}");
        Ok(())
    })
    .await?;
    ensure!(
        schedule_claims(world).await?.len() == 1,
        "the schedule made no second claim after its window"
    );
    let column = schedule_column(world).await?;
    ensure!(column == "<none>" || column.is_empty(), "SCHEDULE after the window: {column:?}");
    eprintln!("[{:>5.1}s] window closed: claim Expired, {slot} off", t.elapsed().as_secs_f64());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_holds_the_cheapest_machine_of_a_builtin_pool() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let mut world = World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = async {
        // mini-1 (0.02/h), mini-2 (0.03/h), big-1 (0.25/h); no workload.
        world.apply_example("pool.yaml").await?;
        let w = window(OPENS_IN, BOOT_ON_LOAD)?;
        apply(&world, &group_with_window("builtin", &w, "")).await?;
        window_holds_a_machine(&mut world, &w, "mini-1", async |_| Ok(())).await
    }
    .await;
    if let Err(error) = outcome {
        panic!("{error:#}\n--- operator ---\n{}", world.operator_log_tail(0, 60));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_leaves_a_scheduled_machine_on_until_the_window_ends() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let mut world = World::start_for_autoscaler(&bin, false).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let settings = AutoscalerSettings::default();
    let unneeded = settings.scale_down_unneeded;
    let ca = world.autoscaler(&settings).await.expect("cluster-autoscaler");
    let outcome = async {
        world.apply_example("pool-cluster-autoscaler.yaml").await?;
        // Long enough for a boot, then cluster-autoscaler's unneeded time twice over and a loop
        // of its on the loaded machine to read the node.
        let open_for = BOOT_ON_LOAD + unneeded * 2 + SCAN_INTERVAL + LOOP_ON_LOAD;
        let w = window(OPENS_IN, open_for)?;
        apply(&world, &group_with_window("cluster-autoscaler", &w, "      slots: [mini-2]\n"))
            .await?;
        window_holds_a_machine(&mut world, &w, "mini-2", async |world| {
            let ready_at = Instant::now();
            // An idle node is removed once unneeded for this long; wait it out twice.
            eventually("cluster-autoscaler past its unneeded time", ACT, || async {
                ensure!(ready_at.elapsed() > unneeded * 2, "not yet");
                let loops = ca
                    .metric_where(
                        "cluster_autoscaler_function_duration_seconds_count",
                        "function=\"main\"",
                    )
                    .await?;
                ensure!(loops > 0.0, "no loop yet");
                Ok(())
            })
            .await?;
            world.autoscaler_left_on(&ca, "mini-2").await
        })
        .await?;
        let said: Vec<String> =
            ca.log().lines().filter(|l| l.contains("mini-2")).map(str::to_owned).collect();
        eprintln!("cluster-autoscaler on mini-2 ({} lines):", said.len());
        for line in said.iter().take(40) {
            eprintln!("  {line}");
        }
        let calls: Vec<String> = world
            .operator_log_tail(0, 2000)
            .lines()
            .filter(|l| l.contains("cluster-autoscaler called"))
            .map(str::to_owned)
            .collect();
        eprintln!("cluster-autoscaler's calls: {calls:#?}");
        Ok::<(), anyhow::Error>(())
    }
    .await;
    if let Err(error) = outcome {
        panic!(
            "{error:#}\n--- cluster-autoscaler ---\n{}\n--- operator ---\n{}",
            ca.log_tail(80),
            world.operator_log_tail(0, 60)
        );
    }
}
