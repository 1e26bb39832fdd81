//! The gRPC provider's TLS, in one of three ways:
//! - from files (`--grpc-cert-dir`: a cert-manager Secret, or one the user made), re-read on
//!   rotation;
//! - self-managed (`--grpc-self-managed-tls`): every replica serves a certificate of the shared
//!   CA (the one the webhooks use) and keeps cluster-autoscaler's client certificate current in
//!   a Secret; clients must present a certificate of that CA;
//! - plaintext (neither), for a trusted network only.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::RunArgs;
use crate::clock::Ticks;
use crate::grpc::GrpcServerConfig;
use crate::tls::ca_secret::CaSecret;
use crate::tls::client_secret::{ClientCert, ClientCertSecret};
use crate::tls::self_managed::SelfManagedCert;

/// Where and how the gRPC provider serves. In the self-managed mode, issues the certificates
/// before returning and keeps them fresh until `shutdown`.
pub async fn server_config(
    client: &Client,
    args: &RunArgs,
    addr: SocketAddr,
    shutdown: &CancellationToken,
) -> anyhow::Result<GrpcServerConfig> {
    let mut config = if let Some(dir) = &args.grpc_cert_dir {
        GrpcServerConfig::mutual_tls(addr, dir.clone())
    } else if args.grpc_self_managed_tls {
        let mut managed = SelfManaged::new(client, args);
        managed
            .refresh()
            .await
            .context("issuing the gRPC certificates from the shared self-managed CA")?;
        let config = GrpcServerConfig::mutual_tls(addr, managed.cert.dir().to_path_buf());
        tokio::spawn(managed.keep_fresh(args.tls_reload_interval.into(), shutdown.clone()));
        config
    } else {
        GrpcServerConfig::plaintext(addr)
    };
    // The server re-reads the files on this interval: a certificate the self-managed loop
    // re-issued is served from the next connection on.
    config.reload_interval = args.tls_reload_interval.into();
    Ok(config)
}

/// One replica's self-managed gRPC certificates: its serving certificate, and the client
/// certificate Secret every replica keeps current.
struct SelfManaged {
    ca_secret: CaSecret,
    cert: SelfManagedCert,
    client_secret: ClientCertSecret,
}

impl SelfManaged {
    fn new(client: &Client, args: &RunArgs) -> Self {
        let secrets = Api::<Secret>::namespaced(client.clone(), &args.namespace);
        let lifetime: Duration = args.grpc_cert_lifetime.into();
        Self {
            ca_secret: CaSecret::new(
                secrets.clone(),
                args.ca_secret.clone(),
                args.ca_lifetime.into(),
            ),
            cert: SelfManagedCert::new(
                args.grpc_dns_names.clone(),
                lifetime,
                std::env::temp_dir()
                    .join(format!("homelab-autoscaler-grpc-{}", std::process::id())),
            ),
            client_secret: ClientCertSecret::new(
                secrets,
                args.grpc_client_secret.clone(),
                lifetime,
            ),
        }
    }

    /// Reads (or makes, or rotates) the shared CA; re-issues the serving certificate and the
    /// client certificate where they are stale. The files' `ca.crt` is the CA bundle: clients
    /// of the previous CA stay accepted until it expires.
    async fn refresh(&mut self) -> anyhow::Result<()> {
        let now = jiff::Timestamp::now();
        let shared = self.ca_secret.current(now).await?;
        if self.cert.refresh(&shared, now)? {
            tracing::info!(not_after = ?self.cert.not_after(), "issued the gRPC certificate from the shared CA");
        }
        if self.client_secret.ensure(&shared, now).await? == ClientCert::Issued {
            tracing::info!("cluster-autoscaler's client certificate was re-issued");
        }
        Ok(())
    }

    async fn keep_fresh(mut self, interval: Duration, shutdown: CancellationToken) {
        let mut ticks = Ticks::after(interval, shutdown);
        while ticks.next().await {
            if let Err(error) = self.refresh().await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "refreshing the self-managed gRPC certificates failed; serving the current ones"
                );
            }
        }
    }
}
