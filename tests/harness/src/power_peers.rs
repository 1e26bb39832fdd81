//! Real protocol peers for the power-driver tests, on 127.0.0.1: `sushy-emulator` (Redfish),
//! `ipmi_sim` and pyghmi's `fakebmc` (IPMI BMCs), and `sshd`.
//! tests/harness/install-power-peers.sh installs them (`make test` runs it); a missing one fails
//! its test with the command that installs it.
//! Each peer runs in its own temporary directory and stops when dropped.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::process::Process;
use crate::wait::{start_timeout, until};

/// The script that installs the peers.
pub const INSTALL_SCRIPT: &str = "tests/harness/install-power-peers.sh";

/// The peers' virtualenv, under the test cache.
pub fn peers_dir() -> PathBuf {
    let cache = std::env::var_os("HOMELAB_TEST_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/homelab-autoscaler")
    });
    cache.join("peers")
}

/// `program`, or a failure that says how to install it.
pub fn require(program: &str) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
            .map(|dir| dir.join(program))
            .collect()
    };
    candidates.into_iter().find(|p| p.is_file()).with_context(|| {
        format!(
            "{program} is not installed: run {INSTALL_SCRIPT} (`make test` does) to install the \
             power-driver test peers"
        )
    })
}

fn free_tcp_port() -> Result<u16> {
    crate::ports::free_port()
}

