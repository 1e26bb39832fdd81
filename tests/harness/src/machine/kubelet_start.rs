//! Kubelet starts one at a time on the host. Every kubelet binds its device-plugin socket at
//! /var/lib/kubelet/device-plugins/kubelet.sock whatever its root dir, and at start it first
//! removes the sockets there and then binds its own: two kubelets starting at once can each
//! clean, and the second to bind finds the first's fresh socket and exits ("bind: address
//! already in use"). A kubelet that already runs is not disturbed by a later one's cleanup (it
//! keeps its unlinked socket), so only the starts are taken in turn: host-wide, across test
//! processes, under an advisory lock held until the new kubelet's socket is there (or it
//! exited, or `SOCKET_WAIT` passed). A machine with a mount table of its own (os.rs) has its
//! own socket and starts its kubelet without the lock.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};

const SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// A kubelet binds the socket within about a second of its start; past this it is left alone.
const SOCKET_WAIT: Duration = Duration::from_secs(20);

fn lock_path() -> PathBuf {
    std::env::temp_dir().join("homelab-harness-kubelet-start.lock")
}

/// The socket file's identity: a new bind makes a new file (a new ctime, most likely a new
/// inode).
fn socket_identity(path: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Runs `start` (which spawns or restarts a kubelet) and waits until that kubelet has bound its
/// device-plugin socket or `running` says it exited. A kubelet on the host's socket starts with
/// no other kubelet starting on the host; one whose machine has a socket of its own (`own`, see
/// os.rs) needs no lock, and the wait lets what starts after it (a device plugin registering
/// with it) find the socket served.
pub async fn start<T>(
    own: Option<&Path>,
    start: impl FnOnce() -> Result<T>,
    running: impl Fn(&T) -> bool,
) -> Result<T> {
    if let Some(socket) = own {
        return until_bound(socket, start, running).await;
    }
    let path = lock_path();
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let lock = tokio::task::spawn_blocking(move || Flock::lock(file, FlockArg::LockExclusive))
        .await
        .context("waiting for the kubelet start lock")?
        .map_err(|(_, errno)| anyhow::anyhow!("locking {}: {errno}", path.display()))?;
    let kubelet = until_bound(Path::new(SOCKET), start, running).await;
    drop(lock);
    kubelet
}

async fn until_bound<T>(
    socket: &Path,
    start: impl FnOnce() -> Result<T>,
    running: impl Fn(&T) -> bool,
) -> Result<T> {
    let before = socket_identity(socket);
    let kubelet = start()?;
    // A kubelet that exits or never binds only ends the wait: its caller sees it down.
    let _bound = crate::wait::until(
        "the new kubelet's device-plugin socket",
        SOCKET_WAIT,
        || {
            anyhow::ensure!(running(&kubelet), "the kubelet exited");
            Ok(())
        },
        || async {
            let now = socket_identity(socket);
            anyhow::ensure!(now.is_some() && now != before, "not bound yet");
            Ok(())
        },
    )
    .await;
    Ok(kubelet)
}
