//! Power sequences against real peers on 127.0.0.1: the throwaway sshd from
//! tests/harness/install-power-peers.sh shuts the "OS" down, and an in-test smart plug (Shelly
//! Gen2 RPC and Tasmota shapes) meters a machine whose draw falls once the OS has halted. The
//! plug's request log shows when the relay was cut against what the meter reported.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::response::IntoResponse;
use homelab_autoscaler::api::{
    HttpPower, HttpRequest, PowerAction, PowerDriverKind, PowerMeter, PowerSpec, PowerStep,
    SecretKeyRef, SshShutdown,
};
use homelab_autoscaler::power::cli::{OffArgs, PowerCommand, PowerTarget};
use homelab_autoscaler::power::{self, Secrets};
use homelab_harness::power_peers::SshPeer;

/// The draw of the machine running, halted (standby) and unplugged.
const RUNNING_WATTS: f64 = 95.0;
const STANDBY_WATTS: f64 = 4.0;
/// How long the OS takes to halt after the shutdown command: the sequence must read the meter
/// while the machine still runs, after the SSH session closes and the next step starts, which
/// takes well under a second idle and seconds on the loaded two-core machine.
const HALT_TAKES: Duration = Duration::from_secs(10);
/// The off sequence's threshold and how long the draw must stay under it.
const THRESHOLD_WATTS: f64 = 10.0;
const STEADY: Duration = Duration::from_secs(2);

/// The two plug shapes the endpoint speaks.
#[derive(Clone, Copy, Debug)]
enum Shape {
    ShellyGen2,
    Tasmota,
}

/// One request as the plug saw it: a meter read (with the watts it reported) or a switch.
#[derive(Clone, Debug)]
enum Seen {
    Meter { at: Instant, watts: f64 },
    Switch { at: Instant, on: bool },
}

/// The machine behind the plug: the relay, and the OS, which halts `HALT_TAKES` after the
/// shutdown command leaves `halt_marker`.
struct Machine {
    relay: bool,
    halt_marker: PathBuf,
}

impl Machine {
    fn watts(&self) -> f64 {
        if !self.relay {
            return 0.0;
        }
        let halted = std::fs::metadata(&self.halt_marker)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .is_some_and(|since| since >= HALT_TAKES);
        if halted { STANDBY_WATTS } else { RUNNING_WATTS }
    }
}

/// Serves the plug of `shape` on a loopback port; returns the port and the request log.
async fn metered_plug(shape: Shape, halt_marker: PathBuf) -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let machine = Arc::new(Mutex::new(Machine { relay: true, halt_marker }));
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |uri: http::Uri| {
        let (record, machine) = (record.clone(), machine.clone());
        async move {
            let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or_default();
            let mut machine = machine.lock().expect("lock");
            let switch = match (shape, path_and_query) {
                (Shape::ShellyGen2, "/rpc/Switch.Set?id=0&on=true")
                | (Shape::Tasmota, "/cm?cmnd=Power%20On") => Some(true),
                (Shape::ShellyGen2, "/rpc/Switch.Set?id=0&on=false")
                | (Shape::Tasmota, "/cm?cmnd=Power%20Off") => Some(false),
                _ => None,
            };
            let at = Instant::now();
            if let Some(on) = switch {
                machine.relay = on;
                record.lock().expect("lock").push(Seen::Switch { at, on });
                return axum::Json(serde_json::json!({ "was_on": !on })).into_response();
            }
            let watts = machine.watts();
            let body = match (shape, path_and_query) {
                (Shape::ShellyGen2, "/rpc/Switch.GetStatus?id=0") => serde_json::json!({
                    "id": 0, "source": "http", "output": machine.relay, "apower": watts,
                    "voltage": 231.4, "current": watts / 231.4,
                }),
                (Shape::Tasmota, "/cm?cmnd=Status%208") => serde_json::json!({
                    "StatusSNS": { "Time": "2026-03-10T10:00:00",
                        "ENERGY": { "Power": watts, "Voltage": 231, "Total": 12.5 } },
                }),
                _ => return http::StatusCode::NOT_FOUND.into_response(),
            };
            record.lock().expect("lock").push(Seen::Meter { at, watts });
            axum::Json(body).into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, seen)
}

fn get(url: String) -> HttpRequest {
    HttpRequest { method: Some("GET".into()), url, headers: vec![], body: None, basic_auth: None }
}

