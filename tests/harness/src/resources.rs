//! Installing the product's API into the test control plane: the CRDs from crds/, and webhook
//! configurations pointed at a server the test runs on 127.0.0.1. Files reach the apiserver
//! through kubectl, never through a YAML parser of ours: kubectl reads YAML as Go does, where an
//! unquoted `on` is a boolean, and that is what a user's cluster gets.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Resource, ResourceExt};

use crate::control_plane::ControlPlane;
use crate::wait;

/// The field manager of everything the test support applies.
const FIELD_MANAGER: &str = "homelab-test-support";

/// A webhook configuration to register, of either kind.
#[derive(Clone, Debug)]
pub enum WebhookConfiguration {
    Validating(ValidatingWebhookConfiguration),
    Mutating(MutatingWebhookConfiguration),
}

impl WebhookConfiguration {
    /// The configuration as the apiserver would take it from `object` (JSON that kubectl
    /// produced); other kinds give `None`.
    fn from_json(object: serde_json::Value) -> Result<Option<Self>> {
        Ok(match object.get("kind").and_then(|kind| kind.as_str()) {
            Some("ValidatingWebhookConfiguration") => Some(Self::Validating(
                serde_json::from_value(object).context("a ValidatingWebhookConfiguration")?,
            )),
            Some("MutatingWebhookConfiguration") => Some(Self::Mutating(
                serde_json::from_value(object).context("a MutatingWebhookConfiguration")?,
            )),
            _ => None,
        })
    }
}

impl ControlPlane {
    /// Applies the repository's crds/ with kubectl, as a user installs them (server-side, so it
    /// is idempotent and tests may call it concurrently), and waits until each is Established.
    /// Returns the names.
    pub async fn install_crds(&self) -> Result<Vec<String>> {
        let dir = crate::repo_path("crds").display().to_string();
        let out = self
            .kubectl(["apply", "--server-side", "--force-conflicts", "-o", "name", "-f", &dir])
            .await?;
        ensure!(
            out.status.success(),
            "kubectl apply -f crds/: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.rsplit_once('/').map(|(_, name)| name.to_owned()))
            .collect();
        if names.is_empty() {
            bail!("no CRDs found in {dir}");
        }
        let crds: Api<CustomResourceDefinition> = Api::all(self.client()?);
        for name in &names {
            let established = await_condition(crds.clone(), name, conditions::is_crd_established());
            tokio::time::timeout(wait::start_timeout(), established)
                .await
                .with_context(|| format!("CRD {name} not Established in time"))?
                .with_context(|| format!("watching CRD {name}"))?;
        }
        Ok(names)
    }

    /// The webhook configurations of the YAML file `path`, read by kubectl; other kinds are
    /// skipped.
    pub async fn webhook_configurations(&self, path: &Path) -> Result<Vec<WebhookConfiguration>> {
        let mut found = Vec::new();
        for object in crate::yaml_readers::read_as_go(path).await? {
            found.extend(WebhookConfiguration::from_json(object)?);
        }
        Ok(found)
    }

    /// Registers webhook configurations so the apiserver calls `url_base` (for example
    /// `https://127.0.0.1:8443`): each webhook's `clientConfig` becomes `url: <url_base><path>`,
    /// the path taken from its `service.path` (or its `url`), with `ca_pem` as the caBundle.
    /// Applied server-side, so registering again updates in place.
    pub async fn register_webhooks(
        &self,
        configurations: Vec<WebhookConfiguration>,
        url_base: &str,
        ca_pem: &str,
    ) -> Result<()> {
        ensure!(url_base.starts_with("https://"), "the apiserver calls webhooks over https only");
        let client = self.client()?;
        for configuration in configurations {
            match configuration {
                WebhookConfiguration::Validating(mut config) => {
                    for webhook in config.webhooks.iter_mut().flatten() {
                        point_at(&mut webhook.client_config, url_base, ca_pem)?;
                    }
                    apply(Api::all(client.clone()), config).await?;
                }
                WebhookConfiguration::Mutating(mut config) => {
                    for webhook in config.webhooks.iter_mut().flatten() {
                        point_at(&mut webhook.client_config, url_base, ca_pem)?;
                    }
                    apply(Api::all(client.clone()), config).await?;
                }
            }
        }
        Ok(())
    }
}

/// Rewrites a webhook's client config to call `url_base` with the path it had.
fn point_at(config: &mut WebhookClientConfig, url_base: &str, ca_pem: &str) -> Result<()> {
    let path = match (&config.service, &config.url) {
        (Some(service), _) => service.path.clone().unwrap_or_default(),
        (None, Some(url)) => url_path(url)?,
        (None, None) => String::new(),
    };
    let path = if path.is_empty() || path.starts_with('/') { path } else { format!("/{path}") };
    config.url = Some(format!("{}{path}", url_base.trim_end_matches('/')));
    config.service = None;
    config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
    Ok(())
}

/// The path (and query) of an absolute URL.
fn url_path(url: &str) -> Result<String> {
    let rest = url.split_once("://").map(|(_, rest)| rest).context("webhook url has no scheme")?;
    Ok(rest.find('/').map(|at| rest[at..].to_owned()).unwrap_or_default())
}

async fn apply<K>(api: Api<K>, object: K) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let name = object.name_any();
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {} {name}", K::kind(&())))?;
    Ok(())
}
