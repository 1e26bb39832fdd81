//! The provider's one error type. Each variant carries the context a person needs to act on it,
//! and [`ProviderError::kind`] classifies it without naming any transport, so the gRPC layer and
//! the built-in scaler each map it their own way.

use jiff::Timestamp;

/// What kind of failure an error is, independent of how it is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed (a delta of the wrong sign, a window that ends first).
    InvalidArgument,
    /// A named group or node does not exist, or is not scaled by the caller.
    NotFound,
    /// The request is well-formed but the pool's declared shape refuses it; retrying will not
    /// help until something changes.
    FailedPrecondition,
    /// The request cannot be carried out now but can later (caches not synced yet, every
    /// live claim past the cancelable phase, the API server unreachable).
    Unavailable,
    /// The request raced with another writer.
    Conflict,
    /// The provider has no answer for this group (no slot to build a template from).
    Unsupported,
    /// Anything else.
    Internal,
}

/// A failed provider call.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the provider's caches have not synced with the API server yet")]
    NotSynced,

    #[error("{call}: delta must be {expected}, got {delta}")]
    InvalidDelta { call: &'static str, delta: i32, expected: &'static str },

    #[error("group {group:?} does not exist in namespace {namespace:?}")]
    GroupNotFound { group: String, namespace: String },

    #[error("group {group:?} is scaled by {driver}, not by {caller}")]
    WrongDriver { group: String, driver: &'static str, caller: &'static str },

    #[error(
        "group {group:?} has {slots} slots and {live} live claims: {delta} more would exceed \
         its size"
    )]
    OverCapacity { group: String, slots: i32, live: i32, delta: i32 },

    #[error(
        "group {group:?}: asked for {wanted} machines but only {bootable} free slots can boot \
         now{}", describe_exhausted(.exhausted)
    )]
    NotEnoughFreeSlots { group: String, wanted: i32, bootable: i32, exhausted: Vec<ExhaustedSlot> },

    #[error(
        "group {group:?}: lowering the target from {target} by {by} would go below its minSize \
         {min_size}"
    )]
    BelowMinSize { group: String, target: i32, by: i32, min_size: i32 },

    #[error(
        "group {group:?}: cancelled {cancelled} of {requested} requested; the other live claims \
         are past the cancelable phase ({booting} booting, {ready} ready) and are released by \
         their boot deadline or by DeleteNodes{}", describe_pinned(*.pinned)
    )]
    NothingCancelable {
        group: String,
        requested: i32,
        cancelled: i32,
        booting: i32,
        ready: i32,
        pinned: i32,
    },

    #[error(transparent)]
    Pinned(Box<PinnedNode>),

    #[error(
        "slot {slot:?} of group {group:?} holds data its storage cannot lose now: {why}. \
         Nothing was released; the machine stays on until its pool's power-off gates let it go \
         (docs/operations.md, Storage that must not lose a replica)"
    )]
    PowerOffHeld { slot: String, group: String, why: String },

    #[error("{why}")]
    OnBattery { group: String, why: String },

    #[error(
        "group {group:?} is coming back from a power outage: at most {at_once} of its machines \
         boot at once until {until} (spec.ups.onMains), {room} may start now and {delta} were asked"
    )]
    StaggeredReturn { group: String, delta: i32, room: i32, at_once: i32, until: Timestamp },

    #[error("node {node:?} is not a slot of group {group:?}")]
    NodeNotInGroup { node: String, group: String },

    #[error("node {node:?} is not a machine of any group this provider knows")]
    UnknownNode { node: String },

    #[error("group {group:?} has no slot to build a template node from")]
    NoTemplate { group: String },

    #[error("the pricing window ends ({end}) before it starts ({start})")]
    InvalidWindow { start: Timestamp, end: Timestamp },

    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
}

