//! The scaler's one error type. Each variant says what the pass was doing, so a log line is
//! enough to act on.

use crate::provider::ProviderError;

#[derive(Debug, thiserror::Error)]
pub enum ScalerError {
    /// A list failed. The pass stops here: a failed list is never read as an empty cluster,
    /// which would tear every pool down.
    #[error("listing {what} for the scaler's observation: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },

    /// The provider could not tell which pools there are (its caches are not synced).
    #[error("reading the groups from the provider: {source}")]
    Groups {
        #[source]
        source: ProviderError,
    },

    /// The provider refused or failed to carry out a decision.
    #[error("group {group}: {action} through the provider: {source}")]
    Act {
        group: String,
        action: &'static str,
        #[source]
        source: ProviderError,
    },

    /// The decision was carried out but could not be reported on the Group.
    #[error("writing status.lastDecision of group {group}: {source}")]
    Status {
        group: String,
        #[source]
        source: kube::Error,
    },
}
