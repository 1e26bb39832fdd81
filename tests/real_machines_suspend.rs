//! Machines that sleep instead of powering off (`spec.power.suspend`), on real machines
//! (homelab_harness::machine): a real kubelet and containerd in a network namespace each, whose
//! suspend-to-RAM is what a sleeping computer looks like from outside (every process frozen by
//! the cgroup freezer, its address answering nothing, its card still listening for the magic
//! packet). The power Jobs run the operator's image on the hub and reach the machines by the
//! real protocols: `systemctl suspend` and `poweroff` over SSH, a Wake-on-LAN packet to wake.
//! Nothing here presses a machine's buttons, except the firmware setting of the scenario whose
//! suspend does not take.
//!
//! Scenarios: the built-in scaler puts an idle machine to sleep and wakes it for a pending pod,
//! on the same Node, timed against the same machine's cold boot in the same run; a suspend that
//! does not take is retried and never counted as off; a machine asleep past its slot's limit is
//! woken and powered off, and its Node then goes; a metered machine counts as asleep once its
//! plug reads the draw of sleep, and one that hangs on its way to sleep (silent, still drawing)
//! never does.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).

use std::fmt;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{
    CONDITION_SUSPENDED, LABEL_LIFECYCLE, Node, NodeClaim, NodeClaimPhase, ObservedPower,
};
use homelab_autoscaler::controller::jobs::{JOB_NAME_LABEL, failure_detail};
use homelab_autoscaler::scaler::{self, ScalerConfig};
use homelab_harness::machine::plug::SUSPENDED_WATTS;
use homelab_harness::machine::{Lan, Machine, MachineLogs, MachineSpec, Plug, PowerCause};
use homelab_harness::real_lab::{
    ACT, HUB_ROLE, POOL_LABEL, Stranding, claim_ready, machine_settings, operator_image,
    pool_machine, pool_workload, release, scenario, secret, start_operator, timeouts,
    wake_and_ssh_power,
};
use homelab_harness::slots::event_reasons;
use homelab_harness::timeline::{Seen, Timeline, Watches, between};
use homelab_harness::{ControlPlane, TestNamespace, eventually, ready_status, stays};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Straight to stderr, past the test's output capture: timings worth seeing on a passing run.
fn report(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "[suspend] {message}");
}

/// What the slot's suspend says: `systemctl suspend` over SSH, silent for 3 s to count.
fn sleeping_power(
    machine: &Machine,
    key_secret: &str,
    ns: &str,
    sleep: &Sleep,
) -> Result<serde_json::Value> {
    let mut power = wake_and_ssh_power(machine, key_secret, json!({ HUB_ROLE: ns }))?;
    let mut suspend = json!({ "command": "systemctl suspend", "quietSeconds": 3, "watts": 1.5 });
    if let Some(minutes) = sleep.power_off_after_minutes {
        suspend["powerOffAfterMinutes"] = json!(minutes);
    }
    if let Some(plug) = &sleep.metered_by {
        let meter = format!("{plug}/rpc/Switch.GetStatus?id=0");
        power["http"] =
            json!({ "meter": { "request": { "url": meter }, "wattsPointer": "/apower" } });
    }
    power["suspend"] = suspend;
    power["confirmTimeoutSeconds"] = json!(20);
    Ok(power)
}

/// How a slot sleeps, beyond the suspend every scenario gives it.
#[derive(Default)]
struct Sleep {
    power_off_after_minutes: Option<u32>,
    /// The base URL of a plug that meters the machine (its draw must fall with the suspend).
    metered_by: Option<String>,
}

