//! Real machines: the tier below kwok's fake nodes. A machine is a network namespace cabled to a
//! test-owned lan (network.rs), a directory for a disk (disk.rs), a cgroup subtree (cgroups.rs),
//! and, while it has power (firmware.rs), a real containerd and kubelet running in them (os.rs)
//! that register a real Node and run real containers (runc) of a locally built image.
//!
//! ```ignore
//! let plane = ControlPlane::shared(Components::CLUSTER).await?;
//! let lan = Lan::start(plane.api_address())?;
//! let machine = Machine::create(&plane, &lan, MachineSpec::named("m1")).await?;
//! machine.power_on().await?;            // the kubelet registers Node m1
//! machine.link().cut()?;                // the cable is pulled: Node m1 goes Unknown
//! machine.power_cut().await?;           // every process of the machine is SIGKILLed
//! ```
//!
//! A machine that is on may also be suspended to RAM (ACPI S3), by `systemctl suspend` over SSH
//! or [`Machine::suspend`]: its processes are frozen (the cgroup v1 freezer) and its `eth0` is
//! down, so its address answers nothing, not even ARP, while its TCP connections survive. It
//! stays `On` (its BMC says On, its plug meters a standby draw). A magic packet for its card, or
//! its power button ([`Machine::power_on`]), resumes it: the same processes run on, nothing is
//! restarted. A real card in WoL mode keeps its PHY up and filters frames in hardware; here the
//! filter listens at the switch side of the cable while the OS side is down (standby.rs), so
//! only a packet to the lan's broadcast address wakes a sleeping machine.
//!
//! Dropping a machine kills whatever still runs in it and removes its namespace, cgroups, mounts
//! and directory; a janitor does the same if the test process dies first (process.rs). Needs
//! root, network namespaces and a cgroup v1 freezer hierarchy; without them it fails, saying so.
//!
//! What the machines share with the host, because the kubelet does not let it be configured:
//! it sets the kernel-wide sysctls vm.overcommit_memory=1, kernel.panic=10 and
//! kernel.panic_on_oops=1 at start (as on any kubelet's host; they are not per namespace; the
//! host's own values are put back whenever a machine goes, see host_sysctls.rs), and
//! its device-plugin socket is /var/lib/kubelet/device-plugins/kubelet.sock (so kubelets start
//! one at a time, kubelet_start.rs), except on a machine with a device
//! ([`MachineSpec::sample_device_plugin`]), which has a mount table of its own with that
//! directory on its disk (os.rs). containerd's CNI
//! results cache (/var/lib/cni) and shim sockets (/run/containerd/s) are the host's too. The
//! cgroup freezer that suspends a machine is its subtree's own, so suspending one machine leaves
//! the host and the other machines running.
//!
//! Programs: `build-binaries.sh machines` (Profile::Machines: the `autoscaler` profile and
//! these), built on first use. Cold build times on the 2-core dev machine, with another Go build
//! running beside them: kubelet 192 s (Go's cache already held the modules kube-apiserver shares
//! with it), containerd + shim + ctr 141 s, runc 28 s (10 s more for seccomp), the CNI plugins
//! 13 s, pause under 1 s; Kubernetes' sample device plugin, built with the kubelet from the same
//! module, 23 s more on its own.

pub mod bmc;
mod cgroups;
mod disk;
mod firmware;
mod host_sysctls;
mod kubelet_start;
pub mod netns;
mod network;
mod os;
pub mod plug;
mod relay;
mod ssh;
mod standby;
mod wake_on_lan;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Taint;
use tokio::sync::Mutex;

pub use bmc::Bmc;
pub use disk::PAUSE_IMAGE;
pub use firmware::PowerState;
pub use network::{API_PORT, Lan, Link};
pub use plug::Plug;
pub use ssh::SSH_PORT;
pub use wake_on_lan::{WAKE_ON_LAN_PORT, is_magic_packet};

