//! The real cluster-autoscaler drives a pool of real machines (homelab_harness::machine): the
//! operator binary (webhooks, controllers, the externalgrpc provider over mutual TLS) and
//! cluster-autoscaler as processes on a control plane of their own; examples/
//! pool-cluster-autoscaler.yaml applied with kubectl, each slot powered by its machine's own
//! drivers (a Wake-on-LAN magic packet on, an SSH shutdown off) from power Jobs that run the
//! operator's image on a real lab machine. Nothing here presses a machine's buttons. A second
//! scenario lets the pool's machines sleep when idle (`spec.power.suspend`): what
//! cluster-autoscaler makes of a machine asleep, and that its scale-up wakes that one.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).
//! The first run builds the `machines` programs and the operator's image (`make image`).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{
    CONDITION_SUSPENDED, ClaimCall, LABEL_GROUP, LABEL_SLOT, NodeClaimPhase,
};
use homelab_harness::claims::phase;
use homelab_harness::e2e::{
    AGENT_TAINT, Autoscaler, AutoscalerSettings, Machines, Workload, World, describe,
    operator_binary, released_by_autoscaler,
};
use homelab_harness::eventually;
use homelab_harness::machine::{Machine, PowerCause, PowerState};
use homelab_harness::real_lab::{Stranding, first_seen, hosts_running};
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::Api;
use serde_json::json;

/// A real boot (kubelet, containerd, the gate) and cluster-autoscaler's loop, with room.
const ACT: Duration = Duration::from_secs(240);

/// Two pods that may not share a machine take the pool of three 0 → 2; scaled away, 2 → 0,
/// each machine shut down over SSH and its Node gone; scaled back, 0 → 2 again. Every boot is a
/// magic packet from the lab to the machine's card, every shutdown an SSH command to its sshd.
/// A machine booted twice registers a fresh Node that carries its kubelet's
/// `--register-with-taints` taint from creation, and the slot's labels come back on it. At no
/// moment is a machine on without its Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_wakes_real_machines_and_shuts_them_down_over_ssh() {
    let bin = operator_binary(None).expect("operator binary");
    let mut world =
        World::start_for_autoscaler_with(&bin, false, Machines::Real).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    if let Err(error) = up_down_up(&mut world, &ca).await {
        panic!(
            "{error:#}\n--- cluster-autoscaler ({}) ---\n{}\n--- operator ---\n{}",
            ca.log_path().display(),
            ca.log_tail(80),
            world.operator_log_tail(0, 60)
        );
    }
}

