//! What runs on a powered real machine: containerd, then the kubelet, each in its network
//! namespace and cgroup, through the harness's [`Process`] (log files, SIGKILLed if the test
//! process ends). Both stay in one mount namespace (`nsenter --net`, not `ip netns exec`,
//! which gives every process a mount namespace of its own): the kubelet mounts pods' volumes
//! that containerd must see to hand them to the containers.
//!
//! That namespace is the host's, except on a machine with a device: there a first process,
//! `init`, makes a mount namespace with the disk's device-plugins directory bound over
//! /var/lib/kubelet/device-plugins and holds it, and containerd, the kubelet and the device
//! plugin enter it. The kubelet and its device plugins meet at that fixed path only, so on a
//! host of many machines this is how a plugin reaches its own machine's kubelet. `init` is in
//! the machine's cgroup: a power-off ends it, and with it the namespace and every mount made in
//! it, as a reboot clears a machine's mounts.

use std::path::Path;
use std::process::Output;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::Board;
use crate::process::Process;
use crate::{progress, wait};

/// Joins the cgroup whose `cgroup.procs` is `$1`, then runs `$5…` in network namespace `$2`
/// and mount namespace `$4` (the host's when empty) with `$3` in front of PATH. exec all the
/// way, so the harness's wrapper kills the program itself.
const ENTER_SCRIPT: &str = r#"
echo $$ > "$1" || exit 1
export PATH="$3:$PATH"
into=()
[ -z "$2" ] || into+=(--net="$2")
[ -z "$4" ] || into+=(--mount="$4" --wd="$PWD")
[ ${#into[@]} -gt 0 ] || exec "${@:5}"
exec nsenter "${into[@]}" -- "${@:5}"
"#;

/// Run by `init` in its new mount namespace: binds the machine's device-plugins directory (`$1`)
/// over the kubelet's, says its pid (in `$2`, once the table is ready), and holds the namespace.
const INIT_SCRIPT: &str = r#"
mkdir -p /var/lib/kubelet/device-plugins &&
  mount --bind "$1" /var/lib/kubelet/device-plugins &&
  echo $$ > "$2.new" && mv "$2.new" "$2" || exit 1
exec sleep infinity
"#;

/// The name (cgroup and log) of the process holding a machine's own mount table.
const INIT: &str = "init";
/// The name of the sample device plugin's service, and of its program.
const DEVICE_PLUGIN: &str = "sample-device-plugin";

/// The running services of a powered machine.
pub(crate) struct Os {
    // Field order is drop order: the services, then the kubelet before its runtime, then the
    // mount table they ran in.
    _services: Vec<Process>,
    kubelet: Process,
    sshd: Option<Process>,
    containerd: Process,
    _init: Option<Process>,
}

impl Os {
    /// Boots: on a machine with a device its own mount table first; containerd, the pause image
    /// imported (a no-op once it is on the disk), the kubelet, then the services.
    pub async fn boot(board: &Board, boot: u32) -> Result<Self> {
        let started = Instant::now();
        let device = board.spec.sample_device_plugin;
        let mut services: Vec<&str> = board.spec.services.iter().map(|s| s.name.as_str()).collect();
        if device {
            services.extend([INIT, DEVICE_PLUGIN]);
        }
        board.cgroups.create(&services)?;
        let logs = board.disk.logs().join(format!("boot-{boot}"));
        let init = if device { Some(own_mount_table(board, &logs).await?) } else { None };
        let mounts = match &init {
            Some((_, namespace)) => namespace.as_str(),
            None => "",
        };
        let containerd = spawn(
            board,
            &logs,
            "containerd",
            mounts,
            vec!["--config".into(), board.disk.containerd_config().display().to_string()],
        )?;
        wait::until(
            &format!("containerd of machine {} to serve", board.name),
            wait::start_timeout(),
            || containerd.ensure_running(),
            || async { check(board.ctr(&["version"]).await?) },
        )
        .await?;
        let image = board.bin.path("pause-image.tar");
        let image = image.display().to_string();
        check(board.ctr(&["images", "import", &image]).await?)
            .with_context(|| format!("importing {image} into machine {}", board.name))?;
        let sshd = match &board.ssh {
            Some(ssh) => {
                let (program, args) = ssh.command()?;
                Some(spawn_program(board, &logs, "sshd", "", &program, args)?)
            }
            None => None,
        };
        let kubelet = super::kubelet_start::start(
            board.own_kubelet_socket().as_deref(),
            || spawn(board, &logs, "kubelet", mounts, board.kubelet_args()),
            |kubelet| kubelet.ensure_running().is_ok(),
        )
        .await?;
        let mut services = Vec::new();
        for service in &board.spec.services {
            services.push(spawn_in(board, &logs, service, mounts)?);
        }
        if device {
            services.push(spawn(board, &logs, DEVICE_PLUGIN, mounts, Vec::new())?);
        }
        progress(&format!(
            "machine {} booted (containerd and kubelet up) in {:.1?}",
            board.name,
            started.elapsed()
        ));
        let _init = init.map(|(process, _)| process);
        Ok(Self { _services: services, kubelet, sshd, containerd, _init })
    }

    pub fn kubelet(&self) -> &Process {
        &self.kubelet
    }

    pub fn containerd(&self) -> &Process {
        &self.containerd
    }

    /// Fails if containerd, the kubelet or sshd has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.containerd.ensure_running()?;
        if let Some(sshd) = &self.sshd {
            sshd.ensure_running()?;
        }
        self.kubelet.ensure_running()
    }
}

/// Starts `init`, which makes the machine's own mount table and holds it (see the module's
/// header): the process, and the path of the namespace to enter.
async fn own_mount_table(board: &Board, logs: &Path) -> Result<(Process, String)> {
    let pid_file = board.disk.mount_table_pid();
    match std::fs::remove_file(&pid_file) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(error).with_context(|| format!("removing {}", pid_file.display()));
        }
        _ => {}
    }
    let args = ["--mount", "--propagation", "slave", "--", "bash", "-c", INIT_SCRIPT, INIT]
        .into_iter()
        .map(str::to_owned)
        .chain([board.disk.device_plugins().display().to_string(), pid_file.display().to_string()])
        .collect();
    let init = enter(board, logs, INIT, "", "", Path::new("unshare"), args)?;
    let pid = wait::until(
        &format!("the mount table of machine {}", board.name),
        wait::start_timeout(),
        || init.ensure_running(),
        || async {
            let pid = std::fs::read_to_string(&pid_file).context("no pid yet")?;
            pid.trim().parse::<u32>().with_context(|| format!("pid {pid:?}"))
        },
    )
    .await?;
    Ok((init, format!("/proc/{pid}/ns/mnt")))
}

