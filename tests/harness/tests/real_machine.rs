//! The real-machine tier (homelab_harness::machine): a network namespace on a test lan running
//! a real containerd and kubelet, whose Node and pods are the kubelet's, not kwok's. And the
//! upstream kubelet behaviour the product depends on: a kubelet whose Node is deleted does not
//! register it again until it restarts. And a machine's suspend to RAM over SSH, and its wake by
//! a magic packet, as the same Node and the same processes.
//!
//! Needs root, network namespaces and a cgroup v1 freezer hierarchy; where they are missing the
//! tests fail (they do not skip). The first run builds the `machines` profile.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use homelab_autoscaler::power::wol::{magic_packet, parse_mac};
use homelab_harness::machine::{
    Lan, Machine, MachineSpec, PAUSE_IMAGE, PowerCause, PowerState, SSH_PORT, WAKE_ON_LAN_PORT,
    netns,
};
use homelab_harness::real_lab::ssh_key_pair;
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

/// `ssh root@<machine> COMMAND` from the lan's namespace with the private key at `key`: whether
/// it exited 0, and what it said.
async fn ssh(lan: &Lan, machine: &Machine, key: &Path, command: &str) -> (bool, String) {
    let output = tokio::process::Command::new("ip")
        .args(["netns", "exec", lan.netns(), "ssh", "-i"])
        .arg(key)
        .args(["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"])
        .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"])
        .arg(format!("root@{}", machine.address()))
        .arg(command)
        .output()
        .await
        .expect("run ssh");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// Whether a TCP connection from the lan's namespace to the machine's sshd succeeds within 3 s.
async fn ssh_port_answers(lan: &Lan, machine: &Machine) -> bool {
    let (netns, to) = (lan.netns().to_owned(), SocketAddr::from((machine.address(), SSH_PORT)));
    tokio::task::spawn_blocking(move || {
        netns::open_in(&netns, move || TcpStream::connect_timeout(&to, Duration::from_secs(3)))
            .is_ok()
    })
    .await
    .expect("connect task")
}

/// A magic packet for `machine`'s card to the lan's broadcast address, port 9, from the lan's
/// namespace: what the operator's Wake-on-LAN driver sends.
fn send_magic_packet(lan: &Lan, machine: &Machine) {
    let mac = parse_mac(&machine.mac()).expect("mac");
    let socket = netns::open_in(lan.netns(), || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_broadcast(true)?;
        Ok(socket)
    })
    .expect("a socket on the lan");
    socket.send_to(&magic_packet(mac), (Lan::broadcast(), WAKE_ON_LAN_PORT)).expect("send");
}

