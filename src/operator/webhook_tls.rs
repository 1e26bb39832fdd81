//! The webhook server's certificate: from files (cert-manager), re-read on rotation; or, with
//! no files, self-made, with its CA patched into the webhook configurations' caBundle.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, Patch};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::RunArgs;
use crate::controller::params;
use crate::tls::{CertFiles, ReloadingServerConfig, issue_self_signed};
use crate::webhook::configuration::CONFIGURATION_NAME;

const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// How often mounted certificate files are re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

pub async fn serving_config(
    client: &Client,
    args: &RunArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<Arc<ReloadingServerConfig>> {
    if let Some(dir) = &args.webhook_cert_dir {
        let tls = ReloadingServerConfig::load(CertFiles::in_dir(dir, false), ALPN)
            .with_context(|| format!("loading the webhook certificate from {}", dir.display()))?;
        tokio::spawn(tls.clone().watch(RELOAD_INTERVAL, shutdown.clone()));
        return Ok(tls);
    }
    let bundle = issue_self_signed(&args.webhook_dns_names, &[])
        .context("issuing a self-signed webhook certificate")?;
    let dir =
        std::env::temp_dir().join(format!("homelab-autoscaler-webhook-{}", std::process::id()));
    bundle.write_secret_layout(&dir).context("writing the self-signed certificate")?;
    let tls = ReloadingServerConfig::load(CertFiles::in_dir(&dir, false), ALPN)?;
    patch_ca_bundle(client, bundle.ca_pem.as_bytes()).await?;
    Ok(tls)
}

/// Writes `ca` into every webhook of both configurations (those that exist).
pub async fn patch_ca_bundle(client: &Client, ca: &[u8]) -> anyhow::Result<()> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    patch_one(mutating, ca, |c| c.webhooks.as_ref().map_or(0, Vec::len)).await?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    patch_one(validating, ca, |c| c.webhooks.as_ref().map_or(0, Vec::len)).await
}

/// Adds `ca` as the caBundle of each of the configuration's `webhooks(..)` webhooks.
async fn patch_one<K>(api: Api<K>, ca: &[u8], webhooks: fn(&K) -> usize) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = std::any::type_name::<K>().rsplit("::").next().unwrap_or("configuration");
    let Some(config) =
        api.get_opt(CONFIGURATION_NAME).await.with_context(|| format!("reading the {kind}"))?
    else {
        return Ok(());
    };
    let bundle = ByteString(ca.to_vec());
    let ops: Vec<_> = (0..webhooks(&config))
        .map(|i| {
            json!({ "op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle })
        })
        .collect();
    let patch: json_patch::Patch = serde_json::from_value(json!(ops))?;
    api.patch(CONFIGURATION_NAME, &params(), &Patch::Json::<()>(patch))
        .await
        .with_context(|| format!("patching the caBundle of the {kind}"))?;
    Ok(())
}
