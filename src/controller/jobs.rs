//! Lifecycle Jobs: the startup and shutdown pods of a slot, built from its spec. A Job is owned
//! by the claim it serves (controller) with the slot as a second owner, so deleting a slot takes
//! its claims and their Jobs, and a Job keeps its provenance after the claim is collected.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EnvVar, Pod, PodSecurityContext, PodSpec,
    PodTemplateSpec, SeccompProfile, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::api::{
    ANNOTATION_CONFIRMS_OFF, ANNOTATION_SUSPENDS, LABEL_GROUP, LABEL_LIFECYCLE, LABEL_MANAGED_BY,
    LABEL_NODECLAIM, LABEL_SLOT, LifecyclePodSpec, Node, NodeClaim, PowerAction, PowerDriverKind,
    PowerSpec,
};
use crate::claim::{DEFAULT_JOB_BACKOFF_LIMIT, DEFAULT_JOB_TTL_SECONDS};
use crate::power;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Startup,
    Shutdown,
    /// The pool's maintenance step before a machine's power-off.
    BeforePowerOff,
    /// The pool's maintenance step once the machine is back.
    AfterReady,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Startup => "startup",
            Lifecycle::Shutdown => "shutdown",
            Lifecycle::BeforePowerOff => "before-power-off",
            Lifecycle::AfterReady => "after-ready",
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
pub fn bounded_name(name: &str) -> String {
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
    /// The operator's own image, which power Jobs run as `homelab-autoscaler power on|off`.
    pub power_image: &'a str,
    /// The PriorityClass of the Job's pod, so that a full cluster preempts something else
    /// rather than leave a boot pending (`--power-job-priority-class`; None: the default).
    pub priority_class: Option<&'a str>,
    /// The pod of a maintenance step (`BeforePowerOff`, `AfterReady`), from the slot's Group.
    pub step: Option<&'a LifecyclePodSpec>,
    /// A shutdown that suspends the machine to RAM (`spec.power.suspend`) instead of powering
    /// it off.
    pub suspend: bool,
    /// A shutdown of a machine asleep: its pod wakes it first where the off path needs its OS
    /// (`power off --wake-first`).
    pub wake_first: bool,
}

/// Why a slot cannot be turned into a Job (admission refuses such a slot; an object stored
/// before that rule can still carry it).
#[derive(Debug, thiserror::Error)]
#[error("slot {slot} has no way to power its machine {direction}: {detail}")]
pub struct NoLifecycle {
    pub slot: String,
    pub direction: &'static str,
    pub detail: String,
}

/// What runs in a lifecycle pod: the slot's own pod spec, or a power driver.
enum Source<'a> {
    Pod(&'a LifecyclePodSpec),
    Power {
        spec: &'a PowerSpec,
        kind: PowerDriverKind,
        action: PowerAction,
    },
    /// `power suspend`: the `ssh` driver's login runs the suspend command.
    Suspend(&'a PowerSpec),
}

/// The suspend of a slot whose `spec.power` says how (admission checks that it can).
fn suspend_source(slot: &Node) -> Result<Source<'_>, NoLifecycle> {
    match slot.spec.power.as_ref() {
        Some(spec) if spec.suspend.is_some() && spec.ssh.is_some() => Ok(Source::Suspend(spec)),
        _ => Err(NoLifecycle {
            slot: slot.metadata.name.clone().unwrap_or_default(),
            direction: "to sleep",
            detail: "spec.power.suspend needs spec.power.ssh".into(),
        }),
    }
}

