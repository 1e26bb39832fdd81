//! A real machine's disk: its directory, and the configuration files of containerd, the CNI
//! plugins and the kubelet written into it. Everything a machine keeps across power cycles
//! (containerd's images and state, the kubelet's root) lives here.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

use super::network::Lan;
use crate::binaries::Binaries;

/// The sandbox image of every pod and the test workload: our pause program, imported from
/// `$bin/pause-image.tar` (tests/harness/build-binaries.sh packs it with crane).
pub const PAUSE_IMAGE: &str = "localhost/homelab/pause:1";

/// A name in the apiserver's serving certificate (pki.rs), for a client that dials its lan
/// address.
const API_SERVER_NAME: &str = "kubernetes";

/// What the configuration files need to know about the machine.
pub(crate) struct Spec<'a> {
    pub address: Ipv4Addr,
    /// The machine's pods' subnet (on its own `cni0` bridge).
    pub pod_subnet: String,
    /// Below each cgroup hierarchy's root; the kubelet's cgroupRoot is `<cgroup>/pods`.
    pub cgroup: &'a str,
}

/// The paths of a machine's disk.
pub(crate) struct Disk {
    pub dir: PathBuf,
}

impl Disk {
    pub fn containerd_config(&self) -> PathBuf {
        self.dir.join("containerd/config.toml")
    }

    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    pub fn kubelet_config(&self) -> PathBuf {
        self.dir.join("kubelet/config.json")
    }

    pub fn kubelet_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubelet/kubeconfig.json")
    }

    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet/root")
    }

    /// What a machine with a mount table of its own sees at /var/lib/kubelet/device-plugins:
    /// its kubelet's device-plugin socket and checkpoint, and its plugins' sockets.
    pub fn device_plugins(&self) -> PathBuf {
        self.dir.join("device-plugins")
    }

    /// Where the process holding the machine's own mount table writes its pid once the table
    /// is set up.
    pub fn mount_table_pid(&self) -> PathBuf {
        self.dir.join("init.pid")
    }

    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    pub fn home(&self) -> PathBuf {
        self.dir.join("home")
    }

    /// Writes every configuration file.
    pub fn write(
        &self,
        spec: &Spec,
        bin: &Binaries,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<()> {
        for sub in ["containerd", "cni", "kubelet", "device-plugins", "logs", "home"] {
            let path = self.dir.join(sub);
            fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        }
        write(&self.containerd_config(), &self.containerd_toml(bin))?;
        write(&self.dir.join("cni/10-pods.conflist"), &self.cni_conflist(spec))?;
        write(&self.kubelet_kubeconfig(), &kubeconfig(ca, cert, key)?)?;
        write(&self.kubelet_config(), &self.kubelet_configuration(spec)?)?;
        Ok(())
    }

    /// containerd's own root, state, sockets and runc root, so that machines share nothing;
    /// config version 3 (containerd 2.4 migrates it to 4 in memory, with a warning, and reads it
    /// the same). No import of /etc/containerd/conf.d: the host's settings are not the machine's.
    fn containerd_toml(&self, bin: &Binaries) -> String {
        let dir = self.dir.join("containerd");
        let d = dir.display();
        let runc = bin.path("runc");
        let cni_bin = bin.path("cni");
        let conf_dir = self.dir.join("cni");
        let conf_dir = conf_dir.display();
        format!(
            r#"version = 3
root = "{d}/root"
state = "{d}/state"
imports = []

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

# Its socket would be the host's /var/run/nri/nri.sock, shared by every machine.
[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  # Pod network namespaces under the machine's directory, not in the host's /run/netns.
  netns_mounts_under_state_dir = true
  # The dev machine's root lacks CAP_SYS_RESOURCE: a container's oom_score_adj may not go
  # below containerd's own (runc failed "failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{conf_dir}"
"#,
            runc = runc.display(),
            cni_bin = cni_bin.display(),
        )
    }

    /// bridge + host-local + loopback. No ipMasq and no portmap: there is no iptables. A pod's
    /// default route is the bridge, and the lan routes each machine's pod range back to it
    /// (network.rs), so a power Job's pod reaches the other machines without NAT.
    fn cni_conflist(&self, spec: &Spec) -> String {
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": spec.pod_subnet }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": self.dir.join("cni/ipam"),
                    },
                },
                { "type": "loopback" },
            ],
        });
        conflist.to_string()
    }

    /// A KubeletConfiguration for a machine that shares the host's kernel and cgroup v1
    /// hierarchy with the test and other machines.
    fn kubelet_configuration(&self, spec: &Spec) -> Result<String> {
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // The dev machine has cgroup v1 (hybrid); 1.35+ refuses it unless told.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            // Its own subtree: two kubelets on one hierarchy must not manage each other's pods.
            "cgroupRoot": format!("{}/pods", spec.cgroup),
            "containerRuntimeEndpoint": format!("unix://{}", self.containerd_socket().display()),
            // Nothing but the test talks to it; the apiserver's client certificate is not set up.
            "authentication": {
                "anonymous": { "enabled": true },
                "webhook": { "enabled": false },
            },
            "authorization": { "mode": "AlwaysAllow" },
            "address": spec.address.to_string(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "failSwapOn": false,
            // No iptables on the dev machine.
            "makeIPTablesUtilChains": false,
            // Pods get no DNS settings from the host.
            "resolvConf": "",
            "volumePluginDir": self.dir.join("kubelet/volume-plugins"),
            // Not the host's /var/log/pods, which every machine would share.
            "podLogsDir": self.dir.join("logs/pods"),
            // Heartbeats well inside kube-controller-manager's 20 s grace period.
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "10s",
            "nodeLeaseDurationSeconds": 10,
            // The dev machine's disk and memory are shared with the test: no evictions.
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "registerNode": true,
        });
        serde_json::to_string_pretty(&config).context("rendering the KubeletConfiguration")
    }
}

/// The kubelet's kubeconfig: the apiserver at its lan address, with the admin client
/// certificate (a system:masters user registers and updates any Node; the control plane runs no
/// Node authorizer that would restrict a system:node user).
fn kubeconfig(ca: &Path, cert: &Path, key: &Path) -> Result<String> {
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "lan",
            "cluster": {
                "server": Lan::api_url(),
                "certificate-authority": ca,
                "tls-server-name": API_SERVER_NAME,
            },
        }],
        "users": [{
            "name": "kubelet",
            "user": { "client-certificate": cert, "client-key": key },
        }],
        "contexts": [{ "name": "lan", "context": { "cluster": "lan", "user": "kubelet" } }],
        "current-context": "lan",
    });
    serde_json::to_string_pretty(&kubeconfig).context("rendering the kubelet's kubeconfig")
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
