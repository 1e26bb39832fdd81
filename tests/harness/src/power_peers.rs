//! Real protocol peers for the power-driver tests, on 127.0.0.1: `sushy-emulator` (Redfish),
//! `ipmi_sim` and pyghmi's `fakebmc` (IPMI BMCs), `sshd`, and Network UPS Tools' `upsd` with its
//! `dummy-ups` driver (a UPS).
//! tests/harness/install-power-peers.sh installs them (`make test` runs it); a missing one fails
//! its test with the command that installs it.
//! Each peer runs in its own temporary directory and stops when dropped.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

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

/// A UPS: Network UPS Tools' `upsd` serving a `dummy-ups` driver, both unpacked from Debian's
/// `nut-server` under [`peers_dir`]`/nut`. The driver reads the UPS's variables from a `.dev`
/// file (`name: value` lines, as `upsc` prints them) and reads it again whenever the file's
/// modification time changes, as a real driver reports a UPS's new readings; [`UpsPeer::set`]
/// rewrites it. Clients speak the NUT protocol to `127.0.0.1:port` and log in as
/// [`UpsPeer::username`] / [`UpsPeer::password`].
pub struct UpsPeer {
    pub port: u16,
    /// upsd. Declared before the driver so that it stops first on drop.
    pub upsd: Process,
    /// dummy-ups.
    pub driver: Process,
    dev_file: PathBuf,
    dev: Mutex<DevFile>,
    _dir: tempfile::TempDir,
}

/// The `.dev` file's variables, in order, and the modification time it was last given.
struct DevFile {
    values: Vec<(String, String)>,
    mtime: SystemTime,
}

/// The UPS's name in upsd (`ups.conf`'s section).
const UPS_NAME: &str = "dummy";
const UPS_USER: &str = "monitor";
const UPS_PASSWORD: &str = "secret";
/// How long [`UpsPeer::set`] waits for upsd to serve the new values: the driver polls the file
/// every second.
const UPS_SET_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one NUT protocol exchange may take.
const UPS_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// The variables the UPS starts with: on line, full. `ups.model` too, or the driver reports its
/// own "Dummy UPS" as the model.
const UPS_INITIAL: &[(&str, &str)] = &[
    ("ups.status", "OL"),
    ("battery.charge", "100"),
    ("battery.runtime", "3600"),
    ("ups.load", "20"),
    ("device.model", "Test UPS"),
    ("ups.model", "Test UPS"),
];