fn free_udp_port() -> Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run(program: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} exited {}: {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A Redfish BMC: sushy-emulator with its fake driver, basic auth, one system that starts Off.
pub struct RedfishPeer {
    pub port: u16,
    pub user: String,
    pub password: String,
    pub system_uuid: String,
    tls: bool,
    pub process: Process,
    _dir: tempfile::TempDir,
}

impl RedfishPeer {
    /// Plain HTTP.
    pub async fn start() -> Result<Self> {
        Self::start_with(None).await
    }

    /// HTTPS with the certificate and key in `tls_dir` (`tls.crt`, `tls.key`).
    pub async fn start_tls(tls_dir: &Path) -> Result<Self> {
        Self::start_with(Some(tls_dir)).await
    }

    async fn start_with(tls_dir: Option<&Path>) -> Result<Self> {
        let venv = peers_dir().join("venv/bin");
        let sushy = require(&venv.join("sushy-emulator").display().to_string())?;
        let python = venv.join("python");
        let dir = tempfile::tempdir()?;
        let (user, password) = ("admin".to_string(), "secret".to_string());
        let hash = run(
            &python,
            &[
                "-c",
                "import bcrypt,sys; print(bcrypt.hashpw(b'secret', bcrypt.gensalt()).decode())",
            ],
        )?;
        let htpasswd = dir.path().join("htpasswd");
        std::fs::write(&htpasswd, format!("{user}:{}\n", hash.trim()))?;
        let port = free_tcp_port()?;
        let system_uuid = "27946b59-9e44-4fa7-8e91-f3527a1ef094".to_string();
        let config = dir.path().join("sushy.conf");
        std::fs::write(
            &config,
            format!(
                "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                 SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                 SUSHY_EMULATOR_FAKE_DRIVER = True\n\
                 SUSHY_EMULATOR_STATE_DIR = '{state}'\n\
                 SUSHY_EMULATOR_AUTH_FILE = '{auth}'\n{tls}\
                 SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': '{system_uuid}', 'name': 'machine-1', \
                 'power_state': 'Off', 'nics': [{{'mac': '00:5c:52:31:3a:9c', 'ip': '172.22.0.100'}}]}}]\n",
                state = dir.path().join("state").display(),
                auth = htpasswd.display(),
                tls = tls_dir.map_or_else(String::new, |d| format!(
                    "SUSHY_EMULATOR_SSL_CERT = '{}'\nSUSHY_EMULATOR_SSL_KEY = '{}'\n",
                    d.join("tls.crt").display(),
                    d.join("tls.key").display()
                )),
            ),
        )?;
        let process = Process::spawn(
            "sushy-emulator",
            &sushy,
            &["--config".into(), config.display().to_string()],
            &dir.path().join("home"),
            dir.path(),
        )?;
        let url = format!("http://127.0.0.1:{port}/redfish/v1");
        let tls = tls_dir.is_some();
        until(
            "sushy-emulator to answer",
            start_timeout(),
            || process.ensure_running(),
            || {
                let url = url.clone();
                async move {
                    if tls {
                        // Listening is enough: the tests speak TLS to it themselves.
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                        return Ok(());
                    }
                    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    stream
                        .write_all(b"GET /redfish/v1 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                        .await?;
                    let mut head = [0u8; 12];
                    stream.read_exact(&mut head).await?;
                    if !head.ends_with(b"200") {
                        bail!("{url} answered {}", String::from_utf8_lossy(&head));
                    }
                    Ok(())
                }
            },
        )
        .await?;
        Ok(Self { port, user, password, system_uuid, tls, process, _dir: dir })
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Changes the system's power behind the operator's back (a person at the machine, a power
    /// cut), through the emulator's own Reset action: `On`, `ForceOff`.
    pub async fn reset(&self, reset_type: &str) -> Result<()> {
        let url = format!(
            "{}/redfish/v1/Systems/{}/Actions/ComputerSystem.Reset",
            self.endpoint(),
            self.system_uuid
        );
        let client = reqwest::Client::builder()
            .no_proxy()
            .danger_accept_invalid_certs(true)
            .build()
            .context("an HTTP client")?;
        let answer = client
            .post(&url)
            .basic_auth(&self.user, Some(&self.password))
            .json(&serde_json::json!({ "ResetType": reset_type }))
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = answer.status();
        if !status.is_success() {
            bail!("{url} answered {status}: {}", answer.text().await.unwrap_or_default());
        }
        Ok(())
    }
}

/// An IPMI BMC: OpenIPMI's `ipmi_sim` with a chassis whose power is a file, and `ipmitool` as
/// an independent client.
pub struct IpmiPeer {
    pub port: u16,
    pub user: String,
    pub password: String,
    power_file: PathBuf,
    pub process: Process,
    _dir: tempfile::TempDir,
}

/// ipmi_sim's chassis control: `<script> 0x20 get power` prints `power:0|1`, `... set power
/// 0|1` stores it. Soft off lands as `set power 0` too.
const CHASSIS_SCRIPT: &str = r#"#!/bin/sh
state="$(dirname "$0")/power"
[ -f "$state" ] || echo 0 > "$state"
case "$2" in
  get) shift 2; for item in "$@"; do
         case "$item" in power) echo "power:$(cat "$state")" ;; esac
       done ;;
  set) shift 2; while [ $# -gt 1 ]; do
         case "$1" in power) echo "$2" > "$state" ;; esac; shift 2
       done ;;
esac
exit 0
"#;

impl IpmiPeer {
    pub async fn start() -> Result<Self> {
        let sim = require("ipmi_sim")?;
        let ipmitool = require("ipmitool")?;
        let dir = tempfile::tempdir()?;
        let port = free_udp_port()?;
        let (user, password) = ("admin".to_string(), "secret".to_string());
        let script = dir.path().join("chassis.sh");
        std::fs::write(&script, CHASSIS_SCRIPT)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        let power_file = dir.path().join("power");
        std::fs::write(&power_file, "0\n")?;
        let lan = dir.path().join("lan.conf");
        std::fs::write(
            &lan,
            format!(
                "name \"homelab\"\n\
                 set_working_mc 0x20\n\
                 startlan 1\n  addr 127.0.0.1 {port}\n  priv_limit admin\n  \
                 allowed_auths_callback none md2 md5 straight\n  \
                 allowed_auths_user none md2 md5 straight\n  \
                 allowed_auths_operator none md2 md5 straight\n  \
                 allowed_auths_admin none md2 md5 straight\n  \
                 guid a123456789abcdefa123456789abcdef\nendlan\n\
                 chassis_control \"{script} 0x20\"\n\
                 user 2 true \"{user}\" \"{password}\" admin 10 none md2 md5 straight\n",
                script = script.display(),
            ),
        )?;
        let emu = dir.path().join("bmc.emu");
        std::fs::write(
            &emu,
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n",
        )?;
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state)?;
        let process = Process::spawn(
            "ipmi_sim",
            &sim,
            &[
                "-n".into(),
                "-c".into(),
                lan.display().to_string(),
                "-f".into(),
                emu.display().to_string(),
                "-s".into(),
                state.display().to_string(),
            ],
            &dir.path().join("home"),
            dir.path(),
        )?;
        let peer = Self { port, user, password, power_file, process, _dir: dir };
        until(
            "ipmi_sim to answer ipmitool",
            start_timeout(),
            || peer.process.ensure_running(),
            || {
                let ipmitool = ipmitool.clone();
                let peer = &peer;
                async move { peer.ipmitool(&ipmitool, &["chassis", "power", "status"]).map(|_| ()) }
            },
        )
        .await?;
        Ok(peer)
    }

    fn ipmitool(&self, ipmitool: &Path, args: &[&str]) -> Result<String> {
        ipmitool_lanplus(ipmitool, self.port, &self.user, &self.password, args)
    }

    /// What `ipmitool chassis power status` says: an independent reading of the chassis.
    pub fn reference_status(&self) -> Result<String> {
        Ok(self
            .ipmitool(&require("ipmitool")?, &["chassis", "power", "status"])?
            .trim()
            .to_string())
    }

    /// The chassis power as the simulated machine holds it (`0` or `1`).
    pub fn power_file(&self) -> Result<String> {
        Ok(std::fs::read_to_string(&self.power_file)?.trim().to_string())
    }

    /// Changes the chassis power behind the operator's back (its front panel's button, a power
    /// cut): what the BMC then reads.
    pub fn set_chassis_power(&self, on: bool) -> Result<()> {
        std::fs::write(&self.power_file, if on { "1\n" } else { "0\n" })
            .context("writing the chassis power")
    }
}