use crate::binaries::{Binaries, Profile, binaries};
use crate::control_plane::ControlPlane;
use crate::process::{Janitor, file_tail};
use crate::progress;
use cgroups::Cgroups;
use disk::Disk;
use firmware::Firmware;
use os::Os;
use ssh::{PowerButtonLine, SshServer};
use wake_on_lan::WakeListener;

/// The power wiring, run by bash (see its header).
const BOARD_SCRIPT: &str = include_str!("board.sh");

/// What a machine is: its name (the Node's), and what its kubelet registers the Node with.
#[derive(Clone, Debug, Default)]
pub struct MachineSpec {
    pub name: String,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    /// `--node-labels`.
    pub labels: BTreeMap<String, String>,
    /// A public key (`ssh-ed25519 AAAA…`) that may log in to the machine's sshd, whose every
    /// command powers the machine off, except one naming `suspend`, which suspends it; no sshd
    /// without it.
    pub ssh_authorized_key: Option<String>,
    /// What the firmware does when mains comes back after it was cut (a smart plug's relay
    /// closing): boot, as with the BIOS setting "restore on AC power loss: power on", or stay
    /// off until something presses "on". Without a plug mains is never cut.
    pub power_on_with_ac: bool,
    /// Programs the machine's OS starts at every boot, after containerd and the kubelet (as
    /// units ordered after them): a storage daemon that lives and dies with the machine.
    pub services: Vec<Service>,
    /// The machine has a device: at every boot, once its kubelet serves its device-plugin
    /// socket, it runs Kubernetes' sample device plugin, which registers two devices of
    /// [`SAMPLE_DEVICE_RESOURCE`] with the kubelet. Such a machine has a mount table of its own
    /// (os.rs), as a real machine does, so that its /var/lib/kubelet/device-plugins is its own.
    pub sample_device_plugin: bool,
}

/// The extended resource Kubernetes' sample device plugin advertises.
pub const SAMPLE_DEVICE_RESOURCE: &str = "example.com/resource";
/// The devices it advertises; its allocation mounts `/tmp/<id>` into the container.
pub const SAMPLE_DEVICES: [&str; 2] = ["Dev-1", "Dev-2"];

/// A program a machine runs while it is on, in its cgroup: killed with the machine's power, and
/// started again at the next boot. Its log is the machine's `logs/boot-<n>/<name>.log`.
#[derive(Clone, Debug)]
pub struct Service {
    /// Names its cgroup and its log (not `containerd`, `kubelet`, `sshd` or `pods`).
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// In the host's network namespace (as a pod with `hostNetwork` on a machine that shares
    /// its host's network), not the machine's: for a daemon whose peers are on the host's
    /// loopback.
    pub host_network: bool,
}

impl MachineSpec {
    pub fn named(name: &str) -> Self {
        Self { name: name.to_owned(), ..Self::default() }
    }
}

/// A real machine. Cheap to clone (a handle); the machine goes when the last handle does.
#[derive(Clone)]
pub struct Machine {
    inner: Arc<Inner>,
}

struct Inner {
    // Field order is drop order: the services, then the janitor's teardown of the rest.
    firmware: Mutex<Firmware>,
    /// The network card's Wake-on-LAN listener and the OS's line to the power supply: they
    /// press the machine's buttons from threads of their own, holding only a weak handle.
    wake: std::sync::Mutex<Option<WakeListener>>,
    button: std::sync::Mutex<Option<PowerButtonLine>>,
    /// How many magic packets for its card the machine has received.
    wakes: AtomicU32,
    /// How many suspends its OS was asked for, and whether they fail to take.
    suspend_requests: AtomicU32,
    refuse_suspend: AtomicBool,
    /// Whether a suspend asked for hangs half-way ([`Machine::hang_on_suspend`]).
    hang_on_suspend: AtomicBool,
    /// How many times it woke from a suspend.
    resumes: AtomicU32,
    /// The firmware's state and mains as of its last completed transition, read without the
    /// lock, so a BMC or a plug answers at once while the machine boots or shuts down.
    on_now: AtomicBool,
    suspended_now: AtomicBool,
    mains_now: AtomicBool,
    /// Every change of the power state or of its sleep, in order.
    history: std::sync::Mutex<Vec<PowerEvent>>,
    /// When an SSH command was lost with the link ([`Machine::lose_next_ssh_command`]).
    lost_at: std::sync::Mutex<Option<Instant>>,
    board: Board,
    link: Link,
    _janitor: Janitor,
}

