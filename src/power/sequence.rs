//! Power sequences: a direction's steps run in order, each within its bound. A step may wait
//! first, for the plug's measured draw to stay under a threshold (the OS has halted) or for a
//! fixed time (a plug that measures nothing), then runs its driver. The first failure ends the
//! sequence with an error that names the step and what to check.
//!
//! An off sequence resumes where a failed attempt left the machine: when the plug's meter
//! already reads under a later step's `afterDrawBelowWatts`, the OS is down (an earlier
//! attempt's shutdown landed, and a later step such as the relay cut failed), so the steps
//! before it are skipped. Otherwise a retry would run the SSH shutdown first, against a halted
//! machine that cannot answer, and the relay would stay on for good.

use std::time::Duration;

use tracing::Instrument;

use super::{PowerError, Secrets, http, run_driver};
use crate::api::{
    DEFAULT_DRAW_STEADY_SECONDS, DEFAULT_STEP_TIMEOUT_SECONDS, PowerAction, PowerDriverKind,
    PowerSpec, PowerStep,
};

/// How often the meter is read while a step waits for the draw to fall.
const METER_INTERVAL: Duration = Duration::from_secs(1);

/// What to set for a driver a sequence names but the slot does not configure.
pub fn how_to_configure(kind: PowerDriverKind, action: PowerAction) -> String {
    match (kind, action) {
        (PowerDriverKind::Http, _) => format!(
            "configure spec.power.http with an {} (docs/power.md shows Shelly, Tasmota and Home \
             Assistant)",
            action.request_field()
        ),
        (PowerDriverKind::WakeOnLan, PowerAction::Off) => {
            "Wake-on-LAN can only power a machine on".to_string()
        }
        (PowerDriverKind::Ssh, PowerAction::On) => "SSH can only shut a machine down".to_string(),
        (kind, _) => format!("configure spec.power.{}", kind.field()),
    }
}

/// Runs the steps of `action`'s sequence; says what each did.
#[tracing::instrument(skip_all, fields(action = action.as_str()))]
pub async fn run(
    spec: &PowerSpec,
    action: PowerAction,
    secrets: &Secrets,
) -> Result<String, PowerError> {
    let mut done = Vec::new();
    let steps = spec.sequence(action);
    let first = match resume_at(spec, action, secrets).await {
        Some((index, watts, threshold)) => {
            tracing::info!(index, watts, threshold, "the OS is down already: resuming");
            done.push(format!(
                "steps before {index} skipped: the draw reads {watts} W, under {threshold} W, \
                 so the OS is down already"
            ));
            index
        }
        None => 0,
    };
    for (index, step) in steps.iter().enumerate().skip(first) {
        let span = tracing::info_span!("step", index, driver = step.driver.field());
        let failed = |detail: String| PowerError::Step {
            sequence: action.sequence_field(),
            index,
            driver: step.driver.field(),
            detail,
        };
        let bound = Duration::from_secs(u64::from(
            step.timeout_seconds.unwrap_or(DEFAULT_STEP_TIMEOUT_SECONDS),
        ));
        let summary = tokio::time::timeout(bound, run_step(spec, step, action, secrets))
            .instrument(span)
            .await
            .map_err(|_| {
                failed(format!(
                    "it did not finish within its timeoutSeconds ({}s): {}",
                    bound.as_secs(),
                    what_to_check(step)
                ))
            })?
            .map_err(|error| failed(error.to_string()))?;
        tracing::info!(summary, "step done");
        done.push(format!("{}: {summary}", step.driver.field()));
    }
    Ok(done.join("; "))
}

/// Where an off sequence resumes: the first step after the first that waits for the draw to fall
/// under a threshold the meter reads under now, with the reading and the threshold. `None`
/// (start at the beginning) for an on sequence, one without such a step, or a meter that does
/// not answer.
async fn resume_at(
    spec: &PowerSpec,
    action: PowerAction,
    secrets: &Secrets,
) -> Option<(usize, f64, f64)> {
    if action != PowerAction::Off {
        return None;
    }
    let steps = spec.sequence(action);
    let waits = steps.iter().enumerate().skip(1).filter_map(|(index, step)| {
        step.after_draw_below_watts.map(|threshold| (index, threshold))
    });
    let waits: Vec<(usize, f64)> = waits.collect();
    if waits.is_empty() {
        return None;
    }
    let settings = spec.http.as_ref()?;
    let watts = match http::read_watts_within(settings, secrets, METER_READ_BOUND).await {
        Ok(watts) => watts,
        Err(error) => {
            tracing::info!(%error, "the meter does not answer: the sequence starts at its first step");
            return None;
        }
    };
    // The first such step: skip no more than the reading shows to be done.
    waits.into_iter().find(|(_, threshold)| watts < *threshold).map(|(i, t)| (i, watts, t))
}

