//! A self-made CA and serving certificate, for clusters without cert-manager and for
//! development (`homelab-autoscaler certs`).

use std::net::IpAddr;
use std::path::Path;

use rcgen::{CertificateParams, CertifiedIssuer, DnType, KeyPair, SanType};

use super::TlsError;

/// A CA, and a certificate and key it signed, all PEM.
#[derive(Clone, Debug)]
pub struct SelfSignedBundle {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Issues a CA and a certificate for `dns_names` and `ips`, usable for serving and as a client
/// certificate (mutual TLS with cluster-autoscaler uses one CA for both sides).
pub fn issue_self_signed(
    dns_names: &[String],
    ips: &[IpAddr],
) -> Result<SelfSignedBundle, TlsError> {
    let ca = CertifiedIssuer::self_signed(super::ca::ca_params()?, KeyPair::generate()?)?;

    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params
        .distinguished_name
        .push(DnType::CommonName, dns_names.first().map_or("homelab-autoscaler", String::as_str));
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(SelfSignedBundle { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

impl SelfSignedBundle {
    /// Writes `tls.crt`, `tls.key` and `ca.crt` into `dir`, as cert-manager lays out a Secret.
    pub fn write_secret_layout(&self, dir: &Path) -> Result<(), TlsError> {
        let write = |name: &str, content: &str| {
            let path = dir.join(name);
            std::fs::write(&path, content).map_err(|source| TlsError::Write { path, source })
        };
        std::fs::create_dir_all(dir)
            .map_err(|source| TlsError::Write { path: dir.into(), source })?;
        write("ca.crt", &self.ca_pem)?;
        write("tls.key", &self.key_pem)?;
        write("tls.crt", &self.cert_pem)
    }
}