/// Everything about a machine that does not change while it runs.
pub(crate) struct Board {
    name: String,
    address: Ipv4Addr,
    netns: String,
    /// Its host number on the lan (the last octet of its address).
    host: u8,
    cgroups: Cgroups,
    disk: Disk,
    bin: Binaries,
    spec: MachineSpec,
    /// Its sshd, when the spec lets a key in.
    ssh: Option<SshServer>,
    /// How many times it was powered on; boot n logs into `logs/boot-<n>/`.
    boots: AtomicU32,
}

impl Machine {
    /// Builds (on first use) the machine programs, then creates a machine, powered off, cabled
    /// to `lan`, its kubelet set up to join `plane`.
    pub async fn create(plane: &ControlPlane, lan: &Lan, spec: MachineSpec) -> Result<Self> {
        if !nix::unistd::geteuid().is_root() {
            bail!("the real-machine tier needs root (network namespaces, cgroups, mounts)");
        }
        let bin = binaries(Profile::Machines).await?;
        host_sysctls::record()?;
        let name = spec.name.clone();
        let dir = tempfile::Builder::new()
            .prefix(&format!("homelab-machine-{name}-"))
            .tempdir()
            .context("creating the machine's directory")?
            .keep();
        let netns = format!("{}-{name}", lan.id());
        let cgroups = Cgroups::new(format!("/{}-{name}", lan.id()));
        // First, so that whatever is made next is removed even if the rest fails.
        let janitor = Janitor::run(
            BOARD_SCRIPT,
            &["teardown".as_ref(), cgroups.root().as_ref(), netns.as_ref(), dir.as_os_str()],
        )?;
        let (address, link) = lan.cable(&netns)?;
        let disk = Disk { dir };
        let host = address.octets()[3];
        let pki = plane.pki();
        disk.write(
            &disk::Spec {
                address,
                pod_subnet: format!("{}/24", Lan::pod_subnet(host)),
                cgroup: cgroups.root(),
            },
            &bin,
            &pki.ca_cert,
            &pki.admin_cert,
            &pki.admin_key,
        )?;
        let button = disk.dir.join("power-button");
        let ssh = match &spec.ssh_authorized_key {
            Some(key) => Some(SshServer::install(&disk.dir.join("ssh"), address, key, &button)?),
            None => None,
        };
        let board = Board {
            name,
            address,
            netns,
            host,
            cgroups,
            disk,
            bin,
            spec,
            ssh,
            boots: AtomicU32::new(0),
        };
        let machine = Self {
            inner: Arc::new(Inner {
                firmware: Mutex::new(Firmware::default()),
                wake: std::sync::Mutex::new(None),
                button: std::sync::Mutex::new(None),
                wakes: AtomicU32::new(0),
                suspend_requests: AtomicU32::new(0),
                refuse_suspend: AtomicBool::new(false),
                hang_on_suspend: AtomicBool::new(false),
                resumes: AtomicU32::new(0),
                on_now: AtomicBool::new(false),
                suspended_now: AtomicBool::new(false),
                mains_now: AtomicBool::new(true),
                history: std::sync::Mutex::new(Vec::new()),
                lost_at: std::sync::Mutex::new(None),
                board,
                link,
                _janitor: janitor,
            }),
        };
        machine.wire_buttons(&button)?;
        Ok(machine)
    }

