//! What runs on a powered real machine: containerd, then the kubelet, each in its network
//! namespace and cgroup, through the harness's [`Process`] (log files, SIGKILLed if the test
//! process ends). Both stay in the root mount namespace (`nsenter --net`, not `ip netns exec`,
//! which gives every process a mount namespace of its own): the kubelet mounts pods' volumes
//! that containerd must see to hand them to the containers.

use std::path::Path;
use std::process::Output;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::Board;
use crate::process::Process;
use crate::{progress, wait};

/// Joins the cgroup whose `cgroup.procs` is `$1`, then runs `$4…` in network namespace `$2`
/// (the host's when `$2` is empty) with `$3` in front of PATH. exec all the way, so the harness's
/// wrapper kills the program itself.
const ENTER_SCRIPT: &str = r#"
echo $$ > "$1" || exit 1
export PATH="$3:$PATH"
[ -n "$2" ] || exec "${@:4}"
exec nsenter --net="$2" -- "${@:4}"
"#;

/// The running services of a powered machine.
pub(crate) struct Os {
    // Field order is drop order: the services, then the kubelet before its runtime.
    _services: Vec<Process>,
    kubelet: Process,
    sshd: Option<Process>,
    containerd: Process,
}

impl Os {
    /// Boots: containerd, the pause image imported (a no-op once it is on the disk), the kubelet.
    pub async fn boot(board: &Board, boot: u32) -> Result<Self> {
        let started = Instant::now();
        let services: Vec<&str> = board.spec.services.iter().map(|s| s.name.as_str()).collect();
        board.cgroups.create(&services)?;
        let logs = board.disk.logs().join(format!("boot-{boot}"));
        let containerd = spawn(
            board,
            &logs,
            "containerd",
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
                Some(spawn_program(board, &logs, "sshd", &program, args)?)
            }
            None => None,
        };
        let kubelet = super::kubelet_start::one_at_a_time(
            || spawn(board, &logs, "kubelet", board.kubelet_args()),
            |kubelet| kubelet.ensure_running().is_ok(),
        )
        .await?;
        let mut services = Vec::new();
        for service in &board.spec.services {
            services.push(spawn_in(board, &logs, service)?);
        }
        progress(&format!(
            "machine {} booted (containerd and kubelet up) in {:.1?}",
            board.name,
            started.elapsed()
        ));
        Ok(Self { _services: services, kubelet, sshd, containerd })
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

fn spawn(board: &Board, logs: &Path, service: &str, args: Vec<String>) -> Result<Process> {
    spawn_program(board, logs, service, &board.bin.path(service), args)
}

/// Runs `program` as the machine's `service`: in its cgroup and network namespace.
fn spawn_program(
    board: &Board,
    logs: &Path,
    service: &str,
    program: &Path,
    args: Vec<String>,
) -> Result<Process> {
    let netns = super::netns::path(&board.netns).display().to_string();
    enter(board, logs, service, &netns, program, args)
}

/// Starts one of the spec's services: in its cgroup, and its network namespace.
fn spawn_in(board: &Board, logs: &Path, service: &super::Service) -> Result<Process> {
    let netns = if service.host_network {
        String::new()
    } else {
        super::netns::path(&board.netns).display().to_string()
    };
    enter(board, logs, &service.name, &netns, &service.program, service.args.clone())
}

fn enter(
    board: &Board,
    logs: &Path,
    service: &str,
    netns: &str,
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
