//! Power drivers: what `homelab-autoscaler power on|off|suspend|status` does, in a Job's pod or at a
//! person's terminal. One file per protocol; this module picks the driver a slot's `spec.power`
//! names for a direction, runs it, and, where the protocol can read the power state, waits until
//! the machine reports the state asked for.

pub mod cli;
pub mod http;
pub mod ipmi;
pub mod redfish;
pub mod resolve;
mod rmcp_ping;
pub mod secrets;
pub mod sequence;
pub mod ssh;
pub mod wol;

use std::time::Duration;

pub use secrets::{DEFAULT_SECRETS_DIR, Secrets};

use crate::api::{
    DEFAULT_SUSPEND_COMMAND, DEFAULT_SUSPEND_QUIET_SECONDS, DriverChoice, PowerAction,
    PowerDriverKind, PowerSpec,
};

/// The environment variable that carries a Job's power settings (JSON of `spec.power`, reduced
/// to the driver the Job runs).
pub const SPEC_ENV: &str = "HOMELAB_POWER_SPEC";
/// How long a driver waits for the machine to report the new state, unless the slot says.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the power state is read while waiting.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A machine's power state as its BMC reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
}

impl PowerState {
    fn of(action: PowerAction) -> Self {
        match action {
            PowerAction::On => PowerState::On,
            PowerAction::Off => PowerState::Off,
        }
    }
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PowerState::On => "On",
            PowerState::Off => "Off",
        })
    }
}

/// Why powering a machine failed. The message ends up in the pod's termination message, so it
/// says what to check.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    #[error("spec.power: {0}")]
    Settings(String),
    #[error("reading Secret {secret}: {detail}")]
    ReadSecret { secret: String, detail: String },
    #[error("{peer} refused the login ({detail}): check Secret {secret}")]
    Unauthorized { peer: String, secret: String, detail: String },
    #[error("{peer}: {detail}")]
    Protocol { peer: String, detail: String },
    #[error("{peer} did not report {wanted} within {waited:?} (last reported {last})")]
    NotConfirmed { peer: String, wanted: PowerState, waited: Duration, last: String },
    #[error(
        "{peer} still answers ({answered}) {waited:?} after {command:?}: the suspend did not \
         take. Check that the firmware offers suspend-to-RAM (S3; `cat /sys/power/mem_sleep` on \
         the machine lists `deep`) and that nothing inhibits sleep (`systemd-inhibit --list`)"
    )]
    NotSuspended { peer: String, command: String, waited: Duration, answered: String },
    #[error(
        "the machine's plug did not read under {threshold} W for {steady:?} within {:.0}s \
         after {command:?}, though its SSH port fell silent: it is not asleep (a machine that \
         hangs instead of sleeping, or a suspend.watts too low for this machine)",
        .waited.as_secs_f64()
    )]
    StillDrawing { command: String, threshold: f64, steady: Duration, waited: Duration },
    /// A step of a power sequence failed: which one, and why.
    #[error("spec.power.{sequence}[{index}] ({driver}) failed: {detail}")]
    Step { sequence: &'static str, index: usize, driver: &'static str, detail: String },
}

impl PowerError {
    pub(crate) fn protocol(peer: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        PowerError::Protocol { peer: peer.into(), detail: detail.to_string() }
    }
}

/// An error and its causes on one line: reqwest's own message ("error sending request") hides
/// the reason (a refused connection, an untrusted certificate) in its sources.
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// What a finished action did, for the log and the person at the terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub driver: PowerDriverKind,
    pub summary: String,
}

/// Picks the driver for `action`, or says why none.
pub fn driver_for(spec: &PowerSpec, action: PowerAction) -> Result<PowerDriverKind, PowerError> {
    match spec.driver_for(action) {
        DriverChoice::Chosen(kind) => Ok(kind),
        DriverChoice::None => Err(PowerError::Settings(format!(
            "no configured driver can power the machine {}",
            action.as_str()
        ))),
        DriverChoice::Unusable(kind) if !spec.sequence(action).is_empty() => {
            Err(PowerError::Settings(format!(
                "spec.power.{} names {}, which is not configured or cannot power a machine {}: {}",
                action.sequence_field(),
                kind.field(),
                action.as_str(),
                sequence::how_to_configure(kind, action)
            )))
        }
        DriverChoice::Unusable(kind) => Err(PowerError::Settings(format!(
            "spec.power.{} is {}, but {} is not configured or cannot power a machine {}",
            action.driver_field(),
            kind.field(),
            kind.field(),
            action.as_str()
        ))),
        DriverChoice::Ambiguous(kinds) => Err(PowerError::Settings(format!(
            "{} drivers could power the machine {}: set spec.power.{} to one of them",
            kinds.iter().map(|k| k.field()).collect::<Vec<_>>().join(", "),
            action.as_str(),
            action.driver_field()
        ))),
    }
}