impl UpsPeer {
    pub async fn start() -> Result<Self> {
        let nut = peers_dir().join("nut");
        let upsd_bin = require(&nut.join("lib/nut/upsd").display().to_string())?;
        let driver_bin = require(&nut.join("lib/nut/dummy-ups").display().to_string())?;
        let env = require("env")?;
        let libs = nut_library_dir(&nut)?;
        // The driver's socket is `<state>/dummy-ups-dummy`, and a unix socket's path has at most
        // 107 bytes: a long $TMPDIR would not do.
        let dir = match tempfile::tempdir() {
            Ok(dir) if dir.path().as_os_str().len() < 60 => dir,
            _ => tempfile::Builder::new().prefix("ups-").tempdir_in("/tmp")?,
        };
        let path = dir.path().to_path_buf();
        let state = path.join("state");
        let dev_file = path.join("dummy.dev");
        let port = free_tcp_port()?;
        let user = run(Path::new("/usr/bin/id"), &["-un"])?.trim().to_string();
        let group = run(Path::new("/usr/bin/id"), &["-gn"])?.trim().to_string();

        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new().mode(0o700).create(&state)?;
        let write = |name: &str, mode: u32, text: String| -> Result<()> {
            let file = path.join(name);
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))?;
            Ok(())
        };
        write(
            "ups.conf",
            0o640,
            format!(
                "[{UPS_NAME}]\n\tdriver = dummy-ups\n\tport = {dev}\n\tdesc = \"test UPS\"\n\t\
                 pollinterval = 1\n",
                dev = dev_file.display()
            ),
        )?;
        write("upsd.conf", 0o640, format!("LISTEN 127.0.0.1 {port}\n"))?;
        write(
            "upsd.users",
            0o600,
            format!("[{UPS_USER}]\n\tpassword = {UPS_PASSWORD}\n\tupsmon secondary\n"),
        )?;
        let values: Vec<(String, String)> =
            UPS_INITIAL.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mtime = write_dev_file(&dev_file, &values, None)?;

        // Process starts its programs with PATH and HOME only; `env` adds NUT's.
        let with_env = |program: &Path, args: &[&str]| -> Vec<String> {
            [
                format!("NUT_CONFPATH={}", path.display()),
                format!("NUT_STATEPATH={}", state.display()),
                format!("NUT_ALTPIDPATH={}", state.display()),
                format!("LD_LIBRARY_PATH={}", libs.display()),
                program.display().to_string(),
            ]
            .into_iter()
            .chain(args.iter().map(|a| a.to_string()))
            .collect()
        };
        let home = path.join("home");
        // -D: debug level 1, in the foreground, logging to stderr. -u/-g: the current user and
        // group (a driver started as root otherwise switches to `nut`, which need not exist).
        let driver = Process::spawn(
            "dummy-ups",
            &env,
            &with_env(&driver_bin, &["-a", UPS_NAME, "-u", &user, "-g", &group, "-D"]),
            &home,
            &path,
        )?;
        let socket = state.join(format!("dummy-ups-{UPS_NAME}"));
        until(
            "dummy-ups to open its socket",
            start_timeout(),
            || driver.ensure_running(),
            || {
                let socket = socket.clone();
                async move {
                    if !socket.exists() {
                        bail!("no {}", socket.display());
                    }
                    Ok(())
                }
            },
        )
        .await?;
        let upsd =
            Process::spawn("upsd", &env, &with_env(&upsd_bin, &["-u", &user, "-D"]), &home, &path)?;
        let peer = Self {
            port,
            upsd,
            driver,
            dev_file,
            dev: Mutex::new(DevFile { values, mtime }),
            _dir: dir,
        };
        peer.until_serving(start_timeout()).await?;
        Ok(peer)
    }

    /// The UPS in NUT's notation: `dummy@127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("{UPS_NAME}@127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn ups_name(&self) -> &'static str {
        UPS_NAME
    }

    pub fn username(&self) -> &'static str {
        UPS_USER
    }

    pub fn password(&self) -> &'static str {
        UPS_PASSWORD
    }

    /// Changes the UPS's variables as its driver would report them (a power cut: `ups.status`
    /// `OB DISCHRG`, a falling `battery.charge`): rewrites the driver's file with `values` over
    /// the current ones, and waits until upsd serves every new value.
    pub async fn set(&self, values: &[(&str, &str)]) -> Result<()> {
        {
            let mut dev = self.dev.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            for (name, value) in values {
                match dev.values.iter_mut().find(|(k, _)| k == name) {
                    Some(entry) => entry.1 = value.to_string(),
                    None => dev.values.push((name.to_string(), value.to_string())),
                }
            }
            let mtime = write_dev_file(&self.dev_file, &dev.values, Some(dev.mtime))?;
            dev.mtime = mtime;
        }
        until(
            "upsd to serve the UPS's new values",
            UPS_SET_TIMEOUT,
            || self.ensure_running(),
            || async move {
                for (name, value) in values {
                    let served = self.get(name).await?;
                    if served != *value {
                        bail!("{name} is {served:?}, not yet {value:?}");
                    }
                }
                Ok(())
            },
        )
        .await
    }

    /// A variable as upsd serves it (`GET VAR dummy <name>`); an unknown one is an error.
    pub async fn get(&self, name: &str) -> Result<String> {
        ups_get(self.port, name).await
    }

    /// Stops upsd (its clients' connections are refused); the driver keeps running.
    pub fn stop_server(&self) -> Result<()> {
        self.upsd.stop()
    }

    /// Starts upsd again on the same port, and waits until it serves the UPS.
    pub async fn start_server(&self) -> Result<()> {
        self.upsd.restart()?;
        self.until_serving(start_timeout()).await
    }

    fn ensure_running(&self) -> Result<()> {
        self.driver.ensure_running()?;
        self.upsd.ensure_running()
    }

    /// Waits until upsd serves the `ups.status` the driver's file holds: until the driver has
    /// read it, upsd serves `WAIT`.
    async fn until_serving(&self, timeout: Duration) -> Result<()> {
        let expected = {
            let dev = self.dev.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            dev.values.iter().find(|(k, _)| k == "ups.status").map(|(_, v)| v.clone())
        };
        let expected = expected.unwrap_or_default();
        until(
            "upsd to serve the UPS",
            timeout,
            || self.ensure_running(),
            || async {
                let status = self.get("ups.status").await?;
                if status != expected {
                    bail!("ups.status is {status:?}, not yet {expected:?}");
                }
                Ok(())
            },
        )
        .await
    }
}

