//! A CA of the operator's own and the certificates it signs, with the lifetimes that decide when
//! each is renewed. Pure: no I/O. `ca_secret` keeps the CA in a Secret that every
//! replica shares.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::TlsError;

/// How long a new CA is valid. Rotated once two thirds of it have passed ([`renewal_due`]).
pub const CA_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// How long a serving certificate is valid; re-issued once two thirds have passed.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// Clocks of a cluster disagree a little: certificates start this long before they are made.
const BACKDATE: Duration = Duration::from_secs(300);

/// When a certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: jiff::Timestamp,
    pub not_after: jiff::Timestamp,
}

impl Validity {
    /// Valid from a little before `now` for `lifetime`.
    pub fn starting(now: jiff::Timestamp, lifetime: Duration) -> Result<Self, TlsError> {
        let not_before = now.checked_sub(BACKDATE).map_err(TlsError::Time)?;
        let not_after = now.checked_add(lifetime).map_err(TlsError::Time)?;
        Ok(Self { not_before, not_after })
    }

    /// Two thirds of the lifetime have passed (cert-manager's default renewal point): time to
    /// renew, with a third left for every replica to pick the new one up. The lifetime is
    /// counted from issuance, not from the backdated start.
    pub fn renewal_due(&self, now: jiff::Timestamp) -> bool {
        let span = self.not_after.as_second() - self.not_before.as_second();
        let lifetime = (span - BACKDATE.as_secs() as i64).max(0);
        now.as_second() >= self.not_after.as_second() - lifetime / 3
    }

    /// Whether the certificate has expired at `now`.
    pub fn expired(&self, now: jiff::Timestamp) -> bool {
        now >= self.not_after
    }

    fn apply(&self, params: &mut CertificateParams) -> Result<(), TlsError> {
        params.not_before = offset(self.not_before)?;
        params.not_after = offset(self.not_after)?;
        Ok(())
    }
}

fn offset(at: jiff::Timestamp) -> Result<time::OffsetDateTime, TlsError> {
    time::OffsetDateTime::from_unix_timestamp(at.as_second())
        .map_err(|error| TlsError::Range(error.to_string()))
}

/// A CA: its certificate and private key (PEM) and when it is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaMaterial {
    pub cert_pem: String,
    pub key_pem: String,
    pub validity: Validity,
}

/// A certificate signed by a [`CaMaterial`], with its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub validity: Validity,
}

/// What every CA the operator makes says of itself: its name, and that it signs certificates.
/// The shared self-managed CA and the development one (`issue_self_signed`) both start here.
pub(super) fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "homelab-autoscaler CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Makes a new CA valid for `validity`.
pub fn new_ca(validity: Validity) -> Result<CaMaterial, TlsError> {
    let mut params = ca_params()?;
    validity.apply(&mut params)?;
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(CaMaterial { cert_pem: cert.pem(), key_pem: key.serialize_pem(), validity })
}

/// Signs a certificate for `dns_names` and `ips` with `ca`, usable to serve and as a client
/// certificate. Its lifetime ends no later than the CA's.
pub fn issue(
    ca: &CaMaterial,
    dns_names: &[String],
    ips: &[IpAddr],
    validity: Validity,
) -> Result<IssuedCert, TlsError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let validity = Validity {
        not_before: validity.not_before,
        not_after: validity.not_after.min(ca.validity.not_after),
    };
    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params
        .distinguished_name
        .push(DnType::CommonName, dns_names.first().map_or("homelab-autoscaler", String::as_str));
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    validity.apply(&mut params)?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(IssuedCert { cert_pem: cert.pem(), key_pem: key.serialize_pem(), validity })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn renewal_is_due_after_two_thirds_of_the_lifetime_counted_from_issuance() {
        // Issued at 00:05, backdated to 00:00: the lifetime is 3 days less 5 minutes.
        let v = Validity {
            not_before: at("2026-01-01T00:00:00Z"),
            not_after: at("2026-01-04T00:00:00Z"),
        };
        for (now, due) in [
            ("2025-12-31T00:00:00Z", false),
            ("2026-01-01T00:00:00Z", false),
            ("2026-01-03T00:00:00Z", false),
            ("2026-01-03T00:01:39Z", false),
            ("2026-01-03T00:01:40Z", true),
            ("2026-01-05T00:00:00Z", true),
        ] {
            assert_eq!(v.renewal_due(at(now)), due, "{now}");
        }
        assert!(!v.expired(at("2026-01-03T23:59:59Z")));
        assert!(v.expired(at("2026-01-04T00:00:00Z")));
    }

    #[test]
    fn a_short_lifetime_is_not_due_at_once() {
        let now = at("2026-01-01T00:00:00Z");
        let v = Validity::starting(now, Duration::from_secs(45)).expect("validity");
        assert!(!v.renewal_due(now));
        assert!(!v.renewal_due(at("2026-01-01T00:00:29Z")));
        assert!(v.renewal_due(at("2026-01-01T00:00:30Z")));
    }

    #[test]
    fn a_certificate_never_outlives_its_ca_and_verifies_against_it() {
        crate::tls::install_crypto_provider();
        let now = jiff::Timestamp::now();
        let ca = new_ca(Validity::starting(now, Duration::from_secs(3600)).expect("validity"))
            .expect("ca");
        let leaf = issue(
            &ca,
            &["localhost".into()],
            &["127.0.0.1".parse().expect("ip")],
            Validity::starting(now, Duration::from_secs(7200)).expect("validity"),
        )
        .expect("leaf");
        assert_eq!(leaf.validity.not_after, ca.validity.not_after, "capped at the CA's end");

        let end = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).expect("leaf der");
        let unix = UnixTime::since_unix_epoch(Duration::from_secs(now.as_second() as u64));
        verify(&ca, &end, unix).expect("the leaf verifies against the CA");
        let other =
            new_ca(Validity::starting(now, Duration::from_secs(3600)).expect("v")).expect("ca");
        assert!(verify(&other, &end, unix).is_err(), "another CA does not vouch for it");
    }

    /// Verifies `end` as a server certificate for `localhost` against `ca` alone.
    fn verify(
        ca: &CaMaterial,
        end: &CertificateDer<'_>,
        at: UnixTime,
    ) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).expect("ca der"))
            .expect("root");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let name = ServerName::try_from("localhost").expect("name");
        verifier.verify_server_cert(end, &[], &name, &[], at).map(|_| ())
    }
}
