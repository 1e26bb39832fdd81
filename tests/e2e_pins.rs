//! End to end with pins (docs/keeping-machines-on.md): the real operator binary, the machine
//! simulator and the built-in scaler's pool of examples/pool.yaml (hold 15 s). A person runs
//! `homelab-autoscaler keep-on` and `release` as they would, against the test's kubeconfig.
//!
//! One World plays both scenarios in turn (the pool and its namespace are the World's):
//! a pinned machine outlives the scaler's hold while the scaler releases its own machine, and a
//! pin with an end time expires and its machine goes off.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use homelab_autoscaler::api::{ClaimCall, Group, NodeClaim, NodeClaimPhase};
use homelab_harness::claims::phase;
use homelab_harness::e2e::{self, NAMESPACE, World};
use homelab_harness::{eventually, stays};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const ACT: Duration = Duration::from_secs(120);
/// The pool's hold in examples/pool.yaml.
const HOLD: Duration = Duration::from_secs(15);

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs the operator binary as a person at a terminal would, with the test's kubeconfig.
async fn cli(bin: &Path, world: &World, args: &[&str]) -> Result<Run> {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env("KUBECONFIG", world.plane.kubeconfig_path())
        .env("TZ", "Europe/Berlin")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .with_context(|| format!("running {args:?}"))?;
    Ok(Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn live(claim: &NodeClaim) -> bool {
    homelab_autoscaler::phase::is_live(Some(phase(claim)))
}

/// The claims of `slot` the API server holds now.
async fn claims_of(world: &World, slot: &str) -> Result<Vec<NodeClaim>> {
    let api: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let selector = format!("spec.slotRef.name={slot}");
    Ok(api.list(&ListParams::default().fields(&selector)).await?.items)
}

/// The claim `keep-on` named in its line: `claim NAME keeps slot ...`.
fn claim_named(run: &Run) -> Result<String> {
    let name = run.stdout.strip_prefix("claim ").and_then(|r| r.split_whitespace().next());
    name.map(str::to_owned).with_context(|| format!("no claim named in {:?}", run.stdout))
}

/// The pinned claim is ready and its machine's Node is there.
async fn pinned_and_on(world: &World, name: &str, node: &str) -> Result<()> {
    let api: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let claim = api.get(name).await?;
    ensure!(phase(&claim) == NodeClaimPhase::Ready, "pin {name} is {:?}", phase(&claim));
    ensure!(claim.metadata.deletion_timestamp.is_none(), "pin {name} is being deleted");
    let nodes = world.nodes_of_group("workers").await?;
    ensure!(nodes.iter().any(|n| n == node), "{node} is gone; Nodes: {nodes:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_hold_against_the_scaler_and_end_on_time() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let world = World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let pool = homelab_harness::repo_path("examples/pool.yaml");
    let applied =
        world.plane.kubectl(["apply", "-n", NAMESPACE, "-f", &pool.to_string_lossy()]).await;
    assert!(applied.expect("kubectl").status.success(), "apply examples/pool.yaml");

    let outcome = async {
        a_pin_outlives_the_scalers_hold(&bin, &world).await?;
        keep_on_with_an_end_expires(&bin, &world).await
    }
    .await;
    outcome.expect("the scenario");
}

/// big-1 pinned with `keep-on` (until released) serves a Deployment beside a machine the scaler
/// boots; with the work gone, the scaler releases its own machine after the hold and keeps the
/// pin on (its reason says so) well past the hold; `release` turns it off.
async fn a_pin_outlives_the_scalers_hold(bin: &Path, world: &World) -> Result<()> {
    let keep = cli(bin, world, &["keep-on", "--slot", "big-1", "--namespace", NAMESPACE]).await?;
    ensure!(keep.ok, "keep-on failed: {}", keep.stderr);
    ensure!(keep.stdout.contains("keeps slot big-1 on until released"), "{}", keep.stdout);
    let pin = claim_named(&keep)?;
    let claims: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let created = claims.get(&pin).await?;
    ensure!(created.spec.request.call == ClaimCall::Manual, "{:?}", created.spec.request);
    ensure!(created.spec.until.is_none(), "no end asked: {:?}", created.spec.until);
    let reason = created.spec.request.reason.clone().unwrap_or_default();
    ensure!(reason == "kept on by admin with keep-on", "{reason}");
    eventually("the pin ready", ACT, || pinned_and_on(world, &pin, "big-1")).await?;

    // Two pods of one CPU at one pod per machine: the pin serves one, the scaler boots one more.
    let deployments: Api<Deployment> = Api::namespaced(world.client.clone(), "default");
    let web: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "pinned-web", "namespace": "default" },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "pinned-web" } },
            "template": {
                "metadata": { "labels": { "app": "pinned-web" } },
                "spec": {
                    "nodeSelector": { "infra.homecluster.dev/group": "workers" },
                    "containers": [{ "name": "web", "image": "nginx:1.27", "resources": { "requests": { "cpu": "1" } } }],
                },
            },
        },
    }))?;
    deployments.create(&PostParams::default(), &web).await?;
    let scaled = eventually("one claim of the scaler, ready", ACT, || async {
        let mine: Vec<NodeClaim> = claims
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|c| c.spec.request.call == ClaimCall::IncreaseSize && live(c))
            .collect();
        ensure!(mine.len() == 1, "{} live scaler claims", mine.len());
        ensure!(phase(&mine[0]) == NodeClaimPhase::Ready, "{:?}", phase(&mine[0]));
        Ok(mine[0].spec.slot_ref.name.clone())
    })
    .await?;
    ensure!(scaled != "big-1", "the scaler claimed the pinned slot");

    // A person cannot take the scaler's machine over, nor release it.
    let taken = cli(bin, world, &["keep-on", "--slot", &scaled, "--namespace", NAMESPACE]).await?;
    ensure!(!taken.ok, "keep-on on the scaler's machine must refuse: {}", taken.stdout);
    ensure!(taken.stderr.contains("the machine is on for its scaler"), "{}", taken.stderr);
    ensure!(taken.stderr.contains("run keep-on again"), "{}", taken.stderr);
    let theirs = cli(bin, world, &["release", "--slot", &scaled, "--namespace", NAMESPACE]).await?;
    ensure!(!theirs.ok, "release of the scaler's machine must refuse: {}", theirs.stdout);
    ensure!(theirs.stderr.contains("there is no pin to release"), "{}", theirs.stderr);

    // The work goes: the scaler releases its own machine after the hold, never the pin.
    deployments
        .patch(
            "pinned-web",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "replicas": 0 } })),
        )
        .await?;
    eventually("the scaler's machine released, the pin kept", ACT, || async {
        // A released pin never comes back, so the wait then fails with this as its last word.
        if let Err(e) = pinned_and_on(world, &pin, "big-1").await {
            bail!("the pin was released: {e:#}");
        }
        let left = claims_of(world, &scaled).await?.into_iter().filter(live).count();
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(left == 0 && nodes == ["big-1"], "{left} live claims on {scaled}, Nodes {nodes:?}");
        Ok(())
    })
    .await?;
    stays("the pin on past the hold", HOLD * 2, || pinned_and_on(world, &pin, "big-1")).await?;
    let groups: Api<Group> = Api::namespaced(world.client.clone(), NAMESPACE);
    let decision = groups.get("workers").await?.status.and_then(|s| s.last_decision);
    let reason = decision.map(|d| d.reason).unwrap_or_default();
    ensure!(reason.contains("pinned machine(s) kept: big-1"), "the scaler says why: {reason}");

    let release =
        cli(bin, world, &["release", "--slot", "big-1", "--namespace", NAMESPACE]).await?;
    ensure!(release.ok, "release failed: {}", release.stderr);
    ensure!(release.stdout.contains(&format!("claim {pin} deleted")), "{}", release.stdout);
    eventually("big-1 off and its pin gone", ACT, || async {
        let gone = claims.get_opt(&pin).await?.is_none();
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(gone && nodes.is_empty(), "pin gone: {gone}, Nodes {nodes:?}");
        Ok(())
    })
    .await
}

