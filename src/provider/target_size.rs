//! NodeGroupTargetSize: how many machines a group should have. It is the number of slots whose
//! claim is live and not marked for scale-down (a brand-new claim counts from its create, its
//! empty phase reading as pending; a marked one stops counting on the write that named it),
//! plus failed boots cluster-autoscaler has not yet acknowledged with DeleteNodes, which it
//! sees as instances that failed to create. A completed claim never counts.

use super::error::ProviderError;
use super::{Caller, Provider};

impl Provider {
    /// The group's target size, from the caches.
    #[tracing::instrument(skip(self, caller))]
    pub fn target_size(&self, caller: &Caller, group: &str) -> Result<i32, ProviderError> {
        Ok(self.snapshot(caller, group)?.target_size())
    }
}
