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
use crate::controller::error::{KubeContext, Result};
use crate::controller::{Context, params};
use crate::phase::{self, Move, Writer};

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

fn since(start: Option<Timestamp>, now: Timestamp) -> String {
    start.map_or_else(String::new, |s| {
        format!(", {}s after the request", now.duration_since(s).as_secs())
    })
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
    Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch_status(&name, &params(), &Patch::Merge(&patch))
        .await
        .during(|| format!("moving claim {name} {from:?} -> {:?}", change.to))?;

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
    let deadline = claim.spec.deadline_at.as_ref().map(|t| t.0.to_string());
    let mut note = format!("{from:?} -> {:?}: attempt {attempt}", change.to);
    if let Some(job) = job {
        note.push_str(&format!(", job {job}"));
    }
    if let Some(deadline) = deadline.filter(|_| phase::in_boot_window(Some(from))) {
        note.push_str(&format!(", deadline {deadline}"));
    }
    note.push_str(&since(claim.spec.requested_at.as_ref().map(|t| t.0), now));
    if let (Some(reason), Some(message)) = (change.reason, &change.message) {
        note.push_str(&format!("; {reason}: {message}"));
    }
    let type_ =
        if change.to == NodeClaimPhase::Failed { EventType::Warning } else { EventType::Normal };
    ctx.publish(claim, type_, event_reason(from, change.to, change.reason), note).await;
    tracing::info!(claim = %name, ?from, to = ?change.to, reason = change.reason, "claim phase moved");
    Ok(true)
}

/// Writes other status fields of a claim (no phase move), with the same concurrency guard.
pub async fn patch_status(ctx: &Context, claim: &NodeClaim, fields: Value) -> Result<()> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let patch = json!({ "metadata": { "resourceVersion": claim.metadata.resource_version }, "status": fields });
    Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch_status(&name, &params(), &Patch::Merge(&patch))
        .await
        .during(|| format!("updating the status of claim {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeClaimPhase::*;

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
