//! The built-in scaler against a real control plane: kube-apiserver, controller-manager
//! (Deployments, Jobs, garbage collection), scheduler, and kwok playing the machines through the
//! project's simulator. Each test runs the controllers, the simulator and the scaler for its own
//! namespace, and names its pool differently, so pods of one test never select another's
//! machines (nodes are cluster-wide).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::StreamExt;
use homelab_autoscaler::api::{
    ClaimCall, Group, LABEL_GROUP, Node, NodeClaim, NodeClaimPhase, ScalerDecision,
};
use homelab_autoscaler::claim::REQUESTED_BY_SCALER;
use homelab_autoscaler::provider::{Caller, Provider, ProviderConfig, ProviderError};
use homelab_autoscaler::simulator::kubelet::NODE_LABELS_ANNOTATION;
use homelab_harness::claims::{phase, provider_claim_for};
use homelab_harness::lab::{Lab, With};
use homelab_harness::{eventually, is_ready};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

/// How long a test waits for machines to boot or pods to run.
const ACT: Duration = Duration::from_secs(90);
/// How long a test waits for the pool to go back to zero: the hold, then drain and shutdown.
const RELEASE: Duration = Duration::from_secs(120);
/// The shortest hold the Group webhook allows (the webhook is not running here).
const HOLD: Duration = Duration::from_secs(10);
/// How many passes a "nothing happens" observation spans.
const QUIET_PASSES: usize = 3;

/// What these tests do to a Lab, beyond what the harness offers.
trait ScalerSteps {
    /// A builtin pool `group` with a readiness gate on `bootstrap.test/not-ready` and `slots`
    /// slots named `<ns>-<group>-<i>` whose lifecycle Jobs run on the lab node; the Group is
    /// created last.
    async fn pool(
        &self,
        group: &str,
        slots: usize,
        builtin: Value,
        node_labels: Value,
    ) -> Vec<String>;
    /// [`ScalerSteps::pool`] with one slot per entry of `slots`, each merged into its slot's
    /// spec (capacity, pricing, labels).
    async fn pool_of(&self, group: &str, builtin: Value, slots: Vec<Value>) -> Vec<String>;
    /// Waits until the pod `name` runs on the node `node`.
    async fn pod_runs_on(&self, name: &str, node: &str);
    /// A PersistentVolume on the disk of the machine whose node carries `key=value`, bound to
    /// the claim `claim` of the lab's namespace; returns the volume's name.
    async fn volume_on(&self, claim: &str, key: &str, value: &str) -> String;
    /// A bare pod (no owner) with `spec` merged into a one-container pod spec.
    async fn bare_pod(&self, name: &str, spec: Value);
    async fn last_decision(&self, group: &str) -> anyhow::Result<ScalerDecision>;
    /// Waits for `passes` distinct decisions on `group` taken after `since`, checking each with
    /// `check` (a failed check fails the test). The Group's own updates are the clock: every pass
    /// writes its decision, so no fixed sleep is needed.
    async fn over_passes(
        &self,
        group: &str,
        since: Timestamp,
        passes: usize,
        check: impl AsyncCheck,
    );
    /// The claims that are not finished.
    async fn live_claims(&self) -> anyhow::Result<Vec<NodeClaim>>;
    /// Waits until exactly `want` claims are live; returns them.
    async fn live_claims_reach(&self, want: usize) -> Vec<NodeClaim>;
    /// [`ScalerSteps::live_claims_reach`] within `deadline`.
    async fn live_claims_within(&self, want: usize, deadline: Duration) -> Vec<NodeClaim>;
}

impl ScalerSteps for Lab {
    async fn pool(
        &self,
        group: &str,
        slots: usize,
        builtin: Value,
        node_labels: Value,
    ) -> Vec<String> {
        self.pool_of(group, builtin, vec![json!({ "nodeLabels": node_labels }); slots]).await
    }