async fn up_down_up(world: &mut World, ca: &Autoscaler) -> Result<()> {
    world.apply_pool("pool-cluster-autoscaler.yaml").await?;
    let machines: Vec<Machine> =
        world.real_pool().context("a real pool")?.machines().cloned().collect();
    ensure!(machines.len() == 3, "a machine per slot of the example: {}", machines.len());
    let _machine_logs: Vec<_> = machines.iter().map(Machine::logs_on_failure).collect();
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    let created = first_seen(nodes.clone());
    let stranded: Vec<Stranding> =
        machines.iter().map(|m| Stranding::watch(m.clone(), nodes.clone())).collect();
    let never_stranded = || {
        for (watch, machine) in stranded.iter().zip(&machines) {
            watch.assert_never(machine.name());
        }
    };
    let machine = |name: &str| machines.iter().find(|m| m.name() == name).cloned();

    // 0 -> 2: two claims from IncreaseSize, each machine woken by a magic packet.
    world.deploy(&Workload::on_group("web", "workers", 2, "1")).await?;
    let first = running_on(world, 2).await?;
    never_stranded();
    world.settled_without_double_boot(ca, "workers", 2).await?;
    for m in &machines {
        let booted = first.contains(m.name());
        let on = m.power_state().await == PowerState::On;
        ensure!(on == booted, "{}: on {on}, serving {booted}", m.name());
        ensure!(
            (m.wakes() > 0) == booted,
            "{}: {} magic packets, serving {booted}",
            m.name(),
            m.wakes()
        );
    }
    let first_nodes: Vec<CoreNode> = {
        let mut all = Vec::new();
        for name in &first {
            all.push(nodes.get(name).await?);
        }
        all
    };

    // 2 -> 0: cluster-autoscaler's scale-down, each machine shut down by its OS over SSH.
    world.scale("web", 0).await?;
    world.pool_at_zero("workers", ACT).await?;
    never_stranded();
    for name in &first {
        let m = machine(name).context("the machine")?;
        ensure!(m.power_state().await == PowerState::Off, "{name} is still on");
        let last = m.power_history().last().copied().context("a power history")?;
        ensure!(
            (last.state, last.cause) == (PowerState::Off, PowerCause::Shutdown),
            "{name}: off by the OS's orderly shutdown, not a cut: {last:?}"
        );
    }
    let claims = world.claims_made_by_increase_size("workers", 2)?;
    ensure!(
        claims.iter().all(|c| phase(c) == NodeClaimPhase::Completed && released_by_autoscaler(c)),
        "every claim completed by cluster-autoscaler's DeleteNodes:\n{}",
        describe(&claims)
    );

    // 0 -> 2 again. Two of three machines each time: at least one boots twice.
    world.scale("web", 2).await?;
    let second = running_on(world, 2).await?;
    world.quiet_loops(ca, 5).await?;
    let claims = world.claims_seen("workers");
    let live: Vec<_> = claims.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).collect();
    ensure!(
        claims.len() == 4
            && live.len() == 2
            && claims.iter().all(|c| c.spec.request.call == ClaimCall::IncreaseSize),
        "two claims per scale-up, all from IncreaseSize, two ready:\n{}",
        describe(&claims)
    );
    let twice: Vec<&CoreNode> = first_nodes
        .iter()
        .filter(|n| second.contains(n.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    ensure!(!twice.is_empty(), "a machine booted twice: {first:?}, then {second:?}");
    for old in twice {
        let name = old.metadata.name.clone().unwrap_or_default();
        let node = nodes.get(&name).await?;
        ensure!(node.metadata.uid != old.metadata.uid, "{name}: a fresh Node");
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let as_created = created.lock().ok().and_then(|seen| seen.get(&uid).cloned());
        let as_created = as_created.context("the watch saw the fresh Node's creation")?;
        let taints = as_created.spec.and_then(|s| s.taints).unwrap_or_default();
        ensure!(
            taints.iter().any(|t| t.key == AGENT_TAINT && t.effect == "NoExecute"),
            "{name}: the kubelet's --register-with-taints taint from creation: {taints:?}"
        );
        let labels = node.metadata.labels.unwrap_or_default();
        ensure!(
            labels.get(LABEL_GROUP).map(String::as_str) == Some("workers")
                && labels.get(LABEL_SLOT) == Some(&name),
            "{name}: the slot's labels are back: {labels:?}"
        );
    }
    never_stranded();
    Ok(())
}

/// Waits until `want` pods of `web` run with their container running, each on a machine of its
/// own; returns the machines.
async fn running_on(world: &World, want: usize) -> Result<BTreeSet<String>> {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "default");
    eventually(&format!("{want} pods of web running on real machines"), ACT, || async {
        let hosts = hosts_running(&pods, "web").await?;
        ensure!(hosts.len() == want, "web running on {hosts:?}, want {want} machines");
        Ok(hosts)
    })
    .await
}

/// A pool whose machines sleep when idle, under the real cluster-autoscaler. One pod boots a
/// machine (mini-1, the first of three equal slots), cold; scaled away, cluster-autoscaler's
/// DeleteNodes releases it and the machine sleeps instead of powering off, its Node kept and
/// marked `Suspended`. Over the loops that follow, past the World's 10 s
/// `--scale-down-unready-time`, cluster-autoscaler counts the Node as suspended, never as
/// unready, scales nothing down and makes no claim. Then mini-1 is made dearer than the machines
/// that are off, by less than the Group's `asleepPriceMargin`: the next pod's IncreaseSize wakes
/// it rather than boot a cheaper machine, on the same Node, without a second boot, and the
/// others stay off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_leaves_a_machine_asleep_alone_and_wakes_it_first() {
    let bin = operator_binary(None).expect("operator binary");
    let mut world =
        World::start_for_autoscaler_with(&bin, false, Machines::Real).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    world.real_pool_mut().expect("a real pool").sleep_when_idle(Some(
        json!({ "command": "systemctl suspend", "quietSeconds": 3, "watts": 2 }),
    ));
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    if let Err(error) = sleep_and_wake(&mut world, &ca).await {
        panic!(
            "{error:#}\n--- cluster-autoscaler ({}) ---\n{}\n--- operator ---\n{}",
            ca.log_path().display(),
            ca.log_tail(80),
            world.operator_log_tail(0, 60)
        );
    }
}

