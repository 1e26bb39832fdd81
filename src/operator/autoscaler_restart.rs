//! Restarts cluster-autoscaler when its client certificate changes. cluster-autoscaler's
//! externalgrpc provider reads `cert`, `key` and `cacert` once, when it starts: a renewed
//! certificate (cert-manager's, or the self-managed one) or a rotated CA mounted into a running
//! pod is never used, and the pod loses the provider once its old certificate expires or the
//! server's certificate comes from a CA it does not hold.
//!
//! So every replica stamps a digest of the client Secret into the Deployment's pod template; a
//! different digest is a rollout. The stamp is the same from every replica, so two replicas
//! writing it cause one rollout, not two.
//!
//! cluster-autoscaler may run in another namespace (the upstream chart in kube-system, say). A
//! pod mounts Secrets of its own namespace only, so there the operator keeps a copy of the client
//! Secret, written before the stamp so the new pods mount the new certificate.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, Patch};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::api::LABEL_MANAGED_BY;
use crate::clock::Ticks;
use crate::field_manager::FieldManager;

/// The pod-template annotation holding the digest of the client certificate Secret.
pub const CERTIFICATE_DIGEST: &str = "infra.homecluster.dev/grpc-client-certificate";

/// The annotation on a copied client Secret naming its source (`namespace/name`).
pub const COPIED_FROM: &str = "infra.homecluster.dev/copied-from";

/// The keys of the client Secret cluster-autoscaler reads (cloud-config `cert`, `key`, `cacert`).
const CLIENT_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    #[error("reading the client certificate Secret {name}: {source}")]
    Secret { name: String, source: kube::Error },
    #[error("copying the client certificate into the Secret {namespace}/{name}: {source}")]
    Copy { namespace: String, name: String, source: kube::Error },
    #[error(
        "the Secret {namespace}/{name} exists and is not a copy the operator made; delete it, or \
         name another Secret for the copy (--cluster-autoscaler-client-secret)"
    )]
    NotOurCopy { namespace: String, name: String },
    #[error("restarting the Deployment {namespace}/{name}: {source}")]
    Deployment { namespace: String, name: String, source: kube::Error },
}

/// What one check did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// No Secret (not issued yet) or no Deployment (not installed): nothing to restart.
    Absent,
    /// The Deployment's pods already run with this certificate.
    Current,
    /// The Deployment was stamped with the new digest: its pods are being replaced.
    Restarted { digest: String },
}

/// The cluster-autoscaler Deployment to keep current, and the client Secret its pods mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub deployment: String,
    /// The Secret (in `namespace`) the pods mount: the client Secret itself when it is the same
    /// Secret, otherwise a copy the operator keeps.
    pub secret: String,
}

/// Keeps the Deployment of `target` running with the certificate in the Secret `secret`.
pub struct AutoscalerRestart {
    secrets: Api<Secret>,
    secret: String,
    /// The copy to keep, when the pods mount another Secret than `secret`.
    copy: Option<(Api<Secret>, String)>,
    source: String,
    deployments: Api<Deployment>,
    target: Target,
}