/// Before a plug switches a machine on: a relay left on under a halted OS (an off sequence that
/// shut the OS down but never cut the relay) would make the switch-on a no-op and the machine
/// would never boot, so it is switched off first, and the switch-on that follows powers the
/// machine up (its firmware set to power on when AC returns, as a plug-switched machine needs).
/// "Halted" is the off sequence's own: a draw above zero and under the `afterDrawBelowWatts` of
/// its plug step. A plug without a meter, a meter that does not answer, or a draw of zero or
/// above the threshold leaves the relay as it is.
pub(crate) async fn cycle_a_halted_relay(
    spec: &PowerSpec,
    secrets: &Secrets,
) -> Result<Option<String>, PowerError> {
    let threshold = spec
        .off_sequence
        .iter()
        .filter(|s| s.driver == PowerDriverKind::Http)
        .find_map(|s| s.after_draw_below_watts);
    let (Some(threshold), Some(settings)) = (threshold, spec.http.as_ref()) else {
        return Ok(None);
    };
    if settings.meter.is_none() || settings.off.is_none() {
        return Ok(None);
    }
    let read = http::read_watts_within(settings, secrets, METER_READ_BOUND).await;
    let Ok(watts) = read else { return Ok(None) };
    if !(watts > 0.0 && watts < threshold) {
        return Ok(None);
    }
    tracing::info!(watts, threshold, "the relay is on under a halted OS: switching it off first");
    http::send(settings, PowerAction::Off, secrets).await?;
    // Give the power supply time to drain, as a person pulling the plug would.
    let settled = tokio::time::Instant::now() + RELAY_SETTLE;
    while tokio::time::Instant::now() < settled {
        tokio::time::sleep(METER_INTERVAL).await;
        let now = http::read_watts_within(settings, secrets, METER_READ_BOUND).await;
        if matches!(now, Ok(w) if w == 0.0) {
            break;
        }
    }
    Ok(Some(format!(
        "the relay was on under a halted OS ({watts} W, under {threshold} W): switched it off first"
    )))
}

/// The longest a halted machine's relay is left off before it is switched on again.
const RELAY_SETTLE: Duration = Duration::from_secs(10);

/// How long one meter read that decides what a sequence does first may take.
const METER_READ_BOUND: Duration = Duration::from_secs(5);

/// What a step that ran out of time was most likely waiting for.
fn what_to_check(step: &PowerStep) -> String {
    match (step.after_draw_below_watts, step.driver) {
        (Some(watts), _) => format!(
            "it was waiting for the plug's draw to stay under {watts} W; check that the step \
             before really shuts the OS down, and that afterDrawBelowWatts is above the \
             machine's standby draw (read http.meter by hand)"
        ),
        (None, PowerDriverKind::Ssh) => {
            "check that the machine answers SSH and the command returns".to_string()
        }
        (None, _) => format!("check that spec.power.{} answers", step.driver.field()),
    }
}

async fn run_step(
    spec: &PowerSpec,
    step: &PowerStep,
    action: PowerAction,
    secrets: &Secrets,
) -> Result<String, PowerError> {
    let mut waited = String::new();
    if let Some(seconds) = step.delay_seconds {
        // A fixed wait is the only way to give an unmetered machine time to halt.
        tokio::time::sleep(Duration::from_secs(u64::from(seconds))).await;
        waited = format!("after {seconds}s, ");
    }
    if let Some(threshold) = step.after_draw_below_watts {
        let steady = Duration::from_secs(u64::from(
            step.draw_steady_seconds.unwrap_or(DEFAULT_DRAW_STEADY_SECONDS),
        ));
        let watts = draw_fallen(spec, secrets, threshold, steady).await?;
        waited =
            format!("the draw stayed under {threshold} W for {}s ({watts} W), ", steady.as_secs());
    }
    let summary = run_driver(spec, step.driver, action, secrets).await?;
    Ok(format!("{waited}{summary}"))
}

/// Reads the meter until the draw has stayed under `threshold` for `steady`; returns the last
/// reading. Runs until its caller's bound cuts it.
pub(crate) async fn draw_fallen(
    spec: &PowerSpec,
    secrets: &Secrets,
    threshold: f64,
    steady: Duration,
) -> Result<f64, PowerError> {
    let settings = spec.http.as_ref().ok_or_else(|| {
        PowerError::Settings("afterDrawBelowWatts needs spec.power.http.meter".into())
    })?;
    let mut below_since: Option<tokio::time::Instant> = None;
    loop {
        let watts = http::read_watts(settings, secrets).await?;
        let now = tokio::time::Instant::now();
        if watts < threshold {
            let since = *below_since.get_or_insert(now);
            if now.duration_since(since) >= steady {
                return Ok(watts);
            }
        } else {
            below_since = None;
        }
        tracing::debug!(watts, threshold, "waiting for the draw to fall");
        tokio::time::sleep(METER_INTERVAL).await;
    }
}
