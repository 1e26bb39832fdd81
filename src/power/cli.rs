//! `homelab-autoscaler power on|off|suspend|status`: in a power Job's pod, with the settings in
//! `HOMELAB_POWER_SPEC` and the Secrets mounted; at a terminal, with `--slot NAME`, reading the
//! slot and its Secrets with the user's kubeconfig, so a person can check a machine's wiring
//! before the autoscaler relies on it.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::{PowerError, SPEC_ENV, Secrets, driver_for, power, power_off_asleep, status, suspend};
use crate::api::{Node, NodeClaim, PowerAction, PowerDriverKind, PowerSpec};
use crate::phase;

/// What `power` does.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum PowerCommand {
    /// Power the machine on and, where the protocol can tell, wait until it reports On.
    On(PowerTarget),
    /// Power the machine off and, where the protocol can tell, wait until it reports Off.
    Off(OffArgs),
    /// Suspend the machine to RAM (`spec.power.suspend`, over the `ssh` driver's login) and
    /// wait until it stops answering.
    Suspend(PowerTarget),
    /// Say which drivers power the machine and, where one can, read its power state.
    Status(PowerTarget),
}

/// `power off`'s arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct OffArgs {
    #[command(flatten)]
    pub target: PowerTarget,
    /// The machine sleeps (suspended to RAM): where the off path starts with SSH, wake it with
    /// `spec.power.wakeOnLan` first and run the off path once it answers.
    #[arg(long)]
    pub wake_first: bool,
}

/// What a `power` command does to the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Switch(PowerAction),
    /// Off, waking a machine asleep first where the off path needs its OS.
    OffAsleep,
    Suspend,
    Status,
}

/// Which machine, and where its settings come from.
#[derive(Clone, Debug, clap::Args)]
pub struct PowerTarget {
    /// The slot to read `spec.power` and its Secrets from, with your kubeconfig.
    #[arg(long, conflicts_with = "spec")]
    pub slot: Option<String>,
    /// The namespace of the slot.
    #[arg(long, env = "HOMELAB_AUTOSCALER_NAMESPACE", default_value = crate::api::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// `spec.power` as JSON (what a power Job's pod is given).
    #[arg(long, env = SPEC_ENV, hide_env_values = true)]
    pub spec: Option<String>,
    /// Where the Secrets are mounted, one directory per Secret (in a power Job's pod).
    #[arg(long, env = "HOMELAB_POWER_SECRETS_DIR", default_value = super::DEFAULT_SECRETS_DIR)]
    pub secrets_dir: PathBuf,
    /// Where a failure is written for Kubernetes to report (a pod's termination message).
    #[arg(long, env = "HOMELAB_POWER_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Power(#[from] PowerError),
    #[error("{0}")]
    Usage(String),
    #[error("reading slot {slot}: {source}")]
    Slot { slot: String, source: kube::Error },
    #[error("connecting to the cluster: {0}")]
    Client(#[from] kube::Error),
}

/// Runs a `power` command; prints what happened.
pub async fn run(command: PowerCommand) -> Result<(), CliError> {
    let (act, target) = match command {
        PowerCommand::On(t) => (Act::Switch(PowerAction::On), t),
        PowerCommand::Off(OffArgs { target, wake_first: false }) => {
            (Act::Switch(PowerAction::Off), target)
        }
        PowerCommand::Off(OffArgs { target, wake_first: true }) => (Act::OffAsleep, target),
        PowerCommand::Suspend(t) => (Act::Suspend, t),
        PowerCommand::Status(t) => (Act::Status, t),
    };
    let result = execute(act, &target).await;
    if let (Err(error), Some(path)) = (&result, &target.termination_log) {
        // Best effort: the error is also on stderr.
        let _ = std::fs::write(path, error.to_string());
    }
    result
}

async fn execute(act: Act, target: &PowerTarget) -> Result<(), CliError> {
    let (spec, secrets, slot) = settings(act, target).await?;
    // A person at a terminal: say what the operator will do about it before acting.
    let warn = |action| {
        let slot = slot.as_ref();
        async move {
            if let Some((client, node)) = slot
                && let Some(warning) = claim_warning(client, node, &target.namespace, action).await
            {
                eprintln!("{warning}");
            }
        }
    };
    match act {
        Act::Switch(action) => {
            warn(action).await;
            let done = power(&spec, action, &secrets).await?;
            println!("{} ({}): {}", action.as_str(), done.driver.field(), done.summary);
        }
        Act::OffAsleep => {
            warn(PowerAction::Off).await;
            let done = power_off_asleep(&spec, &secrets).await?;
            println!("off ({}): {}", done.driver.field(), done.summary);
        }
        Act::Suspend => {
            warn(PowerAction::Off).await;
            let done = suspend(&spec, &secrets).await?;
            println!("suspend ({}): {}", done.driver.field(), done.summary);
        }
        Act::Status => {
            for action in [PowerAction::On, PowerAction::Off] {
                let how = match driver_for(&spec, action) {
                    Ok(kind) => kind.field().to_string(),
                    Err(error) => format!("not by spec.power ({error})"),
                };
                println!("{}: {how}", action.as_str());
            }
            match status(&spec, &secrets).await? {
                Some(state) => println!("power state: {state}"),
                None => println!("power state: unknown (no configured driver can read it)"),
            }
        }
    }
    Ok(())
}

/// The settings and Secrets: the slot's through the API (with the client and the slot), or the
/// pod's.
async fn settings(
    act: Act,
    target: &PowerTarget,
) -> Result<(PowerSpec, Secrets, Option<(kube::Client, Node)>), CliError> {
    if let Some(slot) = &target.slot {
        let client = kube::Client::try_default().await?;
        let slots: kube::Api<Node> = kube::Api::namespaced(client.clone(), &target.namespace);
        let node = slots
            .get(slot)
            .await
            .map_err(|source| CliError::Slot { slot: slot.clone(), source })?;
        let spec = node.spec.power.clone().ok_or_else(|| {
            CliError::Usage(format!(
                "slot {slot} has no spec.power: it is powered by its startupPodSpec and \
                 shutdownPodSpec, which only run as Jobs"
            ))
        })?;
        let mut names = BTreeSet::new();
        let mut needed: Vec<_> = match act {
            Act::Switch(action) => vec![driver_for(&spec, action)?],
            Act::OffAsleep => spec.drivers_of(PowerAction::Off),
            Act::Suspend => vec![PowerDriverKind::Ssh],
            Act::Status => spec.status_driver().into_iter().collect(),
        };
        needed.dedup();
        for kind in needed {
            names.extend(spec.secrets_of(kind));
        }
        let secrets = Secrets::load(client.clone(), &target.namespace, names).await?;
        return Ok((spec, secrets, Some((client, node))));
    }
    let json = target.spec.as_deref().ok_or_else(|| {
        CliError::Usage(format!("name a slot with --slot NAME (or pass --spec / {SPEC_ENV})"))
    })?;
    let spec: PowerSpec = serde_json::from_str(json)
        .map_err(|e| CliError::Usage(format!("{SPEC_ENV} is not a spec.power: {e}")))?;
    Ok((spec, Secrets::mounted(&target.secrets_dir), None))
}

/// A warning when switching the machine by hand goes against what its claims say: a machine is
/// wanted if and only if a live claim holds its slot, and the operator acts on that, not on the
/// power state. `None` when the action agrees with the claims, or when the claims cannot be read
/// (the warning is advice; it never stands in the way of the action).
async fn claim_warning(
    client: &kube::Client,
    slot: &Node,
    namespace: &str,
    action: PowerAction,
) -> Option<String> {
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let claims: kube::Api<NodeClaim> = kube::Api::namespaced(client.clone(), namespace);
    let listed = match claims.list(&kube::api::ListParams::default()).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::debug!(%error, slot = %slot_name, "cannot list claims; no claim warning");
            return None;
        }
    };
    let wanting = listed.items.into_iter().find(|c| {
        c.spec.slot_ref.name == slot_name
            && phase::wants_machine(Some(phase::of(c)), phase::is_marked(c))
    });
    match (action, wanting) {
        (PowerAction::On, None) => Some(power_on_warning(slot, namespace)),
        (PowerAction::Off, Some(claim)) => Some(power_off_warning(&claim, &slot_name, namespace)),
        _ => None,
    }
}

