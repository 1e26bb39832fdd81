//! The operator's power drivers on real machines (homelab_harness::machine): each machine's
//! power is reached by the protocol a homelab uses, from the operator's power Jobs, real pods
//! of its image on the hub, across the lan. A machine with a BMC is powered through Redfish
//! (`machine::Bmc`, bound to the machine's firmware); a machine on a metering smart plug
//! (`machine::Plug`, the Shelly Gen2 RPC) is switched by its relay, and shut down over SSH
//! before the relay is cut. Nothing in these tests presses a machine's buttons or sets a draw.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy (it fails without them).
//! The first run builds the `machines` programs and the operator's image (`make image`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{Group, Node, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::scaler::{self, ScalerConfig};
use homelab_harness::claims::{phase, provider_claim_for};
use homelab_harness::machine::plug::{ON_WATTS, STANDBY_WATTS};
use homelab_harness::machine::{
    Bmc, Lan, Machine, MachineLogs, MachineSpec, PAUSE_IMAGE, Plug, PowerCause, PowerState,
};
use homelab_harness::real_lab::{
    ACT, HUB_ROLE, Stranding, claim_ready, first_seen, hosts_running, machine_settings,
    operator_image, pool_machine, scenario, secret, start_operator, timeouts,
};
use homelab_harness::slots::{condition_reason, event_reasons, node_reporting};
use homelab_harness::{ControlPlane, TestNamespace, eventually};
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The taint the pool's kubelets register with (`--register-with-taints`); the slots do not
/// declare it, so only the kubelet puts it on a Node.
const REGISTER_TAINT: &str = "homelab.test/dedicated";
/// The label the slots declare (`nodeLabels`) and no kubelet registers: only the operator puts it
/// on a Node, and the workload selects it.
const POOL_LABEL: &str = "homelab.test/pool";
const BMC_USER: &str = "homelab";
const BMC_PASSWORD: &str = "standby-rail";

fn fail(output: &std::process::Output, what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", String::from_utf8_lossy(&output.stderr))
}

/// The slots of every claim ever seen, by the claim's uid.
fn claimed_slots(ledger: &Mutex<HashMap<String, NodeClaim>>) -> BTreeMap<String, String> {
    let ledger = ledger.lock().map(|l| l.clone()).unwrap_or_default();
    ledger.into_iter().map(|(uid, claim)| (uid, claim.spec.slot_ref.name)).collect()
}

/// Two slots powered through their machines' BMCs (Redfish over HTTPS, the login and each BMC's
/// CA in Secrets), declaring [`POOL_LABEL`], in a pool the built-in scaler runs; and a Deployment
/// of two replicas that select that label, tolerate the kubelets' taint and may not share a
/// machine. All as a user writes it, applied with kubectl.
async fn apply_redfish_pool(
    plane: &ControlPlane,
    ns: &str,
    machines: &[(&Machine, &Bmc)],
) -> Result<()> {
    let mut manifest = format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{ name: bmc-login }}
type: kubernetes.io/basic-auth
stringData: {{ username: {BMC_USER}, password: {BMC_PASSWORD} }}
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata:
  name: lan
spec:
  driver: builtin
  builtin: {{ hold: 5s, podsPerNode: 1, maxNodes: 2 }}
  nodeReadinessTaints: []