/// Group `lan` (`group_spec`: more of its spec, indented by two) and one slot for `machine`
/// whose machine sleeps when idle, applied with kubectl as a user does.
async fn apply_sleeping_pool(
    plane: &ControlPlane,
    ns: &str,
    machine: &Machine,
    key: &str,
    sleep: Sleep,
    group_spec: &str,
) -> Result<()> {
    let key_secret = format!("{}-ssh", machine.name());
    let power = sleeping_power(machine, &key_secret, ns, &sleep)?;
    let manifest = format!(
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata:
  name: lan
spec:
  driver: builtin
  nodeReadinessTaints: []
{group_spec}
---
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
"#,
        secret = secret(&key_secret, "ssh-privatekey", key),
        name = machine.name(),
    );
    let output = plane.kubectl_apply(ns, &manifest).await?;
    ensure!(output.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// One machine whose slot sleeps, the hub, and the operator. Fields drop in order: the log
/// guards first, while the machines and the lan still exist.
struct Sleeper {
    _m1_logs: MachineLogs,
    _hub_logs: MachineLogs,
    m1: Machine,
    key: String,
    operator: CancellationToken,
    _hub: Machine,
    lan: Lan,
    space: TestNamespace,
}

async fn sleeper(prefix: &str) -> Sleeper {
    let (space, lan, hub) = scenario(prefix).await;
    let hub_logs = hub.logs_on_failure();
    let spec = MachineSpec::named(&format!("{}-m1", space.ns));
    let (m1, key) = pool_machine(space.plane, &lan, spec).await.expect("machine");
    let m1_logs = m1.logs_on_failure();
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(space.plane, &space.ns, &image, machine_settings()).await;
    Sleeper { _m1_logs: m1_logs, _hub_logs: hub_logs, m1, key, operator, _hub: hub, lan, space }
}

/// Where the time from "pod pending" to "pod Running" went in one scale-up of one machine,
/// from the test's watches (millisecond resolution).
#[derive(Clone, Copy, Debug)]
struct Steps {
    /// The pod created to its claim created: the built-in scaler's decision.
    decided: Duration,
    /// The claim to its startup Job created.
    claim_to_job: Duration,
    /// The startup Job created to complete: the magic packet sent from the hub.
    job: Duration,
    /// The Job complete to the node Ready: the machine booting (containerd, the kubelet, its
    /// registration) or resuming (its kubelet reporting again); zero if it was Ready first.
    machine: Duration,
    /// The node Ready (or the Job complete, if later) to the claim ready: the readiness gate
    /// (and, for a resume, the sleep's mark lifted).
    gate: Duration,
    /// The claim ready to the pod Running: the scheduler and the kubelet.
    pod: Duration,
    total: Duration,
}

impl fmt::Display for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: Duration| format!("{:.1}s", d.as_secs_f64());
        write!(
            f,
            "total {} = decided {} + claim→Job {} + Job {} + machine {} + gate {} + pod {}",
            s(self.total),
            s(self.decided),
            s(self.claim_to_job),
            s(self.job),
            s(self.machine),
            s(self.gate),
            s(self.pod)
        )
    }
}

/// Everything a scale-up's steps are read from.
struct Watched {
    timeline: Timeline,
    _watches: Watches,
}

impl Watched {
    fn start(client: &kube::Client, ns: &str) -> Self {
        let timeline = Timeline::default();
        let watches = timeline
            .watch_claims(client, ns)
            .and(timeline.watch_jobs_and_nodes(client, ns, vec![]))
            .and(timeline.watch_pods(client, ns));
        Self { timeline, _watches: watches }
    }

    /// Creates workload `app` and waits until its pod runs on `machine`; returns its steps.
    async fn scale_up(&self, space: &TestNamespace, machine: &Machine, app: &str) -> Steps {
        let deployments: Api<Deployment> = Api::namespaced(space.client.clone(), &space.ns);
        let pods: Api<Pod> = Api::namespaced(space.client.clone(), &space.ns);
        let asked = Instant::now();
        deployments
            .create(&PostParams::default(), &pool_workload(&space.ns, app, 1))
            .await
            .expect("app");
        let pod =
            eventually(&format!("the pod of {app} Running on {}", machine.name()), ACT, || {
                let pods = pods.clone();
                async move {
                    let listed =
                        pods.list(&ListParams::default().labels(&format!("app={app}"))).await?;
                    let pod = listed.items.into_iter().next().context("no pod yet")?;
                    let status = pod.status.clone().unwrap_or_default();
                    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                    ensure!(status.phase.as_deref() == Some("Running"), "phase {:?}", status.phase);
                    ensure!(node.as_deref() == Some(machine.name()), "on {node:?}");
                    Ok(pod.name_any())
                }
            })
            .await
            .expect("the pod running");
        let t = &self.timeline;
        let wait = |seen: Seen, name: String| async move {
            t.wait_of(seen, &name, asked, ACT).await.expect("a sighting")
        };
        let (_, claim) = t.wait_since(Seen::ClaimCreated, asked, ACT).await.expect("a claim");
        let created = t.at(Seen::PodCreated, &pod).unwrap_or(asked).max(asked);
        let claimed = wait(Seen::ClaimCreated, claim.clone()).await;
        let job = wait(Seen::StartupJobCreated, claim.clone()).await;
        let job_done = wait(Seen::StartupJobComplete, claim.clone()).await;
        let node_ready = wait(Seen::NodeReady, machine.name().to_owned()).await;
        let ready = wait(Seen::ClaimPhase(NodeClaimPhase::Ready), claim.clone()).await;
        let running = wait(Seen::PodRunning, pod).await;
        Steps {
            decided: between(created, claimed),
            claim_to_job: between(claimed, job),
            job: between(job, job_done),
            machine: between(job_done, node_ready),
            // The gate cannot pass before the Job is complete, even if the node was Ready first.
            gate: between(node_ready.max(job_done), ready),
            pod: between(ready, running),
            total: between(created, running),
        }
    }
}

