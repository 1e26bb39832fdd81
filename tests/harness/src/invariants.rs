//! The invariants every reliability suite checks, whatever it did to the operator: a
//! [`Ledger`] watches a namespace's claims and Jobs for the whole run (deleted objects stay in
//! it, and "two claims booting on one slot at once" is checked on every event), and
//! [`settled`] checks the end state once the suite has stopped acting:
//!
//! - every claim ended ready, failed or completed, within its deadline (plus a margin);
//! - no claim stuck Terminating;
//! - no Job left running, and no claim with more than one startup or shutdown Job;
//! - no startup Job of a claim that never committed its boot (a cancelled scale-up boots
//!   nothing, docs/decisions.md, D35);
//! - no machine on (its Kubernetes node Ready) without a wanted claim;
//! - no slot with two booting claims, ever;
//! - cluster-autoscaler's startup taint and scale-down-disabled annotation (docs/decisions.md,
//!   D13 and D14) on no node whose claim no longer needs them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, ensure};
use futures::StreamExt;
use homelab_autoscaler::api::{
    ClaimCall, LABEL_LIFECYCLE, LABEL_NODECLAIM, Node as Slot, NodeClaim, NodeClaimPhase,
};
use homelab_autoscaler::phase;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// The taint that makes cluster-autoscaler count a booting machine as not started
/// (docs/decisions.md, D13).
pub const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting";
/// The annotation that keeps cluster-autoscaler off a machine started by hand
/// (docs/decisions.md, D14).
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

#[derive(Default)]
struct Seen {
    /// Every claim as last seen, by name (a deleted claim keeps its last state).
    claims: BTreeMap<String, NodeClaim>,
    /// Every Job ever seen: name → (claim label, lifecycle label).
    jobs: BTreeMap<String, (Option<String>, Option<String>)>,
    /// Violations seen while the run went on.
    violations: Vec<String>,
}

/// What a namespace held over a run, fed by watches.
pub struct Ledger {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Slots with more than one claim in phase Booting among `claims` (deleted ones excluded).
fn double_boots<'a>(claims: impl Iterator<Item = &'a NodeClaim>) -> Vec<String> {
    let mut booting: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for claim in claims {
        if claim.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Booting) {
            booting
                .entry(claim.spec.slot_ref.name.as_str())
                .or_default()
                .push(claim.metadata.name.as_deref().unwrap_or(""));
        }
    }
    booting
        .into_iter()
        .filter(|(_, claims)| claims.len() > 1)
        .map(|(slot, claims)| format!("slot {slot} has two booting claims at once: {claims:?}"))
        .collect()
}

