//! The operator on real machines (homelab_harness::machine): network namespaces on a test lan,
//! each running a real containerd and kubelet. The power Jobs run as real pods, from the
//! operator's own image, on the kubelet of an always-on machine (the hub), and reach the pool's
//! machines across the lan by the real protocols: a Wake-on-LAN magic packet to the card, an SSH
//! shutdown to the machine's sshd. Nothing in these tests presses a machine's buttons or touches
//! its services, except the faults under test: the power cut of the gate scenario, and the
//! containerd stopped by hand under a pin.
//!
//! Scenarios: a machine cut off past the grace keeps its Node; a drain that a disruption budget
//! refuses keeps the machine on; a power cut at the readiness gate ends with one machine serving;
//! a pinned machine whose containerd is stopped (NotReady) stays on and claimed; three machines
//! each running a real Ceph OSD go off one at a time, and only while Ceph is healthy; a pod
//! asking for a device wakes the machine whose real device plugin serves it, at every boot.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).
//! The first run builds the `machines` programs and the operator's image (`make image`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{
    ClaimCall, Group, LABEL_LIFECYCLE, LABEL_SLOT, Node, NodeClaim, NodeClaimPhase,
};
use homelab_autoscaler::controller::MachineSettings;
use homelab_autoscaler::scaler::{self, ScalerConfig};
use homelab_harness::ceph::{Ceph, Layout, longest_inactive};
use homelab_harness::claims::{phase, provider_claim_for};
use homelab_harness::e2e::prometheus::Prometheus;
use homelab_harness::host_kubelet::HostKubelet;
use homelab_harness::machine::{
    Lan, Machine, MachineLogs, MachineSpec, PowerState, SAMPLE_DEVICE_RESOURCE, SAMPLE_DEVICES,
};
use homelab_harness::real_lab::{
    ACT, HUB_ROLE, POOL_LABEL, Stranding, claim_ready, clear_taint, machine_settings,
    operator_image, pool_machine, pool_workload, release, scenario, secret, start_operator,
    timeouts, wake_and_ssh_power,
};
use homelab_harness::slots::{condition, event_reasons, node_reporting, power_off_hold};
use homelab_harness::{ControlPlane, TestNamespace, eventually, ready_status, stays};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod, ResourceRequirements, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The pool as a user writes it, applied with kubectl: Group `lan`, whose gate waits for
/// `readiness_taint` when one is given, and a slot per machine whose power is the machine's own
/// (Wake-on-LAN on, SSH off), its Jobs on the test's hub, declaring [`POOL_LABEL`].
async fn apply_pool(
    plane: &ControlPlane,
    ns: &str,
    readiness_taint: Option<&str>,
    machines: &[(&Machine, &str)],
) -> Result<()> {
    apply_pool_with(plane, ns, readiness_taint, machines, "").await
}

/// [`apply_pool`] with `group_spec`, more of the Group's spec (YAML lines indented by two).
async fn apply_pool_with(
    plane: &ControlPlane,
    ns: &str,
    readiness_taint: Option<&str>,
    machines: &[(&Machine, &str)],
    group_spec: &str,
) -> Result<()> {
    let slots: Vec<(&Machine, &str, &str)> = machines.iter().map(|(m, k)| (*m, *k, "")).collect();
    apply_pool_of(plane, ns, readiness_taint, &slots, group_spec).await
}

/// [`apply_pool_with`], each machine with more of its slot's spec (YAML lines indented by two).
async fn apply_pool_of(
    plane: &ControlPlane,
    ns: &str,
    readiness_taint: Option<&str>,
    machines: &[(&Machine, &str, &str)],
    group_spec: &str,
) -> Result<()> {
    let gate = readiness_taint.map_or_else(String::new, |key| format!("{{ key: {key} }}"));
    let mut manifest = format!(
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata:
  name: lan
spec:
  driver: builtin
  nodeReadinessTaints: [{gate}]
{group_spec}
"#
    );
    for (machine, key, slot_spec) in machines {
        let key_secret = format!("{}-ssh", machine.name());
        let secret = secret(&key_secret, "ssh-privatekey", key);
        manifest.push_str(&format!(
            r#"---
{secret}
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: {name}
  labels: {{ group: lan }}
spec:
  kubernetesNodeName: {name}
  nodeLabels: {{ "{POOL_LABEL}": "{ns}" }}
  power: {power}
{slot_spec}
"#,
            name = machine.name(),
            power = wake_and_ssh_power(machine, &key_secret, json!({ HUB_ROLE: ns }))?,
        ));
    }
    let output = plane.kubectl_apply(ns, &manifest).await?;
    ensure!(output.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// A scenario of one pool machine: the hub, machine `<ns>-m1` on the scenario's lan, the operator
/// running with `settings`, and the pool applied with kubectl. Fields drop in order: the log
/// guards first, while the machines and the lan still exist.
struct OneMachine {
    _m1_logs: MachineLogs,
    _hub_logs: MachineLogs,
    m1: Machine,
    operator: CancellationToken,
    _hub: Machine,
    _lan: Lan,
    space: TestNamespace,
}

async fn one_machine(prefix: &str, settings: MachineSettings) -> OneMachine {
    let (space, lan, hub) = scenario(prefix).await;
    let hub_logs = hub.logs_on_failure();
    let spec = MachineSpec::named(&format!("{}-m1", space.ns));
    let (m1, key) = pool_machine(space.plane, &lan, spec).await.expect("machine");
    let m1_logs = m1.logs_on_failure();
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(space.plane, &space.ns, &image, settings).await;
    apply_pool(space.plane, &space.ns, None, &[(&m1, &key)]).await.expect("pool");
    OneMachine { _m1_logs: m1_logs, _hub_logs: hub_logs, m1, operator, _hub: hub, _lan: lan, space }
}

/// The pods of workload `app` that are Running, with their nodes.
async fn running(pods: &Api<Pod>, app: &str) -> Result<Vec<(String, String)>> {
    let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| {
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            (p.metadata.name.unwrap_or_default(), node)
        })
        .collect())
}

