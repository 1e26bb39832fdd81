//! The Secret values a driver reads: from the files a Job's pod has mounted, or (for a person at
//! a terminal) from the API with the user's kubeconfig.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;

use super::PowerError;
use crate::api::SecretKeyRef;

/// Where a power Job's pod finds its Secrets: one directory per Secret, named after it.
pub const DEFAULT_SECRETS_DIR: &str = "/var/run/secrets/homelab-power";

/// Where Secret values come from.
#[derive(Clone, Debug)]
pub enum Secrets {
    /// `<dir>/<secret name>/<key>`, as the Job mounts them.
    Mounted(PathBuf),
    /// Values read up front, by Secret name then key.
    Loaded(BTreeMap<String, BTreeMap<String, Vec<u8>>>),
}

impl Secrets {
    /// Reads the Secrets named `names` with `client` (a person's kubeconfig).
    pub async fn load(
        client: kube::Client,
        namespace: &str,
        names: impl IntoIterator<Item = String>,
    ) -> Result<Self, PowerError> {
        let api: kube::Api<Secret> = kube::Api::namespaced(client, namespace);
        let mut loaded = BTreeMap::new();
        for name in names {
            let secret = api.get(&name).await.map_err(|source| PowerError::ReadSecret {
                secret: name.clone(),
                detail: source.to_string(),
            })?;
            let data = secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0));
            loaded.insert(name, data.collect());
        }
        Ok(Secrets::Loaded(loaded))
    }

    /// The value of `reference`.
    pub fn bytes(&self, reference: &SecretKeyRef) -> Result<Vec<u8>, PowerError> {
        let missing = |detail: String| PowerError::ReadSecret {
            secret: reference.name.clone(),
            detail: format!("key {:?}: {detail}", reference.key),
        };
        match self {
            Secrets::Mounted(dir) => {
                let path = dir.join(&reference.name).join(&reference.key);
                std::fs::read(&path).map_err(|e| missing(format!("{}: {e}", path.display())))
            }
            Secrets::Loaded(all) => all
                .get(&reference.name)
                .and_then(|data| data.get(&reference.key))
                .cloned()
                .ok_or_else(|| missing("not in the Secret".into())),
        }
    }

    /// The value of `reference` as text, without a trailing newline (files written by hand
    /// often end with one).
    pub fn text(&self, reference: &SecretKeyRef) -> Result<String, PowerError> {
        let bytes = self.bytes(reference)?;
        let text = String::from_utf8(bytes).map_err(|_| PowerError::ReadSecret {
            secret: reference.name.clone(),
            detail: format!("key {:?} is not UTF-8 text", reference.key),
        })?;
        Ok(text.trim_end_matches(['\r', '\n']).to_string())
    }

    /// The directory form, for tests and the pod.
    pub fn mounted(dir: impl AsRef<Path>) -> Self {
        Secrets::Mounted(dir.as_ref().to_path_buf())
    }
}