impl Ledger {
    /// Starts watching `ns`; returns once both watches have listed.
    pub async fn start(client: &Client, ns: &str) -> Result<Ledger> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let claims: Api<NodeClaim> = Api::namespaced(client.clone(), ns);
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        let (claims_listed, claims_ready) = tokio::sync::oneshot::channel::<()>();
        let (jobs_listed, jobs_ready) = tokio::sync::oneshot::channel::<()>();
        let claim_task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut listed = Some(claims_listed);
                let mut events =
                    watcher(claims, watcher::Config::default()).default_backoff().boxed();
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { continue };
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    match event {
                        watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) => {
                            seen.claims.insert(claim.name_any(), claim);
                        }
                        watcher::Event::Delete(claim) => {
                            let mut gone = claim;
                            // A deleted claim no longer boots anything.
                            if let Some(status) = gone.status.as_mut()
                                && status.phase == Some(NodeClaimPhase::Booting)
                            {
                                status.phase = Some(NodeClaimPhase::Failed);
                            }
                            seen.claims.insert(gone.name_any(), gone);
                        }
                        watcher::Event::InitDone => {
                            if let Some(listed) = listed.take() {
                                let _ = listed.send(());
                            }
                        }
                        watcher::Event::Init => {}
                    }
                    let found = double_boots(seen.claims.values());
                    seen.violations.extend(found);
                }
            })
        };
        let job_task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut listed = Some(jobs_listed);
                let mut events =
                    watcher(jobs, watcher::Config::default()).default_backoff().boxed();
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { continue };
                    match event {
                        watcher::Event::Apply(job) | watcher::Event::InitApply(job) => {
                            let labels = job.labels();
                            let entry = (
                                labels.get(LABEL_NODECLAIM).cloned(),
                                labels.get(LABEL_LIFECYCLE).cloned(),
                            );
                            let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                            seen.jobs.insert(job.name_any(), entry);
                        }
                        watcher::Event::InitDone => {
                            if let Some(listed) = listed.take() {
                                let _ = listed.send(());
                            }
                        }
                        _ => {}
                    }
                }
            })
        };
        let ledger = Ledger { seen, tasks: vec![claim_task, job_task] };
        // A ledger that has not listed cannot vouch for what came before its watch: wait for
        // both lists as long as a component may take to start on a loaded machine, then fail.
        tokio::time::timeout(crate::wait::start_timeout(), async {
            let _ = claims_ready.await;
            let _ = jobs_ready.await;
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the ledger's watches of {ns} did not list within {:?}",
                crate::wait::start_timeout()
            )
        })?;
        Ok(ledger)
    }

    /// Every claim seen so far, as last seen.
    pub fn claims(&self) -> BTreeMap<String, NodeClaim> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).claims.clone()
    }

    /// Violations of the run-long invariants: two booting claims on a slot at any moment, a
    /// claim with more than one Job of a lifecycle, and a startup Job of a claim that never
    /// committed its boot (docs/decisions.md, D35).
    pub fn violations(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = seen.violations.clone();
        let mut per_claim: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for (job, (claim, lifecycle)) in &seen.jobs {
            if let (Some(claim), Some(lifecycle)) = (claim, lifecycle) {
                per_claim
                    .entry((claim.clone(), lifecycle.clone()))
                    .or_default()
                    .insert(job.clone());
            }
        }
        for ((claim, lifecycle), jobs) in per_claim {
            if jobs.len() > 1 {
                out.push(format!("claim {claim} had {} {lifecycle} Jobs: {jobs:?}", jobs.len()));
            }
            // A startup Job is created only once its claim's boot is committed (D35).
            let committed = seen
                .claims
                .get(&claim)
                .and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.boot_committed_at.is_some());
            if lifecycle == "startup" && !committed {
                out.push(format!(
                    "startup Job {jobs:?} of claim {claim}, which never committed its boot"
                ));
            }
        }
        out.dedup();
        out
    }
}

/// The bounds of [`settled`].
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// How far past its deadline a claim may still be in its boot window.
    pub deadline_margin: Duration,
    /// How long a claim may carry a deletion timestamp.
    pub terminating: Duration,
}

/// A claim's end is written by a reconcile pass queued for its deadline: a write and a pass on
/// the loaded two-core machine, the slack the lab's budget allows for them.
const DEADLINE_MARGIN: Duration = crate::lab::LOADED_MARGIN;
/// A deleted claim waits for its drain and shutdown Job (the lab's 5 s and 10 s) and for its
/// machine to be seen off, with room for a loaded machine.
const TERMINATING: Duration = Duration::from_secs(60);

impl Default for Bounds {
    fn default() -> Self {
        Self { deadline_margin: DEADLINE_MARGIN, terminating: TERMINATING }
    }
}

