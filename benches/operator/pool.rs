//! A pool written straight to the apiserver, before any operator runs (no webhooks): `slots`
//! slots spread over `groups` cluster-autoscaler Groups, and 200 claims. Claims on the first
//! slots are `ready` with a Ready kwok node each (a steady pool: nothing for the controllers to
//! do), up to half the slots; the rest of the 200 are `completed`, as a pool's history keeps them
//! until their TTL.

use anyhow::{Context as _, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use homelab_autoscaler::api::{Group, Node as Slot, NodeClaim};
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// How many requests the setup keeps in flight.
const PARALLEL: usize = 16;
/// The label on the kwok nodes a pool made, so they can be removed with it.
pub const POOL_LABEL: &str = "bench.homecluster.dev/pool";
pub const CLAIMS: usize = 200;

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub slots: usize,
    pub groups: usize,
}

impl Shape {
    /// `10x1` → 10 slots in 1 group.
    pub fn parse(text: &str) -> Result<Self> {
        let (slots, groups) = text.split_once('x').context("a pool is <slots>x<groups>")?;
        Ok(Shape { slots: slots.trim().parse()?, groups: groups.trim().parse()? })
    }

    /// The ready claims: one per slot on the first slots, at most half the pool, at most 200.
    pub fn live(&self) -> usize {
        (self.slots / 2).min(CLAIMS)
    }
}

pub fn group_name(i: usize) -> String {
    format!("g{i}")
}

pub fn slot_name(ns: &str, i: usize) -> String {
    format!("{ns}-s{i}")
}

/// Writes the pool of `shape` into `ns`.
pub async fn write(client: &Client, ns: &str, shape: Shape) -> Result<()> {
    let groups: Api<Group> = Api::namespaced(client.clone(), ns);
    for i in 0..shape.groups {
        // g0 overrides an option, so GetOptions answers every field (the costlier path).
        let scale_down = if i == 0 { json!({ "unneededTime": "10m" }) } else { json!({}) };
        let group: Group = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
            "metadata": { "name": group_name(i) },
            "spec": { "driver": "cluster-autoscaler", "maxNodeProvisionTime": "20m",
                      "scaleDown": scale_down },
        }))?;
        groups.create(&PostParams::default(), &group).await.context("creating a group")?;
    }

    let slots: Api<Slot> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..shape.slots)
        .map(|i| {
            let slots = slots.clone();
            let name = slot_name(ns, i);
            async move {
                let slot: Slot = serde_json::from_value(json!({
                    "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
                    "metadata": { "name": name, "labels": { "group": group_name(i % shape.groups) } },
                    "spec": {
                        "kubernetesNodeName": name,
                        "nodeCapacity": { "cpu": "4", "memory": "16Gi", "pods": "110" },
                        "nodeLabels": { "homelab/size": "small" },
                        "startupPodSpec": { "image": "busybox",
                                            "nodeSelector": { "bench.homecluster.dev/lab": "none" } },
                        "shutdownPodSpec": { "image": "busybox",
                                             "nodeSelector": { "bench.homecluster.dev/lab": "none" } },
                    },
                }))?;
                slots.create(&PostParams::default(), &slot).await.context("creating a slot")?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<()>()
        .await?;

    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), ns);
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let live = shape.live();
    futures::stream::iter(0..CLAIMS)
        .map(|i| {
            let (claims, nodes) = (claims.clone(), nodes.clone());
            let ns = ns.to_string();
            async move {
                // Live claims hold slots 0..live; the completed ones reuse those slots.
                let slot_index = if live == 0 { 0 } else { i % live };
                let slot = slot_name(&ns, slot_index);
                let (phase, group) = (if i < live { "ready" } else { "completed" },
                                      group_name(slot_index % shape.groups));
                let claim: NodeClaim = serde_json::from_value(json!({
                    "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
                    "metadata": { "name": format!("c{i}") },
                    "spec": { "slotRef": { "name": slot },
                              "request": { "call": "IncreaseSize", "delta": 1, "group": group },
                              "requestedBy": "cluster-autoscaler", "attempt": 1,
                              "ttlSecondsAfterFinished": 86400 },
                }))?;
                claims.create(&PostParams::default(), &claim).await.context("creating a claim")?;
                let status = if i < live {
                    json!({ "status": { "phase": phase } })
                } else {
                    json!({ "status": { "phase": phase,
                                        "finishedAt": jiff::Timestamp::now().to_string() } })
                };
                claims
                    .patch_status(&format!("c{i}"), &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .context("writing a claim's phase")?;
                if i < live {
                    let node: CoreNode = serde_json::from_value(json!({
                        "metadata": {
                            "name": slot,
                            "labels": { "kubernetes.io/hostname": slot, "bench.homecluster.dev/pool": ns,
                                        "group": group },
                            "annotations": { "kwok.x-k8s.io/node": "fake" },
                        },
                        "spec": { "providerID": format!("homelab://{slot}") },
                    }))?;
                    nodes.create(&PostParams::default(), &node).await.context("creating a node")?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<()>()
        .await?;
    wait_nodes_ready(&nodes, ns, live).await
}

async fn wait_nodes_ready(nodes: &Api<CoreNode>, ns: &str, count: usize) -> Result<()> {
    let params = ListParams::default().labels(&format!("{POOL_LABEL}={ns}"));
    homelab_harness::eventually(
        "kwok to make the pool's nodes Ready",
        std::time::Duration::from_secs(120),
        || async {
            let ready = nodes
                .list(&params)
                .await?
                .items
                .iter()
                .filter(|n| homelab_harness::is_ready(n))
                .count();
            anyhow::ensure!(ready == count, "{ready} of {count} nodes Ready");
            Ok(())
        },
    )
    .await
}

/// Removes the pool's nodes (cluster-wide objects every later operator would watch).
pub async fn remove_nodes(client: &Client, ns: &str) -> Result<()> {
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let params = ListParams::default().labels(&format!("{POOL_LABEL}={ns}"));
    nodes.delete_collection(&DeleteParams::default(), &params).await?;
    Ok(())
}