/// A machine running with no claim loses its link for longer than `--off-node-grace` and gets
/// it back. Its kubelet never registers again a Node deleted while it runs, so the operator
/// keeps the Node while the machine is silent: the shutdown it sends to confirm the machine off
/// cannot reach it. Once the link is back the kubelet reports on its own Node, and the shutdown
/// that now lands powers the machine off, after which its Node goes. At no moment is the machine
/// on without its Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_cut_off_past_the_grace_keeps_its_node_and_is_never_stranded() {
    let one = one_machine("real-partition", machine_settings()).await;
    let (client, ns, m1) = (one.space.client.clone(), one.space.ns.clone(), &one.m1);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    let slot = m1.name().to_owned();

    // Booted for a claim: the wake Job on the hub sends the magic packet across the lan.
    claim_ready(&client, &ns, "boot", &slot).await;
    assert!(m1.wakes() >= 1, "woken by a magic packet, not by the test");
    let registered = nodes.get(&slot).await.expect("node");

    // The cable is pulled, then the claim released: the shutdown cannot reach the machine.
    m1.link().cut().expect("cut");
    eventually("the cut-off machine's Node Unknown", ACT, || async {
        let node = nodes.get(&slot).await?;
        ensure!(ready_status(&node) == Some("Unknown"), "Ready={:?}", ready_status(&node));
        Ok(())
    })
    .await
    .expect("unknown");
    release(&claims, "boot").await;

    // Past the grace with nothing wanting it, the operator powers the machine off to confirm it,
    // and that shutdown fails across the cut link: the Node must still be there afterwards.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    eventually("a shutdown to confirm the silent machine off, failed", ACT * 2, || async {
        stranded.assert_never(&slot);
        let reasons = event_reasons(&client, &ns, &slot).await?;
        ensure!(reasons.iter().any(|r| r == "ConfirmingOff"), "events {reasons:?}");
        let failed = jobs.list(&ListParams::default()).await?.items.into_iter().any(|j| {
            let name = j.metadata.name.clone().unwrap_or_default();
            let conditions = j.status.and_then(|s| s.conditions).unwrap_or_default();
            name.starts_with(&format!("{slot}-"))
                && name.contains("shutdown")
                && conditions.iter().any(|c| c.type_ == "Failed" && c.status == "True")
        });
        ensure!(failed, "no slot shutdown Job has failed yet");
        Ok(())
    })
    .await
    .expect("confirming off");
    let kept = nodes.get_opt(&slot).await.expect("read node");
    assert_eq!(
        kept.and_then(|n| n.metadata.uid),
        registered.metadata.uid.clone(),
        "the silent machine's Node is kept"
    );
    let slot_obj = slots.get(&slot).await.expect("slot");
    let (reporting, message) = node_reporting(&slot_obj).expect("NodeReporting");
    assert!(!reporting && message.contains("kubectl delete node"), "{message}");
    assert!(m1.kubelet_running().await, "the machine ran throughout");

    // The cable is back. Up and unwanted, and reachable again: the SSH shutdown lands (the
    // kubelet may report on its Node first, or not), and then the Node goes. Until then the
    // Node is the one the kubelet registered: never removed and never replaced under it.
    m1.link().restore().expect("restore");
    off_and_node_removed(m1, &nodes, &stranded, &registered).await;
    // Published just after the delete the wait above saw.
    eventually("the NodeRemoved event", ACT, || async {
        let reasons = event_reasons(&client, &ns, &slot).await?;
        ensure!(reasons.iter().any(|r| r == "NodeRemoved"), "events {reasons:?}");
        Ok(())
    })
    .await
    .expect("NodeRemoved");
    one.operator.cancel();
}

/// Waits until `machine` is off and its Node gone. Until then the Node is the one the kubelet
/// registered (`registered`): never removed under a running kubelet, never replaced under it.
async fn off_and_node_removed(
    machine: &Machine,
    nodes: &Api<CoreNode>,
    stranded: &Stranding,
    registered: &CoreNode,
) {
    let name = machine.name();
    eventually("the machine off and its Node removed", ACT * 2, || async {
        stranded.assert_never(name);
        if let Some(node) = nodes.get_opt(name).await? {
            assert_eq!(node.metadata.uid, registered.metadata.uid, "the Node was replaced");
        }
        ensure!(machine.power_state().await == PowerState::Off, "the machine is still on");
        ensure!(nodes.get_opt(name).await?.is_none(), "Node {name} still there");
        Ok(())
    })
    .await
    .expect("off");
    stranded.assert_never(name);
}

/// How long the link stays down after a lost SSH command: past the SSH session's 30 s of
/// inactivity (so the session ends while the link is down, with no exit status) and past the
/// kubelet's silence being noticed (20 s), and well inside the 60 s a sent shutdown's host must
/// stay silent to count as off.
const LOST_COMMAND_LINK_DOWN: Duration = Duration::from_secs(45);

/// A released machine's SSH shutdown is sent, and the link drops right after: the machine never
/// gets the command, the session ends with no exit status, and the Node goes Unknown. A session
/// closed without an exit status proves nothing, so the Node stays. Once the link is back, the
/// machine is up and unwanted, a shutdown lands, and only then does its Node go. At no moment is
/// the machine on without its Node. (Taking "no exit status" as done deleted the Node half a
/// minute after the cut, under a kubelet that ran on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lost_with_the_link_keeps_the_node_until_the_machine_is_off() {
    let one = one_machine("real-lost-ssh", machine_settings()).await;
    let (client, ns, m1) = (one.space.client.clone(), one.space.ns.clone(), &one.m1);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    let slot = m1.name().to_owned();
    claim_ready(&client, &ns, "boot", &slot).await;
    let registered = nodes.get(&slot).await.expect("node");

    m1.lose_next_ssh_command().expect("arm the lost command");
    release(&claims, "boot").await;
    let lost_at = eventually("the shutdown sent, and lost with the link", ACT, || async {
        m1.ssh_command_lost_at().ok_or_else(|| anyhow::anyhow!("no SSH command yet"))
    })
    .await
    .expect("lost");
    eventually("the Node Unknown, the link down for its while", ACT, || async {
        stranded.assert_never(&slot);
        let node = nodes.get_opt(&slot).await?.ok_or_else(|| anyhow::anyhow!("no Node"))?;
        ensure!(ready_status(&node) == Some("Unknown"), "Ready={:?}", ready_status(&node));
        ensure!(lost_at.elapsed() >= LOST_COMMAND_LINK_DOWN, "down {:?}", lost_at.elapsed());
        Ok(())
    })
    .await
    .expect("silent");
    assert_eq!(
        nodes.get(&slot).await.expect("node").metadata.uid,
        registered.metadata.uid,
        "the Node of the machine that never got its shutdown is kept"
    );
    assert_eq!(m1.power_state().await, PowerState::On, "the machine never got the command");

    m1.link().restore().expect("restore");
    off_and_node_removed(m1, &nodes, &stranded, &registered).await;
    one.operator.cancel();
}