"#
    );
    for (machine, bmc) in machines {
        let ca = secret(&format!("{}-bmc-ca", machine.name()), "ca.crt", bmc.ca_pem());
        manifest.push_str(&format!(
            r#"---
{ca}
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: {name}
  labels: {{ group: lan }}
spec:
  kubernetesNodeName: {name}
  nodeLabels: {{ "{POOL_LABEL}": drivers }}
  power:
    redfish:
      endpoint: "{endpoint}"
      credentials: {{ secretName: bmc-login }}
      tls: {{ caBundle: {{ name: {name}-bmc-ca, key: ca.crt }} }}
    confirmTimeoutSeconds: 40
    nodeSelector: {{ "{HUB_ROLE}": "{ns}" }}
"#,
            name = machine.name(),
            endpoint = bmc.endpoint(),
        ));
    }
    manifest.push_str(&format!(
        r#"---
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web }}
spec:
  replicas: 2
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata: {{ labels: {{ app: web }} }}
    spec:
      nodeSelector: {{ "{POOL_LABEL}": drivers }}
      tolerations: [{{ key: "{REGISTER_TAINT}", operator: Exists, effect: NoSchedule }}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - {{ labelSelector: {{ matchLabels: {{ app: web }} }}, topologyKey: kubernetes.io/hostname }}
      terminationGracePeriodSeconds: 5
      containers:
        - {{ name: web, image: "{PAUSE_IMAGE}", imagePullPolicy: Never }}
"#
    ));
    let output = plane.kubectl_apply(ns, &manifest).await?;
    ensure!(output.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// The Deployment's pods Running with their container running, one on each of `machines`.
async fn web_runs_on(pods: &Api<Pod>, machines: &[&Machine]) -> Result<()> {
    let hosts = hosts_running(pods, "web").await?;
    let want: BTreeSet<String> = machines.iter().map(|m| m.name().to_owned()).collect();
    ensure!(hosts == want, "web Running on {hosts:?}, want {want:?}");
    Ok(())
}

/// The taint the pool's kubelets register with.
fn register_taint() -> Taint {
    Taint {
        key: REGISTER_TAINT.into(),
        value: Some("drivers".into()),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }
}

fn has_register_taint(node: &CoreNode) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.iter().any(|t| {
        t.key == REGISTER_TAINT && t.value.as_deref() == Some("drivers") && t.effect == "NoSchedule"
    })
}

