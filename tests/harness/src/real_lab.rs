//! The operator on real machines ([`crate::machine`]): what every scenario of that tier sets up.
//! An always-on machine (the hub) runs the power Jobs as real pods of the operator's own image;
//! pool machines get an sshd whose key the test holds; the operator's controllers run in the
//! test process with timeouts short enough that a failed attempt costs seconds; and a watcher
//! records every moment a machine runs without its Node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::controller::MachineSettings;
use homelab_autoscaler::operator::DEFAULT_POWER_IMAGE;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::control_plane::{Components, ControlPlane};
use crate::lab::spawn_controllers;
use crate::machine::{Lan, Machine, MachineSpec, PowerState};
use crate::test_namespace::{TestNamespace, test_namespace};

/// How long the operator and the machines are given for one step.
pub const ACT: Duration = Duration::from_secs(180);
/// The label of the hub's Node, which the pools' power Jobs select.
pub const HUB_ROLE: &str = "homelab.test/role";

/// Timeouts short enough that a failed attempt costs seconds. The SSH driver gives up on an
/// unreachable host after 30 s, inside the Job's 60 s.
pub fn timeouts() -> Timeouts {
    Timeouts {
        job_timeout: Duration::from_secs(60),
        registration: Duration::from_secs(30),
        readiness_gate: Duration::from_secs(30),
        margin: Duration::from_secs(5),
    }
}

/// The scenarios' `--not-ready-grace`.
pub const NOT_READY_GRACE: Duration = Duration::from_secs(240);

/// The machine settings the scenarios run the operator with: a short drain and grace.
pub fn machine_settings() -> MachineSettings {
    MachineSettings {
        drain_timeout: Some(Duration::from_secs(5)),
        off_node_grace: Duration::from_secs(20),
        // The harness's kube-controller-manager marks a silent kubelet Unknown after 20 s.
        node_monitor_grace: Duration::from_secs(25),
        // Longer than a boot window (`timeouts`), so a kubelet held NotReady outlives the
        // bound it used to be judged by.
        not_ready_grace: NOT_READY_GRACE,
        meter_interval: Duration::from_secs(60),
    }
}

/// The cargo profile of the tests' operator image: `dev`, which scripts/build-image.sh links
/// statically from the crates the test build compiled, where `make image` builds `release`.
pub const TEST_IMAGE_PROFILE: &str = "dev";

/// The platforms of the tests' operator image: the machines here are amd64, so the image is a
/// single amd64 one; tests/install_image.rs builds `make image`'s index of both.
pub const TEST_IMAGE_PLATFORMS: &str = "linux/amd64";

/// The operator's image as `make image` builds it (with [`TEST_IMAGE_PROFILE`]), once per test
/// process; or the tarball that `HOMELAB_OPERATOR_IMAGE` names, built before (`make test` builds
/// it beside the test build). Returns the tarball and the image's name.
pub async fn operator_image() -> Result<(PathBuf, String)> {
    static IMAGE: OnceCell<(PathBuf, String)> = OnceCell::const_new();
    IMAGE
        .get_or_try_init(|| async {
            let name = DEFAULT_POWER_IMAGE.to_owned();
            if let Some(prebuilt) = std::env::var_os("HOMELAB_OPERATOR_IMAGE") {
                return Ok((PathBuf::from(prebuilt), name));
            }
            let root = crate::repo_root();
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| root.join("target"), PathBuf::from);
            let out = target.join("image/homelab-autoscaler-machines.tar");
            let status = tokio::process::Command::new(root.join("scripts/build-image.sh"))
                .arg(&out)
                .env("IMAGE_PROFILE", TEST_IMAGE_PROFILE)
                .env("PLATFORMS", TEST_IMAGE_PLATFORMS)
                .status()
                .await
                .context("running scripts/build-image.sh")?;
            ensure!(status.success(), "scripts/build-image.sh failed: {status}");
            Ok((out, name))
        })
        .await
        .cloned()
}

/// The always-on machine the power Jobs of namespace `ns` run on, powered on, with the operator's
/// image imported. Its Node is `<ns>-hub`, labelled [`HUB_ROLE`]`=<ns>`: the tests of one binary
/// share a control plane, and each test's Jobs must run on its own hub, on its own lan.
pub async fn hub(plane: &ControlPlane, lan: &Lan, ns: &str) -> Result<Machine> {
    always_on(plane, lan, &format!("{ns}-hub"), BTreeMap::from([(HUB_ROLE.into(), ns.into())]))
        .await
}

