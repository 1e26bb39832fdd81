//! TLS for the operator's servers (admission webhooks, externalgrpc). Certificates come from
//! files in the cert-manager Secret layout and are re-read on rotation without a restart
//! ([`reloading`]); with no cert-manager, the replicas share one CA kept in a Secret
//! ([`ca_secret`], [`ca`]): each serves a certificate of its own signed by it
//! ([`self_managed`]), and the client certificate cluster-autoscaler dials gRPC with is kept in
//! a Secret too ([`client_secret`]). [`self_signed`] makes throwaway ones for development.

pub mod ca;
pub mod ca_secret;
pub mod client_secret;
mod kept_secret;
pub mod reloading;
pub mod self_managed;
pub mod self_signed;

use std::path::PathBuf;

pub use reloading::ReloadingServerConfig;
pub use self_signed::{SelfSignedBundle, issue_self_signed};

/// The TLS versions both servers speak: 1.3 and 1.2. Older versions are refused at the
/// handshake (rustls implements none older, and the list is spelled out so a dependency update
/// cannot widen it).
pub const PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// The files of a serving certificate, as cert-manager writes them into a Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain, PEM (`tls.crt`).
    pub cert: PathBuf,
    /// The private key, PEM (`tls.key`).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA (PEM, `ca.crt`).
    pub client_ca: Option<PathBuf>,
}

impl CertFiles {
    /// The cert-manager Secret layout under `dir`: `tls.crt`, `tls.key` (and `ca.crt` for
    /// client authentication when `require_client_cert`).
    pub fn in_dir(dir: impl Into<PathBuf>, require_client_cert: bool) -> Self {
        let dir = dir.into();
        Self {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_ca: require_client_cert.then(|| dir.join("ca.crt")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("parsing PEM in {path}: {source}")]
    Pem { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("building the client-certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("issuing a self-signed certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("a certificate's validity is out of range: {0}")]
    Time(jiff::Error),
    #[error("a certificate's validity is out of range: {0}")]
    Range(String),
}

/// Installs the process-wide rustls crypto provider (ring). Idempotent; call it first thing.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Turns Nagle's algorithm off on an accepted connection. A response written in more than one
/// segment otherwise waits for the client's delayed ACK: measured, cluster-autoscaler's
/// TemplateNodeInfo (a node of a few KiB) took 44 ms instead of under 1 ms, once per group on
/// every loop. A socket that refuses the option is served anyway.
pub fn no_delay(tcp: &tokio::net::TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY refused; serving with Nagle's algorithm on");
    }
}
