//! `homelab-autoscaler run`: wires the parts together. Admission webhooks and the externalgrpc
//! server run in every replica (they only read, or create claims); the controllers run only on
//! the replica holding the Lease. All three read the process's one set of caches.

mod admin;
pub mod autoscaler_restart;
mod grpc_tls;
mod leader;
mod webhook_tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::api::DEFAULT_NAMESPACE;
use crate::cache::Stores;
use crate::claim::Timeouts;
use crate::clock::SystemClock;
use crate::controller::MachineSettings;
use crate::grpc::{self, GrpcServerConfig};
use crate::provider::{Provider, ProviderConfig};
use crate::webhook::{self, WebhookState};

/// Settings of a running operator.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// The namespace slots, groups and claims live in.
    #[arg(long, env = "HOMELAB_AUTOSCALER_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Where the admission webhooks listen (HTTPS).
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// A directory with tls.crt and tls.key (a cert-manager Secret mount). Without it every
    /// replica serves a certificate of the one CA in `--ca-secret` (made by the first
    /// replica) and patches that CA into the webhook configurations' caBundle.
    #[arg(long)]
    pub webhook_cert_dir: Option<PathBuf>,
    /// With `--webhook-cert-dir`: patch the directory's ca.crt into the webhook
    /// configurations' caBundle (a Secret of your own; cert-manager's cainjector does it
    /// otherwise).
    #[arg(long, requires = "webhook_cert_dir")]
    pub webhook_patch_ca_bundle: bool,
    /// The Secret (in `--namespace`) holding the self-managed CA every replica shares: the
    /// webhook's and the gRPC provider's self-managed certificates are signed by it.
    #[arg(long, alias = "webhook-ca-secret", default_value = crate::tls::ca_secret::CA_SECRET_NAME)]
    pub ca_secret: String,
    /// How long a self-managed CA is valid; it is rotated after two thirds.
    #[arg(long, alias = "webhook-ca-lifetime", default_value = "43800h")]
    pub ca_lifetime: kube::core::Duration,
    /// How long a self-managed serving certificate is valid; re-issued after two thirds.
    #[arg(long, default_value = "2160h")]
    pub webhook_cert_lifetime: kube::core::Duration,
    /// How often certificate files are re-read (and the self-managed CA re-checked).
    #[arg(long, default_value = "30s")]
    pub tls_reload_interval: kube::core::Duration,
    /// DNS names of the self-managed webhook certificate.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "homelab-autoscaler-webhook.homelab-autoscaler-system.svc"
    )]
    pub webhook_dns_names: Vec<String>,
    /// Where the externalgrpc provider listens for cluster-autoscaler. Unset: not served.
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// A directory with tls.crt, tls.key and ca.crt: serve gRPC with mutual TLS, as
    /// cluster-autoscaler's cloud-config (cert, key, cacert) dials. Unset: plaintext.
    #[arg(long, requires = "grpc_addr")]
    pub grpc_cert_dir: Option<PathBuf>,
    /// Serve gRPC with mutual TLS from the shared self-managed CA (`--ca-secret`): every
    /// replica serves a certificate of its own for `--grpc-dns-names`, and the client
    /// certificate cluster-autoscaler presents is kept in `--grpc-client-secret`.
    #[arg(long, requires = "grpc_addr", conflicts_with = "grpc_cert_dir")]
    pub grpc_self_managed_tls: bool,
    /// DNS names of the self-managed gRPC certificate (the host of cluster-autoscaler's
    /// cloud-config `address`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "homelab-autoscaler-grpc.homelab-autoscaler-system.svc"
    )]
    pub grpc_dns_names: Vec<String>,
    /// How long a self-managed gRPC certificate (server or client) is valid; re-issued after
    /// two thirds.
    #[arg(long, default_value = "2160h")]
    pub grpc_cert_lifetime: kube::core::Duration,
    /// The Secret (in `--namespace`) with cluster-autoscaler's client certificate: issued here
    /// with `--grpc-self-managed-tls`, and watched for `--cluster-autoscaler-deployment`.
    #[arg(long, default_value = crate::tls::client_secret::CLIENT_SECRET_NAME)]
    pub grpc_client_secret: String,
    /// A Deployment (in `--cluster-autoscaler-namespace`) running cluster-autoscaler with the
    /// certificate in `--grpc-client-secret`. cluster-autoscaler reads its certificate files only
    /// when it starts, so when the Secret changes (renewed, or a rotated CA) its pods are
    /// restarted.
    #[arg(long)]
    pub cluster_autoscaler_deployment: Option<String>,
    /// The namespace of `--cluster-autoscaler-deployment` (default: `--namespace`).
    #[arg(long, requires = "cluster_autoscaler_deployment")]
    pub cluster_autoscaler_namespace: Option<String>,
    /// The Secret in `--cluster-autoscaler-namespace` that cluster-autoscaler's pods mount
    /// (default: the name of `--grpc-client-secret`). Unless it is `--grpc-client-secret` itself,
    /// the operator keeps it a copy of that Secret's `tls.crt`, `tls.key` and `ca.crt`.
    #[arg(long, requires = "cluster_autoscaler_deployment")]
    pub cluster_autoscaler_client_secret: Option<String>,
    /// The node label naming a node's GPU type (GPULabel).
    #[arg(long, default_value = "accelerator")]
    pub gpu_label: String,
    /// The GPU types the pools offer (GetAvailableGPUTypes).
    #[arg(long, value_delimiter = ',')]
    pub gpu_types: Vec<String>,
    /// Where the admin endpoints listen (plain HTTP: /live, /ready).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Run the controllers without electing a leader (a single replica, or tests).
    #[arg(long)]
    pub no_leader_election: bool,
    /// The Lease the replicas elect a leader with.
    #[arg(long, default_value = "homelab-autoscaler")]
    pub lease_name: String,
    /// Users that may do what only the operator may (clear a claim's deadline). Defaults to the
    /// operator's ServiceAccount in its namespace.
    #[arg(long, value_delimiter = ',')]
    pub operator_usernames: Vec<String>,
    /// The startup Job's timeout (budget member).
    #[arg(long, default_value = "5m", value_parser = crate::api::duration::parse_go_duration)]
    pub startup_job_timeout: kube::core::Duration,
    /// How long a machine has to register its node after its startup Job (budget member).
    #[arg(long, default_value = "90s", value_parser = crate::api::duration::parse_go_duration)]
    pub registration_timeout: kube::core::Duration,
    /// How long a registered node has to clear the readiness gate (budget member).
    #[arg(long, default_value = "4m", value_parser = crate::api::duration::parse_go_duration)]
    pub readiness_gate_timeout: kube::core::Duration,
    /// How long a drain refused by PodDisruptionBudgets holds the machine on, from when the hold
    /// began, with or without a claim, before the machine is powered off anyway, its protected
    /// pods with it. Unset: the machine stays on, cordoned, for as long as a budget refuses (the
    /// slot's `Drained` condition names it).
    #[arg(long, value_parser = crate::api::duration::parse_go_duration)]
    pub drain_timeout: Option<kube::core::Duration>,
    /// How long a machine's kubelet may be silent (its node Ready `Unknown`), with no claim
    /// wanting the machine, before the slot's shutdown Job powers it off to confirm it is off.
    /// Silence alone never removes a node (a machine cut off from the API server is silent
    /// too); the node goes once a shutdown Job has succeeded.
    #[arg(long, default_value = "5m", value_parser = crate::api::duration::parse_go_duration)]
    pub off_node_grace: kube::core::Duration,
    /// kube-controller-manager's `--node-monitor-grace-period` (50s by default): a machine that
    /// is powered off keeps a Ready node this long, so a shutdown is retried only after it.
    #[arg(long, default_value = "50s", value_parser = crate::api::duration::parse_go_duration)]
    pub node_monitor_grace_period: kube::core::Duration,
    /// How long the kubelet of a machine that a ready claim holds may report NotReady (it runs
    /// and talks, but the node is not Ready: a containerd upgrade, a CNI outage) before the
    /// claim fails `MachineNotReady` and the machine is released. A pin (`keep-on`, a schedule)
    /// has no such bound. A silent kubelet or a gone Node is bounded by the boot window instead
    /// (`MachineGone`).
    #[arg(long, default_value = "1h", value_parser = crate::api::duration::parse_go_duration)]
    pub not_ready_grace: kube::core::Duration,
    /// How often a plug's meter (`spec.power.http.meter`) is read for the energy report.
    #[arg(long, default_value = "1m", value_parser = crate::api::duration::parse_go_duration)]
    pub meter_interval: kube::core::Duration,
    /// How often the built-in scaler decides for each `builtin` pool (it also wakes on new
    /// pending pods).
    #[arg(long, default_value = "10s", value_parser = crate::api::duration::parse_go_duration)]
    pub scaler_interval: kube::core::Duration,
    /// The image the power Jobs run as `homelab-autoscaler power on|off` (for slots with
    /// `spec.power`): the operator's own image. The Helm chart passes its image here.
    #[arg(long, env = "HOMELAB_POWER_IMAGE", default_value = DEFAULT_POWER_IMAGE)]
    pub power_image: String,
    /// The PriorityClass of every startup and shutdown Job's pod, so that a full cluster
    /// preempts lower-priority pods rather than leave a boot pending. Unset: none (the
    /// cluster's default priority).
    #[arg(long, value_parser = non_empty)]
    pub power_job_priority_class: Option<String>,
}

