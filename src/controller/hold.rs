//! A point in a reconcile that a test can hold shut, so it can land its own write between two of
//! the controller's (the cancel that races a boot's commit, docs/decisions.md, D35). The operator
//! never shuts one: an open hold is passed at the cost of reading a flag.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// A hold point, shared by every reconcile that passes it. Clones are the same point.
#[derive(Clone)]
pub struct Hold {
    inner: Arc<Inner>,
}

struct Inner {
    shut: watch::Sender<bool>,
    /// The keys (claim names) of the passes waiting at the hold now.
    waiting: Mutex<BTreeSet<String>>,
}

impl Default for Hold {
    fn default() -> Self {
        let (shut, _) = watch::channel(false);
        Hold { inner: Arc::new(Inner { shut, waiting: Mutex::default() }) }
    }
}

/// Takes a key off the waiting list when its pass leaves the hold, or is dropped while held.
struct Waiting<'a> {
    hold: &'a Inner,
    key: String,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.hold.waiting().remove(&self.key);
    }
}

impl Inner {
    fn waiting(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.waiting.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Hold {
    /// Every pass from now on waits at the hold until it is opened.
    pub fn shut(&self) {
        self.inner.shut.send_replace(true);
    }

    /// Lets every waiting pass through, and every later one.
    pub fn open(&self) {
        self.inner.shut.send_replace(false);
    }

    /// The keys of the passes waiting at the hold now.
    pub fn waiting(&self) -> Vec<String> {
        self.inner.waiting().iter().cloned().collect()
    }

    /// Passes the hold: at once while it is open, else once it opens.
    pub async fn pass(&self, key: &str) {
        let mut shut = self.inner.shut.subscribe();
        if !*shut.borrow_and_update() {
            return;
        }
        self.inner.waiting().insert(key.to_owned());
        let _waiting = Waiting { hold: &self.inner, key: key.to_owned() };
        tracing::info!(key, "held");
        // The sender lives in `self`, so the wait ends only when the hold opens.
        let _ = shut.wait_for(|shut| !*shut).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn a_shut_hold_keeps_a_pass_until_it_opens() {
        let hold = Hold::default();
        assert!(hold.pass("a").now_or_never().is_some(), "an open hold is passed at once");
        hold.shut();
        let held = tokio::spawn({
            let hold = hold.clone();
            async move { hold.pass("a").await }
        });
        while hold.waiting().is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(hold.waiting(), ["a"]);
        hold.open();
        held.await.expect("the pass ends once the hold opens");
        assert!(hold.waiting().is_empty());
    }
}