/// `ipmitool -I lanplus -C 3` against a BMC on 127.0.0.1.
fn ipmitool_lanplus(
    ipmitool: &Path,
    port: u16,
    user: &str,
    password: &str,
    args: &[&str],
) -> Result<String> {
    let port = port.to_string();
    let mut all = vec![
        "-I",
        "lanplus",
        "-H",
        "127.0.0.1",
        "-p",
        &port,
        "-U",
        user,
        "-P",
        password,
        "-C",
        "3",
        "-N",
        "1",
        "-R",
        "1",
    ];
    all.extend_from_slice(args);
    run(ipmitool, &all)
}

/// pyghmi's `fakebmc` (the BMC behind virtualbmc): RMCP+ without an answer to the RMCP ping. Its
/// login is fixed (`admin` / `password`), its machine starts off, and a soft off powers it off.
pub struct FakeBmcPeer {
    pub port: u16,
    pub user: String,
    pub password: String,
    pub process: Process,
    _dir: tempfile::TempDir,
}

impl FakeBmcPeer {
    pub async fn start() -> Result<Self> {
        let fakebmc = require(&peers_dir().join("venv/bin/fakebmc").display().to_string())?;
        let ipmitool = require("ipmitool")?;
        let dir = tempfile::tempdir()?;
        let port = free_udp_port()?;
        let process = Process::spawn(
            "fakebmc",
            &fakebmc,
            &["--port".into(), port.to_string()],
            &dir.path().join("home"),
            dir.path(),
        )?;
        let peer =
            Self { port, user: "admin".into(), password: "password".into(), process, _dir: dir };
        until(
            "fakebmc to answer ipmitool",
            start_timeout(),
            || peer.process.ensure_running(),
            || {
                let ipmitool = ipmitool.clone();
                let peer = &peer;
                async move { peer.reference_status_with(&ipmitool).map(|_| ()) }
            },
        )
        .await?;
        Ok(peer)
    }

    fn reference_status_with(&self, ipmitool: &Path) -> Result<String> {
        let args = ["chassis", "power", "status"];
        Ok(ipmitool_lanplus(ipmitool, self.port, &self.user, &self.password, &args)?
            .trim()
            .to_string())
    }

    /// What `ipmitool chassis power status` says.
    pub fn reference_status(&self) -> Result<String> {
        self.reference_status_with(&require("ipmitool")?)
    }
}

/// An sshd on a loopback port with a throwaway host key; `client_key` logs in as the current
/// user.
pub struct SshPeer {
    pub port: u16,
    pub user: String,
    /// The client's private key (OpenSSH format).
    pub client_key: String,
    /// The host key as `ssh-ed25519 AAAA...`.
    pub host_key: String,
    pub dir: PathBuf,
    pub process: Process,
    _dir: tempfile::TempDir,
}

impl SshPeer {
    pub async fn start() -> Result<Self> {
        let sshd = require("sshd")?;
        let keygen = require("ssh-keygen")?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().to_path_buf();
        std::fs::create_dir_all("/run/sshd").context("creating /run/sshd (sshd needs it)")?;
        for name in ["host", "client"] {
            let key = path.join(name).display().to_string();
            run(&keygen, &["-q", "-t", "ed25519", "-N", "", "-f", &key])?;
        }
        let authorized = path.join("authorized_keys");
        std::fs::copy(path.join("client.pub"), &authorized)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&authorized, std::fs::Permissions::from_mode(0o600))?;
        let port = free_tcp_port()?;
        let config = path.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {host}\nPidFile {pid}\n\
                 AuthorizedKeysFile {authorized}\nPubkeyAuthentication yes\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 StrictModes no\n",
                host = path.join("host").display(),
                pid = path.join("sshd.pid").display(),
                authorized = authorized.display(),
            ),
        )?;
        let process = Process::spawn(
            "sshd",
            &sshd,
            &["-D".into(), "-e".into(), "-f".into(), config.display().to_string()],
            &path.join("home"),
            &path,
        )?;
        until(
            "sshd to listen",
            start_timeout(),
            || process.ensure_running(),
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                Ok(())
            },
        )
        .await?;
        let host_pub = std::fs::read_to_string(path.join("host.pub"))?;
        let host_key = host_pub.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        let user = run(Path::new("/usr/bin/id"), &["-un"])?.trim().to_string();
        Ok(Self {
            port,
            user,
            client_key: std::fs::read_to_string(path.join("client"))?,
            host_key,
            dir: path,
            process,
            _dir: dir,
        })
    }
}