fn source<'a>(slot: &'a Node, lifecycle: Lifecycle) -> Result<Source<'a>, NoLifecycle> {
    let (pod, action) = match lifecycle {
        Lifecycle::Startup => (slot.spec.startup_pod_spec.as_ref(), PowerAction::On),
        Lifecycle::Shutdown => (slot.spec.shutdown_pod_spec.as_ref(), PowerAction::Off),
        Lifecycle::BeforePowerOff | Lifecycle::AfterReady => {
            return Err(NoLifecycle {
                slot: slot.metadata.name.clone().unwrap_or_default(),
                direction: PowerAction::Off.as_str(),
                detail: format!("no {} step was given", lifecycle.as_str()),
            });
        }
    };
    let fail = |detail: String| NoLifecycle {
        slot: slot.metadata.name.clone().unwrap_or_default(),
        direction: action.as_str(),
        detail,
    };
    if let Some(pod) = pod {
        return Ok(Source::Pod(pod));
    }
    let spec = slot.spec.power.as_ref().ok_or_else(|| {
        fail(format!("neither spec.power nor spec.{}PodSpec is set", lifecycle.as_str()))
    })?;
    let kind = power::driver_for(spec, action).map_err(|e| fail(e.to_string()))?;
    Ok(Source::Power { spec, kind, action })
}

/// The settings a power Job's pod is given: the slot's `spec.power` reduced to the drivers it
/// runs (the one driver, or the steps of the direction's sequence), so the pod sees no other
/// driver's settings.
pub fn reduced_power_spec(
    spec: &PowerSpec,
    kind: PowerDriverKind,
    action: PowerAction,
) -> PowerSpec {
    let mut reduced =
        PowerSpec { confirm_timeout_seconds: spec.confirm_timeout_seconds, ..PowerSpec::default() };
    let sequence = spec.sequence(action).to_vec();
    let kinds: Vec<PowerDriverKind> = if sequence.is_empty() {
        match action {
            PowerAction::On => reduced.on = Some(kind),
            PowerAction::Off => reduced.off = Some(kind),
        }
        vec![kind]
    } else {
        sequence.iter().map(|s| s.driver).collect()
    };
    let metered = sequence.iter().any(|s| s.after_draw_below_watts.is_some());
    match action {
        PowerAction::On => reduced.on_sequence = sequence,
        PowerAction::Off => reduced.off_sequence = sequence,
    }
    for kind in kinds {
        copy_driver(spec, &mut reduced, kind, action, metered);
    }
    reduced
}

/// Copies the settings of driver `kind` for `action` into `reduced`; the meter only when a step
/// reads it.
fn copy_driver(
    spec: &PowerSpec,
    reduced: &mut PowerSpec,
    kind: PowerDriverKind,
    action: PowerAction,
    metered: bool,
) {
    match kind {
        PowerDriverKind::WakeOnLan => reduced.wake_on_lan = spec.wake_on_lan.clone(),
        PowerDriverKind::Redfish => reduced.redfish = spec.redfish.clone(),
        PowerDriverKind::Ipmi => reduced.ipmi = spec.ipmi.clone(),
        PowerDriverKind::Http => {
            reduced.http = spec.http.clone().map(|mut http| {
                // Only the request of this direction: the other may name other Secrets.
                match action {
                    PowerAction::On => http.off = None,
                    PowerAction::Off => http.on = None,
                }
                if !metered {
                    http.meter = None;
                }
                http
            });
        }
        PowerDriverKind::Ssh => reduced.ssh = spec.ssh.clone(),
    }
}

impl Source<'_> {
    /// Whether the pod's success means the machine reports the state it was asked for. Every
    /// typed driver's does: a BMC reads the state back, a plug cuts the power at the outlet, and
    /// SSH saw the command exit 0 or the host fall silent after it. A pod spec's only when it
    /// says so (`confirmsPowerState`): its exit 0 may only mean that a request went out.
    fn confirms_state(&self) -> bool {
        match self {
            Source::Pod(spec) => spec.confirms_power_state,
            Source::Power { .. } => true,
            Source::Suspend(_) => false,
        }
    }
}

