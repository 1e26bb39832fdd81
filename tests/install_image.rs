//! `make image` without a container engine: scripts/build-image.sh builds a static binary for
//! linux/amd64 and linux/arm64 and packs them with crane into one OCI layout tarball holding the
//! image index. This unpacks that tarball as a runtime would (index → image index → manifest →
//! config and layer), checks each platform's entrypoint, non-root user, platform and labels, and
//! runs each binary taken out of its layer (the arm64 one under qemu-user): statically linked (no
//! ELF interpreter) and built for its platform's architecture, it makes a CA and certificate with
//! its TLS stack. Then crane reads the index back from a registry it was pushed to, as a node
//! pulls its own platform. The binaries are the tests' (`IMAGE_PROFILE=dev`: the amd64 one linked
//! statically from the test build's crates, the arm64 one from scripts/build-arm64.sh's dev
//! build): the scripts, static linking and packing are `make image`'s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use homelab_harness::{elf, repo_path};
use serde_json::Value;

fn json(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// ELF's e_machine of each platform's architecture.
fn elf_machine(architecture: &str) -> u16 {
    match architecture {
        "amd64" => elf::EM_X86_64,
        "arm64" => elf::EM_AARCH64,
        other => panic!("no ELF machine known for {other}"),
    }
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let (algorithm, hex) = digest.split_once(':').expect("a digest");
    layout.join("blobs").join(algorithm).join(hex)
}

/// Runs `binary` (natively, or under qemu-aarch64 for arm64) and asserts it prints its version and
/// writes a CA and certificate with its TLS stack.
fn runs(binary: &Path, architecture: &str, dir: &Path) {
    let command = |args: &[&str]| {
        let mut command = match architecture {
            "arm64" => {
                let mut qemu = Command::new("qemu-aarch64");
                qemu.arg(binary);
                qemu
            }
            _ => Command::new(binary),
        };
        command.args(args).env_clear();
        command.output().unwrap_or_else(|e| panic!("run the {architecture} binary: {e}"))
    };
    let version = command(&["--version"]);
    assert!(
        version.status.success(),
        "{architecture}: {}",
        String::from_utf8_lossy(&version.stderr)
    );
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("homelab-autoscaler "));
    let certs = dir.join(format!("certs-{architecture}"));
    let made = command(&["certs", "--out", &certs.display().to_string()]);
    assert!(made.status.success(), "{architecture}: {}", String::from_utf8_lossy(&made.stderr));
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(certs.join(file).is_file(), "{file} written by the {architecture} binary");
    }
}