/// The node's `Suspended` condition's status, if it has one.
fn suspended_condition(node: &CoreNode) -> Option<String> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == CONDITION_SUSPENDED).map(|c| c.status.clone())
}

/// Waits until `machine` sleeps: frozen by its firmware, its Node kept with `Suspended=True`,
/// its slot reporting it suspended.
async fn until_asleep(space: &TestNamespace, machine: &Machine) {
    let nodes: Api<CoreNode> = Api::all(space.client.clone());
    let slots: Api<Node> = Api::namespaced(space.client.clone(), &space.ns);
    eventually(&format!("{} asleep, its Node marked", machine.name()), ACT, || async {
        ensure!(machine.suspended(), "the machine is not suspended");
        let node = nodes.get(machine.name()).await?;
        ensure!(
            suspended_condition(&node).as_deref() == Some("True"),
            "Suspended={:?}",
            suspended_condition(&node)
        );
        let slot = slots.get(machine.name()).await?;
        let power = slot.status.and_then(|s| s.power_state);
        ensure!(power == Some(ObservedPower::Suspended), "the slot says {power:?}");
        Ok(())
    })
    .await
    .expect("asleep");
}

/// The built-in scaler boots an off machine for a pod (a cold boot), puts it to sleep once the
/// pod is gone, and wakes it for the next pod. The machine sleeps as a suspended computer does:
/// its processes frozen, its Node kept (the same uid) and marked `Suspended`, its slot reporting
/// it suspended, and it never powers off. Woken by a magic packet, its kubelet reports on the
/// same Node, with no second boot and no re-registration; the gate lifts the cordon. Both
/// scale-ups are timed by step, in the same run, on the same machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_scaler_puts_an_idle_machine_to_sleep_and_wakes_it_for_a_pod() {
    let run = sleeper("sleep").await;
    let (space, m1) = (&run.space, &run.m1);
    let config = ScalerConfig {
        interval: Duration::from_secs(2),
        timeouts: timeouts(),
        ..ScalerConfig::new(space.ns.clone())
    };
    tokio::spawn(scaler::run(space.client.clone(), config, run.operator.child_token()));
    let watched = Watched::start(&space.client, &space.ns);
    apply_sleeping_pool(
        space.plane,
        &space.ns,
        m1,
        &run.key,
        Sleep::default(),
        "  builtin: { hold: 5s }",
    )
    .await
    .expect("pool");
    let nodes: Api<CoreNode> = Api::all(space.client.clone());
    let stranded = Stranding::watch(m1.clone(), nodes.clone());

    let cold = watched.scale_up(space, m1, "first").await;
    assert_eq!((m1.boots(), m1.wakes()), (1, 1), "a cold boot by one magic packet");
    let uid = nodes.get(m1.name()).await.expect("the node").uid();

    let deployments: Api<Deployment> = Api::namespaced(space.client.clone(), &space.ns);
    deployments.delete("first", &DeleteParams::default()).await.expect("delete the workload");
    until_asleep(space, m1).await;
    let node = nodes.get(m1.name()).await.expect("the node kept");
    assert_eq!(node.uid(), uid, "the same Node");
    assert!(node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true), "cordoned asleep");
    let slept_at = Instant::now();
    let history = m1.power_history();
    assert!(
        !history.iter().any(|e| matches!(e.cause, PowerCause::Shutdown | PowerCause::PowerCut)),
        "slept, never powered off: {history:?}"
    );
    let claims: Api<NodeClaim> = Api::namespaced(space.client.clone(), &space.ns);
    eventually("the first claim completed", ACT, || async {
        let listed = claims.list(&ListParams::default()).await?.items;
        let live: Vec<_> = listed
            .iter()
            .filter(|c| {
                !matches!(
                    homelab_harness::claims::phase(c),
                    NodeClaimPhase::Completed | NodeClaimPhase::Failed
                )
            })
            .map(|c| c.name_any())
            .collect();
        ensure!(live.is_empty(), "live claims: {live:?}");
        Ok(())
    })
    .await
    .expect("the claim released");

    let resumed = watched.scale_up(space, m1, "second").await;
    assert_eq!(m1.boots(), 1, "woken from sleep, not booted again");
    assert!(m1.wakes() >= 2, "woken by a magic packet: {} packets", m1.wakes());
    assert!(!m1.suspended(), "awake");
    let node = nodes.get(m1.name()).await.expect("the node");
    assert_eq!(node.uid(), uid, "the kubelet reports on the same Node");
    assert_eq!(suspended_condition(&node).as_deref(), Some("False"), "the mark lifted");
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true), "uncordoned");
    let woke = m1
        .power_history()
        .into_iter()
        .find(|e| e.cause == PowerCause::Resume && e.at >= slept_at)
        .expect("a resume in the history");
    report(&format!("{}: cold boot: {cold}", m1.name()));
    report(&format!(
        "{}: resumed:   {resumed} (woken {:.1?} after the test saw it asleep)",
        m1.name(),
        woke.at.saturating_duration_since(slept_at)
    ));
    report(&format!(
        "resumed/cold: {:.2} of the time to the pod Running",
        resumed.total.as_secs_f64() / cold.total.as_secs_f64().max(0.001)
    ));
    run.operator.cancel();
    stranded.assert_never(m1.name());
}

