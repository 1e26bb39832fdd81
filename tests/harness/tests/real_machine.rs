//! The real-machine tier (homelab_harness::machine): a network namespace on a test lan running
//! a real containerd and kubelet, whose Node and pods are the kubelet's, not kwok's. And the
//! upstream kubelet behaviour the product depends on: a kubelet whose Node is deleted does not
//! register it again until it restarts.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy; where they are missing the
//! tests fail (they do not skip). The first run builds the `machines` profile.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use homelab_harness::machine::{Lan, Machine, MachineSpec, PAUSE_IMAGE, PowerState};
use homelab_harness::{Components, ControlPlane, eventually, ready_status, stays};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Longer than kube-controller-manager's node monitor grace period (20 s in the harness) plus a
/// few heartbeats, and than a cold kubelet's registration.
const ACT: Duration = Duration::from_secs(120);

const TAINT_KEY: &str = "homelab.test/real";
const LABEL_KEY: &str = "homelab.test/machine";

fn spec(name: &str) -> MachineSpec {
    MachineSpec {
        name: name.to_owned(),
        taints: vec![Taint {
            key: TAINT_KEY.to_owned(),
            value: Some("true".to_owned()),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        }],
        labels: BTreeMap::from([(LABEL_KEY.to_owned(), name.to_owned())]),
        ..MachineSpec::default()
    }
}

/// Straight to stderr, past the test's output capture: timings worth seeing on a passing run.
fn report(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "[real-machine] {message}");
}

/// Waits until Node `name` is Ready=`want` and returns it.
async fn until_ready(nodes: &Api<Node>, machine: &Machine, want: &str) -> Node {
    let name = machine.name().to_owned();
    eventually(&format!("Node {name} Ready={want}"), ACT, || async {
        machine.ensure_running().await?;
        let node = nodes.get_opt(&name).await?;
        let node = node.ok_or_else(|| anyhow::anyhow!("no Node {name}"))?;
        let ready = ready_status(&node);
        anyhow::ensure!(ready == Some(want), "Ready={ready:?}");
        Ok(node)
    })
    .await
    .expect("node condition")
}

/// Creates pod `work`, tolerating the machine's taint and selecting it by its label, running
/// the pause image; waits until its container runs and returns the container's id.
async fn run_pod(pods: &Api<Pod>, machine: &Machine) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "work" },
        "spec": {
            "nodeSelector": { LABEL_KEY: machine.name() },
            "tolerations": [{ "key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule" }],
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "work",
                "image": PAUSE_IMAGE,
                // The image is on the machine only: no registry serves it.
                "imagePullPolicy": "Never",
            }],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create pod");
    until_pod_runs(pods, machine, None).await
}