/// The built-in scaler takes a pool of two real machines behind Redfish BMCs from 0 to 2 for a
/// Deployment that needs both, to 0 when it is scaled away, and to 2 again. Each boot and each
/// shutdown is a `ComputerSystem.Reset` the power Job on the hub posts to the machine's BMC
/// across the lan; the machines' firmware says On and Off. Once off, a machine's Node is gone;
/// at its next boot the kubelet registers a fresh Node carrying its `--register-with-taints`
/// taint from creation, and the operator puts the slot's declared label back on it. At no moment
/// is a machine on without its Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_scaler_powers_a_pool_up_and_down_through_redfish() {
    let (space, lan, hub) = scenario("real-redfish").await;
    let (plane, client, ns) = (space.plane, space.client.clone(), space.ns.clone());
    let _hub_logs = hub.logs_on_failure();
    let mut machines = Vec::new();
    for i in 1..=2 {
        let spec = MachineSpec {
            taints: vec![register_taint()],
            ..MachineSpec::named(&format!("{ns}-r{i}"))
        };
        machines.push(Machine::create(plane, &lan, spec).await.expect("machine"));
    }
    let _logs: Vec<_> = machines.iter().map(Machine::logs_on_failure).collect();
    let mut bmcs = Vec::new();
    for machine in &machines {
        bmcs.push(Bmc::start(machine, &lan, BMC_USER, BMC_PASSWORD).await.expect("bmc"));
    }
    let (_, image) = operator_image().await.expect("image");
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ledger = first_seen(claims.clone());
    let created = first_seen(nodes.clone());
    let stranded: Vec<Stranding> =
        machines.iter().map(|m| Stranding::watch(m.clone(), nodes.clone())).collect();
    let never_stranded = || {
        for (watch, machine) in stranded.iter().zip(&machines) {
            watch.assert_never(machine.name());
        }
    };
    let operator = start_operator(plane, &ns, &image, machine_settings()).await;
    let config = ScalerConfig {
        interval: Duration::from_secs(1),
        timeouts: timeouts(),
        ..ScalerConfig::new(ns.clone())
    };
    tokio::spawn(scaler::run(client.clone(), config, operator.clone()));
    let pairs: Vec<(&Machine, &Bmc)> = machines.iter().zip(&bmcs).collect();
    apply_redfish_pool(plane, &ns, &pairs).await.expect("pool");
    let both: Vec<&Machine> = machines.iter().collect();

    // 0 -> 2: two claims, each machine booted by a Reset On to its BMC, the pods on both.
    let started = Instant::now();
    eventually("web Running on both machines", ACT, || async {
        never_stranded();
        web_runs_on(&pods, &both).await
    })
    .await
    .expect("up");
    let up = started.elapsed();
    let first_nodes: Vec<CoreNode> = {
        let mut all = Vec::new();
        for machine in &machines {
            all.push(nodes.get(machine.name()).await.expect("node"));
        }
        all
    };
    let booted = claimed_slots(&ledger);
    let slots: BTreeSet<&String> = booted.values().collect();
    assert_eq!(booted.len(), 2, "exactly two claims for two pods: {booted:?}");
    assert_eq!(slots.len(), 2, "one claim per machine: {booted:?}");
    for (machine, bmc) in &pairs {
        let resets = bmc.resets();
        assert!(
            resets.iter().any(|r| r.reset_type == "On" && r.state == PowerState::Off),
            "{}: booted by a Reset On to its BMC while off: {resets:?}",
            machine.name()
        );
        assert_eq!(machine.wakes(), 0, "no magic packet: the BMC booted it");
    }

    // 2 -> 0: the Deployment scaled away, both machines shut down through their BMCs.
    let output = plane
        .kubectl(["-n", ns.as_str(), "scale", "deployment/web", "--replicas=0"])
        .await
        .expect("kubectl scale");
    assert!(output.status.success(), "{}", fail(&output, "kubectl scale"));
    let started = Instant::now();
    eventually("both machines off through their BMCs, their Nodes gone", ACT * 2, || async {
        never_stranded();
        for (machine, bmc) in &pairs {
            let name = machine.name();
            let resets = bmc.resets();
            ensure!(
                resets
                    .iter()
                    .any(|r| r.reset_type == "GracefulShutdown" && r.state == PowerState::On),
                "{name}: no GracefulShutdown to its BMC yet: {resets:?}"
            );
            ensure!(machine.power_state().await == PowerState::Off, "{name} still on");
            ensure!(nodes.get_opt(name).await?.is_none(), "Node {name} still there");
        }
        Ok(())
    })
    .await
    .expect("down");
    let down = started.elapsed();
    for machine in &machines {
        let last = machine.power_history().last().copied().expect("a power history");
        assert_eq!(
            (last.state, last.cause),
            (PowerState::Off, PowerCause::Shutdown),
            "{}: off by the OS's orderly shutdown, not a cut",
            machine.name()
        );
        let reasons = event_reasons(&client, &ns, machine.name()).await.expect("events");
        assert!(reasons.iter().any(|r| r == "NodeRemoved"), "{reasons:?}");
    }
    assert_eq!(claimed_slots(&ledger).len(), 2, "no claim while going down");

    // 0 -> 2 again: fresh Nodes, the kubelets' taint on them from creation, the label back.
    let output = plane
        .kubectl(["-n", ns.as_str(), "scale", "deployment/web", "--replicas=2"])
        .await
        .expect("kubectl scale");
    assert!(output.status.success(), "{}", fail(&output, "kubectl scale"));
    eventually("web Running on both machines again", ACT, || async {
        never_stranded();
        web_runs_on(&pods, &both).await
    })
    .await
    .expect("up again");
    for (machine, old) in machines.iter().zip(&first_nodes) {
        let node = nodes.get(machine.name()).await.expect("node");
        assert_ne!(node.metadata.uid, old.metadata.uid, "{}: a fresh Node", machine.name());
        let uid = node.metadata.uid.clone().expect("uid");
        let as_created = created.lock().expect("first seen").get(&uid).cloned();
        let as_created = as_created.expect("the watch saw the fresh Node's creation");
        assert!(has_register_taint(&as_created), "the taint from creation: {:?}", as_created.spec);
        let label = node.metadata.labels.clone().unwrap_or_default().get(POOL_LABEL).cloned();
        assert_eq!(label.as_deref(), Some("drivers"), "the slot's declared label is back");
    }
    let all = claimed_slots(&ledger);
    assert_eq!(all.len(), 4, "two claims per scale-up: {all:?}");
    never_stranded();
    eprintln!("[real-redfish] 0 -> 2 in {up:.1?}, 2 -> 0 in {down:.1?}");
    operator.cancel();
}

/// One machine behind a metering smart plug (its BIOS powers on when AC returns), the relay
/// open, on the scenario's lan with its hub. Fields drop in order: the log guards first, while
/// the machines and the lan still exist.
struct PlugMachine {
    _m1_logs: MachineLogs,
    _hub_logs: MachineLogs,
    plug: Plug,
    m1: Machine,
    /// The machine's SSH key, for a slot that shuts it down over SSH.
    key: String,
    _hub: Machine,
    _lan: Lan,
    space: TestNamespace,
}

impl PlugMachine {
    /// Applies [`plug_pool`] for the machine with kubectl, its off sequence over SSH when
    /// `ssh_then_relay`; returns the slot's name.
    async fn apply_pool(&self, ssh_then_relay: bool) -> String {
        let (m1, ns) = (&self.m1, &self.space.ns);
        let slot = m1.name().to_owned();
        let ssh = ssh_then_relay.then_some((m1, self.key.as_str()));
        let manifest = plug_pool(&slot, ns, &self.plug, ssh);
        let output = self.space.plane.kubectl_apply(ns, &manifest).await.expect("kubectl");
        assert!(output.status.success(), "{}", fail(&output, "kubectl apply"));
        slot
    }
}

