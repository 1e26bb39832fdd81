//! The operator as a process: started with the bench's flags, timed to `/ready`, and read from
//! /proc (resident memory, its peak, CPU time) while it idles or serves a burst.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

/// One running operator.
pub struct Operator {
    child: Child,
    pub pid: u32,
    pub grpc_port: u16,
    pub admin: String,
    pub log: PathBuf,
    /// From spawn to the first 200 of `/ready` (caches synced).
    pub start_to_ready: Duration,
}

/// Where the operator's certificates and logs go.
pub struct OperatorFiles<'a> {
    pub bin: &'a Path,
    pub kubeconfig: &'a Path,
    /// tls.crt, tls.key, ca.crt: both the webhook and the gRPC server (mutual TLS) use them.
    pub cert_dir: &'a Path,
    pub log: PathBuf,
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Operator {
    /// Starts `homelab-autoscaler run` for `namespace` and waits until it is ready.
    pub async fn start(
        files: &OperatorFiles<'_>,
        namespace: &str,
        extra: &[String],
    ) -> Result<Self> {
        let (webhook, admin, grpc) = (free_port()?, free_port()?, free_port()?);
        let mut args = vec![
            "run".to_string(),
            format!("--namespace={namespace}"),
            format!("--webhook-addr=127.0.0.1:{webhook}"),
            format!("--admin-addr=127.0.0.1:{admin}"),
            format!("--grpc-addr=127.0.0.1:{grpc}"),
            format!("--grpc-cert-dir={}", files.cert_dir.display()),
            format!("--webhook-cert-dir={}", files.cert_dir.display()),
            "--operator-usernames=admin".to_string(),
        ];
        args.extend(extra.iter().cloned());
        let out = std::fs::File::create(&files.log)
            .with_context(|| format!("creating {}", files.log.display()))?;
        let started = Instant::now();
        let child = Command::new(files.bin)
            .args(&args)
            .env("KUBECONFIG", files.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", files.bin.display()))?;
        let pid = child.id().context("the operator exited at once")?;
        let admin = format!("127.0.0.1:{admin}");
        let mut operator = Operator {
            child,
            pid,
            grpc_port: grpc,
            admin,
            log: files.log.clone(),
            start_to_ready: Duration::ZERO,
        };
        let deadline = started + Duration::from_secs(120);
        loop {
            if http_status(&operator.admin, "/ready").await.ok() == Some(200) {
                break;
            }
            if let Some(status) = operator.child.try_wait()? {
                bail!("the operator exited ({status}): {}", operator.log_tail());
            }
            ensure!(Instant::now() < deadline, "not ready in 120 s: {}", operator.log_tail());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        operator.start_to_ready = started.elapsed();
        Ok(operator)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn usage(&self) -> Result<Usage> {
        Usage::of(self.pid)
    }

    pub async fn stop(mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// The status code of `GET path` on a plain-HTTP admin port.
async fn http_status(addr: &str, path: &str) -> Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let code = response.split_whitespace().nth(1).context("no status line")?;
    Ok(code.parse()?)
}

/// A process's resources at one instant, from /proc.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub at: Instant,
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// VmHWM (the peak resident set since start), KiB.
    pub peak_kib: u64,
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
}

impl Usage {
    pub fn of(pid: u32) -> Result<Self> {
        let at = Instant::now();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> Result<u64> {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .with_context(|| format!("{name} in /proc/{pid}/status"))?;
            Ok(line.split_whitespace().nth(1).context("a value")?.parse()?)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // The command name may hold spaces; the fields after it are space separated, and
        // utime and stime are the 14th and 15th fields of the whole line.
        let after = stat.rsplit_once(')').context("/proc/<pid>/stat")?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| -> Result<u64> { Ok(fields.get(i).context("stat field")?.parse()?) };
        Ok(Usage {
            at,
            rss_kib: field("VmRSS:")?,
            peak_kib: field("VmHWM:")?,
            cpu_ticks: ticks(11)? + ticks(12)?,
        })
    }

    /// The share of one core used between `earlier` and `self`, in percent.
    pub fn cpu_percent_since(&self, earlier: &Usage, ticks_per_second: u64) -> f64 {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        let cpu = self.cpu_ticks.saturating_sub(earlier.cpu_ticks) as f64 / ticks_per_second as f64;
        if wall > 0.0 { 100.0 * cpu / wall } else { f64::NAN }
    }
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux unless told otherwise).
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// How many sockets a process holds open (its connections to the apiserver among them): each
/// kept-alive TLS connection holds buffers of its own.
pub fn sockets(pid: u32) -> Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // An fd closed between the listing and the read is simply not counted.
        if let Ok(target) = std::fs::read_link(entry?.path()) {
            count += usize::from(target.to_string_lossy().starts_with("socket:"));
        }
    }
    Ok(count)
}

pub fn mib(kib: u64) -> String {
    format!("{:.1}MiB", kib as f64 / 1024.0)
}