fn untar(archive: &Path, into: &Path) {
    std::fs::create_dir_all(into).expect("mkdir");
    let out =
        Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(into).output().expect("tar");
    assert!(
        out.status.success(),
        "untar {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn make_image_packs_a_static_non_root_binary_per_platform_into_one_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tarball = dir.path().join("homelab-autoscaler.tar");
    let started = Instant::now();
    let out = Command::new(repo_path("scripts/build-image.sh"))
        .arg(&tarball)
        .env("TAG", "test")
        .env("IMAGE_PROFILE", homelab_harness::real_lab::TEST_IMAGE_PROFILE)
        .env_remove("PLATFORMS")
        .output()
        .expect("run scripts/build-image.sh");
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("image index built in {:.1?}", started.elapsed());

    let layout = dir.path().join("layout");
    untar(&tarball, &layout);
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let top = json(&layout.join("index.json"));
    let entries = top["manifests"].as_array().expect("manifests");
    assert_eq!(entries.len(), 1, "the layout names one thing, the image index");
    let entry = &entries[0];
    assert_eq!(entry["mediaType"], "application/vnd.oci.image.index.v1+json");
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "ghcr.io/homecluster-dev/homelab-autoscaler:test"
    );
    let index = json(&blob(&layout, entry["digest"].as_str().expect("digest")));
    let images = index["manifests"].as_array().expect("the index's manifests");
    let mut platforms: Vec<String> = images
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap_or("?"),
                m["platform"]["architecture"].as_str().unwrap_or("?")
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "one image per platform");

    for image in images {
        let architecture = image["platform"]["architecture"].as_str().expect("architecture");
        assert_eq!(image["mediaType"], "application/vnd.oci.image.manifest.v1+json");
        let manifest = json(&blob(&layout, image["digest"].as_str().expect("digest")));
        let config = json(&blob(&layout, manifest["config"]["digest"].as_str().expect("config")));
        assert_eq!(config["os"], "linux");
        assert_eq!(config["architecture"], architecture, "the config agrees with the index");
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/homelab-autoscaler"]));
        assert_eq!(config["config"]["Cmd"], serde_json::json!(["run"]));
        assert_eq!(config["config"]["User"], "65532:65532", "non-root");
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.title"],
            "homelab-autoscaler"
        );
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1, "{architecture}: one layer, the binary (and /tmp)");

        let rootfs = dir.path().join(format!("rootfs-{architecture}"));
        untar(&blob(&layout, layers[0]["digest"].as_str().expect("layer digest")), &rootfs);
        let binary = rootfs.join("homelab-autoscaler");
        let elf = std::fs::read(&binary).expect("the binary is in the layer");
        assert!(
            !elf::has_interpreter(&elf).expect("a 64-bit ELF binary"),
            "{architecture}: the binary is statically linked"
        );
        assert_eq!(
            elf::machine(&elf).expect("a 64-bit ELF binary"),
            elf_machine(architecture),
            "the {architecture} layer's binary is built for {architecture}"
        );
        assert!(!rootfs.join("bin/sh").exists(), "no shell in the image");
        runs(&binary, architecture, dir.path());
    }

    // crane reads it back as a registry serves it: each platform's config and filesystem.
    let crane = crane();
    let mut registry = std::process::Command::new(&crane)
        .args(["registry", "serve", "--address", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("crane registry serve");
    let port = registry_port(&mut registry);
    let reference = format!("127.0.0.1:{port}/homelab-autoscaler:test");
    let crane_ok = |args: &[&str]| {
        let out = Command::new(&crane).args(args).output().expect("run crane");
        assert!(out.status.success(), "crane {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    // The layout's one entry, the image index, pushed as itself (as scripts/publish-release.sh
    // pushes a release).
    crane_ok(&["push", &layout.display().to_string(), &reference]);
    let pushed: Value =
        serde_json::from_slice(&crane_ok(&["manifest", &reference])).expect("the index as JSON");
    assert_eq!(pushed["mediaType"], "application/vnd.oci.image.index.v1+json");
    for architecture in ["amd64", "arm64"] {
        let platform = format!("linux/{architecture}");
        let config: Value =
            serde_json::from_slice(&crane_ok(&["config", "--platform", &platform, &reference]))
                .expect("config JSON");
        assert_eq!(config["architecture"], architecture, "crane's {platform} config");
        let exported = dir.path().join(format!("export-{architecture}.tar"));
        crane_ok(&["export", "--platform", &platform, &reference, &exported.display().to_string()]);
        let filesystem = dir.path().join(format!("export-{architecture}"));
        untar(&exported, &filesystem);
        let elf = std::fs::read(filesystem.join("homelab-autoscaler")).expect("exported binary");
        assert_eq!(
            elf::machine(&elf).expect("a 64-bit ELF binary"),
            elf_machine(architecture),
            "crane's {platform} filesystem holds the {architecture} binary"
        );
    }
    let _ = registry.kill();
    let _ = registry.wait();
}

/// crane, built by the harness under its lock (scripts/build-image.sh built it already).
fn crane() -> PathBuf {
    let out = Command::new(repo_path("tests/harness/build-binaries.sh"))
        .arg("image")
        .output()
        .expect("run build-binaries.sh image");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the bin dir").trim()).join("crane")
}

/// The port `crane registry serve` says it serves on. Its log is read to the end on a thread of
/// its own: a Go program whose stderr pipe closes dies of SIGPIPE at its next log line.
fn registry_port(registry: &mut std::process::Child) -> u16 {
    use std::io::BufRead as _;
    let stderr = registry.stderr.take().expect("stderr");
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving on port ").nth(1) {
                let _ = port_tx.send(rest.trim().parse::<u16>().expect("a port"));
            }
        }
    });
    port_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("crane registry serve says which port it serves on")
}