    async fn pool_of(&self, group: &str, builtin: Value, slots: Vec<Value>) -> Vec<String> {
        let object: Group = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
            "metadata": { "name": group },
            "spec": {
                "driver": "builtin",
                "builtin": builtin,
                "nodeReadinessTaints": [{ "key": "bootstrap.test/not-ready", "effect": "NoSchedule" }],
            },
        }))
        .expect("group");
        let slots_api: Api<Node> = Api::namespaced(self.client.clone(), &self.ns);
        let mut names = Vec::new();
        for (i, extra) in (1..).zip(slots) {
            let name = format!("{}-{group}-{i}", self.ns);
            let pod = json!({ "image": "registry.invalid/power:1", "nodeSelector": { "homelab.test/lab": self.ns } });
            let mut spec = json!({
                "kubernetesNodeName": name, "startupPodSpec": pod, "shutdownPodSpec": pod,
            });
            for (key, value) in extra.as_object().expect("a slot spec object") {
                spec[key] = value.clone();
            }
            let slot: Node = serde_json::from_value(json!({
                "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
                "metadata": { "name": name, "labels": { "group": group } },
                "spec": spec,
            }))
            .expect("slot");
            slots_api.create(&PostParams::default(), &slot).await.expect("create slot");
            names.push(name);
        }
        // The Group last: the scaler's first pass over it sees every slot.
        self.groups().create(&PostParams::default(), &object).await.expect("create group");
        names
    }

    async fn bare_pod(&self, name: &str, spec: Value) {
        let mut full = json!({
            "containers": [{ "name": "app", "image": "registry.invalid/app:1" }],
            "terminationGracePeriodSeconds": 0,
        });
        for (key, value) in spec.as_object().expect("a spec object") {
            full[key] = value.clone();
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "labels": { "app": "scaler-test" } },
            "spec": full,
        }))
        .expect("pod");
        self.pods().create(&PostParams::default(), &pod).await.expect("create pod");
    }

    async fn pod_runs_on(&self, name: &str, node: &str) {
        eventually(&format!("{name} running on {node}"), ACT, || async {
            let pod = self.pods().get(name).await?;
            ensure!(running_on(&pod) == Some(node), "{:?}", pod.status);
            Ok(())
        })
        .await
        .expect("the pod runs where it was woken for");
    }

    async fn volume_on(&self, claim: &str, key: &str, value: &str) -> String {
        let volume_name = format!("{}-{claim}", self.ns);
        let volume: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": { "name": volume_name },
            "spec": {
                "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "", "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": { "path": format!("/var/lib/{claim}") },
                "claimRef": { "namespace": self.ns, "name": claim },
                "nodeAffinity": { "required": { "nodeSelectorTerms": [{ "matchExpressions": [
                    { "key": key, "operator": "In", "values": [value] },
                ] }] } },
            },
        }))
        .expect("volume");
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        volumes.create(&PostParams::default(), &volume).await.expect("create the volume");
        let bound: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": { "name": claim },
            "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                "volumeName": volume_name, "resources": { "requests": { "storage": "1Gi" } },
            },
        }))
        .expect("claim");
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &self.ns);
        claims.create(&PostParams::default(), &bound).await.expect("create the claim");
        volume_name
    }

    async fn last_decision(&self, group: &str) -> anyhow::Result<ScalerDecision> {
        let group = self.groups().get(group).await?;
        group.status.and_then(|s| s.last_decision).context("no decision yet")
    }

    async fn over_passes(
        &self,
        group: &str,
        since: Timestamp,
        passes: usize,
        check: impl AsyncCheck,
    ) {
        let config = watcher::Config::default().fields(&format!("metadata.name={group}"));
        let mut updates = std::pin::pin!(watcher(self.groups(), config).applied_objects());
        let counted = std::cell::Cell::new(0_usize);
        let observed = async {
            let mut seen = BTreeSet::new();
            while seen.len() < passes {
                let Some(next) = updates.next().await else { break };
                let group = next.expect("watching the group");
                let Some(decision) = group.status.and_then(|s| s.last_decision) else { continue };
                if decision.at.0 < since || seen.contains(&decision.at.0) {
                    continue;
                }
                check.check(self, &decision).await;
                seen.insert(decision.at.0);
                counted.set(seen.len());
            }
            seen.len()
        };
        let got = tokio::time::timeout(ACT, observed).await.unwrap_or_else(|_| {
            panic!(
                "{passes} scaler passes on {group} after {since} within {ACT:?}; saw {}",
                counted.get()
            )
        });
        assert_eq!(got, passes, "the watch on {group} ended early");
    }

    async fn live_claims_reach(&self, want: usize) -> Vec<NodeClaim> {
        self.live_claims_within(want, ACT).await
    }

    async fn live_claims_within(&self, want: usize, deadline: Duration) -> Vec<NodeClaim> {
        eventually(&format!("{want} live claims"), deadline, || async {
            let claims = self.live_claims().await?;
            ensure!(claims.len() == want, "{} live claims", claims.len());
            Ok(claims)
        })
        .await
        .expect("live claims")
    }

    async fn live_claims(&self) -> anyhow::Result<Vec<NodeClaim>> {
        let all = self.claims().list(&ListParams::default()).await?.items;
        Ok(all.into_iter().filter(is_live).collect())
    }
}