    /// Starts the Wake-on-LAN listeners (the card's, and its standby side on the lan) and, with
    /// an sshd, the power button line. Each presses a button on a task of the runtime that
    /// created the machine.
    fn wire_buttons(&self, button: &Path) -> Result<()> {
        let runtime = tokio::runtime::Handle::current();
        let weak = Arc::downgrade(&self.inner);
        let press = |button| press(weak.clone(), runtime.clone(), button);
        let mac = Lan::mac(self.inner.board.host);
        let wake = WakeListener::start(self.netns(), mac, press(Button::On))?;
        *self.inner.wake.lock().map_err(|_| anyhow::anyhow!("wake lock poisoned"))? = Some(wake);
        self.inner.link.listen_in_standby(press(Button::Standby));
        if self.inner.board.ssh.is_some() {
            let cut = weak.clone();
            let lost = move || {
                let Some(inner) = cut.upgrade() else { return };
                if let Err(error) = inner.link.cut() {
                    eprintln!("machine {}: cutting the link: {error:#}", inner.board.name);
                }
                if let Ok(mut at) = inner.lost_at.lock() {
                    *at = Some(Instant::now());
                }
            };
            let line =
                PowerButtonLine::start(button, press(Button::Off), press(Button::Suspend), lost)?;
            *self.inner.button.lock().map_err(|_| anyhow::anyhow!("button lock poisoned"))? =
                Some(line);
        }
        Ok(())
    }

    /// The next SSH command is lost: the link drops right after it is sent (the test process
    /// cuts the cable) and the machine never acts on it. [`Self::ssh_command_lost_at`] says when.
    pub fn lose_next_ssh_command(&self) -> Result<()> {
        let Some(ssh) = &self.inner.board.ssh else { bail!("machine {} has no sshd", self.name()) };
        let marker = ssh.dir().join(ssh::LOSE_NEXT);
        std::fs::write(&marker, "").with_context(|| format!("writing {}", marker.display()))
    }

    /// When an SSH command was lost with the link, if one was.
    pub fn ssh_command_lost_at(&self) -> Option<Instant> {
        self.inner.lost_at.lock().ok().and_then(|at| *at)
    }

    /// Its network card's MAC address (what a Wake-on-LAN packet names).
    pub fn mac(&self) -> String {
        Lan::mac(self.inner.board.host).map(|b| format!("{b:02x}")).join(":")
    }

    /// How many magic packets for its card it has received (each pressed "on").
    pub fn wakes(&self) -> u32 {
        self.inner.wakes.load(Ordering::SeqCst)
    }

    /// How many times it has been powered on.
    pub fn boots(&self) -> u32 {
        self.inner.board.boots.load(Ordering::SeqCst)
    }

    /// Whether it is on and suspended to RAM, as of its last completed transition.
    pub fn suspended(&self) -> bool {
        self.inner.suspended_now.load(Ordering::SeqCst)
    }

    /// How many suspends its OS was asked for over SSH, taken or not.
    pub fn suspend_requests(&self) -> u32 {
        self.inner.suspend_requests.load(Ordering::SeqCst)
    }

    /// How many times it woke from a suspend.
    pub fn resumes(&self) -> u32 {
        self.inner.resumes.load(Ordering::SeqCst)
    }

    /// From now on a suspend asked for over SSH does not take (or, with `false`, does again):
    /// the command still succeeds, but the machine stays awake, as on firmware without S3 or
    /// under a systemd inhibitor. [`Self::suspend`] is not affected.
    pub fn refuse_suspend(&self, refuse: bool) {
        self.inner.refuse_suspend.store(refuse, Ordering::SeqCst);
    }

    /// From now on a suspend asked for over SSH hangs half-way (or, with `false`, does not), as
    /// when a device's driver blocks the kernel's suspend: its processes frozen and its network
    /// down, but never asleep. It answers nothing and draws its running power; no magic packet
    /// wakes it and only a power cut ends it. [`Self::suspend`] is not affected.
    pub fn hang_on_suspend(&self, hang: bool) {
        self.inner.hang_on_suspend.store(hang, Ordering::SeqCst);
    }

