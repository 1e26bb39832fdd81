//! The slot controller: the machine side. It powers a machine off when no claim wants it
//! (`shutdown`, which also powers off a machine its plug reads on with no node), removes the
//! node of a machine that is confirmed off and never one under a running kubelet
//! (`node_removal`), keeps the Kubernetes node tied to its slot, carrying what the slot declares
//! and cluster-autoscaler's marks while it boots or a person holds it
//! (`crate::node_declaration`), marks the node of a machine suspended to RAM (`sleep_mark`),
//! reads the plug's meter (`meter`) and, while its kubelet is
//! silent, its BMC (`bmc`), and writes the slot's observed status and derived report
//! (`observe`).

mod bmc;
mod drain;
mod maintenance;
mod meter;
mod node_removal;
mod observe;
mod power_off_gates;
mod shutdown;
mod sleep_mark;
mod status_plan;
mod undeclared;

use std::sync::Arc;

use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Context, Result, SlotInputs};
use crate::api::{LABEL_SLOT, Node, NodeClaim};
use crate::claim::ready_bound::PowerReading;
use crate::{machine, node_declaration, phase};

/// Runs the slot controller until `shutdown`.
pub async fn controller(ctx: Arc<Context>, inputs: SlotInputs, shutdown: CancellationToken) {
    let ns_claims = ctx.namespace.clone();
    let by_node = ctx.clone();
    let ns_jobs = ctx.namespace.clone();
    let controller = Controller::for_shared_stream(inputs.slots, ctx.stores.slots.clone())
        .watches_shared_stream(inputs.claims, move |claim| {
            Some(ObjectRef::new(&claim.spec.slot_ref.name).within(&ns_claims))
        })
        // A node event wakes the slots whose machine registers as that node.
        .watches_shared_stream(inputs.nodes, move |node| {
            let slots = node.metadata.name.as_deref().map(|n| by_node.stores.slots_of_node(n));
            slots
                .into_iter()
                .flatten()
                .map(|slot| ObjectRef::from_obj(slot.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(inputs.jobs, move |job| {
            job.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SLOT))
                .map(|s| ObjectRef::new(s).within(&ns_jobs))
        })
        .with_config(super::config())
        .graceful_shutdown_on(async move { shutdown.cancelled().await });
    let reconcile = |object, ctx| crate::telemetry::reconcile("slot", reconcile(object, ctx));
    super::drive("slot", controller.run(reconcile, super::error_policy, ctx)).await;
}

async fn reconcile(slot: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    let name = slot.metadata.name.clone().unwrap_or_default();
    let span = tracing::info_span!("reconcile_slot", slot = %name, group = slot.group().unwrap_or_default());
    async move {
        if slot.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let mut node = ctx.core_node(&slot.spec.kubernetes_node_name);
        // The slot's claims and shutdown Jobs, read once for the whole pass.
        let owned = ctx.claims_of_slot(&name);
        let claims: Vec<&NodeClaim> = owned.iter().map(AsRef::as_ref).collect();
        let live = phase::newest_live(claims.iter().copied());
        let shutdowns = node_removal::ShutdownJob::of_slot(&ctx, &name);
        let mut recheck = None;
        let mut unseen = None;
        let booting = live.is_some_and(|c| phase::in_boot_window(Some(phase::of(c))));
        if let Some(current) = node.clone() {
            let removal = node_removal::decide_for(&ctx, &slot, &claims, &shutdowns, &current);
            match removal {
                node_removal::Removal::ConfirmOff { since } => {
                    unseen = Some(shutdown::Unseen::Silent { since });
                }
                node_removal::Removal::PowerOffAsleep { since } => {
                    unseen = Some(shutdown::Unseen::Asleep { since });
                }
                _ => {}
            }
            if let node_removal::Removal::Remove(why) = removal {
                if node_removal::remove(&ctx, &slot, &current, why).await? {
                    node = None;
                }
            } else {
                // One write for everything the slot side wants of the node.
                let marks = node_declaration::marks::wanted(live);
                let want = |node: &_| node_declaration::patch(&slot, node, &marks, booting);
                if observe::write_node(&ctx, &current, want).await? {
                    tracing::info!(startup_taint = marks.startup_taint, protected_for = ?marks.protected_for, "node updated for its slot");
                }
                sleep_mark::reconcile(&ctx, &current, &shutdowns, &name).await?;
            }
            if let node_removal::Removal::RecheckAt(at) = removal {
                recheck = Some(at);
            }
        }
        // No node, and the slot's plug reads the machine drawing power: it runs without its
        // node (deleted under a running kubelet, which never registers it again). A boot in its
        // window is left to register (its own deadline fails it if it never does).
        if node.is_none() && !booting {
            let plug = PowerReading::meter(&slot);
            let max_age = ctx.meter_reading_max_age();
            if let Some(plug) = plug.filter(|p| p.is_on(ctx.now(), max_age)) {
                unseen = Some(shutdown::Unseen::OnWithoutNode { read_at: plug.read_at });
            }
        }
        let shutdown =
            shutdown::reconcile(&ctx, &slot, &claims, &shutdowns, node.as_deref(), unseen).await?;
        let wanted = live.is_some_and(|c| !phase::is_marked(c));
        maintenance::after_ready(&ctx, &slot, node.as_deref(), wanted).await?;
        let reading = meter::read_if_due(&ctx, &slot).await;
        let silent = matches!(machine::Kubelet::of(node.as_deref()), machine::Kubelet::Silent { .. });
        let bmc_reading = bmc::read_if_due(&ctx, &slot, silent).await;
        let seen = status_plan::Seen {
            reading: reading.as_ref(),
            bmc_reading: bmc_reading.as_ref(),
            hold: shutdown.hold.as_ref(),
            gate_hold: shutdown.gate_hold.as_ref(),
            streak: shutdown.streak.as_ref(),
            on_without_node: matches!(unseen, Some(shutdown::Unseen::OnWithoutNode { .. })),
        };
        observe::write_status(&ctx, &slot, node.as_deref(), &claims, live, seen).await?;
        // A silent kubelet's grace and the next meter or BMC read are deadlines no event
        // announces.
        let grace = recheck.map(|at| {
            std::time::Duration::from_secs_f64(at.duration_since(ctx.now()).as_secs_f64().max(1.0))
        });
        let meter = meter::metered(&slot).map(|_| ctx.meter_interval);
        let bmc = bmc::readable(&slot).filter(|_| silent).map(|_| ctx.meter_interval);
        Ok([shutdown.retry, grace, meter, bmc]
            .into_iter()
            .flatten()
            .min()
            .map_or_else(Action::await_change, Action::requeue))
    }
    .instrument(span)
    .await
}
