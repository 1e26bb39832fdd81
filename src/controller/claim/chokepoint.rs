//! The one writer of claim phases. Every move asks the phase table first, is written with the
//! resourceVersion the decision was made on (so a stale decision loses with a 409 instead of
//! overwriting), and publishes exactly one Event on the claim. A refused move or a re-apply that
//! changes nothing publishes nothing.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;
use serde_json::{Map, Value, json};

use crate::api::{NodeClaim, NodeClaimPhase};
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result};
use crate::field_manager::FieldManager;
use crate::phase::{self, Move, Writer};
use crate::telemetry;

/// A requested phase move.
pub struct PhaseMove {
    pub to: NodeClaimPhase,
    pub writer: Writer,
    /// The one-line outcome (terminal moves).
    pub reason: Option<&'static str>,
    pub message: Option<String>,
    /// Further status fields written with the move (camelCase keys).
    pub fields: Map<String, Value>,
}

impl PhaseMove {
    pub fn new(to: NodeClaimPhase, writer: Writer) -> Self {
        Self { to, writer, reason: None, message: None, fields: Map::new() }
    }
    pub fn because(mut self, reason: &'static str, message: impl Into<String>) -> Self {
        self.reason = Some(reason);
        self.message = Some(message.into());
        self
    }
    pub fn with(mut self, field: &str, value: Value) -> Self {
        self.fields.insert(field.into(), value);
        self
    }
}

fn event_reason(from: NodeClaimPhase, to: NodeClaimPhase, reason: Option<&str>) -> &'static str {
    match (from, to) {
        (_, NodeClaimPhase::Booting) => "ClaimBooting",
        (_, NodeClaimPhase::Ready) => "ClaimReady",
        (_, NodeClaimPhase::Failed) if reason == Some("Superseded") => "ClaimSuperseded",
        (_, NodeClaimPhase::Failed) => "ClaimFailed",
        (NodeClaimPhase::Pending, NodeClaimPhase::Completed) => "ClaimCancelled",
        (_, NodeClaimPhase::Completed) => "ClaimCompleted",
        (_, NodeClaimPhase::Pending) => "ClaimCreated",
    }
}

/// What an Event on a claim's move says.
struct Note<'a> {
    from: NodeClaimPhase,
    to: NodeClaimPhase,
    /// The first write of a new claim (its phase was empty).
    created: bool,
    slot: &'a str,
    group: &'a str,
    attempt: i64,
    job: Option<&'a str>,
    deadline: Option<String>,
    /// Whole seconds since the request, when known.
    since_request: Option<u64>,
    reason: Option<&'a str>,
    message: Option<&'a str>,
}

/// The Event's message: one sentence about what happened, for a person reading
/// `kubectl describe nodeclaim`.
fn note(n: &Note<'_>) -> String {
    let after = n.since_request.map_or_else(String::new, |s| format!(" {s}s after the request"));
    let why = match (n.reason, n.message) {
        (Some(reason), Some(message)) => format!(" ({reason}): {message}"),
        (Some(reason), None) => format!(" ({reason})"),
        _ => String::new(),
    };
    let deadline =
        n.deadline.as_ref().map_or_else(String::new, |d| format!("; it must be ready by {d}"));
    match n.to {
        NodeClaimPhase::Pending if n.created => format!(
            "Requested a machine of group {} on slot {} (attempt {}){deadline}.",
            n.group, n.slot, n.attempt
        ),
        NodeClaimPhase::Pending => format!("Back to pending on slot {}.", n.slot),
        NodeClaimPhase::Booting => {
            let job = n.job.map_or_else(String::new, |j| format!(", startup Job {j}"));
            format!(
                "Boot committed on slot {} (attempt {}{job}){after}{deadline}.",
                n.slot, n.attempt
            )
        }
        NodeClaimPhase::Ready => {
            format!("The machine on slot {} is ready{after} (attempt {}).", n.slot, n.attempt)
        }
        NodeClaimPhase::Failed => format!(
            "Failed while {}{why}; attempt {} on slot {}{}.",
            format!("{:?}", n.from).to_lowercase(),
            n.attempt,
            n.slot,
            n.since_request.map_or_else(String::new, |s| format!(", {s}s after the request"))
        ),
        NodeClaimPhase::Completed if n.from == NodeClaimPhase::Pending => {
            format!("Cancelled before its boot started{why}.")
        }
        NodeClaimPhase::Completed => format!("Released slot {}{why}.", n.slot),
    }
}