/// A flag value that must not be empty (leave the flag out instead).
fn non_empty(value: &str) -> Result<String, String> {
    if value.is_empty() {
        Err("must not be empty: leave the flag out for none".into())
    } else {
        Ok(value.to_string())
    }
}

/// The operator's published image at this version.
pub const DEFAULT_POWER_IMAGE: &str =
    concat!("ghcr.io/homecluster-dev/homelab-autoscaler:", env!("CARGO_PKG_VERSION"));

impl RunArgs {
    /// The attempt timeouts: the budget's defaults (docs/decisions.md, D9), with the configurable
    /// members replaced.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            job_timeout: self.startup_job_timeout.into(),
            registration: self.registration_timeout.into(),
            readiness_gate: self.readiness_gate_timeout.into(),
            ..Timeouts::default()
        }
    }

    /// The cluster-autoscaler Deployment kept on the current client certificate, if any.
    pub fn autoscaler_target(&self) -> Option<autoscaler_restart::Target> {
        let deployment = self.cluster_autoscaler_deployment.clone()?;
        Some(autoscaler_restart::Target {
            namespace: self
                .cluster_autoscaler_namespace
                .clone()
                .unwrap_or_else(|| self.namespace.clone()),
            deployment,
            secret: self
                .cluster_autoscaler_client_secret
                .clone()
                .unwrap_or_else(|| self.grpc_client_secret.clone()),
        })
    }

    fn operator_usernames(&self) -> Vec<String> {
        if self.operator_usernames.is_empty() {
            vec![format!("system:serviceaccount:{}:homelab-autoscaler", self.namespace)]
        } else {
            self.operator_usernames.clone()
        }
    }
}