/// Runs the program `service` names as the machine's `service`, in mount namespace `mounts`.
fn spawn(
    board: &Board,
    logs: &Path,
    service: &str,
    mounts: &str,
    args: Vec<String>,
) -> Result<Process> {
    spawn_program(board, logs, service, mounts, &board.bin.path(service), args)
}

/// Runs `program` as the machine's `service`: in its cgroup and network namespace, and mount
/// namespace `mounts` (the host's when empty).
fn spawn_program(
    board: &Board,
    logs: &Path,
    service: &str,
    mounts: &str,
    program: &Path,
    args: Vec<String>,
) -> Result<Process> {
    let netns = super::netns::path(&board.netns).display().to_string();
    enter(board, logs, service, &netns, mounts, program, args)
}

/// Starts one of the spec's services: in its cgroup, its network namespace, and mount
/// namespace `mounts`.
fn spawn_in(board: &Board, logs: &Path, service: &super::Service, mounts: &str) -> Result<Process> {
    let netns = if service.host_network {
        String::new()
    } else {
        super::netns::path(&board.netns).display().to_string()
    };
    enter(board, logs, &service.name, &netns, mounts, &service.program, service.args.clone())
}

fn enter(
    board: &Board,
    logs: &Path,
    service: &str,
    netns: &str,
    mounts: &str,
    program: &Path,
    args: Vec<String>,
) -> Result<Process> {
    let mut all = vec![
        "-c".to_owned(),
        ENTER_SCRIPT.to_owned(),
        format!("enter-{service}"),
        board.cgroups.procs_file(service).display().to_string(),
        netns.to_owned(),
        // containerd finds its shim on PATH; the shim runs runc by the configured path.
        board.bin.path("containerd").parent().map(|p| p.display().to_string()).unwrap_or_default(),
        mounts.to_owned(),
        program.display().to_string(),
    ];
    all.extend(args);
    Process::spawn(service, Path::new("bash"), &all, &board.disk.home(), logs)
}

/// Ok if the command succeeded, else its stderr.
pub(crate) fn check(output: Output) -> Result<()> {
    if output.status.success() {
        return Ok(());
    }
    bail!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim())
}
