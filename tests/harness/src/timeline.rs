//! When each change of a scale-up was first seen, at millisecond resolution: claims (created,
//! each phase), the operator's lifecycle Jobs (created, complete), Nodes (registered, usable,
//! gone), pods (created, Running) and cluster-autoscaler's calls as the operator logged them.
//!
//! Kubernetes stamps objects to the second, too coarse for steps that take milliseconds. A watch
//! in the test process sees each change within milliseconds of its write, so the interval
//! between two sightings is the step between them, give or take the watch's delivery delay at
//! both ends. The demo's scale-up split and the operator bench read the same timeline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::StreamExt as _;
use homelab_autoscaler::api::{
    LABEL_LIFECYCLE, LABEL_NODECLAIM, NodeClaim, NodeClaimPhase, TaintSelector,
};
use homelab_autoscaler::controller::jobs::Lifecycle;
use homelab_autoscaler::job_outcome::{JobOutcome, outcome};
use homelab_autoscaler::machine::gate_open;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use tokio::sync::Notify;

/// What was seen. Each is noted once per object (a Node registered again is a new object) or,
/// for a call, once per call: the first sighting is the one that counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// cluster-autoscaler's IncreaseSize reached the provider (named by the group, at the
    /// operator's log line's own timestamp).
    IncreaseSizeCalled,
    ClaimCreated,
    ClaimPhase(NodeClaimPhase),
    /// A lifecycle Job of a claim (named by the claim).
    StartupJobCreated,
    StartupJobComplete,
    ShutdownJobCreated,
    /// A Node appeared (named by the Node).
    NodeRegistered,
    /// The Node is Ready and carries none of the pool's readiness taints (noted once per Ready
    /// transition, and not while it is marked asleep).
    NodeUsable,
    /// The Node's Ready condition turned True (noted once per transition: a kubelet back from
    /// a machine's sleep on the same Node is a new sighting).
    NodeReady,
    NodeGone,
    PodCreated,
    PodRunning,
}

#[derive(Clone, Debug)]
struct Sighting {
    at: Instant,
    seen: Seen,
    name: String,
    /// What makes two sightings the same: the object's uid, or the name.
    key: String,
}

/// The sightings of one run, shared by the watches that write them and the readers.
#[derive(Clone, Default)]
pub struct Timeline {
    sightings: Arc<Mutex<Vec<Sighting>>>,
    noted: Arc<Notify>,
}

impl Timeline {
    /// Notes `seen` of `name` at `at`, unless `seen` of `key` was noted before.
    pub fn note_at(&self, seen: Seen, name: &str, key: &str, at: Instant) {
        let Ok(mut sightings) = self.sightings.lock() else { return };
        if sightings.iter().any(|s| s.seen == seen && s.key == key) {
            return;
        }
        sightings.push(Sighting { at, seen, name: name.to_string(), key: key.to_string() });
        drop(sightings);
        self.noted.notify_waiters();
    }

    /// Notes `seen` of `name` now, unless seen before.
    pub fn note(&self, seen: Seen, name: &str) {
        self.note_at(seen, name, name, Instant::now());
    }

    /// When `seen` of `name` was first seen.
    pub fn at(&self, seen: Seen, name: &str) -> Option<Instant> {
        let sightings = self.sightings.lock().ok()?;
        sightings.iter().find(|s| s.seen == seen && s.name == name).map(|s| s.at)
    }

    /// The first `seen` of `name` at or after `since` (a Node registered again, a second call).
    pub fn at_since(&self, seen: Seen, name: &str, since: Instant) -> Option<Instant> {
        let sightings = self.sightings.lock().ok()?;
        sightings.iter().find(|s| s.seen == seen && s.name == name && s.at >= since).map(|s| s.at)
    }

    /// The first `seen` of any object at or after `since`, with the object's name.
    pub fn first_since(&self, seen: Seen, since: Instant) -> Option<(Instant, String)> {
        let sightings = self.sightings.lock().ok()?;
        sightings.iter().find(|s| s.seen == seen && s.at >= since).map(|s| (s.at, s.name.clone()))
    }

    /// The last `seen` of `name` within `from..=to` (the call that made a claim: the last one
    /// before the claim was seen).
    pub fn last_between(
        &self,
        seen: Seen,
        name: &str,
        from: Instant,
        to: Instant,
    ) -> Option<Instant> {
        let sightings = self.sightings.lock().ok()?;
        sightings
            .iter()
            .filter(|s| s.seen == seen && s.name == name && (from..=to).contains(&s.at))
            .map(|s| s.at)
            .max()
    }

    /// Waits for the first `seen` of any object at or after `since`.
    pub async fn wait_since(
        &self,
        seen: Seen,
        since: Instant,
        timeout: Duration,
    ) -> Result<(Instant, String)> {
        self.wait_for(timeout, || self.first_since(seen, since))
            .await
            .map_err(|()| anyhow::anyhow!("no {seen:?} within {timeout:?}"))
    }

