//! Finds (and on first use builds) the upstream programs the control plane runs, through
//! tests/harness/build-binaries.sh. The script is the one place that knows how to build them;
//! it honours HOMELAB_TEST_ASSETS (prebuilt binaries) and HOMELAB_TEST_CACHE, rebuilds only what
//! is missing or stale, and prints the binary directory on its last stdout line.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tokio::sync::OnceCell;

use crate::progress;

/// Which programs a test binary needs, named as build-binaries.sh names its profiles. Up to
/// [`Profile::E2e`] each is the one before it plus a few programs; [`Profile::Machines`] branches
/// off at [`Profile::Autoscaler`], so that a real-machine suite never waits on a build of
/// Prometheus or cert-manager, which it does not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// etcd, kube-apiserver, kubectl.
    Integration,
    /// Integration plus kube-controller-manager, kube-scheduler and kwok.
    Cluster,
    /// Cluster plus cluster-autoscaler (built from its source): what `make demo` runs.
    Autoscaler,
    /// Autoscaler plus rancher's local-path-provisioner ([`crate::local_path`]).
    Storage,
    /// Storage plus helm, crane, prometheus, promtool and cert-manager's controller and
    /// cainjector (built from their source).
    E2e,
    /// Autoscaler plus what the real machines of [`crate::machine`] run: kubelet, containerd,
    /// containerd-shim-runc-v2, ctr, runc, the CNI plugins (in `cni/`), our pause program and
    /// the image made of it (`pause-image.tar`).
    Machines,
}

impl Profile {
    fn name(self) -> &'static str {
        match self {
            Profile::Integration => "integration",
            Profile::Cluster => "cluster",
            Profile::Autoscaler => "autoscaler",
            Profile::Storage => "storage",
            Profile::E2e => "e2e",
            Profile::Machines => "machines",
        }
    }

    /// What the profile runs.
    fn programs(self) -> Vec<&'static str> {
        let mut programs = vec!["etcd", "kube-apiserver", "kubectl"];
        if self != Profile::Integration {
            programs.extend(["kube-controller-manager", "kube-scheduler", "kwok"]);
        }
        if !matches!(self, Profile::Integration | Profile::Cluster) {
            programs.push("cluster-autoscaler");
        }
        if matches!(self, Profile::Storage | Profile::E2e) {
            programs.push("local-path-provisioner");
        }
        if self == Profile::E2e {
            programs.extend([
                "helm",
                "crane",
                "prometheus",
                "promtool",
                "cert-manager-controller",
                "cert-manager-cainjector",
                "longhorn-crds.yaml",
            ]);
        }
        if self == Profile::Machines {
            programs.extend([
                "kubelet",
                "sample-device-plugin",
                "containerd",
                "containerd-shim-runc-v2",
                "ctr",
                "runc",
                "cni/bridge",
                "cni/host-local",
                "cni/loopback",
                "pause",
                "pause-image.tar",
            ]);
        }
        programs
    }

    /// Whether this profile's programs include every one of `other`'s.
    fn holds(self, other: Profile) -> bool {
        let mine = self.programs();
        other.programs().iter().all(|program| mine.contains(program))
    }
}

/// A directory holding the programs of a profile.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The path of `program` (for example "kube-apiserver").
    pub fn path(&self, program: &str) -> PathBuf {
        self.dir.join(program)
    }
}

static INTEGRATION: OnceCell<Binaries> = OnceCell::const_new();
static CLUSTER: OnceCell<Binaries> = OnceCell::const_new();
static AUTOSCALER: OnceCell<Binaries> = OnceCell::const_new();
static STORAGE: OnceCell<Binaries> = OnceCell::const_new();
static E2E: OnceCell<Binaries> = OnceCell::const_new();
static MACHINES: OnceCell<Binaries> = OnceCell::const_new();

/// Set by `make test-fast`: the run is the fast tier, which must start no Go build and no
/// control plane, so a suite that asks for one there is misfiled and fails at once.
pub const NO_CONTROL_PLANE_ENV: &str = "HOMELAB_TEST_NO_CONTROL_PLANE";

/// The programs of `profile`, running build-binaries.sh at most once per profile and process.
pub async fn binaries(profile: Profile) -> Result<Binaries> {
    if std::env::var_os(NO_CONTROL_PLANE_ENV).is_some() {
        bail!(
            "this test needs the {} programs, but {NO_CONTROL_PLANE_ENV} is set (the fast tier): \
             run it with `cargo test` or `make test`, or take it out of the fast tier",
            profile.name()
        );
    }
    // Once a profile that holds this one's programs ran, use it.
    let larger = PROFILES.iter().filter(|p| **p != profile && p.holds(profile));
    if let Some(built) = larger.filter_map(|p| cell_of(*p).get()).next() {
        return Ok(built.clone());
    }
    let cell = cell_of(profile);
    cell.get_or_try_init(|| run_build_script(profile)).await.cloned()
}

/// Every profile.
const PROFILES: [Profile; 6] = [
    Profile::Integration,
    Profile::Cluster,
    Profile::Autoscaler,
    Profile::Storage,
    Profile::E2e,
    Profile::Machines,
];

fn cell_of(profile: Profile) -> &'static OnceCell<Binaries> {
    match profile {
        Profile::Integration => &INTEGRATION,
        Profile::Cluster => &CLUSTER,
        Profile::Autoscaler => &AUTOSCALER,
        Profile::Storage => &STORAGE,
        Profile::E2e => &E2E,
        Profile::Machines => &MACHINES,
    }
}

fn script() -> PathBuf {
    crate::repo_path("tests/harness/build-binaries.sh")
}

async fn run_build_script(profile: Profile) -> Result<Binaries> {
    let script = script();
    progress(&format!(
        "locating the {} binaries with {} (the first run builds them from source, which takes \
         many minutes; its progress follows)",
        profile.name(),
        script.display()
    ));
    let started = Instant::now();
    // stderr is inherited so the script's progress shows live; stdout carries the answer.
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .arg(profile.name())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} {} failed ({}); its messages are above in the test output",
            script.display(),
            profile.name(),
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .map(|line| PathBuf::from(line.trim()))
        .with_context(|| format!("{} printed no binary directory", script.display()))?;
    for program in profile.programs() {
        let path = dir.join(program);
        if !path.is_file() {
            bail!("{} reported {} but {program} is not there", script.display(), dir.display());
        }
    }
    progress(&format!(
        "{} binaries ready in {} after {:.1?}",
        profile.name(),
        dir.display(),
        started.elapsed()
    ));
    Ok(Binaries { dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiles_hold_what_their_suites_reuse() {
        assert!(Profile::E2e.holds(Profile::Storage));
        assert!(Profile::Storage.holds(Profile::Autoscaler));
        assert!(Profile::Machines.holds(Profile::Autoscaler));
        assert!(Profile::Autoscaler.holds(Profile::Cluster));
        // A real-machine suite never waits on Prometheus or cert-manager, nor an e2e suite on a
        // kubelet.
        assert!(!Profile::Machines.holds(Profile::E2e));
        assert!(!Profile::Machines.holds(Profile::Storage));
        assert!(!Profile::E2e.holds(Profile::Machines));
    }
}
