//! The control plane's child processes, and how they end with the test process.
//!
//! Teardown must happen however the test process ends: tests passing, a panic, an abort,
//! Ctrl-C or SIGKILL. Rust runs no destructors for statics and has no safe `atexit`, so the
//! shared control plane cannot clean up after itself. Instead each component runs under a small
//! bash wrapper whose stdin is a pipe that only the test process holds, and never writes to.
//! When the test process ends in any way, the kernel closes the pipe; the wrapper's watcher sees
//! end-of-file and SIGKILLs the component (nothing in a throw-away cluster needs a graceful stop,
//! and the ports must be free at once). The wrapper is the component's parent, so it also reaps
//! it: no `<defunct>` etcd or kube-apiserver lingers until PID 1 gets round to it. The wrapper
//! exits with the component's status, so the test process still sees a component die.
//!
//! A janitor, built the same way, removes the control plane's directory (certificates, logs,
//! etcd data) once the test process is gone; `HOMELAB_TEST_KEEP` keeps it for a post-mortem.
//!
//! Dropping a [`Process`] or the [`Janitor`] cuts its lifeline early and waits for the wrapper
//! to finish: that is how a control plane a test owns stops when it is dropped, with its
//! components reaped (their ports free) and its directory gone by the time `drop` returns.
//!
//! Wrappers and janitor run in process groups of their own (`process_group(0)`, no `unsafe`
//! `pre_exec`), so Ctrl-C on the terminal reaches only the test process and the teardown above
//! runs in order. Rust opens every pipe and file close-on-exec, so no other child inherits a
//! pipe's write end, which would keep it open.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

/// Runs `"$@"` as a child and exits with its status; SIGKILLs it when stdin reaches EOF.
const WRAPPER_SCRIPT: &str = r#"
exec 3<&0 </dev/null
"$@" 3<&- &
child=$!
{ read -r _ <&3; kill -KILL "$child" 2>/dev/null; } &
watcher=$!
exec 3<&-
wait "$child"
status=$?
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
exit "$status"
"#;

/// Waits for EOF on stdin, then removes `$1`. A killed component may still be closing its files
/// for a moment, so the removal is retried until the tree is gone.
const JANITOR_SCRIPT: &str = r#"
trap '' INT TERM HUP
root=$1
while read -r _; do :; done
if [ -n "${HOMELAB_TEST_KEEP:-}" ]; then
  echo "[control-plane] kept $root (HOMELAB_TEST_KEEP is set)" >&2
  exit 0
fi
for _ in $(seq 100); do
  rm -rf -- "$root" 2>/dev/null
  [ -e "$root" ] || exit 0
  sleep 0.1
done
echo "[control-plane] could not remove $root" >&2
exit 1
"#;

/// The start of a janitor that runs a script of its own ([`Janitor::run`]): it ignores the
/// signals of a Ctrl-C and waits for its lifeline to close.
const JANITOR_PROLOGUE: &str = r#"
trap '' INT TERM HUP
while read -r _; do :; done
"#;

/// A child that ends when the test process does: its stdin is the lifeline.
struct Tethered {
    lifeline: Option<ChildStdin>,
    child: Child,
}

impl Tethered {
    fn spawn(mut command: Command) -> std::io::Result<Self> {
        let mut child = command.stdin(Stdio::piped()).process_group(0).spawn()?;
        let lifeline = child.stdin.take();
        Ok(Self { lifeline, child })
    }

    /// Cuts the lifeline and waits for the child to finish: on a failed start, and when an owned
    /// control plane is dropped (the shared one lives in a static and is never dropped).
    fn cut(&mut self) {
        self.lifeline.take();
        let _ = self.child.wait();
    }
}

/// Removes the control plane's directory when the test process ends, or earlier when dropped.
pub struct Janitor(Tethered);

impl Janitor {
    /// Starts the janitor for everything under `root`.
    pub fn start(root: &Path) -> Result<Self> {
        Self::spawn(JANITOR_SCRIPT, &[root.as_os_str()])
    }

    /// Starts a janitor that runs the bash `script` (with `args` as `$1`…) once the test process
    /// ends, or when it is dropped: for what is not a directory, such as a real machine's
    /// network namespaces, cgroups and mounts.
    pub fn run(script: &str, args: &[&std::ffi::OsStr]) -> Result<Self> {
        Self::spawn(&format!("{JANITOR_PROLOGUE}{script}"), args)
    }

    fn spawn(script: &str, args: &[&std::ffi::OsStr]) -> Result<Self> {
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .arg("janitor")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let tethered = Tethered::spawn(command).context("starting the janitor (bash)")?;
        Ok(Self(tethered))
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        self.0.cut();
    }
}

/// One running component (under its wrapper), its output going to `<log dir>/<name>.log`.
pub struct Process {
    name: String,
    log: PathBuf,
    wrapper: Mutex<Tethered>,
    /// What it was started with, to start it again in place ([`Process::restart`]).
    program: PathBuf,
    args: Vec<String>,
    home: PathBuf,
}

impl Process {
    /// Starts `program args…` with a minimal environment: `PATH`, plus `HOME` pointing into the
    /// control plane's directory so that nothing reads or writes the user's ~/.kube or ~/.kwok.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        home: &Path,
        log_dir: &Path,
    ) -> Result<Self> {
        fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
        fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let wrapper = Self::launch(name, program, args, home, out)?;
        Ok(Self {
            name: name.to_owned(),
            log,
            wrapper: Mutex::new(wrapper),
            program: program.to_owned(),
            args: args.to_vec(),
            home: home.to_owned(),
        })
    }

    fn launch(
        name: &str,
        program: &Path,
        args: &[String],
        home: &Path,
        out: File,
    ) -> Result<Tethered> {
        let err = out.try_clone().context("duplicating a log file handle")?;
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(WRAPPER_SCRIPT)
            .arg(name)
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
            .env("HOME", home)
            .stdout(out)
            .stderr(err);
        Tethered::spawn(command).with_context(|| format!("starting {name} ({})", program.display()))
    }

    /// SIGKILLs the component, waits until it is reaped, and starts it again with the same
    /// arguments (so the same ports and data directory), its log continued. The caller waits
    /// for it to be ready again.
    pub fn restart(&self) -> Result<()> {
        let mut wrapper = self.wrapper.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        wrapper.cut();
        let out = fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .with_context(|| format!("reopening {}", self.log.display()))?;
        *wrapper = Self::launch(&self.name, &self.program, &self.args, &self.home, out)?;
        Ok(())
    }

    /// SIGKILLs the component and waits until it is reaped, leaving it stopped until
    /// [`Process::restart`] starts it again. Its own children are not its process: a
    /// containerd stopped this way leaves its shims and their containers running, as
    /// `systemctl stop containerd` does.
    pub fn stop(&self) -> Result<()> {
        let mut wrapper = self.wrapper.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        wrapper.cut();
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status, if the component has ended.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.wrapper.lock().ok()?.child.try_wait().ok().flatten()
    }

    /// Fails, with the end of the log, if the component has ended.
    pub fn ensure_running(&self) -> Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail(30)
            ),
        }
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log, lines)
    }
}

/// The last `lines` lines of a log file, or why it cannot be read.
pub fn file_tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(wrapper) = self.wrapper.get_mut() {
            wrapper.cut();
        }
    }
}
