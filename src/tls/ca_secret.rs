//! The self-managed CA, shared by every replica through one Secret in the operator's namespace.
//!
//! Whichever replica comes first creates it; a replica that loses that race (the create answers
//! AlreadyExists) reads the winner's. When two thirds of the CA's lifetime have passed, a replica
//! replaces it under the Secret's resourceVersion (a replica that loses, Conflict, reads the
//! winner's). `ca.crt` holds the new CA and the previous one until that expires, so a replica
//! still serving a certificate of the old CA stays trusted until it re-issues.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::TlsError;
use super::ca::{CaMaterial, Validity, new_ca};
use super::kept_secret::{self, Kept, Stamps};
use crate::field_manager::FieldManager;

/// The Secret's name (in the operator's namespace).
pub const CA_SECRET_NAME: &str = "homelab-autoscaler-ca";
const STAMPS: Stamps = Stamps {
    not_before: "infra.homecluster.dev/ca-not-before",
    not_after: "infra.homecluster.dev/ca-not-after",
};
/// A create or replace that loses a race reads again; more losses than this in a row mean
/// something else is wrong.
const ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum CaSecretError {
    #[error("reading or writing the CA Secret {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("the CA Secret {name} is malformed: {what}")]
    Malformed { name: String, what: String },
    #[error("making a CA: {0}")]
    Tls(#[from] TlsError),
    #[error("the CA Secret {name} kept changing under {ATTEMPTS} attempts")]
    Contended { name: String },
}

/// The CA in force and the bundle clients must trust (it, plus the previous CA until expiry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedCa {
    pub ca: CaMaterial,
    pub bundle_pem: String,
}

/// The CA Secret of one namespace.
pub struct CaSecret {
    api: Api<Secret>,
    name: String,
    ca_lifetime: std::time::Duration,
}

impl CaSecret {
    pub fn new(
        api: Api<Secret>,
        name: impl Into<String>,
        ca_lifetime: std::time::Duration,
    ) -> Self {
        Self { api, name: name.into(), ca_lifetime }
    }

    /// The CA every replica uses now: created if there is none, rotated if due, read back when
    /// another replica won either race.
    #[tracing::instrument(skip(self), fields(secret = %self.name))]
    pub async fn current(&self, now: jiff::Timestamp) -> Result<SharedCa, CaSecretError> {
        for _ in 0..ATTEMPTS {
            let existing = self.api.get_opt(&self.name).await.map_err(|e| self.api_error(e))?;
            let Some(secret) = existing else {
                let fresh =
                    self.shared(new_ca(Validity::starting(now, self.ca_lifetime)?)?, None, now);
                match self
                    .api
                    .create(&FieldManager::Certificates.post(), &self.to_secret(&fresh, None))
                    .await
                {
                    Ok(_) => {
                        tracing::info!("created the shared CA");
                        return Ok(fresh);
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    Err(error) => return Err(self.api_error(error)),
                }
            };
            let stored = self.parse(&secret)?;
            if !stored.ca.validity.renewal_due(now) {
                return Ok(stored);
            }
            let rotated = self.shared(
                new_ca(Validity::starting(now, self.ca_lifetime)?)?,
                Some(&stored.ca),
                now,
            );
            let version = secret.metadata.resource_version.clone();
            match self
                .api
                .replace(
                    &self.name,
                    &FieldManager::Certificates.post(),
                    &self.to_secret(&rotated, version),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!("rotated the shared CA");
                    return Ok(rotated);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(error) => return Err(self.api_error(error)),
            }
        }
        Err(CaSecretError::Contended { name: self.name.clone() })
    }

    /// `ca` with its bundle: it and `previous` while that is still valid.
    fn shared(
        &self,
        ca: CaMaterial,
        previous: Option<&CaMaterial>,
        now: jiff::Timestamp,
    ) -> SharedCa {
        let mut bundle_pem = ca.cert_pem.clone();
        if let Some(previous) = previous.filter(|p| !p.validity.expired(now)) {
            bundle_pem.push_str(&previous.cert_pem);
        }
        SharedCa { ca, bundle_pem }
    }

    fn to_secret(&self, shared: &SharedCa, resource_version: Option<String>) -> Secret {
        let kept = Kept {
            cert_pem: &shared.ca.cert_pem,
            key_pem: &shared.ca.key_pem,
            bundle_pem: &shared.bundle_pem,
            validity: shared.ca.validity,
        };
        kept_secret::to_secret(&self.name, &kept, STAMPS, resource_version)
    }

    fn parse(&self, secret: &Secret) -> Result<SharedCa, CaSecretError> {
        let malformed =
            |what: &str| CaSecretError::Malformed { name: self.name.clone(), what: what.into() };
        let field = |key: &str| -> Result<String, CaSecretError> {
            let bytes = secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .ok_or_else(|| malformed(&format!("no {key}")))?;
            String::from_utf8(bytes.0.clone()).map_err(|_| malformed(&format!("{key} is not text")))
        };
        let validity = kept_secret::validity(secret, STAMPS).map_err(|what| malformed(&what))?;
        let ca = CaMaterial { cert_pem: field("tls.crt")?, key_pem: field("tls.key")?, validity };
        Ok(SharedCa { ca, bundle_pem: field("ca.crt")? })
    }

    fn api_error(&self, source: kube::Error) -> CaSecretError {
        CaSecretError::Api { name: self.name.clone(), source }
    }
}
