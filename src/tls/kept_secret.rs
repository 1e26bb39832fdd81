//! The layout of a Secret the operator keeps itself (the self-managed CA, cluster-autoscaler's
//! client certificate): `kubernetes.io/tls` with `tls.crt`, `tls.key` and `ca.crt` (the CA
//! bundle), and the certificate's validity in two annotations, so that a replica can judge
//! renewal without parsing X.509.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use super::ca::Validity;

/// The annotations holding a kept certificate's validity.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stamps {
    pub not_before: &'static str,
    pub not_after: &'static str,
}

/// What a kept Secret holds, PEM.
pub(super) struct Kept<'a> {
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
    pub bundle_pem: &'a str,
    pub validity: Validity,
}

/// The Secret `name` holding `kept`; `resource_version` set for a replace, so that a replica
/// that lost a race gets Conflict instead of overwriting the winner.
pub(super) fn to_secret(
    name: &str,
    kept: &Kept<'_>,
    stamps: Stamps,
    resource_version: Option<String>,
) -> Secret {
    let file = |pem: &str| ByteString(pem.as_bytes().to_vec());
    let data = BTreeMap::from([
        ("tls.crt".to_string(), file(kept.cert_pem)),
        ("tls.key".to_string(), file(kept.key_pem)),
        ("ca.crt".to_string(), file(kept.bundle_pem)),
    ]);
    let annotations = BTreeMap::from([
        (stamps.not_before.to_string(), kept.validity.not_before.to_string()),
        (stamps.not_after.to_string(), kept.validity.not_after.to_string()),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(annotations),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "homelab-autoscaler".to_string(),
            )])),
            resource_version,
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The timestamp in annotation `key`: Err says what is wrong, for the caller's error.
pub(super) fn stamp(secret: &Secret, key: &str) -> Result<jiff::Timestamp, String> {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .ok_or_else(|| format!("no {key} annotation"))?
        .parse()
        .map_err(|_| format!("{key} is not a timestamp"))
}

/// The validity the annotations record.
pub(super) fn validity(secret: &Secret, stamps: Stamps) -> Result<Validity, String> {
    Ok(Validity {
        not_before: stamp(secret, stamps.not_before)?,
        not_after: stamp(secret, stamps.not_after)?,
    })
}