/// `keep-on --for 30s` pins mini-2 with an end; `keep-on` again moves the end; at the end the
/// claim completes `Expired` and the machine goes off; `release` then has nothing to release.
async fn keep_on_with_an_end_expires(bin: &Path, world: &World) -> Result<()> {
    let target = ["--slot", "mini-2", "--namespace", NAMESPACE];
    // The end is 30 s from when the command ran, read between the clock before and after it
    // (however long a loaded machine takes to run it); the stored time keeps whole seconds.
    let pinned_for = jiff::SignedDuration::from_secs(30);
    let before = jiff::Timestamp::now();
    let first = cli(bin, world, &[&["keep-on"][..], &target, &["--for", "30s"]].concat()).await?;
    let after = jiff::Timestamp::now();
    ensure!(first.ok, "keep-on --for 30s failed: {}", first.stderr);
    ensure!(first.stdout.contains("CET") || first.stdout.contains("CEST"), "{}", first.stdout);
    let name = claim_named(&first)?;
    let claims: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let until = claims.get(&name).await?.spec.until.context("keep-on --for sets spec.until")?.0;
    let earliest = before + pinned_for - jiff::SignedDuration::from_secs(1);
    ensure!(
        until >= earliest && until <= after + pinned_for,
        "until {until}, not 30 s after the command ran ({before} to {after})"
    );

    let again = cli(bin, world, &[&["keep-on"][..], &target, &["--for", "45s"]].concat()).await?;
    ensure!(again.ok, "keep-on on a pin failed: {}", again.stderr);
    ensure!(claim_named(&again)? == name, "the same pin: {}", again.stdout);
    ensure!(again.stdout.contains("was already pinned"), "{}", again.stdout);
    let extended = claims.get(&name).await?.spec.until.context("the end stays set")?.0;
    ensure!(extended > until, "keep-on extends the end: {until} -> {extended}");

    eventually("the pin ready", ACT, || pinned_and_on(world, &name, "mini-2")).await?;
    let ended = eventually("the pin expired and mini-2 off", ACT, || async {
        let claim = claims.get(&name).await?;
        let status = claim.status.clone().unwrap_or_default();
        ensure!(phase(&claim) == NodeClaimPhase::Completed, "{:?}", phase(&claim));
        let nodes = world.nodes_of_group("workers").await?;
        ensure!(nodes.is_empty(), "Nodes left: {nodes:?}");
        let held = claim.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty());
        ensure!(!held, "the finalizer waits for the machine");
        Ok(status)
    })
    .await?;
    ensure!(ended.reason.as_deref() == Some("Expired"), "{:?}", ended.reason);
    let message = ended.message.unwrap_or_default();
    ensure!(message.contains(&format!("kept on until {extended}")), "{message}");
    let finished = ended.finished_at.context("finishedAt")?.0;
    ensure!(finished >= extended, "not before its end: finished {finished}, until {extended}");

    let nothing = cli(bin, world, &[&["release"][..], &target].concat()).await?;
    ensure!(!nothing.ok, "release with no pin must refuse: {}", nothing.stdout);
    ensure!(nothing.stderr.contains("nothing to release"), "{}", nothing.stderr);
    Ok(())
}
