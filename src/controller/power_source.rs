//! The power-source controller: reads each pool's UPS (`spec.ups`) over NUT every
//! `pollInterval`, writes what it read to `status.power`, and sheds the pool's machines on
//! battery as `ups::shed` orders them, by releasing their claims (each machine then goes
//! through the slot's own power-off path, drain and power-off gates included). It never boots
//! anything: the webhook and the provider read `status.power` and refuse boots on battery.
//! A UPS several pools share is read once per poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::{KubeContext, Result};
use super::{Context, GroupInputs};
use crate::api::{Group, GroupPowerStatus, NodeClaim, PowerSource, SecretKeyRef, UpsPolicy};
use crate::field_manager::{FieldManager, apply_status_of};
use crate::power::secrets::Secrets;
use crate::provider::delete_nodes::mark_and_delete;
use crate::ups::address::UpsAddress;
use crate::ups::nut::{self, Credentials};
use crate::ups::reading::UpsReading;
use crate::ups::shed::{self, Machine, Pin, Trigger};
use crate::ups::{power_status, shed::Shed};
use crate::{gates, phase, telemetry};

/// How often a UPS is read unless its pool says.
pub const DEFAULT_POLL: Duration = Duration::from_secs(5);
/// How long one reading may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A reading younger than this answers every pool that names the same UPS.
const SHARED_FOR: Duration = Duration::from_secs(1);

/// A UPS and the Secret of the login it is read with.
type ReadingKey = (UpsAddress, Option<String>);
/// A reading, or why there is none, and when it was taken.
type Recent = HashMap<ReadingKey, (Instant, std::result::Result<UpsReading, String>)>;

/// Recent readings by UPS and login, so pools sharing a UPS read it (and its login's Secret)
/// once per poll, however often their Groups are reconciled.
#[derive(Default)]
struct Readings {
    recent: Mutex<Recent>,
}