/// The plug's settings as docs/power.md writes them for `shape`; `metered` adds the meter.
fn plug(shape: Shape, port: u16, metered: bool) -> HttpPower {
    let base = format!("http://127.0.0.1:{port}");
    let (on, off, meter, pointer) = match shape {
        Shape::ShellyGen2 => (
            "/rpc/Switch.Set?id=0&on=true",
            "/rpc/Switch.Set?id=0&on=false",
            "/rpc/Switch.GetStatus?id=0",
            "/apower",
        ),
        Shape::Tasmota => (
            "/cm?cmnd=Power%20On",
            "/cm?cmnd=Power%20Off",
            "/cm?cmnd=Status%208",
            "/StatusSNS/ENERGY/Power",
        ),
    };
    HttpPower {
        on: Some(get(format!("{base}{on}"))),
        off: Some(get(format!("{base}{off}"))),
        meter: metered.then(|| PowerMeter {
            request: HttpRequest { method: None, ..get(format!("{base}{meter}")) },
            watts_pointer: pointer.into(),
        }),
        insecure_skip_verify: false,
    }
}

fn step(driver: PowerDriverKind) -> PowerStep {
    PowerStep::of(driver)
}

/// `ssh` then the relay once the draw has stayed under the threshold.
fn off_when_drawn_down(timeout_seconds: u32) -> Vec<PowerStep> {
    let steady = u32::try_from(STEADY.as_secs()).expect("seconds");
    vec![
        step(PowerDriverKind::Ssh),
        PowerStep {
            after_draw_below_watts: Some(THRESHOLD_WATTS),
            draw_steady_seconds: Some(steady),
            timeout_seconds: Some(timeout_seconds),
            ..step(PowerDriverKind::Http)
        },
    ]
}

fn plug_and_ssh(
    peer: &SshPeer,
    command: String,
    http: HttpPower,
    off: Vec<PowerStep>,
) -> PowerSpec {
    PowerSpec {
        http: Some(http),
        ssh: Some(SshShutdown {
            host: "127.0.0.1".into(),
            port: Some(peer.port),
            user: peer.user.clone(),
            private_key: SecretKeyRef { name: "ssh-key".into(), key: "ssh-privatekey".into() },
            known_host_key: peer.host_key.clone(),
            command: Some(command),
        }),
        off_sequence: off,
        ..PowerSpec::default()
    }
}

fn mounted_key(dir: &Path, peer: &SshPeer) -> Secrets {
    let at = dir.join("ssh-key");
    std::fs::create_dir_all(&at).expect("secret dir");
    std::fs::write(at.join("ssh-privatekey"), &peer.client_key).expect("key");
    Secrets::mounted(dir)
}

/// A halt marker left by a shutdown that landed long before: the machine reads at standby.
fn halted_long_ago(marker: &Path) -> PathBuf {
    let halted = std::fs::File::create(marker).expect("marker");
    halted.set_modified(SystemTime::now() - 2 * HALT_TAKES).expect("mtime");
    marker.to_path_buf()
}