/// Applies `change` to `claim`. Returns whether the phase changed.
pub async fn move_phase(ctx: &Context, claim: &NodeClaim, change: PhaseMove) -> Result<bool> {
    let current = claim.status.as_ref().and_then(|s| s.phase);
    let from = phase::effective(current);
    let first_write = current.is_none() && change.to == NodeClaimPhase::Pending;
    if phase::check_move(current, change.to, change.writer)? == Move::Unchanged && !first_write {
        return Ok(false);
    }
    let now = ctx.now();
    let mut status = change.fields;
    status.insert("phase".into(), json!(change.to));
    if let Some(reason) = change.reason {
        status.insert("reason".into(), json!(reason));
    }
    if let Some(message) = &change.message {
        status.insert("message".into(), json!(message));
    }
    if phase::is_terminal(Some(change.to)) {
        status.entry("finishedAt").or_insert(json!(Time(now)));
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": { "resourceVersion": claim.metadata.resource_version },
        "status": status,
    });
    let written = Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch_status(&name, &FieldManager::ClaimController.patch(), &Patch::Merge(&patch))
        .await
        .during(|| format!("moving claim {name} {from:?} -> {:?}", change.to))?;
    ctx.claim_read_floor.wrote(written.metadata.resource_version.as_deref());

    let attempt = status
        .get("attempt")
        .and_then(Value::as_i64)
        .or_else(|| claim.spec.attempt.map(i64::from))
        .unwrap_or(1);
    let job = status
        .get("startupJob")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| claim.status.as_ref().and_then(|s| s.startup_job.clone()));
    let deadline = claim
        .spec
        .deadline_at
        .as_ref()
        .map(|t| t.0.to_string())
        .filter(|_| phase::in_boot_window(Some(change.to)));
    let requested_at = claim.spec.requested_at.as_ref().map(|t| t.0);
    let since_request = requested_at.map(|s| now.duration_since(s).as_secs().max(0).unsigned_abs());
    let group = claim.spec.request.group.as_str();
    let note = note(&Note {
        from,
        to: change.to,
        created: first_write,
        slot: &claim.spec.slot_ref.name,
        group,
        attempt,
        job: job.as_deref(),
        deadline,
        since_request,
        reason: change.reason,
        message: change.message.as_deref(),
    });
    // A new claim's first write is counted as from `New`, not as a move from pending to pending.
    let from_label = if first_write { "New".to_string() } else { format!("{from:?}") };
    telemetry::claim_moved(group, &from_label, &format!("{:?}", change.to), change.reason);
    match change.to {
        NodeClaimPhase::Booting => telemetry::boot_committed(group, attempt),
        NodeClaimPhase::Ready => {
            let boot = claim.status.as_ref().and_then(|s| s.boot_committed_at.as_ref());
            let elapsed = |start: Timestamp| now.duration_since(start).unsigned_abs();
            telemetry::claim_ready(group, requested_at.map(elapsed), boot.map(|t| elapsed(t.0)));
        }
        _ => {}
    }
    let type_ =
        if change.to == NodeClaimPhase::Failed { EventType::Warning } else { EventType::Normal };
    ctx.publish(claim, type_, event_reason(from, change.to, change.reason), note).await;
    tracing::info!(claim = %name, ?from, to = ?change.to, reason = change.reason, "claim phase moved");
    Ok(true)
}

/// Writes other status fields of a claim (no phase move), with the same concurrency guard, as
/// `writer` (the slot controller writes its shutdown counters here too).
pub async fn patch_status(
    ctx: &Context,
    claim: &NodeClaim,
    writer: FieldManager,
    fields: Value,
) -> Result<()> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let patch = json!({ "metadata": { "resourceVersion": claim.metadata.resource_version }, "status": fields });
    let written = Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch_status(&name, &writer.patch(), &Patch::Merge(&patch))
        .await
        .during(|| format!("updating the status of claim {name}"))?;
    ctx.claim_read_floor.wrote(written.metadata.resource_version.as_deref());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeClaimPhase::*;

    fn base(from: NodeClaimPhase, to: NodeClaimPhase) -> Note<'static> {
        Note {
            from,
            to,
            created: false,
            slot: "mini-1",
            group: "workers",
            attempt: 1,
            job: None,
            deadline: None,
            since_request: None,
            reason: None,
            message: None,
        }
    }

    #[test]
    fn every_event_reads_as_a_sentence() {
        let table = [
            (
                Note {
                    created: true,
                    deadline: Some("2026-12-01T01:00:00Z".into()),
                    ..base(Pending, Pending)
                },
                "Requested a machine of group workers on slot mini-1 (attempt 1); it must be ready by 2026-12-01T01:00:00Z.",
            ),
            (
                Note {
                    job: Some("c-startup"),
                    since_request: Some(2),
                    deadline: Some("T".into()),
                    ..base(Pending, Booting)
                },
                "Boot committed on slot mini-1 (attempt 1, startup Job c-startup) 2s after the request; it must be ready by T.",
            ),
            (
                Note { since_request: Some(41), attempt: 2, ..base(Booting, Ready) },
                "The machine on slot mini-1 is ready 41s after the request (attempt 2).",
            ),
            (
                Note {
                    reason: Some("DeadlineExceeded"),
                    message: Some(
                        "the machine was not ready by the claim's deadline; powering it off",
                    ),
                    since_request: Some(900),
                    ..base(Booting, Failed)
                },
                "Failed while booting (DeadlineExceeded): the machine was not ready by the claim's deadline; powering it off; attempt 1 on slot mini-1, 900s after the request.",
            ),
            (
                Note {
                    reason: Some("CancelledByScaleDown"),
                    message: Some(
                        "the scale-down (DecreaseTargetSize) came before the boot started",
                    ),
                    ..base(Pending, Completed)
                },
                "Cancelled before its boot started (CancelledByScaleDown): the scale-down (DecreaseTargetSize) came before the boot started.",
            ),
            (
                Note {
                    reason: Some("ScaledDown"),
                    message: Some("scaled down; the machine is off"),
                    ..base(Ready, Completed)
                },
                "Released slot mini-1 (ScaledDown): scaled down; the machine is off.",
            ),
        ];
        for (facts, want) in table {
            let got = note(&facts);
            assert_eq!(got, want);
            assert!(!got.contains("->"), "{got}");
        }
    }

    #[test]
    fn one_event_reason_per_transition() {
        let table = [
            (Pending, Pending, None, "ClaimCreated"),
            (Pending, Booting, None, "ClaimBooting"),
            (Booting, Ready, None, "ClaimReady"),
            (Booting, Failed, Some("DeadlineExceeded"), "ClaimFailed"),
            (Pending, Failed, Some("Superseded"), "ClaimSuperseded"),
            (Pending, Completed, Some("CancelledByScaleDown"), "ClaimCancelled"),
            (Ready, Completed, Some("ScaledDown"), "ClaimCompleted"),
        ];
        for (from, to, reason, want) in table {
            assert_eq!(event_reason(from, to, reason), want, "{from:?} -> {to:?}");
        }
    }
}
