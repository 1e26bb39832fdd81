//! A machine's OS answering an SSH shutdown: a real sshd, started at every boot inside the
//! machine (its network namespace and cgroup, so a power cut or a shutdown ends it as it ends
//! the kubelet), that lets one client key in and runs what `systemctl poweroff` does here: it
//! tells the machine's power button line (a FIFO the test process reads) to shut the machine
//! down, and returns. A command that names `suspend` (`systemctl suspend`, `sudo systemctl
//! suspend`) asks the line to suspend the machine instead and exits 0 at once, as systemctl
//! returns before the kernel sleeps; the line's reader suspends it a moment later
//! ([`SUSPEND_DELAY`]). Any other command powers off. The host key is made once, so it stays the
//! same across boots, as a real machine's does.
//!
//! A test may have the next command lost ([`LOSE_NEXT`]): the link drops right after the command
//! is sent and the machine never acts on it. The session then hangs with no exit status, as it
//! does when a switch drops the link mid-session, and the line tells the test process to cut the
//! machine's cable.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};

use crate::power_peers::require;

/// The port the machine's sshd listens on, at the machine's address.
pub const SSH_PORT: u16 = 22;
/// What the line carries for a shutdown.
const POWEROFF: &str = "poweroff";
/// What the line carries for a suspend to RAM, and what a command names to ask for one.
const SUSPEND: &str = "suspend";
/// How long after `systemctl suspend` returns the machine sleeps: time for the SSH session to
/// close cleanly, as systemd-sleep runs after the unit has started.
pub(crate) const SUSPEND_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
/// What the line carries for a command that is lost with the link.
const LOST: &str = "lost";
/// The file in the sshd's directory that makes the next command a lost one (removed by it).
pub(crate) const LOSE_NEXT: &str = "lose-next";

/// The sshd of a machine: its configuration and keys on the machine's disk.
pub(crate) struct SshServer {
    dir: PathBuf,
}

impl SshServer {
    /// Writes the host key, the authorized client key and sshd's configuration under `dir`,
    /// listening on `address`; `button` is the FIFO a shutdown is written to.
    pub(crate) fn install(
        dir: &Path,
        address: std::net::Ipv4Addr,
        authorized_key: &str,
        button: &Path,
    ) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let host_key = dir.join("ssh_host_ed25519_key");
        let output = Command::new(require("ssh-keygen")?)
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&host_key)
            .output()
            .context("running ssh-keygen for the machine's host key")?;
        if !output.status.success() {
            bail!("ssh-keygen failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        let authorized = dir.join("authorized_keys");
        fs::write(&authorized, format!("{}\n", authorized_key.trim()))
            .with_context(|| format!("writing {}", authorized.display()))?;
        fs::set_permissions(&authorized, fs::Permissions::from_mode(0o600))?;
        let command = dir.join("command.sh");
        let lose_next = dir.join(LOSE_NEXT);
        fs::write(
            &command,
            format!(
                "if [ -e {lose} ]; then rm -f {lose}; echo {LOST} > {button}; exec sleep 600; fi\n\
                 case \"$SSH_ORIGINAL_COMMAND\" in\n\
                 *{SUSPEND}*) echo {SUSPEND} > {button}; exit 0 ;;\n\
                 esac\n\
                 echo {POWEROFF} > {button}\n",
                lose = lose_next.display(),
                button = button.display(),
            ),
        )
        .with_context(|| format!("writing {}", command.display()))?;
        // sshd needs its privilege-separation directory on the host.
        fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
        let config = format!(
            "ListenAddress {address}:{SSH_PORT}\nHostKey {host}\nPidFile {pid}\n\
             AuthorizedKeysFile {authorized}\nPubkeyAuthentication yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             StrictModes no\nPermitRootLogin prohibit-password\n\
             ForceCommand /bin/sh {command}\n",
            host = host_key.display(),
            pid = dir.join("sshd.pid").display(),
            authorized = authorized.display(),
            command = command.display(),
        );
        fs::write(dir.join("sshd_config"), config).context("writing sshd_config")?;
        Ok(Self { dir: dir.to_owned() })
    }

    /// Where its configuration and keys are.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The host key as a known-hosts line holds it: `ssh-ed25519 AAAA…`.
    pub(crate) fn host_key(&self) -> Result<String> {
        let path = self.dir.join("ssh_host_ed25519_key.pub");
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(text.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
    }

    /// The program and arguments that run sshd in the foreground with this configuration.
    pub(crate) fn command(&self) -> Result<(PathBuf, Vec<String>)> {
        let config = self.dir.join("sshd_config").display().to_string();
        Ok((require("sshd")?, vec!["-D".into(), "-e".into(), "-f".into(), config]))
    }
}

/// The line from the OS to the power supply: a FIFO read by a thread of the test process, which
/// presses "shut down" when a `poweroff` arrives, "suspend" for a `suspend`, and calls `lost` for
/// a lost command. Dropping it stops the thread.
pub(crate) struct PowerButtonLine {
    fifo: PathBuf,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PowerButtonLine {
    pub(crate) fn start(
        fifo: &Path,
        shut_down: impl Fn() + Send + 'static,
        suspend: impl Fn() + Send + 'static,
        lost: impl Fn() + Send + 'static,
    ) -> Result<Self> {
        let status = Command::new("mkfifo")
            .arg("-m")
            .arg("0600")
            .arg(fifo)
            .status()
            .context("running mkfifo")?;
        if !status.success() {
            bail!("mkfifo {} failed: {status}", fifo.display());
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let thread = {
            let (fifo, stopping) = (fifo.to_owned(), stopping.clone());
            std::thread::Builder::new()
                .name("power-button".into())
                .spawn(move || {
                    // Each open waits for a writer; the text is whole once it closes.
                    while !stopping.load(Ordering::SeqCst) {
                        let Ok(text) = fs::read_to_string(&fifo) else { return };
                        if stopping.load(Ordering::SeqCst) {
                            return;
                        }
                        if text.contains(POWEROFF) {
                            shut_down();
                        } else if text.contains(SUSPEND) {
                            suspend();
                        } else if text.contains(LOST) {
                            lost();
                        }
                    }
                })
                .context("starting the power button line")?
        };
        Ok(Self { fifo: fifo.to_owned(), stopping, thread: Some(thread) })
    }
}

impl Drop for PowerButtonLine {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // The reader waits in open until a writer comes: be that writer, with nothing to say.
        let unblock =
            fs::OpenOptions::new().write(true).custom_flags(nix::libc::O_NONBLOCK).open(&self.fifo);
        if let Ok(mut writer) = unblock {
            let _ = writer.flush();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
