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
use homelab_autoscaler::api::{LABEL_LIFECYCLE, LABEL_NODECLAIM, NodeClaim, NodeClaimPhase};
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
    /// The Node is Ready and carries none of the pool's readiness taints.
    NodeUsable,
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

    /// Every `seen` of objects whose name `select` accepts, in the order seen.
    pub fn all(&self, seen: Seen, select: impl Fn(&str) -> bool) -> Vec<(Instant, String)> {
        let Ok(sightings) = self.sightings.lock() else { return Vec::new() };
        sightings
            .iter()
            .filter(|s| s.seen == seen && select(&s.name))
            .map(|s| (s.at, s.name.clone()))
            .collect()
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

    /// Starts the watches that fill the timeline: claims and Jobs in `namespace` (the
    /// operator's), every Node (usable once Ready and free of `readiness_taints`), and the pods
    /// of `pod_namespace`. They stop when the returned handles are aborted or dropped with
    /// [`Watches`].
    pub fn watch(
        &self,
        client: &Client,
        namespace: &str,
        readiness_taints: &[&str],
        pod_namespace: &str,
    ) -> Watches {
        let claims: Api<NodeClaim> = Api::namespaced(client.clone(), namespace);
        let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
        let nodes: Api<CoreNode> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), pod_namespace);
        let taints: Vec<String> = readiness_taints.iter().map(|t| t.to_string()).collect();
        let (t1, t2, t3, t4) = (self.clone(), self.clone(), self.clone(), self.clone());
        Watches(vec![
            tokio::spawn(async move {
                let mut stream = watcher(claims, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(next) = stream.next().await {
                    let Ok(claim) = next else { continue };
                    let name = claim.name_any();
                    t1.note(Seen::ClaimCreated, &name);
                    if let Some(phase) = claim.status.as_ref().and_then(|s| s.phase) {
                        t1.note(Seen::ClaimPhase(phase), &name);
                    }
                }
            }),
            tokio::spawn(async move {
                let mut stream = watcher(jobs, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(next) = stream.next().await {
                    let Ok(job) = next else { continue };
                    let labels = job.labels();
                    let (Some(lifecycle), Some(claim)) =
                        (labels.get(LABEL_LIFECYCLE), labels.get(LABEL_NODECLAIM))
                    else {
                        continue;
                    };
                    let complete =
                        job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                            c.iter().any(|c| c.type_ == "Complete" && c.status == "True")
                        });
                    match lifecycle.as_str() {
                        "startup" => {
                            t2.note(Seen::StartupJobCreated, claim);
                            if complete {
                                t2.note(Seen::StartupJobComplete, claim);
                            }
                        }
                        "shutdown" => t2.note(Seen::ShutdownJobCreated, claim),
                        _ => {}
                    }
                }
            }),
            tokio::spawn(async move {
                let mut stream =
                    watcher(nodes, watcher::Config::default()).default_backoff().boxed();
                while let Some(next) = stream.next().await {
                    match next {
                        Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                            let (name, uid, now) = (node.name_any(), node.uid(), Instant::now());
                            let uid = uid.unwrap_or_else(|| name.clone());
                            t3.note_at(Seen::NodeRegistered, &name, &uid, now);
                            if crate::is_ready(&node) && !has_any_taint(&node, &taints) {
                                t3.note_at(Seen::NodeUsable, &name, &uid, now);
                            }
                        }
                        Ok(watcher::Event::Delete(node)) => {
                            let (name, uid) = (node.name_any(), node.uid());
                            let uid = uid.unwrap_or_else(|| name.clone());
                            t3.note_at(Seen::NodeGone, &name, &uid, Instant::now());
                        }
                        _ => {}
                    }
                }
            }),
            tokio::spawn(async move {
                let mut stream = watcher(pods, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(next) = stream.next().await {
                    let Ok(pod) = next else { continue };
                    let name = pod.name_any();
                    t4.note(Seen::PodCreated, &name);
                    if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                        t4.note(Seen::PodRunning, &name);
                    }
                }
            }),
        ])
    }
}

fn has_any_taint(node: &CoreNode, keys: &[String]) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints.is_some_and(|t| t.iter().any(|t| keys.contains(&t.key)))
}

/// The watches of a timeline; dropping them stops them.
pub struct Watches(Vec<tokio::task::JoinHandle<()>>);

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
