//! This replica's claim admissions, serialized per slot and remembered until the caches show
//! them. The caches learn of an admitted create only once the API server has stored it and the
//! watch has delivered it; a second create of the same slot judged in between would not see
//! the first. Holding a per-slot lock across judging and answering, and counting what was
//! admitted but not yet seen, gives a burst of creates to one replica one live claim and one
//! "already has a live claim" denial. Across replicas, the claim controller's
//! supersede-before-boot is the backstop (docs/decisions.md, D23).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::NodeClaim;
use crate::cache::Stores;
use crate::slot_locks::SlotLocks;

/// How long an admitted claim is remembered if the caches never show it: the API server's
/// default request timeout. A create that passed admission has been stored, or has failed, by
/// then (a later admission plugin refused it, or etcd did).
pub const REMEMBER_FOR: Duration = Duration::from_secs(60);

/// Admitted claims not yet seen, by slot.
type Remembered = Mutex<HashMap<String, Vec<(NodeClaim, Instant)>>>;

/// Per-slot locks and the claims admitted but not yet in the caches.
#[derive(Default)]
pub struct Admitted {
    locks: SlotLocks,
    claims: Arc<Remembered>,
    /// Set once the task that forgets what the caches' watch delivers has started.
    forgetting: std::sync::OnceLock<()>,
}

/// Forgets every remembered claim the claims' watch delivers, applied or deleted: a claim
/// created and deleted before the next admission is forgotten too. Ends with the caches or
/// with the memory.
async fn forget_what_the_watch_shows(claims: std::sync::Weak<Remembered>, caches: Stores) {
    use futures::StreamExt;
    let mut changes = caches.claim_changes();
    drop(caches);
    while let Some(changed) = changes.next().await {
        let Some(claims) = claims.upgrade() else { return };
        let Some(name) = changed.metadata.name.as_deref() else { continue };
        let mut claims = claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = claims.get_mut(&changed.spec.slot_ref.name) {
            entry.retain(|(claim, _)| claim.metadata.name.as_deref() != Some(name));
            if entry.is_empty() {
                claims.remove(&changed.spec.slot_ref.name);
            }
        }
    }
}

impl Admitted {
    /// Holds the slot's admission lock until the guard is dropped.
    pub async fn lock_slot(&self, slot: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.locks.lock(slot).await
    }

    /// Remembers an admitted create of `claim` (not a dry run: it is never stored).
    pub fn remember(&self, claim: &NodeClaim, caches: &Stores) {
        self.forgetting.get_or_init(|| {
            let memory = Arc::downgrade(&self.claims);
            tokio::spawn(forget_what_the_watch_shows(memory, caches.clone()));
        });
        let mut claims = self.claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = claims.entry(claim.spec.slot_ref.name.clone()).or_default();
        // A create retried under the same name is one claim.
        entry.retain(|(known, _)| known.metadata.name != claim.metadata.name);
        entry.push((claim.clone(), Instant::now()));
    }

    /// The claims of `slot` admitted here that the caches do not show yet, forgetting those
    /// they show and those older than [`REMEMBER_FOR`].
    pub fn unseen(&self, slot: &str, caches: &Stores) -> Vec<NodeClaim> {
        let mut claims = self.claims.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(entry) = claims.get_mut(slot) else { return Vec::new() };
        entry.retain(|(claim, at)| {
            let shown = claim.metadata.name.as_deref().is_some_and(|n| caches.claim(n).is_some());
            !shown && at.elapsed() < REMEMBER_FOR
        });
        let unseen = entry.iter().map(|(claim, _)| claim.clone()).collect();
        if entry.is_empty() {
            claims.remove(slot);
        }
        unseen
    }
}