fn cuts(log: &[Seen]) -> Vec<Instant> {
    log.iter()
        .filter_map(|s| match s {
            Seen::Switch { at, on: false } => Some(*at),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_relay_is_cut_once_the_draw_has_fallen_for_each_plug_shape() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = mounted_key(dir.path(), &peer);
    for shape in [Shape::ShellyGen2, Shape::Tasmota] {
        let marker = peer.dir.join(format!("halted-{shape:?}"));
        let (port, log) = metered_plug(shape, marker.clone()).await;
        let spec = plug_and_ssh(
            &peer,
            format!("touch {}", marker.display()),
            plug(shape, port, true),
            off_when_drawn_down(30),
        );
        let started = Instant::now();
        let done = power::power(&spec, PowerAction::Off, &secrets).await.expect("off");
        assert!(
            done.summary.starts_with("ssh: ") && done.summary.contains("; http: the draw"),
            "{shape:?}: {}",
            done.summary
        );

        let log = log.lock().expect("lock").clone();
        let cut = match cuts(&log).as_slice() {
            [one] => *one,
            other => panic!("{shape:?}: one relay cut expected, saw {} in {log:?}", other.len()),
        };
        assert!(cut.duration_since(started) >= HALT_TAKES, "{shape:?}: cut before the OS halted");
        let before: Vec<(Instant, f64)> = log
            .iter()
            .filter_map(|s| match s {
                Seen::Meter { at, watts } if *at < cut => Some((*at, *watts)),
                _ => None,
            })
            .collect();
        assert!(
            before.iter().any(|(_, w)| *w == RUNNING_WATTS),
            "{shape:?}: the meter read the running machine first: {before:?}"
        );
        // The readings since the draw fell are all under the threshold, span STEADY, and no
        // reading at or above it came after the first one under it.
        let fell = before.iter().position(|(_, w)| *w < THRESHOLD_WATTS).expect("a low reading");
        assert!(before[fell..].iter().all(|(_, w)| *w == STANDBY_WATTS), "{shape:?}: {before:?}");
        assert!(
            cut.duration_since(before[fell].0) >= STEADY,
            "{shape:?}: the relay was cut {:?} after the draw fell, before {STEADY:?}",
            cut.duration_since(before[fell].0)
        );
        let settings = spec.http.as_ref().expect("http");
        let after = power::http::read_watts(settings, &secrets).await.expect("meter");
        assert_eq!(after, 0.0, "{shape:?}: the relay is open");
    }
}

#[tokio::test]
async fn an_unmetered_plug_cuts_the_relay_after_the_fixed_wait() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = mounted_key(dir.path(), &peer);
    let marker = peer.dir.join("halted");
    let (port, log) = metered_plug(Shape::ShellyGen2, marker.clone()).await;
    let wait = PowerStep {
        delay_seconds: Some(2),
        timeout_seconds: Some(10),
        ..step(PowerDriverKind::Http)
    };
    let spec = plug_and_ssh(
        &peer,
        format!("touch {}", marker.display()),
        plug(Shape::ShellyGen2, port, false),
        vec![step(PowerDriverKind::Ssh), wait],
    );
    power::power(&spec, PowerAction::Off, &secrets).await.expect("off");
    let halted_at =
        std::fs::metadata(&marker).and_then(|m| m.modified()).expect("the OS was shut down");
    let log = log.lock().expect("lock").clone();
    assert_eq!(cuts(&log).len(), 1, "{log:?}");
    assert!(log.iter().all(|s| matches!(s, Seen::Switch { .. })), "no meter was read: {log:?}");
    let since_halt = SystemTime::now().duration_since(halted_at).expect("clock");
    assert!(since_halt >= Duration::from_secs(2), "the relay waited the delay: {since_halt:?}");
}

/// A machine whose BIOS does not power on when AC returns: the on sequence switches the plug
/// on, gives the power supply a moment, then wakes the machine over the LAN.
#[tokio::test]
async fn the_on_sequence_switches_the_plug_on_and_then_wakes_the_machine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, log) = metered_plug(Shape::ShellyGen2, dir.path().join("never-halts")).await;
    let nic = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let nic_port = nic.local_addr().expect("addr").port();
    let woken = tokio::spawn(async move {
        let mut packet = [0u8; 512];
        let (len, _) = nic.recv_from(&mut packet).await.expect("recv");
        (Instant::now(), packet[..len].to_vec())
    });
    let spec = PowerSpec {
        http: Some(plug(Shape::ShellyGen2, port, false)),
        wake_on_lan: Some(homelab_autoscaler::api::WakeOnLan {
            mac: "52:54:00:ab:cd:ef".into(),
            broadcast_address: Some("127.0.0.1".into()),
            port: Some(nic_port),
        }),
        on_sequence: vec![
            step(PowerDriverKind::Http),
            PowerStep { delay_seconds: Some(1), ..step(PowerDriverKind::WakeOnLan) },
        ],
        ..PowerSpec::default()
    };
    power::power(&spec, PowerAction::On, &Secrets::mounted(dir.path())).await.expect("on");
    let (woken_at, packet) = tokio::time::timeout(Duration::from_secs(5), woken)
        .await
        .expect("a magic packet within 5 s")
        .expect("the NIC");
    assert_eq!(packet.len(), 102, "a magic packet");
    assert_eq!(&packet[6..12], &[0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
    let log = log.lock().expect("lock").clone();
    let switched_on: Vec<Instant> = log
        .iter()
        .filter_map(|s| match s {
            Seen::Switch { at, on: true } => Some(*at),
            _ => None,
        })
        .collect();
    assert_eq!(switched_on.len(), 1, "the relay is switched on once: {log:?}");
    assert!(cuts(&log).is_empty(), "{log:?}");
    let gap = woken_at.duration_since(switched_on[0]);
    assert!(gap >= Duration::from_secs(1), "woken {gap:?} after the relay, not after the delay");
}

/// An off sequence shut the OS down but never cut the relay: the plug is on, the machine halted
/// at its standby draw. Switching the plug on would change nothing and the machine would never
/// boot, so the boot switches it off first, then on.
#[tokio::test]
async fn a_boot_power_cycles_a_relay_left_on_under_a_halted_machine() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = mounted_key(dir.path(), &peer);
    let marker = halted_long_ago(&peer.dir.join("halted-relay-on"));
    let (port, log) = metered_plug(Shape::Tasmota, marker).await;
    let spec = plug_and_ssh(
        &peer,
        "true".into(),
        plug(Shape::Tasmota, port, true),
        off_when_drawn_down(30),
    );
    let done = power::power(&spec, PowerAction::On, &secrets).await.expect("on");
    assert!(done.summary.contains("switched it off first"), "{}", done.summary);
    let log = log.lock().expect("lock").clone();
    let switches: Vec<bool> = log
        .iter()
        .filter_map(|s| match s {
            Seen::Switch { on, .. } => Some(*on),
            _ => None,
        })
        .collect();
    assert_eq!(switches, [false, true], "off, then on: {log:?}");

    // A running machine's relay is left alone: only the switch-on.
    let (port, log) = metered_plug(Shape::Tasmota, peer.dir.join("running")).await;
    let spec = plug_and_ssh(
        &peer,
        "true".into(),
        plug(Shape::Tasmota, port, true),
        off_when_drawn_down(30),
    );
    power::power(&spec, PowerAction::On, &secrets).await.expect("on");
    let log = log.lock().expect("lock").clone();
    assert!(cuts(&log).is_empty(), "{log:?}");
}

