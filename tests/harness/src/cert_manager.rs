//! The real cert-manager (controller and cainjector, built by the harness script's e2e profile)
//! as processes against a control plane: its CRDs installed, no admission webhook of its own
//! (nothing is defaulted, but approval, issuance and CA injection all work).

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};

use crate::binaries::{Profile, binaries};
use crate::process::Process;
use crate::{ControlPlane, progress};

/// cert-manager running against one control plane; dropping it stops both processes.
pub struct CertManager {
    controller: Process,
    cainjector: Process,
}

impl CertManager {
    /// Installs cert-manager's CRDs on `plane` and starts the controller and cainjector.
    pub async fn start(plane: &ControlPlane) -> Result<CertManager> {
        let bin = binaries(Profile::E2e).await?;
        install_crds(plane).await?;
        let kubeconfig = plane.kubeconfig_path().display().to_string();
        let logs = plane.dir().join("cert-manager");
        let home = plane.dir().join("home");
        let controller = Process::spawn(
            "cert-manager-controller",
            &bin.path("cert-manager-controller"),
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--cluster-resource-namespace=cert-manager".into(),
                "--metrics-listen-address=127.0.0.1:0".into(),
                "--internal-healthz-listen-address=127.0.0.1:0".into(),
            ],
            &home,
            &logs,
        )?;
        // cainjector takes its configuration from $KUBECONFIG only (the wrapper clears the
        // environment, so `env` sets it).
        let cainjector = Process::spawn(
            "cert-manager-cainjector",
            Path::new("/usr/bin/env"),
            &[
                format!("KUBECONFIG={kubeconfig}"),
                bin.path("cert-manager-cainjector").display().to_string(),
                "--leader-elect=false".into(),
                "--metrics-listen-address=0".into(),
            ],
            &home,
            &logs,
        )?;
        progress("cert-manager controller and cainjector started");
        let manager = CertManager { controller, cainjector };
        manager.ensure_running()?;
        Ok(manager)
    }

    /// Fails, with the end of its log, if either process has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.controller.ensure_running()?;
        self.cainjector.ensure_running()
    }

    /// The last lines of both logs, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        format!(
            "===== cert-manager-controller =====\n{}\n===== cert-manager-cainjector =====\n{}",
            self.controller.log_tail(lines),
            self.cainjector.log_tail(lines)
        )
    }
}

/// Installs cert-manager's CRDs on `plane` and waits until they are served.
pub async fn install_crds(plane: &ControlPlane) -> Result<()> {
    let bin = binaries(Profile::E2e).await?;
    let crds = crds_dir(&bin.path("cert-manager-crds"))?;
    let out = plane.kubectl(["apply", "--server-side", "-f", &crds]).await?;
    ensure!(
        out.status.success(),
        "installing cert-manager's CRDs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = plane
        .kubectl(["wait", "--for=condition=Established", "--timeout=120s", "-f", &crds])
        .await?;
    ensure!(
        out.status.success(),
        "cert-manager's CRDs not Established: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// How long issuance may take on a loaded two-core machine (it takes about a second).
pub const ISSUE_TIMEOUT: Duration = Duration::from_secs(90);

fn crds_dir(dir: &Path) -> Result<String> {
    ensure!(
        dir.is_dir(),
        "{} is missing: tests/harness/build-binaries.sh e2e puts cert-manager's CRDs there",
        dir.display()
    );
    Ok(dir.display().to_string())
}