/// A check run on each decision by [`Lab::over_passes`].
trait AsyncCheck {
    async fn check(&self, lab: &Lab, decision: &ScalerDecision);
}

fn is_live(claim: &NodeClaim) -> bool {
    matches!(
        phase(claim),
        NodeClaimPhase::Pending | NodeClaimPhase::Booting | NodeClaimPhase::Ready
    )
}

fn running_on(pod: &Pod) -> Option<&str> {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    running.then(|| pod.spec.as_ref().and_then(|s| s.node_name.as_deref())).flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pending_pods_boot_three_machines_and_the_pool_returns_to_zero_after_the_hold() {
    let lab = Lab::start("scaler-up", With::ControllersAndScaler).await;
    let slots = lab
        .pool("pool", 3, json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 3 }), json!({}))
        .await;

    // A builtin pool is not offered to cluster-autoscaler.
    let provider = Provider::start(lab.client.clone(), ProviderConfig::new(lab.ns.clone()));
    provider.wait_synced(ACT).await.expect("provider caches");
    eventually("the pool in the provider's cache", ACT, || async {
        ensure!(provider.snapshots(homelab_autoscaler::api::ScalingDriver::Builtin)?.len() == 1);
        Ok(())
    })
    .await
    .expect("cached");
    let ca = Caller::cluster_autoscaler();
    assert!(provider.node_groups(&ca).expect("node groups").is_empty());
    assert!(matches!(provider.snapshot(&ca, "pool"), Err(ProviderError::WrongDriver { .. })));

    for i in 1..=3 {
        lab.bare_pod(&format!("work-{i}"), json!({ "nodeSelector": { LABEL_GROUP: "pool" } }))
            .await;
    }

    let claims = lab.live_claims_reach(3).await;
    let claimed: BTreeSet<&str> = claims.iter().map(|c| c.spec.slot_ref.name.as_str()).collect();
    assert_eq!(claimed.len(), 3, "one claim per slot");
    // The pods arrive one by one, so a pass may see one or two of them and claim that many; the
    // pass that claims the third machine saw all three.
    let reasons: Vec<&str> =
        claims.iter().map(|c| c.spec.request.reason.as_deref().unwrap_or_default()).collect();
    for (claim, reason) in claims.iter().zip(&reasons) {
        assert_eq!(claim.spec.requested_by.as_deref(), Some(REQUESTED_BY_SCALER));
        assert!(
            reason.starts_with("demand ") && reason.contains("claiming"),
            "the decision's reason is on the claim: {reason}"
        );
    }
    assert!(
        reasons.iter().any(|r| r.starts_with("demand 3 pod(s)")),
        "the pass that claimed the third machine saw the three pods: {reasons:?}"
    );

    eventually("three claims ready and three machines Ready", ACT, || async {
        let ready =
            lab.live_claims().await?.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).count();
        ensure!(ready == 3, "{ready} claims ready");
        for slot in &slots {
            let node = lab
                .nodes()
                .get_opt(slot)
                .await?
                .with_context(|| format!("{slot} not registered"))?;
            ensure!(is_ready(&node), "{slot} not Ready");
        }
        Ok(())
    })
    .await
    .expect("three ready machines");

    eventually("three pods Running on the pool", ACT, || async {
        let pods = lab.pods().list(&ListParams::default().labels("app=scaler-test")).await?.items;
        let on_pool = pods
            .iter()
            .filter(|p| running_on(p).is_some_and(|n| slots.iter().any(|s| s == n)))
            .count();
        ensure!(on_pool == 3, "{on_pool} of 3 pods Running on the pool");
        Ok(())
    })
    .await
    .expect("pods running");
    eventually("the decision to show the pool at its target", ACT, || async {
        let d = lab.last_decision("pool").await?;
        ensure!((d.demand, d.target, d.action.as_str()) == (3, 3, "None"), "{d:?}");
        Ok(())
    })
    .await
    .expect("at target");

    let deleted_at = Timestamp::now();
    lab.pods()
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=scaler-test"),
        )
        .await
        .expect("delete the pods");

    // The first release is not before the hold. A claim is caught while its machine shuts down
    // (it is marked first); if every claim were already gone, the decision's record still shows
    // it came after the hold.
    let first_release = eventually("a machine to be released", RELEASE, || async {
        let claims = lab.claims().list(&ListParams::default()).await?.items;
        let marked = claims
            .iter()
            .filter_map(|c| c.status.as_ref().and_then(|s| s.scale_down_requested_at.as_ref()))
            .map(|t| t.0)
            .min();
        ensure!(marked.is_some() || claims.is_empty(), "no claim marked yet");
        Ok(marked)
    })
    .await
    .expect("a release");
    if let Some(at) = first_release {
        // The scaler's clock and the stored mark both keep whole seconds: allow the two seconds
        // the truncations can take off.
        let waited = at.duration_since(deleted_at);
        assert!(
            waited
                >= jiff::SignedDuration::try_from(HOLD).expect("hold")
                    - jiff::SignedDuration::from_secs(2),
            "released {waited:#} after the pods went, before the hold of {HOLD:?}"
        );
    }
    for claim in lab.claims().list(&ListParams::default()).await.expect("claims").items {
        if let Some(by) = claim.status.as_ref().and_then(|s| s.scale_down_requested_by.as_deref()) {
            assert!(by.starts_with(REQUESTED_BY_SCALER), "released by the scaler: {by}");
        }
    }

    eventually("the pool at zero", RELEASE, || async {
        let live = lab.live_claims().await?.len();
        let mut up = Vec::new();
        for slot in &slots {
            if lab.nodes().get_opt(slot).await?.is_some() {
                up.push(slot.clone());
            }
        }
        ensure!(live == 0 && up.is_empty(), "{live} live claims, machines up: {up:?}");
        let d = lab.last_decision("pool").await?;
        ensure!((d.demand, d.target) == (0, 0), "{d:?}");
        Ok(())
    })
    .await
    .expect("pool at zero");
}