/// The termination message of every failed shutdown Job's pods, once one has said anything.
async fn failed_suspend_messages(space: &TestNamespace) -> Result<Vec<String>> {
    let jobs: Api<Job> = Api::namespaced(space.client.clone(), &space.ns);
    let selector = format!("{LABEL_LIFECYCLE}=shutdown");
    let listed = jobs.list(&ListParams::default().labels(&selector)).await?.items;
    let failed: Vec<&Job> = listed
        .iter()
        .filter(|j| j.status.as_ref().and_then(|s| s.failed).unwrap_or(0) > 0)
        .collect();
    ensure!(!failed.is_empty(), "no failed shutdown Job among {}", listed.len());
    let pods: Api<Pod> = Api::namespaced(space.client.clone(), &space.ns);
    let mut messages = Vec::new();
    for job in failed {
        let selector = format!("{JOB_NAME_LABEL}={}", job.name_any());
        let listed = pods.list(&ListParams::default().labels(&selector)).await?.items;
        messages.extend(failure_detail(&listed));
    }
    ensure!(!messages.is_empty(), "no termination message yet");
    Ok(messages)
}

/// Waits until a failed shutdown Job says `says`; returns its message.
async fn failed_suspend_saying(space: &TestNamespace, says: &str) -> String {
    eventually(&format!("a suspend Job failed saying {says:?}"), ACT, || async {
        let messages = failed_suspend_messages(space).await?;
        let found = messages.iter().find(|m| m.contains(says));
        found.cloned().with_context(|| format!("the failed Jobs say {messages:?}"))
    })
    .await
    .expect("a failed suspend")
}

