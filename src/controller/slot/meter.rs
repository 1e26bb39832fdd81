//! Reads a slot's plug meter (`spec.power.http.meter`) for the energy report: at most once per
//! meter interval per slot, from the leader. The operator reads it itself rather than through a
//! Job, because a reading is one small GET a minute; a meter request that names Secrets needs
//! the operator to be allowed to read them (docs/power.md, "Measured draw").

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{HttpPower, MeasuredDraw, Node, SlotPhase};
use crate::controller::Context;
use crate::power::{PowerError, Secrets, http};
use crate::telemetry;

/// How long one reading may take; a plug on the LAN answers in milliseconds.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What one attempt to read the meter found.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Watts { watts: f64, at: Timestamp },
    Failed(String),
}

/// The plug settings of a slot whose plug has a meter.
pub fn metered(slot: &Node) -> Option<&HttpPower> {
    slot.spec.power.as_ref()?.http.as_ref().filter(|h| h.meter.is_some())
}

/// Reads the meter if the slot has one and was not tried within the interval.
pub async fn read_if_due(ctx: &Context, slot: &Node) -> Option<Reading> {
    let settings = metered(slot)?;
    let name = slot.metadata.name.as_deref()?;
    if !ctx.meter_read_due(name) {
        return None;
    }
    let reading = match read(ctx, settings).await {
        Ok(watts) => {
            telemetry::slot_draw_read(slot.group().unwrap_or_default(), name, watts);
            Reading::Watts { watts, at: ctx.now() }
        }
        Err(error) => {
            tracing::warn!(%error, "reading the plug's meter failed");
            Reading::Failed(advice(&error))
        }
    };
    Some(reading)
}

async fn read(ctx: &Context, settings: &HttpPower) -> Result<f64, PowerError> {
    let names: Vec<String> = settings.meter.iter().flat_map(|m| m.request.secret_names()).collect();
    let secrets = Secrets::load(ctx.client.clone(), &ctx.namespace, names).await?;
    http::read_watts_within(settings, &secrets, READ_TIMEOUT).await
}

/// The condition message of a failed read: what failed and what to do about it.
fn advice(error: &PowerError) -> String {
    match error {
        PowerError::ReadSecret { secret, .. } => format!(
            "{error}; the operator reads a meter's Secrets itself: create Secret {secret} in its \
             namespace if it is missing, and let the operator read it (the chart's \
             energy.meterSecrets). The energy report counts the declared watts meanwhile"
        ),
        _ => format!(
            "{error}; check spec.power.http.meter against the plug (docs/power.md). The energy \
             report counts the declared watts meanwhile"
        ),
    }
}

/// The slot's draw after `reading`: a new reading replaces the last; a reading taken while the
/// slot is ready is also its on-draw. A failed or skipped read keeps what was known.
pub fn next_draw(
    previous: Option<&MeasuredDraw>,
    reading: Option<&Reading>,
    report: SlotPhase,
) -> Option<MeasuredDraw> {
    let Some(Reading::Watts { watts, at }) = reading else {
        return previous.cloned();
    };
    let when_on_watts = if report == SlotPhase::Ready {
        Some(*watts)
    } else {
        previous.and_then(|d| d.when_on_watts)
    };
    Some(MeasuredDraw { watts: *watts, read_at: Time(*at), when_on_watts })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn a_ready_reading_is_the_on_draw_and_others_keep_it() {
        let ready =
            next_draw(None, Some(&Reading::Watts { watts: 92.5, at: at(60) }), SlotPhase::Ready)
                .unwrap();
        assert_eq!((ready.watts, ready.when_on_watts), (92.5, Some(92.5)));
        let off = next_draw(
            Some(&ready),
            Some(&Reading::Watts { watts: 3.5, at: at(120) }),
            SlotPhase::Off,
        )
        .unwrap();
        assert_eq!((off.watts, off.read_at.0, off.when_on_watts), (3.5, at(120), Some(92.5)));
        let booting = next_draw(
            None,
            Some(&Reading::Watts { watts: 140.0, at: at(180) }),
            SlotPhase::Booting,
        )
        .unwrap();
        assert_eq!(booting.when_on_watts, None, "a boot's surge is not the on-draw");
        let failed = Reading::Failed("timed out".into());
        assert_eq!(next_draw(Some(&off), Some(&failed), SlotPhase::Ready), Some(off.clone()));
        assert_eq!(next_draw(Some(&off), None, SlotPhase::Ready), Some(off));
        assert_eq!(next_draw(None, Some(&failed), SlotPhase::Ready), None);
    }

    #[test]
    fn a_failed_read_says_what_to_do() {
        let secret = PowerError::ReadSecret { secret: "plug".into(), detail: "forbidden".into() };
        let message = advice(&secret);
        assert!(message.contains("energy.meterSecrets") && message.contains("Secret plug"));
        assert!(message.contains("create Secret plug"), "{message}");
        let protocol = PowerError::protocol("http://plug/rpc", "answered 404");
        let message = advice(&protocol);
        assert!(message.contains("check spec.power.http.meter"), "{message}");
        assert!(message.contains("declared watts meanwhile"), "{message}");
    }
}
