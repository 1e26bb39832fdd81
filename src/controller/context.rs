//! What every controller shares: the client, the operator's settings, an event recorder, and
//! read-only caches (reflector stores) of everything the reconcilers read.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tokio_util::sync::CancellationToken;

use super::error::{KubeContext, Result, is_already_exists};
use super::jobs::{JobOutcome, LABEL_LIFECYCLE, LABEL_MANAGED_BY, Lifecycle, outcome};
use crate::api::{GROUP_LABEL, Group, Node, NodeClaim};
use crate::claim::Timeouts;
use crate::clock::Clock;

/// Read-only caches of the objects the reconcilers read.
#[derive(Clone)]
pub struct Stores {
    pub claims: Store<NodeClaim>,
    pub slots: Store<Node>,
    pub groups: Store<Group>,
    pub nodes: Store<CoreNode>,
    pub jobs: Store<Job>,
}

/// What the controllers share.
pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub timeouts: Timeouts,
    /// How long a drain waits on PodDisruptionBudgets before the shutdown goes ahead.
    pub drain_timeout: Duration,
    pub clock: Arc<dyn Clock>,
    pub recorder: Recorder,
    pub stores: Stores,
}

fn spawn_store<K>(api: Api<K>, config: watcher::Config, shutdown: &CancellationToken) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff().reflect(writer).applied_objects();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let drained = stream.for_each(|_| futures::future::ready(()));
        tokio::select! {
            _ = drained => {},
            _ = shutdown.cancelled() => {},
        }
    });
    reader
}

impl Context {
    /// Starts the caches and waits until each has listed once.
    pub async fn start(
        client: Client,
        namespace: &str,
        timeouts: Timeouts,
        drain_timeout: Duration,
        clock: Arc<dyn Clock>,
        shutdown: &CancellationToken,
    ) -> std::result::Result<Arc<Self>, reflector::store::WriterDropped> {
        let managed = watcher::Config::default()
            .labels(&format!("{}={}", LABEL_MANAGED_BY.0, LABEL_MANAGED_BY.1));
        let stores = Stores {
            claims: spawn_store(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default(),
                shutdown,
            ),
            slots: spawn_store(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default(),
                shutdown,
            ),
            groups: spawn_store(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default(),
                shutdown,
            ),
            nodes: spawn_store(Api::all(client.clone()), watcher::Config::default(), shutdown),
            jobs: spawn_store(Api::namespaced(client.clone(), namespace), managed, shutdown),
        };
        stores.claims.wait_until_ready().await?;
        stores.slots.wait_until_ready().await?;
        stores.groups.wait_until_ready().await?;
        stores.nodes.wait_until_ready().await?;
        stores.jobs.wait_until_ready().await?;
        let reporter = Reporter {
            controller: "homelab-autoscaler".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Ok(Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: namespace.to_string(),
            timeouts,
            drain_timeout,
            clock,
            stores,
        }))
    }

    pub fn now(&self) -> jiff::Timestamp {
        self.clock.now()
    }

    pub fn slot(&self, name: &str) -> Option<Arc<Node>> {
        self.stores.slots.get(&ObjectRef::new(name).within(&self.namespace))
    }

    pub fn group(&self, name: &str) -> Option<Arc<Group>> {
        self.stores.groups.get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The group a slot belongs to, by its label.
    pub fn group_of(&self, slot: &Node) -> Option<Arc<Group>> {
        slot.metadata.labels.as_ref().and_then(|l| l.get(GROUP_LABEL)).and_then(|g| self.group(g))
    }

    pub fn core_node(&self, name: &str) -> Option<Arc<CoreNode>> {
        self.stores.nodes.get(&ObjectRef::new(name))
    }

    pub fn job(&self, name: &str) -> Option<Arc<Job>> {
        self.stores.jobs.get(&ObjectRef::new(name).within(&self.namespace))
    }

    /// The cached claims of a slot.
    pub fn claims_of_slot(&self, slot: &str) -> Vec<Arc<NodeClaim>> {
        self.stores.claims.state().into_iter().filter(|c| c.spec.slot_ref.name == slot).collect()
    }

    /// The cached lifecycle Jobs of a slot.
    pub fn jobs_of_slot(&self, slot: &str) -> Vec<Arc<Job>> {
        self.stores
            .jobs
            .state()
            .into_iter()
            .filter(|j| {
                j.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::api::LABEL_SLOT))
                    .is_some_and(|s| s == slot)
            })
            .collect()
    }

    /// The cached lifecycle Jobs of a slot of one kind.
    pub fn lifecycle_jobs_of_slot(&self, slot: &str, lifecycle: Lifecycle) -> Vec<Arc<Job>> {
        self.jobs_of_slot(slot)
            .into_iter()
            .filter(|j| {
                j.metadata.labels.as_ref().and_then(|l| l.get(LABEL_LIFECYCLE)).map(String::as_str)
                    == Some(lifecycle.as_str())
            })
            .collect()
    }

    /// Whether a shutdown Job of the slot is still running.
    pub fn shutdown_in_flight(&self, slot: &str) -> bool {
        self.lifecycle_jobs_of_slot(slot, Lifecycle::Shutdown)
            .iter()
            .any(|j| outcome(j) == JobOutcome::Running)
    }

    /// Creates a lifecycle Job. Returns false when it already existed: Job names are
    /// deterministic, so a create repeated after a crash or a conflict is a no-op.
    pub async fn create_job(&self, job: &Job) -> Result<bool> {
        let name = job.metadata.name.clone().unwrap_or_default();
        match Api::<Job>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), job)
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if is_already_exists(&error) => Ok(false),
            Err(error) => Err(error).during(|| format!("creating Job {name}")),
        }
    }

    /// Publishes an event on `object`; a failure to publish is logged, never fatal.
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%error, reason, "publishing an event failed");
        }
    }
}