/// Pod `work`'s container: its id and restart count.
async fn container_of(pods: &Api<Pod>) -> (String, i32) {
    let pod = pods.get("work").await.expect("pod work");
    let statuses = pod.status.and_then(|s| s.container_statuses).unwrap_or_default();
    let status = statuses.into_iter().next().expect("a container status");
    let id = status.container_id.unwrap_or_default();
    (id.trim_start_matches("containerd://").to_owned(), status.restart_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_machine_suspended_over_ssh_sleeps_and_wakes_on_its_magic_packet_as_itself() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let lan = Lan::start(plane.api_address()).expect("lan");
    let (private, public) = ssh_key_pair().expect("key pair");
    let keys = tempfile::tempdir().expect("key dir");
    let key = keys.path().join("id");
    std::fs::write(&key, private).expect("write key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("key mode");
    let spec1 = MachineSpec { ssh_authorized_key: Some(public), ..spec("sleep-1") };
    let m1 = Machine::create(plane, &lan, spec1).await.expect("machine sleep-1");
    let _m1_logs = m1.logs_on_failure();
    let m2 = Machine::create(plane, &lan, spec("sleep-2")).await.expect("machine sleep-2");
    let _m2_logs = m2.logs_on_failure();
    m1.power_on().await.expect("power on sleep-1");
    m2.power_on().await.expect("power on sleep-2");
    let uid = until_ready(&nodes, &m1, "True").await.uid().expect("uid");
    until_ready(&nodes, &m2, "True").await;
    let kubelet = m1.kubelet_pid().expect("the kubelet's pid");
    let ns = plane.fresh_namespace("real-machine").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let container = run_pod(&pods, &m1).await;
    assert_eq!(m1.freezer_state().expect("freezer"), "THAWED");

    // a. `systemctl suspend` over SSH returns 0 at once; a moment later the machine sleeps: every
    // process frozen, its address silent, its Node Unknown.
    let (ok, said) = ssh(&lan, &m1, &key, "systemctl suspend").await;
    assert!(ok, "ssh systemctl suspend failed: {said}");
    let asked = Instant::now();
    eventually("sleep-1 suspended", Duration::from_secs(30), || async {
        anyhow::ensure!(m1.suspended(), "awake");
        Ok(())
    })
    .await
    .expect("suspended");
    report(&format!("sleep-1: ssh suspend returned to frozen in {:.1?}", asked.elapsed()));
    assert_eq!(m1.suspend_requests(), 1);
    assert_eq!(m1.power_state_now(), PowerState::On, "a suspended machine is On (S3)");
    assert_eq!(m1.freezer_state().expect("freezer"), "FROZEN");
    assert_eq!(m1.kubelet_pid(), Some(kubelet), "the kubelet sleeps, it does not stop");
    let last = m1.power_history().last().copied().expect("history");
    assert_eq!((last.state, last.cause), (PowerState::On, PowerCause::Suspend));
    assert!(!ssh_port_answers(&lan, &m1).await, "a sleeping machine's sshd answered");
    // Two machines of the lan asleep at once.
    m2.suspend().await.expect("suspend sleep-2");
    assert!(m2.suspended());
    let slept = Instant::now();
    until_ready(&nodes, &m1, "Unknown").await;
    report(&format!("sleep-1: suspended to Node Unknown in {:.1?}", slept.elapsed()));

    // b. Its magic packet wakes it, and only it: the same Node, kubelet, boot and container.
    let (boots, wakes) = (m1.boots(), m1.wakes());
    send_magic_packet(&lan, &m1);
    let sent = Instant::now();
    eventually("sleep-1 resumed", Duration::from_secs(30), || async {
        anyhow::ensure!(!m1.suspended(), "asleep");
        Ok(())
    })
    .await
    .expect("resumed");
    report(&format!("sleep-1: magic packet to resumed in {:.1?}", sent.elapsed()));
    let node = until_ready(&nodes, &m1, "True").await;
    report(&format!("sleep-1: magic packet to Node Ready in {:.1?}", sent.elapsed()));
    assert_eq!(node.uid().as_deref(), Some(uid.as_str()), "a different Node object");
    assert_eq!(m1.kubelet_pid(), Some(kubelet), "a different kubelet");
    assert_eq!(m1.freezer_state().expect("freezer"), "THAWED");
    assert_eq!((m1.boots(), m1.wakes(), m1.resumes()), (boots, wakes + 1, 1));
    let last = m1.power_history().last().copied().expect("history");
    assert_eq!((last.state, last.cause), (PowerState::On, PowerCause::Resume));
    assert_eq!(container_of(&pods).await, (container.clone(), 0), "the container restarted");
    assert!(ssh_port_answers(&lan, &m1).await, "the woken machine's sshd does not answer");
    assert!(m2.suspended(), "sleep-1's packet woke sleep-2");
    assert_eq!((m2.wakes(), m2.resumes()), (0, 0));

    // c. A power cut in its sleep kills it whole, and leaves its card listening on eth0 again:
    // its magic packet boots it.
    m2.power_cut().await.expect("power cut sleep-2");
    assert!(!m2.suspended());
    assert_eq!(m2.power_state().await, PowerState::Off);
    let left = m2.processes();
    assert!(left.is_empty(), "processes of sleep-2 survived its power cut: {left:?}");
    send_magic_packet(&lan, &m2);
    eventually("sleep-2 booted by its magic packet", ACT, || async {
        anyhow::ensure!(m2.power_state().await == PowerState::On, "off");
        Ok(())
    })
    .await
    .expect("sleep-2 boots");
    assert_eq!((m2.boots(), m2.wakes(), m2.resumes()), (2, 1, 0));

    // d. A suspend that does not take: the command still succeeds, the machine stays awake.
    m1.refuse_suspend(true);
    let (ok, said) = ssh(&lan, &m1, &key, "sudo systemctl suspend").await;
    assert!(ok, "ssh sudo systemctl suspend failed: {said}");
    eventually("the second request counted", Duration::from_secs(10), || async {
        anyhow::ensure!(m1.suspend_requests() == 2, "{} requests", m1.suspend_requests());
        Ok(())
    })
    .await
    .expect("counted");
    stays("sleep-1 awake after a refused suspend", Duration::from_secs(15), || async {
        anyhow::ensure!(!m1.suspended(), "suspended");
        anyhow::ensure!(ssh_port_answers(&lan, &m1).await, "its sshd does not answer");
        let node = nodes.get(m1.name()).await?;
        anyhow::ensure!(ready_status(&node) == Some("True"), "Ready={:?}", ready_status(&node));
        Ok(())
    })
    .await
    .expect("stays awake");
    assert_eq!(m1.freezer_state().expect("freezer"), "THAWED");

    // e. Asleep, a shutdown reaches no OS; the power button wakes it. Dropped asleep at the end,
    // it is cut whole.
    m1.suspend().await.expect("suspend");
    m1.shutdown().await.expect("shutdown while asleep");
    assert!(m1.suspended(), "a shutdown woke a sleeping machine");
    m1.power_on().await.expect("power button");
    assert!(!m1.suspended());
    assert_eq!((m1.boots(), m1.resumes()), (boots, 2));

    // f. A suspend that hangs half-way: frozen and silent, but not asleep; its magic packet does
    // not wake it and a shutdown reaches no OS. A power cut ends it; the next boot has its card
    // up again.
    m1.refuse_suspend(false);
    m1.hang_on_suspend(true);
    let (ok, said) = ssh(&lan, &m1, &key, "systemctl suspend").await;
    assert!(ok, "ssh systemctl suspend failed: {said}");
    eventually("sleep-1's address silent", Duration::from_secs(30), || async {
        anyhow::ensure!(!ssh_port_answers(&lan, &m1).await, "its sshd answers");
        Ok(())
    })
    .await
    .expect("silent");
    assert!(!m1.suspended(), "a hung machine is not asleep");
    assert_eq!(m1.power_state_now(), PowerState::On);
    assert_eq!(m1.freezer_state().expect("freezer"), "FROZEN");
    assert_eq!(m1.kubelet_pid(), Some(kubelet), "the same kubelet, frozen");
    m1.shutdown().await.expect("shutdown while hung");
    assert_eq!(m1.power_state_now(), PowerState::On, "a shutdown reached a hung machine");
    send_magic_packet(&lan, &m1);
    stays("sleep-1 hung after its magic packet", Duration::from_secs(5), || async {
        anyhow::ensure!(!ssh_port_answers(&lan, &m1).await, "its sshd answers");
        Ok(())
    })
    .await
    .expect("a packet does not wake a hung machine");
    assert_eq!(m1.resumes(), 2, "a hung machine resumed");
    m1.power_cut().await.expect("power cut");
    m1.power_on().await.expect("power on");
    assert_eq!(m1.boots(), boots + 1);
    eventually("sleep-1 answers after its boot", ACT, || async {
        anyhow::ensure!(ssh_port_answers(&lan, &m1).await, "its sshd does not answer");
        Ok(())
    })
    .await
    .expect("answers");
    m1.hang_on_suspend(false);
    m1.suspend().await.expect("suspend again");
}
