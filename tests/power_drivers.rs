//! The power drivers against real protocol peers on 127.0.0.1: sushy-emulator (Redfish),
//! ipmi_sim and pyghmi's fakebmc (IPMI over RMCP+), sshd, a UDP listener (Wake-on-LAN) and an
//! in-test HTTP endpoint (smart-plug presets); names resolved by an in-test nameserver on
//! 127.0.0.153:53. The peers come from tests/harness/install-power-peers.sh.

use std::path::Path;
use std::time::Duration;

use homelab_autoscaler::api::{
    CredentialsRef, HttpHeader, HttpPower, HttpRequest, Ipmi, IpmiOffMethod, PowerAction,
    PowerSpec, Redfish, RedfishTls, SecretKeyRef, SshShutdown, WakeOnLan,
};
use homelab_autoscaler::power::{self, PowerError, PowerState, Secrets};
use homelab_harness::http::Recorder;
use homelab_harness::power_peers::{FakeBmcPeer, IpmiPeer, RedfishPeer, SshPeer};

/// Writes Secrets the way a power Job's pod sees them: `<dir>/<secret>/<key>`.
fn secrets(dir: &Path, entries: &[(&str, &str, &str)]) -> Secrets {
    for (secret, key, value) in entries {
        let at = dir.join(secret);
        std::fs::create_dir_all(&at).expect("secret dir");
        std::fs::write(at.join(key), value).expect("secret file");
    }
    Secrets::mounted(dir)
}

fn login(secret: &str, user: &str, password: &str) -> Vec<(String, String, String)> {
    vec![
        (secret.into(), "username".into(), user.into()),
        (secret.into(), "password".into(), format!("{password}\n")),
    ]
}

fn secrets_owned(dir: &Path, entries: &[(String, String, String)]) -> Secrets {
    let borrowed: Vec<(&str, &str, &str)> =
        entries.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
    secrets(dir, &borrowed)
}

