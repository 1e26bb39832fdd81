//! A power outage from start to end, against a real UPS server: Network UPS Tools' `upsd` with
//! its `dummy-ups` driver (tests/harness/install-power-peers.sh installs it), whose values the
//! test changes as a real UPS's driver reports them (OL → OB → charge falling → LB → OL). The
//! real operator binary reads it over the NUT protocol with the login of a Secret, and runs the
//! pool of examples/power-outage.yaml (applied with kubectl) on simulated machines against a
//! real control plane, scaled by the built-in scaler.
//!
//! The scenarios, in the order an outage brings them: on battery a pending pod wakes nothing and
//! a person's claim is refused, but a pin that says `bootOnBattery` boots; the UPS unread, a
//! threshold the last reading crossed sheds nothing; below the charge threshold the pool sheds
//! down to `keep`, the highest draw first, never the battery pin; low battery powers everything
//! off, the pin too; mains back, the pool boots again for its pods one machine at a time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{Group, GroupPowerStatus, NodeClaim, NodeClaimPhase, PowerSource};
use homelab_harness::claims::phase;
use homelab_harness::e2e::{self, NAMESPACE, Workload, World};
use homelab_harness::power_peers::UpsPeer;
use homelab_harness::{eventually, stays};
use kube::api::{Api, ListParams};
use serde_json::json;

/// How long the operator may take to read a change and act on it.
const ACT: Duration = Duration::from_secs(120);
/// How long a state must hold to count as kept.
const KEPT: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_outage_holds_boots_sheds_in_order_and_comes_back_one_machine_at_a_time() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let ups = UpsPeer::start().await.expect("upsd with dummy-ups");
    let mut world = World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let outcome = outage(&mut world, &ups, &bin).await;
    eprintln!("{}", world.summary());
    if outcome.is_err() {
        eprintln!("upsd:\n{}", ups.upsd.log_tail(30));
        eprintln!("operator:\n{}", world.operator_log_tail(0, 80));
    }
    outcome.expect("the outage");
}

