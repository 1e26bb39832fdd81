//! Every file in examples/ applied the way a person applies it: `kubectl apply -f` against the
//! real kube-apiserver, with the CRDs installed and the product's admission webhooks registered
//! for the example's namespace (served in this process on 127.0.0.1). Each object is read back
//! with `kubectl get -o json`, and the test asserts what a wrong manifest would lose: the power
//! drivers of each slot, the group's scaler, every enum-like string still a string (Go's YAML
//! reads an unquoted `on` as a boolean, and the schema then prunes the field), and each
//! referenced Secret key present in the slot's namespace.
//!
//! The homelab examples carry their own Namespace; the older ones are applied with `-n` into a
//! fresh namespace. Each test registers its own configurations, named after its namespace and
//! selecting it alone, so the tests run in parallel.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use homelab_autoscaler::api::{Node, NodeClaim, PowerSpec, SecretKeyRef};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::tls::{CertFiles, ReloadingServerConfig, install_crypto_provider};
use homelab_autoscaler::webhook::configuration::{self, Endpoint};
use homelab_autoscaler::webhook::{SystemClock, WebhookState, router, server::serve_https};
use homelab_harness::admission::claim;
use homelab_harness::{Components, ControlPlane, WebhookConfiguration, eventually, repo_path};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// How long the apiserver may take to pick a webhook configuration up.
const ACT_TIMEOUT: Duration = Duration::from_secs(90);

/// Fields of our kinds that are booleans by design; any other boolean in a spec is a string
/// that YAML 1.1 turned into one.
const BOOLEAN_FIELDS: &[&str] =
    &["insecureSkipVerify", "zeroOrMaxNodeScaling", "ignoreDaemonSetsUtilization"];

// ---------------------------------------------------------------------------------------------
// The admission webhooks of one namespace.
// ---------------------------------------------------------------------------------------------

/// The product's webhook server for one namespace, registered with the apiserver.
struct Admission {
    plane: &'static ControlPlane,
    ns: String,
    base: String,
    name: String,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    _cert_dir: tempfile::TempDir,
}

impl Admission {
    /// Starts the server on 127.0.0.1, registers configurations selecting `ns` alone and waits
    /// until the validating one answers (a claim for a missing slot is refused).
    async fn start(plane: &'static ControlPlane, ns: &str) -> Result<Self> {
        install_crypto_provider();
        let cert_dir = tempfile::tempdir().context("cert dir")?;
        let cert = plane.issue_serving_cert(&["127.0.0.1"])?;
        std::fs::write(cert_dir.path().join("tls.crt"), &cert.cert_pem)?;
        std::fs::write(cert_dir.path().join("tls.key"), &cert.key_pem)?;
        let tls = ReloadingServerConfig::load(
            CertFiles::in_dir(cert_dir.path(), false),
            &[b"h2", b"http/1.1"],
        )
        .context("loading the serving certificate")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
        let client = plane.client()?;
        let state = WebhookState {
            caches: homelab_autoscaler::cache::Stores::start(&client, ns),
            client,
            namespace: ns.to_string(),
            operator_usernames: Vec::new(),
            clock: Box::new(SystemClock),
            timeouts: Timeouts::default(),
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve_https(
            listener,
            tls,
            router(std::sync::Arc::new(state)),
            shutdown.clone(),
        ));
        let admission = Self {
            plane,
            ns: ns.to_string(),
            name: format!("homelab-autoscaler-{ns}"),
            base,
            shutdown,
            server,
            _cert_dir: cert_dir,
        };
        admission.register().await?;
        admission.until_validating_answers().await?;
        Ok(admission)
    }

    async fn register(&self) -> Result<()> {
        let endpoint = Endpoint::Url(self.base.clone());
        let ca = self.plane.ca_pem();
        let mut mutating = configuration::mutating(&endpoint, &self.ns, Some(ca.as_bytes()), None);
        mutating.metadata.name = Some(self.name.clone());
        let mut validating =
            configuration::validating(&endpoint, &self.ns, Some(ca.as_bytes()), None);
        validating.metadata.name = Some(self.name.clone());
        self.plane
            .register_webhooks(
                vec![
                    WebhookConfiguration::Mutating(mutating),
                    WebhookConfiguration::Validating(validating),
                ],
                &self.base,
                &ca,
            )
            .await
    }

