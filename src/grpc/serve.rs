//! Serving the externalgrpc service: plaintext (cluster-autoscaler's cloud-config without
//! `cert`), or mutual TLS when certificate files are given.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::provider::Provider;
use crate::tls::{CertFiles, ReloadingServerConfig, TlsError};

use super::measure::Measured;
use super::server::CloudProviderService;
use super::tls;

/// How often the certificate files are re-read.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// Where and how to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcServerConfig {
    pub address: SocketAddr,
    /// Mutual TLS: the serving certificate and key, and the CA client certificates must be
    /// signed by (`client_ca` is required: cluster-autoscaler always sends its certificate).
    pub tls: Option<CertFiles>,
    pub reload_interval: Duration,
}

impl GrpcServerConfig {
    /// Plaintext on `address`.
    pub fn plaintext(address: SocketAddr) -> Self {
        Self { address, tls: None, reload_interval: DEFAULT_RELOAD_INTERVAL }
    }

    /// Mutual TLS on `address` with the cert-manager Secret layout in `dir` (`tls.crt`,
    /// `tls.key`, and `ca.crt` as the client CA).
    pub fn mutual_tls(address: SocketAddr, dir: impl Into<PathBuf>) -> Self {
        Self {
            address,
            tls: Some(CertFiles::in_dir(dir, true)),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("binding the gRPC listener on {address}: {source}")]
    Bind { address: SocketAddr, source: std::io::Error },
    #[error("loading the gRPC TLS files: {0}")]
    Tls(#[from] TlsError),
    #[error("mutual TLS needs a client CA: cluster-autoscaler authenticates with its certificate")]
    NoClientCa,
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Binds `config.address` and serves until `shutdown`.
pub async fn serve(
    provider: Provider,
    config: GrpcServerConfig,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    let tls = match config.tls {
        Some(files) if files.client_ca.is_none() => return Err(GrpcError::NoClientCa),
        Some(files) => Some(tls::load(files)?),
        None => None,
    };
    let listener = TcpListener::bind(config.address)
        .await
        .map_err(|source| GrpcError::Bind { address: config.address, source })?;
    serve_on(listener, provider, tls, config.reload_interval, shutdown).await
}

/// Serves on a bound listener until `shutdown`; with `tls`, re-reads its files every
/// `reload_interval`.
pub async fn serve_on(
    listener: TcpListener,
    provider: Provider,
    tls: Option<Arc<ReloadingServerConfig>>,
    reload_interval: Duration,
    shutdown: CancellationToken,
) -> Result<(), GrpcError> {
    let address = listener.local_addr().ok();
    let service = CloudProviderService::new(provider).into_server();
    let router = Server::builder().layer(tower::layer::layer_fn(Measured)).add_service(service);
    match tls {
        Some(tls) => {
            tracing::info!(?address, "externalgrpc provider listening (mutual TLS)");
            tokio::spawn(tls.clone().watch(reload_interval, shutdown.clone()));
            let incoming = tls::incoming(listener, tls, shutdown.clone());
            router.serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()).await?;
        }
        None => {
            tracing::info!(?address, "externalgrpc provider listening (plaintext)");
            let incoming = TcpListenerStream::new(listener).inspect(|accepted| {
                if let Ok(tcp) = accepted {
                    crate::tls::no_delay(tcp);
                }
            });
            router.serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()).await?;
        }
    }
    Ok(())
}
