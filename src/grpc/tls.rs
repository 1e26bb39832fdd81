//! Mutual TLS for the gRPC listener, as cluster-autoscaler's cloud-config dials it: with `cert`,
//! `key` and `cacert` set, it presents `cert` as its client certificate, trusts only `cacert`,
//! and checks the server's certificate against the host part of `address`, over HTTP/2 (ALPN
//! `h2`, which grpc-go requires). So the server presents a certificate whose SAN is that host,
//! and accepts only clients whose certificate is signed by the CA given here.
//!
//! The files are the cert-manager Secret layout and are loaded by [`crate::tls`], which
//! re-reads them on an interval and swaps the configuration (an `ArcSwap<ServerConfig>`)
//! when they changed; each new connection is accepted with the configuration in force.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::tls::{CertFiles, ReloadingServerConfig, TlsError};

/// gRPC runs over HTTP/2 only.
const ALPN: &[&[u8]] = &[b"h2"];
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to pick them up.
const ACCEPT_BACKLOG: usize = 64;

/// Loads the serving certificate, its key and the CA client certificates must be signed by.
pub fn load(files: CertFiles) -> Result<Arc<ReloadingServerConfig>, TlsError> {
    ReloadingServerConfig::load(files, ALPN)
}

/// A TLS connection tonic can serve.
pub struct TlsConnection(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The connections of `listener` that completed a TLS handshake, until `shutdown`. Each
/// handshake runs on its own task, so a slow or hostile client does not hold up the others; a
/// client that fails the handshake (no certificate, one from another CA) is dropped and logged.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingServerConfig>,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<TlsConnection>> {
    let (accepted, stream) = mpsc::channel(ACCEPT_BACKLOG);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = listener.accept() => match next {
                    Ok(next) => next,
                    Err(error) => {
                        // Out of file descriptors and the like: pause instead of spinning.
                        tracing::warn!(%error, "accepting a gRPC connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            crate::tls::no_delay(&tcp);
            let acceptor = tls.acceptor();
            let accepted = accepted.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        // The receiver is gone only when the server stopped.
                        let _ = accepted.send(Ok(TlsConnection(stream))).await;
                    }
                    Ok(Err(error)) => tracing::info!(%peer, %error, "gRPC TLS handshake refused"),
                    Err(_) => tracing::info!(%peer, "gRPC TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(stream)
}