async fn plug_machine(prefix: &str) -> PlugMachine {
    let (space, lan, hub) = scenario(prefix).await;
    let hub_logs = hub.logs_on_failure();
    let name = format!("{}-p1", space.ns);
    let spec = MachineSpec { power_on_with_ac: true, ..MachineSpec::named(&name) };
    let (m1, key) = pool_machine(space.plane, &lan, spec).await.expect("machine");
    let m1_logs = m1.logs_on_failure();
    let plug = Plug::start(&m1, &lan).await.expect("plug");
    PlugMachine {
        _m1_logs: m1_logs,
        _hub_logs: hub_logs,
        plug,
        m1,
        key,
        _hub: hub,
        _lan: lan,
        space,
    }
}

/// A slot on a metering smart plug, booted by closing the relay (the BIOS powers on when AC
/// returns) and shut down by its off sequence: SSH shutdown, then the relay cut once the draw has
/// stayed under the threshold. The relay opens only after the OS has halted, at the standby
/// draw: never while the OS runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plug_switched_machine_is_shut_down_over_ssh_before_its_relay_is_cut() {
    let one = plug_machine("real-plug").await;
    let (plane, client, ns) = (one.space.plane, one.space.client.clone(), one.space.ns.clone());
    let (m1, plug) = (&one.m1, &one.plug);
    assert!(!m1.has_mains(), "the relay starts open");
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(plane, &ns, &image, machine_settings()).await;
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let stranded = Stranding::watch(m1.clone(), nodes.clone());
    let slot = one.apply_pool(true).await;

    // On: the power Job on the hub closes the relay; the machine boots as mains returns.
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let groups: Api<Group> = Api::namespaced(client.clone(), &ns);
    let claim = provider_claim_for("boot", &slot, &slots, &groups, timeouts(), "test")
        .await
        .expect("claim");
    claims.create(&PostParams::default(), &claim).await.expect("create claim");
    eventually("the claim ready on the plug-switched machine", ACT, || async {
        stranded.assert_never(&slot);
        let claim = claims.get("boot").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "phase {:?}", claim.status);
        Ok(())
    })
    .await
    .expect("ready");
    let switches = plug.switches();
    assert!(
        matches!(switches.as_slice(), [s] if s.on && s.watts == 0.0 && s.state == PowerState::Off),
        "one switch, the relay closed on a machine without power: {switches:?}"
    );
    // The harness records a boot once containerd and the kubelet run, and on a loaded machine
    // the claim can be Ready before that returns: wait for the record rather than read it once.
    let boot = eventually("the machine's boot recorded", ACT, || async {
        m1.power_history().last().copied().context("no power event yet")
    })
    .await
    .expect("history");
    assert_eq!((boot.state, boot.cause), (PowerState::On, PowerCause::MainsBack));
    assert_eq!(m1.wakes(), 0, "booted by mains returning, not a magic packet");

    // Off: released, the sequence shuts the OS down over SSH, waits for the standby draw, then
    // cuts the relay.
    let mark = json!({ "status": { "scaleDownRequestedAt": Time(jiff::Timestamp::now()), "scaleDownRequestedBy": "test" } });
    claims.patch_status("boot", &PatchParams::default(), &Patch::Merge(&mark)).await.expect("mark");
    claims.delete("boot", &DeleteParams::default()).await.expect("release");
    eventually("the relay open, the machine off, its Node gone", ACT * 2, || async {
        stranded.assert_never(&slot);
        ensure!(!m1.has_mains(), "the relay is still closed");
        ensure!(m1.power_state().await == PowerState::Off, "the machine is still on");
        ensure!(nodes.get_opt(&slot).await?.is_none(), "Node {slot} still there");
        Ok(())
    })
    .await
    .expect("off");
    let switches = plug.switches();
    let cuts: Vec<_> = switches.iter().filter(|s| !s.on).collect();
    assert!(
        cuts.iter().all(|s| s.state == PowerState::Off && s.watts == STANDBY_WATTS),
        "the relay opened only on a halted machine at its standby draw, never at {ON_WATTS} W: \
         {switches:?}"
    );
    let [cut] = cuts.as_slice() else { panic!("one cut of the relay: {switches:?}") };
    let halted = m1.power_history().into_iter().rev().find(|e| e.state == PowerState::Off);
    let halted = halted.expect("the machine went off");
    assert_eq!(halted.cause, PowerCause::Shutdown, "the OS shut down in order (SSH), not cut");
    let waited = cut.at.duration_since(halted.at);
    assert!(
        waited >= Duration::from_secs(u64::from(STEADY)),
        "the relay was cut {waited:?} after the OS halted: the draw must stay low for {STEADY}s"
    );
    stranded.assert_never(&slot);
    eprintln!("[real-plug] the relay was cut {waited:.1?} after the OS halted");
    operator.cancel();
}

