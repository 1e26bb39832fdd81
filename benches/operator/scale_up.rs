//! The control plane's own overhead in a scale-up and a scale-down, with a simulated machine
//! that boots in zero time (`homelab-autoscaler simulate --boot-delay=0s --gate-delay=0s`):
//!
//! - IncreaseSize → the startup Job exists;
//! - the startup Job complete → the claim `ready` (split into the simulator registering the
//!   node, kwok making it Ready, and the operator passing the readiness gate);
//! - DeleteNodes → the shutdown Job exists.
//!
//! Every instant is when a watch in this process first saw the change, so the watch's own
//! delivery delay is on both ends of each interval.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use homelab_autoscaler::api::{LABEL_LIFECYCLE, LABEL_NODECLAIM, Node as Slot, NodeClaim};
use homelab_autoscaler::grpc::proto;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use serde_json::json;

use crate::grpc;
use crate::stats::Samples;

/// The pool's readiness taint (the Group's default), which the simulator registers the node
/// with and lifts after its gate delay (zero here).
const READINESS_TAINT: &str = "node.cilium.io/agent-not-ready";
const GROUP: &str = "workers";

/// One change, first seen at `at`: what it was and of which object.
#[derive(Clone, Debug)]
struct Event {
    at: Instant,
    what: String,
    name: String,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Event>>>);

impl Log {
    fn note(&self, what: String, name: &str) {
        if let Ok(mut log) = self.0.lock()
            && !log.iter().any(|e| e.what == what && e.name == name)
        {
            log.push(Event { at: Instant::now(), what, name: name.to_string() });
        }
    }

    /// The first event `what` after `since`, with its object's name.
    fn first(&self, what: &str, since: Instant) -> Option<(Instant, String)> {
        let log = self.0.lock().ok()?;
        log.iter().find(|e| e.what == what && e.at >= since).map(|e| (e.at, e.name.clone()))
    }

    fn of(&self, what: &str, name: &str) -> Option<Instant> {
        let log = self.0.lock().ok()?;
        log.iter().find(|e| e.what == what && e.name == name).map(|e| e.at)
    }

    async fn wait(
        &self,
        what: &str,
        since: Instant,
        timeout: Duration,
    ) -> Result<(Instant, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.first(what, since) {
                return Ok(found);
            }
            if Instant::now() > deadline {
                bail!("no {what} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn wait_of(&self, what: &str, name: &str, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.of(what, name) {
                return Ok(at);
            }
            if Instant::now() > deadline {
                bail!("no {what} of {name} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Records claims (first sight, each phase), Jobs (created, complete) and the slot's node
/// (registered, Ready, free of the pool's readiness taint, gone).
fn watch(client: &Client, ns: &str, node: &str, log: &Log) -> Vec<tokio::task::JoinHandle<()>> {
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
    let node_fields = format!("metadata.name={node}");
    vec![
        tokio::spawn(async move {
            let mut stream = watcher(claims, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(claim)) = stream.next().await {
                let name = claim.name_any();
                l1.note("claim-new".into(), &name);
                let phase = claim.status.as_ref().and_then(|s| s.phase);
                if let Some(phase) = phase {
                    l1.note(format!("claim-{phase:?}").to_lowercase(), &name);
                }
            }
        }),
        tokio::spawn(async move {
            let mut stream = watcher(jobs, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(job)) = stream.next().await {
                let labels = job.labels();
                let (Some(lifecycle), Some(claim)) =
                    (labels.get(LABEL_LIFECYCLE), labels.get(LABEL_NODECLAIM))
                else {
                    continue;
                };
                l2.note(format!("job-new-{lifecycle}"), claim);
                let complete =
                    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                        c.iter().any(|c| c.type_ == "Complete" && c.status == "True")
                    });
                if complete {
                    l2.note(format!("job-complete-{lifecycle}"), claim);
                }
            }
        }),
        tokio::spawn(async move {
            let config = watcher::Config::default().fields(&node_fields);
            let mut stream = watcher(nodes, config).boxed();
            while let Some(Ok(event)) = stream.next().await {
                match event {
                    watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                        let name = node.name_any();
                        l3.note("node-new".into(), &name);
                        if homelab_harness::is_ready(&node) {
                            l3.note("node-ready".into(), &name);
                        }
                        let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
                        let clear =
                            taints.is_none_or(|t| t.iter().all(|t| t.key != READINESS_TAINT));
                        if homelab_harness::is_ready(&node) && clear {
                            l3.note("node-clear".into(), &name);
                        }
                    }
                    watcher::Event::Delete(node) => l3.note("node-gone".into(), &node.name_any()),
                    _ => {}
                }
            }
        }),
    ]
}

/// The measured intervals over every round.
#[derive(Default)]
pub struct Overheads {
    pub increase_to_startup_job: Samples,
    pub job_complete_to_ready: Samples,
    pub job_complete_to_node: Samples,
    pub node_to_usable: Samples,
    pub usable_to_ready: Samples,
    pub delete_to_shutdown_job: Samples,
}

/// A Group `workers` with one slot whose lifecycle pods run on the lab node `lab_node`.
pub async fn write_pool(client: &Client, ns: &str, slot: &str, lab: &str) -> Result<()> {
    let groups: Api<homelab_autoscaler::api::Group> = Api::namespaced(client.clone(), ns);
    let group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": GROUP },
        "spec": { "driver": "cluster-autoscaler", "maxNodeProvisionTime": "20m" },
    }))?;
    groups.create(&PostParams::default(), &group).await.context("creating the group")?;
    let slots: Api<Slot> = Api::namespaced(client.clone(), ns);
    let pod = json!({ "image": "busybox", "nodeSelector": { "bench.homecluster.dev/lab": lab } });
    let slot: Slot = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": slot, "labels": { "group": GROUP } },
        "spec": { "kubernetesNodeName": slot, "nodeCapacity": { "cpu": "4", "memory": "16Gi" },
                  "startupPodSpec": pod, "shutdownPodSpec": pod },
    }))?;
    slots.create(&PostParams::default(), &slot).await.context("creating the slot")?;
    Ok(())
}

