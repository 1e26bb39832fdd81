//! `make image` without a container engine: scripts/build-image.sh builds the static binary and
//! packs it with crane into an OCI layout tarball. This unpacks that tarball as a runtime would
//! (index → manifest → config and layer), checks the image's entrypoint, non-root user, platform
//! and labels, and runs the binary taken out of the layer: statically linked (no ELF
//! interpreter), it makes a CA and certificate with its TLS stack. The binary is the tests'
//! (`IMAGE_PROFILE=dev`: linked statically from the test build's crates, without debug info):
//! the script, static linking and packing are `make image`'s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(
        &std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let (algorithm, hex) = digest.split_once(':').expect("a digest");
    layout.join("blobs").join(algorithm).join(hex)
}

/// Whether an ELF file asks for a dynamic loader (a PT_INTERP program header).
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF binary");
    assert_eq!(elf[4], 2, "64-bit");
    let u64_at =
        |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().expect("8 bytes")) as usize;
    let u16_at =
        |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().expect("2 bytes")) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().expect("4 bytes")) == 3
    })
}

#[test]
fn make_image_packs_a_static_non_root_binary_that_runs_from_its_layer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tarball = dir.path().join("homelab-autoscaler.tar");
    let started = Instant::now();
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .arg(&tarball)
        .env("TAG", "test")
        .env("IMAGE_PROFILE", homelab_harness::real_lab::TEST_IMAGE_PROFILE)
        .output()
        .expect("run scripts/build-image.sh");
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("image built in {:.1?}", started.elapsed());

    let layout = dir.path().join("layout");
    std::fs::create_dir_all(&layout).expect("mkdir");
    let untar = |archive: &Path, into: &Path| {
        let out =
            Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(into).output().expect("tar");
        assert!(
            out.status.success(),
            "untar {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    untar(&tarball, &layout);
    assert_eq!(json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = json(&layout.join("index.json"));
    let entry = &index["manifests"][0];
    assert_eq!(entry["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "ghcr.io/homecluster-dev/homelab-autoscaler:test"
    );
    let manifest = json(&blob(&layout, entry["digest"].as_str().expect("digest")));
    let config = json(&blob(&layout, manifest["config"]["digest"].as_str().expect("config")));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/homelab-autoscaler"]));
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["run"]));
    assert_eq!(config["config"]["User"], "65532:65532", "non-root");
    assert_eq!(config["config"]["Labels"]["org.opencontainers.image.title"], "homelab-autoscaler");
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "one layer: the binary (and /tmp)");

    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("mkdir");
    untar(&blob(&layout, layers[0]["digest"].as_str().expect("layer digest")), &rootfs);
    let binary = rootfs.join("homelab-autoscaler");
    let elf = std::fs::read(&binary).expect("the binary is in the layer");
    assert!(!has_interpreter(&elf), "the binary is statically linked");
    assert!(!rootfs.join("bin/sh").exists(), "no shell in the image");

    let version = Command::new(&binary).arg("--version").output().expect("run the binary");
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("homelab-autoscaler "));
    let certs = dir.path().join("certs");
    let made = Command::new(&binary)
        .args(["certs", "--out"])
        .arg(&certs)
        .env_clear()
        .output()
        .expect("run the binary");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(certs.join(file).is_file(), "{file} written by the binary from the image");
    }
}