/// Runs the operator until SIGINT/SIGTERM.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::tls::install_crypto_provider();
    let clients =
        crate::controller::Clients::infer().await.context("connecting to the Kubernetes API")?;
    let client = clients.api.clone();
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let ready = admin::Readiness::default();

    let tls = webhook_tls::serving_config(&client, &args, &shutdown).await?;
    // The one set of watches and caches the webhooks, the provider and the controllers read.
    let caches = Stores::start(&client, &args.namespace);
    let state = Arc::new(WebhookState {
        client: client.clone(),
        caches: caches.clone(),
        namespace: args.namespace.clone(),
        operator_usernames: args.operator_usernames(),
        clock: Box::new(SystemClock),
        timeouts: args.timeouts(),
    });
    let listener = tokio::net::TcpListener::bind(args.webhook_addr)
        .await
        .with_context(|| format!("binding the webhook listener on {}", args.webhook_addr))?;
    tracing::info!(addr = %args.webhook_addr, "admission webhooks listening");
    let webhooks = tokio::spawn(webhook::server::serve_https(
        listener,
        tls,
        webhook::router(state),
        shutdown.clone(),
    ));
    let admin = tokio::spawn(admin::serve(args.admin_addr, ready.clone(), shutdown.clone()));
    // One provider core serves cluster-autoscaler's calls and the built-in scaler's.
    let provider = Provider::on(caches.clone(), client.clone(), provider_config(&args));
    let grpc = match args.grpc_addr {
        Some(addr) => {
            let config = grpc_tls::server_config(&client, &args, addr, &shutdown).await?;
            Some(tokio::spawn(serve_grpc(provider.clone(), config, shutdown.clone()).await?))
        }
        None => None,
    };
    if let Some(target) = args.autoscaler_target() {
        let restart = autoscaler_restart::AutoscalerRestart::new(
            &client,
            &args.namespace,
            args.grpc_client_secret.clone(),
            target,
        );
        tokio::spawn(restart.run(args.tls_reload_interval.into(), shutdown.clone()));
    }

    let controllers = leader::run_controllers_while_leader(
        clients,
        caches,
        provider,
        &args,
        ready,
        shutdown.clone(),
    );
    let result = controllers.await;
    shutdown.cancel();
    let _ = tokio::join!(webhooks, admin);
    if let Some(grpc) = grpc {
        let _ = grpc.await;
    }
    result
}

