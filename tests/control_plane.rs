//! The product's API and the test control plane, end to end: the CRDs from crds/ are served and
//! enforce their schema, Jobs run to completion on kwok machines, kubectl sees the kinds, and
//! admission webhooks are called. Every wait has a deadline; none is a fixed sleep.

use std::collections::BTreeMap;
use std::time::Duration;

use homelab_autoscaler::api::{
    ClaimCall, Group, GroupSpec, Node, NodeClaim, NodeClaimSpec, NodeSpec, ScalingDriver,
};
use homelab_harness::{Components, ControlPlane, eventually, is_ready};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Taint};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// How long a test waits for the cluster to act (a Job to complete, say).
const ACT_TIMEOUT: Duration = Duration::from_secs(90);

/// The API's objects a test creates in its namespace: a pool, one slot, one claim for it.
struct Sample {
    group: Group,
    slot: Node,
    claim: NodeClaim,
}

fn sample() -> Sample {
    // Specs come from JSON, as a user writes them, so unset fields take the types' defaults.
    let group_spec: GroupSpec =
        serde_json::from_value(json!({ "driver": "builtin", "minSize": 1 })).expect("group spec");
    let slot_spec: NodeSpec = serde_json::from_value(json!({
        "kubernetesNodeName": "machine-1",
        "startupPodSpec": { "image": "registry.invalid/wake:1" },
        "shutdownPodSpec": { "image": "registry.invalid/sleep:1" },
    }))
    .expect("slot spec");
    let claim_spec: NodeClaimSpec = serde_json::from_value(json!({
        "slotRef": { "name": "machine-1" },
        "request": { "call": "IncreaseSize", "delta": 1, "group": "pool" },
    }))
    .expect("claim spec");
    let mut slot = Node::new("machine-1", slot_spec);
    slot.metadata.labels = Some(BTreeMap::from([("group".into(), "pool".into())]));
    Sample {
        group: Group::new("pool", group_spec),
        slot,
        claim: NodeClaim::new("claim-1", claim_spec),
    }
}

async fn create_sample(client: &Client, namespace: &str) -> Sample {
    let sample = sample();
    let post = PostParams::default();
    let group = Api::<Group>::namespaced(client.clone(), namespace)
        .create(&post, &sample.group)
        .await
        .expect("create Group");
    let slot = Api::<Node>::namespaced(client.clone(), namespace)
        .create(&post, &sample.slot)
        .await
        .expect("create Node (slot)");
    let claim = Api::<NodeClaim>::namespaced(client.clone(), namespace)
        .create(&post, &sample.claim)
        .await
        .expect("create NodeClaim");
    Sample { group, slot, claim }
}

/// The apiserver's refusal of `result`: its HTTP code and message. Panics if it was accepted.
fn rejection<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the apiserver to refuse the object, got {other:?}"),
    }
}

#[tokio::test]
async fn crds_serve_the_api_types_and_enforce_their_schema() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let installed = plane.install_crds().await.expect("install CRDs");
    for name in [
        "groups.infra.homecluster.dev",
        "nodes.infra.homecluster.dev",
        "nodeclaims.infra.homecluster.dev",
    ] {
        assert!(installed.iter().any(|n| n == name), "{name} not installed: {installed:?}");
    }
    let client = plane.client().expect("client");
    let ns = plane.fresh_namespace("crds").await.expect("namespace");
    let created = create_sample(&client, &ns).await;

    // Read back through the crate's types: what was written is what is served.
    let groups: Api<Group> = Api::namespaced(client.clone(), &ns);
    let slots: Api<Node> = Api::namespaced(client.clone(), &ns);
    let claims: Api<NodeClaim> = Api::namespaced(client.clone(), &ns);
    let group = groups.get("pool").await.expect("get Group");
    assert_eq!(group.spec, created.group.spec);
    assert_eq!(group.spec.driver, ScalingDriver::Builtin);
    assert_eq!(group.spec.min_size, 1);
    let slot = slots.get("machine-1").await.expect("get Node (slot)");
    assert_eq!(slot.spec, created.slot.spec);
    assert_eq!(slot.labels().get("group").map(String::as_str), Some("pool"));
    let claim = claims.get("claim-1").await.expect("get NodeClaim");
    assert_eq!(claim.spec, created.claim.spec);
    assert_eq!(claim.spec.request.call, ClaimCall::IncreaseSize);
    assert_eq!(claim.spec.request.delta, Some(1));

    let post = PostParams::default();

    // The removed spec.powerState stays in the schema, with any value (v1alpha1 manifests wrote
    // a bare `on`, a YAML boolean), so the apiserver neither prunes it nor rejects its type: it
    // reaches the validating webhook, which refuses it with an explanation
    // (tests/webhooks_power_state.rs).
    // With no webhook registered here, it is stored as written.
    let mut powered = sample().slot;
    powered.metadata.name = Some("machine-2".into());
    powered.spec.kubernetes_node_name = "machine-2".into();
    powered.spec.power_state = Some(json!(true));
    let stored = slots.create(&post, &powered).await.expect("stored without a webhook");
    assert_eq!(stored.spec.power_state, Some(json!(true)), "not pruned, not retyped");
    slots.delete("machine-2", &DeleteParams::default()).await.expect("delete machine-2");

    // A slot must be named after its Kubernetes node.
    let mut misnamed = sample().slot;
    misnamed.metadata.name = Some("machine-3".into());
    let (code, message) = rejection(slots.create(&post, &misnamed).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("metadata.name must equal spec.kubernetesNodeName"), "{message}");

    // An IncreaseSize claim without a positive delta is refused.
    let mut zero = sample().claim;
    zero.metadata.name = Some("claim-zero".into());
    zero.spec.request.delta = Some(0);
    let (code, message) = rejection(claims.create(&post, &zero).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("an IncreaseSize request carries a positive delta"), "{message}");

    // The claim's request is immutable once created.
    let mut changed = claim.clone();
    changed.spec.request.group = "another-pool".into();
    let (code, message) = rejection(claims.replace("claim-1", &post, &changed).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.request is immutable"), "{message}");
}

