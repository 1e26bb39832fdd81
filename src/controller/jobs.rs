//! Lifecycle Jobs: the startup and shutdown pods of a slot, built from its spec. A Job is owned
//! by the claim it serves (controller) with the slot as a second owner, so deleting a slot takes
//! its claims and their Jobs, and a Job keeps its provenance after the claim is collected.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvVar, PodSpec, PodTemplateSpec, SecretVolumeSource, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::{
    LABEL_GROUP, LABEL_LIFECYCLE, LABEL_MANAGED_BY, LABEL_NODECLAIM, LABEL_SLOT, LifecyclePodSpec,
    Node, NodeClaim,
};
use crate::claim::{DEFAULT_JOB_BACKOFF_LIMIT, DEFAULT_JOB_TTL_SECONDS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Startup,
    Shutdown,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Startup => "startup",
            Lifecycle::Shutdown => "shutdown",
        }
    }
}

/// The name of the startup Job of a claim: one per claim, so creating it is idempotent.
pub fn startup_job_name(claim: &str) -> String {
    bounded_name(&format!("{claim}-startup"))
}

/// The name of the n-th shutdown Job fired for `owner` (a claim, or the slot itself).
pub fn shutdown_job_name(owner: &str, attempt: i32) -> String {
    bounded_name(&format!("{owner}-shutdown-{attempt}"))
}

/// Job names become a pod label value, so they are kept within 63 characters; a longer name
/// keeps its head and gets a hash of the whole as its tail, so it stays unique and stable.
fn bounded_name(name: &str) -> String {
    const MAX: usize = 63;
    if name.len() <= MAX {
        return name.to_string();
    }
    let hash = name
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
    let tail = format!("-{:08x}", hash as u32);
    let mut head: String = name.chars().take(MAX - tail.len()).collect();
    while head.ends_with('-') || head.ends_with('.') {
        head.pop();
    }
    format!("{head}{tail}")
}

fn owner(reference: Option<OwnerReference>, controller: bool) -> Option<OwnerReference> {
    reference.map(|mut r| {
        r.controller = Some(controller);
        r.block_owner_deletion = Some(false);
        r
    })
}

/// What the lifecycle pod is told about itself.
pub struct JobContext<'a> {
    pub slot: &'a Node,
    pub group: &'a str,
    pub claim: Option<&'a NodeClaim>,
    pub lifecycle: Lifecycle,
    pub name: String,
    /// The ceiling of the Job's run time (the startup Job timeout of the budget).
    pub max_run_time: std::time::Duration,
}

