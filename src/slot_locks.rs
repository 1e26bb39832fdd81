//! One async lock per slot name, for work that must not run twice at once for one slot: the
//! claim controller's "may this claim boot?" and its booting write, and admission's judging of
//! a claim create. A lock nobody holds or waits on is dropped at the next call, so names of
//! slots that are gone (or never existed) do not pile up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// The locks, by slot name.
#[derive(Default)]
pub struct SlotLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SlotLocks {
    /// Holds `slot`'s lock until the guard is dropped.
    pub async fn lock(&self, slot: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            locks.entry(slot.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn one_holder_per_slot_and_unused_locks_are_dropped() {
        let locks = SlotLocks::default();
        let held = locks.lock("m1").await;
        assert!(locks.lock("m1").now_or_never().is_none(), "m1 is held");
        let other = locks.lock("m2").now_or_never().expect("m2 is free");
        drop((held, other));
        let _again = locks.lock("m3").await;
        assert_eq!(locks.len(), 1, "only the lock in use is kept");
    }
}