impl AutoscalerRestart {
    /// `namespace`/`secret` is the client Secret as issued (or given); `target` is where
    /// cluster-autoscaler runs.
    pub fn new(client: &Client, namespace: &str, secret: String, target: Target) -> Self {
        let same = target.namespace == namespace && target.secret == secret;
        let copy = (!same)
            .then(|| (Api::namespaced(client.clone(), &target.namespace), target.secret.clone()));
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            source: format!("{namespace}/{secret}"),
            secret,
            copy,
            deployments: Api::namespaced(client.clone(), &target.namespace),
            target,
        }
    }

    /// Stamps the Deployment when the Secret's certificate differs from the one it was last
    /// stamped with (after bringing the copy, if any, up to date).
    #[tracing::instrument(skip(self), fields(secret = %self.source, namespace = %self.target.namespace, deployment = %self.target.deployment))]
    pub async fn check(&self) -> Result<Checked, RestartError> {
        let secret = self
            .secrets
            .get_opt(&self.secret)
            .await
            .map_err(|source| RestartError::Secret { name: self.source.clone(), source })?;
        let Some(secret) = secret else {
            return Ok(Checked::Absent);
        };
        let Some(digest) = secret.data.as_ref().and_then(certificate_digest) else {
            return Ok(Checked::Absent);
        };
        if let Some((copies, name)) = &self.copy {
            self.keep_copy(copies, name, &secret).await?;
        }
        let deployment_error = |source| RestartError::Deployment {
            namespace: self.target.namespace.clone(),
            name: self.target.deployment.clone(),
            source,
        };
        let Some(deployment) =
            self.deployments.get_opt(&self.target.deployment).await.map_err(deployment_error)?
        else {
            return Ok(Checked::Absent);
        };
        let stamped = deployment
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(CERTIFICATE_DIGEST));
        if stamped == Some(&digest) {
            return Ok(Checked::Current);
        }
        let patch = json!({
            "spec": { "template": { "metadata": { "annotations": { CERTIFICATE_DIGEST: digest } } } }
        });
        self.deployments
            .patch(
                &self.target.deployment,
                &FieldManager::Certificates.patch(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(deployment_error)?;
        tracing::info!(%digest, "restarting cluster-autoscaler: its client certificate changed");
        Ok(Checked::Restarted { digest })
    }

    /// Makes the Secret `name` (in cluster-autoscaler's namespace) hold what cluster-autoscaler
    /// reads from `source`. Only a Secret the operator made is overwritten.
    async fn keep_copy(
        &self,
        copies: &Api<Secret>,
        name: &str,
        source: &Secret,
    ) -> Result<(), RestartError> {
        let copy_error = |source| RestartError::Copy {
            namespace: self.target.namespace.clone(),
            name: name.to_string(),
            source,
        };
        let data: BTreeMap<String, ByteString> = source
            .data
            .iter()
            .flatten()
            .filter(|(key, _)| CLIENT_KEYS.contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        let existing = copies.get_opt(name).await.map_err(copy_error)?;
        let Some(mut existing) = existing else {
            let copy = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(self.target.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        LABEL_MANAGED_BY.0.to_string(),
                        LABEL_MANAGED_BY.1.to_string(),
                    )])),
                    annotations: Some(BTreeMap::from([(
                        COPIED_FROM.to_string(),
                        self.source.clone(),
                    )])),
                    ..ObjectMeta::default()
                },
                type_: source.type_.clone(),
                data: Some(data),
                ..Secret::default()
            };
            copies.create(&FieldManager::Certificates.post(), &copy).await.map_err(copy_error)?;
            tracing::info!("copied the client certificate into cluster-autoscaler's namespace");
            return Ok(());
        };
        let ours = existing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(COPIED_FROM))
            .is_some_and(|from| *from == self.source);
        if !ours {
            return Err(RestartError::NotOurCopy {
                namespace: self.target.namespace.clone(),
                name: name.to_string(),
            });
        }
        if existing.data.as_ref() == Some(&data) {
            return Ok(());
        }
        existing.data = Some(data);
        // A replace carries the resourceVersion read above: a concurrent writer makes it fail
        // and the next tick retries.
        copies
            .replace(name, &FieldManager::Certificates.post(), &existing)
            .await
            .map_err(copy_error)?;
        tracing::info!("updated the client certificate copy in cluster-autoscaler's namespace");
        Ok(())
    }

    /// Checks every `interval` until `shutdown`.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        let mut ticks = Ticks::now(interval, shutdown);
        while ticks.next().await {
            if let Err(error) = self.check().await {
                tracing::warn!(%error, "keeping cluster-autoscaler on its current client certificate failed");
            }
        }
    }
}

/// SHA-256 over what cluster-autoscaler reads from the Secret (certificate, key, CA bundle),
/// hex; None when the Secret holds no certificate.
pub fn certificate_digest(data: &BTreeMap<String, k8s_openapi::ByteString>) -> Option<String> {
    let cert = data.get("tls.crt").filter(|c| !c.0.is_empty())?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [Some(cert), data.get("tls.key"), data.get("ca.crt")] {
        let bytes = part.map(|p| p.0.as_slice()).unwrap_or_default();
        // Lengths first, so that moving bytes from one file to the next changes the digest.
        context.update(&(bytes.len() as u64).to_be_bytes());
        context.update(bytes);
    }
    let digest = context.finish();
    Some(digest.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        entries.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()
    }

    #[test]
    fn the_digest_follows_every_file_cluster_autoscaler_reads() {
        let base = data(&[("tls.crt", "cert"), ("tls.key", "key"), ("ca.crt", "ca")]);
        let digest = certificate_digest(&base).expect("digest");
        assert_eq!(digest.len(), 32);
        assert_eq!(certificate_digest(&base.clone()), Some(digest.clone()), "stable");
        for (key, value) in [("tls.crt", "cert2"), ("tls.key", "key2"), ("ca.crt", "ca2")] {
            let mut changed = base.clone();
            changed.insert(key.into(), ByteString(value.as_bytes().to_vec()));
            assert_ne!(certificate_digest(&changed), Some(digest.clone()), "{key} changed");
        }
        let shifted = data(&[("tls.crt", "cer"), ("tls.key", "tkey"), ("ca.crt", "ca")]);
        assert_ne!(certificate_digest(&shifted), Some(digest), "bytes moved between files");
        assert_eq!(certificate_digest(&data(&[("tls.key", "key")])), None, "no certificate");
        assert_eq!(certificate_digest(&data(&[("tls.crt", "")])), None, "an empty certificate");
    }
}
