//! rancher's local-path-provisioner, the real one, making node-local PersistentVolumes on the
//! harness's machines: the storage of pods whose volume lives on one machine.
//!
//! It runs as a process beside the control plane with the admin kubeconfig, as cluster-autoscaler
//! does, rather than as the Deployment of its own manifest: kwok machines run no containers. What
//! it needs in the cluster (its namespace, the ServiceAccount of its helper pods, the ConfigMap it
//! reads and the `local-path` StorageClass) is tests/harness/manifests/local-path.yaml, applied
//! with kubectl.
//!
//! How it provisions (v0.0.30): for a claim of a `WaitForFirstConsumer` class it waits for the
//! scheduler to pick the machine of the claim's first pod (the claim's
//! `volume.kubernetes.io/selected-node`), creates a helper pod bound to that machine
//! (`spec.nodeName`, every taint tolerated) from the ConfigMap's `helperPod.yaml`, running its
//! `setup` script with the directory in `VOL_DIR`, polls the pod every second until it has
//! succeeded (for `cmdTimeoutSeconds`, 120 s by default), deletes it and creates the
//! PersistentVolume: a `hostPath` under the machine's path from `config.json`, its node affinity
//! `kubernetes.io/hostname In [<the machine's hostname label>]`. kwok completes the helper pod by
//! its label (tests/harness/kwok/stages.yaml, `pod-complete-labelled`). Out of a cluster it also
//! logs an error after each helper pod ("unable to retrieve in cluster config"): it reads the
//! pod's log with an in-cluster client only, and provisions all the same.
//!
//! Built by tests/harness/build-binaries.sh in the `storage` profile (and every larger one, so
//! the build beside the suites makes it) from its published Go module (tests/harness/go/local-path-provisioner/). Cold build (modules already downloaded, no
//! Go build cache for it) on the 2-core development machine, sharing the CPU with a cold cargo
//! build of the tests: 77 s.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use crate::binaries::{Profile, binaries};
use crate::control_plane::{Components, ControlPlane};
use crate::process::Process;
use crate::{progress, wait};

/// The StorageClass whose claims the provisioner serves.
pub const STORAGE_CLASS: &str = "local-path";
/// The provisioner's name, the StorageClass's `provisioner`.
pub const PROVISIONER_NAME: &str = "rancher.io/local-path";
/// Where its ConfigMap lives and its helper pods run.
pub const NAMESPACE: &str = "local-path-storage";
const MANIFEST: &str = "tests/harness/manifests/local-path.yaml";
const CONFIG_MAP: &str = "local-path-config";
const SERVICE_ACCOUNT: &str = "local-path-provisioner-service-account";
/// What the provisioner library logs once its informers have synced: from then on it acts on
/// every claim of its class.
const STARTED: &str = "Started provisioner controller";

/// The running provisioner. Dropping it kills and reaps the process.
pub struct LocalPathProvisioner {
    process: Process,
}

impl LocalPathProvisioner {
    /// Fails, with the end of its log, if the provisioner has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.process.ensure_running()
    }

    /// Its log (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

/// Applies tests/harness/manifests/local-path.yaml to `plane`, starts the provisioner against it
/// (its log `local-path-provisioner.log` in `logs_dir`) and returns once its controller runs.
/// Also starts the components it works with: the scheduler picks each volume's machine, and
/// kube-controller-manager binds the claim to the volume. One per control plane: two would both
/// provision every claim.
pub async fn start_local_path_provisioner(
    plane: &ControlPlane,
    logs_dir: &Path,
) -> Result<LocalPathProvisioner> {
    plane.ensure(Components::CLUSTER).await?;
    let program = binaries(Profile::Storage).await?.path("local-path-provisioner");
    let started = Instant::now();
    apply_manifest(plane).await?;
    let args = vec![
        "--debug".to_string(),
        "start".into(),
        format!("--kubeconfig={}", plane.kubeconfig_path().display()),
        format!("--namespace={NAMESPACE}"),
        // config.json, setup, teardown and helperPod.yaml are read from this ConfigMap.
        format!("--configmap-name={CONFIG_MAP}"),
        format!("--provisioner-name={PROVISIONER_NAME}"),
        format!("--service-account-name={SERVICE_ACCOUNT}"),
    ];
    let process = Process::spawn(
        "local-path-provisioner",
        &program,
        &args,
        &plane.dir().join("home").join("local-path-provisioner"),
        logs_dir,
    )?;
    let log = process.log_path().to_path_buf();
    wait::until(
        "local-path-provisioner to start its controller",
        wait::start_timeout(),
        || process.ensure_running(),
        || async {
            let text = std::fs::read_to_string(&log)
                .with_context(|| format!("reading {}", log.display()))?;
            ensure!(text.contains(STARTED), "no \"{STARTED}\" in its log yet");
            Ok(())
        },
    )
    .await
    .with_context(|| process.log_tail(30))?;
    progress(&format!("local-path-provisioner started in {:.1?}", started.elapsed()));
    Ok(LocalPathProvisioner { process })
}

/// `kubectl apply -f` of the manifest: its objects name their own namespaces.
async fn apply_manifest(plane: &ControlPlane) -> Result<()> {
    let manifest = crate::repo_path(MANIFEST).to_string_lossy().into_owned();
    let output = plane.kubectl(["apply", "-f", manifest.as_str()]).await?;
    ensure!(
        output.status.success(),
        "kubectl apply -f {manifest}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
