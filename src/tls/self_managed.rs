//! A serving certificate signed by the shared self-managed CA ([`super::ca_secret`]), kept as
//! files in the cert-manager Secret layout so that [`super::ReloadingServerConfig`] serves it as
//! it serves a mounted Secret. Each replica issues its own: only the CA is shared.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::TlsError;
use super::ca::{CaMaterial, IssuedCert, Validity, issue};
use super::ca_secret::SharedCa;

/// One replica's certificate from the shared CA, and where it is written.
pub struct SelfManagedCert {
    dns_names: Vec<String>,
    lifetime: Duration,
    dir: PathBuf,
    /// The CA that signed the certificate written now, and that certificate.
    written: Option<(CaMaterial, IssuedCert)>,
}

impl SelfManagedCert {
    /// A certificate for `dns_names`, valid for `lifetime`, to be written under `dir`.
    pub fn new(dns_names: Vec<String>, lifetime: Duration, dir: PathBuf) -> Self {
        Self { dns_names, lifetime, dir, written: None }
    }

    /// Where `tls.crt`, `tls.key` and `ca.crt` (the CA bundle) are written.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Issues and writes a certificate when there is none yet, the CA changed, or two thirds of
    /// its lifetime have passed. Returns whether it wrote one.
    pub fn refresh(&mut self, shared: &SharedCa, now: jiff::Timestamp) -> Result<bool, TlsError> {
        let due = match &self.written {
            None => true,
            Some((ca, cert)) => *ca != shared.ca || cert.validity.renewal_due(now),
        };
        if !due {
            return Ok(false);
        }
        let cert =
            issue(&shared.ca, &self.dns_names, &[], Validity::starting(now, self.lifetime)?)?;
        write_secret_layout(&self.dir, &cert, &shared.bundle_pem)?;
        self.written = Some((shared.ca.clone(), cert));
        Ok(true)
    }

    /// When the certificate written now expires.
    pub fn not_after(&self) -> Option<jiff::Timestamp> {
        self.written.as_ref().map(|(_, cert)| cert.validity.not_after)
    }
}

/// Writes `ca.crt` (the bundle), `tls.key` (readable by the operator only) and `tls.crt`, in
/// that order: the reloader reads all three, and a half-written set fails to parse and keeps
/// the previous configuration until the next interval.
fn write_secret_layout(dir: &Path, cert: &IssuedCert, bundle: &str) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir)
        .map_err(|source| TlsError::Write { path: dir.to_path_buf(), source })?;
    for (name, content, mode) in [
        ("ca.crt", bundle, 0o644),
        ("tls.key", cert.key_pem.as_str(), 0o600),
        ("tls.crt", cert.cert_pem.as_str(), 0o644),
    ] {
        let path = dir.join(name);
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&path)?;
            file.write_all(content.as_bytes())
        };
        write().map_err(|source| TlsError::Write { path: path.clone(), source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::tls::ca::new_ca;

    fn shared(now: jiff::Timestamp) -> SharedCa {
        let ca = new_ca(Validity::starting(now, Duration::from_secs(3600)).expect("validity"))
            .expect("ca");
        SharedCa { bundle_pem: ca.cert_pem.clone(), ca }
    }

    #[test]
    fn issues_once_then_again_when_due_or_when_the_ca_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let now = jiff::Timestamp::now();
        let first_ca = shared(now);
        let mut cert = SelfManagedCert::new(
            vec!["localhost".into()],
            Duration::from_secs(60),
            dir.path().join("tls"),
        );
        assert!(cert.refresh(&first_ca, now).expect("issue"), "nothing written yet");
        let written = std::fs::read(cert.dir().join("tls.crt")).expect("tls.crt");
        assert_eq!(
            std::fs::read_to_string(cert.dir().join("ca.crt")).expect("ca.crt"),
            first_ca.bundle_pem
        );
        let key_mode = std::fs::metadata(cert.dir().join("tls.key")).expect("key").permissions();
        assert_eq!(key_mode.mode() & 0o777, 0o600, "the key is the operator's alone");

        let later = |s: i64| now.checked_add(jiff::SignedDuration::from_secs(s)).expect("time");
        assert!(!cert.refresh(&first_ca, later(30)).expect("fresh"), "a third has not passed");
        assert_eq!(std::fs::read(cert.dir().join("tls.crt")).expect("tls.crt"), written);
        assert!(cert.refresh(&first_ca, later(41)).expect("due"), "two thirds have passed");

        let rotated = shared(later(41));
        assert!(cert.refresh(&rotated, later(42)).expect("rotated"), "a new CA re-issues");
        assert_eq!(
            std::fs::read_to_string(cert.dir().join("ca.crt")).expect("ca.crt"),
            rotated.bundle_pem
        );
        assert!(cert.not_after().is_some());
    }
}
