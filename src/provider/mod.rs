//! The provider core: what cluster-autoscaler's externalgrpc calls and the built-in scaler ask
//! of the pool, answered from reflector caches and carried out by creating, cancelling and
//! marking NodeClaims. It knows no transport; the gRPC layer translates the wire to these calls
//! and [`ProviderError::kind`] back.
//!
//! One file per job: [`groups`] (which groups and slots), [`target_size`], [`increase`] (with
//! the pure [`slot_choice`] and [`claim_object`]), [`decrease`], [`delete_nodes`],
//! [`instances`], [`template`], [`options`], [`pricing`] and [`node_lookup`]
//! (NodeGroupForNode). The caches are the process's one set, [`crate::cache::Stores`]. The slot's price ([`slot_pricing`]) sits
//! below the choice, the template and the pricing, which read it; the modules import one another
//! without cycles (tests/dependency_rules.rs).
//!
//! Reads never call the API server. Writes are serialized within the process, decide on the
//! claims as the API server has them (one list), and are answered only once the caches show
//! them (bounded by [`ProviderConfig::settle_timeout`]), so the next read agrees with them.

pub mod adoption;
pub mod claim_object;
pub mod decrease;
pub mod delete_nodes;
pub mod error;
pub mod groups;
pub mod increase;
pub mod instances;
pub mod node_lookup;
pub mod options;
mod power_off_gates;
pub mod pricing;
pub mod slot_choice;
pub mod slot_pricing;
pub mod target_size;
pub mod template;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;

use crate::api::{Group, NodeClaim, ScalingDriver};
use crate::cache::Stores;

pub use decrease::DecreaseOutcome;
pub use delete_nodes::DeleteOutcome;
pub use error::{ErrorKind, ExhaustedSlot, PinnedNode, ProviderError};
pub use groups::{GroupSnapshot, NodeGroupInfo, NodeSeen, PoolIndex, SlotState, provider_id_of};
pub use increase::CreatedClaim;
pub use instances::{Instance, InstanceError, InstanceState, OTHER_ERROR_CLASS};
pub use node_lookup::NodeRef;
pub use options::{AutoscalingOptions, GroupOptions, ResolvedOptions};
pub use pricing::{PodPlacement, PriceWindow};
pub use slot_pricing::PodRequests;

/// A slot: one physical machine of a pool (the `nodes.infra.homecluster.dev` kind).
pub type Slot = crate::api::Node;

/// The node label cluster-autoscaler reads a node's GPU type from, unless configured.
pub const DEFAULT_GPU_LABEL: &str = "accelerator";
/// How long a write waits for the caches to show it before answering anyway.
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(2);
/// `spec.requestedBy` of cluster-autoscaler's claims.
pub const REQUESTED_BY_CLUSTER_AUTOSCALER: &str = "cluster-autoscaler";

/// How the provider is set up.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfig {
    /// The namespace of the Groups, slots and claims.
    pub namespace: String,
    /// The node label that names a node's GPU type (GPULabel).
    pub gpu_label: String,
    /// The GPU types the pool offers (GetAvailableGPUTypes).
    pub gpu_types: Vec<String>,
    /// How long a write waits for the caches to show it. Well inside cluster-autoscaler's 5 s.
    pub settle_timeout: Duration,
    /// The boot deadlines the operator runs with; a claim's deadlineAt is measured with them.
    pub timeouts: crate::claim::Timeouts,
}

impl ProviderConfig {
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            gpu_label: DEFAULT_GPU_LABEL.into(),
            gpu_types: Vec::new(),
            settle_timeout: DEFAULT_SETTLE_TIMEOUT,
            timeouts: crate::claim::Timeouts::default(),
        }
    }
}

/// Who is asking: the driver whose groups it may touch, and the name its claims carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Only groups with this `spec.driver` are visible to the caller.
    pub driver: ScalingDriver,
    /// Written to `spec.requestedBy` and `status.scaleDownRequestedBy`.
    pub requested_by: String,
    /// Why, in a sentence; recorded in `spec.request.reason` of the claims it creates.
    pub reason: Option<String>,
    /// The connection a cluster-autoscaler call came over (its peer address): a new one is a
    /// new cluster-autoscaler process (see [`adoption`]).
    pub session: Option<String>,
}

impl Caller {
    /// cluster-autoscaler, through the externalgrpc provider.
    pub fn cluster_autoscaler() -> Self {
        Self {
            driver: ScalingDriver::ClusterAutoscaler,
            requested_by: REQUESTED_BY_CLUSTER_AUTOSCALER.into(),
            reason: None,
            session: None,
        }
    }