/// Runs `power off` as a power Job's pod does; returns its error and termination message.
async fn off_as_a_job(spec: &PowerSpec, secrets_dir: &Path) -> (String, String) {
    let termination = secrets_dir.join("termination-log");
    let target = PowerTarget {
        slot: None,
        namespace: "ns".into(),
        spec: Some(serde_json::to_string(spec).expect("json")),
        secrets_dir: secrets_dir.to_path_buf(),
        termination_log: Some(termination.clone()),
    };
    let error = power::cli::run(PowerCommand::Off(OffArgs { target, wake_first: false }))
        .await
        .expect_err("the step fails");
    let message = std::fs::read_to_string(&termination).expect("termination message");
    (error.to_string(), message)
}

#[tokio::test]
async fn a_failed_step_names_itself_and_what_to_check_and_nothing_after_it_runs() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    mounted_key(dir.path(), &peer);
    let marker = peer.dir.join("never-halts");

    // The OS ignores the shutdown: the draw never falls, the step runs out of time.
    let (port, log) = metered_plug(Shape::ShellyGen2, marker.clone()).await;
    let spec = plug_and_ssh(
        &peer,
        "true".into(),
        plug(Shape::ShellyGen2, port, true),
        off_when_drawn_down(4),
    );
    let (error, message) = off_as_a_job(&spec, dir.path()).await;
    assert_eq!(error, message);
    assert!(
        message.starts_with(
            "spec.power.offSequence[1] (http) failed: it did not finish within \
                             its timeoutSeconds (4s)"
        ) && message.contains("waiting for the plug's draw to stay under 10 W"),
        "{message}"
    );
    let log = log.lock().expect("lock").clone();
    assert!(cuts(&log).is_empty(), "the relay stays closed: {log:?}");
    assert!(log.iter().any(|s| matches!(s, Seen::Meter { watts, .. } if *watts == RUNNING_WATTS)));

    // The shutdown command fails: the first step says so, the relay is never touched.
    let (port, log) = metered_plug(Shape::Tasmota, marker).await;
    let spec = plug_and_ssh(
        &peer,
        "echo no sudo here >&2; exit 3".into(),
        plug(Shape::Tasmota, port, true),
        off_when_drawn_down(30),
    );
    let (_, message) = off_as_a_job(&spec, dir.path()).await;
    assert!(message.starts_with("spec.power.offSequence[0] (ssh) failed: "), "{message}");
    assert!(message.contains("exited 3: no sudo here"), "{message}");
    // Only the one reading that found the machine running, before the first step.
    let log = log.lock().expect("lock").clone();
    assert!(
        matches!(log.as_slice(), [Seen::Meter { watts, .. }] if *watts == RUNNING_WATTS),
        "no switch after a failed step: {log:?}"
    );
}

/// An earlier attempt's shutdown landed and its relay step failed: the OS is halted, the relay
/// still on, and SSH cannot reach the machine. The retry sees the standby draw, skips the
/// shutdown, and cuts the relay; before, it ran the SSH step first and failed there every time.
#[tokio::test]
async fn a_retried_off_sequence_finishes_the_relay_step_of_a_halted_machine() {
    let peer = SshPeer::start().await.expect("sshd");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = mounted_key(dir.path(), &peer);
    let marker = halted_long_ago(&peer.dir.join("halted-long-ago"));
    let (port, log) = metered_plug(Shape::ShellyGen2, marker).await;
    let mut spec = plug_and_ssh(
        &peer,
        "true".into(),
        plug(Shape::ShellyGen2, port, true),
        off_when_drawn_down(30),
    );
    // The halted machine answers no SSH: a closed port.
    let closed = homelab_harness::ports::free_port().expect("a free port");
    spec.ssh.as_mut().expect("ssh").port = Some(closed);
    let done = power::power(&spec, PowerAction::Off, &secrets).await.expect("the retry finishes");
    assert!(
        done.summary.starts_with("steps before 1 skipped: the draw reads 4 W, under 10 W")
            && done.summary.contains("http: the draw stayed under 10 W"),
        "{}",
        done.summary
    );
    let log = log.lock().expect("lock").clone();
    assert_eq!(cuts(&log).len(), 1, "the relay is cut once: {log:?}");
}
