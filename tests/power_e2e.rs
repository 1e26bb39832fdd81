//! End to end on the simulated cluster: a claim on a slot that wakes by Wake-on-LAN and shuts
//! down over SSH (examples/power-wake-on-lan.yaml), and one on a mini PC behind a metering smart
//! plug shut down over SSH then unplugged (examples/power-smart-plug.yaml), boot and are
//! released like any other. The operator turns `spec.power` into its startup and shutdown Jobs
//! (the operator's image running `power on|off`); kwok plays their pods and the simulator the
//! machine behind them. The plug's meter is an in-test Shelly endpoint on 127.0.0.1, which the
//! operator reads into the slot's status. tests/power_sequences.rs runs the same sequence
//! against real peers.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use homelab_autoscaler::api::{Node as Slot, NodeClaim, NodeClaimPhase};
use homelab_harness::e2e::{self, NAMESPACE};
use homelab_harness::http::ShellyMeter;
use homelab_harness::{eventually, repo_path};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const ACT: Duration = Duration::from_secs(120);

/// The power Job of `lifecycle` for `slot`, once the operator has made one.
async fn power_job(jobs: &Api<Job>, slot: &str, lifecycle: &str) -> Result<Job> {
    let list = jobs
        .list(&ListParams::default().labels(&format!(
            "infra.homecluster.dev/node={slot},infra.homecluster.dev/lifecycle={lifecycle}"
        )))
        .await?;
    list.items.into_iter().next().with_context(|| format!("no {lifecycle} Job yet"))
}

fn args_of(job: &Job) -> Vec<String> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}

/// The settings a power Job's pod is given (`HOMELAB_POWER_SPEC`), and the Secrets it mounts.
fn power_settings(job: &Job) -> (serde_json::Value, Vec<String>) {
    let pod = job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let env =
        pod.and_then(|p| p.containers.first()).and_then(|c| c.env.clone()).unwrap_or_default();
    let spec = env
        .iter()
        .find(|e| e.name == "HOMELAB_POWER_SPEC")
        .and_then(|e| e.value.as_deref())
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default();
    let secrets = pod
        .and_then(|p| p.volumes.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.secret.and_then(|s| s.secret_name))
        .collect();
    (spec, secrets)
}

/// One World for both slots: a test binary's control plane holds one simulated cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_on_a_wake_on_lan_slot_and_a_plug_and_ssh_slot_boot_and_are_released() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let world = e2e::World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();

    let wake_on_lan = repo_path("examples/power-wake-on-lan.yaml");
    let (startup, shutdown) =
        claim_boots_and_is_released(&world, &wake_on_lan, "nas-1", "lan").await;
    assert_eq!(args_of(&startup), ["power", "on"]);
    assert_eq!(args_of(&shutdown), ["power", "off"]);

    // The example's plug, at its LAN address there, is an in-test Shelly meter here: the
    // operator reads it itself for the energy report. It reads the machine's standby draw, as a
    // real plug does under a machine that is off whenever the operator looks (the machine is on
    // only between the boot and the release): a running draw with no node is a machine on
    // without its node, which the operator powers off.
    let meter = ShellyMeter::start(0.5).await.expect("meter");
    let dir = tempfile::tempdir().expect("tempdir");
    let example =
        std::fs::read_to_string(repo_path("examples/power-smart-plug.yaml")).expect("the example");
    let plug = dir.path().join("power-smart-plug.yaml");
    std::fs::write(&plug, example.replace("http://192.168.1.41", &meter.base)).expect("write");
    let (startup, shutdown) = claim_boots_and_is_released(&world, &plug, "mini-1", "minis").await;
    let slots: Api<Slot> = Api::namespaced(world.client.clone(), NAMESPACE);
    eventually("the plug's reading in the slot's status", ACT, || async {
        let slot = slots.get("mini-1").await?;
        let draw = slot.status.and_then(|s| s.draw);
        ensure!(draw.as_ref().is_some_and(|d| d.watts == 0.5), "draw {draw:?}");
        Ok(())
    })
    .await
    .expect("the meter read by the operator");
    assert!(meter.reads() >= 1);
    assert_eq!(args_of(&startup), ["power", "on"]);
    let (on, secrets) = power_settings(&startup);
    assert_eq!(on["onWith"], json!("http"), "the plug switches the machine on: {on}");
    assert!(on.get("ssh").is_none() && on["http"].get("meter").is_none(), "{on}");
    assert!(secrets.is_empty(), "the plug needs no Secret: {secrets:?}");

    assert_eq!(args_of(&shutdown), ["power", "off"]);
    let (off, secrets) = power_settings(&shutdown);
    let steps: Vec<&serde_json::Value> =
        off["offSequence"].as_array().expect("offSequence").iter().map(|s| &s["driver"]).collect();
    assert_eq!(steps, [&json!("ssh"), &json!("http")], "{off}");
    assert_eq!(off["offSequence"][1]["afterDrawBelowWatts"], json!(3.0), "{off}");
    assert_eq!(off["http"]["meter"]["wattsPointer"], json!("/apower"), "the meter it waits on");
    assert!(off["http"].get("onRequest").is_none(), "only the off direction's request: {off}");
    assert_eq!(secrets, ["mini-ssh"], "the SSH key is mounted for the first step");
}

/// Applies `example` with kubectl, claims `slot` of `group` by hand, waits for it ready,
/// releases it and waits for the machine off; returns the startup and shutdown Jobs.
async fn claim_boots_and_is_released(
    world: &e2e::World,
    example: &std::path::Path,
    slot: &str,
    group: &str,
) -> (Job, Job) {
    let applied = world
        .plane
        .kubectl(["apply", "-n", NAMESPACE, "-f", &example.to_string_lossy()])
        .await
        .expect("kubectl");
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));

    let claims: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "NodeClaim",
        "metadata": { "generateName": format!("{slot}-") },
        "spec": { "slotRef": { "name": slot }, "request": { "call": "Manual", "group": group } },
    }))
    .expect("claim");
    let name = claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim")
        .metadata
        .name
        .expect("name");
    eventually(&format!("the claim on {slot} ready"), ACT, || async {
        let phase = claims.get(&name).await?.status.and_then(|s| s.phase);
        ensure!(phase == Some(NodeClaimPhase::Ready), "phase {phase:?}");
        Ok(())
    })
    .await
    .expect("ready");
    let jobs: Api<Job> = Api::namespaced(world.client.clone(), NAMESPACE);
    let startup = power_job(&jobs, slot, "startup").await.expect("startup Job");

    claims.delete(&name, &DeleteParams::default()).await.expect("delete the claim");
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    eventually("the machine off and the claim released", ACT, || async {
        let gone = claims.get_opt(&name).await?.is_none();
        let up = nodes.get_opt(slot).await?.is_some();
        ensure!(gone && !up, "claim gone: {gone}, machine up: {up}");
        Ok(())
    })
    .await
    .expect("released");
    let shutdown = power_job(&jobs, slot, "shutdown").await.expect("shutdown Job");
    (startup, shutdown)
}