/// A machine whose firmware refuses to sleep: `systemctl suspend` exits 0 and the machine goes
/// on answering. The suspend Job fails, saying the suspend did not take; the machine is never
/// counted as off (its claim keeps it, its Node stays Ready and unmarked), and the shutdown
/// path tries again. Once the firmware lets it, a later attempt puts it to sleep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_that_does_not_take_is_retried_and_never_counted_as_off() {
    let run = sleeper("nosleep").await;
    let (space, m1) = (&run.space, &run.m1);
    apply_sleeping_pool(space.plane, &space.ns, m1, &run.key, Sleep::default(), "")
        .await
        .expect("pool");
    claim_ready(&space.client, &space.ns, "wanted", m1.name()).await;
    m1.refuse_suspend(true);

    let claims: Api<NodeClaim> = Api::namespaced(space.client.clone(), &space.ns);
    release(&claims, "wanted").await;

    let message = failed_suspend_saying(space, "the suspend did not take").await;
    assert!(m1.suspend_requests() >= 1, "the machine was asked to sleep");
    let nodes: Api<CoreNode> = Api::all(space.client.clone());
    stays(
        "the machine awake, claimed, its Node Ready and unmarked",
        Duration::from_secs(20),
        || async {
            ensure!(!m1.suspended(), "the machine sleeps");
            let claim = claims.get("wanted").await.context("the claim is gone")?;
            let phase = homelab_harness::claims::phase(&claim);
            ensure!(phase == NodeClaimPhase::Ready, "the claim is {phase:?}");
            let node = nodes.get(m1.name()).await?;
            ensure!(ready_status(&node) == Some("True"), "Ready={:?}", ready_status(&node));
            ensure!(suspended_condition(&node).as_deref() != Some("True"), "marked asleep");
            Ok(())
        },
    )
    .await
    .expect("never counted as off");
    let reasons = event_reasons(&space.client, &space.ns, m1.name()).await.expect("events");
    report(&format!("a suspend that did not take: {message}; slot events {reasons:?}"));

    m1.refuse_suspend(false);
    until_asleep(space, m1).await;
    eventually("the claim released once the machine sleeps", ACT, || async {
        ensure!(claims.get_opt("wanted").await?.is_none(), "the claim is still there");
        Ok(())
    })
    .await
    .expect("released");
    assert_eq!(m1.boots(), 1, "never powered off and on again");
    run.operator.cancel();
}

/// A machine asleep past its slot's `powerOffAfterMinutes` is woken by a magic packet and shut
/// down over SSH (the off path needs its OS), and its Node then goes as any machine's that is
/// off. At no moment does it run without its Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_asleep_past_its_limit_is_woken_and_powered_off_and_its_node_goes() {
    let run = sleeper("limit").await;
    let (space, m1) = (&run.space, &run.m1);
    let sleep = Sleep { power_off_after_minutes: Some(1), ..Sleep::default() };
    apply_sleeping_pool(space.plane, &space.ns, m1, &run.key, sleep, "").await.expect("pool");
    let nodes: Api<CoreNode> = Api::all(space.client.clone());
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    claim_ready(&space.client, &space.ns, "wanted", m1.name()).await;
    let claims: Api<NodeClaim> = Api::namespaced(space.client.clone(), &space.ns);
    release(&claims, "wanted").await;
    until_asleep(space, m1).await;
    let asleep_at = Instant::now();

    eventually("the machine off and its Node gone", ACT + ACT, || async {
        ensure!(m1.power_state_now() == homelab_harness::machine::PowerState::Off, "still on");
        ensure!(nodes.get_opt(m1.name()).await?.is_none(), "the Node is still there");
        Ok(())
    })
    .await
    .expect("powered off after its sleep");
    let causes: Vec<PowerCause> = m1.power_history().into_iter().map(|e| e.cause).collect();
    let tail: Vec<PowerCause> = causes.iter().rev().take(3).rev().copied().collect();
    assert_eq!(
        tail,
        [PowerCause::Suspend, PowerCause::Resume, PowerCause::Shutdown],
        "asleep, woken, shut down by its OS: {causes:?}"
    );
    let reasons = event_reasons(&space.client, &space.ns, m1.name()).await.expect("events");
    assert!(reasons.iter().any(|r| r == "PowerOffAfterSleep"), "the slot says why: {reasons:?}");
    report(&format!(
        "asleep past its 1-minute limit: powered off {:.1?} after the test saw it asleep",
        asleep_at.elapsed()
    ));
    run.operator.cancel();
    stranded.assert_never(m1.name());
}