/// `rounds` of up (IncreaseSize until the claim is ready) and down (DeleteNodes until the
/// claim is completed and the node gone) on the one slot.
pub async fn run(
    client: &Client,
    ns: &str,
    slot: &str,
    grpc: &mut grpc::Client,
    rounds: usize,
) -> Result<Overheads> {
    const STEP: Duration = Duration::from_secs(60);
    let log = Log::default();
    let watches = watch(client, ns, slot, &log);
    let mut out = Overheads::default();
    let result = async {
        for _ in 0..rounds {
            let asked = Instant::now();
            grpc.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                delta: 1,
                id: GROUP.into(),
            })
            .await
            .context("IncreaseSize")?;
            let (_, claim) = log.wait("claim-new", asked, STEP).await?;
            let job = log.wait_of("job-new-startup", &claim, STEP).await?;
            out.increase_to_startup_job.push(job - asked);
            let complete = log.wait_of("job-complete-startup", &claim, STEP).await?;
            let ready = log.wait_of("claim-ready", &claim, STEP).await?;
            let registered = log.wait("node-new", complete.min(job), STEP).await?.0;
            let usable = log.wait("node-clear", complete.min(job), STEP).await?.0;
            out.job_complete_to_ready.push(ready.saturating_duration_since(complete));
            out.job_complete_to_node.push(registered.saturating_duration_since(complete));
            out.node_to_usable.push(usable.saturating_duration_since(registered));
            out.usable_to_ready.push(ready.saturating_duration_since(usable));

            let asked = Instant::now();
            let node = proto::ExternalGrpcNode {
                name: slot.to_string(),
                provider_id: format!("homelab://{slot}"),
                ..Default::default()
            };
            grpc.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                nodes: vec![node],
                id: GROUP.into(),
            })
            .await
            .context("DeleteNodes")?;
            let shutdown = log.wait_of("job-new-shutdown", &claim, STEP).await?;
            out.delete_to_shutdown_job.push(shutdown - asked);
            log.wait_of("claim-completed", &claim, STEP).await?;
            log.wait("node-gone", asked, STEP).await?;
            // The next round starts from a clean log of this node.
            if let Ok(mut events) = log.0.lock() {
                events.retain(|e| !e.what.starts_with("node-"));
            }
        }
        anyhow::Ok(())
    }
    .await;
    for w in watches {
        w.abort();
    }
    result.map(|()| out)
}

/// Counts, for the report.
pub fn lines(o: &Overheads) -> Vec<String> {
    let mut out = vec![
        o.increase_to_startup_job.line("IncreaseSize -> startup Job created"),
        o.job_complete_to_ready.line("startup Job complete -> claim ready (all)"),
        o.job_complete_to_node.line("  Job complete -> node registered (simulator)"),
        o.node_to_usable.line("  registered -> Ready, no pool taints (kwok)"),
        o.usable_to_ready.line("  Ready and untainted -> claim ready (operator)"),
        o.delete_to_shutdown_job.line("DeleteNodes -> shutdown Job created"),
    ];
    let worst = [
        o.increase_to_startup_job.quantile(0.5),
        o.usable_to_ready.quantile(0.5),
        o.delete_to_shutdown_job.quantile(0.5),
    ]
    .into_iter()
    .max()
    .unwrap_or_default();
    out.push(format!(
        "largest operator overhead p50 {}: {:.0}x below a 30 s Job poll, {:.0}x below CA's 10 s scan",
        crate::stats::ms(worst),
        30.0 / worst.as_secs_f64(),
        10.0 / worst.as_secs_f64(),
    ));
    out
}