/// Powers the machine `action` with the driver `spec` picks (or the steps of its sequence), and
/// confirms the new state where the protocol can read it.
#[tracing::instrument(skip_all, fields(action = action.as_str()))]
pub async fn power(
    spec: &PowerSpec,
    action: PowerAction,
    secrets: &Secrets,
) -> Result<Done, PowerError> {
    let kind = driver_for(spec, action)?;
    if !spec.sequence(action).is_empty() {
        let summary = sequence::run(spec, action, secrets).await?;
        return Ok(Done { driver: kind, summary });
    }
    let summary = run_driver(spec, kind, action, secrets).await?;
    tracing::info!(driver = kind.field(), summary, "done");
    Ok(Done { driver: kind, summary })
}

/// Runs one driver.
pub(crate) async fn run_driver(
    spec: &PowerSpec,
    kind: PowerDriverKind,
    action: PowerAction,
    secrets: &Secrets,
) -> Result<String, PowerError> {
    let confirm = spec
        .confirm_timeout_seconds
        .map_or(DEFAULT_CONFIRM_TIMEOUT, |s| Duration::from_secs(u64::from(s)));
    let missing = || PowerError::Settings(format!("{} is not configured", kind.field()));
    let summary = match kind {
        PowerDriverKind::WakeOnLan => wol::wake(spec.wake_on_lan.as_ref().ok_or_else(missing)?)
            .await
            .map_err(|e| PowerError::protocol("Wake-on-LAN", e))?,
        PowerDriverKind::Http => {
            let settings = spec.http.as_ref().ok_or_else(missing)?;
            let cycled = match action {
                PowerAction::On => sequence::cycle_a_halted_relay(spec, secrets).await?,
                PowerAction::Off => None,
            };
            let sent = http::send(settings, action, secrets).await?;
            cycled.map_or(sent.clone(), |cycled| format!("{cycled}; {sent}"))
        }
        PowerDriverKind::Ssh => {
            ssh::shutdown(spec.ssh.as_ref().ok_or_else(missing)?, secrets, confirm).await?
        }
        PowerDriverKind::Redfish => {
            let bmc =
                redfish::Bmc::connect(spec.redfish.as_ref().ok_or_else(missing)?, secrets).await?;
            set_and_confirm(&bmc, action, confirm).await?
        }
        PowerDriverKind::Ipmi => {
            let bmc = ipmi::Bmc::new(spec.ipmi.as_ref().ok_or_else(missing)?, secrets)?;
            set_and_confirm(&bmc, action, confirm).await?
        }
    };
    Ok(summary)
}

/// How long a suspended machine may take to fall silent, unless the slot says.
const DEFAULT_SUSPEND_CONFIRM: Duration = Duration::from_secs(60);

/// Suspends the machine to RAM: the `ssh` driver's login runs `spec.suspend`'s command, and
/// the host must then fall silent.
#[tracing::instrument(skip_all)]
pub async fn suspend(spec: &PowerSpec, secrets: &Secrets) -> Result<Done, PowerError> {
    let settings = spec.suspend.as_ref().ok_or_else(|| {
        PowerError::Settings("suspend is not configured (spec.power.suspend)".into())
    })?;
    let ssh = spec.ssh.as_ref().ok_or_else(|| {
        PowerError::Settings("spec.power.suspend needs spec.power.ssh to log in with".into())
    })?;
    let command = settings.command.as_deref().unwrap_or(DEFAULT_SUSPEND_COMMAND);
    let quiet = Duration::from_secs(u64::from(
        settings.quiet_seconds.unwrap_or(DEFAULT_SUSPEND_QUIET_SECONDS),
    ));
    let confirm = spec
        .confirm_timeout_seconds
        .map_or(DEFAULT_SUSPEND_CONFIRM, |s| Duration::from_secs(u64::from(s)));
    let started = tokio::time::Instant::now();
    let mut summary = ssh::suspend(ssh, command, secrets, quiet, confirm).await?;
    // With a plug that meters the machine and a declared draw asleep, the draw must fall too:
    // a machine that hangs on its way to sleep is silent but still draws its running power.
    let metered = spec.http.as_ref().is_some_and(|h| h.meter.is_some());
    if let (true, Some(asleep)) = (metered, settings.watts) {
        let threshold = asleep_threshold(asleep);
        let left = confirm.saturating_sub(started.elapsed()).max(SUSPEND_DRAW_STEADY * 2);
        let fallen = sequence::draw_fallen(spec, secrets, threshold, SUSPEND_DRAW_STEADY);
        let watts =
            tokio::time::timeout(left, fallen).await.map_err(|_| PowerError::StillDrawing {
                command: command.to_owned(),
                threshold,
                steady: SUSPEND_DRAW_STEADY,
                waited: left,
            })??;
        summary = format!(
            "{summary}; its plug read {watts} W, under {threshold} W, for {}s",
            SUSPEND_DRAW_STEADY.as_secs()
        );
    }
    tracing::info!(summary, "suspended");
    Ok(Done { driver: PowerDriverKind::Ssh, summary })
}