/// No demand and no claim on any of the passes checked.
struct NothingWanted;

impl AsyncCheck for NothingWanted {
    async fn check(&self, lab: &Lab, decision: &ScalerDecision) {
        assert_eq!((decision.demand, decision.target), (0, 0), "{decision:?}");
        let claims = lab.claims().list(&ListParams::default()).await.expect("claims").items;
        assert!(
            claims.is_empty(),
            "no claim, yet: {:?}",
            claims.iter().map(|c| &c.metadata.name).collect::<Vec<_>>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_elsewhere_creates_no_demand() {
    let lab = Lab::start("scaler-fits", With::ControllersAndScaler).await;
    // The pool's machines would carry the lab label too, so both pods below select the pool's
    // template; but the lab node, which is up, admits them as well.
    let lab_label = json!({ "homelab.test/lab": lab.ns });
    // Placed by the scheduler on the lab node before the pool exists: a pod the scheduler
    // judged Unschedulable for a moment (a node it had not seen yet) would be demand, rightly.
    lab.bare_pod("placed", json!({ "nodeSelector": lab_label })).await;
    let lab_node = format!("{}-lab", lab.ns);
    eventually("the placed pod Running on the lab node", ACT, || async {
        let pod = lab.pods().get("placed").await?;
        ensure!(
            running_on(&pod) == Some(lab_node.as_str()),
            "not yet: {:?}",
            pod.status.map(|s| s.phase)
        );
        Ok(())
    })
    .await
    .expect("placed");
    // Never judged nor bound (no such scheduler runs): it stays pending, and it fits the lab node,
    // so the scaler must not count it either.
    lab.bare_pod(
        "unjudged",
        json!({ "nodeSelector": lab_label, "schedulerName": "homelab-test-absent-scheduler" }),
    )
    .await;

    // Every pass over the pool, from its first, lists both pods.
    let since = Timestamp::now();
    lab.pool(
        "spill",
        2,
        json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 2 }),
        lab_label.clone(),
    )
    .await;
    lab.over_passes("spill", since, QUIET_PASSES + 1, NothingWanted).await;
    let unjudged = lab.pods().get("unjudged").await.expect("pod");
    assert!(
        unjudged.spec.and_then(|s| s.node_name).is_none(),
        "the pod stayed unbound, so the fit check (not the scheduler) kept demand at zero"
    );
}

/// A pod that only one machine can run, and two pods of ordinary work, wait for a pool of three
/// with maxNodes 2, and the first pass over the pool sees them all: it wakes the one machine and
/// decides for the rest, and the two together stay within maxNodes: two claims, ever. A decision
/// that did not count the wake of its own pass claimed two more, three machines in a pool of
/// at most two (the surplus one released a few passes later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_wakes_a_machine_and_scales_up_stays_within_max_nodes() {
    let lab = Lab::start("scaler-cap", With::ControllersAndScaler).await;
    // Every claim ever made, however soon it is released and collected.
    let ever = homelab_harness::real_lab::first_seen(lab.claims());
    let pinned_to = format!("{}-cap-1", lab.ns);
    lab.bare_pod("pinned", json!({ "nodeSelector": { "kubernetes.io/hostname": pinned_to } }))
        .await;
    for i in 1..=2 {
        lab.bare_pod(&format!("work-{i}"), json!({ "nodeSelector": { LABEL_GROUP: "cap" } })).await;
    }
    lab.pool("cap", 3, json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 2 }), json!({})).await;
    let claims = lab.live_claims_reach(2).await;
    let woke = claims.iter().find(|c| c.spec.slot_ref.name == pinned_to);
    let reason = woke.and_then(|c| c.spec.request.reason.as_deref()).unwrap_or_default();
    assert!(
        reason.contains("/pinned is pending"),
        "the pinned pod's machine woken for it: {reason}"
    );
    // Passes after both claims exist: none makes another, and none was made before.
    lab.over_passes("cap", Timestamp::now(), QUIET_PASSES, EverMade(ever)).await;
}

