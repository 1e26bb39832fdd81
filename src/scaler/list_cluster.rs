//! The pass's reads: every object the classification needs, listed once per pass and shared by
//! every pool. Lists, not caches: each pass reads the cluster as the API server has it
//! now, and a list that fails fails the pass (never an empty observation).

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node as CoreNode, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::classify::ClusterView;
use super::error::ScalerError;

/// Finished pods never need a machine; leaving them out keeps the pod list small.
const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Lists pods, nodes, workloads, PersistentVolumeClaims and PersistentVolumes of the whole
/// cluster.
///
/// The lists cannot be one read, so they are taken in an order in which a change between them
/// can only hide work for a pass, never count it twice: pods first, then the ReplicaSets that
/// own them, then the Deployments and StatefulSets. An owner is created before its pods, so
/// every pod listed finds its owner listed after it; were the owners listed first, a Deployment
/// created in between would count its replicas once as pods and again as podless replicas.
/// Claims and volumes come after the pods too: a claim binds before its pod is placed, so a
/// pod listed pending finds its claim's binding as new as the pod or newer.
pub async fn list_cluster(client: &Client) -> Result<ClusterView, ScalerError> {
    let pods = list::<Pod>(client, "pods", ListParams::default().fields(LIVE_PODS)).await?;
    let nodes = list::<CoreNode>(client, "nodes", ListParams::default());
    let replica_sets = list::<ReplicaSet>(client, "replicasets", ListParams::default());
    let claims =
        list::<PersistentVolumeClaim>(client, "persistentvolumeclaims", ListParams::default());
    let volumes = list::<PersistentVolume>(client, "persistentvolumes", ListParams::default());
    let (nodes, replica_sets, claims, volumes) =
        futures::try_join!(nodes, replica_sets, claims, volumes)?;
    let deployments = list::<Deployment>(client, "deployments", ListParams::default());
    let stateful_sets = list::<StatefulSet>(client, "statefulsets", ListParams::default());
    let (deployments, stateful_sets) = futures::try_join!(deployments, stateful_sets)?;
    Ok(ClusterView { pods, nodes, deployments, stateful_sets, replica_sets, claims, volumes })
}

async fn list<K>(
    client: &Client,
    what: &'static str,
    params: ListParams,
) -> Result<Vec<K>, ScalerError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    Ok(api.list(&params).await.map_err(|source| ScalerError::List { what, source })?.items)
}