    /// Waits for `seen` of `name` at or after `since`.
    pub async fn wait_of(
        &self,
        seen: Seen,
        name: &str,
        since: Instant,
        timeout: Duration,
    ) -> Result<Instant> {
        match self.wait_for(timeout, || self.at_since(seen, name, since)).await {
            Ok(at) => Ok(at),
            Err(()) => bail!("no {seen:?} of {name} within {timeout:?}"),
        }
    }

    async fn wait_for<T>(&self, timeout: Duration, find: impl Fn() -> Option<T>) -> Result<T, ()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the look, so a sighting noted in between still wakes us.
            let noted = self.noted.notified();
            if let Some(found) = find() {
                return Ok(found);
            }
            if tokio::time::timeout_at(deadline, noted).await.is_err() {
                return find().ok_or(());
            }
        }
    }

    /// Notes a claim as a watch delivered it: created, and its phase.
    pub fn note_claim(&self, claim: &NodeClaim) {
        let name = claim.name_any();
        self.note(Seen::ClaimCreated, &name);
        self.note(Seen::ClaimPhase(crate::claims::phase(claim)), &name);
    }

    /// Watches the claims of `namespace` into the timeline (a World notes them from the watch
    /// that keeps its ledger instead).
    pub fn watch_claims(&self, client: &Client, namespace: &str) -> Watches {
        let timeline = self.clone();
        follow(Api::namespaced(client.clone(), namespace), move |claim: NodeClaim| {
            timeline.note_claim(&claim)
        })
    }

    /// Watches the lifecycle Jobs of `namespace` (the operator's) and every Node: usable once
    /// its gate is open (Ready, free of the `gate`'s readiness taints), as the operator judges
    /// it.
    pub fn watch_jobs_and_nodes(
        &self,
        client: &Client,
        namespace: &str,
        gate: Vec<TaintSelector>,
    ) -> Watches {
        let timeline = self.clone();
        let jobs = follow(Api::namespaced(client.clone(), namespace), move |job: Job| {
            let labels = job.labels();
            let (Some(lifecycle), Some(claim)) =
                (labels.get(LABEL_LIFECYCLE), labels.get(LABEL_NODECLAIM))
            else {
                return;
            };
            if lifecycle == Lifecycle::Startup.as_str() {
                timeline.note(Seen::StartupJobCreated, claim);
                if matches!(outcome(&job), JobOutcome::Succeeded { .. }) {
                    timeline.note(Seen::StartupJobComplete, claim);
                }
            } else if lifecycle == Lifecycle::Shutdown.as_str() {
                timeline.note(Seen::ShutdownJobCreated, claim);
            }
        });
        let timeline = self.clone();
        let nodes: Api<CoreNode> = Api::all(client.clone());
        let nodes = tokio::spawn(async move {
            let mut stream = watcher(nodes, watcher::Config::default()).default_backoff().boxed();
            while let Some(next) = stream.next().await {
                let (node, gone) = match next {
                    Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                        (node, false)
                    }
                    Ok(watcher::Event::Delete(node)) => (node, true),
                    _ => continue,
                };
                // Keyed by uid: a Node registered again is a new sighting.
                let (name, now) = (node.name_any(), Instant::now());
                let uid = node.uid().unwrap_or_else(|| name.clone());
                if gone {
                    timeline.note_at(Seen::NodeGone, &name, &uid, now);
                    continue;
                }
                timeline.note_at(Seen::NodeRegistered, &name, &uid, now);
                // Once per Ready transition: a kubelet back from its machine's sleep reports on
                // the same Node.
                let Some(since) = homelab_autoscaler::machine::ready_since(Some(&node)) else {
                    continue;
                };
                let transition = format!("{uid}@{since}");
                timeline.note_at(Seen::NodeReady, &name, &transition, now);
                if gate_open(&node, &gate) && !homelab_autoscaler::machine::is_suspended(&node) {
                    timeline.note_at(Seen::NodeUsable, &name, &transition, now);
                }
            }
        });
        jobs.and(Watches(vec![nodes]))
    }

    /// Watches the pods of `namespace`: created, Running.
    pub fn watch_pods(&self, client: &Client, namespace: &str) -> Watches {
        let timeline = self.clone();
        follow(Api::namespaced(client.clone(), namespace), move |pod: Pod| {
            let name = pod.name_any();
            timeline.note(Seen::PodCreated, &name);
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                timeline.note(Seen::PodRunning, &name);
            }
        })
    }
}

/// Runs `on` for every object the watch of `api` delivers (errors retried with backoff).
fn follow<K>(api: Api<K>, on: impl Fn(K) + Send + 'static) -> Watches
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    Watches(vec![tokio::spawn(async move {
        let mut stream =
            watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
        while let Some(next) = stream.next().await {
            if let Ok(object) = next {
                on(object);
            }
        }
    })])
}

/// The watches of a timeline; dropping them stops them.
pub struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Watches {
    /// Both sets, stopped together.
    pub fn and(mut self, mut other: Watches) -> Watches {
        self.0.append(&mut other.0);
        self
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for watch in &self.0 {
            watch.abort();
        }
    }
}

/// `to - from`, zero when `to` came first.
pub fn between(from: Instant, to: Instant) -> Duration {
    to.saturating_duration_since(from)
}