#[tokio::test]
async fn a_job_completes_on_a_kwok_machine_and_bootstrap_taints_stay() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");

    let pool = BTreeMap::from([("homelab-test/pool".to_owned(), "jobs".to_owned())]);
    let worker = plane.add_machine("kwok-worker-1", vec![], pool.clone()).await.expect("machine");
    assert!(is_ready(&worker));

    // A machine still booting carries the readiness taint; kwok makes it Ready but must leave
    // the taint for the product's readiness gate to see.
    let bootstrap = Taint {
        key: "node.cilium.io/agent-not-ready".into(),
        effect: "NoExecute".into(),
        value: Some("true".into()),
        time_added: None,
    };
    let booting = plane
        .add_machine("kwok-booting-1", vec![bootstrap.clone()], pool.clone())
        .await
        .expect("tainted machine");
    let taints = booting.spec.and_then(|spec| spec.taints).unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == bootstrap.key && t.effect == bootstrap.effect),
        "the bootstrap taint was removed from a Ready kwok node: {taints:?}"
    );

    let ns = plane.fresh_namespace("job").await.expect("namespace");
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": { "name": "power-on" },
        "spec": {
            "backoffLimit": 0,
            "template": { "spec": {
                "restartPolicy": "Never",
                "nodeSelector": pool,
                "containers": [{ "name": "wake", "image": "registry.invalid/wake:1" }],
            }},
        },
    }))
    .expect("job");
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    jobs.create(&PostParams::default(), &job).await.expect("create Job");
    tokio::time::timeout(
        ACT_TIMEOUT,
        await_condition(jobs.clone(), "power-on", conditions::is_job_completed()),
    )
    .await
    .expect("the Job did not complete in time")
    .expect("watching the Job");

    // It ran where the scheduler put it: on the untainted machine.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = pods.list(&ListParams::default().labels("job-name=power-on")).await.expect("pods");
    let nodes: Vec<_> =
        listed.items.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
    assert_eq!(nodes, ["kwok-worker-1"], "the Job's pod ran elsewhere");

    plane.remove_machine("kwok-booting-1").await.expect("remove tainted machine");
    plane.remove_machine("kwok-worker-1").await.expect("remove machine");
    let left = Api::<k8s_openapi::api::core::v1::Node>::all(client)
        .list(&ListParams::default().labels("homelab-test/pool=jobs"))
        .await
        .expect("list nodes");
    assert!(left.items.is_empty(), "machines left: {:?}", left.items.iter().map(|n| n.name_any()));
}

#[tokio::test]
async fn kubectl_lists_the_homelab_kinds() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("install CRDs");
    let client = plane.client().expect("client");
    let ns = plane.fresh_namespace("kubectl").await.expect("namespace");
    create_sample(&client, &ns).await;

    let claims = plane.kubectl(["get", "nodeclaims", "-n", &ns]).await.expect("kubectl");
    let stdout = String::from_utf8_lossy(&claims.stdout);
    assert!(claims.status.success(), "kubectl get nodeclaims failed: {claims:?}");
    assert!(stdout.contains("claim-1"), "kubectl get nodeclaims:\n{stdout}");
    assert!(stdout.contains("IncreaseSize"), "the Call column is missing:\n{stdout}");

    let all = plane.kubectl(["get", "homelab", "-n", &ns, "-o", "name"]).await.expect("kubectl");
    let stdout = String::from_utf8_lossy(&all.stdout);
    assert!(all.status.success(), "kubectl get homelab failed: {all:?}");
    let mut listed: Vec<&str> = stdout.lines().collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        [
            "group.infra.homecluster.dev/pool",
            "node.infra.homecluster.dev/machine-1",
            "nodeclaim.infra.homecluster.dev/claim-1",
        ]
    );
}

