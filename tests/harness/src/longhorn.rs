//! Longhorn's CustomResourceDefinitions, installed as Longhorn's Helm chart installs them: the
//! file its manager's published module ships (k8s/crds.yaml, fetched by build-binaries.sh) is
//! the CRD template of that chart, so it is rendered by the pinned helm inside a chart holding
//! it and the one helper it calls (`longhorn.labels`), and applied with kubectl. Longhorn itself
//! (its manager, engines and instance managers) does not run here; a test writes a volume's
//! status as longhorn-manager does.

use anyhow::{Context as _, Result, ensure};

use crate::ControlPlane;
use crate::binaries::{Profile, binaries};
use crate::install::helm;

/// The Longhorn release whose CRDs are installed (go/longhorn-crds pins its module).
pub const VERSION: &str = "1.10.0";

/// The labels Longhorn's chart puts on every object it installs.
const HELPERS: &str = r#"{{- define "longhorn.labels" -}}
app.kubernetes.io/name: longhorn
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: v{{ .Chart.AppVersion }}
{{- end -}}
"#;

/// Installs (or updates) Longhorn's CRDs on `plane` and waits until they are served.
pub async fn install_crds(plane: &ControlPlane) -> Result<()> {
    let crds = binaries(Profile::E2e).await?.path("longhorn-crds.yaml");
    let chart = tempfile::tempdir()?;
    std::fs::create_dir_all(chart.path().join("templates"))?;
    std::fs::write(
        chart.path().join("Chart.yaml"),
        format!("apiVersion: v2\nname: longhorn\nversion: {VERSION}\nappVersion: {VERSION}\n"),
    )?;
    std::fs::write(chart.path().join("templates/_helpers.tpl"), HELPERS)?;
    std::fs::copy(&crds, chart.path().join("templates/crds.yaml"))
        .with_context(|| format!("copying {}", crds.display()))?;
    let chart_dir = chart.path().display().to_string();
    let rendered = helm(&["template", "longhorn", &chart_dir]).await?;
    let manifest = chart.path().join("rendered.yaml");
    std::fs::write(&manifest, rendered)?;
    let manifest = manifest.display().to_string();
    // Server-side: the largest of them outgrows the annotation client-side apply would keep.
    let applied = plane
        .kubectl(["apply", "--server-side", "--field-manager=longhorn", "-f", manifest.as_str()])
        .await?;
    ensure!(
        applied.status.success(),
        "kubectl apply of Longhorn's CRDs: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let established = plane
        .kubectl([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/volumes.longhorn.io",
            "crd/nodes.longhorn.io",
        ])
        .await?;
    ensure!(
        established.status.success(),
        "Longhorn's CRDs not established: {}",
        String::from_utf8_lossy(&established.stderr)
    );
    Ok(())
}
