//! A pool taken 0 -> 1 -> 0 the way a user does it and sees it: a Group and a slot applied with
//! kubectl, a `Manual` NodeClaim applied with kubectl, and `kubectl get slot`'s table (the CRD's
//! printer columns) read until the machine shows booted, then, the claim deleted with kubectl,
//! off again. The table is what a user reads: an empty PHASE or POWER column there is a bug even
//! when the operator's logs look fine.
//!
//! The machine is the simulator's (`homelab-autoscaler simulate`, as in the e2e World): the
//! operator's power Jobs run on a kwok "lab" node, and the simulator plays the machine when they
//! succeed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use tokio::process::Child;

use crate::{Components, ControlPlane, eventually};

/// The pool's Group; `cluster-autoscaler` so that the operator never claims a machine of its
/// own accord (the built-in scaler would, for the chart's own pending pods).
pub const GROUP: &str = "by-hand";
/// The pool's one slot, and its Kubernetes node.
pub const SLOT: &str = "hand-1";
/// The `Manual` claim on it.
pub const CLAIM: &str = "hand-1-by-hand";
/// How long a step may take: a boot is a startup Job, the simulator's 2 s boot and 2 s gate.
const STEP: Duration = Duration::from_secs(120);

fn pool_manifest(namespace: &str) -> String {
    let pod =
        "{ image: busybox:1.36, command: [\"true\"], nodeSelector: { homelab.demo/role: lab } }";
    format!(
        "apiVersion: infra.homecluster.dev/v2alpha1
kind: Group
metadata: {{ name: {GROUP}, namespace: {namespace} }}
spec:
  driver: cluster-autoscaler
---
apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata: {{ name: {SLOT}, namespace: {namespace}, labels: {{ group: {GROUP} }} }}
spec:
  kubernetesNodeName: {SLOT}
  pricing: {{ hourlyRate: 0.02, podRate: 0.005 }}
  nodeCapacity: {{ cpu: \"4\", memory: 16Gi, pods: \"110\" }}
  startupPodSpec: {pod}
  shutdownPodSpec: {pod}
"
    )
}

fn claim_manifest(namespace: &str) -> String {
    format!(
        "apiVersion: infra.homecluster.dev/v2alpha1
kind: NodeClaim
metadata: {{ name: {CLAIM}, namespace: {namespace} }}
spec:
  slotRef: {{ name: {SLOT} }}
  request: {{ call: Manual, group: {GROUP} }}
"
    )
}

/// The machines' side of the lab on `plane`: kube-controller-manager, kube-scheduler and kwok
/// (the power Jobs run as pods), a kwok node labelled `homelab.demo/role: lab` for them, and the
/// simulator for the slots of `namespace`, logging to `log`. The simulator stops when the
/// returned process is dropped.
pub async fn start_machines(
    plane: &ControlPlane,
    bin: &Path,
    namespace: &str,
    log: &Path,
) -> Result<Child> {
    plane.ensure(Components::CLUSTER).await?;
    plane
        .add_machine("lab", vec![], [("homelab.demo/role".to_string(), "lab".to_string())].into())
        .await?;
    let args = [
        "simulate".to_string(),
        format!("--namespace={namespace}"),
        "--boot-delay=2s".into(),
        "--gate-delay=2s".into(),
    ];
    crate::e2e::spawn(bin, &args, plane.kubeconfig_path(), log)
}

/// One row of `kubectl get slot`: the printed cell of each column, by header (`<none>` read as
/// empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row(pub Vec<(String, String)>);

impl Row {
    /// The cell under `header` (`PHASE`, `POWER`, ...), empty if the column is not printed.
    pub fn cell(&self, header: &str) -> &str {
        self.0.iter().find(|(h, _)| h == header).map(|(_, c)| c.as_str()).unwrap_or_default()
    }
}

/// The row of `name` in kubectl's table `text`. Cells are cut at the header's column offsets
/// (kubectl aligns every column with its header), so an empty cell does not shift the others.
pub fn table_row(text: &str, name: &str) -> Result<Row> {
    let mut lines = text.lines();
    let header = lines.next().context("an empty table")?;
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let row = lines
        .find(|line| line.split_whitespace().next() == Some(name))
        .with_context(|| format!("no row {name} in:\n{text}"))?;
    let cut = |line: &str, i: usize| {
        let end = starts.get(i + 1).copied().unwrap_or(line.len()).min(line.len());
        line.get(starts[i].min(end)..end).unwrap_or_default().trim().to_string()
    };
    Ok(Row((0..starts.len())
        .map(|i| {
            let cell = cut(row, i);
            (cut(header, i), if cell == "<none>" { String::new() } else { cell })
        })
        .collect()))
}

/// `kubectl get slot <SLOT>` in `namespace`, as a user types it: the table.
pub async fn slot_table(plane: &ControlPlane, namespace: &str) -> Result<String> {
    let out = plane.kubectl(["get", "slot", SLOT, "-n", namespace]).await?;
    ensure!(out.status.success(), "kubectl get slot: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn kubectl_ok(plane: &ControlPlane, args: &[&str]) -> Result<()> {
    let out = plane.kubectl(args).await?;
    ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn apply_text(plane: &ControlPlane, dir: &Path, name: &str, text: &str) -> Result<()> {
    let file = dir.join(name);
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    kubectl_ok(plane, &["apply", "-f", &file.display().to_string()]).await
}

/// Waits until `kubectl get slot` prints `phase` and `power` for the slot (and, when given, the
/// claim `claim`), returning the row.
async fn until_printed(
    plane: &ControlPlane,
    namespace: &str,
    phase: &str,
    power: &str,
    claim: Option<&str>,
) -> Result<Row> {
    let what = format!("`kubectl get slot` to print PHASE {phase} and POWER {power}");
    eventually(&what, STEP, || async {
        let table = slot_table(plane, namespace).await?;
        let row = table_row(&table, SLOT)?;
        ensure!(
            row.cell("PHASE") == phase
                && row.cell("POWER") == power
                && claim.is_none_or(|c| row.cell("CLAIM") == c),
            "printed:\n{table}"
        );
        Ok(row)
    })
    .await
}

/// How long each step of [`zero_one_zero`] took.
#[derive(Debug)]
pub struct Timings {
    pub off_at_first: Duration,
    pub booted: Duration,
    pub off_again: Duration,
}

/// The pool 0 -> 1 -> 0 in `namespace` (the operator and [`start_machines`] running), each
/// state read from `kubectl get slot`'s table: off at first; `ready`/`on` with the claim once the
/// `Manual` claim is applied; `off`/`off` once it is deleted. Manifests are written under `dir`.
pub async fn zero_one_zero(plane: &ControlPlane, namespace: &str, dir: &Path) -> Result<Timings> {
    let t = Instant::now();
    apply_text(plane, dir, "pool.yaml", &pool_manifest(namespace)).await?;
    until_printed(plane, namespace, "off", "off", None).await.context("the new slot")?;
    let off_at_first = t.elapsed();

    let t = Instant::now();
    apply_text(plane, dir, "claim.yaml", &claim_manifest(namespace)).await?;
    let row = until_printed(plane, namespace, "ready", "on", Some(CLAIM))
        .await
        .context("the machine booted for the Manual claim")?;
    ensure!(row.cell("GROUP") == GROUP, "GROUP printed {:?}", row.cell("GROUP"));
    ensure!(row.cell("ATTEMPT") == "1", "ATTEMPT printed {:?}", row.cell("ATTEMPT"));
    let booted = t.elapsed();

    let t = Instant::now();
    kubectl_ok(plane, &["delete", "nodeclaim", CLAIM, "-n", namespace, "--wait=false"]).await?;
    until_printed(plane, namespace, "off", "off", None)
        .await
        .context("the machine off again once the claim is deleted")?;
    Ok(Timings { off_at_first, booted, off_again: t.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::table_row;

    #[test]
    fn cells_are_cut_at_the_headers_offsets() {
        let table = "NAME     GROUP     PHASE   POWER   CLAIM   ATTEMPT   AGE\n\
                     hand-1   by-hand                   <none>            5s\n";
        let row = table_row(table, "hand-1").expect("row");
        assert_eq!(row.cell("GROUP"), "by-hand");
        assert_eq!(row.cell("PHASE"), "");
        assert_eq!(row.cell("POWER"), "");
        assert_eq!(row.cell("CLAIM"), "");
        assert_eq!(row.cell("AGE"), "5s");
    }
}