/// Every claim ever made: never more than two, on every pass checked.
struct EverMade(Arc<std::sync::Mutex<std::collections::HashMap<String, NodeClaim>>>);

impl AsyncCheck for EverMade {
    async fn check(&self, _: &Lab, decision: &ScalerDecision) {
        let made: Vec<String> = self
            .0
            .lock()
            .map(|m| m.values().map(|c| c.spec.slot_ref.name.clone()).collect())
            .unwrap_or_default();
        assert!(made.len() <= 2, "claims made on {made:?} with maxNodes 2 ({decision:?})");
    }
}

/// Two pods of work, two machines, on every pass checked.
struct TwoOfTwo;

impl AsyncCheck for TwoOfTwo {
    async fn check(&self, lab: &Lab, decision: &ScalerDecision) {
        assert_eq!((decision.demand, decision.target), (2, 2), "{decision:?}");
        let claims = lab.claims().list(&ListParams::default()).await.expect("claims").items;
        assert_eq!(claims.len(), 2, "exactly two claims were ever made");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_of_two_replicas_counts_two_not_four() {
    let lab = Lab::start("scaler-deploy", With::ControllersAndScaler).await;
    // With podsPerNode 1 and three slots, counting a Deployment twice (2 replicas + 2 pods)
    // would claim all three machines.
    lab.pool("deploy", 3, json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 3 }), json!({}))
        .await;