/// A machine running two pods, one of them protected by a PodDisruptionBudget, is released. The
/// drain asks before it evicts, and the budget refuses: the machine stays on, cordoned, serving
/// both pods (the one with no budget is not evicted for a shutdown that cannot happen), and the
/// slot names the budget; nothing is evicted or killed, however long past the drain's retries.
/// Once the budget allows it both pods are evicted, and only then does the machine go off and
/// its Node with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_a_disruption_budget_refuses_keeps_the_machine_on_and_names_the_budget() {
    // No --drain-timeout, as installed: a budget holds the machine for as long as it refuses.
    let settings = MachineSettings { drain_timeout: None, ..machine_settings() };
    let one = one_machine("real-budget", settings).await;
    let (client, ns, m1) = (one.space.client.clone(), one.space.ns.clone(), &one.m1);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    let slot = m1.name().to_owned();
    claim_ready(&client, &ns, "boot", &slot).await;

    // The precious workload runs on the machine, a budget over its one replica.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &pool_workload(&ns, "db", 1))
        .await
        .expect("workload");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "db" },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "db" } } },
    }))
    .expect("budget");
    budgets.create(&PostParams::default(), &budget).await.expect("budget");
    let (pod, _) =
        eventually("the pod running on the machine, the budget in force", ACT, || async {
            let running = running(&pods, "db").await?;
            ensure!(running.len() == 1 && running[0].1 == slot, "running {running:?}");
            let healthy = budgets.get("db").await?.status.and_then(|s| s.current_healthy);
            ensure!(healthy == Some(1), "{healthy:?} healthy");
            Ok(running[0].clone())
        })
        .await
        .expect("running");
    let pod_uid = pods.get(&pod).await.expect("pod").metadata.uid;
    // Beside it, a workload no budget protects: it could move, but the machine cannot go.
    deployments
        .create(&PostParams::default(), &pool_workload(&ns, "free", 1))
        .await
        .expect("workload");
    let (free, _) = eventually("the unprotected pod running on the machine", ACT, || async {
        let running = running(&pods, "free").await?;
        ensure!(running.len() == 1 && running[0].1 == slot, "running {running:?}");
        Ok(running[0].clone())
    })
    .await
    .expect("running");
    let free_uid = pods.get(&free).await.expect("pod").metadata.uid;

    // Released: the drain is refused, and the slot names the budget.
    release(&claims, "boot").await;
    eventually("the slot saying which budget holds its machine", ACT, || async {
        let slot_obj = slots.get(&slot).await?;
        let (drained, message) = condition(&slot_obj, "Drained").context("no Drained condition")?;
        ensure!(!drained, "{message}");
        ensure!(message.contains(&format!("PodDisruptionBudget {ns}/db")), "{message}");
        ensure!(message.contains(&format!("pod {ns}/{pod}")), "{message}");
        ensure!(!message.contains(&free), "the unprotected pod is not held: {message}");
        let reasons = event_reasons(&client, &ns, &slot).await?;
        ensure!(reasons.iter().any(|r| r == "DrainBlocked"), "events {reasons:?}");
        Ok(())
    })
    .await
    .expect("held");
    // Held: well past the harness's former 5 s bound and many eviction rounds, the machine is on,
    // cordoned, no shutdown Job exists, and both pods are the same ones, running.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    stays("the machine held on by the budget", Duration::from_secs(30), || async {
        stranded.assert_never(&slot);
        ensure!(m1.power_state().await == PowerState::On, "the machine went off");
        let node = nodes.get(&slot).await?;
        ensure!(node.spec.and_then(|s| s.unschedulable) == Some(true), "not cordoned");
        let shutdown = format!("{LABEL_LIFECYCLE}=shutdown");
        let shutdowns = jobs.list(&ListParams::default().labels(&shutdown)).await?;
        ensure!(shutdowns.items.is_empty(), "a shutdown Job was created");
        for (name, uid) in [(&pod, &pod_uid), (&free, &free_uid)] {
            let now = pods.get(name).await?;
            ensure!(now.metadata.uid == *uid, "pod {name} was replaced");
            ensure!(now.metadata.deletion_timestamp.is_none(), "pod {name} is being deleted");
            let phase = now.status.and_then(|s| s.phase);
            ensure!(phase.as_deref() == Some("Running"), "pod {name} is {phase:?}");
        }
        Ok(())
    })
    .await
    .expect("held on");

    // The budget relaxed: both pods are evicted, and then the machine goes off and its Node with it.
    let relax = json!({ "spec": { "minAvailable": 0 } });
    budgets.patch("db", &PatchParams::default(), &Patch::Merge(&relax)).await.expect("relax");
    eventually("the pod evicted, the machine off and its Node removed", ACT * 2, || async {
        stranded.assert_never(&slot);
        ensure!(pods.get_opt(&pod).await?.is_none(), "pod {pod} still there");
        ensure!(pods.get_opt(&free).await?.is_none(), "pod {free} still there");
        ensure!(m1.power_state().await == PowerState::Off, "the machine is still on");
        ensure!(nodes.get_opt(&slot).await?.is_none(), "Node {slot} still there");
        let slot_obj = slots.get(&slot).await?;
        ensure!(condition(&slot_obj, "Drained").is_none(), "the hold is still reported");
        Ok(())
    })
    .await
    .expect("off");
    stranded.assert_never(&slot);
    one.operator.cancel();
}

