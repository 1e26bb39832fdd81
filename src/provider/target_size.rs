//! NodeGroupTargetSize: how many machines a group should have. It is the number of slots whose
//! claim is live and not marked for scale-down: a brand-new claim counts from its create (its
//! empty phase reads as pending), a failed or completed one never counts, and a marked one
//! stops counting on the write that named it.

use super::error::ProviderError;
use super::{Caller, Provider};

impl Provider {
    /// The group's target size, from the caches.
    #[tracing::instrument(skip(self, caller))]
    pub fn target_size(&self, caller: &Caller, group: &str) -> Result<i32, ProviderError> {
        Ok(self.snapshot(caller, group)?.target_size())
    }
}
