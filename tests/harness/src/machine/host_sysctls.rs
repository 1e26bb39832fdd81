//! The host's kernel settings a kubelet changes when it starts (`vm.overcommit_memory=1`,
//! `kernel.panic=10`, `kernel.panic_on_oops=1`: kernel-wide, not per namespace, and not
//! configurable short of `protectKernelDefaults`, which makes the kubelet refuse to start
//! instead). The values a host had before any machine ran are recorded once, in the test cache,
//! and put back whenever a machine goes, so the host is left as it was found: with
//! `panic_on_oops` on, an oops anywhere else on a CI host would reboot it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// What the kubelet sets, as paths under /proc/sys.
const SETTINGS: [&str; 3] = ["vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"];

fn record_file() -> PathBuf {
    std::env::var_os("HOMELAB_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/homelab-autoscaler")
        })
        .join("host-sysctls")
}

/// Records the host's values, unless a record exists (the first run on a host writes it, before
/// any kubelet of its has started).
pub(crate) fn record() -> Result<()> {
    let path = record_file();
    if path.exists() {
        return Ok(());
    }
    let mut text = String::new();
    for setting in SETTINGS {
        let value = fs::read_to_string(Path::new("/proc/sys").join(setting))
            .with_context(|| format!("reading /proc/sys/{setting}"))?;
        text.push_str(&format!("{setting} {}\n", value.trim()));
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Two test processes may race to write it: the first one wins, both read the same host.
    match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(mut file) => file.write_all(text.as_bytes()).context("writing the host's sysctls"),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error).with_context(|| format!("creating {}", path.display())),
    }
}

/// Puts the recorded values back. Best effort: a machine going away must not fail on it.
pub(crate) fn restore() {
    let Ok(text) = fs::read_to_string(record_file()) else { return };
    for line in text.lines() {
        if let Some((setting, value)) = line.split_once(' ')
            && SETTINGS.contains(&setting)
        {
            let _ = fs::write(Path::new("/proc/sys").join(setting), value);
        }
    }
}