    async fn until_validating_answers(&self) -> Result<()> {
        let claims: Api<NodeClaim> = Api::namespaced(self.plane.client()?, &self.ns);
        let dry_run = PostParams { dry_run: true, ..PostParams::default() };
        let probe = claim("probe", "no-such-slot", "no-such-group");
        eventually(
            &format!("the validating webhook for {} to refuse a claim for a missing slot", self.ns),
            ACT_TIMEOUT,
            || {
                let (claims, dry_run, probe) = (claims.clone(), dry_run.clone(), probe.clone());
                async move {
                    match claims.create(&dry_run, &probe).await {
                        Ok(_) => bail!("accepted: the validating webhook is not active yet"),
                        Err(kube::Error::Api(s)) if s.message.contains("no slot") => Ok(()),
                        Err(other) => Err(other.into()),
                    }
                }
            },
        )
        .await
    }

    /// Waits until the mutating webhook stamps a (dry-run) claim for `slot` of `group`.
    async fn until_mutating_answers(&self, slot: &str, group: &str) -> Result<()> {
        let claims: Api<NodeClaim> = Api::namespaced(self.plane.client()?, &self.ns);
        let dry_run = PostParams { dry_run: true, ..PostParams::default() };
        let probe = claim("probe", slot, group);
        eventually(
            &format!("the mutating webhook for {} to stamp claims", self.ns),
            ACT_TIMEOUT,
            || {
                let (claims, dry_run, probe) = (claims.clone(), dry_run.clone(), probe.clone());
                async move {
                    let created = claims.create(&dry_run, &probe).await?;
                    ensure!(created.spec.requested_by.is_some(), "not stamped yet");
                    Ok(())
                }
            },
        )
        .await
    }

    async fn finish(self) {
        assert!(!self.server.is_finished(), "the webhook server task ended");
        let client = self.plane.client().expect("client");
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
            .expect("delete the mutating configuration");
        Api::<ValidatingWebhookConfiguration>::all(client)
            .delete(&self.name, &DeleteParams::default())
            .await
            .expect("delete the validating configuration");
        self.shutdown.cancel();
    }
}

// ---------------------------------------------------------------------------------------------
// kubectl and reading back.
// ---------------------------------------------------------------------------------------------

async fn kubectl(plane: &ControlPlane, args: &[&str]) -> Result<String> {
    let output = plane.kubectl(args).await?;
    ensure!(
        output.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn example(file: &str) -> String {
    repo_path(&format!("examples/{file}")).display().to_string()
}

/// `kubectl apply -f examples/<file>`, into `ns` when the file names no namespace itself.
async fn apply(plane: &ControlPlane, file: &str, ns: Option<&str>) -> Result<String> {
    let path = example(file);
    let mut args = vec!["apply", "-f", path.as_str()];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    kubectl(plane, &args).await
}

async fn get_json(plane: &ControlPlane, resource: &str, ns: &str) -> Result<Value> {
    let text = kubectl(plane, &["get", resource, "-n", ns, "-o", "json"]).await?;
    serde_json::from_str(&text).with_context(|| format!("kubectl get {resource} -o json"))
}

/// The items of a list, by name.
fn items(list: &Value) -> Vec<(String, Value)> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            (item["metadata"]["name"].as_str().unwrap_or_default().to_string(), item.clone())
        })
        .collect()
}

fn item<'a>(list: &'a [(String, Value)], name: &str) -> &'a Value {
    &list.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no object {name}")).1
}

/// Fails on any boolean that is not a boolean field, and any key YAML turned into one: the sign
/// of an unquoted `on`/`off`/`yes`/`no` read as YAML 1.1.
fn assert_no_stray_booleans(path: &str, value: &Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                assert!(key != "true" && key != "false", "{path}: a key read as a boolean: {key}");
                let child_path = format!("{path}.{key}");
                if child.is_boolean() {
                    assert!(
                        BOOLEAN_FIELDS.contains(&key.as_str()),
                        "{child_path} is the boolean {child}, not a string"
                    );
                } else {
                    assert_no_stray_booleans(&child_path, child);
                }
            }
        }
        Value::Array(values) => {
            for (i, child) in values.iter().enumerate() {
                assert!(!child.is_boolean(), "{path}[{i}] is the boolean {child}, not a string");
                assert_no_stray_booleans(&format!("{path}[{i}]"), child);
            }
        }
        _ => {}
    }
}