    // Every decision from now on, by watching the Group: the highest demand ever shown. The
    // Deployment comes once the watch has listed, however long that takes, so none is missed.
    let highest = Arc::new(AtomicI32::new(0));
    let config = watcher::Config::default().fields("metadata.name=deploy");
    let mut decisions = watcher(lab.groups(), config).boxed();
    let seen = highest.clone();
    let (listed, listed_rx) = tokio::sync::oneshot::channel();
    let watching = tokio::spawn(async move {
        let mut listed = Some(listed);
        while let Some(Ok(event)) = decisions.next().await {
            match event {
                watcher::Event::Apply(group) | watcher::Event::InitApply(group) => {
                    if let Some(d) = group.status.and_then(|s| s.last_decision) {
                        seen.fetch_max(d.demand, Ordering::SeqCst);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                watcher::Event::Init | watcher::Event::Delete(_) => {}
            }
        }
    });
    listed_rx.await.expect("the Group's watch listed");

    let web: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": {
                    "nodeSelector": { LABEL_GROUP: "deploy" },
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{ "name": "web", "image": "registry.invalid/web:1" }],
                },
            },
        },
    }))
    .expect("deployment");
    Api::<Deployment>::namespaced(lab.client.clone(), &lab.ns)
        .create(&PostParams::default(), &web)
        .await
        .expect("create deployment");

    eventually("two ready claims and two pods Running on the pool", ACT, || async {
        let ready =
            lab.live_claims().await?.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).count();
        ensure!(ready == 2, "{ready} claims ready");
        let pods = lab.pods().list(&ListParams::default().labels("app=web")).await?.items;
        let running = pods.iter().filter(|p| running_on(p).is_some()).count();
        ensure!(running == 2, "{running} of 2 pods Running");
        Ok(())
    })
    .await
    .expect("two machines");

    lab.over_passes("deploy", Timestamp::now(), QUIET_PASSES, TwoOfTwo).await;
    watching.abort();
    assert_eq!(highest.load(Ordering::SeqCst), 2, "no decision ever counted the Deployment twice");
}

/// A pod pinned to one machine that cannot run it once it is up (it asks for more memory than
/// the machine has; placement judges labels and taints, not resources) wakes that machine once.
/// The scheduler's refusal on the woken machine stops the waking, with a Warning on the pod
/// quoting it: the pool boots no other machine for the pod, and once the hold has released the
/// machine, no pass wakes it again. A pod that went back into the pool's count once its machine
/// was up, and woke the released machine again, cost a power cycle per hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_its_woken_machine_cannot_run_wakes_it_once() {
    let lab = Lab::start("scaler-loop", With::ControllersAndScaler).await;
    let ever = homelab_harness::real_lab::first_seen(lab.claims());
    let small = json!({ "nodeCapacity": { "cpu": "2", "memory": "1Gi", "pods": "110" } });
    let slots = lab
        .pool_of("loop", json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 2 }), vec![small; 2])
        .await;
    let pinned_to = &slots[0];
    lab.bare_pod(
        "too-big",
        json!({
            "nodeSelector": { "kubernetes.io/hostname": pinned_to },
            "containers": [{
                "name": "app", "image": "registry.invalid/app:1",
                "resources": { "requests": { "memory": "4Gi" } },
            }],
        }),
    )
    .await;

    let quoted = eventually("a Warning on the pod quoting the scheduler", ACT, || async {
        let events: Api<Event> = Api::namespaced(lab.client.clone(), &lab.ns);
        let list =
            events.list(&ListParams::default().fields("involvedObject.name=too-big")).await?;
        let warning = list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("WokenMachineCannotRunPod"))
            .context("no WokenMachineCannotRunPod event yet")?;
        Ok(warning.message.unwrap_or_default())
    })
    .await
    .expect("the scaler stops waking for the pod and says why");
    assert!(quoted.contains("Insufficient memory"), "the scheduler's reason quoted: {quoted}");
    assert!(quoted.contains(pinned_to.as_str()), "the machine named: {quoted}");

    // The hold releases the machine; then passes go by with the pod still pending.
    lab.live_claims_within(0, RELEASE).await;
    lab.over_passes("loop", Timestamp::now(), QUIET_PASSES, WokenOnce(ever)).await;
    let pod = lab.pods().get("too-big").await.expect("the pod");
    assert_eq!(running_on(&pod), None, "the pod never ran");
}