/// A named node whose machine a pin holds: no scaler releases it (docs/decisions.md, D17).
#[derive(Debug, thiserror::Error)]
#[error(
    "node {node:?} of group {group:?} is pinned by claim {claim:?} ({call} claim of {by}{}); \
     no scaler releases a pinned machine, so nothing was released: its owner releases it with \
     `homelab-autoscaler release --slot {slot} --namespace {namespace}` or by deleting the \
     claim (`kubectl delete nodeclaim {claim} -n {namespace}`)",
    until.map_or_else(|| ", until released".to_owned(), |u| format!(", until {u}"))
)]
pub struct PinnedNode {
    pub node: String,
    pub group: String,
    pub slot: String,
    pub claim: String,
    pub call: &'static str,
    pub by: String,
    pub namespace: String,
    pub until: Option<Timestamp>,
}

/// A slot skipped by IncreaseSize because it failed too many boots in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExhaustedSlot {
    pub slot: String,
    pub failures: i32,
    pub retry_after: Timestamp,
}

fn describe_pinned(pinned: i32) -> String {
    if pinned == 0 {
        return String::new();
    }
    format!("; {pinned} pending claim(s) are pins, which only their owner or their end cancels")
}

fn describe_exhausted(exhausted: &[ExhaustedSlot]) -> String {
    if exhausted.is_empty() {
        return String::new();
    }
    let slots: Vec<String> = exhausted
        .iter()
        .map(|e| {
            format!("{} ({} failed boots, retried after {})", e.slot, e.failures, e.retry_after)
        })
        .collect();
    format!(
        "; exhausted: {} (reset early with the annotation {})",
        slots.join(", "),
        crate::api::ANNOTATION_ATTEMPTS_RESET_AT
    )
}

impl ProviderError {
    /// Wraps a Kubernetes API error with what the provider was doing.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube { action: action.into(), source }
    }

    /// Classifies the error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            // Both pass: mains returns, boots finish. cluster-autoscaler backs off the group
            // and asks again.
            Self::NotSynced
            | Self::NothingCancelable { .. }
            | Self::OnBattery { .. }
            | Self::StaggeredReturn { .. } => ErrorKind::Unavailable,
            Self::InvalidDelta { .. }
            | Self::InvalidWindow { .. }
            | Self::NodeNotInGroup { .. } => ErrorKind::InvalidArgument,
            Self::GroupNotFound { .. } | Self::WrongDriver { .. } | Self::UnknownNode { .. } => {
                ErrorKind::NotFound
            }
            Self::OverCapacity { .. }
            | Self::NotEnoughFreeSlots { .. }
            | Self::BelowMinSize { .. }
            | Self::Pinned(_)
            | Self::PowerOffHeld { .. } => ErrorKind::FailedPrecondition,
            Self::NoTemplate { .. } => ErrorKind::Unsupported,
            Self::Kube { source, .. } => kube_kind(source),
        }
    }
}

/// Reads an API server answer: a refusal by admission or validation is the pool's rule, a
/// conflict is a race, and a server or transport failure is worth retrying.
fn kube_kind(error: &kube::Error) -> ErrorKind {
    match error {
        kube::Error::Api(status) => match status.code {
            400 | 422 => ErrorKind::FailedPrecondition,
            403 => ErrorKind::FailedPrecondition,
            404 => ErrorKind::NotFound,
            409 => ErrorKind::Conflict,
            429 | 500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..kube::core::Status::failure("refused", "Testing")
        }))
    }

    #[test]
    fn api_answers_are_classified_by_status_code() {
        let table = [
            (422, ErrorKind::FailedPrecondition),
            (403, ErrorKind::FailedPrecondition),
            (404, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (429, ErrorKind::Unavailable),
            (503, ErrorKind::Unavailable),
            (418, ErrorKind::Internal),
        ];
        for (code, kind) in table {
            assert_eq!(ProviderError::kube("creating", api(code)).kind(), kind, "HTTP {code}");
        }
    }

    #[test]
    fn exhausted_slots_are_named_with_the_way_out() {
        let err = ProviderError::NotEnoughFreeSlots {
            group: "pool".into(),
            wanted: 2,
            bootable: 1,
            exhausted: vec![ExhaustedSlot {
                slot: "big".into(),
                failures: 3,
                retry_after: "2026-03-04T10:25:00Z".parse().unwrap(),
            }],
        };
        let text = err.to_string();
        assert!(text.contains("big (3 failed boots"), "{text}");
        assert!(text.contains(crate::api::ANNOTATION_ATTEMPTS_RESET_AT), "{text}");
        assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    }
}