/// A [`sleeper`] whose machine's smart plug meters it, the relay closed by hand (as a person
/// does once: the machine has mains, and stays off), its sleeping pool applied with the plug as
/// its meter, and claim `wanted` ready.
async fn metered_sleeper(prefix: &str) -> (Sleeper, Plug) {
    let run = sleeper(prefix).await;
    let (space, m1) = (&run.space, &run.m1);
    let plug = Plug::start(m1, &run.lan).await.expect("plug");
    let on = format!("{}/rpc/Switch.Set?id=0&on=true", plug.operator_base());
    reqwest::get(&on).await.and_then(|r| r.error_for_status()).expect("close the relay");
    let sleep = Sleep { metered_by: Some(plug.base()), ..Sleep::default() };
    apply_sleeping_pool(space.plane, &space.ns, m1, &run.key, sleep, "").await.expect("pool");
    claim_ready(&space.client, &space.ns, "wanted", m1.name()).await;
    (run, plug)
}

/// A machine whose smart plug meters it: its suspend counts only once the plug reads the draw
/// of a machine asleep (under twice the slot's `suspend.watts` plus a watt, for 5 s), read by
/// the suspend Job from the hub across the lan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_machine_is_asleep_once_its_plug_reads_the_draw_of_sleep() {
    let (run, plug) = metered_sleeper("metered").await;
    let (space, m1) = (&run.space, &run.m1);
    let claims: Api<NodeClaim> = Api::namespaced(space.client.clone(), &space.ns);
    release(&claims, "wanted").await;
    until_asleep(space, m1).await;
    let slept = m1
        .power_history()
        .into_iter()
        .rfind(|e| e.cause == PowerCause::Suspend)
        .expect("a suspend in the history")
        .at;
    let asleep_readings: Vec<f64> =
        plug.readings().into_iter().filter(|(at, _)| *at > slept).map(|(_, w)| w).collect();
    assert!(
        asleep_readings.iter().filter(|w| **w == SUSPENDED_WATTS).count() >= 2,
        "the suspend Job read the plug while the machine slept: {asleep_readings:?}"
    );
    report(&format!(
        "a metered suspend: the plug read {asleep_readings:?} W after the machine slept"
    ));
    run.operator.cancel();
}

/// A metered machine that hangs on its way to sleep: `systemctl suspend` takes its network down
/// and the kernel never sleeps (a device's driver blocks it). Its SSH port falls silent as a
/// sleeping machine's does, but its plug goes on reading its running draw. The suspend Job
/// fails on the meter, saying so, and the machine is never counted as asleep or off: no
/// `Suspended` mark, its slot never `suspended`, its Node kept, its claim kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_machine_that_hangs_on_its_way_to_sleep_is_never_counted_as_asleep() {
    let (run, plug) = metered_sleeper("hang").await;
    let (space, m1) = (&run.space, &run.m1);
    m1.hang_on_suspend(true);
    let claims: Api<NodeClaim> = Api::namespaced(space.client.clone(), &space.ns);
    release(&claims, "wanted").await;

    let message = failed_suspend_saying(space, "did not read under").await;
    assert!(message.contains("SSH port fell silent"), "says what it saw: {message}");
    assert!(m1.suspend_requests() >= 1, "the machine was asked to sleep");
    let nodes: Api<CoreNode> = Api::all(space.client.clone());
    let slots: Api<Node> = Api::namespaced(space.client.clone(), &space.ns);
    stays("the machine counted neither asleep nor off", Duration::from_secs(20), || async {
        ensure!(!m1.suspended(), "the machine sleeps");
        let claim = claims.get("wanted").await.context("the claim is gone")?;
        let phase = homelab_harness::claims::phase(&claim);
        ensure!(phase == NodeClaimPhase::Ready, "the claim is {phase:?}");
        let node = nodes.get(m1.name()).await.context("the Node is gone")?;
        ensure!(suspended_condition(&node).as_deref() != Some("True"), "marked asleep");
        let slot = slots.get(m1.name()).await?;
        let power = slot.status.and_then(|s| s.power_state);
        ensure!(power != Some(ObservedPower::Suspended), "the slot says {power:?}");
        Ok(())
    })
    .await
    .expect("never counted as asleep");
    assert_eq!(m1.boots(), 1, "never powered off and on again");
    let readings: Vec<f64> = plug.readings().into_iter().map(|(_, w)| w).collect();
    assert!(
        !readings.is_empty() && readings.iter().all(|w| *w > SUSPENDED_WATTS),
        "the Job read the plug, and it never read the draw of sleep: {readings:?}"
    );
    report(&format!("a machine that hangs on its way to sleep: {message}"));
    run.operator.cancel();
}