/// Builds the Job. Pure; the caller creates it.
pub fn build(ctx: &JobContext<'_>) -> Result<Job, NoLifecycle> {
    let source = match (ctx.lifecycle, ctx.step) {
        (Lifecycle::BeforePowerOff | Lifecycle::AfterReady, Some(step)) => Source::Pod(step),
        (Lifecycle::Shutdown, _) if ctx.suspend => suspend_source(ctx.slot)?,
        _ => source(ctx.slot, ctx.lifecycle)?,
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
    let env = vec![
        env_var("HOMELAB_SLOT", &slot_name),
        env_var("HOMELAB_NODE_NAME", &ctx.slot.spec.kubernetes_node_name),
        env_var("HOMELAB_GROUP", ctx.group),
        env_var("HOMELAB_NODECLAIM", claim_name.as_deref().unwrap_or("")),
        env_var("HOMELAB_ATTEMPT", &attempt.to_string()),
        env_var("HOMELAB_LIFECYCLE", ctx.lifecycle.as_str()),
    ];
    let confirms_off = ctx.lifecycle == Lifecycle::Shutdown && source.confirms_state();
    let suspends = matches!(source, Source::Suspend(_));
    let (mut pod, run) = match source {
        Source::Pod(spec) => (pod_from_spec(ctx, spec, env), JobRun::of(spec)),
        Source::Power { spec, kind, action } if ctx.wake_first && action == PowerAction::Off => {
            let mut reduced = reduced_power_spec(spec, kind, action);
            // The wake: the on path's Wake-on-LAN (admission holds a slot that may sleep to it).
            reduced.wake_on_lan = spec.wake_on_lan.clone();
            let mut drivers = reduced.drivers_of(action);
            drivers.push(PowerDriverKind::WakeOnLan);
            let verb = "off --wake-first";
            (power_pod(ctx, spec, &reduced, &drivers, verb, env), JobRun::default())
        }
        Source::Power { spec, kind, action } => {
            let reduced = reduced_power_spec(spec, kind, action);
            let drivers = reduced.drivers_of(action);
            (power_pod(ctx, spec, &reduced, &drivers, action.as_str(), env), JobRun::default())
        }
        Source::Suspend(spec) => {
            let reduced = reduced_suspend_spec(spec);
            let mut drivers = vec![PowerDriverKind::Ssh];
            if reduced.http.is_some() {
                drivers.push(PowerDriverKind::Http);
            }
            (power_pod(ctx, spec, &reduced, &drivers, "suspend", env), JobRun::default())
        }
    };
    pod.priority_class_name = ctx.priority_class.map(str::to_string);

    let mut annotations = BTreeMap::new();
    if confirms_off {
        annotations.insert(ANNOTATION_CONFIRMS_OFF.to_string(), "true".to_string());
    }
    if suspends {
        annotations.insert(ANNOTATION_SUSPENDS.to_string(), "true".to_string());
    }
    let annotations = (!annotations.is_empty()).then_some(annotations);
    let ceiling = i64::try_from(ctx.max_run_time.as_secs()).unwrap_or(i64::MAX).max(1);
    let active_deadline = run.active_deadline_seconds.map_or(ceiling, |s| s.min(ceiling));
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(ctx.name.clone()),
            namespace: ctx.slot.metadata.namespace.clone(),
            labels: Some(labels.clone()),
            annotations,
            owner_references: Some(owners),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(run.backoff_limit.unwrap_or(DEFAULT_JOB_BACKOFF_LIMIT)),
            active_deadline_seconds: Some(active_deadline),
            // A succeeded step before a power-off is the record that its after-ready step is
            // due, which may be hours later: it is kept until then (`maintenance`).
            ttl_seconds_after_finished: (ctx.lifecycle != Lifecycle::BeforePowerOff)
                .then(|| run.ttl_seconds_after_finished.unwrap_or(DEFAULT_JOB_TTL_SECONDS)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..ObjectMeta::default() }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    })
}

/// The Job-level settings a pod spec may override.
#[derive(Default)]
struct JobRun {
    backoff_limit: Option<i32>,
    active_deadline_seconds: Option<i64>,
    ttl_seconds_after_finished: Option<i32>,
}

impl JobRun {
    fn of(spec: &LifecyclePodSpec) -> Self {
        JobRun {
            backoff_limit: spec.backoff_limit,
            active_deadline_seconds: spec.active_deadline_seconds,
            ttl_seconds_after_finished: spec.ttl_seconds_after_finished,
        }
    }
}

fn pod_from_spec(ctx: &JobContext<'_>, spec: &LifecyclePodSpec, mut env: Vec<EnvVar>) -> PodSpec {
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
    PodSpec {
        restart_policy: Some("Never".into()),
        service_account_name: spec.service_account_name.clone(),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
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
    }
}