/// A machine that runs the power Jobs: powered on, registered with `labels`, and holding the
/// operator's image (no registry serves it).
pub async fn always_on(
    plane: &ControlPlane,
    lan: &Lan,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<Machine> {
    let spec = MachineSpec { name: name.into(), labels, ..MachineSpec::default() };
    let hub = Machine::create(plane, lan, spec).await?;
    hub.power_on().await?;
    let (tar, name) = operator_image().await?;
    let output = hub.ctr(&["images", "import", &tar.display().to_string()]).await?;
    ensure!(output.status.success(), "ctr import: {}", String::from_utf8_lossy(&output.stderr));
    let listed = hub.ctr(&["images", "ls", "-q"]).await?;
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    ensure!(listed.lines().any(|l| l == name), "{name} not among the hub's images:\n{listed}");
    Ok(hub)
}

/// Removes taint `key` from Node `name`, if it is there: what a network agent (Cilium's, say)
/// does once it runs on the machine.
pub async fn clear_taint(nodes: &Api<CoreNode>, name: &str, key: &str) -> Result<()> {
    if let Some(node) = nodes.get_opt(name).await? {
        remove_taint(nodes, &node, key).await?;
    }
    Ok(())
}

/// Removes taint `key` from `node` as read, conditional on its resourceVersion, so a write
/// another writer made since is never undone (a conflict instead).
async fn remove_taint(nodes: &Api<CoreNode>, node: &CoreNode, key: &str) -> kube::Result<()> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if taints.iter().all(|t| t.key != key) {
        return Ok(());
    }
    let kept: Vec<&Taint> = taints.iter().filter(|t| t.key != key).collect();
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": node.metadata.resource_version },
        "spec": { "taints": kept },
    });
    let name = node.metadata.name.as_deref().unwrap_or_default();
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// A network agent's stand-in for a whole cluster: on every Node that is Ready and carries the
/// agent's bootstrap taint `key` (registered by its kubelet, `--register-with-taints`), removes
/// the taint, as the agent's pod does once networking is up on that machine. Runs until `stop`.
pub fn network_agent(nodes: Api<CoreNode>, key: &'static str, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut events = watcher(nodes.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        loop {
            let node = tokio::select! {
                () = stop.cancelled() => return,
                next = events.next() => match next {
                    Some(Ok(node)) => node,
                    Some(Err(_)) => continue,
                    None => return,
                },
            };
            if !crate::is_ready(&node) {
                continue;
            }
            match remove_taint(&nodes, &node, key).await {
                // A conflict means a newer version is on its way: the watch brings it.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => {
                    let name = node.metadata.name.as_deref().unwrap_or_default();
                    eprintln!("network agent on {name}: {error:#}");
                }
                Ok(()) => {}
            }
        }
    });
}

/// One scenario's namespace on the test binary's shared control plane, a lan of its own and its
/// own hub: scenarios of one binary run side by side.
pub async fn scenario(prefix: &str) -> (TestNamespace, Lan, Machine) {
    homelab_autoscaler::tls::install_crypto_provider();
    let space = test_namespace(Components::CLUSTER, prefix).await.expect("namespace");
    let lan = Lan::start(space.plane.api_address()).expect("lan");
    let hub = hub(space.plane, &lan, &space.ns).await.expect("hub");
    (space, lan, hub)
}

/// A slot's `spec.power` for `machine`: a Wake-on-LAN magic packet to its card on, an SSH
/// `poweroff` to its sshd off (the key in Secret `key_secret`, its host key pinned), the power
/// Jobs on the Nodes `node_selector` selects.
pub fn wake_and_ssh_power(
    machine: &Machine,
    key_secret: &str,
    node_selector: serde_json::Value,
) -> Result<serde_json::Value> {
    Ok(serde_json::json!({
        "wakeOnLan": { "mac": machine.mac(), "broadcastAddress": Lan::broadcast() },
        "ssh": {
            "host": machine.address().to_string(),
            "user": "root",
            "privateKey": { "name": key_secret, "key": "ssh-privatekey" },
            "knownHostKey": machine.ssh_host_key()?,
            "command": "poweroff",
        },
        "nodeSelector": node_selector,
    }))
}

/// The Nodes on which a pod of workload `app` (label `app=<app>`) runs: phase Running with a
/// container running, and not being deleted.
pub async fn hosts_running(pods: &Api<Pod>, app: &str) -> Result<BTreeSet<String>> {
    let listed = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?.items;
    let mut hosts = BTreeSet::new();
    for pod in listed.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let status = pod.status.clone().unwrap_or_default();
        let running = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        if status.phase.as_deref() == Some("Running") && running {
            hosts.extend(pod.spec.as_ref().and_then(|s| s.node_name.clone()));
        }
    }
    Ok(hosts)
}

/// A Secret `name` holding one `key`, as a manifest document for kubectl.
pub fn secret(name: &str, key: &str, value: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name },
        "stringData": { key: value },
    })
}

/// A fresh ed25519 key pair: the private key (OpenSSH PEM) and the public line.
pub fn ssh_key_pair() -> Result<(String, String)> {
    let keys = tempfile::tempdir()?;
    let key = keys.path().join("id");
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .context("running ssh-keygen")?;
    ensure!(status.success(), "ssh-keygen failed");
    Ok((std::fs::read_to_string(&key)?, std::fs::read_to_string(key.with_extension("pub"))?))
}

