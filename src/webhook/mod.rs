//! Admission webhooks: the rules of the model that can be judged at write time. Handlers read
//! the process's caches (`lookup`) and decide; they never write. The rules themselves are pure functions
//! (`claim_rules`, `slot_rules`, `group_rules`) so they are table-tested without a server.

mod admitted;
pub mod body_limit;
pub mod claim_rules;
pub mod configuration;
pub mod group_rules;
mod handlers;
mod lookup;
pub mod node_mark_rules;
pub mod node_registration;
pub mod power_rules;
pub mod schedule_rules;
pub mod sequence_rules;
pub mod server;
pub mod slot_rules;
pub mod verdict;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use kube::Client;

pub use crate::clock::{Clock, SystemClock};

/// What the webhook handlers share.
pub struct WebhookState {
    /// For the reads made while the caches cannot answer (see `lookup`).
    pub client: Client,
    /// The process's caches, which admission reads.
    pub caches: crate::cache::Stores,
    /// The namespace slots, groups and claims live in.
    pub namespace: String,
    /// Usernames allowed to do what only the operator may (clear a claim's deadline).
    pub operator_usernames: Vec<String>,
    pub clock: Box<dyn Clock>,
    /// The timeouts the operator runs with, which claims' deadlines follow.
    pub timeouts: crate::claim::Timeouts,
}

impl WebhookState {
    fn is_operator(&self, username: &str) -> bool {
        self.operator_usernames.iter().any(|u| u == username)
    }
}

/// The handlers' state: the settings, and this router's own claim admissions.
struct Shared {
    state: Arc<WebhookState>,
    admitted: admitted::Admitted,
}

impl std::ops::Deref for Shared {
    type Target = WebhookState;

    fn deref(&self) -> &WebhookState {
        &self.state
    }
}

/// The admission routes, one per kind and operation class.
pub fn router(state: Arc<WebhookState>) -> Router {
    let state = Arc::new(Shared { state, admitted: admitted::Admitted::default() });
    Router::new()
        .route(configuration::PATH_MUTATE_CLAIM, post(handlers::mutate_claim))
        .route(configuration::PATH_VALIDATE_CLAIM, post(handlers::validate_claim))
        .route(configuration::PATH_VALIDATE_SLOT, post(handlers::validate_slot))
        .route(configuration::PATH_VALIDATE_GROUP, post(handlers::validate_group))
        .route(configuration::PATH_MUTATE_KUBERNETES_NODE, post(handlers::mutate_kubernetes_node))
        .route("/healthz", get(|| async { "ok" }))
        // The extractors' own limit (2 MB by default) must not undercut the 413 below.
        .layer(axum::extract::DefaultBodyLimit::max(body_limit::MAX_REVIEW_BYTES))
        .layer(axum::middleware::from_fn(body_limit::limit_body))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}