/// The user the power pod runs as (the distroless "nonroot" user).
const POWER_POD_USER: i64 = 65532;

/// The settings a suspend Job's pod is given: the `ssh` driver's login, the suspend, and the
/// plug's meter when there is one (its switch requests left out: the pod only reads it).
fn reduced_suspend_spec(spec: &PowerSpec) -> PowerSpec {
    let meter = spec.http.as_ref().filter(|h| h.meter.is_some()).map(|h| crate::api::HttpPower {
        on: None,
        off: None,
        ..h.clone()
    });
    PowerSpec {
        confirm_timeout_seconds: spec.confirm_timeout_seconds,
        ssh: spec.ssh.clone(),
        http: meter,
        suspend: spec.suspend.clone(),
        ..PowerSpec::default()
    }
}

/// A pod that runs the operator's image as `homelab-autoscaler power <verb>` (on, off,
/// suspend): the `reduced` settings in an environment variable, only the Secrets of `drivers`
/// mounted, no API access.
fn power_pod(
    ctx: &JobContext<'_>,
    spec: &PowerSpec,
    reduced: &PowerSpec,
    drivers: &[PowerDriverKind],
    verb: &str,
    mut env: Vec<EnvVar>,
) -> PodSpec {
    // Serializing plain data into a String cannot fail; an empty spec would fail loudly in the pod.
    env.push(env_var(power::SPEC_ENV, &serde_json::to_string(reduced).unwrap_or_default()));
    env.push(env_var("HOMELAB_POWER_SECRETS_DIR", power::DEFAULT_SECRETS_DIR));
    env.push(env_var("HOMELAB_POWER_TERMINATION_LOG", TERMINATION_LOG));
    let secrets: std::collections::BTreeSet<String> =
        drivers.iter().flat_map(|k| reduced.secrets_of(*k)).collect();
    let volumes: Vec<Volume> = secrets
        .iter()
        .enumerate()
        .map(|(i, name)| Volume {
            name: format!("secret-{i}"),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        })
        .collect();
    let mounts: Vec<VolumeMount> = secrets
        .iter()
        .enumerate()
        .map(|(i, name)| VolumeMount {
            name: format!("secret-{i}"),
            mount_path: format!("{}/{name}", power::DEFAULT_SECRETS_DIR),
            read_only: Some(true),
            ..VolumeMount::default()
        })
        .collect();
    // A magic packet must leave on the machines' LAN, not on the pod network.
    let host_network = drivers.contains(&PowerDriverKind::WakeOnLan);
    PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        host_network: host_network.then_some(true),
        dns_policy: host_network.then(|| "ClusterFirstWithHostNet".into()),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(POWER_POD_USER),
            run_as_group: Some(POWER_POD_USER),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        volumes: (!volumes.is_empty()).then_some(volumes),
        containers: vec![Container {
            name: ctx.lifecycle.as_str().into(),
            image: Some(ctx.power_image.to_string()),
            args: Some(["power"].into_iter().chain(verb.split(' ')).map(Into::into).collect()),
            env: Some(env),
            volume_mounts: (!mounts.is_empty()).then_some(mounts),
            termination_message_path: Some(TERMINATION_LOG.into()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Capabilities::default()
                }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

/// Where the power pod writes why it failed, for Kubernetes to report.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// The longest pod termination message carried into a claim's failure message.
const MAX_FAILURE_DETAIL: usize = 400;

/// Why a Job's pod failed, in its own words: the termination message of the newest pod that
/// wrote one (a power pod writes its error there). Pure; the caller lists the Job's pods.
pub fn failure_detail(pods: &[Pod]) -> Option<String> {
    let mut newest_first: Vec<&Pod> = pods.iter().collect();
    newest_first.sort_by_key(|p| std::cmp::Reverse(p.metadata.creation_timestamp.clone()));
    newest_first.into_iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|status| {
            let message = status.state.as_ref()?.terminated.as_ref()?.message.as_deref()?;
            let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
            (!line.is_empty()).then(|| line.chars().take(MAX_FAILURE_DETAIL).collect())
        })
    })
}