/// `lib/<multiarch>` under the unpacked NUT, where libupsclient is.
fn nut_library_dir(nut: &Path) -> Result<PathBuf> {
    let lib = nut.join("lib");
    std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .find(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().ends_with("-linux-gnu"))
                && p.join("libupsclient.so.6").exists()
        })
        .with_context(|| {
            format!(
                "no {}/<multiarch>/libupsclient.so.6: run {INSTALL_SCRIPT} (`make test` does) to \
                 install the power-driver test peers",
                lib.display()
            )
        })
}

/// Writes the driver's `.dev` file in one step (a temporary file renamed over it) and returns the
/// modification time it was given. dummy-ups reads the file again when its mtime changes, and
/// compares whole seconds: the new time is at least a second past `previous`, or two writes
/// within a second would leave the second unread.
fn write_dev_file(
    path: &Path,
    values: &[(String, String)],
    previous: Option<SystemTime>,
) -> Result<SystemTime> {
    let mut text = String::new();
    for (name, value) in values {
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == ':') {
            bail!("{name:?} is not a NUT variable name");
        }
        if value.contains(['\n', '\r']) {
            bail!("the value of {name} has a line break: {value:?}");
        }
        let quoted = value.replace('\\', "\\\\").replace('"', "\\\"");
        text.push_str(&format!("{name}: \"{quoted}\"\n"));
    }
    let now = SystemTime::now();
    let mtime = match previous {
        Some(previous) => now.max(previous + Duration::from_secs(1)),
        None => now,
    };
    let temporary = path.with_extension("dev.new");
    let file = std::fs::File::create(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    use std::io::Write;
    (&file).write_all(text.as_bytes())?;
    file.set_modified(mtime)?;
    drop(file);
    std::fs::rename(&temporary, path)
        .with_context(|| format!("renaming {} to {}", temporary.display(), path.display()))?;
    Ok(mtime)
}

/// One `GET VAR` over the NUT protocol: `VAR dummy <name> "<value>"`, or `ERR <reason>`.
async fn ups_get(port: u16, name: &str) -> Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .with_context(|| format!("connecting to upsd on 127.0.0.1:{port}"))?;
        let (read, mut write) = stream.into_split();
        write.write_all(format!("GET VAR {UPS_NAME} {name}\n").as_bytes()).await?;
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await?;
        let _ = write.write_all(b"LOGOUT\n").await;
        anyhow::Ok(line)
    };
    let line = tokio::time::timeout(UPS_EXCHANGE_TIMEOUT, exchange)
        .await
        .with_context(|| format!("upsd on 127.0.0.1:{port} did not answer GET VAR {name}"))??;
    let line = line.trim_end_matches(['\r', '\n']);
    let prefix = format!("VAR {UPS_NAME} {name} \"");
    match line.strip_prefix(&prefix).and_then(|rest| rest.strip_suffix('"')) {
        Some(quoted) => {
            let mut value = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                value.push(if c == '\\' { chars.next().unwrap_or('\\') } else { c });
            }
            Ok(value)
        }
        None => bail!("upsd answered {line:?} to GET VAR {UPS_NAME} {name}"),
    }
}
