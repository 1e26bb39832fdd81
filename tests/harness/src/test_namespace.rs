//! What most integration tests start from: the shared control plane with the CRDs installed and
//! a namespace of the test's own.

use crate::control_plane::{Components, ControlPlane};
use crate::failure_logs::FailureLogs;

/// A test's namespace on the shared control plane, and what it needs to work there.
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
