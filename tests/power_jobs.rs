//! Slots with each power driver, applied to the real kube-apiserver (the CRD schema takes them),
//! turned into their startup and shutdown Jobs, which the apiserver validates and stores. Each
//! Job runs the operator's image as `power on|off`, carries its driver's settings, mounts only
//! the Secrets that driver reads, and has no API access.

use std::collections::BTreeSet;

use homelab_autoscaler::api::{Node, PowerAction, PowerDriverKind, PowerSpec};
use homelab_autoscaler::controller::jobs::{self, JobContext, Lifecycle};
use homelab_autoscaler::power;
use homelab_harness::{Components, ControlPlane};
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const IMAGE: &str = "ghcr.io/homecluster-dev/homelab-autoscaler:test";
const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

fn slot(name: &str, power: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "Node",
        "metadata": { "name": name, "labels": { "group": "pool" } },
        "spec": { "kubernetesNodeName": name, "power": power },
    }))
    .expect("slot")
}

/// A slot, and for each direction the driver and the Secrets its Job mounts.
struct Case {
    slot: Node,
    on: (PowerDriverKind, &'static [&'static str]),
    off: (PowerDriverKind, &'static [&'static str]),
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            slot: slot(
                "wol-ssh",
                json!({
                    "wakeOnLan": { "mac": "52:54:00:ab:cd:ef", "broadcastAddress": "192.168.1.255" },
                    "ssh": {
                        "host": "192.168.1.20", "user": "homelab",
                        "privateKey": { "name": "ssh-key", "key": "ssh-privatekey" },
                        "knownHostKey": HOST_KEY,
                    },
                    "nodeSelector": { "kubernetes.io/hostname": "gateway" },
                }),
            ),
            on: (PowerDriverKind::WakeOnLan, &[]),
            off: (PowerDriverKind::Ssh, &["ssh-key"]),
        },
        Case {
            slot: slot(
                "redfish",
                json!({
                    "redfish": {
                        "endpoint": "https://10.0.0.5", "systemId": "1",
                        "credentials": { "secretName": "bmc-login" },
                        "tls": { "caBundle": { "name": "bmc-ca", "key": "ca.crt" } },
                        "offResetType": "ForceOff",
                    },
                }),
            ),
            on: (PowerDriverKind::Redfish, &["bmc-ca", "bmc-login"]),
            off: (PowerDriverKind::Redfish, &["bmc-ca", "bmc-login"]),
        },
        Case {
            slot: slot(
                "ipmi-ssh",
                json!({
                    "ipmi": { "host": "10.0.0.6", "credentials": { "secretName": "ipmi-creds" }, "cipherSuite": 3 },
                    "ssh": {
                        "host": "10.0.0.16", "user": "root",
                        "privateKey": { "name": "ssh-key", "key": "ssh-privatekey" },
                        "knownHostKey": HOST_KEY,
                    },
                    "offWith": "ssh",
                }),
            ),
            on: (PowerDriverKind::Ipmi, &["ipmi-creds"]),
            off: (PowerDriverKind::Ssh, &["ssh-key"]),
        },
        Case {
            slot: slot(
                "plug",
                json!({
                    "http": {
                        "onRequest": {
                            "url": "http://ha.lan:8123/api/services/switch/turn_on",
                            "headers": [{ "name": "Authorization", "valueFrom": { "name": "ha-token", "key": "token" }, "valuePrefix": "Bearer " }],
                            "body": "{\"entity_id\":\"switch.rack_1\"}",
                        },
                        "offRequest": {
                            "method": "GET", "url": "http://plug.lan/cm?cmnd=Power%20Off",
                            "basicAuth": { "secretName": "plug-login" },
                        },
                    },
                }),
            ),
            on: (PowerDriverKind::Http, &["ha-token"]),
            off: (PowerDriverKind::Http, &["plug-login"]),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_driver_becomes_jobs_the_apiserver_accepts() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("CRDs");
    let client = plane.client().expect("client");
    let ns = plane.fresh_namespace("power-jobs").await.expect("namespace");
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let job_api: Api<Job> = Api::namespaced(client.clone(), &ns);
    let post = PostParams::default();

    for case in cases() {
        let name = case.slot.metadata.name.clone().expect("name");
        let stored = slots.create(&post, &case.slot).await.expect("the schema takes the slot");
        assert_eq!(stored.spec.power, case.slot.spec.power, "{name}: spec.power round-trips");
        for (lifecycle, action, (kind, secrets)) in [
            (Lifecycle::Startup, PowerAction::On, case.on),
            (Lifecycle::Shutdown, PowerAction::Off, case.off),
        ] {
            let job = jobs::build(&JobContext {
                slot: &stored,
                group: "pool",
                claim: None,
                lifecycle,
                name: format!("{name}-{}", lifecycle.as_str()),
                max_run_time: std::time::Duration::from_secs(300),
                power_image: IMAGE,
                priority_class: None,
                step: None,
                suspend: false,
                wake_first: false,
            })
            .expect("a Job");
            let created = job_api.create(&post, &job).await.unwrap_or_else(|e| {
                panic!("{name} {}: the apiserver refused the Job: {e}", lifecycle.as_str())
            });
            let pod = created.spec.expect("spec").template.spec.expect("pod");
            let what = format!("{name} {}", lifecycle.as_str());
            assert_eq!(pod.automount_service_account_token, Some(false), "{what}: no API access");
            assert_eq!(
                pod.host_network.unwrap_or(false),
                kind == PowerDriverKind::WakeOnLan,
                "{what}: only a magic packet needs the host's network"
            );
            let container = &pod.containers[0];
            assert_eq!(container.image.as_deref(), Some(IMAGE), "{what}");
            assert_eq!(
                container.args.clone().unwrap_or_default(),
                vec!["power".to_string(), action.as_str().to_string()],
                "{what}"
            );
            let mounted: BTreeSet<String> = pod
                .volumes
                .unwrap_or_default()
                .iter()
                .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
                .collect();
            let want: BTreeSet<String> = secrets.iter().map(|s| s.to_string()).collect();
            assert_eq!(mounted, want, "{what}: only its driver's Secrets");
            for mount in container.volume_mounts.clone().unwrap_or_default() {
                assert!(mount.read_only == Some(true), "{what}: {mount:?}");
                assert!(mount.mount_path.starts_with(power::DEFAULT_SECRETS_DIR), "{what}");
            }
            let env = container.env.clone().unwrap_or_default();
            let settings = env
                .iter()
                .find(|e| e.name == power::SPEC_ENV)
                .and_then(|e| e.value.clone())
                .expect("the settings");
            let settings: PowerSpec = serde_json::from_str(&settings).expect("a spec.power");
            assert_eq!(settings.configured(), vec![kind], "{what}: only the driver it runs");
            assert_eq!(power::driver_for(&settings, action).expect("a driver"), kind, "{what}");
            assert!(!settings.secrets_of(kind).iter().any(|s| !want.contains(s)), "{what}");
        }
    }
    // spec.power.nodeSelector places the pods (on a node of the machines' LAN).
    let placed = job_api.get("wol-ssh-startup").await.expect("job");
    let selector = placed.spec.and_then(|s| s.template.spec).and_then(|p| p.node_selector);
    assert_eq!(selector.unwrap_or_default()["kubernetes.io/hostname"], "gateway");
}

