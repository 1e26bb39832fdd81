//! The HTTPS listener of the webhooks: a tokio-rustls accept loop in front of the axum router,
//! taking the certificate in force at each handshake so a rotation needs no restart.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::tls::ReloadingServerConfig;

/// A handshake that takes longer than this is dropped (a stuck client holds no task forever).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` over TLS on `listener` until `shutdown`.
pub async fn serve_https(
    listener: TcpListener,
    tls: Arc<ReloadingServerConfig>,
    router: Router,
    shutdown: CancellationToken,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a webhook connection failed");
                    continue;
                }
            },
        };
        crate::tls::no_delay(&tcp);
        let acceptor = tls.acceptor();
        let service = TowerToHyperService::new(router.clone());
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%error, %peer, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = connection => if let Err(error) = result {
                    tracing::debug!(%error, %peer, "webhook connection ended with an error");
                },
                _ = shutdown.cancelled() => {}
            }
        });
    }
}
