//! The integration-test harness of homelab-autoscaler: a real Kubernetes control plane for
//! integration tests, the in-process [`lab::Lab`] and the end-to-end [`e2e::World`].
//!
//! The root package's tests, and examples/demo.rs, use it as a dev-dependency. Typical use:
//!
//! ```ignore
//! use homelab_harness::{Components, ControlPlane};
//!
//! let plane = ControlPlane::shared(Components::API).await.expect("control plane");
//! let _logs = plane.logs_on_failure(); // component log tails if the test panics
//! let client = plane.client().expect("client");
//! let ns = plane.fresh_namespace("my-test").await.expect("namespace");
//! ```
//!
//! [`ControlPlane::shared`] is one control plane per test binary, shared by its tests;
//! [`ControlPlane::start`] is one a test owns, stopped and removed when it is dropped.
//!
//! The binaries come from tests/harness/build-binaries.sh (built on first use into
//! `$HOMELAB_TEST_CACHE/bin`, or taken from `$HOMELAB_TEST_ASSETS`). Progress goes straight to
//! stderr, past the test harness's output capture, so a first run that builds for minutes says
//! so.

pub mod admission;
mod base;
pub mod binaries;
pub mod ceph;
pub mod cert_manager;
pub mod claims;
mod control_plane;
pub mod e2e;
pub mod elf;
mod failure_logs;
pub mod fault_run;
pub mod host_kubelet;
pub mod http;
pub mod install;
pub mod invariants;
mod kwok;
pub mod lab;
pub mod local_path;
pub mod longhorn;
pub mod machine;
mod pki;
mod plane;
pub mod ports;
pub mod power_peers;
mod process;
pub mod real_lab;
mod resources;
pub mod seeded;
pub mod slots;
mod test_namespace;
pub mod timeline;
mod wait;
pub mod yaml_readers;

use std::path::{Path, PathBuf};

pub use control_plane::{Components, ControlPlane};
pub use failure_logs::FailureLogs;
pub use kwok::{KWOK_NODE_ANNOTATION, is_ready, ready_status};
pub use pki::CertAndKey;
pub use plane::Plane;
pub use resources::WebhookConfiguration;
pub use test_namespace::{TestNamespace, test_namespace};
pub use wait::{eventually, stays};

/// The repository's root directory, where crds/, webhooks/, examples/ and tests/harness/ are.
/// This crate lives in tests/harness/, two levels below it.
pub fn repo_root() -> &'static Path {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // `ancestors` always has the two levels here; the fallback only keeps this total.
    manifest_dir
        .ancestors()
        .nth(2)
        .unwrap_or_else(|| Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")))
}

/// `relative` (for example `crds` or `tests/harness/kwok/stages.yaml`) in the repository.
pub fn repo_path(relative: &str) -> PathBuf {
    repo_root().join(relative)
}

/// A progress line on stderr. Written to the stream directly: `eprintln!` in a test is captured
/// and shown only if the test fails, and a long first build must be visible while it runs.
fn progress(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "[control-plane] {message}");
}
