//! Plain-HTTP admin endpoints: `/live` answers while the process runs, `/ready` once the caches
//! it serves from have synced, `/metrics` the Prometheus metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::telemetry;

#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
        telemetry::set_caches_synced(ready);
    }
}

async fn ready(State(readiness): State<Readiness>) -> (StatusCode, &'static str) {
    if readiness.0.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting: the caches have not synced yet")
    }
}

async fn metrics(headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = telemetry::render(accept);
    ([(header::CONTENT_TYPE, content_type)], body)
}

/// The admin routes.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/live", get(|| async { "alive" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(readiness)
}

pub async fn serve(addr: SocketAddr, readiness: Readiness, shutdown: CancellationToken) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, %addr, "cannot bind the admin listener");
            return;
        }
    };
    if let Err(error) = axum::serve(listener, router(readiness))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        tracing::error!(%error, "admin server failed");
    }
}