#[tokio::test]
async fn wake_on_lan_sends_exactly_the_magic_packet() {
    let listener = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let spec = PowerSpec {
        wake_on_lan: Some(WakeOnLan {
            mac: "52:54:00:ab:cd:ef".into(),
            broadcast_address: Some("127.0.0.1".into()),
            port: Some(port),
        }),
        ..PowerSpec::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let done =
        power::power(&spec, PowerAction::On, &Secrets::mounted(dir.path())).await.expect("wake");
    assert!(done.summary.contains("52:54:00:ab:cd:ef"), "{}", done.summary);
    let mut buf = [0u8; 512];
    let (len, _) = tokio::time::timeout(Duration::from_secs(5), listener.recv_from(&mut buf))
        .await
        .expect("a packet within 5s")
        .expect("recv");
    assert_eq!(len, 102);
    let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
    assert_eq!(&buf[..6], &[0xFF; 6]);
    for i in 0..16 {
        assert_eq!(&buf[6 + 6 * i..12 + 6 * i], &mac, "repetition {i}");
    }
}

/// One request as the in-test endpoint saw it.
fn request(method: &str, url: String, body: Option<&str>) -> HttpRequest {
    HttpRequest {
        method: Some(method.into()),
        url,
        headers: vec![],
        body: body.map(str::to_owned),
        basic_auth: None,
    }
}

#[tokio::test]
async fn http_presets_send_what_each_device_expects() {
    let endpoint = Recorder::start(200).await.expect("endpoint");
    let port = endpoint.port;
    let base = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets(dir.path(), &[("ha-token", "token", "abc123\n")]);
    // Shelly Gen2 RPC, Tasmota, Home Assistant (as in docs/power.md).
    let shelly = HttpPower {
        on: Some(request("POST", format!("{base}/rpc/Switch.Set"), Some(r#"{"id":0,"on":true}"#))),
        off: Some(request(
            "POST",
            format!("{base}/rpc/Switch.Set"),
            Some(r#"{"id":0,"on":false}"#),
        )),
        meter: None,
        insecure_skip_verify: false,
    };
    let tasmota = HttpPower {
        on: Some(request("GET", format!("{base}/cm?cmnd=Power%20On"), None)),
        off: Some(request("GET", format!("{base}/cm?cmnd=Power%20Off"), None)),
        meter: None,
        insecure_skip_verify: false,
    };
    let home_assistant = |service: &str| HttpRequest {
        headers: vec![
            HttpHeader {
                name: "Authorization".into(),
                value: None,
                value_from: Some(SecretKeyRef { name: "ha-token".into(), key: "token".into() }),
                value_prefix: Some("Bearer ".into()),
            },
            HttpHeader {
                name: "Content-Type".into(),
                value: Some("application/json".into()),
                value_from: None,
                value_prefix: None,
            },
        ],
        ..request(
            "POST",
            format!("{base}/api/services/switch/{service}"),
            Some(r#"{"entity_id":"switch.rack_1"}"#),
        )
    };
    let ha = HttpPower {
        on: Some(home_assistant("turn_on")),
        off: Some(home_assistant("turn_off")),
        meter: None,
        insecure_skip_verify: false,
    };
    for http in [shelly, tasmota, ha] {
        let spec = PowerSpec { http: Some(http), ..PowerSpec::default() };
        power::power(&spec, PowerAction::On, &secrets).await.expect("on");
        power::power(&spec, PowerAction::Off, &secrets).await.expect("off");
    }
    let seen = endpoint.seen();
    let summary: Vec<(String, String, String)> =
        seen.iter().map(|s| (s.method.clone(), s.uri.clone(), s.body.clone())).collect();
    let want = [
        ("POST", "/rpc/Switch.Set", r#"{"id":0,"on":true}"#),
        ("POST", "/rpc/Switch.Set", r#"{"id":0,"on":false}"#),
        ("GET", "/cm?cmnd=Power%20On", ""),
        ("GET", "/cm?cmnd=Power%20Off", ""),
        ("POST", "/api/services/switch/turn_on", r#"{"entity_id":"switch.rack_1"}"#),
        ("POST", "/api/services/switch/turn_off", r#"{"entity_id":"switch.rack_1"}"#),
    ];
    let want: Vec<(String, String, String)> =
        want.iter().map(|(m, u, b)| (m.to_string(), u.to_string(), b.to_string())).collect();
    assert_eq!(summary, want);
    for ha in &seen[4..] {
        assert_eq!(ha.headers["authorization"], "Bearer abc123", "the token from the Secret");
        assert_eq!(ha.headers["content-type"], "application/json");
    }
}

#[tokio::test]
async fn http_refusal_names_the_secret() {
    let endpoint = Recorder::start(401).await.expect("endpoint");
    let port = endpoint.port;
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("plug-login", "admin", "wrong"));
    let mut on = request("POST", format!("http://127.0.0.1:{port}/relay/0?turn=on"), None);
    on.basic_auth = Some(CredentialsRef { secret_name: "plug-login".into() });
    let spec = PowerSpec {
        http: Some(HttpPower { on: Some(on), off: None, meter: None, insecure_skip_verify: false }),
        ..PowerSpec::default()
    };
    let error = power::power(&spec, PowerAction::On, &secrets).await.expect_err("refused");
    let message = error.to_string();
    assert!(matches!(error, PowerError::Unauthorized { .. }), "{message}");
    assert!(
        message.contains("answered 401") && message.contains("check Secret plug-login"),
        "{message}"
    );
}

fn redfish_spec(peer: &RedfishPeer, secret: &str) -> PowerSpec {
    PowerSpec {
        redfish: Some(Redfish {
            endpoint: peer.endpoint(),
            system_id: None,
            credentials: CredentialsRef { secret_name: secret.into() },
            tls: None,
            on_reset_type: None,
            off_reset_type: Some("ForceOff".into()),
        }),
        confirm_timeout_seconds: Some(30),
        ..PowerSpec::default()
    }
}

#[tokio::test]
async fn redfish_powers_on_and_off_and_confirms_the_power_state() {
    let peer = RedfishPeer::start().await.expect("sushy-emulator");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("bmc-login", &peer.user, &peer.password));
    let spec = redfish_spec(&peer, "bmc-login");
    assert_eq!(power::status(&spec, &secrets).await.expect("status"), Some(PowerState::Off));
    let on = power::power(&spec, PowerAction::On, &secrets).await.expect("power on");
    assert!(on.summary.contains("reports On"), "{}", on.summary);
    assert_eq!(power::status(&spec, &secrets).await.expect("status"), Some(PowerState::On));
    // Asking again is a no-op that says so.
    let again = power::power(&spec, PowerAction::On, &secrets).await.expect("power on again");
    assert!(again.summary.contains("already reports On"), "{}", again.summary);
    let off = power::power(&spec, PowerAction::Off, &secrets).await.expect("power off");
    assert!(off.summary.contains("reports Off"), "{}", off.summary);
    assert_eq!(power::status(&spec, &secrets).await.expect("status"), Some(PowerState::Off));

    // The default reset types (On, GracefulShutdown).
    let mut defaults = spec.clone();
    if let Some(redfish) = defaults.redfish.as_mut() {
        redfish.off_reset_type = None;
        redfish.system_id = Some(peer.system_uuid.clone());
    }
    power::power(&defaults, PowerAction::On, &secrets).await.expect("power on");
    let off = power::power(&defaults, PowerAction::Off, &secrets).await.expect("graceful off");
    assert!(off.summary.contains("reports Off"), "{}", off.summary);
}

#[tokio::test]
async fn redfish_wrong_password_is_a_clear_refusal_also_in_the_pod() {
    let peer = RedfishPeer::start().await.expect("sushy-emulator");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("bmc-login", &peer.user, "not-the-password"));
    let spec = redfish_spec(&peer, "bmc-login");
    let error = power::power(&spec, PowerAction::On, &secrets).await.expect_err("refused");
    let message = error.to_string();
    assert!(message.starts_with("BMC at 127.0.0.1 refused the login (answered 401"), "{message}");
    assert!(message.ends_with("check Secret bmc-login"), "{message}");

    // The pod's contract: settings in HOMELAB_POWER_SPEC, Secrets mounted, the failure in the
    // termination message.
    let log = dir.path().join("termination-log");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"))
        .args(["power", "on"])
        .env("HOMELAB_POWER_SPEC", serde_json::to_string(&spec).expect("json"))
        .env("HOMELAB_POWER_SECRETS_DIR", dir.path())
        .env("HOMELAB_POWER_TERMINATION_LOG", &log)
        .output()
        .expect("run the binary");
    assert!(!out.status.success(), "a refusal fails the pod");
    let termination = std::fs::read_to_string(&log).expect("termination message");
    assert_eq!(termination, message);
}

/// A name the test nameserver denies fails at once: under the Redfish and SSH drivers' 20 s and
/// 30 s connect timeouts, which a driver that retried the name would run into, and seconds above
/// what the power binary's start and one answer take on a loaded machine.
const NAME_ERROR_QUICK: Duration = Duration::from_secs(10);

/// The spec's confirmation wait: a refusal must end before it, where a driver that took the
/// refusal for a slow BMC would wait it out. Its 20 s leave a loaded machine room for the login.
fn confirm_wait(spec: &PowerSpec) -> Duration {
    Duration::from_secs(u64::from(spec.confirm_timeout_seconds.expect("a confirm timeout")))
}

fn ipmi_spec(peer: &IpmiPeer, secret: &str, off: IpmiOffMethod) -> PowerSpec {
    PowerSpec {
        ipmi: Some(Ipmi {
            host: "127.0.0.1".into(),
            port: Some(peer.port),
            credentials: CredentialsRef { secret_name: secret.into() },
            cipher_suite: Some(3),
            privilege_level: None,
            off_method: Some(off),
        }),
        confirm_timeout_seconds: Some(20),
        ..PowerSpec::default()
    }
}

#[tokio::test]
async fn ipmi_powers_the_chassis_on_and_off_as_ipmitool_sees_it() {
    let peer = IpmiPeer::start().await.expect("ipmi_sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("ipmi-creds", &peer.user, &peer.password));
    let spec = ipmi_spec(&peer, "ipmi-creds", IpmiOffMethod::Hard);
    assert_eq!(power::status(&spec, &secrets).await.expect("status"), Some(PowerState::Off));
    let on = power::power(&spec, PowerAction::On, &secrets).await.expect("power on");
    assert!(on.summary.contains("reports On"), "{}", on.summary);
    assert_eq!(peer.power_file().expect("power file"), "1");
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is on");
    let off = power::power(&spec, PowerAction::Off, &secrets).await.expect("power off");
    assert!(off.summary.contains("reports Off"), "{}", off.summary);
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is off");

    // The default off is an ACPI soft shutdown. The simulated chassis has no OS to act on it,
    // like a machine whose OS ignores the power button: the BMC accepts, the machine stays on,
    // and the driver says so when its confirmation deadline passes.
    let mut soft = ipmi_spec(&peer, "ipmi-creds", IpmiOffMethod::Soft);
    soft.confirm_timeout_seconds = Some(3);
    power::power(&soft, PowerAction::On, &secrets).await.expect("power on");
    let error = power::power(&soft, PowerAction::Off, &secrets).await.expect_err("not confirmed");
    assert!(matches!(error, PowerError::NotConfirmed { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        format!("BMC at 127.0.0.1:{} did not report Off within 3s (last reported On)", peer.port)
    );
}

#[tokio::test]
async fn ipmi_wrong_password_is_a_clear_refusal() {
    let peer = IpmiPeer::start().await.expect("ipmi_sim");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("ipmi-creds", &peer.user, "wrong"));
    let spec = ipmi_spec(&peer, "ipmi-creds", IpmiOffMethod::Hard);
    let started = std::time::Instant::now();
    let error = power::power(&spec, PowerAction::On, &secrets).await.expect_err("refused");
    let message = error.to_string();
    assert!(matches!(error, PowerError::Unauthorized { .. }), "{message}");
    assert!(
        message.contains(&format!("BMC at 127.0.0.1:{} refused the login", peer.port)),
        "{message}"
    );
    assert!(message.ends_with("check Secret ipmi-creds"), "{message}");
    assert!(started.elapsed() < confirm_wait(&spec), "a refusal is quick: {:?}", started.elapsed());
    assert_eq!(peer.power_file().expect("power file"), "0", "nothing changed");
}

fn ssh_spec(peer: &SshPeer, command: String, host_key: String) -> PowerSpec {
    PowerSpec {
        ssh: Some(SshShutdown {
            host: "127.0.0.1".into(),
            port: Some(peer.port),
            user: peer.user.clone(),
            private_key: SecretKeyRef { name: "ssh-key".into(), key: "ssh-privatekey".into() },
            known_host_key: host_key,
            command: Some(command),
        }),
        ..PowerSpec::default()
    }
}

#[tokio::test]
async fn ssh_runs_the_shutdown_command_and_refuses_a_wrong_host_key() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets(dir.path(), &[("ssh-key", "ssh-privatekey", &peer.client_key)]);
    let marker = peer.dir.join("powered-off");
    let command = format!("touch {}", marker.display());

    // A host key that is not the machine's: refused before logging in, nothing runs.
    let other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
    let spec = ssh_spec(&peer, command.clone(), other.into());
    let error = power::power(&spec, PowerAction::Off, &secrets).await.expect_err("refused");
    let message = error.to_string();
    assert!(message.contains("not the one in ssh.knownHostKey"), "{message}");
    assert!(message.contains(&peer.host_key), "names the key it was offered: {message}");
    assert!(!marker.exists(), "no command ran");

    let spec = ssh_spec(&peer, command, peer.host_key.clone());
    let done = power::power(&spec, PowerAction::Off, &secrets).await.expect("shutdown");
    assert!(done.summary.contains("ran \"touch"), "{}", done.summary);
    assert!(marker.exists(), "the command ran on the machine");

    // A command that fails says how.
    let spec = ssh_spec(&peer, "echo no sudo here >&2; exit 3".into(), peer.host_key.clone());
    let error = power::power(&spec, PowerAction::Off, &secrets).await.expect_err("exit 3");
    assert!(error.to_string().contains("exited 3: no sudo here"), "{error}");
}

/// A session that closes without an exit status is what a stalled or dropped link looks like
/// after `exec` as much as a machine going down: the command was sent, which proves nothing.
/// Here the command kills its own sshd session (the connection closes, no exit status) and the
/// host goes on answering on its SSH port: the shutdown is not confirmed, and says why.
#[tokio::test]
async fn ssh_a_session_closed_without_an_exit_status_on_a_host_that_still_answers_is_not_done() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets(dir.path(), &[("ssh-key", "ssh-privatekey", &peer.client_key)]);
    let mut spec = ssh_spec(&peer, "kill -9 $PPID".into(), peer.host_key.clone());
    spec.confirm_timeout_seconds = Some(3);
    let started = std::time::Instant::now();
    let error = power::power(&spec, PowerAction::Off, &secrets).await.expect_err("not confirmed");
    let message = error.to_string();
    assert!(matches!(error, PowerError::NotConfirmed { .. }), "{message}");
    assert!(message.contains("without an exit status"), "{message}");
    assert!(message.contains(&format!("answers on port {}", peer.port)), "{message}");
    assert!(
        started.elapsed() >= confirm_wait(&spec),
        "it watched the host for its confirm timeout: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn redfish_over_tls_trusts_the_ca_bundle_from_its_secret() {
    homelab_autoscaler::tls::install_crypto_provider();
    let tls = tempfile::tempdir().expect("tempdir");
    homelab_autoscaler::tls::issue_self_signed(
        &["localhost".into()],
        &["127.0.0.1".parse().expect("ip")],
    )
    .expect("certificate")
    .write_secret_layout(tls.path())
    .expect("write");
    let peer = RedfishPeer::start_tls(tls.path()).await.expect("sushy-emulator over TLS");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut entries = login("bmc-login", &peer.user, &peer.password);
    let ca = std::fs::read_to_string(tls.path().join("ca.crt")).expect("ca");
    entries.push(("bmc-ca".into(), "ca.crt".into(), ca));
    let secrets = secrets_owned(dir.path(), &entries);
    let mut spec = redfish_spec(&peer, "bmc-login");
    assert!(peer.endpoint().starts_with("https://"));

    // Public roots only: the BMC's certificate is not trusted, and the error says TLS.
    let error = power::status(&spec, &secrets).await.expect_err("untrusted");
    assert!(error.to_string().contains("invalid peer certificate: UnknownIssuer"), "{error}");

    let redfish = spec.redfish.as_mut().expect("redfish");
    redfish.tls = Some(RedfishTls {
        ca_bundle: Some(SecretKeyRef { name: "bmc-ca".into(), key: "ca.crt".into() }),
        insecure_skip_verify: false,
    });
    assert_eq!(power::status(&spec, &secrets).await.expect("trusted"), Some(PowerState::Off));

    let redfish = spec.redfish.as_mut().expect("redfish");
    redfish.tls = Some(RedfishTls { ca_bundle: None, insecure_skip_verify: true });
    assert_eq!(power::status(&spec, &secrets).await.expect("unverified"), Some(PowerState::Off));
}

fn fakebmc_spec(peer: &FakeBmcPeer, host: &str, off: IpmiOffMethod) -> PowerSpec {
    PowerSpec {
        ipmi: Some(Ipmi {
            host: host.into(),
            port: Some(peer.port),
            credentials: CredentialsRef { secret_name: "ipmi-creds".into() },
            cipher_suite: None,
            privilege_level: None,
            off_method: Some(off),
        }),
        confirm_timeout_seconds: Some(20),
        ..PowerSpec::default()
    }
}

/// What the binary did: success, stdout, stderr, and the termination message.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
    termination: String,
}

/// Runs `homelab-autoscaler power <action>` as a power Job's pod does: the settings in
/// `HOMELAB_POWER_SPEC`, the Secrets mounted under `secrets`, names resolved with the
/// nameservers in `resolv_conf` (the pod's /etc/resolv.conf).
fn power_binary(action: &str, spec: &PowerSpec, secrets: &Path, resolv_conf: &Path) -> Ran {
    let log = tempfile::NamedTempFile::new().expect("termination log");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"))
        .args(["power", action])
        .env("HOMELAB_POWER_SPEC", serde_json::to_string(spec).expect("json"))
        .env("HOMELAB_POWER_SECRETS_DIR", secrets)
        .env("HOMELAB_POWER_TERMINATION_LOG", log.path())
        .env(power::resolve::RESOLV_CONF_ENV, resolv_conf)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run the binary");
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        termination: std::fs::read_to_string(log.path()).unwrap_or_default(),
    }
}

#[tokio::test]
async fn ipmi_goes_on_when_the_bmc_does_not_answer_the_rmcp_ping() {
    let peer = FakeBmcPeer::start().await.expect("fakebmc");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("ipmi-creds", &peer.user, &peer.password));
    let spec = fakebmc_spec(&peer, "127.0.0.1", IpmiOffMethod::Hard);
    assert_eq!(power::status(&spec, &secrets).await.expect("status"), Some(PowerState::Off));
    let on = power::power(&spec, PowerAction::On, &secrets).await.expect("power on");
    assert!(on.summary.contains("reports On"), "{}", on.summary);
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is on");
    let off = power::power(&spec, PowerAction::Off, &secrets).await.expect("hard off");
    assert!(off.summary.contains("reports Off"), "{}", off.summary);
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is off");

    // The pod's way, through the binary: status, on, and the default soft off, which fakebmc's
    // machine obeys.
    let resolv_conf = dir.path().join("resolv.conf");
    std::fs::write(&resolv_conf, "# IP literals only: no nameserver is asked\n").expect("write");
    let soft = fakebmc_spec(&peer, "127.0.0.1", IpmiOffMethod::Soft);
    let status = power_binary("status", &soft, dir.path(), &resolv_conf);
    assert!(status.ok, "{}", status.stderr);
    assert_eq!(status.stdout, "on: ipmi\noff: ipmi\npower state: Off\n");
    let on = power_binary("on", &soft, dir.path(), &resolv_conf);
    assert!(on.ok, "{}", on.stderr);
    assert!(
        on.stdout.starts_with(&format!("on (ipmi): BMC at 127.0.0.1:{} reports On", peer.port)),
        "{}",
        on.stdout
    );
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is on");
    let off = power_binary("off", &soft, dir.path(), &resolv_conf);
    assert!(off.ok, "{}", off.stderr);
    assert!(off.stdout.contains("reports Off"), "{}", off.stdout);
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is off");
}

#[tokio::test]
async fn ipmi_wrong_password_without_the_rmcp_pong_is_a_clear_refusal() {
    let peer = FakeBmcPeer::start().await.expect("fakebmc");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = secrets_owned(dir.path(), &login("ipmi-creds", &peer.user, "wrong"));
    let spec = fakebmc_spec(&peer, "127.0.0.1", IpmiOffMethod::Hard);
    let started = std::time::Instant::now();
    let error = power::power(&spec, PowerAction::On, &secrets).await.expect_err("refused");
    let message = error.to_string();
    assert!(matches!(error, PowerError::Unauthorized { .. }), "{message}");
    assert!(
        message.starts_with(&format!("BMC at 127.0.0.1:{} refused the login", peer.port)),
        "{message}"
    );
    assert!(message.ends_with("check Secret ipmi-creds"), "{message}");
    assert!(started.elapsed() < confirm_wait(&spec), "quick: {:?}", started.elapsed());
    assert_eq!(peer.reference_status().expect("ipmitool"), "Chassis Power is off");

    // No BMC on the port: the host refuses it, and the error says so rather than "no pong".
    let closed =
        std::net::UdpSocket::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
    let mut spec = fakebmc_spec(&peer, "127.0.0.1", IpmiOffMethod::Hard);
    spec.ipmi.as_mut().expect("ipmi").port = Some(closed.port());
    let error = power::status(&spec, &secrets).await.expect_err("closed");
    assert_eq!(
        error.to_string(),
        format!(
            "BMC at 127.0.0.1:{0}: UDP port {0} is closed: is IPMI over LAN enabled on the BMC, on \
             this port?",
            closed.port()
        )
    );
}

/// A nameserver on port 53 of a loopback address (a resolv.conf cannot name a port), for the
/// whole test binary: `bmc.homelab.test` and `nas.homelab.test` are 127.0.0.1, every other name
/// does not exist. It counts the questions it was asked, by name.
mod nameserver {
    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, UdpSocket};
    use std::sync::{Mutex, OnceLock};

    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType, rdata::A};

    pub const ADDRESS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 153);
    const NAMES: [&str; 2] = ["bmc.homelab.test.", "nas.homelab.test."];

    static ASKED: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

    /// Starts the nameserver once; a resolv.conf naming it.
    pub fn start(dir: &std::path::Path) -> std::path::PathBuf {
        static STARTED: OnceLock<()> = OnceLock::new();
        STARTED.get_or_init(|| {
            let socket = UdpSocket::bind((ADDRESS, 53)).unwrap_or_else(|e| {
                panic!("binding {ADDRESS}:53 for the test nameserver (needs root): {e}")
            });
            std::thread::spawn(move || serve(socket));
        });
        let path = dir.join("resolv.conf");
        std::fs::write(&path, format!("nameserver {ADDRESS}\noptions timeout:2 attempts:1\n"))
            .expect("resolv.conf");
        path
    }

    pub fn asked(name: &str) -> usize {
        ASKED.lock().expect("lock").get(name).copied().unwrap_or(0)
    }

    fn serve(socket: UdpSocket) {
        let mut buf = [0u8; 512];
        loop {
            let Ok((len, from)) = socket.recv_from(&mut buf) else { continue };
            let Ok(query) = Message::from_vec(&buf[..len]) else { continue };
            let mut answer = Message::new();
            answer
                .set_id(query.id())
                .set_message_type(MessageType::Response)
                .set_op_code(query.op_code())
                .set_recursion_desired(query.recursion_desired())
                .set_recursion_available(true)
                .set_authoritative(true);
            let mut code = ResponseCode::NoError;
            for question in query.queries() {
                answer.add_query(question.clone());
                let name = question.name().to_ascii().to_lowercase();
                *ASKED.lock().expect("lock").entry(name.clone()).or_default() += 1;
                if !NAMES.contains(&name.as_str()) {
                    code = ResponseCode::NXDomain;
                } else if question.query_type() == RecordType::A {
                    answer.add_answer(Record::from_rdata(
                        question.name().clone(),
                        60,
                        RData::A(A(Ipv4Addr::LOCALHOST)),
                    ));
                }
            }
            answer.set_response_code(code);
            if let Ok(bytes) = answer.to_vec() {
                let _ = socket.send_to(&bytes, from);
            }
        }
    }
}

#[tokio::test]
async fn drivers_reach_machines_by_name_through_resolv_conf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let resolv_conf = nameserver::start(dir.path());
    let (redfish, sshd, bmc) =
        tokio::join!(RedfishPeer::start(), SshPeer::start(), FakeBmcPeer::start());
    let (redfish, sshd, bmc) =
        (redfish.expect("sushy-emulator"), sshd.expect("sshd"), bmc.expect("fakebmc"));
    let mut entries = login("bmc-login", &redfish.user, &redfish.password);
    entries.extend(login("ipmi-creds", &bmc.user, &bmc.password));
    entries.push(("ssh-key".into(), "ssh-privatekey".into(), sshd.client_key.clone()));
    let secrets = dir.path().join("secrets");
    secrets_owned(&secrets, &entries);

    // Redfish (reqwest): the endpoint's name.
    let mut spec = redfish_spec(&redfish, "bmc-login");
    let by_name = format!("http://bmc.homelab.test:{}", redfish.port);
    spec.redfish.as_mut().expect("redfish").endpoint = by_name;
    let status = power_binary("status", &spec, &secrets, &resolv_conf);
    assert!(status.ok, "{}", status.stderr);
    assert!(status.stdout.ends_with("power state: Off\n"), "{}", status.stdout);
    let on = power_binary("on", &spec, &secrets, &resolv_conf);
    assert!(on.ok, "{}", on.stderr);
    assert!(
        on.stdout.starts_with("on (redfish): BMC at bmc.homelab.test reports On"),
        "{}",
        on.stdout
    );
    assert!(nameserver::asked("bmc.homelab.test.") > 0, "the test nameserver answered");

    // IPMI (UDP): the BMC's name.
    let spec = fakebmc_spec(&bmc, "bmc.homelab.test", IpmiOffMethod::Hard);
    let on = power_binary("on", &spec, &secrets, &resolv_conf);
    assert!(on.ok, "{}", on.stderr);
    assert!(
        on.stdout
            .starts_with(&format!("on (ipmi): BMC at bmc.homelab.test:{} reports On", bmc.port)),
        "{}",
        on.stdout
    );
    assert_eq!(bmc.reference_status().expect("ipmitool"), "Chassis Power is on");

    // SSH (russh): the machine's name.
    let marker = sshd.dir.join("powered-off");
    let mut spec = ssh_spec(&sshd, format!("touch {}", marker.display()), sshd.host_key.clone());
    spec.ssh.as_mut().expect("ssh").host = "nas.homelab.test".into();
    let off = power_binary("off", &spec, &secrets, &resolv_conf);
    assert!(off.ok, "{}", off.stderr);
    assert!(marker.exists(), "the command ran on nas.homelab.test");
    assert!(nameserver::asked("nas.homelab.test.") > 0);

    // A name that does not resolve: the error names it, in the termination message too.
    let resolv = resolv_conf.display();
    let cases = [
        ("status", {
            let mut spec = redfish_spec(&redfish, "bmc-login");
            spec.redfish.as_mut().expect("redfish").endpoint =
                format!("http://nothing.homelab.test:{}", redfish.port);
            spec
        }),
        ("on", fakebmc_spec(&bmc, "nothing.homelab.test", IpmiOffMethod::Hard)),
        ("off", {
            let mut spec = ssh_spec(&sshd, "true".into(), sshd.host_key.clone());
            spec.ssh.as_mut().expect("ssh").host = "nothing.homelab.test".into();
            spec
        }),
    ];
    for (action, spec) in cases {
        let started = std::time::Instant::now();
        let ran = power_binary(action, &spec, &secrets, &resolv_conf);
        assert!(!ran.ok, "{action}: {}", ran.stdout);
        let want = format!("cannot resolve nothing.homelab.test with the nameservers in {resolv}");
        assert!(ran.termination.contains(&want), "{action}: {}", ran.termination);
        assert!(ran.stderr.contains(&want), "{action}: {}", ran.stderr);
        assert!(started.elapsed() < NAME_ERROR_QUICK, "{action}: {:?}", started.elapsed());
    }
}