    /// The same caller, on the connection from `peer`.
    pub fn over(&self, peer: Option<std::net::SocketAddr>) -> Self {
        Self { session: peer.map(|p| p.to_string()), ..self.clone() }
    }

    /// The built-in demand scaler, with the decision it acts on.
    pub fn builtin_scaler(reason: impl Into<String>) -> Self {
        Self {
            driver: ScalingDriver::Builtin,
            requested_by: crate::claim::REQUESTED_BY_SCALER.into(),
            reason: Some(reason.into()),
            session: None,
        }
    }

    /// The scaler's pass waking the one machine a pending pod can run on, in a pool of either
    /// driver: the claim names the pod in `requestedBy` and says why in its reason.
    pub fn for_bound_pod(driver: ScalingDriver, pod: &str, reason: impl Into<String>) -> Self {
        Self {
            driver,
            requested_by: format!("{} for pod {pod}", crate::claim::REQUESTED_BY_SCALER),
            reason: Some(reason.into()),
            session: None,
        }
    }
}

/// The provider. Cheap to clone; the caches stop when the last clone is dropped.
#[derive(Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: ProviderConfig,
    stores: Stores,
    /// Serializes writes in this process, so two calls never pick the same free slot.
    writes: tokio::sync::Mutex<()>,
    /// Reads the pools' power-off gates before a DeleteNodes.
    gates: crate::gates::Reader,
}

impl Provider {
    /// Starts caches of its own (spawned on the current Tokio runtime), for a process that runs
    /// the provider alone. Call [`Provider::wait_synced`] before serving: until then every read
    /// answers `NotSynced`.
    pub fn start(client: Client, config: ProviderConfig) -> Self {
        let stores = Stores::start(&client, &config.namespace);
        Self::on(stores, client, config)
    }

