//! The scaler's loop: one pass every `interval`, and sooner when an unbound pod appears or
//! changes (a metadata watch of unbound pods only, so it costs little), never two passes closer
//! than [`MIN_GAP`]. A pass lists the cluster once, wakes the machines that pods only some
//! machines can run need (in every pool, whatever its driver), then for each builtin pool
//! observes, decides, acts through the provider, keeps the new state only if the act
//! succeeded, and reports the decision on the Group.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::decide::{Action, Settings, State, decide};
use super::error::ScalerError;
use super::refusals::Refusals;
use super::{act, bound_pods, classify, list_cluster, status, wake};
use crate::api::ScalingDriver;
use crate::claim::Timeouts;
use crate::placement::pods::PodKey;
use crate::provider::{GroupSnapshot, Provider, ProviderConfig};
use crate::telemetry;

/// How often each builtin pool is decided for, unless configured.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// The least time between two passes, however many pod events arrive.
pub const MIN_GAP: Duration = Duration::from_secs(1);
/// How long one wait for the provider's caches lasts before it is logged and retried.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Only unbound pods wake the scaler early: a new pending pod is the event worth reacting to.
const UNBOUND_PODS: &str = "spec.nodeName=";

/// How the scaler runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalerConfig {
    /// The namespace of the Groups, slots and claims.
    pub namespace: String,
    /// The time between passes; at least [`MIN_GAP`].
    pub interval: Duration,
    /// The boot deadlines the operator runs with, stamped on the claims the scaler creates.
    pub timeouts: Timeouts,
}

impl ScalerConfig {
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            interval: DEFAULT_INTERVAL,
            timeouts: Timeouts::default(),
        }
    }
}

/// Runs the scaler until `shutdown`, with a provider of its own. Run it only where the
/// controllers run (the leader).
pub async fn run(client: Client, config: ScalerConfig, shutdown: CancellationToken) {
    let mut provider_config = ProviderConfig::new(config.namespace.clone());
    provider_config.timeouts = config.timeouts;
    let provider = Provider::start(client.clone(), provider_config);
    run_with(client, provider, config, shutdown).await;
}

/// Runs the scaler until `shutdown` through `provider`, the same provider core the gRPC server
/// uses, so one set of caches serves both and claims look the same whoever asked.
pub async fn run_with(
    client: Client,
    provider: Provider,
    config: ScalerConfig,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            synced = provider.wait_synced(SYNC_TIMEOUT) => match synced {
                Ok(()) => break,
                Err(error) => tracing::warn!(%error, "the scaler is waiting for the provider's caches"),
            },
        }
    }
    let wake = Arc::new(Notify::new());
    tokio::spawn(wake_on_unbound_pods(client.clone(), wake.clone(), shutdown.clone()));
    let interval = config.interval.max(MIN_GAP);
    tracing::info!(?interval, namespace = %config.namespace, "built-in scaler running");
    let reporter = Reporter {
        controller: "homelab-autoscaler-scaler".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut scaler = Scaler {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        provider,
        namespace: config.namespace,
        states: HashMap::new(),
        refusals: Refusals::default(),
        blocked: HashSet::new(),
    };
    for pass in 1_u64.. {
        let started = tokio::time::Instant::now();
        let span = tracing::info_span!("scaler_pass", pass);
        if let Err(error) = scaler.pass().instrument(span).await {
            tracing::warn!(%error, pass, "scaler pass failed; its state is kept and the next pass retries");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {},
            _ = wake.notified() => {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(started + MIN_GAP) => {},
                }
            },
        }
    }
}

/// Wakes the loop whenever an unbound pod is added or changes (the scheduler marking it
/// unschedulable is such a change).
async fn wake_on_unbound_pods(client: Client, wake: Arc<Notify>, shutdown: CancellationToken) {
    let config = watcher::Config::default().fields(UNBOUND_PODS);
    let events = watcher(Api::<PartialObjectMeta<Pod>>::all(client), config).default_backoff();
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            next = events.next() => match next {
                Some(Ok(watcher::Event::Apply(_))) => wake.notify_one(),
                Some(Ok(_)) => {}
                Some(Err(error)) => tracing::debug!(%error, "watching unbound pods; retrying"),
                None => return,
            },
        }
    }
}

