//! The operator as it runs on a Raspberry Pi: built for aarch64 (scripts/build-arm64.sh, the
//! static binary of the image index's arm64 half, in the dev profile) and run here under
//! qemu-user. The library's unit and table tests pass on aarch64; the arm64 binary serves its
//! admission webhooks and the externalgrpc provider to the real kube-apiserver and the real
//! cluster-autoscaler, which scales a pool up and down through it; and its power command reads
//! and sets a Redfish BMC (sushy-emulator).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use homelab_autoscaler::api::{CredentialsRef, PowerSpec, Redfish};
use homelab_harness::e2e::{AutoscalerSettings, NAMESPACE, World};
use homelab_harness::power_peers::RedfishPeer;
use homelab_harness::{elf, repo_path};

/// The arm64 operator binary, built once per test process.
fn arm64_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let started = Instant::now();
        let out = Command::new(repo_path("scripts/build-arm64.sh"))
            .args(["build", "dev"])
            .output()
            .expect("run scripts/build-arm64.sh");
        assert!(
            out.status.success(),
            "scripts/build-arm64.sh build dev failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("arm64 binary built in {:.1?}", started.elapsed());
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let elf = std::fs::read(&path).expect("the arm64 binary");
        assert_eq!(elf::machine(&elf), Some(elf::EM_AARCH64), "built for aarch64");
        path
    })
}

/// An executable that runs the arm64 binary under qemu-user with its arguments: what the
/// harness starts as "the operator binary".
fn under_qemu(dir: &Path) -> PathBuf {
    let wrapper = dir.join("homelab-autoscaler-arm64");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec qemu-aarch64 {} \"$@\"\n", arm64_binary().display()),
    )
    .expect("write the wrapper");
    let mut permissions = std::fs::metadata(&wrapper).expect("wrapper").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&wrapper, permissions).expect("chmod the wrapper");
    wrapper
}

#[test]
fn the_library_tests_pass_on_aarch64_under_qemu() {
    let started = Instant::now();
    let out = Command::new(repo_path("scripts/build-arm64.sh"))
        .arg("test")
        .output()
        .expect("run scripts/build-arm64.sh test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the aarch64 library tests failed:\n{stdout}\n{stderr}");
    // What ran is an aarch64 executable, which only qemu-aarch64 (cargo's runner) runs here.
    let executable = stderr
        .lines()
        .find_map(|line| line.trim().strip_prefix("Running unittests src/lib.rs ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("cargo named no unit-test executable:\n{stderr}"));
    let elf = std::fs::read(executable).expect("the unit-test executable");
    assert_eq!(elf::machine(&elf), Some(elf::EM_AARCH64), "{executable} is for aarch64");
    let passed: usize = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("test result: ok. "))
        .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert!(passed >= 300, "only {passed} library tests passed on aarch64:\n{stdout}");
    eprintln!(
        "{passed} library tests passed on aarch64 under qemu-user in {:.1?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arm64_operator_serves_its_webhooks_and_cluster_autoscaler() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Nothing else runs on this runtime yet, so the build may block it.
    let bin = under_qemu(dir.path());
    let mut world = World::start_for_autoscaler(&bin, false).await.expect("world");
    let _logs = world.plane.logs_on_failure();
    let ca = world.autoscaler(&AutoscalerSettings::default()).await.expect("cluster-autoscaler");
    if let Err(error) = world.autoscaler_scale_up_and_down(&ca, 2).await {
        panic!(
            "{error:#}\n--- cluster-autoscaler ---\n{}\n--- operator (arm64) ---\n{}",
            ca.log_tail(80),
            world.operator_log_tail(0, 60)
        );
    }

    // Its memory. The process is qemu-user's: its resident set holds the guest's memory and
    // qemu's buffer of translated code, which is the largest mapping; both are shown.
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", world.replicas[0].pid))
        .expect("the operator's /proc smaps");
    let mut mappings: Vec<(u64, String)> = Vec::new();
    for line in smaps.lines() {
        if let Some(kb) = line.strip_prefix("Rss:") {
            if let (Some(last), Ok(kb)) =
                (mappings.last_mut(), kb.trim().trim_end_matches(" kB").trim().parse::<u64>())
            {
                last.0 = kb;
            }
        } else if line.split_whitespace().next().is_some_and(|range| {
            range.contains('-') && range.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        }) {
            mappings.push((0, line.to_owned()));
        }
    }
    mappings.sort_by_key(|m| std::cmp::Reverse(m.0));
    let total: u64 = mappings.iter().map(|m| m.0).sum();
    eprintln!("arm64 operator under qemu-user: resident {} KiB in all; largest mappings:", total);
    for (kb, mapping) in mappings.iter().take(3) {
        eprintln!("  {kb:>8} KiB  {mapping}");
    }

    // The validating webhook of the arm64 binary explains a removed field to kubectl.
    let slot = r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: mini-9
  labels: { group: workers }
spec:
  kubernetesNodeName: mini-9
  startupPodSpec: { image: registry.invalid/wake:1 }
  shutdownPodSpec: { image: registry.invalid/sleep:1 }
  powerState: on
"#;
    let applied = world.plane.kubectl_apply(NAMESPACE, slot).await.expect("kubectl apply");
    let stderr = String::from_utf8_lossy(&applied.stderr);
    assert!(!applied.status.success(), "a slot with powerState was stored");
    assert!(
        stderr.contains("spec.powerState was removed") && stderr.contains("Delete spec.powerState"),
        "the refusal does not explain the way forward:\n{stderr}"
    );
    eprintln!("{}", world.summary());
}

#[tokio::test]
async fn the_arm64_power_command_reads_and_sets_a_redfish_bmc() {
    let peer = RedfishPeer::start().await.expect("sushy-emulator");
    let secrets = tempfile::tempdir().expect("tempdir");
    let login = secrets.path().join("bmc-login");
    std::fs::create_dir_all(&login).expect("secret dir");
    std::fs::write(login.join("username"), &peer.user).expect("username");
    std::fs::write(login.join("password"), &peer.password).expect("password");
    let spec = PowerSpec {
        redfish: Some(Redfish {
            endpoint: peer.endpoint(),
            system_id: None,
            credentials: CredentialsRef { secret_name: "bmc-login".into() },
            tls: None,
            on_reset_type: None,
            off_reset_type: Some("ForceOff".into()),
        }),
        confirm_timeout_seconds: Some(60),
        ..PowerSpec::default()
    };
    let spec = serde_json::to_string(&spec).expect("json");
    let binary = arm64_binary();
    let power = |action: &str| {
        let out = Command::new("qemu-aarch64")
            .arg(binary)
            .args(["power", action])
            .env_clear()
            .env("HOMELAB_POWER_SPEC", &spec)
            .env("HOMELAB_POWER_SECRETS_DIR", secrets.path())
            .output()
            .expect("run the arm64 binary under qemu-aarch64");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "power {action}: {stdout}\n{stderr}");
        stdout
    };
    let before = power("status");
    assert!(before.contains("on: redfish"), "{before}");
    assert!(before.contains("power state: Off"), "sushy's system starts Off: {before}");
    let on = power("on");
    assert!(on.contains("reports On"), "{on}");
    let after = power("status");
    assert!(after.contains("power state: On"), "{after}");
}