/// One claim ever made, on the pinned pod's machine.
struct WokenOnce(Arc<std::sync::Mutex<std::collections::HashMap<String, NodeClaim>>>);

impl AsyncCheck for WokenOnce {
    async fn check(&self, _: &Lab, decision: &ScalerDecision) {
        let made: Vec<String> = self
            .0
            .lock()
            .map(|m| m.values().map(|c| c.spec.slot_ref.name.clone()).collect())
            .unwrap_or_default();
        assert_eq!(made.len(), 1, "claims made on {made:?} for one pod ({decision:?})");
    }
}

/// A pool of two cheap machines and a GPU box: the GPU slot declares `nvidia.com/gpu: 1` in its
/// capacity and costs the most, and its simulated kubelet's Node offers the GPU, as a device
/// plugin's registration makes a real one do. Work that needs no GPU wakes the cheapest machine
/// and never the GPU box; a pod that asks for the GPU wakes the GPU box, and only it, while a
/// cheap machine is still free, and runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_machine_is_woken_only_for_gpu_work() {
    let lab = Lab::start("scaler-gpu", With::ControllersAndScaler).await;
    let ever = homelab_harness::real_lab::first_seen(lab.claims());
    let machine = |rate: f64, capacity: Value| json!({ "nodeCapacity": capacity, "pricing": { "hourlyRate": rate } });
    let slots = lab
        .pool_of(
            "gpu",
            json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 3 }),
            vec![
                machine(0.01, json!({ "cpu": "4", "memory": "8Gi", "pods": "110" })),
                machine(0.02, json!({ "cpu": "4", "memory": "8Gi", "pods": "110" })),
                machine(
                    0.10,
                    json!({ "cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1" }),
                ),
            ],
        )
        .await;
    let (cheapest, gpu_box) = (&slots[0], &slots[2]);

    lab.bare_pod("cpu-work", json!({ "nodeSelector": { LABEL_GROUP: "gpu" } })).await;
    let claims = lab.live_claims_reach(1).await;
    assert_eq!(&claims[0].spec.slot_ref.name, cheapest, "CPU work wakes the cheapest machine");
    lab.pod_runs_on("cpu-work", cheapest).await;

    lab.bare_pod(
        "gpu-work",
        json!({
            "nodeSelector": { LABEL_GROUP: "gpu" },
            "containers": [{
                "name": "app", "image": "registry.invalid/app:1",
                "resources": { "limits": { "nvidia.com/gpu": "1" } },
            }],
        }),
    )
    .await;
    let claims = lab.live_claims_reach(2).await;
    let woken: BTreeSet<&str> = claims.iter().map(|c| c.spec.slot_ref.name.as_str()).collect();
    assert_eq!(woken, BTreeSet::from([cheapest.as_str(), gpu_box.as_str()]));
    lab.pod_runs_on("gpu-work", gpu_box).await;
    let made: Vec<String> = ever
        .lock()
        .map(|m| m.values().map(|c| c.spec.slot_ref.name.clone()).collect())
        .unwrap_or_default();
    assert_eq!(made.len(), 2, "one machine each, never the second cheap one: {made:?}");
}

