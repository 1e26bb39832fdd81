//! Restarts cluster-autoscaler when its client certificate changes. cluster-autoscaler's
//! externalgrpc provider reads `cert`, `key` and `cacert` once, when it starts: a renewed
//! certificate (cert-manager's, or the self-managed one) or a rotated CA mounted into a running
//! pod is never used, and the pod loses the provider once its old certificate expires or the
//! server's certificate comes from a CA it does not hold.
//!
//! So every replica stamps a digest of the client Secret into the Deployment's pod template; a
//! different digest is a rollout. The stamp is the same from every replica, so two replicas
//! writing it cause one rollout, not two.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::clock::Ticks;
use crate::controller::params;

/// The pod-template annotation holding the digest of the client certificate Secret.
pub const CERTIFICATE_DIGEST: &str = "infra.homecluster.dev/grpc-client-certificate";

#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    #[error("reading the client certificate Secret {name}: {source}")]
    Secret { name: String, source: kube::Error },
    #[error("restarting the Deployment {name}: {source}")]
    Deployment { name: String, source: kube::Error },
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

/// Keeps the Deployment `deployment` running with the certificate in the Secret `secret`.
pub struct AutoscalerRestart {
    secrets: Api<Secret>,
    deployments: Api<Deployment>,
    secret: String,
    deployment: String,
}

impl AutoscalerRestart {
    pub fn new(client: &Client, namespace: &str, secret: String, deployment: String) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            deployments: Api::namespaced(client.clone(), namespace),
            secret,
            deployment,
        }
    }

    /// Stamps the Deployment when the Secret's certificate differs from the one it was last
    /// stamped with.
    #[tracing::instrument(skip(self), fields(secret = %self.secret, deployment = %self.deployment))]
    pub async fn check(&self) -> Result<Checked, RestartError> {
        let secret = self
            .secrets
            .get_opt(&self.secret)
            .await
            .map_err(|source| RestartError::Secret { name: self.secret.clone(), source })?;
        let Some(digest) = secret.as_ref().and_then(|s| certificate_digest(s.data.as_ref()?))
        else {
            return Ok(Checked::Absent);
        };
        let deployment_error =
            |source| RestartError::Deployment { name: self.deployment.clone(), source };
        let Some(deployment) =
            self.deployments.get_opt(&self.deployment).await.map_err(deployment_error)?
        else {
            return Ok(Checked::Absent);
        };
        let stamped = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(CERTIFICATE_DIGEST));
        if stamped == Some(&digest) {
            return Ok(Checked::Current);
        }
        let patch = json!({
            "spec": { "template": { "metadata": { "annotations": { CERTIFICATE_DIGEST: digest } } } }
        });
        self.deployments
            .patch(&self.deployment, &params(), &Patch::Merge(&patch))
            .await
            .map_err(deployment_error)?;
        tracing::info!(%digest, "restarting cluster-autoscaler: its client certificate changed");
        Ok(Checked::Restarted { digest })
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