    /// Hangs on its way to sleep at once (see [`Self::hang_on_suspend`]).
    async fn hang(&self) -> Result<()> {
        let mut firmware = self.inner.firmware.lock().await;
        firmware.hang(&self.inner.board).await
    }

    /// The kubelet's pid while the machine is on (the same across a suspend).
    pub fn kubelet_pid(&self) -> Option<u32> {
        self.inner.board.cgroups.processes_in("kubelet").first().copied()
    }

    /// What the machine's cgroup freezer reads: `FROZEN` while it is suspended, else `THAWED`.
    pub fn freezer_state(&self) -> Result<String> {
        self.inner.board.cgroups.freezer_state()
    }

    /// Its sshd's host key as `ssh-ed25519 AAAA…`, when it has an sshd.
    pub fn ssh_host_key(&self) -> Result<String> {
        let ssh = self.inner.board.ssh.as_ref();
        ssh.with_context(|| format!("machine {} has no sshd", self.name()))?.host_key()
    }

    /// The machine's (and its Node's) name.
    pub fn name(&self) -> &str {
        &self.inner.board.name
    }

    /// Its address on the lan (the Node's InternalIP).
    pub fn address(&self) -> Ipv4Addr {
        self.inner.board.address
    }

    /// Its network namespace, as `ip netns` names it.
    pub fn netns(&self) -> &str {
        &self.inner.board.netns
    }

    /// Its cable to the lan.
    pub fn link(&self) -> &Link {
        &self.inner.link
    }

    /// The machine's directory (its disk and logs).
    pub fn dir(&self) -> PathBuf {
        self.inner.board.disk.dir.clone()
    }

    pub async fn power_state(&self) -> PowerState {
        self.inner.firmware.lock().await.state()
    }

    /// The power state as of the firmware's last completed transition, without waiting for one
    /// in progress (a machine shutting down is On until it is Off): what its BMC reports.
    pub fn power_state_now(&self) -> PowerState {
        if self.inner.on_now.load(Ordering::SeqCst) { PowerState::On } else { PowerState::Off }
    }

    /// Whether the wall feeds its power supply (always, without a plug).
    pub fn has_mains(&self) -> bool {
        self.inner.mains_now.load(Ordering::SeqCst)
    }

