//! The controllers. Each owns one object: the claim controller moves claims (it is the only
//! writer of `NodeClaim.status.phase`, through `claim::chokepoint`); the slot controller runs the
//! shutdown path, observes machines and writes the slot's status; the group controller counts;
//! the schedule controller keeps a Group's schedule windows held by pins; the power-source
//! controller reads a pool's UPS and sheds machines on battery.
//! They run only on the elected leader.

pub mod claim;
mod context;
mod error;
pub mod group;
pub mod hold;
pub mod jobs;
pub mod power_source;
mod read_floor;
pub mod schedule;
pub mod slot;

pub use context::{
    ClaimInputs, Clients, Context, GroupInputs, METER_READINGS_FRESH, MachineSettings, PowerPods,
    PublishedHold, SlotInputs, Subscriptions,
};
pub use error::{Error, Result};

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::Action;
use tokio_util::sync::CancellationToken;

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "homelab-autoscaler";

/// Patch parameters of every operator write.
pub fn params() -> kube::api::PatchParams {
    kube::api::PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() }
}

/// How many reconciles each controller runs at once. kube-runtime's default is no bound: when
/// the controllers start, every object is reconciled at once (1200 at 1000 slots), each with
/// its requests and responses in flight, and the process keeps that peak of memory
/// (docs/performance.md). Reconciles are short (API round trips, an eviction bounded at 10 s),
/// and one object is never reconciled twice at once either way.
pub const CONCURRENCY: u16 = 8;

/// The settings every controller runs with.
fn config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(CONCURRENCY)
}

/// Runs every controller until `shutdown`, each fed by its subscriptions.
pub async fn run(ctx: Arc<Context>, inputs: Subscriptions, shutdown: CancellationToken) {
    let claims = claim::controller(ctx.clone(), inputs.claim_controller, shutdown.clone());
    let slots = slot::controller(ctx.clone(), inputs.slot_controller, shutdown.clone());
    let groups = group::controller(ctx.clone(), inputs.group_controller, shutdown.clone());
    let schedules = schedule::controller(ctx.clone(), inputs.schedule_controller, shutdown.clone());
    let power =
        power_source::controller(ctx.clone(), inputs.power_source_controller, shutdown.clone());
    tokio::join!(claims, slots, groups, schedules, power);
}

/// Requeue policy on error: retry soon, the error is logged by the caller.
pub fn error_policy<K>(_object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed; retrying");
    Action::requeue(std::time::Duration::from_secs(if error.is_conflict() { 1 } else { 10 }))
}

/// Drains a controller's result stream, logging what happened.
async fn drive<S, T, E>(name: &'static str, stream: S)
where
    S: futures::Stream<Item = std::result::Result<T, E>>,
    T: std::fmt::Debug,
    E: std::fmt::Display,
{
    stream
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(controller = name, %error, "reconcile error");
            }
        })
        .await;
}