/// Builds the Job. Pure; the caller creates it.
pub fn build(ctx: &JobContext<'_>) -> Job {
    let spec: &LifecyclePodSpec = match ctx.lifecycle {
        Lifecycle::Startup => &ctx.slot.spec.startup_pod_spec,
        Lifecycle::Shutdown => &ctx.slot.spec.shutdown_pod_spec,
    };
    let slot_name = ctx.slot.metadata.name.clone().unwrap_or_default();
    let claim_name = ctx.claim.and_then(|c| c.metadata.name.clone());
    let mut labels = BTreeMap::from([
        (LABEL_MANAGED_BY.0.to_string(), LABEL_MANAGED_BY.1.to_string()),
        (LABEL_LIFECYCLE.to_string(), ctx.lifecycle.as_str().to_string()),
        (LABEL_SLOT.to_string(), slot_name.clone()),
        (LABEL_GROUP.to_string(), ctx.group.to_string()),
    ]);
    if let Some(claim) = &claim_name {
        labels.insert(LABEL_NODECLAIM.to_string(), claim.clone());
    }
    let owners: Vec<OwnerReference> = [
        owner(ctx.claim.and_then(|c| c.controller_owner_ref(&())), true),
        owner(ctx.slot.controller_owner_ref(&()), ctx.claim.is_none()),
    ]
    .into_iter()
    .flatten()
    .collect();

    let attempt = ctx.claim.and_then(|c| c.spec.attempt).unwrap_or(1);
    let mut env = vec![
        env_var("HOMELAB_SLOT", &slot_name),
        env_var("HOMELAB_NODE_NAME", &ctx.slot.spec.kubernetes_node_name),
        env_var("HOMELAB_GROUP", ctx.group),
        env_var("HOMELAB_NODECLAIM", claim_name.as_deref().unwrap_or("")),
        env_var("HOMELAB_ATTEMPT", &attempt.to_string()),
        env_var("HOMELAB_LIFECYCLE", ctx.lifecycle.as_str()),
    ];
    env.extend(spec.env.iter().cloned());

    let volumes: Vec<Volume> = spec
        .volumes
        .iter()
        .map(|v| Volume {
            name: v.name.clone(),
            secret: v.secret_name.as_ref().map(|s| SecretVolumeSource {
                secret_name: Some(s.clone()),
                ..SecretVolumeSource::default()
            }),
            config_map: v.config_map_name.as_ref().map(|c| ConfigMapVolumeSource {
                name: c.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        })
        .collect();
    let mounts: Vec<VolumeMount> = spec
        .volumes
        .iter()
        .map(|v| VolumeMount {
            name: v.name.clone(),
            mount_path: v.mount_path.clone(),
            read_only: Some(true),
            ..VolumeMount::default()
        })
        .collect();

    let ceiling = i64::try_from(ctx.max_run_time.as_secs()).unwrap_or(i64::MAX).max(1);
    let active_deadline = spec.active_deadline_seconds.map_or(ceiling, |s| s.min(ceiling));
    Job {
        metadata: ObjectMeta {
            name: Some(ctx.name.clone()),
            namespace: ctx.slot.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            owner_references: Some(owners),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(spec.backoff_limit.unwrap_or(DEFAULT_JOB_BACKOFF_LIMIT)),
            active_deadline_seconds: Some(active_deadline),
            ttl_seconds_after_finished: Some(
                spec.ttl_seconds_after_finished.unwrap_or(DEFAULT_JOB_TTL_SECONDS),
            ),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..ObjectMeta::default() }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    service_account_name: spec.service_account_name.clone(),
                    node_selector: (!spec.node_selector.is_empty())
                        .then(|| spec.node_selector.clone()),
                    tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
                    volumes: (!volumes.is_empty()).then_some(volumes),
                    containers: vec![Container {
                        name: ctx.lifecycle.as_str().into(),
                        image: Some(spec.image.clone()),
                        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
                        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
                        env: Some(env),
                        resources: spec.resources.clone(),
                        volume_mounts: (!mounts.is_empty()).then_some(mounts),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{claim, slot};

    #[test]
    fn long_names_are_bounded_stable_and_distinct() {
        let a = "a".repeat(80) + "-x";
        let b = "a".repeat(80) + "-y";
        assert!(startup_job_name(&a).len() <= 63);
        assert_eq!(startup_job_name(&a), startup_job_name(&a));
        assert_ne!(startup_job_name(&a), startup_job_name(&b));
        assert_eq!(startup_job_name("m1-abcde"), "m1-abcde-startup");
    }

    #[test]
    fn the_startup_job_carries_the_slot_spec_and_its_provenance() {
        let mut s = slot("m1", "pool");
        s.metadata.uid = Some("slot-uid".into());
        s.spec.startup_pod_spec.active_deadline_seconds = Some(900);
        s.spec.startup_pod_spec.command = vec!["wake".into()];
        let mut c = claim("m1-abcde", "m1", "pool");
        c.metadata.uid = Some("claim-uid".into());
        c.spec.attempt = Some(2);
        let job = build(&JobContext {
            slot: &s,
            group: "pool",
            claim: Some(&c),
            lifecycle: Lifecycle::Startup,
            name: startup_job_name("m1-abcde"),
            max_run_time: std::time::Duration::from_secs(300),
        });
        let owners = job.metadata.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 2);
        assert_eq!((owners[0].kind.as_str(), owners[0].controller), ("NodeClaim", Some(true)));
        assert_eq!((owners[1].kind.as_str(), owners[1].controller), ("Node", Some(false)));
        let labels = job.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_NODECLAIM], "m1-abcde");
        assert_eq!(labels[LABEL_LIFECYCLE], "startup");
        let spec = job.spec.unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(300), "capped by the budget's Job timeout");
        let container = &spec.template.spec.unwrap().containers[0];
        assert_eq!(container.command.as_deref(), Some(&["wake".to_string()][..]));
        let env = container.env.clone().unwrap();
        assert!(env.iter().any(|e| e.name == "HOMELAB_ATTEMPT" && e.value.as_deref() == Some("2")));
        assert!(
            env.iter()
                .any(|e| e.name == "HOMELAB_NODECLAIM" && e.value.as_deref() == Some("m1-abcde"))
        );
    }
}