    /// A provider reading the process's caches (of `config.namespace`).
    pub fn on(stores: Stores, client: Client, config: ProviderConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                gates: crate::gates::Reader::new(client.clone()),
                client,
                config,
                stores,
                writes: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Waits until every cache has its first listing, at most `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), ProviderError> {
        if self.inner.stores.wait_synced(timeout).await {
            Ok(())
        } else {
            Err(ProviderError::NotSynced)
        }
    }

    pub fn is_synced(&self) -> bool {
        self.inner.stores.is_synced()
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.inner.config
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn gate_reader(&self) -> &crate::gates::Reader {
        &self.inner.gates
    }

    pub(crate) fn stores(&self) -> &Stores {
        &self.inner.stores
    }

    pub(crate) async fn lock_writes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.writes.lock().await
    }

    /// Answers only once the caches are warm: an empty cache would read as an empty pool.
    pub(crate) fn ensure_synced(&self) -> Result<(), ProviderError> {
        if self.is_synced() { Ok(()) } else { Err(ProviderError::NotSynced) }
    }

    /// Refresh: the caches are kept current by their watches, so there is nothing to do.
    pub fn refresh(&self) {}

    /// NodeGroups: every group the caller scales. CA calls it every loop, and it describes every
    /// group: one pass that counts the slots by group, no claim read and no snapshot built (the
    /// snapshots of 50 groups at 1000 slots made its p99 2 ms, see docs/performance.md).
    #[tracing::instrument(skip_all)]
    pub fn node_groups(&self, caller: &Caller) -> Result<Vec<NodeGroupInfo>, ProviderError> {
        let groups = self.groups_scaled_by(caller.driver)?;
        let slots = self.inner.stores.slots.state();
        let mut counts: rustc_hash::FxHashMap<&str, usize> = rustc_hash::FxHashMap::default();
        for slot in &slots {
            if let Some(group) = groups::group_of(slot) {
                *counts.entry(group).or_default() += 1;
            }
        }
        let now = jiff::Timestamp::now();
        Ok(groups
            .iter()
            .map(|g| {
                let name = g.metadata.name.as_deref().unwrap_or_default();
                let info = NodeGroupInfo::of(g, counts.get(name).copied().unwrap_or_default());
                // Only a pool whose UPS holds its boots costs a snapshot.
                if crate::ups::boots::may_hold_boots(g, now) {
                    info.within_power(&self.build_snapshot(g.clone()), now)
                } else {
                    info
                }
            })
            .collect())
    }

    /// One group the caller scales, as the caches hold it now.
    pub fn snapshot(&self, caller: &Caller, group: &str) -> Result<GroupSnapshot, ProviderError> {
        Ok(self.build_snapshot(self.group(caller, group)?))
    }

    /// How many more of the group's machines may start booting while its return from a power
    /// outage is staggered; `None`: no such limit now (or the group is unknown).
    pub fn stagger_room(&self, group: &str) -> Option<crate::ups::boots::Stagger> {
        let namespace = &self.inner.config.namespace;
        let found =
            self.inner.stores.groups.get(&ObjectRef::<Group>::new(group).within(namespace))?;
        let snapshot = self.build_snapshot(found);
        crate::ups::boots::stagger_room(
            &snapshot.group,
            snapshot.booting_count(),
            jiff::Timestamp::now(),
        )
    }

    /// The Group alone, for the calls that answer from it (GetOptions): no slot or claim read.
    pub fn group(&self, caller: &Caller, group: &str) -> Result<Arc<Group>, ProviderError> {
        self.ensure_synced()?;
        let namespace = &self.inner.config.namespace;
        let key = ObjectRef::<Group>::new(group).within(namespace);
        let Some(found) = self.inner.stores.groups.get(&key) else {
            return Err(ProviderError::GroupNotFound {
                group: group.to_owned(),
                namespace: namespace.clone(),
            });
        };
        if found.spec.driver != caller.driver {
            return Err(ProviderError::WrongDriver {
                group: group.to_owned(),
                driver: groups::driver_name(found.spec.driver),
                caller: groups::driver_name(caller.driver),
            });
        }
        Ok(found)
    }

    /// The group as [`Provider::snapshot`] has it, but with its claims listed from the API
    /// server (a quorum read) instead of the cache. Writes decide on this: a cache a moment
    /// behind, say after a watch restarted, would hand one free slot to two calls.
    pub(crate) async fn snapshot_for_write(
        &self,
        caller: &Caller,
        group: &str,
    ) -> Result<GroupSnapshot, ProviderError> {
        let cached = self.snapshot(caller, group)?;
        let api: Api<NodeClaim> = Api::namespaced(self.client().clone(), &self.config().namespace);
        let listed = api.list(&ListParams::default()).await.map_err(|source| {
            ProviderError::kube(format!("listing the claims of group {group}"), source)
        })?;
        let claims: Vec<Arc<NodeClaim>> = listed.items.into_iter().map(Arc::new).collect();
        let slots: Vec<Arc<Slot>> = cached.slots.iter().map(|s| s.slot.clone()).collect();
        let stores = &self.inner.stores;
        Ok(PoolIndex::new(&slots, &claims)
            .snapshot(cached.group, |n| NodeSeen::of(stores.core_node(n).as_deref())))
    }

    /// The groups scaled by `driver`, by name, once the caches are warm.
    fn groups_scaled_by(&self, driver: ScalingDriver) -> Result<Vec<Arc<Group>>, ProviderError> {
        self.ensure_synced()?;
        let mut groups = self.inner.stores.groups.state();
        groups.retain(|g| g.spec.driver == driver);
        groups.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(groups)
    }

    /// Every group scaled by `driver`, by name.
    pub fn snapshots(&self, driver: ScalingDriver) -> Result<Vec<GroupSnapshot>, ProviderError> {
        let groups = self.groups_scaled_by(driver)?;
        let stores = &self.inner.stores;
        // One read of the caches and one index for every group: a read per group, matching
        // every claim against every slot, cost 3.3 ms p50 at 50 groups of 1000 slots (see
        // docs/performance.md).
        let (slots, claims, nodes) =
            (stores.slots.state(), stores.claims.state(), stores.nodes.state());
        let index = PoolIndex::new(&slots, &claims);
        // Every slot is asked about: one set of the node names per call rather than a cache
        // lookup per slot (each allocates its key, and a miss looks twice).
        let seen: rustc_hash::FxHashMap<&str, NodeSeen> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, NodeSeen::of(Some(n)))))
            .collect();
        let seen = |name: &str| seen.get(name).copied().unwrap_or(NodeSeen::Absent);
        Ok(groups.into_iter().map(|g| index.snapshot(g, seen)).collect())
    }

    /// One group's snapshot, read through the caches' indexes: only the group's own slots and
    /// their claims are fetched, so the per-group calls cost the same at any pool size.
    fn build_snapshot(&self, group: Arc<Group>) -> GroupSnapshot {
        let stores = &self.inner.stores;
        let name = group.metadata.name.as_deref().unwrap_or_default();
        let slots = stores.slots_of_group(name);
        let claims: Vec<Arc<NodeClaim>> =
            slots.iter().flat_map(|slot| stores.claims_of_slot(groups::slot_name(slot))).collect();
        PoolIndex::new(&slots, &claims)
            .snapshot(group, |n| NodeSeen::of(stores.core_node(n).as_deref()))
    }

    /// GPULabel.
    pub fn gpu_label(&self) -> &str {
        &self.inner.config.gpu_label
    }

    /// GetAvailableGPUTypes.
    pub fn gpu_types(&self) -> &[String] {
        &self.inner.config.gpu_types
    }
}
