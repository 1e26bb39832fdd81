//! The real cluster-autoscaler as a process: built by tests/harness/build-binaries.sh from its
//! source, run against the harness's control plane with the admin kubeconfig, and dialing the
//! operator's externalgrpc provider over mutual TLS exactly as a user's cloud-config does. What
//! it did is read from its own outputs: its log, its `/metrics` and its status ConfigMap.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::binaries::{Profile, binaries};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use serde::Deserialize;
use tokio::process::{Child, Command};

use super::http_get;
use crate::wait::until;

/// cluster-autoscaler's `--scan-interval`: a loop starts at most this long after the last began.
pub const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// What one of its loops may take on the two-core machine under CI's load, besides the interval:
/// its reads of the apiserver, the provider's gRPC calls, the scale-up and scale-down
/// simulations. Idle, a loop takes well under a second.
pub const LOOP_ON_LOAD: Duration = Duration::from_secs(8);

/// How cluster-autoscaler is run: the flags that shorten its clocks for a test, and the
/// readiness taints it must treat as startup taints (docs/decisions.md, D13).
#[derive(Clone, Debug)]
pub struct AutoscalerSettings {
    pub startup_taints: Vec<String>,
    pub scale_down_unneeded: Duration,
    pub backoff: Duration,
    pub extra: Vec<String>,
}

impl Default for AutoscalerSettings {
    fn default() -> Self {
        Self {
            startup_taints: vec!["node.cilium.io/agent-not-ready".into()],
            scale_down_unneeded: Duration::from_secs(10),
            backoff: Duration::from_secs(15),
            extra: Vec::new(),
        }
    }
}

/// Where the operator's gRPC provider listens and the mutual-TLS files both sides use.
#[derive(Clone, Debug)]
pub struct GrpcEndpoint {
    pub port: u16,
    /// `tls.crt`, `tls.key`, `ca.crt`: one CA signs the server's and the client's certificate.
    pub cert_dir: PathBuf,
}

/// One cluster-autoscaler process (restartable), and its log across restarts.
pub struct Autoscaler {
    binary: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    log: PathBuf,
    metrics_addr: String,
    child: Option<Child>,
    runs: u32,
}

/// The program, built (once) by the harness script's autoscaler profile.
pub async fn binary() -> Result<PathBuf> {
    Ok(binaries(Profile::Autoscaler).await?.path("cluster-autoscaler"))
}

impl Autoscaler {
    /// Writes the cloud-config and starts cluster-autoscaler; returns once its health check
    /// answers.
    pub async fn start(
        kubeconfig: &Path,
        grpc: &GrpcEndpoint,
        dir: &Path,
        settings: &AutoscalerSettings,
    ) -> Result<Autoscaler> {
        let binary = binary().await?;
        std::fs::create_dir_all(dir)?;
        let cloud_config = dir.join("cloud-config.yaml");
        let certs = &grpc.cert_dir;
        std::fs::write(
            &cloud_config,
            format!(
                "address: \"localhost:{}\"\ncert: {}\nkey: {}\ncacert: {}\ngrpc_timeout: 10s\n",
                grpc.port,
                certs.join("tls.crt").display(),
                certs.join("tls.key").display(),
                certs.join("ca.crt").display(),
            ),
        )?;
        let metrics_port = crate::ports::free_port()?;
        let metrics_addr = format!("127.0.0.1:{metrics_port}");
        let secs = |d: Duration| format!("{}s", d.as_secs());
        let mut args = vec![
            "--cloud-provider=externalgrpc".to_string(),
            format!("--cloud-config={}", cloud_config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            format!("--address={metrics_addr}"),
            "--namespace=kube-system".into(),
            "--v=4".into(),
            format!("--scan-interval={}", secs(SCAN_INTERVAL)),
            "--new-pod-scale-up-delay=0s".into(),
            "--max-node-provision-time=3m".into(),
            format!("--scale-down-unneeded-time={}", secs(settings.scale_down_unneeded)),
            format!("--scale-down-unready-time={}", secs(settings.scale_down_unneeded)),
            "--scale-down-delay-after-add=5s".into(),
            "--scale-down-delay-after-delete=0s".into(),
            "--scale-down-delay-after-failure=5s".into(),
            "--unremovable-node-recheck-timeout=5s".into(),
            "--max-graceful-termination-sec=10".into(),
            "--node-delete-delay-after-taint=0s".into(),
            format!("--initial-node-group-backoff-duration={}", secs(settings.backoff)),
            format!("--max-node-group-backoff-duration={}", secs(settings.backoff * 2)),
            "--skip-nodes-with-local-storage=false".into(),
            "--skip-nodes-with-system-pods=false".into(),
        ];
        args.extend(settings.startup_taints.iter().map(|t| format!("--startup-taint={t}")));
        args.extend(settings.extra.iter().cloned());
        let mut ca = Autoscaler {
            binary,
            args,
            kubeconfig: kubeconfig.to_path_buf(),
            log: dir.join("cluster-autoscaler.log"),
            metrics_addr,
            child: None,
            runs: 0,
        };
        ca.spawn().await?;
        Ok(ca)
    }

    async fn spawn(&mut self) -> Result<()> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let err = out.try_clone()?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.runs += 1;
        // Healthy once its /health-check answers; an early exit fails at once with its log.
        let child = std::sync::Mutex::new(child);
        let exited = || {
            let mut child = child.lock().map_err(|_| anyhow::anyhow!("the process lock"))?;
            match child.try_wait()? {
                Some(status) => {
                    bail!("cluster-autoscaler exited ({status}):\n{}", self.log_tail(30))
                }
                None => Ok(()),
            }
        };
        let metrics_addr = self.metrics_addr.clone();
        until("cluster-autoscaler's /health-check", crate::wait::start_timeout(), exited, || {
            let addr = metrics_addr.clone();
            async move { http_get(&addr, "/health-check").await.map(|_| ()) }
        })
        .await
        .with_context(|| self.log_tail(30))?;
        let child = child.into_inner().map_err(|_| anyhow::anyhow!("the process lock"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await.context("killing cluster-autoscaler")?;
        }
        Ok(())
    }

    /// Starts it again after [`Autoscaler::kill`], with the same flags.
    pub async fn start_again(&mut self) -> Result<()> {
        self.spawn().await
    }

    /// Kills it and starts it again with the same flags: a crash and a restart by its Deployment.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill().await?;
        self.spawn().await
    }