/// The loop's memory: one [`State`] per pool, kept only across successful passes, and the
/// slots the scheduler refused pending pods on.
struct Scaler {
    client: Client,
    recorder: Recorder,
    provider: Provider,
    namespace: String,
    states: HashMap<String, State>,
    refusals: Refusals,
    /// The pods a pass last found blocked at maxNodes: each is told once while it stays so.
    blocked: HashSet<String>,
}

impl Scaler {
    /// One pass: the pods only some machines can run, in every pool ([`bound_pods`]), then a
    /// decision for each builtin pool. A failed list fails the whole pass before any decision;
    /// a pool whose act or report fails is logged and does not stop the others.
    async fn pass(&mut self) -> Result<(), ScalerError> {
        let unsynced = |source| ScalerError::Groups { source };
        let builtin = self.provider.snapshots(ScalingDriver::Builtin).map_err(unsynced)?;
        let autoscaled =
            self.provider.snapshots(ScalingDriver::ClusterAutoscaler).map_err(unsynced)?;
        self.states.retain(|name, _| builtin.iter().any(|s| s.name() == name));
        if builtin.is_empty() && autoscaled.is_empty() {
            return Ok(());
        }
        let view = list_cluster::list_cluster(&self.client).await?;
        let pools: Vec<&GroupSnapshot> = builtin.iter().chain(&autoscaled).collect();
        let plan = bound_pods::plan(
            &view.pods,
            &view.nodes,
            &view.volume_index(),
            &pools,
            &mut self.refusals,
        );
        wake::report_refused(&self.recorder, &plan).await;
        wake::report_blocked(&self.recorder, &plan, &mut self.blocked).await;
        let woken = wake::wake(&self.provider, &plan).await;
        wake::report_slots(&self.client, &self.namespace, &pools, &plan, &woken.held_back).await;
        // The decisions count the machines this pass woke: the provider's caches show its own
        // claims once it has answered, so the pools are read again. Read before the wakes, a
        // pool would boot up to maxNodes on top of them.
        let builtin = if woken.created.is_empty() {
            builtin
        } else {
            self.provider.snapshots(ScalingDriver::Builtin).map_err(unsynced)?
        };
        for snapshot in &builtin {
            let span = tracing::info_span!("group", group = snapshot.name());
            if let Err(error) =
                self.decide_for(&view, snapshot, &plan.handled).instrument(span).await
            {
                tracing::warn!(%error, group = snapshot.name(), "scaler decision failed");
            }
        }
        Ok(())
    }

    async fn decide_for(
        &mut self,
        view: &classify::ClusterView,
        snapshot: &GroupSnapshot,
        bound: &HashSet<PodKey>,
    ) -> Result<(), ScalerError> {
        let name = snapshot.name().to_owned();
        let observation = classify::observe_group(view, snapshot, bound);
        let settings = Settings::of(&snapshot.group.spec, snapshot.slot_count());
        let state = self.states.get(&name).cloned().unwrap_or_default();
        // Whole seconds: the API stores times so, and the reasons read better for it.
        let now = Timestamp::now();
        let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
        let outcome = decide(&observation, &settings, &state, now);
        let decision = &outcome.decision;
        tracing::debug!(?observation, ?state, "observed");

        let acted = act::act(&self.provider, &name, decision).await;
        telemetry::scaler_decided(
            &name,
            decision.demand.into(),
            decision.target.into(),
            decision.action.name(),
        );
        let note = match &acted {
            Ok(done) => {
                // The state advances only here: a failed act is decided again from the old one.
                self.states.insert(name.clone(), outcome.next.clone());
                if decision.action != Action::None {
                    tracing::info!(
                        action = decision.action.name(),
                        demand = decision.demand,
                        target = decision.target,
                        machines = decision.machines,
                        created = ?done.created,
                        released = ?done.released,
                        reason = %decision.reason,
                        "scaler decision carried out"
                    );
                }
                None
            }
            Err(error) => Some(format!("not carried out: {error}")),
        };
        let patch = status::patch_for(decision, now, note.as_deref());
        let written = status::write(&self.client, &self.namespace, &name, &patch).await;
        acted?;
        written
    }
}
