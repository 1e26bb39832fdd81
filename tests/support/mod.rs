//! Test support: a real Kubernetes control plane for integration tests.
//!
//! Include it with `mod support;` from a file in tests/. Typical use:
//!
//! ```ignore
//! let plane = ControlPlane::shared(Components::API).await.expect("control plane");
//! let _logs = plane.logs_on_failure(); // component log tails if the test panics
//! let client = plane.client().expect("client");
//! let ns = plane.fresh_namespace("my-test").await.expect("namespace");
//! ```
//!
//! The binaries come from tests/harness/build-binaries.sh (built on first use into
//! `$HOMELAB_TEST_CACHE/bin`, or taken from `$HOMELAB_TEST_ASSETS`). Progress goes straight to
//! stderr, past the test harness's output capture, so a first run that builds for minutes says
//! so.

// Each test binary compiles this module and uses only part of it (the re-exports included).
#![allow(dead_code, unused_imports)]

mod base;
mod binaries;
mod control_plane;
mod kwok;
mod pki;
mod process;
mod resources;
mod wait;

pub use control_plane::{Components, ControlPlane, FailureLogs};
pub use kwok::{KWOK_NODE_ANNOTATION, is_ready};
pub use pki::CertAndKey;
pub use resources::WebhookConfiguration;
pub use wait::eventually;

/// A progress line on stderr. Written to the stream directly: `eprintln!` in a test is captured
/// and shown only if the test fails, and a long first build must be visible while it runs.
fn progress(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "[control-plane] {message}");
}

/// What most integration tests start from.
pub struct TestNamespace {
    pub plane: &'static ControlPlane,
    /// An admin client for this test's runtime.
    pub client: kube::Client,
    /// A fresh namespace of this test's own.
    pub ns: String,
    /// Component logs (and the operator's, by RUST_LOG) printed if the test panics.
    pub logs: FailureLogs<'static>,
}

/// The shared control plane with at least `components`, the CRDs from crds/ installed, a fresh
/// namespace `<prefix>-<n>`, and the operator's tracing routed to the test's output.
pub async fn test_namespace(components: Components, prefix: &str) -> anyhow::Result<TestNamespace> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("homelab_autoscaler=debug,kube=info")
    });
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    let plane = ControlPlane::shared(components).await?;
    let logs = plane.logs_on_failure();
    plane.install_crds().await?;
    let client = plane.client()?;
    let ns = plane.fresh_namespace(prefix).await?;
    Ok(TestNamespace { plane, client, ns, logs })
}