/// The label the job controller puts on a Job's pods.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{claim, slot};

    fn pod(created: &str, message: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "creationTimestamp": created },
            "status": { "containerStatuses": [{
                "name": "startup", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": { "terminated": { "exitCode": 1, "message": message } },
            }]},
        }))
        .unwrap()
    }

    #[test]
    fn failure_detail_is_the_newest_pods_termination_message() {
        let refused = "BMC at 10.0.0.5 refused the login (answered 401): check Secret bmc";
        let table: &[(&str, Vec<Pod>, Option<&str>)] = &[
            ("no pods", vec![], None),
            ("no message", vec![pod("2026-03-04T09:00:00Z", None)], None),
            ("blank message", vec![pod("2026-03-04T09:00:00Z", Some(" \n"))], None),
            (
                "the newest pod wins",
                vec![
                    pod("2026-03-04T09:00:00Z", Some("older")),
                    pod("2026-03-04T09:01:00Z", Some(refused)),
                ],
                Some(refused),
            ),
            (
                "one line",
                vec![pod("2026-03-04T09:00:00Z", Some("first\n  second\n"))],
                Some("first second"),
            ),
        ];
        for (name, pods, want) in table {
            assert_eq!(failure_detail(pods).as_deref(), *want, "{name}");
        }
        let long = "x".repeat(1000);
        let detail = failure_detail(&[pod("2026-03-04T09:00:00Z", Some(&long))]).unwrap();
        assert_eq!(detail.len(), MAX_FAILURE_DETAIL);
    }

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
        let startup = s.spec.startup_pod_spec.get_or_insert_default();
        startup.active_deadline_seconds = Some(900);
        startup.command = vec!["wake".into()];
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
            power_image: "operator:1",
            priority_class: None,
            step: None,
            suspend: false,
            wake_first: false,
        })
        .unwrap();
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

    #[test]
    fn every_lifecycle_pod_carries_the_priority_class() {
        let from_spec = slot("m1", "pool");
        let mut powered = slot("m2", "pool");
        powered.spec.startup_pod_spec = None;
        powered.spec.power = Some(PowerSpec {
            wake_on_lan: Some(
                serde_json::from_value(serde_json::json!({ "mac": "aa:bb:cc:dd:ee:ff" })).unwrap(),
            ),
            ..PowerSpec::default()
        });
        for s in [&from_spec, &powered] {
            for class in [None, Some("homelab-autoscaler-power")] {
                let job = build(&JobContext {
                    slot: s,
                    group: "pool",
                    claim: None,
                    lifecycle: Lifecycle::Startup,
                    name: "job".into(),
                    max_run_time: std::time::Duration::from_secs(300),
                    power_image: "operator:1",
                    priority_class: class,
                    step: None,
                    suspend: false,
                    wake_first: false,
                })
                .unwrap();
                let pod = job.spec.unwrap().template.spec.unwrap();
                assert_eq!(pod.priority_class_name.as_deref(), class, "{:?}", s.metadata.name);
            }
        }
    }

    /// A slot that sleeps: its routine shutdown Job runs `power suspend` with the SSH login, the
    /// suspend and the plug's meter (not its switch), says it suspends and confirms nothing off;
    /// the power-off of a machine asleep runs `power off --wake-first` on the host network, with
    /// the magic packet's settings.
    #[test]
    fn a_slot_that_sleeps_gets_a_suspend_job_and_a_wake_first_power_off() {
        let mut s = slot("m1", "pool");
        s.spec.startup_pod_spec = None;
        s.spec.shutdown_pod_spec = None;
        s.spec.power = Some(
            serde_json::from_value(serde_json::json!({
                "wakeOnLan": { "mac": "aa:bb:cc:dd:ee:ff" },
                "ssh": {
                    "host": "10.0.0.3", "user": "root",
                    "privateKey": { "name": "k", "key": "ssh-privatekey" },
                    "knownHostKey": "ssh-ed25519 AAAA",
                },
                "http": {
                    "offRequest": { "url": "http://plug/off", "basicAuth": { "secretName": "plug-switch" } },
                    "meter": { "request": { "url": "http://plug/status" }, "wattsPointer": "/apower" },
                },
                "offWith": "ssh",
                "suspend": { "watts": 2.5 },
            }))
            .unwrap(),
        );
        let job_of = |suspend, wake_first| {
            build(&JobContext {
                slot: &s,
                group: "pool",
                claim: None,
                lifecycle: Lifecycle::Shutdown,
                name: "job".into(),
                max_run_time: std::time::Duration::from_secs(300),
                power_image: "operator:1",
                priority_class: None,
                step: None,
                suspend,
                wake_first,
            })
            .unwrap()
        };
        let pod_of = |job: &Job| job.spec.clone().unwrap().template.spec.unwrap();
        let settings = |pod: &PodSpec| -> PowerSpec {
            let env = pod.containers[0].env.clone().unwrap();
            let raw = env.iter().find(|e| e.name == power::SPEC_ENV).unwrap().value.clone();
            serde_json::from_str(&raw.unwrap()).unwrap()
        };

        let suspend = job_of(true, false);
        let annotations = suspend.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.get(ANNOTATION_SUSPENDS).map(String::as_str), Some("true"));
        assert!(!annotations.contains_key(ANNOTATION_CONFIRMS_OFF), "asleep is not off");
        let pod = pod_of(&suspend);
        assert_eq!(
            pod.containers[0].args.as_deref(),
            Some(&["power".into(), "suspend".into()][..])
        );
        let given = settings(&pod);
        assert!(given.ssh.is_some() && given.suspend.is_some() && given.wake_on_lan.is_none());
        let http = given.http.expect("the meter");
        assert!(http.meter.is_some() && http.off.is_none(), "the meter, not the switch");
        assert_eq!(pod.host_network, None, "no magic packet to send");

        let off = job_of(false, true);
        let pod = pod_of(&off);
        let args: Vec<String> = pod.containers[0].args.clone().unwrap();
        assert_eq!(args, ["power", "off", "--wake-first"]);
        assert!(settings(&pod).wake_on_lan.is_some(), "the wake's packet");
        assert_eq!(pod.host_network, Some(true), "the packet leaves on the machines' LAN");
        let annotations = off.metadata.annotations.clone().unwrap_or_default();
        assert!(!annotations.contains_key(ANNOTATION_SUSPENDS));
    }

    /// What a shutdown Job's success proves is written on it when it is made: a typed driver's
    /// reads the machine off, a pod spec's only when it says so, and a startup Job never says.
    #[test]
    fn a_shutdown_job_says_whether_its_success_confirms_the_machine_off() {
        let from_spec = slot("m1", "pool");
        let mut confirming = slot("m2", "pool");
        confirming.spec.shutdown_pod_spec.get_or_insert_default().confirms_power_state = true;
        let mut powered = slot("m3", "pool");
        powered.spec.shutdown_pod_spec = None;
        powered.spec.power = Some(PowerSpec {
            ssh: Some(
                serde_json::from_value(serde_json::json!({
                    "host": "10.0.0.3", "user": "root",
                    "privateKey": { "name": "k", "key": "ssh-privatekey" },
                    "knownHostKey": "ssh-ed25519 AAAA",
                }))
                .unwrap(),
            ),
            ..PowerSpec::default()
        });
        let table = [
            ("a pod spec that only ran", &from_spec, Lifecycle::Shutdown, None),
            (
                "a pod spec that reads the machine off",
                &confirming,
                Lifecycle::Shutdown,
                Some("true"),
            ),
            ("a typed driver", &powered, Lifecycle::Shutdown, Some("true")),
            ("a startup Job", &confirming, Lifecycle::Startup, None),
        ];
        for (name, s, lifecycle, want) in table {
            let job = build(&JobContext {
                slot: s,
                group: "pool",
                claim: None,
                lifecycle,
                name: "job".into(),
                max_run_time: std::time::Duration::from_secs(300),
                power_image: "operator:1",
                priority_class: None,
                step: None,
                suspend: false,
                wake_first: false,
            })
            .unwrap();
            let annotations = job.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations.get(ANNOTATION_CONFIRMS_OFF).map(String::as_str),
                want,
                "{name}"
            );
        }
    }
}
