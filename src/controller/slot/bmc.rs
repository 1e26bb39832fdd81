//! Reads a slot's BMC (`spec.power.redfish` or `spec.power.ipmi`) while its machine's kubelet is
//! silent, at most once per meter interval: a BMC on its own port answers while the machine's
//! link is down, so "on" there is a machine cut off from the API server, not off (decisions.md,
//! D28, "Partitions"). The operator reads it itself, with the BMC login the power Jobs use; the
//! Secrets it names must be readable by the operator (the chart's `bmcSecrets`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{BmcReading, Node, ObservedPower, PowerDriverKind};
use crate::controller::Context;
use crate::power::{self, PowerError, PowerState, Secrets};

/// How long one reading may take: a BMC that has not answered by then counts as unread. The
/// Redfish client's own timeout is longer, for the power Jobs.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What one attempt to read the BMC found: the reading `status.bmcReading` takes, or why none.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Read(BmcReading),
    Failed(String),
}

/// The BMC driver of a slot whose BMC can read the power state.
pub fn readable(slot: &Node) -> Option<PowerDriverKind> {
    slot.spec.power.as_ref()?.status_driver()
}

/// Reads the BMC if the slot has one, its kubelet is `silent`, and it was not tried within
/// the interval.
pub async fn read_if_due(ctx: &Context, slot: &Node, silent: bool) -> Option<Reading> {
    let kind = readable(slot).filter(|_| silent)?;
    let name = slot.metadata.name.as_deref()?;
    if !ctx.bmc_read_due(name) {
        return None;
    }
    let read = tokio::time::timeout(READ_TIMEOUT, read(ctx, slot, kind)).await;
    let reading = match read {
        Ok(Ok(state)) => {
            tracing::debug!(power = %state, "the BMC reports the silent machine's power");
            let power =
                if state == PowerState::On { ObservedPower::On } else { ObservedPower::Off };
            Reading::Read(BmcReading { power, read_at: Time(ctx.now()) })
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "reading the BMC failed");
            Reading::Failed(advice(&error))
        }
        Err(_) => {
            let error =
                PowerError::protocol(kind.field(), format!("no answer within {READ_TIMEOUT:?}"));
            tracing::warn!(%error, "reading the BMC failed");
            Reading::Failed(advice(&error))
        }
    };
    Some(reading)
}

async fn read(ctx: &Context, slot: &Node, kind: PowerDriverKind) -> Result<PowerState, PowerError> {
    let spec =
        slot.spec.power.as_ref().ok_or_else(|| PowerError::Settings("no spec.power".into()))?;
    let secrets = Secrets::load(ctx.client.clone(), &ctx.namespace, spec.secrets_of(kind)).await?;
    power::status(spec, &secrets).await?.ok_or_else(|| {
        PowerError::Settings(format!("{} cannot read the power state", kind.field()))
    })
}

/// The condition message of a failed read: what failed, what to do, and what it costs meanwhile.
fn advice(error: &PowerError) -> String {
    const MEANWHILE: &str =
        "Meanwhile a silent machine behind this BMC is judged by its silence alone";
    match error {
        PowerError::ReadSecret { secret, .. } => format!(
            "{error}; the operator reads a BMC's login itself while a kubelet is silent: create \
             Secret {secret} in its namespace if it is missing, and let the operator read it (the \
             chart's bmcSecrets). {MEANWHILE}"
        ),
        _ => format!(
            "{error}; check the slot's spec.power against the BMC (docs/power.md). {MEANWHILE}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_says_what_to_do() {
        let forbidden = PowerError::ReadSecret {
            secret: "bmc-login".into(),
            detail: "secrets \"bmc-login\" is forbidden".into(),
        };
        let message = advice(&forbidden);
        assert!(
            message.contains("Secret bmc-login") && message.contains("bmcSecrets"),
            "{message}"
        );
        assert!(message.contains("judged by its silence alone"), "{message}");
        let refused = PowerError::protocol("BMC at 10.0.0.5", "connection refused");
        let message = advice(&refused);
        assert!(
            message.contains("connection refused") && message.contains("spec.power"),
            "{message}"
        );
    }

    #[test]
    fn only_a_slot_with_a_bmc_is_read() {
        let slot = |power: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "m1" },
                "spec": { "kubernetesNodeName": "m1", "power": power },
            }))
            .unwrap()
        };
        let redfish = slot(serde_json::json!({ "redfish": {
            "endpoint": "https://10.0.0.5", "credentials": { "secretName": "bmc" } } }));
        let ipmi = slot(serde_json::json!({ "ipmi": {
            "host": "10.0.0.6", "credentials": { "secretName": "bmc" } } }));
        let wol = slot(serde_json::json!({ "wakeOnLan": { "mac": "00:11:22:33:44:55" } }));
        assert_eq!(readable(&redfish), Some(PowerDriverKind::Redfish));
        assert_eq!(readable(&ipmi), Some(PowerDriverKind::Ipmi));
        assert_eq!(readable(&wol), None);
    }
}
