//! A power outage under the real cluster-autoscaler, on real machines
//! (homelab_harness::machine): the operator binary and cluster-autoscaler as processes on a
//! control plane of their own, examples/pool-cluster-autoscaler.yaml applied with kubectl, each
//! slot powered by its machine's own drivers (a Wake-on-LAN magic packet on, an SSH shutdown
//! off), and the pool's UPS a real `upsd` with its `dummy-ups` driver, read without a login.
//!
//! On battery cluster-autoscaler is told the group's maximum is its size and boots nothing for
//! a pending pod; on low battery the machine is shed and shut down by its OS; back on mains
//! cluster-autoscaler scales the pool up again, one machine booting at a time.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{Group, NodeClaimPhase, PowerSource};
use homelab_harness::claims::phase;
use homelab_harness::e2e::{
    Autoscaler, AutoscalerSettings, Machines, NAMESPACE, Workload, World, describe, operator_binary,
};
use homelab_harness::machine::{Machine, PowerCause, PowerState};
use homelab_harness::power_peers::UpsPeer;
use homelab_harness::real_lab::{Stranding, hosts_running};
use homelab_harness::{eventually, stays};
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::Api;
use serde_json::json;

/// A real boot (kubelet, containerd, the gate) and cluster-autoscaler's loop, with room.
const ACT: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_boots_nothing_on_battery_and_the_pool_returns_one_machine_at_a_time() {
    let bin = operator_binary(None).expect("operator binary");
    let ups = UpsPeer::start().await.expect("upsd with dummy-ups");
    let mut world =
        World::start_for_autoscaler_with(&bin, false, Machines::Real).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    if let Err(error) = outage(&mut world, &ca, &ups).await {
        panic!(
            "{error:#}\n--- cluster-autoscaler ({}) ---\n{}\n--- operator ---\n{}\n--- upsd ---\n{}",
            ca.log_path().display(),
            ca.log_tail(80),
            world.operator_log_tail(0, 60),
            ups.upsd.log_tail(20),
        );
    }
    eprintln!("{}", world.summary());
}

async fn outage(world: &mut World, ca: &Autoscaler, ups: &UpsPeer) -> Result<()> {
    let t = std::time::Instant::now();
    world.apply_pool("pool-cluster-autoscaler.yaml").await?;
    let machines: Vec<Machine> =
        world.real_pool().context("a real pool")?.machines().cloned().collect();
    let _machine_logs: Vec<_> = machines.iter().map(Machine::logs_on_failure).collect();
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    let stranded: Vec<Stranding> =
        machines.iter().map(|m| Stranding::watch(m.clone(), nodes.clone())).collect();
    let never_stranded = || {
        for (watch, machine) in stranded.iter().zip(&machines) {
            watch.assert_never(machine.name());
        }
    };
    let policy = json!({ "spec": { "ups": {
        "name": ups.address(),
        "pollInterval": "1s",
        "onBattery": { "shedAfter": "10m", "keep": 0 },
        "onMains": { "bootsAtOnce": 1, "staggerFor": "10m" },
    } } });
    world.patch_group("workers", &policy).await?;
    let groups: Api<Group> = Api::namespaced(world.client.clone(), NAMESPACE);
    let source = || async {
        let group = groups.get("workers").await?;
        group.status.and_then(|s| s.power).map(|p| p.source).context("no status.power yet")
    };
    eventually("the pool reads mains", ACT, || async {
        ensure!(source().await? == PowerSource::Mains, "{:?}", source().await?);
        Ok(())
    })
    .await?;
    world.note(format!("pool applied, its UPS {} read as mains", ups.address()), t);

    // One pod, one machine.
    let t = std::time::Instant::now();
    world.deploy(&Workload::on_group("web", "workers", 1, "1")).await?;
    let first: BTreeSet<String> = world.pods_running("web", 1, ACT).await?.into_iter().collect();
    never_stranded();
    world.note(format!("one pod running on {first:?}"), t);

    // On battery: cluster-autoscaler is told the group is at its maximum and boots nothing.
    let t = std::time::Instant::now();
    ups.set(&[("ups.status", "OB DISCHRG"), ("battery.charge", "80"), ("battery.runtime", "1500")])
        .await?;
    eventually("the pool reads battery", ACT, || async {
        ensure!(source().await? == PowerSource::Battery, "{:?}", source().await?);
        Ok(())
    })
    .await?;
    world.scale("web", 2).await?;
    world.quiet_loops(ca, 3).await?;
    stays("no second machine on battery", Duration::from_secs(10), || async {
        let claims = world.claims_seen("workers");
        ensure!(claims.len() == 1, "claims on battery:\n{}", describe(&claims));
        Ok(())
    })
    .await?;
    for m in machines.iter().filter(|m| !first.contains(m.name())) {
        ensure!(m.wakes() == 0, "{} was woken on battery", m.name());
    }
    ensure!(
        ca.log().contains("Skipping node group workers - max size reached"),
        "cluster-autoscaler did not see the group at its maximum"
    );
    world.note("on battery: a second pod pending, cluster-autoscaler skips the group at its maximum (3 loops), no magic packet sent", t);

    // Low battery: the machine is shed and its OS shuts it down.
    let t = std::time::Instant::now();
    ups.set(&[("ups.status", "OB LB"), ("battery.charge", "7"), ("battery.runtime", "60")]).await?;
    world.pool_at_zero("workers", ACT).await?;
    never_stranded();
    for name in &first {
        let m = machines.iter().find(|m| m.name() == name).context("the machine")?;
        ensure!(m.power_state().await == PowerState::Off, "{name} is still on");
        let last = m.power_history().last().copied().context("a power history")?;
        ensure!(
            (last.state, last.cause) == (PowerState::Off, PowerCause::Shutdown),
            "{name}: off by the OS's orderly shutdown, not a cut: {last:?}"
        );
    }
    let shed: Vec<_> = world
        .claims_seen("workers")
        .into_iter()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.scale_down_requested_by.as_deref())
                .is_some_and(|by| by.starts_with("homelab-autoscaler/ups"))
        })
        .collect();
    ensure!(
        shed.len() == 1,
        "the machine shed by the UPS:\n{}",
        describe(&world.claims_seen("workers"))
    );
    world.note(format!("low battery: {first:?} shed and shut down over SSH"), t);

    // Mains: cluster-autoscaler brings both pods' machines back, one booting at a time.
    let t = std::time::Instant::now();
    ups.set(&[("ups.status", "OL CHRG"), ("battery.charge", "15"), ("battery.runtime", "300")])
        .await?;
    let most = Arc::new(AtomicUsize::new(0));
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "default");
    eventually("two pods running again", ACT * 2, || async {
        let on_the_way = world
            .claims_seen("workers")
            .iter()
            .filter(|c| matches!(phase(c), NodeClaimPhase::Pending | NodeClaimPhase::Booting))
            .count();
        most.fetch_max(on_the_way, Ordering::SeqCst);
        let hosts = hosts_running(&pods, "web").await?;
        ensure!(hosts.len() == 2, "web running on {hosts:?}");
        Ok(())
    })
    .await?;
    let most = most.load(Ordering::SeqCst);
    ensure!(most == 1, "{most} machines booting at once after the outage");
    never_stranded();
    world.note(
        "mains: cluster-autoscaler scaled back to two machines, never more than one booting",
        t,
    );
    Ok(())
}
