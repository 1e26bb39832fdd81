//! A real machine's cgroups: one subtree per machine below the root of every cgroup hierarchy
//! of the host, so that a power cut finds (and kills) every process of the machine and no other:
//! `<root>/containerd` (containerd and the shims it starts), `<root>/kubelet`, and
//! `<root>/pods`, the kubelet's cgroupRoot, where runc puts the containers. The processes are
//! tracked in the freezer hierarchy (see board.sh); the pods' subtree exists in every hierarchy
//! because the kubelet checks its cgroupRoot there.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

const CGROUP_FS: &str = "/sys/fs/cgroup";

pub(crate) struct Cgroups {
    /// Below each hierarchy's root, starting with `/`.
    root: String,
}

impl Cgroups {
    pub fn new(root: String) -> Self {
        Self { root }
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// The group of one of the machine's services (`containerd`, `kubelet`) or its `pods`.
    pub fn group(&self, name: &str) -> String {
        format!("{}/{name}", self.root)
    }

    /// Creates the machine's subtree, with a group for each of `services` beside its own.
    /// Idempotent: called at every power-on.
    pub fn create(&self, services: &[&str]) -> Result<()> {
        let hierarchies = hierarchies()?;
        if !hierarchies.iter().any(|h| h.ends_with("freezer")) {
            bail!(
                "no cgroup v1 freezer hierarchy at {CGROUP_FS}/freezer: the real-machine tier \
                 needs one to power a machine off (cgroup v2-only hosts are not supported yet)"
            );
        }
        for hierarchy in &hierarchies {
            let pods = hierarchy.join(self.group("pods").trim_start_matches('/'));
            fs::create_dir_all(&pods)
                .with_context(|| format!("creating cgroup {}", pods.display()))?;
        }
        for service in ["containerd", "kubelet", "sshd"].iter().chain(services) {
            let path = self.procs_file(service);
            let dir = path.parent().context("a cgroup.procs path has a parent")?;
            fs::create_dir_all(dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
        }
        Ok(())
    }

    /// The `cgroup.procs` a service's first process writes itself into.
    pub fn procs_file(&self, service: &str) -> PathBuf {
        PathBuf::from(CGROUP_FS)
            .join("freezer")
            .join(self.group(service).trim_start_matches('/'))
            .join("cgroup.procs")
    }
}

impl Cgroups {
    /// The processes of the machine: every pid in its freezer subtree.
    pub fn processes(&self) -> Vec<u32> {
        processes_below(self.freezer(&self.root))
    }

    /// The processes of one of its groups (`kubelet`, say) and the groups below it.
    pub fn processes_in(&self, name: &str) -> Vec<u32> {
        processes_below(self.freezer(&self.group(name)))
    }

    /// What the machine's freezer reads (`THAWED`, `FREEZING` or `FROZEN`), for all of it.
    pub fn freezer_state(&self) -> Result<String> {
        let path = self.freezer(&self.root).join("freezer.state");
        let state =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(state.trim().to_owned())
    }

    fn freezer(&self, group: &str) -> PathBuf {
        PathBuf::from(CGROUP_FS).join("freezer").join(group.trim_start_matches('/'))
    }
}

/// Every pid in the freezer cgroup `root` and below it.
fn processes_below(root: PathBuf) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut pending = vec![root];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            }
        }
        // A cgroup removed meanwhile has no processes.
        let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) else { continue };
        pids.extend(procs.lines().filter_map(|line| line.trim().parse::<u32>().ok()));
    }
    pids
}

/// Every mounted cgroup hierarchy (v1 controllers, name=systemd, the unified v2 one).
fn hierarchies() -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(CGROUP_FS).with_context(|| format!("reading {CGROUP_FS}"))?;
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.with_context(|| format!("reading {CGROUP_FS}"))?.path();
        if path.join("cgroup.procs").is_file() {
            found.push(path);
        }
    }
    Ok(found)
}