async fn sleep_and_wake(world: &mut World, ca: &Autoscaler) -> Result<()> {
    world.apply_pool("pool-cluster-autoscaler.yaml").await?;
    let machines: Vec<Machine> =
        world.real_pool().context("a real pool")?.machines().cloned().collect();
    let _machine_logs: Vec<_> = machines.iter().map(Machine::logs_on_failure).collect();
    let machine = |name: &str| machines.iter().find(|m| m.name() == name).cloned();
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    let stranded: Vec<Stranding> =
        machines.iter().map(|m| Stranding::watch(m.clone(), nodes.clone())).collect();

    world.deploy(&Workload::on_group("web", "workers", 1, "1")).await?;
    let first = running_on(world, 1).await?;
    ensure!(first.contains("mini-1"), "the first of equal slots boots: {first:?}");
    let mini1 = machine("mini-1").context("mini-1")?;
    let uid = nodes.get("mini-1").await?.metadata.uid;

    world.scale("web", 0).await?;
    world.no_live_claims("workers", ACT).await?;
    eventually("mini-1 asleep, its Node marked", ACT, || async {
        ensure!(mini1.suspended(), "mini-1 does not sleep");
        let node = nodes.get("mini-1").await?;
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        let marked =
            conditions.iter().any(|c| c.type_ == CONDITION_SUSPENDED && c.status == "True");
        ensure!(marked, "not marked Suspended");
        Ok(())
    })
    .await?;
    let scaled_down = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
    let log_from = std::fs::metadata(ca.log_path()).map(|m| m.len()).unwrap_or(0);
    world.quiet_loops(ca, 10).await?;
    let suspended =
        ca.metric_where("cluster_autoscaler_nodes_count", r#"state="suspended""#).await?;
    let unready = ca.metric_where("cluster_autoscaler_nodes_count", r#"state="unready""#).await?;
    ensure!(
        (suspended, unready) == (1.0, 0.0),
        "cluster-autoscaler counts {suspended} node(s) suspended and {unready} unready: {:?}; \
         the node: {:?}",
        ca.metric_lines("cluster_autoscaler_nodes_count").await?,
        nodes.get("mini-1").await.map(|n| (n.spec, n.status.map(|s| s.conditions)))
    );
    let after = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
    ensure!(
        after == scaled_down,
        "cluster-autoscaler scaled {} more node(s) down",
        after - scaled_down
    );
    // What cluster-autoscaler said of the Node while it slept.
    let log = std::fs::read(ca.log_path()).context("cluster-autoscaler's log")?;
    let said = String::from_utf8_lossy(log.get(usize::try_from(log_from)?..).unwrap_or_default());
    let about: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("mini-1"))
        .filter(|l| ["nready", "nregistered", "emov", "elete"].iter().any(|w| l.contains(w)))
        .collect();
    ensure!(about.is_empty(), "cluster-autoscaler on mini-1 asleep:\n{}", about.join("\n"));
    ensure!(mini1.suspended(), "mini-1 was woken while nothing wanted it");
    ensure!(world.claims_seen("workers").len() == 1, "a claim was made while mini-1 slept");
    let health = Autoscaler::status(&world.client).await?.cluster_wide.health.status;
    ensure!(health == "Healthy", "cluster-autoscaler's cluster-wide health: {health}");

    // mini-1 asleep costs 0.03, the two off 0.02: within the margin of 0.02.
    world
        .kubectl(&[
            "patch",
            "-n",
            "homelab-autoscaler-system",
            "node.infra.homecluster.dev",
            "mini-1",
            "--type=merge",
            "-p",
            r#"{"spec":{"pricing":{"hourlyRate":0.03,"podRate":0.005}}}"#,
        ])
        .await?;
    world
        .kubectl(&[
            "patch",
            "-n",
            "homelab-autoscaler-system",
            "group",
            "workers",
            "--type=merge",
            "-p",
            r#"{"spec":{"asleepPriceMargin":0.02}}"#,
        ])
        .await?;
    world.scale("web", 1).await?;
    let second = running_on(world, 1).await?;
    ensure!(second.contains("mini-1"), "the machine asleep is woken first: {second:?}");
    world.quiet_loops(ca, 5).await?;
    ensure!(!mini1.suspended() && mini1.boots() == 1, "mini-1 woke without a second boot");
    ensure!(nodes.get("mini-1").await?.metadata.uid == uid, "mini-1 is on the same Node");
    for name in ["mini-2", "mini-3"] {
        let m = machine(name).context("a machine")?;
        ensure!(m.wakes() == 0 && m.boots() == 0, "{name} stayed off");
    }
    let claims = world.claims_seen("workers");
    ensure!(
        claims.len() == 2
            && claims.iter().all(|c| c.spec.request.call == ClaimCall::IncreaseSize)
            && claims.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).count() == 1,
        "one claim per scale-up, from IncreaseSize, one ready:\n{}",
        describe(&claims)
    );
    for (watch, machine) in stranded.iter().zip(&machines) {
        watch.assert_never(machine.name());
    }
    Ok(())
}