/// A PersistentVolume keyed on a label the machine's kubelet puts on its Node (TopoLVM's
/// `topology.topolvm.io/node`, here through `--node-labels`), which the slot does not declare.
/// The slot records the labels its Node carried when last seen, so once the machine has been up,
/// a pod whose volume is keyed so wakes it. A template of declared labels alone fitted no slot:
/// the pod was never woken, and nothing said why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_keyed_on_a_label_the_kubelet_registers_wakes_its_machine() {
    let lab = Lab::start("scaler-lvm", With::ControllersAndScaler).await;
    let slots = lab
        .pool("lvm", 2, json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 2 }), json!({}))
        .await;
    let disk = &slots[1];
    let key = "topology.topolvm.io/node";
    let registers = json!({ "metadata": { "annotations": {
        NODE_LABELS_ANNOTATION: format!("{key}={disk}"),
    } } });
    lab.slots()
        .patch(disk, &PatchParams::default(), &Patch::Merge(&registers))
        .await
        .expect("the kubelet's --node-labels");

    // Up once, for a pod pinned to it by hostname: the slot learns its node's labels.
    lab.bare_pod("first", json!({ "nodeSelector": { "kubernetes.io/hostname": disk } })).await;
    lab.pod_runs_on("first", disk).await;
    lab.pods().delete("first", &DeleteParams::default()).await.expect("delete the first pod");
    lab.live_claims_within(0, RELEASE).await;

    let volume_name = lab.volume_on("data", key, disk).await;
    lab.bare_pod(
        "db",
        json!({ "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "data" } }] }),
    )
    .await;

    let woken = lab.live_claims_reach(1).await;
    assert_eq!(&woken[0].spec.slot_ref.name, disk, "the machine the volume is on");
    let reason = woken[0].spec.request.reason.as_deref().unwrap_or_default();
    assert!(reason.contains(&volume_name), "the claim names the volume: {reason}");
    lab.pod_runs_on("db", disk).await;
    let slot = lab.slots().get(disk).await.expect("the slot");
    let labels = slot.status.map(|s| s.node_labels).unwrap_or_default();
    assert_eq!(labels.get(key), Some(disk), "status.nodeLabels: {labels:?}");
}

/// A pin (a schedule window alike) that ends while a pod runs on the machine its data is on
/// does not power the machine off: the scaler claims the machine for the pod on the spot, and
/// the slot's shutdown waits for that. Powered off, the machine's pod was evicted, and the new
/// pod its controller made could run on that machine only, which the scaler then woke again: a
/// power cycle at every window's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_a_pin_hands_a_machine_holding_a_running_pods_data_to_the_pod() {
    let lab = Lab::start("scaler-pin-end", With::ControllersAndScaler).await;
    let slots = lab
        .pool("pin", 2, json!({ "hold": "10s", "podsPerNode": 1, "maxNodes": 2 }), json!({}))
        .await;
    let disk = &slots[1];
    let mut pin =
        provider_claim_for("pin", disk, &lab.slots(), &lab.groups(), lab.timeouts, "test")
            .await
            .expect("a claim");
    pin.spec.request.call = ClaimCall::Manual;
    pin.spec.request.delta = None;
    let until = Timestamp::now() + jiff::SignedDuration::from_secs(30);
    pin.spec.until = Some(Time(until));
    lab.claims().create(&PostParams::default(), &pin).await.expect("the pin");

    lab.volume_on("data", "kubernetes.io/hostname", disk).await;
    lab.bare_pod(
        "db",
        json!({ "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "data" } }] }),
    )
    .await;
    lab.pod_runs_on("db", disk).await;
    let uid = lab.pods().get("db").await.expect("the pod").metadata.uid;

    eventually("the pin ends", ACT, || async {
        let pin = lab.claims().get("pin").await?;
        let reason = pin.status.as_ref().and_then(|s| s.reason.as_deref());
        ensure!(
            phase(&pin) == NodeClaimPhase::Completed && reason == Some("Expired"),
            "{:?}",
            pin.status
        );
        Ok(())
    })
    .await
    .expect("the pin expired");
    let handed = lab.live_claims_reach(1).await;
    assert_eq!(&handed[0].spec.slot_ref.name, disk);
    let by = handed[0].spec.requested_by.as_deref().unwrap_or_default();
    assert!(by.ends_with("/db"), "claimed for the pod: {by}");
    lab.over_passes(
        "pin",
        Timestamp::now(),
        QUIET_PASSES,
        StillRunning { uid, node: disk.clone() },
    )
    .await;
}

/// The pod `db` is the one first seen, and runs on `node`, on every pass checked.
struct StillRunning {
    uid: Option<String>,
    node: String,
}

impl AsyncCheck for StillRunning {
    async fn check(&self, lab: &Lab, decision: &ScalerDecision) {
        let pod = lab.pods().get("db").await.expect("the pod is still there");
        assert_eq!(pod.metadata.uid, self.uid, "the same pod, never evicted ({decision:?})");
        assert_eq!(running_on(&pod), Some(self.node.as_str()), "on its machine ({decision:?})");
    }
}