/// Runs the operator binary as a person would, with the control plane's kubeconfig.
fn power_cli(plane: &ControlPlane, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_homelab-autoscaler"))
        .arg("power")
        .args(args)
        .env("KUBECONFIG", plane.kubeconfig_path())
        .env_remove("HOMELAB_POWER_SPEC")
        .output()
        .expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_checks_a_slots_wiring_with_power_status_on_and_off() {
    let peer = homelab_harness::power_peers::RedfishPeer::start().await.expect("sushy-emulator");
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("CRDs");
    let client = plane.client().expect("client");
    let ns = plane.fresh_namespace("power-cli").await.expect("namespace");
    let post = PostParams::default();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    let login = |password: &str| -> k8s_openapi::api::core::v1::Secret {
        serde_json::from_value(json!({
            "metadata": { "name": "bmc-login" },
            "type": "kubernetes.io/basic-auth",
            "stringData": { "username": peer.user, "password": password },
        }))
        .expect("secret")
    };
    secrets.create(&post, &login("wrong")).await.expect("secret");
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let machine = slot(
        "rack-1",
        json!({
            "redfish": {
                "endpoint": peer.endpoint(),
                "credentials": { "secretName": "bmc-login" },
                "offResetType": "ForceOff",
            },
            "confirmTimeoutSeconds": 30,
        }),
    );
    slots.create(&post, &machine).await.expect("slot");
    let target = ["--slot", "rack-1", "--namespace", ns.as_str()];

    // A wrong password in the Secret: the person is told which Secret to check.
    let (ok, _, stderr) = power_cli(plane, &[&["status"][..], &target].concat());
    assert!(!ok, "a refused login fails");
    assert!(stderr.contains("BMC at 127.0.0.1 refused the login (answered 401"), "{stderr}");
    assert!(stderr.contains("check Secret bmc-login"), "{stderr}");

    secrets.replace("bmc-login", &post, &login(&peer.password)).await.expect("fix the secret");
    let (ok, stdout, stderr) = power_cli(plane, &[&["status"][..], &target].concat());
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "on: redfish\noff: redfish\npower state: Off\n");
    let (ok, stdout, stderr) = power_cli(plane, &[&["on"][..], &target].concat());
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("on (redfish): BMC at 127.0.0.1 reports On after"), "{stdout}");
    let (ok, stdout, _) = power_cli(plane, &[&["status"][..], &target].concat());
    assert!(ok && stdout.ends_with("power state: On\n"), "{stdout}");
    let (ok, stdout, stderr) = power_cli(plane, &[&["off"][..], &target].concat());
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("off (redfish): BMC at 127.0.0.1 reports Off after"), "{stdout}");

    // A slot powered by pod specs has nothing to run here, and says so.
    let pods: Node = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "Node",
        "metadata": { "name": "by-pods", "labels": { "group": "pool" } },
        "spec": {
            "kubernetesNodeName": "by-pods",
            "startupPodSpec": { "image": "busybox" },
            "shutdownPodSpec": { "image": "busybox" },
        },
    }))
    .expect("slot");
    slots.create(&post, &pods).await.expect("slot");
    let (ok, _, stderr) =
        power_cli(plane, &["status", "--slot", "by-pods", "--namespace", ns.as_str()]);
    assert!(!ok);
    assert!(stderr.contains("slot by-pods has no spec.power"), "{stderr}");
}