/// A serving machine on a metering smart plug is cut off from the API server for longer than a
/// boot window (a switch port that died, a Wi-Fi drop): its kubelet is silent, but its plug, which
/// the operator reaches over the house's network and not through the machine's cable, still reads
/// it drawing power. That is a machine on and cut off, not off: its claim
/// stays ready, the slot says why (`NodeReporting` `CutOff`), and nothing powers it off. Once
/// the link is back its kubelet takes its Node back, serving under the same claim. Reading
/// silence alone as "off" failed the claim `MachineGone` and powered the machine off on heal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_cut_off_whose_plug_reads_it_on_keeps_its_claim() {
    let one = plug_machine("real-plug-cut").await;
    let (plane, client, ns) = (one.space.plane, one.space.client.clone(), one.space.ns.clone());
    let m1 = &one.m1;
    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(plane, &ns, &image, machine_settings()).await;
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let slot = one.apply_pool(false).await;
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    claim_ready(&client, &ns, "serve", &slot).await;
    let registered = nodes.get(&slot).await.expect("node");

    let history_before_cut = m1.power_history().len();
    m1.link().cut().expect("cut");
    let message = eventually("the slot saying its machine is cut off, not off", ACT, || async {
        let said = slots.get(&slot).await?;
        let reason = condition_reason(&said, "NodeReporting");
        let (_, message) = node_reporting(&said).unwrap_or_default();
        ensure!(reason.as_deref() == Some("CutOff"), "NodeReporting {reason:?}: {message}");
        Ok(message)
    })
    .await
    .expect("cut off");
    assert!(message.contains("plug"), "{message}");
    // Past a whole boot window of silence, and a margin for the controllers to act on it.
    let window = timeouts().budget() + Duration::from_secs(20);
    homelab_harness::stays("the claim ready, the machine on", window, || async {
        let claim = claims.get("serve").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "phase {:?}", claim.status);
        ensure!(m1.power_state().await == PowerState::On, "the machine was powered off");
        ensure!(m1.has_mains(), "the relay was opened");
        Ok(())
    })
    .await
    .expect("kept");

    m1.link().restore().expect("restore");
    eventually("the kubelet back on its own Node, the claim still ready", ACT, || async {
        let node = nodes.get(&slot).await?;
        ensure!(node.metadata.uid == registered.metadata.uid, "the Node was replaced");
        ensure!(homelab_harness::ready_status(&node) == Some("True"), "not Ready yet");
        let claim = claims.get("serve").await?;
        ensure!(phase(&claim) == NodeClaimPhase::Ready, "phase {:?}", claim.status);
        Ok(())
    })
    .await
    .expect("back");
    let since_cut = m1.power_history().split_off(history_before_cut);
    assert!(since_cut.is_empty(), "the machine's power never changed: {since_cut:?}");
    let reasons = event_reasons(&client, &ns, "serve").await.expect("events");
    assert!(reasons.iter().any(|r| r == "MachineCutOff"), "claim events {reasons:?}");
    operator.cancel();
}