/// The provider core's settings.
fn provider_config(args: &RunArgs) -> ProviderConfig {
    let mut config = ProviderConfig::new(args.namespace.clone());
    config.gpu_label = args.gpu_label.clone();
    config.gpu_types = args.gpu_types.clone();
    config.timeouts = args.timeouts();
    config
}

/// Waits for the provider's caches and returns the gRPC server's future.
async fn serve_grpc(
    provider: Provider,
    server: GrpcServerConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<impl std::future::Future<Output = ()> + use<>> {
    provider.wait_synced(Duration::from_secs(60)).await.context("syncing the provider's caches")?;
    Ok(async move {
        if let Err(error) = grpc::serve(provider, server, shutdown).await {
            tracing::error!(%error, "the externalgrpc server stopped");
        }
    })
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}

/// How the slot side treats machines going down.
fn machine_settings(args: &RunArgs) -> MachineSettings {
    MachineSettings {
        drain_timeout: args.drain_timeout.map(Into::into),
        off_node_grace: args.off_node_grace.into(),
        node_monitor_grace: args.node_monitor_grace_period.into(),
        not_ready_grace: args.not_ready_grace.into(),
        meter_interval: args.meter_interval.into(),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|c| c.run)
    }

    #[test]
    fn cluster_autoscaler_is_found_in_its_own_namespace() {
        let target = |args: &[&str]| parse(args).expect("parses").autoscaler_target();
        assert_eq!(target(&["--namespace=hla"]), None, "no Deployment, no restart");
        assert_eq!(
            target(&["--namespace=hla", "--cluster-autoscaler-deployment=ca"]),
            Some(autoscaler_restart::Target {
                namespace: "hla".into(),
                deployment: "ca".into(),
                secret: crate::tls::client_secret::CLIENT_SECRET_NAME.into(),
            }),
            "by default beside the operator, mounting the client Secret itself"
        );
        assert_eq!(
            target(&[
                "--namespace=hla",
                "--grpc-client-secret=client",
                "--cluster-autoscaler-deployment=ca",
                "--cluster-autoscaler-namespace=kube-system",
                "--cluster-autoscaler-client-secret=copy",
            ]),
            Some(autoscaler_restart::Target {
                namespace: "kube-system".into(),
                deployment: "ca".into(),
                secret: "copy".into(),
            })
        );
        let alone = parse(&["--cluster-autoscaler-namespace=kube-system"]);
        assert!(alone.is_err(), "a namespace without a Deployment is refused");
    }

    #[test]
    fn the_power_job_priority_class_is_a_name_or_absent() {
        let class = |args: &[&str]| parse(args).map(|a| a.power_job_priority_class);
        assert_eq!(class(&[]).expect("parses"), None);
        assert_eq!(
            class(&["--power-job-priority-class=homelab-power"]).expect("parses"),
            Some("homelab-power".into())
        );
        let empty = class(&["--power-job-priority-class="]).expect_err("refused");
        assert!(empty.to_string().contains("leave the flag out"), "{empty}");
    }
}