impl Readings {
    /// The UPS of `policy` as read within [`SHARED_FOR`], or read now.
    async fn read(
        &self,
        ctx: &Context,
        policy: &UpsPolicy,
    ) -> std::result::Result<UpsReading, String> {
        let address: UpsAddress =
            policy.name.parse().map_err(|e: crate::ups::address::AddressError| e.to_string())?;
        let key = (address, policy.credentials_secret.clone());
        if let Some((at, reading)) = self.lock().get(&key)
            && at.elapsed() < SHARED_FOR
        {
            return reading.clone();
        }
        let reading = read_now(ctx, &key.0, key.1.as_deref()).await;
        self.lock().insert(key, (Instant::now(), reading.clone()));
        reading
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One reading of the UPS, logged in with the Secret's account if one is named.
async fn read_now(
    ctx: &Context,
    address: &UpsAddress,
    secret: Option<&str>,
) -> std::result::Result<UpsReading, String> {
    let credentials = match secret {
        Some(secret) => Some(credentials(ctx, secret).await?),
        None => None,
    };
    nut::read(address, credentials.as_ref(), READ_TIMEOUT).await.map_err(|e| e.to_string())
}

pub async fn controller(ctx: Arc<Context>, inputs: GroupInputs, shutdown: CancellationToken) {
    let controller = super::group::of_pools(&ctx, inputs, shutdown);
    let readings = Arc::new(Readings::default());
    let reconcile = move |group: Arc<Group>, ctx: Arc<Context>| {
        let readings = readings.clone();
        telemetry::reconcile("power_source", async move { reconcile(group, ctx, &readings).await })
    };
    super::drive("power_source", controller.run(reconcile, super::error_policy, ctx)).await;
}

async fn reconcile(group: Arc<Group>, ctx: Arc<Context>, readings: &Readings) -> Result<Action> {
    let name = group.metadata.name.clone().unwrap_or_default();
    let span = tracing::info_span!("reconcile_power_source", group = %name);
    reconcile_power_source(&group, &ctx, readings, &name).instrument(span).await
}

async fn reconcile_power_source(
    group: &Group,
    ctx: &Context,
    readings: &Readings,
    name: &str,
) -> Result<Action> {
    let previous = group.status.as_ref().and_then(|s| s.power.clone());
    let Some(policy) = group.spec.ups.as_ref() else {
        if previous.is_some() {
            write_status(ctx, name, previous.as_ref(), None).await?;
            telemetry::ups_forgotten(name);
        }
        return Ok(Action::await_change());
    };
    let now = ctx.now();
    let read = readings.read(ctx, policy).await;
    if let Err(why) = &read {
        // Every reconcile while unread: the change itself is logged and published once.
        tracing::debug!(ups = %policy.name, %why, "the UPS could not be read; nothing is shed on a missing reading");
    }
    let mut status = power_status::next(
        previous.as_ref(),
        &policy.name,
        read.as_ref().map_err(Clone::clone),
        policy,
        now,
    );
    let machines = machines_of(ctx, group, name);
    status.pool_watts =
        Some(machines.iter().filter(|m| !m.releasing).filter_map(|m| m.watts).sum());
    let trigger = shed::trigger(&status, &policy.on_battery, now);
    let shedding = shed::plan(&trigger, policy.on_battery.keep, &machines);
    if status.source != PowerSource::Unread {
        status.message = message(&trigger, policy, &machines, &shedding);
    }
    announce_change(ctx, group, previous.as_ref(), &status).await;
    for machine in &shedding {
        shed_one(ctx, group, machine, &status, now).await?;
    }
    telemetry::ups_read(name, &status);
    if power_status::worth_writing(previous.as_ref(), &status, now) {
        write_status(ctx, name, previous.as_ref(), Some(&status)).await?;
    }
    let poll = policy.poll_interval.map_or(DEFAULT_POLL, Into::into).max(Duration::from_secs(1));
    Ok(Action::requeue(poll))
}

/// The `username` and `password` of an `upsd.users` account from a Secret of the namespace,
/// read as the power drivers read theirs.
async fn credentials(ctx: &Context, secret: &str) -> std::result::Result<Credentials, String> {
    let why = |e: crate::power::PowerError| {
        format!("reading the NUT login (spec.ups.credentialsSecret): {e}")
    };
    let secrets = Secrets::load(ctx.client.clone(), &ctx.namespace, [secret.to_owned()])
        .await
        .map_err(why)?;
    let key = |key: &str| {
        secrets.text(&SecretKeyRef { name: secret.to_owned(), key: key.to_owned() }).map_err(why)
    };
    Ok(Credentials { username: key("username")?, password: key("password")? })
}

/// The pool's machines that a live claim keeps on.
fn machines_of(ctx: &Context, group: &Group, name: &str) -> Vec<Machine> {
    let mut machines = Vec::new();
    for slot in ctx.stores.slots_of_group(name) {
        let Some(slot_name) = slot.metadata.name.clone() else { continue };
        let live = ctx
            .stores
            .claims_of_slot(&slot_name)
            .into_iter()
            .find(|c| phase::is_live(Some(phase::of(c))));
        let Some(claim) = live else { continue };
        let pin = match (claim.spec.request.call.is_pin(), claim.spec.boot_on_battery) {
            (true, Some(true)) => Pin::BootOnBattery,
            (true, _) => Pin::Pin,
            (false, _) => Pin::None,
        };
        machines.push(Machine {
            slot: slot_name,
            claim: claim.metadata.name.clone().unwrap_or_default(),
            watts: slot.running_watts(),
            data: gates::is_data_machine(&group.spec, &slot.spec),
            pin,
            releasing: phase::is_marked(&claim),
        });
    }
    machines
}

/// What the pool does about its power, for `status.power.message`.
fn message(
    trigger: &Trigger,
    policy: &UpsPolicy,
    machines: &[Machine],
    shedding: &[Shed],
) -> Option<String> {
    let powered = machines.iter().filter(|m| !m.releasing).count();
    let going = machines.iter().filter(|m| m.releasing).count() + shedding.len();
    match trigger {
        Trigger::No => None,
        Trigger::Waiting(waiting) => Some(format!(
            "no machine boots but a bootOnBattery pin; {powered} on, {waiting} down to {}",
            policy.on_battery.keep
        )),
        Trigger::Shed(why) => Some(format!(
            "{why}: shedding down to {} ({going} on their way off); no machine boots but a bootOnBattery pin",
            policy.on_battery.keep
        )),
        Trigger::LowBattery => Some(format!(
            "low battery: every machine goes off ({going} on their way off) before the UPS shuts down"
        )),
    }
}

/// Events for a change of source: the pool's timeline reads from them.
async fn announce_change(
    ctx: &Context,
    group: &Group,
    previous: Option<&GroupPowerStatus>,
    next: &GroupPowerStatus,
) {
    let before = previous.filter(|p| p.ups == next.ups).map(|p| p.source);
    if before == Some(next.source) {
        return;
    }
    let (kind, reason, note) = match next.source {
        PowerSource::Battery => (
            EventType::Warning,
            "OnBattery",
            format!(
                "{} runs on battery ({}): no machine of the pool boots but a bootOnBattery pin",
                next.ups, next.summary
            ),
        ),
        PowerSource::LowBattery => (
            EventType::Warning,
            "LowBattery",
            format!(
                "{} reports a low battery ({}): every machine of the pool goes off",
                next.ups, next.summary
            ),
        ),
        PowerSource::Mains if before.is_none() => {
            (EventType::Normal, "OnMains", format!("{} is on mains", next.ups))
        }
        PowerSource::Mains => (
            EventType::Normal,
            "MainsReturned",
            format!(
                "{} is back on mains: boots resume, a few at a time while the return lasts",
                next.ups
            ),
        ),
        PowerSource::Unread => (
            EventType::Warning,
            "UpsUnread",
            format!(
                "{} could not be read ({}); nothing is shed on a missing reading",
                next.ups,
                next.message.as_deref().unwrap_or("no reason")
            ),
        ),
    };
    tracing::info!(ups = %next.ups, from = ?before, to = ?next.source, "the pool's power source changed");
    ctx.publish(group, kind, reason, note).await;
}

/// Releases one machine's claim as a scale-down does: marked with who and why, then deleted;
/// its finalizer keeps it until the machine is off.
async fn shed_one(
    ctx: &Context,
    group: &Group,
    machine: &Shed,
    power: &GroupPowerStatus,
    now: Timestamp,
) -> Result<()> {
    let key = ObjectRef::<NodeClaim>::new(&machine.claim).within(&ctx.namespace);
    let Some(claim) = ctx.stores.claims.get(&key) else { return Ok(()) };
    let api = Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace);
    let by = format!("{} ({}: {})", crate::ups::shed::SHED_BY, power.ups, machine.why);
    mark_and_delete(&api, &claim, &by, FieldManager::PowerSource, now).await.map_err(|failed| {
        super::Error::Kube {
            action: format!("{} to shed slot {}", failed.action, machine.slot),
            source: failed.source,
        }
    })?;
    tracing::info!(slot = %machine.slot, claim = %machine.claim, why = %machine.why, "machine shed on battery");
    telemetry::ups_shed(group.metadata.name.as_deref().unwrap_or_default());
    ctx.publish(
        group,
        EventType::Warning,
        "Shed",
        format!("slot {} shed: {}", machine.slot, machine.why),
    )
    .await;
    Ok(())
}

/// Applies `status.power` (None: clears it). This controller owns only that field.
async fn write_status(
    ctx: &Context,
    name: &str,
    previous: Option<&GroupPowerStatus>,
    power: Option<&GroupPowerStatus>,
) -> Result<()> {
    let serialize = |value: Option<&GroupPowerStatus>| {
        serde_json::to_value(value)
            .map_err(|source| super::Error::Serialize { what: "the power status", source })
    };
    let previous = json!({ "power": serialize(previous)? });
    let status = json!({ "power": serialize(power)? });
    let groups = Api::<Group>::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_status_of(&groups, name, FieldManager::PowerSource, Some(&previous), status)
        .await
        .during(|| format!("writing the power status of group {name}"))?;
    Ok(())
}
