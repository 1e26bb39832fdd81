//! The client certificate cluster-autoscaler dials the gRPC provider with, in the self-managed
//! mode: one Secret in the operator's namespace (`tls.crt`, `tls.key`, `ca.crt`: the layout its
//! cloud-config's `cert`, `key` and `cacert` read), signed by the shared CA.
//!
//! Every replica keeps it current the way [`super::ca_secret`] keeps the CA: whichever comes
//! first creates it (AlreadyExists: read the winner's); it is re-issued under the Secret's
//! resourceVersion (Conflict: read again) when the CA changed, when its `ca.crt` is not the
//! bundle in force, or when two thirds of its lifetime have passed.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::TlsError;
use super::ca::{Validity, issue};
use super::ca_secret::SharedCa;
use super::kept_secret::{self, Kept, Stamps};
use crate::field_manager::FieldManager;

/// The Secret's default name (in the operator's namespace).
pub const CLIENT_SECRET_NAME: &str = "homelab-autoscaler-grpc-client";
/// The name the client certificate carries (its CN and DNS SAN; the server checks only that the
/// shared CA signed it).
const CLIENT_NAME: &str = "cluster-autoscaler";
const STAMPS: Stamps = Stamps {
    not_before: "infra.homecluster.dev/cert-not-before",
    not_after: "infra.homecluster.dev/cert-not-after",
};
/// A create or replace that loses a race reads again; more losses than this in a row mean
/// something else is wrong.
const ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum ClientSecretError {
    #[error("reading or writing the client certificate Secret {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("issuing the client certificate: {0}")]
    Tls(#[from] TlsError),
    #[error("the client certificate Secret {name} kept changing under {ATTEMPTS} attempts")]
    Contended { name: String },
}

/// What [`ClientCertSecret::ensure`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCert {
    /// The Secret already held a current certificate.
    Current,
    /// This replica issued one (created the Secret, or replaced what it held).
    Issued,
}

/// The client certificate Secret of one namespace.
pub struct ClientCertSecret {
    api: Api<Secret>,
    name: String,
    lifetime: std::time::Duration,
}

impl ClientCertSecret {
    pub fn new(api: Api<Secret>, name: impl Into<String>, lifetime: std::time::Duration) -> Self {
        Self { api, name: name.into(), lifetime }
    }

    /// Makes the Secret hold a client certificate of `shared`'s CA, issuing one when there is
    /// none or the one there is stale.
    #[tracing::instrument(skip(self, shared), fields(secret = %self.name))]
    pub async fn ensure(
        &self,
        shared: &SharedCa,
        now: jiff::Timestamp,
    ) -> Result<ClientCert, ClientSecretError> {
        for _ in 0..ATTEMPTS {
            let existing = self.api.get_opt(&self.name).await.map_err(|e| self.api_error(e))?;
            let resource_version = match &existing {
                Some(secret) if is_current(secret, shared, now) => return Ok(ClientCert::Current),
                Some(secret) => Some(secret.metadata.resource_version.clone().unwrap_or_default()),
                None => None,
            };
            let secret = self.issue(shared, now, resource_version.clone())?;
            let written = match resource_version {
                None => self.api.create(&FieldManager::Certificates.post(), &secret).await,
                Some(_) => {
                    self.api.replace(&self.name, &FieldManager::Certificates.post(), &secret).await
                }
            };
            match written {
                Ok(_) => {
                    tracing::info!("issued the cluster-autoscaler client certificate");
                    return Ok(ClientCert::Issued);
                }
                // Another replica created or replaced it first: judge what it wrote.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(self.api_error(error)),
            }
        }
        Err(ClientSecretError::Contended { name: self.name.clone() })
    }

    fn issue(
        &self,
        shared: &SharedCa,
        now: jiff::Timestamp,
        resource_version: Option<String>,
    ) -> Result<Secret, TlsError> {
        let cert = issue(
            &shared.ca,
            &[CLIENT_NAME.to_string()],
            &[],
            Validity::starting(now, self.lifetime)?,
        )?;
        let kept = Kept {
            cert_pem: &cert.cert_pem,
            key_pem: &cert.key_pem,
            bundle_pem: &shared.bundle_pem,
            validity: cert.validity,
        };
        Ok(kept_secret::to_secret(&self.name, &kept, STAMPS, resource_version))
    }

    fn api_error(&self, source: kube::Error) -> ClientSecretError {
        ClientSecretError::Api { name: self.name.clone(), source }
    }
}

/// Whether `secret` holds a client certificate of the CA in force, trusting the bundle in force,
/// that is not due for renewal. Anything unreadable is stale: it is re-issued, not trusted.
fn is_current(secret: &Secret, shared: &SharedCa, now: jiff::Timestamp) -> bool {
    let data = secret.data.as_ref();
    let has = |key: &str| data.and_then(|d| d.get(key)).is_some_and(|v| !v.0.is_empty());
    let bundle_matches =
        data.and_then(|d| d.get("ca.crt")).is_some_and(|b| b.0 == shared.bundle_pem.as_bytes());
    let Ok(validity) = kept_secret::validity(secret, STAMPS) else {
        return false;
    };
    // The bundle starts with the CA in force, so a rotated CA shows as a bundle that differs.
    has("tls.crt")
        && has("tls.key")
        && bundle_matches
        && !validity.renewal_due(now)
        && validity.not_after <= shared.ca.validity.not_after
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::tls::ca::new_ca;

    fn shared(now: jiff::Timestamp) -> SharedCa {
        let ca = new_ca(Validity::starting(now, Duration::from_secs(36_000)).expect("validity"))
            .expect("ca");
        SharedCa { bundle_pem: ca.cert_pem.clone(), ca }
    }

    fn client(api: Api<Secret>) -> ClientCertSecret {
        ClientCertSecret::new(api, CLIENT_SECRET_NAME, Duration::from_secs(600))
    }

    /// A Secret as [`ClientCertSecret::issue`] writes it, without an apiserver: the issue step
    /// needs no client, so a throwaway `Api` over an unreachable address stands in.
    fn issued(shared: &SharedCa, now: jiff::Timestamp) -> Secret {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let kube_client = kube::Client::try_from(config).expect("client");
        client(Api::namespaced(kube_client, "ns")).issue(shared, now, None).expect("issue")
    }

    #[tokio::test]
    async fn a_fresh_certificate_of_the_ca_in_force_is_current_and_anything_else_is_stale() {
        let now = jiff::Timestamp::now();
        let later = |s: i64| now.checked_add(jiff::SignedDuration::from_secs(s)).expect("time");
        let ca = shared(now);
        let secret = issued(&ca, now);
        assert!(is_current(&secret, &ca, now), "just issued");
        assert!(is_current(&secret, &ca, later(390)), "a third of 600 s is left");
        assert!(!is_current(&secret, &ca, later(400)), "two thirds have passed");

        let rotated = shared(now);
        assert!(!is_current(&secret, &rotated, now), "another CA");
        let mut both = rotated.clone();
        both.bundle_pem.push_str(&ca.bundle_pem);
        assert!(!is_current(&issued(&rotated, now), &both, now), "the bundle grew");

        let mut unreadable = secret.clone();
        unreadable.metadata.annotations = None;
        assert!(!is_current(&unreadable, &ca, now), "no validity annotations");
        let mut keyless = secret;
        keyless.data.as_mut().expect("data").remove("tls.key");
        assert!(!is_current(&keyless, &ca, now), "no key");
    }
}