    /// Every change of its power state so far, in order.
    pub fn power_history(&self) -> Vec<PowerEvent> {
        self.inner.history.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// Powers on (boots containerd and the kubelet); nothing if it is on; a suspended machine
    /// resumes, as its power button wakes it. Returns once both run; the Node registers (or
    /// comes back Ready) in the seconds after.
    pub async fn power_on(&self) -> Result<()> {
        let mut firmware = self.inner.firmware.lock().await;
        if firmware.suspended() {
            let done = firmware.resume(&self.inner.board).await;
            self.inner.record(&firmware, PowerCause::Resume);
            return done;
        }
        let done = firmware.power_on(&self.inner.board).await;
        self.inner.record(&firmware, PowerCause::Boot);
        done
    }

    /// Suspends to RAM at once (what `systemctl suspend` over SSH does a moment after it
    /// returns): its processes frozen, its `eth0` down. Nothing if it is off or suspended.
    pub async fn suspend(&self) -> Result<()> {
        let mut firmware = self.inner.firmware.lock().await;
        let done = firmware.suspend(&self.inner.board).await;
        self.inner.record(&firmware, PowerCause::Suspend);
        done
    }

    /// Wakes from a suspend, as a magic packet does: `eth0` up, the same processes thawed.
    /// Nothing unless it is suspended.
    pub async fn resume(&self) -> Result<()> {
        let mut firmware = self.inner.firmware.lock().await;
        let done = firmware.resume(&self.inner.board).await;
        self.inner.record(&firmware, PowerCause::Resume);
        done
    }

    /// Pulls the plug: every process of the machine is SIGKILLed at once.
    pub async fn power_cut(&self) -> Result<()> {
        let mut firmware = self.inner.firmware.lock().await;
        let done = firmware.power_cut(&self.inner.board).await;
        self.inner.record(&firmware, PowerCause::PowerCut);
        done
    }

    /// Shuts down in order (SIGTERM, then SIGKILL after a while). Nothing while it is
    /// suspended: no OS is awake to act on it.
    pub async fn shutdown(&self) -> Result<()> {
        let mut firmware = self.inner.firmware.lock().await;
        let done = firmware.shutdown(&self.inner.board).await;
        self.inner.record(&firmware, PowerCause::Shutdown);
        done
    }

    /// Mains comes and goes with a plug's relay ([`plug`]): lost, the machine is cut at once
    /// and nothing can turn it on; back, it boots if `power_on_with_ac`, else stays off.
    pub(crate) async fn set_mains(&self, on: bool) -> Result<()> {
        // First, so that the plug's meter and the BMC see it before the cut is done.
        self.inner.mains_now.store(on, Ordering::SeqCst);
        let mut firmware = self.inner.firmware.lock().await;
        let board = &self.inner.board;
        let (done, cause) = if on {
            (firmware.mains_back(board).await, PowerCause::MainsBack)
        } else {
            (firmware.mains_lost(board).await, PowerCause::MainsLost)
        };
        self.inner.mains_now.store(firmware.mains(), Ordering::SeqCst);
        self.inner.record(&firmware, cause);
        done
    }

    /// Whether the kubelet process is running (false when off).
    pub async fn kubelet_running(&self) -> bool {
        let firmware = self.inner.firmware.lock().await;
        firmware.os().is_some_and(|os| os.kubelet().exit_status().is_none())
    }

    /// Fails, with the end of its log, if containerd or the kubelet has exited while the
    /// machine is on; a machine that is off is fine.
    pub async fn ensure_running(&self) -> Result<()> {
        match self.inner.firmware.lock().await.os() {
            Some(os) => os.ensure_running(),
            None => Ok(()),
        }
    }

    /// The pids of every process of the machine (its services, shims and containers): none
    /// once it is off.
    pub fn processes(&self) -> Vec<u32> {
        self.inner.board.cgroups.processes()
    }

    /// SIGKILLs the kubelet and starts it again, as a crashed service is restarted; containerd
    /// and the containers keep running. Fails if the machine is off or suspended.
    pub async fn restart_kubelet(&self) -> Result<()> {
        let firmware = self.inner.firmware.lock().await;
        let os = self.awake_os(&firmware)?;
        let kubelet = os.kubelet();
        kubelet_start::start(
            self.inner.board.own_kubelet_socket().as_deref(),
            || kubelet.restart(),
            |()| kubelet.ensure_running().is_ok(),
        )
        .await
    }

    /// Stops containerd as a person upgrading it by hand does (`systemctl stop containerd`):
    /// its containers keep running, and the kubelet, still running, reports the node NotReady
    /// ("container runtime is down"). Fails if the machine is off or suspended.
    pub async fn stop_containerd(&self) -> Result<()> {
        let firmware = self.inner.firmware.lock().await;
        let os = self.awake_os(&firmware)?;
        os.containerd().stop()
    }

    /// Starts containerd again after [`Machine::stop_containerd`] and waits until it serves.
    pub async fn start_containerd(&self) -> Result<()> {
        let firmware = self.inner.firmware.lock().await;
        let os = self.awake_os(&firmware)?;
        let containerd = os.containerd();
        containerd.restart()?;
        let board = &self.inner.board;
        crate::wait::until(
            &format!("containerd of machine {} to serve again", self.name()),
            crate::wait::start_timeout(),
            || containerd.ensure_running(),
            || async { os::check(board.ctr(&["version"]).await?) },
        )
        .await
    }

    /// The running OS, for an operation on its services: a frozen process cannot be stopped
    /// (its wrapper would wait for it for ever).
    fn awake_os<'a>(&self, firmware: &'a Firmware) -> Result<&'a Os> {
        if firmware.suspended() {
            bail!("machine {} is suspended", self.name());
        }
        firmware.os().with_context(|| format!("machine {} is off", self.name()))
    }

    /// Runs `ctr ARGS…` against the machine's containerd, in its `k8s.io` namespace (the
    /// kubelet's). A failing ctr is not an error here: the caller reads the output.
    pub async fn ctr(&self, args: &[&str]) -> Result<Output> {
        self.inner.board.ctr(args).await
    }

    /// The last `lines` lines of the logs of the machine's latest boot (on or off).
    pub fn log_tails(&self, lines: usize) -> String {
        let boots = self.inner.board.boots.load(Ordering::SeqCst);
        let logs = self.inner.board.disk.logs().join(format!("boot-{boots}"));
        ["containerd", "kubelet"]
            .into_iter()
            .map(|service| {
                let path = logs.join(format!("{service}.log"));
                format!(
                    "\n===== machine {} {service} ({}) =====\n{}\n",
                    self.name(),
                    path.display(),
                    file_tail(&path, lines)
                )
            })
            .collect()
    }
}