/// The power fails while a booted machine waits at the readiness gate (its network agent has not
/// cleared the taint yet). The claim is not made ready on a dead machine: it fails inside its
/// deadline, the built-in scaler asks again, and in the end exactly one machine serves the pod:
/// one live claim, one machine on, the pod running on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_at_the_readiness_gate_ends_with_exactly_one_machine_serving() {
    let (space, lan, hub) = scenario("real-gate-cut").await;
    let (plane, client, ns) = (space.plane, space.client.clone(), space.ns.clone());
    let _hub_logs = hub.logs_on_failure();
    // The kubelets register with the agent's taint, as a CNI's nodes do, and the gate waits for it.
    let agent_taint =
        Taint { key: AGENT_TAINT.into(), effect: "NoSchedule".into(), ..Taint::default() };
    let mut machines = Vec::new();
    for name in ["m1", "m2"] {
        let spec = MachineSpec {
            taints: vec![agent_taint.clone()],
            ..MachineSpec::named(&format!("{ns}-{name}"))
        };
        let (machine, key) = pool_machine(plane, &lan, spec).await.expect("machine");
        machines.push((machine, key));
    }
    let _logs: Vec<_> = machines.iter().map(|(m, _)| m.logs_on_failure()).collect();
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(plane, &ns, &image, machine_settings()).await;
    let pool: Vec<(&Machine, &str)> = machines.iter().map(|(m, k)| (m, k.as_str())).collect();
    apply_pool(plane, &ns, Some(AGENT_TAINT), &pool).await.expect("pool");
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let stranded: Vec<Stranding> =
        machines.iter().map(|(m, _)| Stranding::watch(m.clone(), nodes.clone())).collect();
    let config = ScalerConfig {
        interval: Duration::from_secs(2),
        timeouts: timeouts(),
        ..ScalerConfig::new(ns.clone())
    };
    tokio::spawn(scaler::run(client.clone(), config, operator.child_token()));

    // One pod: the scaler claims one machine, which boots and stops at the gate.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &pool_workload(&ns, "app", 1))
        .await
        .expect("workload");
    let (first, victim) = eventually("a booted machine held at the gate", ACT, || async {
        let list = claims.list(&ListParams::default()).await?.items;
        ensure!(list.len() == 1, "{} claims", list.len());
        let claim = &list[0];
        ensure!(phase(claim) == NodeClaimPhase::Booting, "phase {:?}", claim.status);
        let slot = claim.spec.slot_ref.name.clone();
        let node = nodes.get_opt(&slot).await?.context("not registered yet")?;
        ensure!(homelab_harness::is_ready(&node), "the kubelet is not Ready yet");
        Ok((claim.metadata.name.clone().unwrap_or_default(), slot))
    })
    .await
    .expect("at the gate");
    let victim = machines.iter().map(|(m, _)| m).find(|m| m.name() == victim).expect("machine");
    let boots_before_cut = victim.boots();
    victim.power_cut().await.expect("power cut");

    // The agent clears its taint only on a machine it runs on: one booted after the cut.
    let agent = {
        let (nodes, machines) =
            (nodes.clone(), machines.iter().map(|(m, _)| m.clone()).collect::<Vec<_>>());
        let victim_name = victim.name().to_owned();
        tokio::spawn(async move {
            loop {
                for machine in &machines {
                    let fresh = machine.name() != victim_name || machine.boots() > boots_before_cut;
                    if fresh && machine.power_state().await == PowerState::On {
                        let _ = clear_taint(&nodes, machine.name(), AGENT_TAINT).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    // The claim on the dead machine fails inside its deadline; one machine ends up serving.
    let budget = timeouts().budget();
    eventually("exactly one machine serving the pod", budget + ACT, || async {
        for s in &stranded {
            s.assert_never("a pool machine");
        }
        let failed = claims.get_opt(&first).await?;
        if let Some(claim) = &failed {
            let status = claim.status.clone().unwrap_or_default();
            ensure!(phase(claim) == NodeClaimPhase::Failed, "first claim {:?}", claim.status);
            let (deadline, failed_at) =
                (claim.spec.deadline_at.clone(), status.finished_at.clone());
            if let (Some(deadline), Some(failed_at)) = (deadline, failed_at) {
                assert!(
                    failed_at.0 <= deadline.0,
                    "failed at {failed_at:?} past its deadline {deadline:?}"
                );
            }
        }
        let live: Vec<NodeClaim> = claims
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|c| phase(c) != NodeClaimPhase::Failed && phase(c) != NodeClaimPhase::Completed)
            .collect();
        ensure!(live.len() == 1, "{} live claims", live.len());
        ensure!(phase(&live[0]) == NodeClaimPhase::Ready, "phase {:?}", live[0].status);
        let serving = live[0].spec.slot_ref.name.clone();
        let mut on = Vec::new();
        for (machine, _) in &machines {
            if machine.power_state().await == PowerState::On {
                on.push(machine.name().to_owned());
            }
        }
        ensure!(on == [serving.clone()], "machines on {on:?}, serving {serving}");
        let running = running(&pods, "app").await?;
        ensure!(running.len() == 1 && running[0].1 == serving, "running {running:?}");
        Ok(())
    })
    .await
    .expect("one machine serving");
    // And it stays that way: no second machine for the same pod.
    stays("one machine serving", Duration::from_secs(20), || async {
        let mut on = 0;
        for (machine, _) in &machines {
            on += usize::from(machine.power_state().await == PowerState::On);
        }
        ensure!(on == 1, "{on} machines on");
        Ok(())
    })
    .await
    .expect("stays one");
    agent.abort();
    operator.cancel();
}

/// The taint of the network agent the pool's gate waits for.
const AGENT_TAINT: &str = "homelab.test/agent-not-ready";

/// A machine pinned on, as `homelab-autoscaler keep-on` pins it, has its containerd stopped, as
/// for an upgrade by hand: its kubelet runs on and reports the node NotReady. That is a machine
/// that is on, not one that is off: past a whole boot window (the bound of a silent machine) the
/// pin is still ready, the machine on, never cordoned or shut down, and the slot says since when
/// and why the node is not Ready. With containerd back, the same Node is Ready again under the
/// same pin. (Counting NotReady as off failed the pin `MachineGone` one boot window in, and then
/// drained and powered the machine off mid-maintenance.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_machine_whose_containerd_is_stopped_stays_on_and_claimed() {
    let one = one_machine("real-not-ready", machine_settings()).await;
    let (client, ns, m1) = (one.space.client.clone(), one.space.ns.clone(), &one.m1);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let groups: Api<Group> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    let slot = m1.name().to_owned();

    let mut pin = provider_claim_for("pin", &slot, &slots, &groups, timeouts(), "someone")
        .await
        .expect("claim");
    pin.spec.request.call = ClaimCall::Manual;
    claims.create(&PostParams::default(), &pin).await.expect("create the pin");
    eventually("the pin ready on the real machine", ACT, || async {
        let claim = claims.get("pin").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "phase {:?}", claim.status);
        Ok(())
    })
    .await
    .expect("ready");
    let registered = nodes.get(&slot).await.expect("node");

    m1.stop_containerd().await.expect("stop containerd");
    eventually("the kubelet reporting the node NotReady", ACT, || async {
        let node = nodes.get(&slot).await?;
        ensure!(ready_status(&node) == Some("False"), "Ready={:?}", ready_status(&node));
        Ok(())
    })
    .await
    .expect("not ready");

    // A boot window and a margin for a loaded machine, from the first NotReady the test saw (the
    // operator saw it no later): the bound a silent machine gets passes, and nothing moves.
    let window = timeouts().budget() + Duration::from_secs(30);
    let shutdowns = ListParams::default().labels(&format!("{LABEL_LIFECYCLE}=shutdown"));
    stays("the pinned NotReady machine on and claimed", window, || async {
        stranded.assert_never(&slot);
        ensure!(m1.power_state().await == PowerState::On, "the machine went off");
        let node = nodes.get(&slot).await?;
        ensure!(ready_status(&node) == Some("False"), "Ready={:?}", ready_status(&node));
        ensure!(node.spec.and_then(|s| s.unschedulable) != Some(true), "cordoned");
        let claim = claims.get("pin").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "the pin ended: {:?}", claim.status);
        ensure!(jobs.list(&shutdowns).await?.items.is_empty(), "a shutdown Job was created");
        Ok(())
    })
    .await
    .expect("kept on");
    let slot_obj = slots.get(&slot).await.expect("slot");
    let (reporting, message) = node_reporting(&slot_obj).expect("NodeReporting");
    assert!(reporting, "{message}");
    assert!(message.contains("has not been Ready since"), "{message}");
    assert!(message.contains("kubelet says:"), "{message}");

    // containerd back: the same Node Ready again, under the same pin.
    m1.start_containerd().await.expect("start containerd");
    eventually("the node Ready again under the pin", ACT, || async {
        stranded.assert_never(&slot);
        let node = nodes.get(&slot).await?;
        ensure!(node.metadata.uid == registered.metadata.uid, "the Node was replaced");
        ensure!(ready_status(&node) == Some("True"), "Ready={:?}", ready_status(&node));
        let claim = claims.get("pin").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "the pin ended: {:?}", claim.status);
        let off = claim.status.and_then(|s| s.machine_observed_off);
        ensure!(off.is_none(), "the pin says its machine was observed off at {off:?}");
        Ok(())
    })
    .await
    .expect("ready again");
    assert_eq!(m1.boots(), 1, "booted once, never power-cycled");
    one.operator.cancel();
}