/// Waits until pod `work` is Running with its container running, and that container is not
/// `except` (a pod's status outlives its machine's power); returns the container's id.
async fn until_pod_runs(pods: &Api<Pod>, machine: &Machine, except: Option<&str>) -> String {
    eventually("pod work Running with its container running", ACT, || async {
        machine.ensure_running().await?;
        let pod = pods.get("work").await?;
        let status = pod.status.unwrap_or_default();
        let container = status.container_statuses.unwrap_or_default().into_iter().next();
        let running = container.as_ref().and_then(|c| c.state.as_ref()?.running.as_ref());
        anyhow::ensure!(
            status.phase.as_deref() == Some("Running") && running.is_some(),
            "phase {:?}, container {container:?}",
            status.phase
        );
        let id = container.and_then(|c| c.container_id).unwrap_or_default();
        let id = id.trim_start_matches("containerd://").to_owned();
        anyhow::ensure!(except != Some(id.as_str()), "still the container {id} of before");
        Ok(id)
    })
    .await
    .expect("pod runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_machine_registers_runs_a_pod_and_does_not_re_register_a_deleted_node() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let lan = Lan::start(plane.api_address()).expect("lan");
    let machine = Machine::create(plane, &lan, spec("real-1")).await.expect("machine");
    let _machine_logs = machine.logs_on_failure();

    // a. Powered on, the kubelet registers its Node, with the taint and label it was given.
    let started = Instant::now();
    machine.power_on().await.expect("power on");
    let node = until_ready(&nodes, &machine, "True").await;
    report(&format!("real-1: power on to Node Ready in {:.1?}", started.elapsed()));
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == TAINT_KEY
            && t.value.as_deref() == Some("true")
            && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    assert_eq!(node.labels().get(LABEL_KEY).map(String::as_str), Some("real-1"));
    let addresses = node.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default();
    let address = machine.address().to_string();
    assert!(
        addresses.iter().any(|a| a.type_ == "InternalIP" && a.address == address),
        "{addresses:?}"
    );

    // b. A pod scheduled to it runs a real container.
    let ns = plane.fresh_namespace("real-machine").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    let container_id = run_pod(&pods, &machine).await;
    report(&format!("real-1: pod created to Running in {:.1?}", started.elapsed()));
    let tasks = machine.ctr(&["tasks", "ls"]).await.expect("ctr tasks ls");
    let tasks = String::from_utf8_lossy(&tasks.stdout).into_owned();
    assert!(
        tasks.lines().any(|l| l.starts_with(&container_id) && l.contains("RUNNING")),
        "container {container_id} is not a running task of the machine's containerd:\n{tasks}"
    );

    // c. The Node deleted while the kubelet runs is not registered again...
    nodes.delete("real-1", &DeleteParams::default()).await.expect("delete node");
    eventually("Node real-1 gone", ACT, || async {
        anyhow::ensure!(nodes.get_opt("real-1").await?.is_none(), "still there");
        Ok(())
    })
    .await
    .expect("node deleted");
    stays("Node real-1 absent while its kubelet runs", Duration::from_secs(30), || async {
        anyhow::ensure!(machine.kubelet_running().await, "the kubelet exited");
        anyhow::ensure!(nodes.get_opt("real-1").await?.is_none(), "the Node came back");
        Ok(())
    })
    .await
    .expect("a running kubelet does not re-register its deleted Node");
    // ...until the kubelet restarts.
    let started = Instant::now();
    machine.restart_kubelet().await.expect("restart the kubelet");
    until_ready(&nodes, &machine, "True").await;
    report(&format!(
        "real-1: kubelet restart to Node re-registered Ready in {:.1?}",
        started.elapsed()
    ));

    machine.shutdown().await.expect("shutdown");
    assert_eq!(machine.power_state().await, PowerState::Off);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_machine_cut_off_or_powered_off_goes_unknown_and_comes_back_as_the_same_node() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let lan = Lan::start(plane.api_address()).expect("lan");
    let machine = Machine::create(plane, &lan, spec("real-2")).await.expect("machine");
    let _machine_logs = machine.logs_on_failure();

    let started = Instant::now();
    machine.power_on().await.expect("power on");
    let uid = until_ready(&nodes, &machine, "True").await.uid().expect("uid");
    report(&format!("real-2: power on to Node Ready in {:.1?}", started.elapsed()));
    let ns = plane.fresh_namespace("real-machine").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let first_container = run_pod(&pods, &machine).await;

    // d. The cable pulled: the kubelet runs on but reaches no apiserver.
    machine.link().cut().expect("cut the link");
    let started = Instant::now();
    until_ready(&nodes, &machine, "Unknown").await;
    report(&format!("real-2: link cut to Node Unknown in {:.1?}", started.elapsed()));
    assert!(machine.kubelet_running().await, "the kubelet died with the link");
    machine.link().restore().expect("restore the link");
    let started = Instant::now();
    let node = until_ready(&nodes, &machine, "True").await;
    report(&format!("real-2: link restored to Node Ready in {:.1?}", started.elapsed()));
    assert_eq!(node.uid().as_deref(), Some(uid.as_str()), "a different Node object");

    // e. The plug pulled: every process of the machine dies; powered on again, its kubelet takes
    // over the Node it registered before.
    machine.power_cut().await.expect("power cut");
    assert_eq!(machine.power_state().await, PowerState::Off);
    assert!(!machine.kubelet_running().await);
    let left = machine.processes();
    assert!(left.is_empty(), "processes of the machine survived its power cut: {left:?}");
    let started = Instant::now();
    until_ready(&nodes, &machine, "Unknown").await;
    report(&format!("real-2: power cut to Node Unknown in {:.1?}", started.elapsed()));
    let started = Instant::now();
    machine.power_on().await.expect("power on again");
    let node = until_ready(&nodes, &machine, "True").await;
    report(&format!("real-2: power on (second boot) to Node Ready in {:.1?}", started.elapsed()));
    assert_eq!(node.uid().as_deref(), Some(uid.as_str()), "a different Node object");
    // Its pod, bound to the Node all along, runs again in a new container.
    until_pod_runs(&pods, &machine, Some(&first_container)).await;
}