/// Why a machine's power state changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerCause {
    Boot,
    Shutdown,
    PowerCut,
    MainsLost,
    MainsBack,
    /// Suspended to RAM (the state stays On).
    Suspend,
    /// Woken from a suspend (On).
    Resume,
}

/// One change of a machine's power state, or of its sleep: when, to what, and what did it.
#[derive(Clone, Copy, Debug)]
pub struct PowerEvent {
    pub at: Instant,
    pub state: PowerState,
    pub cause: PowerCause,
}

impl Inner {
    /// Mirrors the firmware's state and sleep, and logs them when they changed.
    fn record(&self, firmware: &Firmware, cause: PowerCause) {
        let state = firmware.state();
        let on = state == PowerState::On;
        let asleep = firmware.suspended();
        let was_on = self.on_now.swap(on, Ordering::SeqCst);
        let was_asleep = self.suspended_now.swap(asleep, Ordering::SeqCst);
        if on && was_asleep && !asleep {
            self.resumes.fetch_add(1, Ordering::SeqCst);
        }
        if (was_on != on || was_asleep != asleep)
            && let Ok(mut history) = self.history.lock()
        {
            history.push(PowerEvent { at: Instant::now(), state, cause });
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Runs before the fields go. A frozen process dies only once thawed, and the wrappers
        // of its services, dropped next, wait for it: a frozen machine (suspended, or hung on its
        // way to sleep) loses its power first.
        if self.firmware.get_mut().frozen() {
            let cut = std::process::Command::new("bash")
                .arg("-c")
                .arg(BOARD_SCRIPT)
                .arg("board")
                .arg("cut")
                .arg(self.board.cgroups.root())
                .status();
            if let Err(error) = cut {
                eprintln!("machine {}: cutting a frozen machine: {error}", self.board.name);
            }
        }
        // The kubelet sets these only when it starts.
        host_sysctls::restore();
    }
}

/// Which of a machine's buttons a listener or its OS presses.
#[derive(Clone, Copy)]
enum Button {
    /// A magic packet heard on its own `eth0`.
    On,
    /// A magic packet heard by its card's standby side on the lan: only while it sleeps (awake
    /// or off, its `eth0` hears the packet itself).
    Standby,
    /// `systemctl poweroff`.
    Off,
    /// `systemctl suspend`: taken after [`ssh::SUSPEND_DELAY`], unless the machine refuses.
    Suspend,
}

/// Presses `button` of the machine `weak` names, on a task of `runtime`. The handle goes with
/// the task, so the machine's last handle never drops on the listener's own thread.
fn press(
    weak: Weak<Inner>,
    runtime: tokio::runtime::Handle,
    button: Button,
) -> impl Fn() + Send + Sync + 'static {
    move || {
        let Some(inner) = weak.upgrade() else { return };
        let acts = match button {
            Button::On => {
                inner.wakes.fetch_add(1, Ordering::SeqCst);
                true
            }
            Button::Standby => {
                let asleep = inner.suspended_now.load(Ordering::SeqCst);
                if asleep {
                    inner.wakes.fetch_add(1, Ordering::SeqCst);
                }
                asleep
            }
            Button::Off => true,
            Button::Suspend => {
                inner.suspend_requests.fetch_add(1, Ordering::SeqCst);
                !inner.refuse_suspend.load(Ordering::SeqCst)
            }
        };
        let machine = Machine { inner };
        runtime.spawn(async move {
            let pressed = match button {
                _ if !acts => {
                    if matches!(button, Button::Suspend) {
                        progress(&format!("machine {}: the suspend did not take", machine.name()));
                    }
                    Ok(())
                }
                Button::On | Button::Standby => machine.power_on().await,
                Button::Off => machine.shutdown().await,
                Button::Suspend => {
                    tokio::time::sleep(ssh::SUSPEND_DELAY).await;
                    if machine.inner.hang_on_suspend.load(Ordering::SeqCst) {
                        machine.hang().await
                    } else {
                        machine.suspend().await
                    }
                }
            };
            if let Err(error) = pressed {
                eprintln!("machine {}: {error:#}", machine.name());
            }
        });
    }
}