/// Every Secret key a slot's power drivers read.
fn secret_key_refs(power: &PowerSpec) -> Vec<SecretKeyRef> {
    let mut refs = Vec::new();
    if let Some(redfish) = &power.redfish {
        refs.extend([redfish.credentials.username(), redfish.credentials.password()]);
        refs.extend(redfish.tls.as_ref().and_then(|t| t.ca_bundle.clone()));
    }
    if let Some(ipmi) = &power.ipmi {
        refs.extend([ipmi.credentials.username(), ipmi.credentials.password()]);
    }
    for request in power.http.iter().flat_map(|h| h.on.iter().chain(h.off.iter())) {
        if let Some(auth) = &request.basic_auth {
            refs.extend([auth.username(), auth.password()]);
        }
        refs.extend(request.headers.iter().filter_map(|h| h.value_from.clone()));
    }
    if let Some(ssh) = &power.ssh {
        refs.push(ssh.private_key.clone());
    }
    refs
}

/// Each Secret key the slots' drivers read is a non-empty key of a Secret in `ns`, where the
/// operator and `power --slot` look for it.
async fn assert_secret_refs_resolve(plane: &ControlPlane, ns: &str, slots: &[(String, Value)]) {
    let secrets = items(&get_json(plane, "secrets", ns).await.expect("secrets"));
    let mut checked = 0;
    for (name, raw) in slots {
        let slot: Node = serde_json::from_value(raw.clone()).expect("a slot");
        let Some(power) = &slot.spec.power else { continue };
        for reference in secret_key_refs(power) {
            let secret = secrets
                .iter()
                .find(|(n, _)| *n == reference.name)
                .unwrap_or_else(|| panic!("slot {name}: no Secret {} in {ns}", reference.name));
            let data = secret.1["data"][&reference.key].as_str().unwrap_or_default();
            assert!(
                !data.is_empty(),
                "slot {name}: Secret {} has no key {}",
                reference.name,
                reference.key
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no Secret reference was checked in {ns}");
}

// ---------------------------------------------------------------------------------------------
// The homelab examples: their own namespace, Secrets, typed power drivers.
// ---------------------------------------------------------------------------------------------

/// What a homelab example should read back as.
struct Expected {
    file: &'static str,
    ns: &'static str,
    driver: &'static str,
    /// The providerID each slot declares (`None`: none).
    provider_id: fn(&str) -> Option<String>,
}

async fn apply_homelab(expected: Expected) {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("install CRDs");
    // The namespace exists before its webhooks are registered and answering, so every object of
    // the file passes admission. The apply below then adopts it.
    Api::<Namespace>::all(plane.client().expect("client"))
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": expected.ns }
            }))
            .expect("namespace"),
        )
        .await
        .expect("create the example's namespace");
    let admission = Admission::start(plane, expected.ns).await.expect("webhooks");

    let out = apply(plane, expected.file, None).await.expect("kubectl apply");
    assert!(out.contains("group.infra.homecluster.dev/workers created"), "{out}");

    let groups =
        items(&get_json(plane, "groups.infra.homecluster.dev", expected.ns).await.unwrap());
    assert_eq!(groups.len(), 1, "one Group");
    let group = item(&groups, "workers");
    assert_eq!(group["spec"]["driver"], json!(expected.driver), "{group}");
    assert_no_stray_booleans("group.spec", &group["spec"]);

    let slots = items(&get_json(plane, "nodes.infra.homecluster.dev", expected.ns).await.unwrap());
    let names: Vec<&str> = slots.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["mini-1", "mini-2", "rack-1"]);
    for (name, slot) in &slots {
        assert_eq!(slot["metadata"]["labels"]["group"], json!("workers"), "{name}");
        assert_no_stray_booleans(&format!("{name}.spec"), &slot["spec"]);
        let power = &slot["spec"]["power"];
        assert!(slot["spec"].get("startupPodSpec").is_none(), "{name}: powered by spec.power");
        assert_eq!(power["ssh"]["user"], json!("homelab"), "{name}: {power}");
        assert_eq!(power["ssh"]["privateKey"]["key"], json!("ssh-privatekey"), "{name}: {power}");
        match (expected.provider_id)(name) {
            Some(id) => assert_eq!(slot["spec"]["providerID"], json!(id), "{name}"),
            None => assert!(slot["spec"].get("providerID").is_none(), "{name}"),
        }
    }
    let rack = item(&slots, "rack-1");
    let power = &rack["spec"]["power"];
    // The driver choices arrive as strings under their own names.
    assert_eq!(power["onWith"], json!("redfish"), "{power}");
    assert_eq!(power["offWith"], json!("ssh"), "{power}");
    assert_eq!(power["redfish"]["credentials"]["secretName"], json!("rack-1-bmc"), "{power}");
    assert!(power.get("wakeOnLan").is_none(), "{power}");
    for mini in ["mini-1", "mini-2"] {
        let power = &item(&slots, mini)["spec"]["power"];
        let mac = power["wakeOnLan"]["mac"].as_str().expect("a MAC string");
        assert!(mac.starts_with("52:54:00:"), "{mini}: {power}");
        assert!(power.get("redfish").is_none() && power.get("onWith").is_none(), "{mini}: {power}");
    }
    assert_secret_refs_resolve(plane, expected.ns, &slots).await;

    admission.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn homelab_under_cluster_autoscaler_applies() {
    apply_homelab(Expected {
        file: "homelab-cluster-autoscaler.yaml",
        ns: "homelab-ca",
        driver: "cluster-autoscaler",
        provider_id: |_| None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn homelab_under_builtin_scaler_applies() {
    apply_homelab(Expected {
        file: "homelab-builtin.yaml",
        ns: "homelab-builtin",
        driver: "builtin",
        provider_id: |_| None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn homelab_on_k3s_applies() {
    apply_homelab(Expected {
        file: "homelab-k3s.yaml",
        ns: "homelab-k3s",
        driver: "cluster-autoscaler",
        provider_id: |slot| Some(format!("k3s://{slot}")),
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// The other examples: applied into a fresh namespace.
// ---------------------------------------------------------------------------------------------

/// A fresh namespace with the webhooks answering for it.
async fn fresh(prefix: &str) -> (&'static ControlPlane, String, Admission) {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    plane.install_crds().await.expect("install CRDs");
    let ns = plane.fresh_namespace(prefix).await.expect("namespace");
    let admission = Admission::start(plane, &ns).await.expect("webhooks");
    (plane, ns, admission)
}

/// Every Group and every slot of `ns`, by name, with no spec holding a stray boolean.
async fn read_pools(
    plane: &ControlPlane,
    ns: &str,
) -> (Vec<(String, Value)>, Vec<(String, Value)>) {
    let groups = items(&get_json(plane, "groups.infra.homecluster.dev", ns).await.unwrap());
    let slots = items(&get_json(plane, "nodes.infra.homecluster.dev", ns).await.unwrap());
    for (name, object) in groups.iter().chain(slots.iter()) {
        assert_no_stray_booleans(&format!("{name}.spec"), &object["spec"]);
    }
    (groups, slots)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_example_applies() {
    let (plane, ns, admission) = fresh("ex-pool").await;
    let _logs = plane.logs_on_failure();
    apply(plane, "pool.yaml", Some(&ns)).await.expect("kubectl apply");
    let (groups, slots) = read_pools(plane, &ns).await;
    assert_eq!(item(&groups, "workers")["spec"]["driver"], json!("builtin"));
    assert_eq!(item(&groups, "workers")["spec"]["builtin"]["maxNodes"], json!(3));
    assert_eq!(slots.len(), 3);
    for (name, slot) in &slots {
        assert_eq!(slot["spec"]["startupPodSpec"]["image"], json!("busybox:1.36"), "{name}");
    }
    admission.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_pool_and_a_manual_claim_apply() {
    let (plane, ns, admission) = fresh("ex-ca").await;
    let _logs = plane.logs_on_failure();
    apply(plane, "pool-cluster-autoscaler.yaml", Some(&ns)).await.expect("kubectl apply");
    let (groups, slots) = read_pools(plane, &ns).await;
    assert_eq!(item(&groups, "workers")["spec"]["driver"], json!("cluster-autoscaler"));
    let names: Vec<&str> = slots.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["mini-1", "mini-2", "mini-3"]);

    // manual-claim.yaml has a generated name: `kubectl create`, as docs/api.md says.
    admission.until_mutating_answers("mini-1", "workers").await.expect("mutating webhook");
    let path = example("manual-claim.yaml");
    let created = kubectl(plane, &["create", "-f", &path, "-n", &ns, "-o", "json"])
        .await
        .expect("kubectl create manual-claim.yaml");
    let claim: Value = serde_json::from_str(&created).expect("claim json");
    assert!(
        claim["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("mini-1-")),
        "{claim}"
    );
    assert_eq!(claim["spec"]["request"]["call"], json!("Manual"), "{claim}");
    assert_eq!(claim["spec"]["attempt"], json!(1), "stamped by admission: {claim}");
    assert!(claim["spec"]["requestedBy"].is_string(), "stamped by admission: {claim}");
    assert!(claim["spec"]["deadlineAt"].is_string(), "stamped by admission: {claim}");
    admission.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_by_size_example_applies() {
    let (plane, ns, admission) = fresh("ex-sizes").await;
    let _logs = plane.logs_on_failure();
    apply(plane, "pools-by-size.yaml", Some(&ns)).await.expect("kubectl apply");
    let (groups, slots) = read_pools(plane, &ns).await;
    for pool in ["minis", "bigs"] {
        let group = item(&groups, pool);
        assert_eq!(group["spec"]["driver"], json!("cluster-autoscaler"), "{pool}");
        assert_eq!(group["spec"]["nodeReadinessTaints"], json!([]), "{pool}");
    }
    let big = item(&slots, "big-1");
    assert_eq!(big["metadata"]["labels"]["group"], json!("bigs"));
    assert_eq!(big["spec"]["nodeLabels"]["homelab.demo/size"], json!("big"));
    admission.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_on_lan_example_applies() {
    let (plane, ns, admission) = fresh("ex-wol").await;
    let _logs = plane.logs_on_failure();
    apply(plane, "power-wake-on-lan.yaml", Some(&ns)).await.expect("kubectl apply");
    let (groups, slots) = read_pools(plane, &ns).await;
    assert_eq!(item(&groups, "lan")["spec"]["driver"], json!("builtin"));
    let power = &item(&slots, "nas-1")["spec"]["power"];
    assert_eq!(power["wakeOnLan"]["mac"], json!("52:54:00:ab:cd:ef"), "{power}");
    assert_eq!(power["ssh"]["privateKey"], json!({ "name": "nas-ssh", "key": "ssh-privatekey" }));
    // Its Secret is created by hand, with the command in the file's comment.
    let slot: Node = serde_json::from_value(item(&slots, "nas-1").clone()).expect("slot");
    let refs = secret_key_refs(slot.spec.power.as_ref().expect("spec.power"));
    assert_eq!(refs, [SecretKeyRef { name: "nas-ssh".into(), key: "ssh-privatekey".into() }]);
    let key_dir = tempfile::tempdir().expect("tempdir");
    let key = key_dir.path().join("id_ed25519");
    std::fs::write(&key, "a private key\n").expect("write the key file");
    let from_file = format!("--from-file=ssh-privatekey={}", key.display());
    kubectl(plane, &["-n", &ns, "create", "secret", "generic", "nas-ssh", &from_file])
        .await
        .expect("kubectl create secret");
    assert_secret_refs_resolve(plane, &ns, &slots).await;
    admission.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smart_plug_example_applies() {
    let (plane, ns, admission) = fresh("ex-plug").await;
    let _logs = plane.logs_on_failure();
    apply(plane, "power-smart-plug.yaml", Some(&ns)).await.expect("kubectl apply");
    let (groups, slots) = read_pools(plane, &ns).await;
    let energy = &item(&groups, "minis")["spec"]["energy"];
    assert_eq!(energy, &json!({ "pricePerKWh": 0.32, "currency": "EUR" }));
    let power = &item(&slots, "mini-1")["spec"]["power"];
    assert_eq!(power["watts"], json!({ "whenOn": 18, "whenOff": 0.5 }), "{power}");
    assert_eq!(power["http"]["meter"]["wattsPointer"], json!("/apower"), "{power}");
    let steps: Vec<&serde_json::Value> = power["offSequence"]
        .as_array()
        .expect("offSequence")
        .iter()
        .map(|s| &s["driver"])
        .collect();
    assert_eq!(steps, [&json!("ssh"), &json!("http")], "the OS down before the relay");
    admission.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_example_applies_and_a_slot_that_cannot_wake_from_sleep_is_refused() {
    let (plane, ns, admission) = fresh("ex-suspend").await;
    let _logs = plane.logs_on_failure();
    apply(plane, "power-suspend.yaml", Some(&ns)).await.expect("kubectl apply");
    let (groups, slots) = read_pools(plane, &ns).await;
    assert_eq!(item(&groups, "minis")["spec"]["asleepPriceMargin"], json!(0.02));
    let power = &item(&slots, "mini-2")["spec"]["power"];
    assert_eq!(power["suspend"], json!({ "watts": 2.5, "powerOffAfterMinutes": 240 }), "{power}");
    // The same slot woken by its BMC instead: a machine in S3 does not answer a BMC's power-on.
    let example = std::fs::read_to_string(repo_path("examples/power-suspend.yaml")).expect("read");
    let by_bmc = example
        .replace("    wakeOnLan:\n      mac: \"52:54:00:ab:cd:02\"\n      broadcastAddress: 192.168.1.255\n", "    ipmi:\n      host: 192.168.1.132\n      credentials: { secretName: mini-bmc }\n    offWith: ssh\n")
        .replace("name: mini-2\n  labels", "name: mini-3\n  labels")
        .replace("kubernetesNodeName: mini-2", "kubernetesNodeName: mini-3");
    assert!(by_bmc.contains("ipmi:") && by_bmc.contains("mini-3"), "the edit applied");
    let output = plane.kubectl_apply(&ns, &by_bmc).await.expect("kubectl apply");
    assert!(!output.status.success(), "a slot that cannot wake from sleep was accepted");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("a machine suspended to RAM wakes on a Wake-on-LAN packet"),
        "says why and what to do: {said}"
    );
    admission.finish().await;
}

/// Every example file is applied by a test in this file, or by the test named beside it: a new
/// example must be added here.
#[test]
fn every_example_is_applied_here() {
    // The upstream cluster-autoscaler chart's recipe: its values are read by Helm and its
    // flags parsed by the real cluster-autoscaler, its ConfigMap applied with kubectl
    // (tests/chart.rs, the_upstream_chart_recipe_is_what_cluster_autoscaler_and_this_chart_expect).
    // The power-outage pool is applied by tests/e2e_power_outage.rs, against a real upsd.
    let elsewhere = [
        "power-outage.yaml",
        "upstream-cluster-autoscaler-cloud-config.yaml",
        "upstream-cluster-autoscaler-values.yaml",
    ];
    let applied = [
        "homelab-builtin.yaml",
        "homelab-cluster-autoscaler.yaml",
        "homelab-k3s.yaml",
        "manual-claim.yaml",
        "pool-cluster-autoscaler.yaml",
        "pool.yaml",
        "pools-by-size.yaml",
        "power-smart-plug.yaml",
        "power-suspend.yaml",
        "power-wake-on-lan.yaml",
    ];
    let mut found: Vec<String> = std::fs::read_dir(repo_path("examples"))
        .expect("examples/")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .filter(|name| !elsewhere.contains(&name.as_str()))
        .collect();
    found.sort();
    assert_eq!(found, applied, "examples/ and this test's list differ");
}
