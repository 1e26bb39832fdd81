//! Before a data machine is cordoned for its power-off: its turn among the pool's data machines
//! and its gates ([`crate::gates`]). A hold keeps the machine on, uncordoned and serving, and
//! says which gate holds it and what the gate read (docs/decisions.md, D40).

use std::time::Duration;

use futures::future::join_all;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::Node;
use crate::controller::Context;
use crate::gates::one_at_a_time::{self, Peer, Turn};
use crate::gates::{self, Reading};

/// The slot condition a gate hold is reported in, and its reasons.
pub const CONDITION: &str = "PowerOffAllowed";
pub const HELD_BY_GATE: &str = "GateHolds";
pub const HELD_FOR_TURN: &str = "AnotherDataMachineGoingOff";
pub const CONDITION_REASON_STEP: &str = "MaintenanceStep";
/// How often a held machine's gates are read again.
pub const RECHECK: Duration = Duration::from_secs(10);

/// A power-off the gates hold back: since when, by what, and what it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateHold {
    pub since: Timestamp,
    /// The gates that hold it (their names), or the data machine it waits for.
    pub held_by: String,
    pub reason: &'static str,
    pub message: String,
    /// When to look again.
    pub retry: Duration,
}

/// Whether the slot's machine may be cordoned and powered off now; `None`: it may (no gate
/// concerns it, or its turn came and every gate holds).
pub async fn check(ctx: &Context, slot: &Node) -> Option<GateHold> {
    let name = slot.metadata.name.as_deref().unwrap_or_default();
    let group = ctx.stores.group(slot.group()?)?;
    let pool = &group.spec;
    if !gates::is_data_machine(pool, &slot.spec) {
        return None;
    }
    let now = ctx.now();
    let settle = SignedDuration::try_from(gates::settle(pool)).unwrap_or(SignedDuration::MAX);
    let (me, peers) = gates::peers::around(&ctx.stores, pool, slot);
    let since = |reason| hold_since(ctx, slot, reason, now);
    let turn = ctx.take_power_off_turn(name, |taken| {
        let peers: Vec<Peer> =
            // A release not yet acted on is this controller's own next pass, which the turns
            // it gives already order.
            peers
                .iter()
                .cloned()
                .map(|p| Peer { turn_taken: taken(&p.slot), released: false, ..p })
                .collect();
        one_at_a_time::decide(&me, &peers, now, settle)
    });
    if let Turn::Wait { peer, why, until } = turn {
        let message = format!(
            "held on: {peer}, another data machine of the pool, is on its way off ({why}). One data machine goes off at a time; the next once the storage has had time to see it go and every gate holds again"
        );
        let retry = until.map_or(RECHECK, |at| {
            Duration::from_secs_f64(at.duration_since(now).as_secs_f64().clamp(1.0, 60.0))
        });
        let reason = HELD_FOR_TURN;
        return Some(GateHold { since: since(reason), held_by: peer, reason, message, retry });
    }
    let (applying, mut readings) = gates::applying(pool, &slot.spec);
    readings.extend(join_all(applying.into_iter().map(|g| ctx.gates.read(g))).await);
    let holding: Vec<&Reading> = readings.iter().filter(|r| !r.open()).collect();
    if holding.is_empty() {
        tracing::info!(gates = readings.len(), "every power-off gate holds; the machine may go");
        return None;
    }
    ctx.give_back_power_off_turn(name);
    let held_by: Vec<&str> = holding.iter().map(|r| r.gate.as_str()).collect();
    let said: Vec<String> = holding.iter().map(|r| r.holding()).collect();
    let message = format!(
        "held on, serving: {}. The machine is powered off once every gate holds; to let it go now, set the slot's spec.powerOffGates to []",
        said.join("; ")
    );
    tracing::info!(held_by = ?held_by, "a power-off gate holds the machine on");
    let reason = HELD_BY_GATE;
    Some(GateHold {
        since: since(reason),
        held_by: held_by.join(","),
        reason,
        message,
        retry: RECHECK,
    })
}

/// When the slot's hold began: its condition's transition while the reason is the same, else
/// this term's record, else now (to the second, as the status keeps it).
pub fn hold_since(ctx: &Context, slot: &Node, reason: &str, now: Timestamp) -> Timestamp {
    let name = slot.metadata.name.as_deref().unwrap_or_default();
    let remembered = ctx.published_gate_hold(name).map(|h| h.since);
    let conditions: &[Condition] =
        slot.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions
        .iter()
        .find(|c| c.type_ == CONDITION && c.status == "False" && c.reason == reason)
        .map(|c| c.last_transition_time.0)
        .or(remembered)
        .unwrap_or_else(|| Timestamp::from_second(now.as_second()).unwrap_or(now))
}