/// `power on` with no live claim: the operator powers an unwanted machine off again.
fn power_on_warning(slot: &Node, namespace: &str) -> String {
    let slot_name = slot.metadata.name.as_deref().unwrap_or_default();
    let group = slot.group();
    format!(
        "warning: no live NodeClaim holds slot {slot_name}, so nothing wants this machine: once \
         the operator sees it up, it drains it and powers it off again. To keep it on, pin it \
         instead of powering it on by hand: `homelab-autoscaler keep-on --slot {slot_name} \
         --namespace {namespace}` (add `--for 2h` or `--until 18:00` for an end; the operator \
         then boots it itself, and `homelab-autoscaler release --slot {slot_name}` powers it \
         off), or create a Manual claim yourself:\n\n{}",
        manual_claim_command(slot_name, group.unwrap_or("<group of the slot>"), namespace)
    )
}

/// `power off` under a live claim: the claim still counts the machine as capacity.
fn power_off_warning(claim: &NodeClaim, slot_name: &str, namespace: &str) -> String {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let phase = serde_json::to_value(phase::of(claim))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!(
        "warning: live NodeClaim {name} (phase {phase}) holds slot {slot_name}, so this machine is \
         still wanted: powering it off by hand does not release it. The claim fails once the \
         machine stays off, and its pool's scaler may boot the machine again for the same pods. \
         To power it off for good, delete the claim; the operator then drains the machine and \
         powers it off:\n\n  kubectl delete nodeclaim {name} -n {namespace}\n"
    )
}

/// A ready-to-run command creating the Manual claim for a slot (docs/api.md).
fn manual_claim_command(slot: &str, group: &str, namespace: &str) -> String {
    format!(
        "  kubectl create -f - <<'EOF'\n\
         apiVersion: infra.homecluster.dev/v2alpha1\n\
         kind: NodeClaim\n\
         metadata:\n\
         \x20 generateName: {slot}-\n\
         \x20 namespace: {namespace}\n\
         spec:\n\
         \x20 slotRef: {{ name: {slot} }}\n\
         \x20 request: {{ call: Manual, group: {group}, reason: started by hand }}\n\
         EOF\n"
    )
}
