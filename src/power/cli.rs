//! `homelab-autoscaler power on|off|status`: in a power Job's pod, with the settings in
//! `HOMELAB_POWER_SPEC` and the Secrets mounted; at a terminal, with `--slot NAME`, reading the
//! slot and its Secrets with the user's kubeconfig, so a person can check a machine's wiring
//! before the autoscaler relies on it.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::{PowerError, SPEC_ENV, Secrets, driver_for, power, status};
use crate::api::{Node, PowerAction, PowerSpec};

/// What `power` does.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum PowerCommand {
    /// Power the machine on and, where the protocol can tell, wait until it reports On.
    On(PowerTarget),
    /// Power the machine off and, where the protocol can tell, wait until it reports Off.
    Off(PowerTarget),
    /// Say which drivers power the machine and, where one can, read its power state.
    Status(PowerTarget),
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
    let (action, target) = match command {
        PowerCommand::On(t) => (Some(PowerAction::On), t),
        PowerCommand::Off(t) => (Some(PowerAction::Off), t),
        PowerCommand::Status(t) => (None, t),
    };
    let result = execute(action, &target).await;
    if let (Err(error), Some(path)) = (&result, &target.termination_log) {
        // Best effort: the error is also on stderr.
        let _ = std::fs::write(path, error.to_string());
    }
    result
}

async fn execute(action: Option<PowerAction>, target: &PowerTarget) -> Result<(), CliError> {
    let (spec, secrets) = settings(action, target).await?;
    match action {
        Some(action) => {
            let done = power(&spec, action, &secrets).await?;
            println!("{} ({}): {}", action.as_str(), done.driver.field(), done.summary);
        }
        None => {
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

/// The settings and Secrets: the slot's through the API, or the pod's.
async fn settings(
    action: Option<PowerAction>,
    target: &PowerTarget,
) -> Result<(PowerSpec, Secrets), CliError> {
    if let Some(slot) = &target.slot {
        let client = kube::Client::try_default().await?;
        let slots: kube::Api<Node> = kube::Api::namespaced(client.clone(), &target.namespace);
        let node = slots
            .get(slot)
            .await
            .map_err(|source| CliError::Slot { slot: slot.clone(), source })?;
        let spec = node.spec.power.ok_or_else(|| {
            CliError::Usage(format!(
                "slot {slot} has no spec.power: it is powered by its startupPodSpec and \
                 shutdownPodSpec, which only run as Jobs"
            ))
        })?;
        let mut names = BTreeSet::new();
        let mut needed: Vec<_> = match action {
            Some(action) => vec![driver_for(&spec, action)?],
            None => spec.status_driver().into_iter().collect(),
        };
        needed.dedup();
        for kind in needed {
            names.extend(spec.secrets_of(kind));
        }
        let secrets = Secrets::load(client, &target.namespace, names).await?;
        return Ok((spec, secrets));
    }
    let json = target.spec.as_deref().ok_or_else(|| {
        CliError::Usage(format!("name a slot with --slot NAME (or pass --spec / {SPEC_ENV})"))
    })?;
    let spec: PowerSpec = serde_json::from_str(json)
        .map_err(|e| CliError::Usage(format!("{SPEC_ENV} is not a spec.power: {e}")))?;
    Ok((spec, Secrets::mounted(&target.secrets_dir)))
}