/// How long after a data machine's shutdown the Ceph scenarios' gates are not trusted.
const GATE_SETTLE: Duration = Duration::from_secs(20);
/// The label of a scenario's host kubelet's Node, which the steps that must reach Ceph select.
const ON_HOST: &str = "homelab.test/host-kubelet";

/// A pool of real machines each running one OSD of a real Ceph cluster, and a real Prometheus
/// scraping Ceph's manager. Fields drop in order: the machines' log guards first.
struct CephPool {
    _logs: Vec<MachineLogs>,
    machines: Vec<(Machine, String)>,
    ceph: Arc<Ceph>,
    /// Until the test stops it; its URL stays in the pool's gate.
    prometheus: Option<Prometheus>,
    prometheus_url: String,
    _prometheus_logs: tempfile::TempDir,
}

impl CephPool {
    /// A machine `<ns>-m<i>` for each of three OSDs laid out by `layout` (its hosts are set to
    /// the machines' names), the cluster filled and healthy, and scraped healthy.
    async fn start(space: &TestNamespace, lan: &Lan, layout: Layout) -> CephPool {
        let names: Vec<String> = (1..=3).map(|i| format!("{}-m{i}", space.ns)).collect();
        let layout = Layout { hosts: names.clone(), ..layout };
        let (ceph, osds) = Ceph::for_machines(&layout).await.expect("a Ceph cluster");
        let mut machines = Vec::new();
        for (name, osd) in names.iter().zip(osds) {
            let spec = MachineSpec { services: vec![osd], ..MachineSpec::named(name) };
            let (machine, key) = pool_machine(space.plane, lan, spec).await.expect("machine");
            machine.power_on().await.expect("power on");
            machines.push((machine, key));
        }
        let logs = machines.iter().map(|(m, _)| m.logs_on_failure()).collect();
        ceph.fill().await.expect("Ceph healthy with its OSDs on the machines");
        let prometheus_logs = tempfile::tempdir().expect("logs");
        let prometheus =
            Prometheus::start(std::slice::from_ref(&ceph.metrics_addr), prometheus_logs.path())
                .await
                .expect("prometheus");
        eventually("Prometheus to have scraped a healthy Ceph", ACT, || async {
            ensure!(!prometheus.query("ceph_health_status == 0").await?.is_empty(), "not yet");
            Ok(())
        })
        .await
        .expect("scraped");
        CephPool {
            _logs: logs,
            machines,
            ceph: Arc::new(ceph),
            prometheus_url: prometheus.url(),
            prometheus: Some(prometheus),
            _prometheus_logs: prometheus_logs,
        }
    }

    /// Stops the pool's Prometheus: its gate can no longer be read.
    fn stop_prometheus(&mut self) {
        self.prometheus = None;
    }

    fn names(&self) -> Vec<String> {
        self.machines.iter().map(|(m, _)| m.name().to_owned()).collect()
    }

    fn machine(&self, slot: &str) -> Option<&Machine> {
        self.machines.iter().find(|(m, _)| m.name() == slot).map(|(m, _)| m)
    }

