//! The webhook server's certificate, in one of three ways:
//! - from files (a cert-manager Secret, or one the user made), re-read on rotation; with
//!   `--webhook-patch-ca-bundle`, the files' `ca.crt` is also patched into the webhook
//!   configurations (no cainjector to do it);
//! - self-managed: every replica serves a certificate signed by the one CA in the
//!   `--ca-secret` Secret ([`crate::tls::ca_secret`]), patches that CA into the
//!   configurations' caBundle, and re-issues before its certificate or the CA expire.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::RunArgs;
use crate::clock::Ticks;
use crate::field_manager::FieldManager;
use crate::tls::ca_secret::CaSecret;
use crate::tls::self_managed::SelfManagedCert;
use crate::tls::{CertFiles, ReloadingServerConfig};
use crate::webhook::configuration::CONFIGURATION_NAME;

const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

pub async fn serving_config(
    client: &Client,
    args: &RunArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<Arc<ReloadingServerConfig>> {
    let interval = args.tls_reload_interval.into();
    if let Some(dir) = &args.webhook_cert_dir {
        let tls = ReloadingServerConfig::load(CertFiles::in_dir(dir, false), ALPN)
            .with_context(|| format!("loading the webhook certificate from {}", dir.display()))?;
        tokio::spawn(tls.clone().watch(interval, shutdown.clone()));
        if args.webhook_patch_ca_bundle {
            tokio::spawn(keep_ca_bundle_from(
                client.clone(),
                dir.join("ca.crt"),
                interval,
                shutdown.clone(),
            ));
        }
        return Ok(tls);
    }
    let mut managed = SelfManaged {
        client: client.clone(),
        ca_secret: CaSecret::new(
            Api::<Secret>::namespaced(client.clone(), &args.namespace),
            args.ca_secret.clone(),
            args.ca_lifetime.into(),
        ),
        cert: SelfManagedCert::new(
            args.webhook_dns_names.clone(),
            args.webhook_cert_lifetime.into(),
            std::env::temp_dir().join(format!("homelab-autoscaler-webhook-{}", std::process::id())),
        ),
    };
    managed.refresh().await.context("issuing the webhook certificate from the shared CA")?;
    let tls = ReloadingServerConfig::load(CertFiles::in_dir(managed.cert.dir(), false), ALPN)?;
    tokio::spawn(managed.keep_fresh(tls.clone(), interval, shutdown.clone()));
    Ok(tls)
}

/// One replica's view of the self-managed CA and the webhook certificate it serves.
struct SelfManaged {
    client: Client,
    ca_secret: CaSecret,
    cert: SelfManagedCert,
}

impl SelfManaged {
    /// Reads (or makes, or rotates) the shared CA; re-issues the serving certificate when the
    /// CA changed or the certificate is due; patches the CA bundle where it differs.
    async fn refresh(&mut self) -> anyhow::Result<()> {
        let now = jiff::Timestamp::now();
        let shared = self.ca_secret.current(now).await?;
        if self.cert.refresh(&shared, now)? {
            tracing::info!(not_after = ?self.cert.not_after(), "issued the webhook certificate from the shared CA");
        }
        patch_ca_bundle(&self.client, shared.bundle_pem.as_bytes()).await
    }

    async fn keep_fresh(
        mut self,
        tls: Arc<ReloadingServerConfig>,
        interval: std::time::Duration,
        shutdown: CancellationToken,
    ) {
        let mut ticks = Ticks::after(interval, shutdown);
        while ticks.next().await {
            // What the last refresh wrote is served one interval later: by then the apiserver
            // has seen the caBundle that refresh patched (a rotated CA is in it beside the old).
            match tls.reload_if_changed() {
                Ok(true) => tracing::info!("serving the re-issued webhook certificate"),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, "the re-issued certificate is unusable; serving the previous one")
                }
            }
            if let Err(error) = self.refresh().await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "refreshing the self-managed webhook certificate failed; serving the current one"
                );
            }
        }
    }
}

/// Patches the `ca.crt` file's content into the configurations whenever it changes.
async fn keep_ca_bundle_from(
    client: Client,
    ca_file: PathBuf,
    interval: std::time::Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = Ticks::now(interval, shutdown);
    while ticks.next().await {
        let result = match std::fs::read(&ca_file) {
            Ok(ca) => patch_ca_bundle(&client, &ca).await,
            Err(error) => {
                Err(anyhow::Error::new(error).context(format!("reading {}", ca_file.display())))
            }
        };
        if let Err(error) = result {
            tracing::warn!(
                error = format!("{error:#}"),
                "keeping the webhook caBundle current failed"
            );
        }
    }
}

/// Writes `ca` into every webhook of both configurations (those that exist) whose caBundle
/// differs; a configuration already carrying it is not written.
pub async fn patch_ca_bundle(client: &Client, ca: &[u8]) -> anyhow::Result<()> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    patch_one(mutating, ca, |c| {
        c.webhooks.iter().flatten().map(|w| w.client_config.ca_bundle.as_ref()).collect()
    })
    .await?;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    patch_one(validating, ca, |c| {
        c.webhooks.iter().flatten().map(|w| w.client_config.ca_bundle.as_ref()).collect()
    })
    .await
}

/// Sets `ca` as the caBundle of each of the configuration's webhooks (`bundles(..)` lists
/// their current ones).
async fn patch_one<K>(
    api: Api<K>,
    ca: &[u8],
    bundles: for<'a> fn(&'a K) -> Vec<Option<&'a ByteString>>,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let kind = std::any::type_name::<K>().rsplit("::").next().unwrap_or("configuration");
    let Some(config) =
        api.get_opt(CONFIGURATION_NAME).await.with_context(|| format!("reading the {kind}"))?
    else {
        return Ok(());
    };
    let current = bundles(&config);
    if current.iter().all(|b| b.is_some_and(|b| b.0 == ca)) {
        return Ok(());
    }
    let bundle = ByteString(ca.to_vec());
    let patch = json_patch::Patch(
        (0..current.len())
            .map(|i| {
                PatchOperation::Add(AddOperation {
                    path: PointerBuf::from_tokens([
                        "webhooks".to_owned(),
                        i.to_string(),
                        "clientConfig".to_owned(),
                        "caBundle".to_owned(),
                    ]),
                    value: json!(bundle),
                })
            })
            .collect(),
    );
    api.patch(CONFIGURATION_NAME, &FieldManager::Certificates.patch(), &Patch::Json::<()>(patch))
        .await
        .with_context(|| format!("patching the caBundle of the {kind}"))?;
    tracing::info!(kind, "patched the webhook caBundle");
    Ok(())
}