fn age(time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Duration {
    let since = jiff::Timestamp::now().duration_since(time.0);
    Duration::try_from(since).unwrap_or_default()
}

/// The end-state invariants of namespace `ns` now. `nodes` are the Kubernetes nodes of this
/// namespace's slots (nodes are cluster-wide; slot names carry the namespace in the suites).
pub async fn settled(client: &Client, ns: &str, bounds: Bounds) -> Result<Vec<String>> {
    let claims: Vec<NodeClaim> =
        Api::<NodeClaim>::namespaced(client.clone(), ns).list(&ListParams::default()).await?.items;
    let slots: Vec<Slot> =
        Api::<Slot>::namespaced(client.clone(), ns).list(&ListParams::default()).await?.items;
    let jobs: Vec<Job> =
        Api::<Job>::namespaced(client.clone(), ns).list(&ListParams::default()).await?.items;
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let mut out = Vec::new();
    let now = jiff::Timestamp::now();

    for claim in &claims {
        let name = claim.name_any();
        let phase = claim.status.as_ref().and_then(|s| s.phase);
        if phase::in_boot_window(phase)
            && let Some(deadline) = &claim.spec.deadline_at
        {
            let late = now.duration_since(deadline.0);
            if late > jiff::SignedDuration::try_from(bounds.deadline_margin)? {
                out.push(format!("claim {name} is still {phase:?}, {late:#} past its deadline"));
            }
        }
        if let Some(deleted) = &claim.metadata.deletion_timestamp
            && age(deleted) > bounds.terminating
        {
            out.push(format!(
                "claim {name} stuck Terminating for {:?} (finalizers {:?}, status {:?})",
                age(deleted),
                claim.metadata.finalizers,
                claim.status
            ));
        }
    }
    out.extend(double_boots(claims.iter().filter(|c| c.metadata.deletion_timestamp.is_none())));

    for job in &jobs {
        let status = job.status.clone().unwrap_or_default();
        let finished = status.succeeded.unwrap_or(0) > 0
            || status
                .conditions
                .iter()
                .flatten()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
        if !finished {
            out.push(format!("Job {} is still running", job.name_any()));
        }
    }

    for slot in &slots {
        let node_name = &slot.spec.kubernetes_node_name;
        let of_slot: Vec<&NodeClaim> =
            claims.iter().filter(|c| c.spec.slot_ref.name == slot.name_any()).collect();
        let wanted = of_slot.iter().any(|c| {
            c.metadata.deletion_timestamp.is_none()
                && phase::wants_machine(
                    c.status.as_ref().and_then(|s| s.phase),
                    phase::is_marked(c),
                )
        });
        let Some(node) = nodes.get_opt(node_name).await? else { continue };
        // A Node that is not Ready is a machine that is off (or not up yet); its Node may stay
        // until the operator sees the machine confirmed off.
        if !wanted && crate::is_ready(&node) {
            out.push(format!("machine {node_name} is on without a wanted claim"));
        }
        let in_gate = of_slot.iter().any(|c| {
            c.metadata.deletion_timestamp.is_none()
                && phase::in_boot_window(c.status.as_ref().and_then(|s| s.phase))
        });
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        if !in_gate && taints.iter().any(|t| t.key == STARTUP_TAINT) {
            out.push(format!("node {node_name} keeps {STARTUP_TAINT} with no claim booting"));
        }
        let manual = of_slot.iter().any(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.spec.request.call == ClaimCall::Manual
                && phase::is_live(c.status.as_ref().and_then(|s| s.phase))
        });
        if !manual && node.annotations().contains_key(SCALE_DOWN_DISABLED) {
            out.push(format!("node {node_name} keeps {SCALE_DOWN_DISABLED} with no Manual claim"));
        }
    }
    Ok(out)
}

/// Waits (up to `timeout`) for [`settled`] to find nothing, then returns; else fails with
/// what it still finds.
pub async fn until_settled(
    client: &Client,
    ns: &str,
    bounds: Bounds,
    timeout: Duration,
) -> Result<()> {
    crate::eventually("the invariants to hold", timeout, || async {
        let found = settled(client, ns, bounds).await?;
        ensure!(found.is_empty(), "{}", found.join("; "));
        Ok(())
    })
    .await
}