    /// Applies the pool with kubectl, gated on Ceph's health (its own words explaining a hold),
    /// with `more` of the Group's spec.
    async fn apply(&self, space: &TestNamespace, more: &str) {
        let gates = format!(
            r#"  powerOffGateSettle: {}s
  powerOffGates:
  - name: ceph
    prometheus:
      url: "{}"
      query: ceph_health_status == 0
      explain: ceph_health_detail == 1
{more}"#,
            GATE_SETTLE.as_secs(),
            self.prometheus_url
        );
        let pool: Vec<(&Machine, &str)> =
            self.machines.iter().map(|(m, k)| (m, k.as_str())).collect();
        apply_pool_with(space.plane, &space.ns, None, &pool, &gates).await.expect("pool");
    }

    /// Waits for the first machine to be shut down and off: its slot.
    async fn first_off(&self, space: &TestNamespace) -> String {
        let first = eventually("the first OSD machine's shutdown", ACT, || async {
            let jobs = shutdowns(space).await?;
            ensure!(!jobs.is_empty(), "no shutdown Job yet");
            Ok(jobs)
        })
        .await
        .expect("a shutdown");
        assert_eq!(first.len(), 1, "one OSD machine at a time, not {first:?}");
        let first = first[0].0.clone();
        let machine = self.machine(&first).expect("a machine of the pool");
        until_off(machine, "the first machine off").await;
        first
    }
}

/// Waits for `machine` to be off (`what` names the wait), failing the test after [`ACT`].
async fn until_off(machine: &Machine, what: &str) {
    eventually(what, ACT, || async {
        let state = machine.power_state().await;
        ensure!(state == PowerState::Off, "{state:?}");
        Ok(())
    })
    .await
    .expect("off");
}

/// The slots whose shutdown Jobs exist in the scenario's namespace, with when each was made.
async fn shutdowns(space: &TestNamespace) -> Result<Vec<(String, jiff::Timestamp)>> {
    let jobs: Api<Job> = Api::namespaced(space.client.clone(), &space.ns);
    let params = ListParams::default().labels(&format!("{LABEL_LIFECYCLE}=shutdown"));
    Ok(jobs
        .list(&params)
        .await?
        .items
        .iter()
        .map(|j| {
            let slot = j.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SLOT));
            let created = j.metadata.creation_timestamp.as_ref().map(|t| t.0);
            (slot.cloned().unwrap_or_default(), created.unwrap_or_default())
        })
        .collect())
}

/// What holds a slot's power-off, and what its condition says.
async fn held(space: &TestNamespace, slot: &str) -> Result<(String, String)> {
    let slots: Api<Node> = Api::namespaced(space.client.clone(), &space.ns);
    let (by, _, message) = power_off_hold(&slots.get(slot).await?).context("not held")?;
    Ok((by, message))
}

/// Fails if the scenario's namespace ever has other than `count` shutdown Jobs for `duration`.
async fn shutdowns_stay(space: &TestNamespace, count: usize, what: &str, duration: Duration) {
    stays(what, duration, || async {
        let jobs = shutdowns(space).await?;
        ensure!(jobs.len() == count, "shutdowns: {jobs:?}");
        Ok(())
    })
    .await
    .expect("held on");
}