/// Prints a machine's log tails if the test panics while it is alive (see
/// [`Machine::logs_on_failure`]).
pub struct MachineLogs(Machine);

impl Machine {
    /// A guard that prints the machine's containerd and kubelet log tails if the test panics
    /// while it is alive: `let _machine_logs = machine.logs_on_failure();`
    pub fn logs_on_failure(&self) -> MachineLogs {
        MachineLogs(self.clone())
    }
}

impl Drop for MachineLogs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("machine logs at the failure:{}", self.0.log_tails(60));
        }
    }
}

impl Board {
    /// Runs a board.sh command (cut, signal, wait-empty).
    async fn run(&self, command: &str, args: &[&str]) -> Result<()> {
        let output = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(BOARD_SCRIPT)
            .arg("board")
            .arg(command)
            .args(args)
            .output()
            .await
            .with_context(|| format!("running board.sh {command}"))?;
        os::check(output).with_context(|| format!("board.sh {command} {}", args.join(" ")))
    }

    async fn ctr(&self, args: &[&str]) -> Result<Output> {
        tokio::process::Command::new(self.bin.path("ctr"))
            .arg("--address")
            .arg(self.disk.containerd_socket())
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .await
            .with_context(|| format!("running ctr {}", args.join(" ")))
    }

    /// The kubelet's device-plugin socket as seen from the host, on a machine with a mount table
    /// of its own (os.rs); none where it is the host's fixed one.
    fn own_kubelet_socket(&self) -> Option<PathBuf> {
        self.spec.sample_device_plugin.then(|| self.disk.device_plugins().join("kubelet.sock"))
    }

    fn kubelet_args(&self) -> Vec<String> {
        let taints: Vec<String> = self
            .spec
            .taints
            .iter()
            .map(|t| match &t.value {
                Some(value) => format!("{}={value}:{}", t.key, t.effect),
                None => format!("{}:{}", t.key, t.effect),
            })
            .collect();
        let labels: Vec<String> =
            self.spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut args = vec![
            format!("--config={}", self.disk.kubelet_config().display()),
            format!("--kubeconfig={}", self.disk.kubelet_kubeconfig().display()),
            format!("--root-dir={}", self.disk.kubelet_root().display()),
            // Its default is /var/lib/kubelet/pki whatever the root dir: machines would share it.
            format!("--cert-dir={}", self.disk.kubelet_root().join("pki").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.address),
            "--v=2".to_owned(),
        ];
        if !taints.is_empty() {
            args.push(format!("--register-with-taints={}", taints.join(",")));
        }
        if !labels.is_empty() {
            args.push(format!("--node-labels={}", labels.join(",")));
        }
        args
    }
}