/// How long a machine's metered draw must stay under [`asleep_threshold`] after a suspend.
const SUSPEND_DRAW_STEADY: Duration = Duration::from_secs(5);

/// The draw under which a machine whose declared draw asleep is `asleep` watts reads asleep:
/// twice that, plus a watt for the plug's own error; an idle machine awake draws several times
/// more. Pure.
pub fn asleep_threshold(asleep: f64) -> f64 {
    2.0 * asleep + 1.0
}

/// How often a machine asleep is sent the wake again while the off path waits for it.
const WAKE_RESEND: Duration = Duration::from_secs(5);

/// Powers off a machine asleep (suspended to RAM). An off path that starts with SSH needs the
/// OS awake: a Wake-on-LAN packet wakes it (sent again while it does not answer), and the off
/// path runs once its SSH port answers. Any other off path (a BMC, a plug) powers it off as it
/// is.
#[tracing::instrument(skip_all)]
pub async fn power_off_asleep(spec: &PowerSpec, secrets: &Secrets) -> Result<Done, PowerError> {
    let off = spec.drivers_of(PowerAction::Off);
    let (Some(PowerDriverKind::Ssh), Some(ssh)) = (off.first(), spec.ssh.as_ref()) else {
        return power(spec, PowerAction::Off, secrets).await;
    };
    let packet = spec.wake_on_lan.as_ref().ok_or_else(|| {
        PowerError::Settings("a machine asleep is woken by spec.power.wakeOnLan: set it".into())
    })?;
    let confirm = spec
        .confirm_timeout_seconds
        .map_or(DEFAULT_CONFIRM_TIMEOUT, |s| Duration::from_secs(u64::from(s)));
    let started = tokio::time::Instant::now();
    let woke = loop {
        let sent = wol::wake(packet).await.map_err(|e| PowerError::protocol("Wake-on-LAN", e))?;
        if ssh::answers_within(ssh, WAKE_RESEND).await? {
            break sent;
        }
        if started.elapsed() >= confirm {
            return Err(PowerError::NotConfirmed {
                peer: format!("SSH at {}", ssh.host),
                wanted: PowerState::On,
                waited: confirm,
                last: "no answer on the SSH port after Wake-on-LAN packets: the machine did not \
                       wake from sleep"
                    .into(),
            });
        }
    };
    let done = power(spec, PowerAction::Off, secrets).await?;
    let summary =
        format!("{woke}, awake after {:.1}s; {}", started.elapsed().as_secs_f32(), done.summary);
    Ok(Done { driver: done.driver, summary })
}

/// Reads the power state, if a configured driver can.
pub async fn status(spec: &PowerSpec, secrets: &Secrets) -> Result<Option<PowerState>, PowerError> {
    match spec.status_driver() {
        Some(PowerDriverKind::Redfish) => {
            let Some(settings) = spec.redfish.as_ref() else { return Ok(None) };
            let bmc = redfish::Bmc::connect(settings, secrets).await?;
            Ok(Some(bmc.power_state().await?))
        }
        Some(PowerDriverKind::Ipmi) => {
            let Some(settings) = spec.ipmi.as_ref() else { return Ok(None) };
            let bmc = ipmi::Bmc::new(settings, secrets)?;
            Ok(Some(bmc.power_state().await?))
        }
        _ => Ok(None),
    }
}

/// A BMC: reads and sets the power state.
pub(crate) trait Reads {
    fn peer(&self) -> String;
    async fn power_state(&self) -> Result<PowerState, PowerError>;
    async fn set_power(&self, action: PowerAction) -> Result<(), PowerError>;
}

/// Asks for `action` unless the machine is already there, then polls until it reports so.
async fn set_and_confirm(
    bmc: &impl Reads,
    action: PowerAction,
    within: Duration,
) -> Result<String, PowerError> {
    let wanted = PowerState::of(action);
    let before = bmc.power_state().await?;
    if before == wanted {
        return Ok(format!("{} already reports {wanted}", bmc.peer()));
    }
    bmc.set_power(action).await?;
    let started = tokio::time::Instant::now();
    let mut last;
    loop {
        match bmc.power_state().await {
            Ok(state) if state == wanted => {
                return Ok(format!(
                    "{} reports {wanted} after {:.1}s",
                    bmc.peer(),
                    started.elapsed().as_secs_f32()
                ));
            }
            Ok(state) => last = state.to_string(),
            Err(error) => last = format!("an error: {error}"),
        }
        if started.elapsed() >= within {
            return Err(PowerError::NotConfirmed {
                peer: bmc.peer(),
                wanted,
                waited: within,
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