    /// How many times it was started.
    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// Its whole log, across restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::file_tail(&self.log, lines)
    }

    /// The sum of a metric's samples on `/metrics` (0 when absent), e.g.
    /// `cluster_autoscaler_scaled_up_nodes_total`.
    pub async fn metric(&self, name: &str) -> Result<f64> {
        self.metric_where(name, "").await
    }

    /// Every sample line of metric `name`, as cluster-autoscaler exports it now.
    pub async fn metric_lines(&self, name: &str) -> Result<Vec<String>> {
        let body = http_get(&self.metrics_addr, "/metrics").await?;
        Ok(body.lines().filter(|l| l.starts_with(name)).map(str::to_owned).collect())
    }

    /// As [`Autoscaler::metric`], only the series whose labels contain `labels` (for example
    /// `function="main"`).
    pub async fn metric_where(&self, name: &str, labels: &str) -> Result<f64> {
        let body = http_get(&self.metrics_addr, "/metrics").await?;
        Ok(sum_samples(&body, name, labels))
    }

    /// Its status ConfigMap `kube-system/cluster-autoscaler-status`, parsed.
    pub async fn status(client: &Client) -> Result<AutoscalerStatus> {
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
        let map = maps
            .get("cluster-autoscaler-status")
            .await
            .context("reading kube-system/cluster-autoscaler-status")?;
        let text = map.data.unwrap_or_default().remove("status").unwrap_or_default();
        // cluster-autoscaler's own YAML report, not a manifest.
        serde_saphyr::from_str(&text).with_context(|| format!("parsing CA's status:\n{text}"))
    }
}

/// The parts of cluster-autoscaler's status ConfigMap the tests read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerStatus {
    #[serde(default)]
    pub autoscaler_status: String,
    #[serde(default)]
    pub cluster_wide: ClusterWide,
    #[serde(default)]
    pub node_groups: Vec<NodeGroupStatus>,
}

/// The cluster-wide part: `health.status` is `Unhealthy` when too many nodes are unready, and
/// then cluster-autoscaler scales no group at all.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterWide {
    #[serde(default)]
    pub health: NodeGroupHealth,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupStatus {
    pub name: String,
    #[serde(default)]
    pub health: NodeGroupHealth,
    #[serde(default)]
    pub scale_up: Condition,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupHealth {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub cloud_provider_target: i64,
    #[serde(default)]
    pub node_counts: NodeCounts,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    #[serde(default)]
    pub registered: RegisteredNodes,
    #[serde(default)]
    pub unregistered: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisteredNodes {
    #[serde(default)]
    pub total: i64,
    #[serde(default)]
    pub ready: i64,
    #[serde(default)]
    pub not_started: i64,
    #[serde(default)]
    pub unready: UnreadyNodes,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadyNodes {
    #[serde(default)]
    pub total: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub backoff_info: BackoffInfo,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackoffInfo {
    #[serde(default)]
    pub error_code: String,
    #[serde(default)]
    pub error_message: String,
}

impl AutoscalerStatus {
    pub fn group(&self, name: &str) -> Option<&NodeGroupStatus> {
        self.node_groups.iter().find(|g| g.name == name)
    }
}

/// Adds up every sample of `name` in a Prometheus text exposition.
pub fn sum_samples(body: &str, name: &str, labels: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name && series.contains(labels)).then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_of_one_metric_are_added_up() {
        let body = "# HELP x\nfoo_total{a=\"1\"} 2\nfoo_total{a=\"2\"} 3\nfoo_total_other 7\nfoo_total 1\n";
        assert_eq!(super::sum_samples(body, "foo_total", ""), 6.0);
        assert_eq!(super::sum_samples(body, "foo_total", "a=\"2\""), 3.0);
        assert_eq!(super::sum_samples(body, "missing", ""), 0.0);
    }
}