/// A real Ceph cluster on the real machines: the monitor and manager on the test host, one OSD
/// on each of three pool machines, run by the machine (in its cgroup, started at every boot), so
/// that powering the machine off (an SSH shutdown from a power Job on the hub) takes its OSD
/// down; each object on three OSDs, served while two are up; the pool gated on Ceph's health as
/// the manager exports it to a real Prometheus. No demand: the first machine goes off; Ceph
/// reports the OSD down, and the other two are held on, quoting Ceph's own health checks, past
/// the settle. The first machine claimed back (Wake-on-LAN), its OSD starts with it, Ceph is
/// healthy again, and a second machine goes; the third is held again. Prometheus stopped and the
/// second machine back, Ceph is healthy, yet the third stays on, saying its gate cannot be read.
/// Sampled every second: never two OSDs down at once, no placement group inactive for longer
/// than peering takes. Without the pool's gates, all three go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ceph_osd_machines_go_off_one_at_a_time_and_only_while_ceph_is_healthy() {
    let (space, lan, hub) = scenario("ceph").await;
    let _hub_logs = hub.logs_on_failure();
    let mut pool = CephPool::start(&space, &lan, Layout::replicated_three_ways(3)).await;
    let ceph = pool.ceph.clone();
    // Every second: how many OSDs are up, and the placement groups' states.
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = {
        let (ceph, samples) = (ceph.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                if let (Ok((up, _)), Ok(status)) =
                    (ceph.osds_up_and_in().await, ceph.status().await)
                {
                    samples.lock().unwrap().push((jiff::Timestamp::now(), up, status));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(space.plane, &space.ns, &image, machine_settings()).await;
    pool.apply(&space, "").await;

    let first = pool.first_off(&space).await;
    let names = pool.names();
    for slot in names.iter().filter(|n| **n != first) {
        let (_, message) = eventually("held by Ceph's health", ACT, || async {
            let (by, message) = held(&space, slot).await?;
            ensure!(by == "ceph" && message.contains("OSD_DOWN"), "held by {by}: {message}");
            Ok((by, message))
        })
        .await
        .expect("held by ceph");
        let quoted = "the query ceph_health_status == 0 returned no sample";
        assert!(message.contains(quoted), "{message}");
    }
    let settle = GATE_SETTLE + Duration::from_secs(10);
    shutdowns_stay(&space, 1, "the other two on while Ceph is degraded", settle).await;

    // The first machine comes back: its OSD starts with it, Ceph heals, and one more may go.
    claim_ready(&space.client, &space.ns, "back", &first).await;
    let second = eventually("a second OSD machine off once Ceph is healthy again", ACT * 2, || {
        let (pool, space, first) = (&pool, &space, &first);
        async move {
            let jobs = shutdowns(space).await?;
            let second = jobs.iter().find(|j| j.0 != *first).context("no second shutdown yet")?;
            let state = pool.machine(&second.0).context("a pool machine")?.power_state().await;
            ensure!(state == PowerState::Off, "{} is {state:?}", second.0);
            Ok(second.0.clone())
        }
    })
    .await
    .expect("a second off");
    let third = names.iter().find(|n| **n != first && **n != second).expect("the third");
    eventually("the third held again", ACT, || async {
        let (_, message) = held(&space, third).await?;
        ensure!(message.contains("OSD_DOWN"), "{message}");
        Ok(())
    })
    .await
    .expect("the third held");

    // Prometheus goes away, and the second machine comes back: Ceph is healthy, but no machine
    // of the pool goes off while its gate cannot be read, and the third says why.
    pool.stop_prometheus();
    claim_ready(&space.client, &space.ns, "back-again", &second).await;
    ceph.until_healthy(ACT).await.expect("Ceph healthy with three OSDs");
    eventually("the third held by the unreadable gate", ACT, || async {
        let (by, message) = held(&space, third).await?;
        let unread =
            format!("could not be read: Prometheus at {} did not answer", pool.prometheus_url);
        ensure!(by == "ceph" && message.contains(&unread), "held by {by}: {message}");
        Ok(())
    })
    .await
    .expect("held by the unreadable gate");
    shutdowns_stay(&space, 2, "every machine on while the gate cannot be read", GATE_SETTLE).await;

    sampler.abort();
    operator.cancel();
    let samples = samples.lock().unwrap().clone();
    assert!(samples.len() > 30, "{} samples", samples.len());
    let fewest = samples.iter().map(|s| s.1).min().unwrap_or(0);
    assert_eq!(fewest, 2, "OSDs up at the worst moment (never two down at once)");
    let statuses: Vec<_> = samples.into_iter().map(|(at, _, status)| (at, status)).collect();
    if let Some((lasted, at, status)) = longest_inactive(&statuses) {
        assert!(lasted.as_secs() < 15, "placement groups inactive {lasted:#} at {at}: {status:?}");
    }
}

/// Ceph's `noout` around a real power-off, set and cleared by the pool's maintenance steps as
/// docs/operations.md's recipe writes them. The steps run on a host kubelet (their `ceph`
/// commands must reach the test's cluster; no image of Ceph's is served here); the OSDs run on
/// the machines. Each object on two of three OSDs, and a monitor that marks an OSD out 10 s
/// after it went down (Ceph's default is 10 minutes): without the flag, the OSD of a machine
/// that is off is marked out and its objects are copied to the others (seen: out 15 s after its
/// machine went off). With it, the first machine goes off with its CRUSH host flagged `noout`;
/// for 40 s no OSD is marked out, no placement group is remapped, backfilling or recovering, and
/// no object has been recovered since before the power-off; back and Ready, the step after
/// clears the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noout_step_keeps_ceph_from_moving_data_while_its_machine_is_off() {
    let (space, lan, hub) = scenario("noout").await;
    let _hub_logs = hub.logs_on_failure();
    let layout = Layout {
        hosts: Vec::new(),
        size: 2,
        min_size: 1,
        down_out_after: Some(Duration::from_secs(10)),
    };
    let pool = CephPool::start(&space, &lan, layout).await;
    let ceph = pool.ceph.clone();
    let host = format!("{}-host", space.ns);
    let on_host = std::collections::BTreeMap::from([(ON_HOST.to_owned(), space.ns.clone())]);
    let conf = ceph.conf().display().to_string();
    let kubelet =
        HostKubelet::start(space.client.clone(), &host, on_host, vec![("CEPH_CONF".into(), conf)])
            .await
            .expect("host kubelet");
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(space.plane, &space.ns, &image, machine_settings()).await;
    let step = |what: &str| {
        format!(
            r#"      image: quay.io/ceph/ceph:v16
      command: [sh, -c, 'ceph osd {what} noout "$HOMELAB_NODE_NAME"']
      nodeSelector: {{ "{ON_HOST}": "{ns}" }}
      backoffLimit: 0"#,
            ns = space.ns
        )
    };
    let steps = format!(
        "  maintenance:\n    beforePowerOff:\n{}\n    afterReady:\n{}",
        step("set-group"),
        step("unset-group")
    );
    let recovered = ceph.objects_recovered().await.expect("recovered");
    pool.apply(&space, &steps).await;

    let first = pool.first_off(&space).await;
    let flags = ceph.host_flags(&first).await.expect("flags");
    assert_eq!(flags, ["noout"], "the step before flagged the machine's host");
    let went_down = std::sync::atomic::AtomicBool::new(false);
    let watched = Duration::from_secs(40);
    stays("no OSD out, no object moved, while the machine is off", watched, || {
        let (ceph, went_down) = (ceph.clone(), &went_down);
        async move {
            let (up, r#in) = ceph.osds_up_and_in().await?;
            if up == 2 {
                went_down.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            ensure!(r#in == 3, "{} OSDs in, {up} up", r#in);
            let status = ceph.status().await?;
            ensure!(status.moving == 0, "placement groups moving data: {status:?}");
            let now = ceph.objects_recovered().await?;
            ensure!(now == recovered, "objects recovered or backfilled: {recovered}, now {now}");
            Ok(())
        }
    })
    .await
    .expect("no data movement");
    assert!(went_down.load(std::sync::atomic::Ordering::SeqCst), "its OSD never went down");
    assert_eq!(shutdowns(&space).await.expect("shutdowns").len(), 1, "one machine at a time");

    claim_ready(&space.client, &space.ns, "back", &first).await;
    let jobs: Api<Job> = Api::namespaced(space.client.clone(), &space.ns);
    eventually("the step after run, and the flag cleared", ACT, || async {
        let params = ListParams::default().labels(&format!("{LABEL_LIFECYCLE}=after-ready"));
        let after = jobs.list(&params).await?.items;
        let done =
            after.iter().any(|j| j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0);
        ensure!(done, "the step after has not succeeded: {}", after.len());
        let flags = ceph.host_flags(&first).await?;
        ensure!(flags.is_empty(), "{first} still flagged {flags:?}");
        Ok(())
    })
    .await
    .expect("noout cleared");
    operator.cancel();
    kubelet.remove().await.expect("host kubelet removed");
}

/// A workload of one pod of the pause image asking for one device of Kubernetes' sample device
/// plugin, on the machines of the pool in `ns`.
fn device_workload(ns: &str, name: &str) -> Deployment {
    let mut workload = pool_workload(ns, name, 1);
    let pod = workload.spec.template.spec.as_mut().expect("pod spec");
    let limits = [(SAMPLE_DEVICE_RESOURCE.to_owned(), Quantity("1".to_owned()))];
    pod.containers[0].resources =
        Some(ResourceRequirements { limits: Some(limits.into()), ..Default::default() });
    workload
}

/// A machine with a device, as a GPU box is: at every boot it runs Kubernetes' sample device
/// plugin, which registers two devices of `example.com/resource` with its real kubelet through
/// the kubelet's device-plugin socket. Its slot declares them and costs ten times the other
/// machine of the pool. A pod that asks for a device wakes that machine and never the cheaper
/// one, and the kubelet gives the pod a device: the pod's status names it, and the container is
/// made with the device file the plugin's allocation mounts. Released, the machine goes off; a
/// second device pod wakes it again, the plugin registers with the new boot's kubelet, and the
/// pod gets a device again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_asking_for_a_device_wakes_the_machine_whose_device_plugin_serves_it() {
    let (space, lan, hub) = scenario("device").await;
    let _hub_logs = hub.logs_on_failure();
    let plain = MachineSpec::named(&format!("{}-m1", space.ns));
    let with_device = MachineSpec {
        sample_device_plugin: true,
        ..MachineSpec::named(&format!("{}-m2", space.ns))
    };
    let (m1, key1) = pool_machine(space.plane, &lan, plain).await.expect("machine m1");
    let (m2, key2) = pool_machine(space.plane, &lan, with_device).await.expect("machine m2");
    let (_m1_logs, _m2_logs) = (m1.logs_on_failure(), m2.logs_on_failure());
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(space.plane, &space.ns, &image, machine_settings()).await;
    let config = ScalerConfig {
        interval: Duration::from_secs(2),
        timeouts: timeouts(),
        ..ScalerConfig::new(space.ns.clone())
    };
    tokio::spawn(scaler::run(space.client.clone(), config, operator.child_token()));
    let devices = format!(
        "  nodeCapacity: {{ \"{SAMPLE_DEVICE_RESOURCE}\": \"2\" }}\n  pricing: {{ hourlyRate: 0.10 }}"
    );
    let slots = [(&m1, key1.as_str(), "  pricing: { hourlyRate: 0.01 }"), (&m2, &key2, &devices)];
    apply_pool_of(space.plane, &space.ns, None, &slots, "  builtin: { hold: 10s }")
        .await
        .expect("pool");
    let deployments: Api<Deployment> = Api::namespaced(space.client.clone(), &space.ns);
    let pods: Api<Pod> = Api::namespaced(space.client.clone(), &space.ns);
    let nodes: Api<CoreNode> = Api::all(space.client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(space.client.clone(), &space.ns);
    let slots: Api<Node> = Api::namespaced(space.client.clone(), &space.ns);
    let stranded = Stranding::watch(m2.clone(), nodes.clone());

    for (boot, app) in [(1, "first"), (2, "second")] {
        let workload = device_workload(&space.ns, app);
        deployments.create(&PostParams::default(), &workload).await.expect("workload");
        let device = eventually("the device pod running with its device", ACT, || {
            device_given(&pods, app, &m2)
        })
        .await
        .expect("a device");
        assert_eq!(m2.boots(), boot, "the machine with the device, booted for the pod");
        assert_eq!(m1.boots(), 0, "the cheaper machine without a device stays off");
        let claims = claims.list(&ListParams::default()).await.expect("claims").items;
        let asked = format!("the {SAMPLE_DEVICE_RESOURCE}: 1 it asks for");
        let reasons: Vec<&str> =
            claims.iter().filter_map(|c| c.spec.request.reason.as_deref()).collect();
        assert!(reasons.iter().any(|r| r.contains(&asked)), "the claim says why: {reasons:?}");
        let node = nodes.get(m2.name()).await.expect("the node");
        let status = node.status.unwrap_or_default();
        for (what, resources) in
            [("capacity", status.capacity), ("allocatable", status.allocatable)]
        {
            let amount = resources.unwrap_or_default().get(SAMPLE_DEVICE_RESOURCE).cloned();
            assert_eq!(amount, Some(Quantity("2".into())), "{what}: the plugin's two devices");
        }
        eventually("the slot's capacity matching its node", ACT, || async {
            let slot = slots.get(m2.name()).await?;
            let (ok, message) = condition(&slot, "CapacityMatches").context("no condition yet")?;
            ensure!(ok, "{message}");
            Ok(())
        })
        .await
        .expect("capacity matches");
        eprintln!("boot {boot}: the pod got device {device}");

        deployments.delete(app, &DeleteParams::default()).await.expect("delete the workload");
        until_off(&m2, "the machine with the device off once released").await;
    }
    operator.cancel();
    stranded.assert_never(m2.name());
}

/// The device the pod of workload `app` got on `machine`: its status names one of the sample
/// plugin's devices, and its container was made with that device's file mounted, as the
/// plugin's allocation said.
async fn device_given(pods: &Api<Pod>, app: &str, machine: &Machine) -> Result<String> {
    let listed = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?.items;
    let pod = listed.first().context("no pod yet")?;
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    ensure!(node == machine.name(), "on {node:?}");
    let status = pod.status.clone().unwrap_or_default();
    ensure!(status.phase.as_deref() == Some("Running"), "phase {:?}", status.phase);
    let container = status.container_statuses.unwrap_or_default().into_iter().next();
    let container = container.context("no container status")?;
    let given: Vec<String> = container
        .allocated_resources_status
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.name == SAMPLE_DEVICE_RESOURCE)
        .flat_map(|r| r.resources.unwrap_or_default())
        .map(|r| r.resource_id)
        .collect();
    let [device] = given.as_slice() else { anyhow::bail!("devices in the status: {given:?}") };
    ensure!(SAMPLE_DEVICES.contains(&device.as_str()), "device {device}");
    let id = container.container_id.unwrap_or_default();
    let id = id.strip_prefix("containerd://").context("a containerd container id")?;
    let info = machine.ctr(&["containers", "info", id]).await?;
    ensure!(info.status.success(), "ctr: {}", String::from_utf8_lossy(&info.stderr));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout)?;
    let mounts = info["Spec"]["mounts"].as_array().cloned().unwrap_or_default();
    let file = format!("/tmp/{device}");
    ensure!(
        mounts.iter().any(|m| m["destination"] == file.as_str() && m["source"] == file.as_str()),
        "no mount of {file} in the container: {mounts:?}"
    );
    Ok(device.clone())
}