/// A pool machine, powered off, with an sshd that the returned private key logs in to (every
/// command powers the machine off). `spec.ssh_authorized_key` is set here.
pub async fn pool_machine(
    plane: &ControlPlane,
    lan: &Lan,
    mut spec: MachineSpec,
) -> Result<(Machine, String)> {
    let (private, public) = ssh_key_pair()?;
    spec.ssh_authorized_key = Some(public);
    let machine = Machine::create(plane, lan, spec).await?;
    Ok((machine, private))
}

/// The operator's controllers for `ns`, in this process, with power Jobs from `image`.
pub async fn start_operator(
    plane: &ControlPlane,
    ns: &str,
    image: &str,
    settings: MachineSettings,
) -> CancellationToken {
    let stop = CancellationToken::new();
    let clients = plane.controller_clients().expect("the controllers' clients");
    spawn_controllers(&clients, ns, timeouts(), settings, image, &stop).await;
    stop
}

/// A claim for `slot` as the provider makes one, created; then waited on until ready.
pub async fn claim_ready(client: &kube::Client, ns: &str, name: &str, slot: &str) {
    use homelab_autoscaler::api::{Group, Node, NodeClaim, NodeClaimPhase};
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), ns);
    let groups: Api<Group> = Api::namespaced(client.clone(), ns);
    let claim = crate::claims::provider_claim_for(name, slot, &slots, &groups, timeouts(), "test")
        .await
        .expect("claim");
    claims.create(&Default::default(), &claim).await.expect("create claim");
    crate::eventually(&format!("claim {name} ready on the real machine"), ACT, || async {
        let claim = claims.get(name).await?;
        let phase = crate::claims::phase(&claim);
        ensure!(phase == NodeClaimPhase::Ready, "phase {:?}", claim.status);
        Ok(())
    })
    .await
    .expect("ready");
}

/// Every object of `api` ever seen, by uid, as first seen: claims are deleted once released,
/// so a list at the end would miss them; and with a watch started before a Node exists, its
/// first sight is the Node as the kubelet created it.
pub fn first_seen<K>(api: Api<K>) -> Arc<Mutex<HashMap<String, K>>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let seen: Arc<Mutex<HashMap<String, K>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let (Ok(watcher::Event::Apply(object)) | Ok(watcher::Event::InitApply(object))) = event
            else {
                continue;
            };
            if let (Some(uid), Ok(mut seen)) = (object.meta().uid.clone(), record.lock()) {
                seen.entry(uid).or_insert(object);
            }
        }
    });
    seen
}

/// Every moment a watched machine was on, its kubelet running, with no Node after it had one in
/// that power-on: a machine stranded without its Node.
#[derive(Clone, Default)]
pub struct Stranding {
    seen: Arc<Mutex<Vec<String>>>,
}

impl Stranding {
    /// Watches `machine` every 250 ms until the runtime ends.
    pub fn watch(machine: Machine, nodes: Api<CoreNode>) -> Self {
        let stranding = Self::default();
        let record = stranding.seen.clone();
        tokio::spawn(async move {
            let mut registered = false;
            loop {
                let on = machine.power_state().await == PowerState::On;
                let node = nodes.get_opt(machine.name()).await;
                match (on, node) {
                    (false, _) => registered = false,
                    (true, Ok(Some(_))) => registered = true,
                    (true, Ok(None)) if registered && machine.kubelet_running().await => {
                        if let Ok(mut log) = record.lock() {
                            log.push(format!("{}: on with no Node", jiff::Timestamp::now()));
                        }
                    }
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        stranding
    }

    /// Every moment seen so far.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Panics if the machine has run without its Node.
    pub fn assert_never(&self, name: &str) {
        let seen = self.seen();
        assert!(seen.is_empty(), "machine {name} ran without its Node: {seen:?}");
    }
}

/// The label every slot of a scenario's pool declares (its value the test's namespace), which no
/// kubelet registers: a workload that selects it runs on a machine of its test's pool, never on
/// a hub.
pub const POOL_LABEL: &str = "homelab.test/pool";

/// A workload of `replicas` pods of the pause image (on the machines only: no registry serves
/// it), on the machines of the pool in `ns` only ([`POOL_LABEL`]).
pub fn pool_workload(
    ns: &str,
    name: &str,
    replicas: i32,
) -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "nodeSelector": { POOL_LABEL: ns },
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{ "name": "work", "image": crate::machine::PAUSE_IMAGE, "imagePullPolicy": "Never" }],
                },
            },
        },
    }))
    .expect("deployment")
}

/// Releases claim `name` as a scaler does: marked for scale-down, then deleted.
pub async fn release(claims: &Api<homelab_autoscaler::api::NodeClaim>, name: &str) {
    let mark = serde_json::json!({ "status": {
        "scaleDownRequestedAt": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        "scaleDownRequestedBy": "test",
    }});
    claims.patch_status(name, &PatchParams::default(), &Patch::Merge(&mark)).await.expect("mark");
    claims.delete(name, &Default::default()).await.expect("release");
}
