//! A rustls server configuration that follows its files. cert-manager rotates a Secret by
//! swapping the mounted files; inotify on Secret mounts is unreliable (the kubelet swaps a
//! symlink), so the files are re-read on an interval and the configuration replaced when their
//! content changed. A broken rotation keeps the last good configuration.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{CertFiles, TlsError};

/// A server configuration re-read from its files on rotation.
pub struct ReloadingServerConfig {
    files: CertFiles,
    alpn: Vec<Vec<u8>>,
    current: ArcSwap<ServerConfig>,
    loaded_from: std::sync::Mutex<Vec<u8>>,
}

impl ReloadingServerConfig {
    /// Loads the files now; fails when they are missing or invalid. `alpn` lists the
    /// protocols to offer (h2 for gRPC, h2 and http/1.1 for the webhooks).
    pub fn load(files: CertFiles, alpn: &[&[u8]]) -> Result<Arc<Self>, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let bytes = read_all(&files)?;
        let config = build(&files, &alpn)?;
        Ok(Arc::new(Self {
            files,
            alpn,
            current: ArcSwap::from_pointee(config),
            loaded_from: std::sync::Mutex::new(bytes),
        }))
    }

    /// An acceptor with the configuration in force now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.load_full())
    }

    /// Re-reads the files; replaces the configuration when they changed. Returns whether it did.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let bytes = read_all(&self.files)?;
        let mut loaded = self.loaded_from.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *loaded == bytes {
            return Ok(false);
        }
        let config = build(&self.files, &self.alpn)?;
        self.current.store(Arc::new(config));
        *loaded = bytes;
        Ok(true)
    }

    /// Re-reads the files every `interval` until `shutdown`.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        let mut ticks = crate::clock::Ticks::now(interval, shutdown);
        while ticks.next().await {
            match self.reload_if_changed() {
                Ok(true) => {
                    tracing::info!(cert = %self.files.cert.display(), "reloaded rotated TLS certificate")
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, "rotated TLS files are unusable; keeping the previous certificate")
                }
            }
        }
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })
}

fn read_all(files: &CertFiles) -> Result<Vec<u8>, TlsError> {
    let mut bytes = read(&files.cert)?;
    bytes.extend(read(&files.key)?);
    if let Some(ca) = &files.client_ca {
        bytes.extend(read(ca)?);
    }
    Ok(bytes)
}

fn certificates(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem { path: path.into(), source })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

fn build(files: &CertFiles, alpn: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
    let chain = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .map_err(|source| TlsError::Pem { path: files.key.clone(), source })?;
    let builder = ServerConfig::builder_with_protocol_versions(super::PROTOCOL_VERSIONS);
    let mut config = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert)?;
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots)).build()?;
            builder.with_client_cert_verifier(verifier).with_single_cert(chain, key)?
        }
        None => builder.with_no_client_auth().with_single_cert(chain, key)?,
    };
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::issue_self_signed;

    #[test]
    fn reloads_when_the_files_change_and_keeps_the_old_config_when_they_break() {
        super::super::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let first = issue_self_signed(&["localhost".into()], &[]).expect("issue");
        first.write_secret_layout(dir.path()).expect("write");
        let tls = ReloadingServerConfig::load(CertFiles::in_dir(dir.path(), false), &[b"h2"])
            .expect("load");
        let before = tls.current.load_full();
        assert!(!tls.reload_if_changed().expect("unchanged"), "nothing changed yet");

        issue_self_signed(&["localhost".into()], &[])
            .expect("issue")
            .write_secret_layout(dir.path())
            .expect("rotate");
        assert!(tls.reload_if_changed().expect("rotated"));
        assert!(!Arc::ptr_eq(&before, &tls.current.load_full()), "the configuration was replaced");

        let good = tls.current.load_full();
        std::fs::write(dir.path().join("tls.crt"), "not a certificate").expect("break");
        assert!(tls.reload_if_changed().is_err());
        assert!(
            Arc::ptr_eq(&good, &tls.current.load_full()),
            "a broken rotation keeps the last good config"
        );
    }
}
