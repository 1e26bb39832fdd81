//! The claim, slot and group controllers against a real control plane: kube-apiserver,
//! controller-manager (Jobs, garbage collection), scheduler, and kwok playing the machines
//! through the project's own simulator. Each test runs the controllers for its own namespace.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use homelab_autoscaler::api::{
    Group, LABEL_GROUP, LABEL_SLOT, Node, NodeClaim, NodeClaimPhase, ObservedPower, SlotPhase,
};
use homelab_autoscaler::claim::FINALIZER;
use homelab_autoscaler::controller::MachineSettings;
use homelab_autoscaler::job_outcome::{JobOutcome, outcome};
use homelab_autoscaler::simulator::{BEHAVIOUR_ANNOTATION, NOT_READY_FOR_ANNOTATION};
use homelab_harness::claims::{phase, provider_claim_for, reason};
use homelab_harness::http::ShellyMeter;
use homelab_harness::lab::{self, Lab, With};
use homelab_harness::slots::{self, node_reporting};
use homelab_harness::{Components, ControlPlane, KWOK_NODE_ANNOTATION, eventually, stays};
use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

/// How long a test waits for the controllers to act: long enough for three shutdown attempts,
/// two of them after a settle of the registration timeout plus kube-controller-manager's grace
/// (the lab's 8 s + 30 s each), with room for the Jobs and writes of a loaded machine.
const ACT: Duration = Duration::from_secs(120);
/// How long a machine takes to be off and its Node deleted: the drain and shutdown Job, then
/// kube-controller-manager's grace period before the stopped kubelet's Node is Unknown.
const OFF: Duration = Duration::from_secs(90);

/// What these tests do to a Lab, beyond what the harness offers.
trait LabSteps {
    /// A pool with a readiness gate on `bootstrap.test/not-ready`, and slots named
    /// `<ns>-<suffix>` whose lifecycle Jobs run on the lab node.
    async fn pool(&self, slots: &[(&str, Option<&str>)]) -> Vec<String>;
    /// Creates a claim as the provider does (stamped, owned by its slot).
    async fn claim(&self, name: &str, slot: &str, deadline_in: Option<Duration>) -> NodeClaim;
    async fn claim_with_ttl(
        &self,
        name: &str,
        slot: &str,
        deadline_in: Option<Duration>,
        ttl: i32,
    ) -> NodeClaim;
    async fn claim_until(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&NodeClaim) -> bool,
    ) -> NodeClaim;
    async fn claim_gone(&self, name: &str);
    async fn slot_until(&self, name: &str, what: &str, pred: impl Fn(&Node) -> bool) -> Node;
    async fn node_gone(&self, name: &str);
    /// Marks a claim for scale-down and deletes it, as the provider's DeleteNodes does.
    async fn scale_down(&self, name: &str);
    async fn event_reasons(&self, name: &str) -> Vec<String>;
    /// Where the pods of the slot's `field` (`startupPodSpec` or `shutdownPodSpec`) run: on the
    /// lab node, or, not `reachable`, nowhere (their Job runs into its deadline).
    async fn power_pods_run(&self, slot: &str, field: &str, reachable: bool);
}

impl LabSteps for Lab {
    async fn power_pods_run(&self, slot: &str, field: &str, reachable: bool) {
        let on = if reachable { self.ns.as_str() } else { "nowhere" };
        let patch = json!({ "spec": { field: { "nodeSelector": { "homelab.test/lab": on } } } });
        self.slots()
            .patch(slot, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch slot");
    }

    async fn pool(&self, slots: &[(&str, Option<&str>)]) -> Vec<String> {
        let group: Group = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
            "metadata": { "name": "pool" },
            "spec": { "nodeReadinessTaints": [{ "key": "bootstrap.test/not-ready", "effect": "NoSchedule" }] },
        }))
        .expect("group");
        Api::<Group>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &group)
            .await
            .expect("create group");
        let mut names = Vec::new();
        for (suffix, behaviour) in slots {
            let name = format!("{}-{suffix}", self.ns);
            // The lab's machines go off when their shutdown pod runs: it confirms them off.
            let pod = json!({
                "image": "registry.invalid/power:1",
                "nodeSelector": { "homelab.test/lab": self.ns },
                "confirmsPowerState": true,
            });
            let mut annotations = serde_json::Map::new();
            if let Some(b) = behaviour {
                annotations.insert(BEHAVIOUR_ANNOTATION.into(), json!(b));
            }
            let slot: Node = serde_json::from_value(json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
                "metadata": { "name": name, "labels": { "group": "pool" }, "annotations": annotations },
                "spec": { "kubernetesNodeName": name, "startupPodSpec": pod, "shutdownPodSpec": pod },
            }))
            .expect("slot");
            self.slots().create(&PostParams::default(), &slot).await.expect("create slot");
            names.push(name);
        }
        names
    }

    async fn claim(&self, name: &str, slot: &str, deadline_in: Option<Duration>) -> NodeClaim {
        self.claim_with_ttl(name, slot, deadline_in, 3600).await
    }

    async fn claim_with_ttl(
        &self,
        name: &str,
        slot: &str,
        deadline_in: Option<Duration>,
        ttl: i32,
    ) -> NodeClaim {
        let mut claim =
            provider_claim_for(name, slot, &self.slots(), &self.groups(), self.timeouts, "test")
                .await
                .expect("the provider's claim");
        if let Some(d) = deadline_in {
            let now = jiff::Timestamp::now();
            let deadline = now
                .checked_add(jiff::SignedDuration::try_from(d).expect("duration"))
                .expect("time");
            claim.spec.deadline_at = Some(Time(deadline));
        }
        claim.spec.ttl_seconds_after_finished = Some(ttl);
        self.claims().create(&PostParams::default(), &claim).await.expect("create claim")
    }

    async fn claim_until(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&NodeClaim) -> bool,
    ) -> NodeClaim {
        let claims = self.claims();
        eventually(&format!("claim {name}: {what}"), ACT, || async {
            let claim = claims.get(name).await.with_context(|| format!("reading claim {name}"))?;
            ensure!(pred(&claim), "not yet: status {:?}", claim.status);
            Ok(claim)
        })
        .await
        .expect(what)
    }

    async fn claim_gone(&self, name: &str) {
        let claims = self.claims();
        eventually(&format!("claim {name} to be gone"), ACT, || async {
            let claim = claims.get_opt(name).await?;
            ensure!(
                claim.is_none(),
                "still there: {:?}",
                claim.map(|c| (c.metadata.finalizers, c.status))
            );
            Ok(())
        })
        .await
        .expect("claim gone");
    }

    async fn slot_until(&self, name: &str, what: &str, pred: impl Fn(&Node) -> bool) -> Node {
        let slots = self.slots();
        eventually(&format!("slot {name}: {what}"), ACT, || async {
            let slot = slots.get(name).await?;
            ensure!(pred(&slot), "not yet: status {:?}", slot.status);
            Ok(slot)
        })
        .await
        .expect(what)
    }

    async fn node_gone(&self, name: &str) {
        let nodes = self.nodes();
        eventually(&format!("node {name} to be gone"), OFF, || async {
            if let Some(node) = nodes.get_opt(name).await? {
                let ready = homelab_harness::ready_status(&node).map(str::to_owned);
                anyhow::bail!("node {name} is still registered (Ready={ready:?})");
            }
            Ok(())
        })
        .await
        .expect("node gone");
    }

    async fn scale_down(&self, name: &str) {
        let patch = json!({ "status": { "scaleDownRequestedAt": Time(jiff::Timestamp::now()), "scaleDownRequestedBy": "test" } });
        self.claims()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("mark");
        self.claims().delete(name, &DeleteParams::default()).await.expect("delete");
    }

    async fn event_reasons(&self, name: &str) -> Vec<String> {
        slots::event_reasons(&self.client, &self.ns, name).await.expect("events")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_boots_its_machine_and_a_scale_down_powers_it_off() {
    let lab = Lab::start("ctl-happy", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;

    let booting = lab
        .claim_until("c1", "booting", |c| {
            phase(c) == NodeClaimPhase::Booting || phase(c) == NodeClaimPhase::Ready
        })
        .await;
    assert!(
        booting.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER),
        "the finalizer arrives with the boot"
    );
    // The Job follows the Booting commit (D35): under load it may not be there yet.
    let jobs = lab.jobs();
    let job = eventually("the startup Job", ACT, || async {
        jobs.get("c1-startup").await.context("reading Job c1-startup")
    })
    .await
    .expect("startup Job");
    let owners = job.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(
        owners.iter().find(|o| o.controller == Some(true)).map(|o| o.kind.as_str()),
        Some("NodeClaim")
    );
    assert!(
        owners.iter().any(|o| o.kind == "Node" && o.name == slot),
        "the slot is a second owner"
    );

    let ready = lab
        .claim_until("c1", "ready", |c| {
            phase(c) == NodeClaimPhase::Ready && c.spec.deadline_at.is_none()
        })
        .await;
    let status = ready.status.clone().expect("status");
    assert_eq!(status.attempt, Some(1));
    assert!(status.ready_at.is_some() && status.boot_committed_at.is_some());
    let node = lab.nodes().get(&slot).await.expect("machine's node");
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.clone()),
        Some(format!("homelab://{slot}"))
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        (labels.get(LABEL_GROUP).map(String::as_str), labels.get(LABEL_SLOT)),
        (Some("pool"), Some(&slot))
    );
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints.iter().all(|t| t.key != "bootstrap.test/not-ready"),
        "the gate waited for the bootstrap taint to clear"
    );

    let reported = lab
        .slot_until(&slot, "reported ready", |s| {
            s.status.as_ref().and_then(|s| s.phase) == Some(SlotPhase::Ready)
        })
        .await;
    let status = reported.status.expect("slot status");
    assert_eq!(status.power_state, Some(ObservedPower::On));
    let digest = status.last_claim.expect("digest");
    assert_eq!((digest.name.as_str(), digest.attempt, digest.reached_ready), ("c1", 1, true));
    let reasons = lab.event_reasons("c1").await;
    for reason in ["ClaimCreated", "ClaimBooting", "ClaimReady"] {
        assert!(reasons.iter().any(|r| r == reason), "{reason} missing from {reasons:?}");
    }

    lab.scale_down("c1").await;
    lab.node_gone(&slot).await;
    lab.claim_gone("c1").await;
    let shutdown_jobs: Vec<_> = lab.lifecycle_jobs("shutdown").await.expect("jobs");
    assert_eq!(shutdown_jobs.len(), 1, "one shutdown Job");
    lab.slot_until(&slot, "reported off", |s| {
        s.status.as_ref().is_some_and(|s| {
            s.phase == Some(SlotPhase::Off) && s.power_state == Some(ObservedPower::Off)
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overdue_boot_fails_and_its_machine_is_forced_off() {
    let lab = Lab::start("ctl-deadline", With::Controllers).await;
    let slot = lab.pool(&[("m1", Some("never-boots"))]).await.remove(0);
    // A deadline shorter than the registration wait: the deadline is what ends this attempt.
    lab.claim("c1", &slot, Some(Duration::from_secs(4))).await;
    let failed = lab.claim_until("c1", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert_eq!(reason(&failed).as_deref(), Some("DeadlineExceeded"));
    // The forced shutdown fires although no machine is observed, then the finalizer comes off.
    let released = lab
        .claim_until("c1", "forced shutdown and release", |c| {
            c.status.as_ref().and_then(|s| s.shutdown_attempts) == Some(1)
                && c.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty())
        })
        .await;
    assert!(released.status.and_then(|s| s.finished_at).is_some());
    assert!(lab.event_reasons("c1").await.iter().any(|r| r == "ClaimFailed"));
}

/// Every value `read` takes of node `name`, in order, from a watch that has listed when this
/// returns (a node that does not exist yet is picked up when it registers). A state that lasts a
/// moment is recorded however slowly the test polls.
async fn record_node<T: PartialEq + Send + 'static>(
    lab: &Lab,
    name: &str,
    read: fn(&CoreNode) -> T,
) -> Arc<Mutex<Vec<T>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(lab.nodes(), config).boxed();
    let (listed, listed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut listed = Some(listed);
        while let Some(Ok(event)) = events.next().await {
            let node = match event {
                watcher::Event::Apply(node) | watcher::Event::InitApply(node) => node,
                watcher::Event::InitDone => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                    continue;
                }
                watcher::Event::Init | watcher::Event::Delete(_) => continue,
            };
            let value = read(&node);
            let mut seen = record.lock().expect("the node record");
            if seen.last() != Some(&value) {
                seen.push(value);
            }
        }
    });
    listed_rx.await.expect("the node watch listed");
    seen
}