#[tokio::test]
async fn admission_webhooks_are_called_at_the_registered_url() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let ns = plane.fresh_namespace("webhook").await.expect("namespace");

    // Nothing listens on this port, so a called webhook fails, and failurePolicy Fail turns
    // that into a refusal that names the URL the apiserver called.
    let port = homelab_harness::ports::free_port().expect("free port");
    let configuration = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: deny-configmaps-{ns}
webhooks:
- name: deny.homelab.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig:
    service: {{ name: homelab-autoscaler-webhook, namespace: somewhere, path: /validate-configmap }}
  namespaceSelector:
    matchLabels: {{ kubernetes.io/metadata.name: {ns} }}
  rules:
  - {{ apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps] }}
"#
    );
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), &configuration).expect("write the configuration");
    let configurations = plane.webhook_configurations(file.path()).await.expect("read");
    assert_eq!(configurations.len(), 1);
    let base = format!("https://127.0.0.1:{port}");
    plane.register_webhooks(configurations, &base, &plane.ca_pem()).await.expect("register");

    let registered = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(&format!("deny-configmaps-{ns}"))
        .await
        .expect("get configuration");
    let client_config = &registered.webhooks.as_ref().expect("webhooks")[0].client_config;
    assert_eq!(client_config.url.as_deref(), Some(format!("{base}/validate-configmap").as_str()));
    assert!(client_config.service.is_none());
    assert!(client_config.ca_bundle.is_some());

    // The apiserver picks a new configuration up from its informer, a moment after the write:
    // probe with fresh ConfigMaps until one is refused.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut attempt = 0;
    let message = eventually("the webhook to be called", ACT_TIMEOUT, || {
        attempt += 1;
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("probe-{attempt}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let config_maps = config_maps.clone();
        async move {
            match config_maps.create(&PostParams::default(), &config_map).await {
                Ok(_) => anyhow::bail!("ConfigMap created: the webhook is not active yet"),
                Err(kube::Error::Api(status)) => Ok(status.message.clone()),
                Err(other) => Err(other.into()),
            }
        }
    })
    .await
    .expect("the webhook was never called");
    assert!(message.contains("failed calling webhook \"deny.homelab.test\""), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}/validate-configmap")), "{message}");

    Api::<ValidatingWebhookConfiguration>::all(client)
        .delete(&format!("deny-configmaps-{ns}"), &DeleteParams::default())
        .await
        .expect("delete configuration");
}

#[tokio::test]
async fn generated_webhook_configurations_register_with_the_test_url() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("webhooks/admission.yaml");
    let configurations = plane.webhook_configurations(&path).await.expect("kubectl reads it");
    assert_eq!(configurations.len(), 2, "one mutating and one validating configuration");

    // The real apiserver validates them; their namespaceSelector keeps them away from the
    // other tests' namespaces while they are registered, and the one on Nodes fails open.
    let base = "https://127.0.0.1:9443";
    plane.register_webhooks(configurations, base, &plane.ca_pem()).await.expect("register");
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let mut urls: Vec<String> = Vec::new();
    for webhook in
        mutating.get("homelab-autoscaler").await.expect("mutating").webhooks.unwrap_or_default()
    {
        urls.extend(webhook.client_config.url);
    }
    for webhook in
        validating.get("homelab-autoscaler").await.expect("validating").webhooks.unwrap_or_default()
    {
        urls.extend(webhook.client_config.url);
    }
    urls.sort();
    assert_eq!(
        urls,
        [
            "https://127.0.0.1:9443/mutate/kubernetes-nodes",
            "https://127.0.0.1:9443/mutate/nodeclaims",
            "https://127.0.0.1:9443/validate/groups",
            "https://127.0.0.1:9443/validate/nodeclaims",
            "https://127.0.0.1:9443/validate/nodes",
        ]
    );
    mutating.delete("homelab-autoscaler", &DeleteParams::default()).await.expect("delete");
    validating.delete("homelab-autoscaler", &DeleteParams::default()).await.expect("delete");
}
