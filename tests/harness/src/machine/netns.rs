//! Network namespaces the test makes, through `ip netns` (so they are the ones `ip netns list`
//! shows and `ip netns exec` enters), and the one way the test process itself enters one: a
//! short-lived thread that opens a socket inside it. A socket keeps the namespace it was made in,
//! so the rest of the test process stays in the root namespace.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use nix::sched::{CloneFlags, setns};

/// Where `ip netns add NAME` mounts the namespace.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Runs `ip ARGS…` and fails with its message.
pub(crate) fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {} (is iproute2 installed?)", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "ip {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// `ip netns add NAME` with its loopback up.
pub(crate) fn add(name: &str) -> Result<()> {
    ip(&["netns", "add", name]).context(
        "creating a network namespace: the real-machine tier needs root (CAP_SYS_ADMIN and \
         CAP_NET_ADMIN) and a kernel with network namespaces",
    )?;
    ip(&["-n", name, "link", "set", "lo", "up"])
}

/// Turns on IPv4 forwarding inside namespace `name` (a per-namespace setting).
pub(crate) fn forward(name: &str) -> Result<()> {
    let path = path(name);
    let output = Command::new("nsenter")
        .arg(format!("--net={}", path.display()))
        .args(["--", "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        .output()
        .with_context(|| format!("running sysctl in {}", path.display()))?;
    if !output.status.success() {
        bail!(
            "enabling forwarding in {name} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Calls `open` on a thread of its own that has entered network namespace `name`: for a
/// listening socket (the apiserver relay, a Wake-on-LAN listener) that must live in it.
pub fn open_in<T, F>(name: &str, open: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let path = path(name);
    let namespace = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    // setns changes the calling thread only; this thread ends right after, so nothing else
    // ever runs in the namespace by mistake.
    let thread = std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || -> Result<T> {
            setns(&namespace, CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering network namespace {}", path.display()))?;
            open().with_context(|| {
                format!("opening a socket in network namespace {}", path.display())
            })
        })
        .context("starting a thread to enter a network namespace")?;
    thread.join().map_err(|_| anyhow::anyhow!("the network namespace thread panicked"))?
}

/// A listening TCP socket on `address` inside namespace `name`, for a task of the calling
/// runtime to serve (a device's service on the lan: a BMC, a plug).
pub(crate) fn tcp_listener(
    name: &str,
    address: std::net::SocketAddr,
) -> Result<tokio::net::TcpListener> {
    let listener = open_in(name, move || {
        let listener = std::net::TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })?;
    tokio::net::TcpListener::from_std(listener).context("handing the listener to the runtime")
}