/// Every value of `spec.unschedulable` node `name` takes, in order (see [`record_node`]).
async fn record_cordons(lab: &Lab, name: &str) -> Arc<Mutex<Vec<bool>>> {
    record_node(lab, name, |node| node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_never_clears_fails_the_claim_and_uncordons() {
    let lab = Lab::start("ctl-gate", With::Controllers).await;
    let slot = lab.pool(&[("m1", Some("never-clears-gate"))]).await.remove(0);
    let cordons = record_cordons(&lab, &slot).await;
    lab.claim("c1", &slot, None).await;
    // The machine is cordoned while its gate is pending (by hand, or by a kubelet registered
    // unschedulable); the gate is the writer that lifts the cordon, also when it gives up.
    let nodes = lab.nodes();
    eventually("the machine's node to register", ACT, || async {
        nodes.get(&slot).await.context("no node yet")?;
        Ok(())
    })
    .await
    .expect("the node registers");
    let cordon = Patch::Merge(json!({ "spec": { "unschedulable": true } }));
    nodes.patch(&slot, &PatchParams::default(), &cordon).await.expect("cordon the node");

    let failed = lab.claim_until("c1", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert_eq!(reason(&failed).as_deref(), Some("ReadinessGateTimeout"));
    assert!(
        failed
            .status
            .and_then(|s| s.message)
            .is_some_and(|m| m.contains("bootstrap.test/not-ready"))
    );
    // The cordon is lifted before the claim fails; the watch may trail the claim (the record
    // keeps the order, so a longer wait cannot pass a wrong one).
    eventually("the node to be uncordoned after the cordon", ACT, || async {
        let seen = cordons.lock().expect("the cordon record").clone();
        let cordoned_at = seen.iter().position(|c| *c).context("the cordon was never seen")?;
        ensure!(seen[cordoned_at..].contains(&false), "still cordoned: {seen:?}");
        Ok(())
    })
    .await
    .expect("a gate that gives up uncordons the node");
    // The machine is powered off by the forced shutdown (the operator deletes its node once off).
    lab.node_gone(&slot).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newer_of_two_live_claims_on_one_slot_is_superseded() {
    let lab = Lab::start("ctl-supersede", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    // Creation timestamps have one-second resolution; make the order unambiguous.
    eventually("a second to pass", ACT, || async {
        let c1 = lab.claims().get("c1").await?;
        let created = c1.metadata.creation_timestamp.map(|t| t.0).context("creation time")?;
        ensure!(jiff::Timestamp::now().as_second() > created.as_second(), "same second");
        Ok(())
    })
    .await
    .expect("time passes");
    lab.claim("c2", &slot, None).await;
    let superseded =
        lab.claim_until("c2", "superseded", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert_eq!(reason(&superseded).as_deref(), Some("Superseded"));
    assert!(superseded.status.and_then(|s| s.boot_committed_at).is_none(), "it never booted");
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    assert!(lab.event_reasons("c2").await.iter().any(|r| r == "ClaimSuperseded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_machine_that_disappears_fails_machine_gone_after_the_grace() {
    let lab = Lab::start("ctl-gone", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    lab.nodes().delete(&slot, &DeleteParams::default()).await.expect("delete node");
    lab.claim_until("c1", "machine observed off", |c| {
        c.status.as_ref().is_some_and(|s| s.machine_observed_off.is_some())
    })
    .await;
    let gone = lab.claim_until("c1", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert_eq!(reason(&gone).as_deref(), Some("MachineGone"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_up_with_no_claim_is_powered_off() {
    let lab = Lab::start("ctl-unwanted", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    let node: CoreNode = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": slot, "annotations": { KWOK_NODE_ANNOTATION: "fake" } },
    }))
    .expect("node");
    lab.nodes().create(&PostParams::default(), &node).await.expect("machine up");
    lab.node_gone(&slot).await;
    let slot_obj = lab
        .slot_until(&slot, "reported off", |s| {
            s.status.as_ref().and_then(|s| s.phase) == Some(SlotPhase::Off)
        })
        .await;
    assert!(slot_obj.status.and_then(|s| s.last_claim).is_none(), "no claim was involved");
}

/// A machine whose kubelet went silent while no claim wanted it may be off, or on and cut off
/// from the API server (a switch reboot), and a running kubelet never registers a deleted node
/// again. So silence past the grace powers the machine off through its slot's shutdown, and the
/// node stays until a shutdown succeeds: here the first cannot reach the machine (its pod can
/// run nowhere), the link comes back and the kubelet reports on its own node, and the shutdown
/// that then succeeds removes the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_machine_keeps_its_node_until_a_shutdown_confirms_it_off() {
    let lab = Lab::start("ctl-silent", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.power_pods_run(&slot, "shutdownPodSpec", false).await;
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("plane");
    let silent = plane.add_stopped_machine(&slot, BTreeMap::new()).await.expect("silent machine");

    eventually("a shutdown Job to confirm the silent machine off", ACT, || async {
        let reasons = lab.event_reasons(&slot).await;
        ensure!(reasons.iter().any(|r| r == "ConfirmingOff"), "{reasons:?}");
        Ok(())
    })
    .await
    .expect("confirming off");
    let kept = lab
        .slot_until(&slot, "NodeReporting=False with what to do", |s| {
            node_reporting(s).is_some_and(|(ok, message)| {
                !ok && message.contains(&format!("kubectl delete node {slot}"))
            })
        })
        .await;
    assert_eq!(kept.status.and_then(|s| s.power_state), Some(ObservedPower::Off));
    // Past the grace and past the first Job's end (its deadline, however late a loaded machine
    // reports it), and for as long as the controllers take to act on that: the node must stay.
    eventually("the first shutdown Job to fail", ACT, || async {
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        let failed = jobs.iter().any(|job| {
            job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|conditions| {
                conditions.iter().any(|c| c.type_ == "Failed" && c.status == "True")
            })
        });
        ensure!(failed, "{} shutdown Jobs, none failed yet", jobs.len());
        Ok(())
    })
    .await
    .expect("the unreachable shutdown fails");
    let hold = lab::LOADED_MARGIN;
    stays("the silent machine's node kept while no shutdown reached it", hold, || async {
        let node = lab.nodes().get_opt(&slot).await?;
        ensure!(node.is_some_and(|n| n.metadata.uid == silent.metadata.uid), "node removed");
        Ok(())
    })
    .await
    .expect("node kept");

    // The link is back: the kubelet reports on the node it registered, which is still there.
    plane.start_kubelet(&slot).await.expect("kubelet back");
    lab.slot_until(&slot, "NodeReporting=True", |s| node_reporting(s).is_some_and(|(ok, _)| ok))
        .await;
    let back = lab.nodes().get(&slot).await.expect("node");
    assert_eq!(back.metadata.uid, silent.metadata.uid, "the same node, taken back");

    // Up and unwanted, and now reachable: the shutdown lands and the node goes.
    lab.power_pods_run(&slot, "shutdownPodSpec", true).await;
    // A shutdown Job created before the patch still fails: the next one, a settle later, lands.
    eventually("the node removed after a shutdown landed", ACT * 2, || async {
        ensure!(lab.nodes().get_opt(&slot).await?.is_none(), "node {slot} still registered");
        let reasons = lab.event_reasons(&slot).await;
        ensure!(reasons.iter().any(|r| r == "NodeRemoved"), "{reasons:?}");
        Ok(())
    })
    .await
    .expect("node removed");
}

/// Two serving machines behind BMCs on their own ports (one Redfish, one IPMI: real
/// sushy-emulator and OpenIPMI peers) are cut off from the API server for longer than a boot
/// window: their kubelets are silent, but the operator reads each BMC, which reports the machine
/// on. That is a machine on and cut off, not off: each claim stays ready, its slot says so
/// (`NodeReporting` `CutOff`, `BmcRead`), and the claim's `MachineCutOff` event says why. Once a
/// BMC reports its machine off (a power cut), the silence counts again and the claim fails
/// `MachineGone` a boot window later. Judged by their silence alone, both claims failed at the
/// end of the window, and their machines were powered off when the network came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_machine_its_bmc_reports_on_keeps_its_claim() {
    use homelab_harness::power_peers::{IpmiPeer, RedfishPeer};
    use k8s_openapi::api::core::v1::Secret;
    let lab = Lab::start("ctl-bmc-cut", With::Controllers).await;
    let slots = lab.pool(&[("redfish", None), ("ipmi", None)]).await;
    let (on_redfish, on_ipmi) = (&slots[0], &slots[1]);
    let (redfish, ipmi) = tokio::join!(RedfishPeer::start(), IpmiPeer::start());
    let (redfish, ipmi) = (redfish.expect("sushy-emulator"), ipmi.expect("ipmi_sim"));
    let login: Secret = serde_json::from_value(json!({
        "metadata": { "name": "bmc-login" },
        "stringData": { "username": redfish.user, "password": redfish.password },
    }))
    .expect("secret");
    Api::<Secret>::namespaced(lab.client.clone(), &lab.ns)
        .create(&PostParams::default(), &login)
        .await
        .expect("the BMC login");
    let credentials = json!({ "secretName": "bmc-login" });
    let behind = [
        (
            on_redfish,
            json!({ "redfish": { "endpoint": redfish.endpoint(), "credentials": credentials } }),
        ),
        (
            on_ipmi,
            json!({ "ipmi": { "host": "127.0.0.1", "port": ipmi.port, "credentials": credentials } }),
        ),
    ];
    for (slot, power) in &behind {
        let patch = json!({ "spec": { "power": power } });
        lab.slots().patch(slot, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("bmc");
    }
    // The machines boot (their pod specs still power them); their BMCs report them on.
    redfish.reset("On").await.expect("the Redfish machine on");
    ipmi.set_chassis_power(true).expect("the IPMI machine on");
    for (claim, slot) in [("c-redfish", on_redfish), ("c-ipmi", on_ipmi)] {
        lab.claim(claim, slot, None).await;
    }
    for claim in ["c-redfish", "c-ipmi"] {
        lab.claim_until(claim, "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    }

    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("plane");
    for slot in [on_redfish, on_ipmi] {
        plane.stop_kubelet(slot).await.expect("the link goes");
    }
    for slot in [on_redfish, on_ipmi] {
        let said = lab
            .slot_until(slot, "NodeReporting=False (CutOff) from the BMC's reading", |s| {
                slots::condition_reason(s, "NodeReporting").as_deref() == Some("CutOff")
            })
            .await;
        let (_, message) = node_reporting(&said).unwrap_or_default();
        assert!(message.contains("BMC reports the machine powered on"), "{message}");
        let read = said.status.as_ref().and_then(|s| s.bmc_reading.as_ref()).map(|r| r.power);
        assert_eq!(read, Some(ObservedPower::On), "{slot}: status.bmcReading");
        assert_eq!(slots::condition_reason(&said, "BmcRead").as_deref(), Some("Read"));
    }
    // Past a whole boot window of silence, with room for the controllers to act on it.
    let window = lab.timeouts.budget() + lab::LOADED_MARGIN;
    stays("both claims ready while their BMCs report the machines on", window, || async {
        for claim in ["c-redfish", "c-ipmi"] {
            let claim = lab.claims().get(claim).await?;
            ensure!(phase(&claim) == NodeClaimPhase::Ready, "{:?}", claim.status);
        }
        Ok(())
    })
    .await
    .expect("kept");
    for claim in ["c-redfish", "c-ipmi"] {
        let reasons = lab.event_reasons(claim).await;
        assert!(reasons.iter().any(|r| r == "MachineCutOff"), "{claim}: events {reasons:?}");
    }

    // The power fails: the BMCs report the machines off, and the silence counts from then.
    redfish.reset("ForceOff").await.expect("the Redfish machine off");
    ipmi.set_chassis_power(false).expect("the IPMI machine off");
    for claim in ["c-redfish", "c-ipmi"] {
        let gone = lab.claim_until(claim, "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
        assert_eq!(reason(&gone).as_deref(), Some("MachineGone"), "{claim}");
    }
}

/// A ready claim's machine cut off past a boot window fails `MachineGone`, and its forced
/// shutdown cannot reach it (its pod can run nowhere). When the link is back, the machine is up
/// and nothing claims it: it is left `--off-node-grace` to be claimed again, past the settle
/// after the failed attempt (which used to power it off then), and a claim made meanwhile takes
/// it back on the same Node, with no shutdown Job. (Powered off on heal, a pool behind a switch
/// reboot lost every serving machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_back_from_a_partition_is_left_to_be_claimed_again() {
    let settings = MachineSettings { off_node_grace: Duration::from_secs(180), ..lab::settings() };
    let lab = Lab::start_with_settings("ctl-heal", With::Controllers, settings).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.power_pods_run(&slot, "shutdownPodSpec", false).await;
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    let node = lab.nodes().get(&slot).await.expect("node");

    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("plane");
    plane.stop_kubelet(&slot).await.expect("the link goes");
    let gone = lab.claim_until("c1", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert_eq!(reason(&gone).as_deref(), Some("MachineGone"));
    eventually("the forced shutdown to fail", ACT, || async {
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        let failed = jobs.iter().filter(|j| outcome(j) == JobOutcome::Failed).count();
        ensure!(
            failed == jobs.len() && failed > 0,
            "{} shutdown Jobs, {failed} failed",
            jobs.len()
        );
        Ok(())
    })
    .await
    .expect("the forced shutdown fails");
    let tried = lab.lifecycle_jobs("shutdown").await.expect("jobs").len();
    // Reachable from now on: a shutdown, if one were made, would land.
    lab.power_pods_run(&slot, "shutdownPodSpec", true).await;

    plane.start_kubelet(&slot).await.expect("the link is back");
    lab.slot_until(&slot, "NodeReporting=True", |s| node_reporting(s).is_some_and(|(ok, _)| ok))
        .await;
    // Longer than the settle after the failed attempt (registration plus the node monitor's
    // grace, 38 s here), well inside the grace.
    let settle = lab.timeouts.registration + lab.settings.node_monitor_grace;
    stays(
        "no shutdown of the machine back from the partition",
        settle + Duration::from_secs(10),
        || async {
            let jobs = lab.lifecycle_jobs("shutdown").await?;
            ensure!(jobs.len() == tried, "{} shutdown Jobs, {tried} before the heal", jobs.len());
            Ok(())
        },
    )
    .await
    .expect("left to be claimed");

    lab.claim("c2", &slot, None).await;
    lab.claim_until("c2", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    stays("the machine claimed again, on its own Node", lab::LOADED_MARGIN, || async {
        let now = lab.nodes().get(&slot).await?;
        ensure!(now.metadata.uid == node.metadata.uid, "a new Node");
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        ensure!(jobs.len() == tried, "{} shutdown Jobs, {tried} before the heal", jobs.len());
        Ok(())
    })
    .await
    .expect("claimed again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_slot_releases_its_claim() {
    let lab = Lab::start("ctl-slotgone", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    lab.slots().delete(&slot, &DeleteParams::default()).await.expect("delete slot");
    // Garbage collection deletes the claim; the claim controller releases its finalizer after a
    // fresh read confirms the slot is gone, so nothing is left stuck in Terminating.
    lab.claim_gone("c1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_claim_is_collected_after_its_ttl() {
    let lab = Lab::start("ctl-ttl", With::Controllers).await;
    let slot = lab.pool(&[("m1", Some("never-boots"))]).await.remove(0);
    lab.claim_with_ttl("c1", &slot, Some(Duration::from_secs(3)), 1).await;
    let failed = lab.claim_until("c1", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert!(
        failed.status.and_then(|s| s.finished_at).is_some(),
        "a terminal claim carries its end"
    );
    lab.claim_gone("c1").await;
    // The slot keeps the story after the claim is collected.
    let kept = lab
        .slots()
        .get(&slot)
        .await
        .expect("slot")
        .status
        .and_then(|s| s.last_claim)
        .expect("digest");
    assert_eq!(
        (kept.name.as_str(), kept.reason.as_deref(), kept.boot_committed),
        ("c1", Some("DeadlineExceeded"), true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_many_claims_raced_onto_one_slot_exactly_one_boots() {
    let lab = Lab::start("ctl-race", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    let names: Vec<String> = (0..5).map(|i| format!("race-{i}")).collect();
    futures::future::join_all(names.iter().map(|n| lab.claim(n, &slot, None))).await;
    let mut ready = Vec::new();
    for name in &names {
        let settled = lab
            .claim_until(name, "ready or superseded", |c| {
                phase(c) == NodeClaimPhase::Ready
                    || (phase(c) == NodeClaimPhase::Failed
                        && reason(c).as_deref() == Some("Superseded"))
            })
            .await;
        if phase(&settled) == NodeClaimPhase::Ready {
            ready.push(name.clone());
        }
    }
    assert_eq!(ready.len(), 1, "exactly one claim owns the machine: {ready:?}");
    let startup_jobs = lab.lifecycle_jobs("startup").await.expect("jobs");
    assert_eq!(startup_jobs.len(), 1, "one machine was bought");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_finished_while_the_operator_was_down_is_picked_up_from_its_job() {
    let lab = Lab::start("ctl-restart", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "booting", |c| phase(c) == NodeClaimPhase::Booting).await;
    lab.stop_controllers();
    // While nothing watches, the startup Job completes and the machine registers and clears
    // its bootstrap taint (the simulator keeps running).
    let nodes = lab.nodes();
    eventually("the machine up while the operator is down", ACT, || async {
        let node = nodes.get_opt(&slot).await?.context("not registered")?;
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        ensure!(taints.iter().all(|t| t.key != "bootstrap.test/not-ready"), "gate not clear");
        Ok(())
    })
    .await
    .expect("machine up");
    let claim = lab.claims().get("c1").await.expect("claim");
    assert_eq!(phase(&claim), NodeClaimPhase::Booting, "nothing moved it while down");
    lab.start_controllers().await;
    let ready = lab
        .claim_until("c1", "ready after the restart", |c| phase(c) == NodeClaimPhase::Ready)
        .await;
    assert_eq!(ready.status.and_then(|s| s.attempt), Some(1), "the same attempt, not a new boot");
    let startup_jobs = lab.lifecycle_jobs("startup").await.expect("jobs");
    assert_eq!(startup_jobs.len(), 1, "no second startup Job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_job_that_fails_fails_the_claim() {
    let lab = Lab::start("ctl-jobfail", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    // The startup pod can run nowhere: the Job hits its deadline (the budget's Job timeout).
    lab.power_pods_run(&slot, "startupPodSpec", false).await;
    lab.claim("c1", &slot, None).await;
    let failed = lab.claim_until("c1", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    assert_eq!(reason(&failed).as_deref(), Some("StartupJobFailed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdowns_that_do_not_land_are_bounded_and_paused() {
    let lab = Lab::start("ctl-noshut", With::Controllers).await;
    let slot = lab.pool(&[("m1", Some("ignores-shutdown"))]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    lab.scale_down("c1").await;
    let paused = lab
        .claim_until("c1", "three shutdown attempts", |c| {
            c.status.as_ref().and_then(|s| s.shutdown_attempts) == Some(3)
        })
        .await;
    assert!(paused.metadata.deletion_timestamp.is_some(), "the claim waits on its finalizer");
    eventually("the ShutdownAttemptLimitReached warning", ACT, || async {
        let reasons = lab.event_reasons("c1").await;
        ensure!(reasons.iter().any(|r| r == "ShutdownAttemptLimitReached"), "{reasons:?}");
        Ok(())
    })
    .await
    .expect("warning");
    let shutdown_jobs = lab.lifecycle_jobs("shutdown").await.expect("jobs");
    assert_eq!(shutdown_jobs.len(), 3, "no fourth shutdown Job during the pause");
    assert!(lab.nodes().get_opt(&slot).await.expect("node").is_some(), "the machine is still up");
    // The documented reset lets the next attempt fire at once.
    let reset = json!({ "status": { "shutdownAttempts": 0, "lastShutdownAttemptAt": null } });
    lab.claims()
        .patch_status("c1", &PatchParams::default(), &Patch::Merge(&reset))
        .await
        .expect("reset");
    eventually("a fourth shutdown Job after the reset", ACT, || async {
        let n = lab.lifecycle_jobs("shutdown").await?.len();
        ensure!(n == 4, "{n} shutdown Jobs");
        Ok(())
    })
    .await
    .expect("reset fires again");
}

/// With no claim to count them on, the slot's status counts the shutdowns: the pause after three
/// holds when their Jobs are collected (as their TTL does, ten minutes into a 30-minute pause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unclaimed_shutdowns_stay_paused_when_their_jobs_are_collected() {
    let lab = Lab::start("ctl-unclaimed", With::Controllers).await;
    let slot = lab.pool(&[("m1", Some("ignores-shutdown"))]).await.remove(0);
    let node: CoreNode = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": slot, "annotations": { KWOK_NODE_ANNOTATION: "fake" } },
    }))
    .expect("node");
    lab.nodes().create(&PostParams::default(), &node).await.expect("machine up, no claim");
    let attempts = |s: &Node| {
        s.status.as_ref().and_then(|s| s.unclaimed_shutdowns.as_ref()).map(|r| r.attempts)
    };
    eventually("three unclaimed shutdowns and the pause", ACT * 2, || async {
        let counted = attempts(&lab.slots().get(&slot).await?);
        ensure!(counted == Some(3), "attempts {counted:?}");
        let reasons = lab.event_reasons(&slot).await;
        ensure!(reasons.iter().any(|r| r == "ShutdownAttemptLimitReached"), "{reasons:?}");
        Ok(())
    })
    .await
    .expect("paused");
    let background = DeleteParams::background();
    for job in lab.lifecycle_jobs("shutdown").await.expect("jobs") {
        let name = job.metadata.name.expect("job name");
        lab.jobs().delete(&name, &background).await.expect("collect the Job");
    }
    // Longer than a settle between attempts (the lab's 8 s + 30 s): a count taken from the Jobs
    // would have fired again by now.
    stays("no shutdown Job during the pause", Duration::from_secs(60), || async {
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        let live: Vec<_> =
            jobs.iter().filter(|j| j.metadata.deletion_timestamp.is_none()).collect();
        ensure!(live.is_empty(), "{} shutdown Jobs", live.len());
        let counted = attempts(&lab.slots().get(&slot).await?);
        ensure!(counted == Some(3), "attempts {counted:?}");
        Ok(())
    })
    .await
    .expect("the pause holds");
    assert!(lab.nodes().get_opt(&slot).await.expect("node").is_some(), "the machine is still up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_capacity_that_the_node_contradicts_is_reported() {
    let lab = Lab::start("ctl-capacity", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    let declared = json!({ "spec": { "nodeCapacity": { "cpu": "4", "pods": "110" } } });
    lab.slots()
        .patch(&slot, &PatchParams::default(), &Patch::Merge(&declared))
        .await
        .expect("capacity");
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    let condition = |s: &homelab_autoscaler::api::Node| {
        s.status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "CapacityMatches").cloned())
    };
    // The simulated machine registers with the declared capacity.
    lab.slot_until(&slot, "capacity matches", |s| condition(s).is_some_and(|c| c.status == "True"))
        .await;
    // The machine turns out smaller than declared (someone pulled a DIMM).
    let smaller = json!({ "status": { "allocatable": { "cpu": "2", "pods": "110" } } });
    lab.nodes()
        .patch_status(&slot, &PatchParams::default(), &Patch::Merge(&smaller))
        .await
        .expect("node status");
    let drifted = lab
        .slot_until(&slot, "capacity drift reported", |s| {
            condition(s).is_some_and(|c| c.status == "False")
        })
        .await;
    let message = condition(&drifted).map(|c| c.message).unwrap_or_default();
    assert!(message.contains("cpu: declared 4 vs allocatable 2"), "{message}");
}

fn meter_condition(
    slot: &Node,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    slot.status.as_ref()?.conditions.iter().find(|c| c.type_ == "MeterRead").cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plug_meter_is_read_into_the_slot_and_counted_by_the_energy_report() {
    let lab = Lab::start("ctl-meter", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    let meter = ShellyMeter::start(3.5).await.expect("meter");
    let started = std::time::Instant::now();
    let tariff = json!({ "spec": { "energy": { "pricePerKWh": 0.32, "currency": "EUR" } } });
    lab.groups()
        .patch("pool", &PatchParams::default(), &Patch::Merge(&tariff))
        .await
        .expect("tariff");
    let metered = metered_by(&meter, 95.0, 4.0);
    lab.slots()
        .patch(&slot, &PatchParams::default(), &Patch::Merge(&metered))
        .await
        .expect("meter");

    // The machine is off: the reading is its standby draw, and not its on-draw.
    let read = lab
        .slot_until(&slot, "the standby draw read", |s| {
            s.status.as_ref().and_then(|st| st.draw.as_ref()).is_some_and(|d| d.watts == 3.5)
        })
        .await;
    let draw = read.status.as_ref().and_then(|s| s.draw.clone()).expect("draw");
    assert_eq!(draw.when_on_watts, None, "an off machine's reading is not its on-draw");
    assert_eq!(meter_condition(&read).map(|c| c.status).as_deref(), Some("True"));
    // The pool's report counts the slot from its reading, and says so.
    let group = eventually("the report counts the reading", ACT, || async {
        let group = lab.groups().get("pool").await?;
        let savings = group.status.as_ref().and_then(|s| s.savings.clone());
        let measured = savings.map(|s| s.measured_watts).unwrap_or_default();
        anyhow::ensure!(measured.get(&slot) == Some(&3.5), "measuredWatts {measured:?}");
        Ok(group)
    })
    .await
    .expect("measuredWatts");
    let savings = group.status.and_then(|s| s.savings).expect("savings");
    assert!(savings.slots_without_watts.is_empty(), "{:?}", savings.slots_without_watts);

    // Ready, the machine draws 88 W: that reading becomes its on-draw.
    meter.set(88.0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    lab.slot_until(&slot, "the on-draw read while ready", |s| {
        s.status
            .as_ref()
            .and_then(|st| st.draw.as_ref())
            .is_some_and(|d| d.when_on_watts == Some(88.0))
    })
    .await;

    let (_, metrics) = homelab_autoscaler::telemetry::render(None);
    let series = format!("homelab_autoscaler_slot_draw_watts{{group=\"pool\",slot=\"{slot}\"}} 88");
    assert!(metrics.lines().any(|l| l.starts_with(&series)), "no {series} in:\n{metrics}");

    // Events wake the slot often; the meter is still read at most once per interval (the first
    // read, one per interval since, and one in flight). A loaded machine reads less, never more.
    let interval = lab::METER_INTERVAL.as_secs_f64();
    let allowed = started.elapsed().as_secs_f64() / interval + 2.0;
    assert!(
        (meter.reads() as f64) <= allowed,
        "{} reads in {:?}",
        meter.reads(),
        started.elapsed()
    );

    // A meter behind a token the operator may not read: the condition says what to do, and
    // the last reading is kept (the report counts it only while it is fresh).
    let locked = json!({ "spec": { "power": { "http": { "meter": { "request": {
        "url": format!("{}{}", meter.base, ShellyMeter::STATUS),
        "headers": [{ "name": "Authorization", "valuePrefix": "Bearer ",
                      "valueFrom": { "name": "plug-token", "key": "token" } }],
    } } } } } });
    lab.slots().patch(&slot, &PatchParams::default(), &Patch::Merge(&locked)).await.expect("token");
    let failed = lab
        .slot_until(&slot, "the failed read reported", |s| {
            meter_condition(s).is_some_and(|c| c.status == "False")
        })
        .await;
    let message = meter_condition(&failed).map(|c| c.message).unwrap_or_default();
    assert!(message.contains("Secret plug-token"), "{message}");
    assert!(message.contains("energy.meterSecrets"), "{message}");
    let kept = failed.status.as_ref().and_then(|s| s.draw.as_ref()).map(|d| d.when_on_watts);
    assert_eq!(kept, Some(Some(88.0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_timeout_powers_off_past_a_refusing_budget_when_set() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let lab = Lab::start("ctl-pdb", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "precious", "labels": { "app": "precious" } },
        "spec": { "nodeName": slot, "containers": [{ "name": "c", "image": "registry.invalid/app:1" }] },
    }))
    .expect("pod");
    let pods = lab.pods();
    pods.create(&PostParams::default(), &pod).await.expect("pod");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "precious" },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "precious" } } },
    }))
    .expect("pdb");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(lab.client.clone(), &lab.ns);
    budgets.create(&PostParams::default(), &pdb).await.expect("pdb");
    eventually("the pod running and the budget in force", ACT, || async {
        let budget = budgets.get("precious").await?;
        let healthy = budget.status.and_then(|s| s.current_healthy).unwrap_or(0);
        ensure!(healthy == 1, "{healthy} healthy");
        Ok(())
    })
    .await
    .expect("budget");

    lab.scale_down("c1").await;
    let claim = lab.claims().get("c1").await.expect("claim");
    let asked = claim.status.and_then(|s| s.scale_down_requested_at).expect("marked").0;
    let fired = first_shutdown_at(&lab, "the shutdown Job").await;
    // The budget held the drain back until the opt-in `--drain-timeout` (timestamps are whole
    // seconds, so one may be lost), and the pod was never evicted: the machine went down under
    // it anyway. Without the flag it stays on (tests/real_machines.rs).
    let held = i64::try_from(lab::DRAIN_TIMEOUT.as_secs()).expect("seconds") - 1;
    assert!(fired.duration_since(asked).as_secs() >= held, "fired {fired} after asking {asked}");
    let node = lab.nodes().get(&slot).await.expect("node");
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true), "cordoned first");
    lab.claim_gone("c1").await;
}

/// A pod of the test's namespace bound to node `node`, labelled `app: <app>`.
fn pod_on(name: &str, app: &str, node: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": app } },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "registry.invalid/app:1" }] },
    }))
    .expect("pod")
}

/// A PodDisruptionBudget over the pods labelled `app: <app>` that keeps `min_available` of them.
fn budget_over(app: &str, min_available: i32) -> k8s_openapi::api::policy::v1::PodDisruptionBudget {
    serde_json::from_value(json!({
        "metadata": { "name": app },
        "spec": { "minAvailable": min_available, "selector": { "matchLabels": { "app": app } } },
    }))
    .expect("budget")
}

/// The slot's `Drained` condition while a budget holds its drain: its message and since when.
fn drain_hold(slot: &Node) -> Option<(String, jiff::Timestamp)> {
    let conditions = slot.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions
        .iter()
        .find(|c| c.type_ == "Drained" && c.status == "False")
        .map(|c| (c.message.clone(), c.last_transition_time.0))
}

/// When the slot's first shutdown Job was created, waiting for one (`what` names it).
async fn first_shutdown_at(lab: &Lab, what: &str) -> jiff::Timestamp {
    let jobs = eventually(what, ACT, || async {
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        ensure!(!jobs.is_empty(), "no shutdown Job yet");
        Ok(jobs)
    })
    .await
    .expect("shutdown");
    jobs[0].metadata.creation_timestamp.as_ref().expect("created").0
}

/// A lab as installed (no `--drain-timeout`: a budget holds a machine for as long as it
/// refuses), with slot m1's machine booted for claim c1. Returns the lab and the slot.
async fn booted_without_drain_timeout(prefix: &str) -> (Lab, String) {
    let settings = MachineSettings { drain_timeout: None, ..lab::settings() };
    let lab = Lab::start_with_settings(prefix, With::Controllers, settings).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    lab.claim("c1", &slot, None).await;
    lab.claim_until("c1", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    (lab, slot)
}

/// A machine silent before its shutdown (here: no claim, past the grace) is powered off to
/// confirm it, and the slot's shutdown is a pod spec that does not say it reads the machine off:
/// its exit 0 only says the pod ran (a `curl` that ignores an HTTP error, an `ssh ... || true`). Its
/// success confirms nothing, so the Node stays and the slot says why and what to set. Once the
/// slot says its pod confirms (`confirmsPowerState`), the next shutdown's success removes the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_pod_that_does_not_confirm_off_keeps_a_silent_node() {
    let lab = Lab::start("ctl-unconfirmed", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    let confirms = |value: serde_json::Value| json!({ "spec": { "shutdownPodSpec": { "confirmsPowerState": value } } });
    lab.slots()
        .patch(&slot, &PatchParams::default(), &Patch::Merge(&confirms(json!(null))))
        .await
        .expect("patch slot");
    // Silent before the operator looks: a machine that was up and unwanted would get its
    // shutdown first, and the silence that followed would be that shutdown's doing.
    lab.stop_controllers();
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("plane");
    let _silent = plane.add_stopped_machine(&slot, BTreeMap::new()).await.expect("silent machine");
    let registered = lab.nodes().get(&slot).await.expect("node");
    lab.start_controllers().await;

    eventually("a shutdown Job to confirm the silent machine off, succeeded", ACT, || async {
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        let succeeded = jobs.iter().any(|j| matches!(outcome(j), JobOutcome::Succeeded { .. }));
        ensure!(succeeded, "{} shutdown Jobs, none succeeded yet", jobs.len());
        Ok(())
    })
    .await
    .expect("shutdown ran");
    let kept = lab
        .slot_until(&slot, "NodeReporting=False naming confirmsPowerState", |s| {
            node_reporting(s).is_some_and(|(ok, message)| {
                !ok && message.contains("confirmsPowerState")
                    && message.contains(&format!("kubectl delete node {slot}"))
            })
        })
        .await;
    assert_eq!(kept.status.and_then(|s| s.power_state), Some(ObservedPower::Off));
    // Past the settle after that success, and for as long as the controllers take to act on it.
    stays("the silent Node kept", Duration::from_secs(20), || async {
        let node = lab.nodes().get_opt(&slot).await?;
        ensure!(
            node.and_then(|n| n.metadata.uid) == registered.metadata.uid,
            "node {slot} was removed on a shutdown that confirms nothing"
        );
        Ok(())
    })
    .await
    .expect("kept");

    lab.slots()
        .patch(&slot, &PatchParams::default(), &Patch::Merge(&confirms(json!(true))))
        .await
        .expect("patch slot");
    lab.node_gone(&slot).await;
}

/// A slot patch that puts the slot's machine behind `meter` (a Shelly plug the operator reads)
/// and declares its running and standby draw.
fn metered_by(meter: &ShellyMeter, when_on: f64, when_off: f64) -> serde_json::Value {
    json!({ "spec": { "power": {
        "watts": { "whenOn": when_on, "whenOff": when_off },
        "http": { "meter": {
            "request": { "url": format!("{}{}", meter.base, ShellyMeter::STATUS) },
            "wattsPointer": "/apower",
        } },
    } } })
}

/// A machine on a metering plug runs with no Node: one deleted under its running kubelet, which
/// never registers it again. Its plug reads it drawing power, which is all that shows it is on.
/// With no claim wanting it, the slot says so (`NodeReporting` `OnWithoutNode`, an
/// `OnWithoutNode` warning) and its shutdown powers it off: at its next boot the kubelet
/// registers afresh. Once the plug reads standby, nothing more is sent. Reading "no Node" as
/// "off" left such a machine on for good, its pods gone and no scaler counting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_its_plug_reads_on_with_no_node_is_powered_off() {
    let lab = Lab::start("ctl-nodeless", With::Controllers).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    let meter = ShellyMeter::start(32.0).await.expect("meter");
    let metered = metered_by(&meter, 32.0, 1.4);
    lab.slots()
        .patch(&slot, &PatchParams::default(), &Patch::Merge(&metered))
        .await
        .expect("meter");

    eventually("a shutdown for the machine that runs without its Node", ACT, || async {
        let jobs = lab.lifecycle_jobs("shutdown").await?;
        ensure!(!jobs.is_empty(), "no shutdown Job");
        let reasons = slots::event_reasons(&lab.client, &lab.ns, &slot).await?;
        ensure!(reasons.iter().any(|r| r == "OnWithoutNode"), "events {reasons:?}");
        Ok(())
    })
    .await
    .expect("powered off");
    let said = lab
        .slot_until(&slot, "NodeReporting=False (OnWithoutNode)", |s| {
            node_reporting(s).is_some_and(|(ok, message)| {
                !ok && message.contains("plug reads the machine drawing power")
                    && message.contains("systemctl restart kubelet")
            })
        })
        .await;
    let reason = slots::condition_reason(&said, "NodeReporting");
    assert_eq!(reason.as_deref(), Some("OnWithoutNode"));

    // The machine went off: its plug reads standby, and the slot reads "no node" again.
    meter.set(1.4);
    lab.slot_until(&slot, "NodeReporting=True (NoNode)", |s| {
        node_reporting(s).is_some_and(|(ok, _)| ok)
    })
    .await;
    let sent = lab.lifecycle_jobs("shutdown").await.expect("jobs").len();
    stays("no further shutdown for a machine that is off", Duration::from_secs(10), || async {
        let now = lab.lifecycle_jobs("shutdown").await?.len();
        ensure!(now == sent, "{now} shutdown Jobs, {sent} before the plug read standby");
        Ok(())
    })
    .await
    .expect("quiet");
}

/// A machine's kubelet goes silent (a crash, a cut cable) while a budget covers its one pod:
/// kube-controller-manager marks the pod not Ready, the budget counts it unhealthy and refuses
/// its eviction for as long as the machine is silent. Released, the machine's drain does not wait
/// on a pod that is already down: no hold, the shutdown Job goes out to confirm the machine off,
/// and once it succeeds the Node goes (the pod with it). Waiting on that budget held the machine
/// "on, cordoned" for good, with no shutdown ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_machines_drain_does_not_wait_on_a_pod_already_down() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let (lab, slot) = booted_without_drain_timeout("ctl-silent-drain").await;
    let pods = lab.pods();
    pods.create(&PostParams::default(), &pod_on("db-0", "db", &slot)).await.expect("pod");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(lab.client.clone(), &lab.ns);
    budgets.create(&PostParams::default(), &budget_over("db", 1)).await.expect("budget");
    eventually("the pod running and the budget in force", ACT, || async {
        let status = budgets.get("db").await?.status.unwrap_or_default();
        ensure!(status.current_healthy == Some(1), "{:?} healthy", status.current_healthy);
        Ok(())
    })
    .await
    .expect("budget");

    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("plane");
    plane.stop_kubelet(&slot).await.expect("the kubelet stops");
    eventually("the pod marked not Ready, the budget refusing", ACT, || async {
        let pod = pods.get("db-0").await?;
        let ready = pod.status.and_then(|s| s.conditions).unwrap_or_default();
        let ready = ready.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone());
        ensure!(ready.as_deref() == Some("False"), "pod Ready {ready:?}");
        let status = budgets.get("db").await?.status.unwrap_or_default();
        ensure!(status.disruptions_allowed == Some(0), "{:?} allowed", status.disruptions_allowed);
        Ok(())
    })
    .await
    .expect("the pod down");

    lab.scale_down("c1").await;
    eventually("a shutdown Job out to confirm the silent machine off", ACT, || async {
        let slot_obj = lab.slots().get(&slot).await?;
        ensure!(drain_hold(&slot_obj).is_none(), "held: {:?}", drain_hold(&slot_obj));
        ensure!(!lab.lifecycle_jobs("shutdown").await?.is_empty(), "no shutdown Job yet");
        Ok(())
    })
    .await
    .expect("shutdown sent");
    eventually("the node removed once the shutdown confirmed the machine off", ACT, || async {
        ensure!(lab.nodes().get_opt(&slot).await?.is_none(), "node {slot} still registered");
        Ok(())
    })
    .await
    .expect("node removed");
    lab.claim_gone("c1").await;
    let slot_obj = lab.slots().get(&slot).await.expect("slot");
    assert!(drain_hold(&slot_obj).is_none(), "never held: {:?}", drain_hold(&slot_obj));
}

/// A budget refuses the eviction of three of a machine's four pods, the fourth has none. The
/// drain asks first (a dry-run eviction of each pod) and evicts nothing while any is refused: the
/// machine stays on serving all four. The refusals come back at once, not after the client's
/// retries, so the hold is reported within a pass; it is published once, not every pass. Once the
/// budget allows it, every pod is evicted and the machine goes off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_refusing_one_pod_leaves_every_pod_of_the_machine_in_place() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let (lab, slot) = booted_without_drain_timeout("ctl-hold").await;
    let pods = lab.pods();
    let names = ["free", "precious-0", "precious-1", "precious-2"];
    for name in names {
        let app = if name == "free" { "free" } else { "precious" };
        pods.create(&PostParams::default(), &pod_on(name, app, &slot)).await.expect("pod");
    }
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(lab.client.clone(), &lab.ns);
    budgets.create(&PostParams::default(), &budget_over("precious", 3)).await.expect("budget");
    let mut uids = BTreeMap::new();
    eventually("the pods running and the budget in force", ACT, || async {
        let status = budgets.get("precious").await?.status.unwrap_or_default();
        let (healthy, allowed) = (status.current_healthy, status.disruptions_allowed);
        ensure!(
            healthy == Some(3) && allowed == Some(0),
            "{healthy:?} healthy, {allowed:?} allowed"
        );
        Ok(())
    })
    .await
    .expect("budget");
    for name in names {
        uids.insert(name, pods.get(name).await.expect("pod").metadata.uid);
    }

    lab.scale_down("c1").await;
    let claim = lab.claims().get("c1").await.expect("claim");
    let asked = claim.status.and_then(|s| s.scale_down_requested_at).expect("marked").0;
    let held = lab
        .slot_until(&slot, "held by the budget", |s| {
            drain_hold(s).is_some_and(|(m, _)| {
                (0..3).all(|i| m.contains(&format!("pod {}/precious-{i}", lab.ns)))
            })
        })
        .await;
    let (message, since) = drain_hold(&held).expect("held");
    assert!(message.contains(&format!("PodDisruptionBudget {}/precious", lab.ns)), "{message}");
    assert!(!message.contains("/free"), "the pod with no budget is not held: {message}");
    // Each refusal comes back at once: the client's retries of a 429 cost 10 s per refused pod.
    let took = since.duration_since(asked);
    assert!(took.as_secs() < 15, "the hold reported {took:#} after the scale-down");
    // Held: every pod stays, the one with no budget too, and the hold is not published again.
    stays("every pod in place while the budget refuses", Duration::from_secs(20), || async {
        for name in names {
            let pod = pods.get(name).await?;
            ensure!(pod.metadata.uid == uids[name], "pod {name} was replaced");
            ensure!(pod.metadata.deletion_timestamp.is_none(), "pod {name} is being evicted");
        }
        ensure!(lab.lifecycle_jobs("shutdown").await?.is_empty(), "a shutdown Job was created");
        let now = drain_hold(&lab.slots().get(&slot).await?);
        ensure!(now.as_ref() == Some(&(message.clone(), since)), "the hold changed: {now:?}");
        Ok(())
    })
    .await
    .expect("held");
    let published = slots::event_count(&lab.client, &lab.ns, &slot, "DrainBlocked").await;
    assert_eq!(published.expect("events"), 1, "DrainBlocked published once");

    // The budget relaxed: every pod is evicted, and the machine goes off.
    let relax = json!({ "spec": { "minAvailable": 0 } });
    budgets.patch("precious", &PatchParams::default(), &Patch::Merge(&relax)).await.expect("relax");
    lab.claim_gone("c1").await;
    for name in names {
        let pod = pods.get_opt(name).await.expect("read pod");
        assert!(
            pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
            "pod {name} was not evicted"
        );
    }
    lab.slot_until(&slot, "the hold over", |s| drain_hold(s).is_none()).await;
}

/// A machine up with no claim, a budget refusing its pod's eviction: `--drain-timeout` runs from
/// when the hold began (the slot's `Drained` condition, which a restart keeps), so the machine is
/// powered off once it has passed. Meanwhile the hold, and the time it ends at, stay as first
/// published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_timeout_runs_from_the_start_of_a_hold_with_no_claim() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let timeout = Duration::from_secs(20);
    let settings = MachineSettings { drain_timeout: Some(timeout), ..lab::settings() };
    let lab = Lab::start_with_settings("ctl-hold-unclaimed", With::Controllers, settings).await;
    let slot = lab.pool(&[("m1", None)]).await.remove(0);
    // The pod and its budget first, then the machine: up with no claim, it is drained at once.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(lab.client.clone(), &lab.ns);
    budgets.create(&PostParams::default(), &budget_over("precious", 1)).await.expect("budget");
    lab.pods()
        .create(&PostParams::default(), &pod_on("precious", "precious", &slot))
        .await
        .expect("pod");
    let node: CoreNode = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": slot, "annotations": { KWOK_NODE_ANNOTATION: "fake" } },
    }))
    .expect("node");
    lab.nodes().create(&PostParams::default(), &node).await.expect("machine up");

    let held = lab.slot_until(&slot, "held by the budget", |s| drain_hold(s).is_some()).await;
    let (message, since) = drain_hold(&held).expect("held");
    let end =
        since.checked_add(jiff::SignedDuration::try_from(timeout).expect("timeout")).expect("end");
    assert!(message.contains(&format!("at {end} it is powered off anyway")), "{message}");
    stays("the hold as first published", Duration::from_secs(10), || async {
        let now = drain_hold(&lab.slots().get(&slot).await?);
        ensure!(now.as_ref() == Some(&(message.clone(), since)), "the hold changed: {now:?}");
        ensure!(lab.lifecycle_jobs("shutdown").await?.is_empty(), "a shutdown Job was created");
        Ok(())
    })
    .await
    .expect("held");
    let fired = first_shutdown_at(&lab, "the shutdown Job past the drain timeout").await;
    // Timestamps are whole seconds, so one may be lost.
    assert!(fired.duration_since(since).as_secs() >= 19, "fired {fired}, held since {since}");
    let published = slots::event_count(&lab.client, &lab.ns, &slot, "DrainBlocked").await;
    assert_eq!(published.expect("events"), 1, "DrainBlocked published once");
}

const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting";
const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

fn has_taint(node: &CoreNode, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// Waits until `name`'s core Node exists and `pred` holds.
async fn node_until(lab: &Lab, name: &str, what: &str, pred: impl Fn(&CoreNode) -> bool) {
    let nodes = lab.nodes();
    eventually(&format!("node {name}: {what}"), ACT, || async {
        let node = nodes.get_opt(name).await?.context("not registered yet")?;
        ensure!(
            pred(&node),
            "not yet: taints {:?}",
            node.spec.as_ref().and_then(|s| s.taints.clone())
        );
        Ok(())
    })
    .await
    .expect(what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booting_machine_carries_the_autoscaler_startup_taint_until_its_gate_passes() {
    // The kubelet reports NotReady for this long, then the bootstrap taint clears a step later;
    // the gate's own timeout comes on top, so only a gate that never clears runs out of it.
    const NOT_READY_FOR: Duration = Duration::from_secs(3);
    let lab_timeouts = lab::timeouts();
    let timeouts = homelab_autoscaler::claim::Timeouts {
        readiness_gate: lab_timeouts.readiness_gate + NOT_READY_FOR,
        ..lab_timeouts
    };
    let lab = Lab::start_with_timeouts("ctl-startup-taint", With::Controllers, timeouts).await;
    let slots = lab
        .pool(&[("slow", Some("registers-not-ready")), ("stuck", Some("never-clears-gate"))])
        .await;
    let not_ready_for = format!("{}s", NOT_READY_FOR.as_secs());
    let patch =
        json!({ "metadata": { "annotations": { NOT_READY_FOR_ANNOTATION: not_ready_for } } });
    lab.slots()
        .patch(&slots[0], &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    // The NotReady moment is recorded from the watch, not caught by polling.
    let slow_states = record_node(&lab, &slots[0], |n| {
        (homelab_harness::is_ready(n), has_taint(n, STARTUP_TAINT))
    })
    .await;
    lab.claim("c-slow", &slots[0], None).await;
    lab.claim("c-stuck", &slots[1], None).await;

    // Registered but not Ready: cluster-autoscaler must read it as not started.
    eventually("the slow node seen NotReady with the startup taint", ACT, || async {
        let seen = slow_states.lock().expect("the node record").clone();
        ensure!(seen.contains(&(false, true)), "(ready, startup taint) seen: {seen:?}");
        Ok(())
    })
    .await
    .expect("NotReady with the startup taint");
    let ready = lab.claim_until("c-slow", "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    assert!(ready.status.and_then(|s| s.ready_at).is_some());
    node_until(&lab, &slots[0], "the startup taint gone once the claim is ready", |n| {
        homelab_harness::is_ready(n) && !has_taint(n, STARTUP_TAINT)
    })
    .await;

    // A gate that never clears keeps the taint until the claim fails, then it goes too.
    node_until(&lab, &slots[1], "the startup taint while the gate is closed", |n| {
        has_taint(n, STARTUP_TAINT) && has_taint(n, "bootstrap.test/not-ready")
    })
    .await;
    lab.claim_until("c-stuck", "failed", |c| phase(c) == NodeClaimPhase::Failed).await;
    let nodes = lab.nodes();
    eventually("the stuck machine's startup taint removed or its node gone", ACT, || async {
        let node = nodes.get_opt(&slots[1]).await?;
        ensure!(node.is_none_or(|n| !has_taint(&n, STARTUP_TAINT)), "still tainted");
        Ok(())
    })
    .await
    .expect("taint removed after the failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_started_by_hand_is_protected_from_autoscaler_scale_down() {
    let lab = Lab::start("ctl-manual-mark", With::Controllers).await;
    let slots = lab.pool(&[("byhand", None), ("byca", None)]).await;
    lab.claim("c-ca", &slots[1], None).await;
    let mut manual = lab.claims().get("c-ca").await.expect("claim");
    manual.metadata =
        kube::api::ObjectMeta { name: Some("c-hand".into()), ..manual.metadata.clone() };
    manual.metadata.resource_version = None;
    manual.metadata.uid = None;
    manual.metadata.creation_timestamp = None;
    manual.spec.slot_ref.name = slots[0].clone();
    manual.spec.request.call = homelab_autoscaler::api::ClaimCall::Manual;
    manual.spec.request.delta = None;
    manual.metadata.owner_references = None;
    manual.status = None;
    lab.claims().create(&PostParams::default(), &manual).await.expect("manual claim");

    for claim in ["c-hand", "c-ca"] {
        lab.claim_until(claim, "ready", |c| phase(c) == NodeClaimPhase::Ready).await;
    }
    node_until(&lab, &slots[0], "scale-down disabled for the manual claim", |n| {
        let a = n.metadata.annotations.clone().unwrap_or_default();
        a.get(SCALE_DOWN_DISABLED).map(String::as_str) == Some("true")
            && a.get("infra.homecluster.dev/scale-down-disabled-for").map(String::as_str)
                == Some("c-hand")
    })
    .await;
    let by_ca = lab.nodes().get(&slots[1]).await.expect("node");
    assert!(
        !by_ca.metadata.annotations.unwrap_or_default().contains_key(SCALE_DOWN_DISABLED),
        "a machine cluster-autoscaler asked for stays scalable"
    );

    // Releasing the claim releases the machine: drained and powered off.
    lab.claims().delete("c-hand", &DeleteParams::default()).await.expect("delete");
    lab.claim_gone("c-hand").await;
    lab.node_gone(&slots[0]).await;
}
