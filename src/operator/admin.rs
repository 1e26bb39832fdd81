//! Plain-HTTP admin endpoints: `/live` answers while the process runs, `/ready` once its caches
//! have synced (or, with leader election, once it serves webhooks).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
}

async fn ready(State(readiness): State<Readiness>) -> (StatusCode, &'static str) {
    if readiness.0.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

pub async fn serve(addr: SocketAddr, readiness: Readiness, shutdown: CancellationToken) {
    let app = Router::new()
        .route("/live", get(|| async { "alive" }))
        .route("/ready", get(ready))
        .with_state(readiness);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, %addr, "cannot bind the admin listener");
            return;
        }
    };
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        tracing::error!(%error, "admin server failed");
    }
}