/// A machine on a metering plug runs with no Node. Someone switched its plug on by hand while
/// the operator was down (the BIOS boots it as AC returns), and its Node was deleted under its
/// running kubelet, which never registers it again (its Lease goes with the Node: the garbage
/// collector removes it, and the kubelet makes no new one without a Node to own it). Only the
/// plug still shows that the machine is on. Back, the operator reads the plug above the
/// machine's standby, with no Node and nothing wanting the machine: the slot says
/// `OnWithoutNode` and its shutdown opens the relay. Reading "no Node" as "off" left it running
/// for good, invisible to both scalers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plug_switched_machine_running_without_its_node_is_powered_off() {
    use k8s_openapi::api::coordination::v1::Lease;
    let one = plug_machine("real-plug-nodeless").await;
    let (plane, client, ns) = (one.space.plane, one.space.client.clone(), one.space.ns.clone());
    let (m1, plug) = (&one.m1, &one.plug);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let slot = one.apply_pool(false).await;

    // The operator is down; the plug is switched on by hand, the machine boots and registers.
    let app = reqwest::Client::builder().no_proxy().build().expect("client");
    let on = app.get(format!("{}/rpc/Switch.Set?id=0&on=true", plug.operator_base())).send();
    assert!(on.await.expect("switch the plug on").status().is_success(), "the plug switched on");
    eventually("the machine's Node registered", ACT, || async {
        nodes.get_opt(&slot).await?.ok_or_else(|| anyhow::anyhow!("no Node yet"))
    })
    .await
    .expect("registered");
    nodes.delete(&slot, &DeleteParams::default()).await.expect("the Node deleted under it");
    eventually("the Node and its Lease gone, the kubelet running on", ACT, || async {
        ensure!(nodes.get_opt(&slot).await?.is_none(), "Node {slot} still there");
        ensure!(leases.get_opt(&slot).await?.is_none(), "the Lease is still there");
        ensure!(m1.kubelet_running().await, "the kubelet stopped");
        Ok(())
    })
    .await
    .expect("nodeless");

    let (_, image) = operator_image().await.expect("image");
    let operator = start_operator(plane, &ns, &image, machine_settings()).await;
    eventually("the machine off, its relay opened", ACT * 2, || async {
        ensure!(m1.power_state().await == PowerState::Off, "the machine is still on");
        ensure!(!m1.has_mains(), "the relay is still closed");
        Ok(())
    })
    .await
    .expect("off");
    assert!(
        nodes.get_opt(&slot).await.expect("read node").is_none(),
        "a running kubelet never registers its deleted Node again"
    );
    let reasons = event_reasons(&client, &ns, &slot).await.expect("events");
    assert!(reasons.iter().any(|r| r == "OnWithoutNode"), "events {reasons:?}");
    operator.cancel();
}

/// The pool of one slot on a metering smart plug, as a user writes it: booted by closing the
/// relay, its Jobs on the test's hub. With `ssh` (the machine and its key) it is shut down by its
/// off sequence: SSH, then the relay cut once the draw has stayed under [`THRESHOLD`]; the plug
/// step reads the meter from the hub, so the meter is at the plug's lan address. Without, the
/// relay is simply cut, and only the operator reads the meter, at its own route to the plug
/// ([`Plug::operator_base`]), with the machine's running and standby draw declared.
fn plug_pool(slot: &str, ns: &str, plug: &Plug, ssh: Option<(&Machine, &str)>) -> String {
    let (secret, meter, off) = match ssh {
        Some((m1, key)) => (
            format!("{}\n---\n", secret(&format!("{slot}-ssh"), "ssh-privatekey", key)),
            plug.base(),
            format!(
                r#"    ssh:
      host: "{address}"
      user: root
      privateKey: {{ name: {slot}-ssh, key: ssh-privatekey }}
      knownHostKey: "{host_key}"
      command: poweroff
    offSequence:
      - driver: ssh
      - {{ driver: http, afterDrawBelowWatts: {THRESHOLD}, drawSteadySeconds: {STEADY}, timeoutSeconds: 45 }}
"#,
                address = m1.address(),
                host_key = m1.ssh_host_key().expect("host key"),
            ),
        ),
        None => (
            String::new(),
            plug.operator_base(),
            format!("    watts: {{ whenOn: {ON_WATTS}, whenOff: {STANDBY_WATTS} }}\n"),
        ),
    };
    format!(
        r#"{secret}apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata:
  name: lan
spec:
  driver: builtin
  nodeReadinessTaints: []
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: {slot}
  labels: {{ group: lan }}
spec:
  kubernetesNodeName: {slot}
  power:
    http:
      onRequest: {{ method: GET, url: "{lan}/rpc/Switch.Set?id=0&on=true" }}
      offRequest: {{ method: GET, url: "{lan}/rpc/Switch.Set?id=0&on=false" }}
      meter:
        request: {{ url: "{meter}/rpc/Switch.GetStatus?id=0" }}
        wattsPointer: /apower
{off}    nodeSelector: {{ "{HUB_ROLE}": "{ns}" }}
"#,
        lan = plug.base(),
    )
}

/// The plug step's threshold, between the standby and the running draw.
const THRESHOLD: f64 = 5.0;
/// How long the draw must stay under it.
const STEADY: u32 = 3;