async fn outage(world: &mut World, ups: &UpsPeer, bin: &std::path::Path) -> Result<()> {
    let groups: Api<Group> = Api::namespaced(world.client.clone(), NAMESPACE);
    let claims = world.claims();

    // The example as a person applies it, then pointed at this test's upsd.
    let t = Instant::now();
    world.apply_pool("power-outage.yaml").await?;
    world
        .kubectl(&[
            "patch",
            "secret",
            "nut-monitor",
            "-n",
            NAMESPACE,
            "--type",
            "merge",
            "-p",
            &json!({ "stringData": { "username": ups.username(), "password": ups.password() } })
                .to_string(),
        ])
        .await?;
    let policy = json!({ "spec": { "ups": {
        "name": ups.address(),
        "pollInterval": "1s",
        "onBattery": { "shedAfter": "10m", "shedBelowCharge": 50, "shedBelowRuntime": null, "keep": 2 },
        "onMains": { "bootsAtOnce": 1, "staggerFor": "10m" },
    } } });
    world.patch_group("workers", &policy).await?;
    let power = || async {
        let group = groups.get("workers").await?;
        group.status.and_then(|s| s.power).context("no status.power yet")
    };
    eventually("the pool reads mains from its UPS", ACT, || async {
        let p: GroupPowerStatus = power().await?;
        ensure!(p.source == PowerSource::Mains && p.ups == ups.address(), "{p:?}");
        Ok(())
    })
    .await?;
    let table = world.kubectl(&["get", "hgroup", "workers", "-n", NAMESPACE]).await?;
    ensure!(table.contains("POWER") && table.contains("mains"), "kubectl get hgroup:\n{table}");
    world.note(
        format!(
            "applied examples/power-outage.yaml against {}; the pool reads mains",
            ups.address()
        ),
        t,
    );

    // Three pods: the three cheapest machines.
    let t = Instant::now();
    world.deploy(&Workload::on_group("web", "workers", 3, "1")).await?;
    let first = ["gpu-1", "mini-1", "mini-2"];
    eventually("three machines ready", ACT, || async {
        ensure!(ready_slots(&claims).await? == set(&first), "{:?}", ready_slots(&claims).await?);
        Ok(())
    })
    .await?;
    world.note("three pods, three machines ready: mini-1 (15 W), mini-2 (20 W), gpu-1 (300 W)", t);

    // (1) On battery: nothing boots but a battery pin.
    let t = Instant::now();
    ups.set(&[("ups.status", "OB DISCHRG"), ("battery.charge", "90"), ("battery.runtime", "1800")])
        .await?;
    eventually("the pool reads battery", ACT, || async {
        let p = power().await?;
        ensure!(p.source == PowerSource::Battery && p.summary == "battery 90%, 30m", "{p:?}");
        Ok(())
    })
    .await?;
    world.note("the UPS went on battery (OB DISCHRG, 90%, 30m); the pool reads it", t);

    let t = Instant::now();
    world.scale("web", 4).await?;
    stays("no machine boots for the fourth pod on battery", KEPT, || async {
        let live = live_slots(&claims).await?;
        ensure!(live == set(&first), "live claims {live:?}");
        Ok(())
    })
    .await?;
    let decision = groups.get("workers").await?.status.and_then(|s| s.last_decision);
    let reason = decision.map(|d| d.reason).unwrap_or_default();
    world.note(
        format!("a fourth pod pending: nothing booted in {KEPT:?} (the scaler: {reason})"),
        t,
    );

    let t = Instant::now();
    let refused =
        world.plane.kubectl_apply(NAMESPACE, &pin_manifest("mini-3-by-hand", "mini-3")).await?;
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    ensure!(!refused.status.success(), "a claim on battery was admitted");
    ensure!(
        said.contains("runs on battery") && said.contains("spec.bootOnBattery: true"),
        "kubectl apply said: {said}"
    );
    // The same pin made with the CLI, as a person makes it: keep-on --on-battery.
    let pinned = tokio::process::Command::new(bin)
        .args(["keep-on", "--slot", "mini-3", "--namespace", NAMESPACE, "--on-battery"])
        .env("KUBECONFIG", world.plane.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    ensure!(
        pinned.status.success(),
        "keep-on --on-battery: {}",
        String::from_utf8_lossy(&pinned.stderr)
    );
    let all_four = ["gpu-1", "mini-1", "mini-2", "mini-3"];
    eventually("the battery pin's machine ready", ACT, || async {
        ensure!(ready_slots(&claims).await? == set(&all_four), "{:?}", ready_slots(&claims).await?);
        Ok(())
    })
    .await?;
    world.note(
        format!(
            "kubectl refused a claim on battery ({}); `keep-on --on-battery` booted mini-3",
            first_line(&said)
        ),
        t,
    );

    // (5) The UPS unread: a threshold its last reading crosses sheds nothing.
    let t = Instant::now();
    ups.stop_server()?;
    eventually("the pool reads the UPS as unread", ACT, || async {
        let p = power().await?;
        ensure!(p.source == PowerSource::Unread && p.summary.starts_with("unread since"), "{p:?}");
        Ok(())
    })
    .await?;
    let message = power().await?.message.unwrap_or_default();
    set_shed_below_charge(world, 95).await?;
    stays("nothing is shed on a missing reading", KEPT, || async {
        ensure!(
            marked_slots(&claims).await?.is_empty(),
            "marked: {:?}",
            marked_slots(&claims).await?
        );
        Ok(())
    })
    .await?;
    set_shed_below_charge(world, 50).await?;
    ups.start_server().await?;
    eventually("the pool reads battery again", ACT, || async {
        ensure!(power().await?.source == PowerSource::Battery, "{:?}", power().await?);
        Ok(())
    })
    .await?;
    world.note(format!("upsd stopped: the pool read it unread ({message}); with shedBelowCharge 95 over a last 90% nothing was shed in {KEPT:?}; upsd back"), t);

    // (2) Below the charge threshold: down to keep 2, the highest draw first, the pin kept.
    let t = Instant::now();
    ups.set(&[("battery.charge", "40"), ("battery.runtime", "700")]).await?;
    eventually("gpu-1 and mini-2 shed and off", ACT, || async {
        let live = live_slots(&claims).await?;
        ensure!(live == set(&["mini-1", "mini-3"]), "live {live:?}");
        Ok(())
    })
    .await?;
    let shed = shed_order(world);
    ensure!(
        shed.iter().map(|(slot, _)| slot.as_str()).collect::<Vec<_>>() == ["gpu-1", "mini-2"],
        "shed {shed:?}"
    );
    for (slot, by) in &shed {
        ensure!(by.contains("charge 40% is below 50%"), "{slot} shed by {by}");
    }
    stays("mini-1 and the battery pin stay on", KEPT, || async {
        ensure!(
            live_slots(&claims).await? == set(&["mini-1", "mini-3"]),
            "{:?}",
            live_slots(&claims).await?
        );
        ensure!(marked_slots(&claims).await?.is_empty(), "{:?}", marked_slots(&claims).await?);
        Ok(())
    })
    .await?;
    world.note(format!("charge 40%: shed {shed:?}; mini-1 (keep 2) and the mini-3 pin stayed"), t);

    // (3) Low battery: everything goes, the battery pin too.
    let t = Instant::now();
    ups.set(&[("ups.status", "OB LB"), ("battery.charge", "8"), ("battery.runtime", "90")]).await?;
    eventually("every machine off", ACT, || async {
        let live = live_slots(&claims).await?;
        ensure!(live.is_empty(), "live {live:?}");
        Ok(())
    })
    .await?;
    let low: Vec<(String, String)> = shed_order(world).into_iter().skip(2).collect();
    ensure!(low.iter().all(|(_, by)| by.contains("low battery")), "low battery sheds: {low:?}");
    world.note(format!("low battery (OB LB, 8%): shed {low:?}"), t);

    // (4) Mains returns: the pods' machines come back one at a time.
    let t = Instant::now();
    ups.set(&[("ups.status", "OL CHRG"), ("battery.charge", "20"), ("battery.runtime", "300")])
        .await?;
    let most_at_once = Arc::new(AtomicUsize::new(0));
    eventually("the pool back where its four pods want it", Duration::from_secs(300), || {
        let claims = claims.clone();
        let most = most_at_once.clone();
        async move {
            let list = claims.list(&ListParams::default()).await?.items;
            let on_the_way = list
                .iter()
                .filter(|c| matches!(phase(c), NodeClaimPhase::Pending | NodeClaimPhase::Booting))
                .count();
            most.fetch_max(on_the_way, Ordering::SeqCst);
            let ready = ready_slots(&claims).await?;
            ensure!(ready == set(&["gpu-1", "mini-1", "mini-2", "mini-3"]), "ready {ready:?}");
            Ok(())
        }
    })
    .await?;
    let most_at_once = most_at_once.load(Ordering::SeqCst);
    ensure!(most_at_once == 1, "{most_at_once} machines booted at once after the outage");
    let p = power().await?;
    ensure!(p.source == PowerSource::Mains && p.summary == "mains (returning)", "{p:?}");
    world.note(
        "mains returned: four machines back for four pods, never more than one booting at once",
        t,
    );
    Ok(())
}

fn set(slots: &[&str]) -> BTreeSet<String> {
    slots.iter().map(|s| (*s).to_owned()).collect()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// The slots of the claims that `keep` selects.
async fn slots_where(
    claims: &Api<NodeClaim>,
    keep: impl Fn(&NodeClaim) -> bool,
) -> Result<BTreeSet<String>> {
    let list = claims.list(&ListParams::default()).await?.items;
    Ok(list.iter().filter(|c| keep(c)).map(|c| c.spec.slot_ref.name.clone()).collect())
}

/// Slots with a live claim, one being released included.
async fn live_slots(claims: &Api<NodeClaim>) -> Result<BTreeSet<String>> {
    slots_where(claims, |c| homelab_autoscaler::phase::is_live(Some(phase(c)))).await
}

/// Slots whose claim is ready and not being released.
async fn ready_slots(claims: &Api<NodeClaim>) -> Result<BTreeSet<String>> {
    slots_where(claims, |c| {
        phase(c) == NodeClaimPhase::Ready && !homelab_autoscaler::phase::is_marked(c)
    })
    .await
}

/// Slots whose claim is being released.
async fn marked_slots(claims: &Api<NodeClaim>) -> Result<BTreeSet<String>> {
    slots_where(claims, homelab_autoscaler::phase::is_marked).await
}

/// The claims released by the UPS, in the order they were marked: (slot, by whom and why).
fn shed_order(world: &World) -> Vec<(String, String)> {
    let ledger = world.ledger.lock().map(|l| l.clone()).unwrap_or_default();
    let mut shed: Vec<(String, String, String)> = ledger
        .values()
        .filter_map(|c| {
            let status = c.status.as_ref()?;
            let by = status.scale_down_requested_by.clone()?;
            let at = status.scale_down_requested_at.as_ref()?.0.to_string();
            by.starts_with("homelab-autoscaler/ups").then(|| (at, c.spec.slot_ref.name.clone(), by))
        })
        .collect();
    // Marked in the same second, they were shed in one pass in the plan's order, which the
    // reason's draw shows: the higher draw first.
    shed.sort_by(|a, b| a.0.cmp(&b.0).then(watts_in(&b.2).total_cmp(&watts_in(&a.2))));
    shed.into_iter().map(|(_, slot, by)| (slot, by)).collect()
}

/// The draw a shed reason names ("…, 300 W; …"), 0 if none.
fn watts_in(by: &str) -> f64 {
    by.split(" W")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0.0)
}

/// A person's claim for `slot`, as they would write it.
fn pin_manifest(name: &str, slot: &str) -> String {
    format!(
        "apiVersion: infra.homecluster.dev/v2alpha1
kind: NodeClaim
metadata:
  name: {name}
spec:
  slotRef: {{ name: {slot} }}
  request: {{ call: Manual, group: workers, reason: the home automation box }}
"
    )
}

async fn set_shed_below_charge(world: &World, percent: i32) -> Result<()> {
    let patch = json!({ "spec": { "ups": { "onBattery": { "shedBelowCharge": percent } } } });
    world.patch_group("workers", &patch).await
}
