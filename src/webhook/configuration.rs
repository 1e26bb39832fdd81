//! The admission configurations, generated from the code into `webhooks/` (and rewritten for
//! tests to a loopback `url` with a `caBundle`). Every webhook: sideEffects None, AdmissionReview
//! v1, CREATE/UPDATE rules on the main resources only (status subresources are the
//! controllers' and pass untouched; DELETE is never intercepted, so a claim can always be
//! deleted to power a machine off), and a namespace selector that names the operator's
//! namespace alone, so kube-system (or any other namespace) is never blocked, even while the
//! operator is down. One webhook reaches further: a Kubernetes Node's creation (a kubelet
//! registering), which is cluster-scoped, so it is `Ignore` with a short timeout and only ever
//! adds to the node. The failure policy and timeout are chosen per webhook: see [`POLICIES`]
//! and docs/reliability.md.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};

use crate::api::{GROUP, VERSION};

pub const PATH_MUTATE_CLAIM: &str = "/mutate/nodeclaims";
pub const PATH_VALIDATE_CLAIM: &str = "/validate/nodeclaims";
pub const PATH_VALIDATE_SLOT: &str = "/validate/nodes";
pub const PATH_VALIDATE_GROUP: &str = "/validate/groups";
/// Kubernetes Nodes (the core kind), not slots.
pub const PATH_MUTATE_KUBERNETES_NODE: &str = "/mutate/kubernetes-nodes";
/// The name of both configurations.
pub const CONFIGURATION_NAME: &str = "homelab-autoscaler";
/// The Service and cert-manager Certificate the chart creates for the webhook server.
pub const SERVICE_NAME: &str = "homelab-autoscaler-webhook";

/// What kube-apiserver does with one webhook's requests when the operator cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WebhookPolicy {
    pub webhook: &'static str,
    /// `Fail`: the write is refused while the webhook is unreachable; `Ignore`: admitted unjudged.
    pub failure_policy: &'static str,
    /// How long kube-apiserver waits for an answer before applying the failure policy.
    pub timeout_seconds: i32,
}

pub const STAMP_CLAIMS: &str = "stamp.nodeclaims.infra.homecluster.dev";
pub const VALIDATE_CLAIMS: &str = "nodeclaims.infra.homecluster.dev";
pub const VALIDATE_SLOTS: &str = "nodes.infra.homecluster.dev";
pub const VALIDATE_GROUPS: &str = "groups.infra.homecluster.dev";
pub const DECLARE_KUBERNETES_NODES: &str = "registration.kubernetes-nodes.infra.homecluster.dev";

/// The failure policy and timeout of each webhook, and why.
///
/// - Claims (stamp and validation): `Fail`, 5 s. An unstamped claim has no deadline or attempt,
///   and a second live claim on a slot would boot a machine twice: neither may be admitted
///   unjudged. Nothing is lost while the operator is down, as nothing would move the claim
///   anyway; cluster-autoscaler's IncreaseSize is served by the same process, so a claim
///   creation waits on the webhook only inside a call whose caller retries, hence the short
///   timeout.
/// - Slots: `Fail`, 10 s. The rules (no `powerState`, a pool that exists, no providerID change
///   under a live claim, a well-formed reset) protect a machine's power; slots are edited by
///   people, who can retry, and the rules read the slot's group and claims, so the timeout
///   leaves room for a slow apiserver.
/// - Groups: `Fail`, 10 s. A driver switch under live claims would hand a pool's boots to a
///   second scaler; edited by people, as slots.
/// - Kubernetes Nodes (create only): `Ignore`, 2 s. Nodes are cluster-scoped, so every kubelet's
///   registration in the cluster passes here, and none may wait on the operator: unanswered, a
///   node registers as the kubelet sent it, and the slot controller's first write brings its
///   declaration as it would without this webhook.
pub const POLICIES: [WebhookPolicy; 5] = [
    WebhookPolicy { webhook: STAMP_CLAIMS, failure_policy: "Fail", timeout_seconds: 5 },
    WebhookPolicy { webhook: VALIDATE_CLAIMS, failure_policy: "Fail", timeout_seconds: 5 },
    WebhookPolicy { webhook: VALIDATE_SLOTS, failure_policy: "Fail", timeout_seconds: 10 },
    WebhookPolicy { webhook: VALIDATE_GROUPS, failure_policy: "Fail", timeout_seconds: 10 },
    WebhookPolicy {
        webhook: DECLARE_KUBERNETES_NODES,
        failure_policy: "Ignore",
        timeout_seconds: 2,
    },
];

fn policy(webhook: &str) -> WebhookPolicy {
    POLICIES.iter().copied().find(|p| p.webhook == webhook).unwrap_or(WebhookPolicy {
        webhook: "",
        failure_policy: "Fail",
        timeout_seconds: 5,
    })
}

/// Where the API server reaches the webhook server.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// In cluster, through a Service (the chart).
    Service { namespace: String, name: String, port: i32 },
    /// A URL base such as `https://127.0.0.1:8443` (tests, out-of-cluster development).
    Url(String),
}

fn client_config(endpoint: &Endpoint, path: &str, ca_bundle: Option<&[u8]>) -> WebhookClientConfig {
    let ca_bundle = ca_bundle.map(|ca| ByteString(ca.to_vec()));
    match endpoint {
        Endpoint::Service { namespace, name, port } => WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.into()),
                port: Some(*port),
            }),
            ca_bundle,
            url: None,
        },
        Endpoint::Url(base) => WebhookClientConfig {
            url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            ca_bundle,
            service: None,
        },
    }
}

fn rule(resource: &str, operations: &[&str]) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![GROUP.into()]),
        api_versions: Some(vec![VERSION.into()]),
        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
        resources: Some(vec![resource.into()]),
        scope: Some("Namespaced".into()),
    }]
}

/// Creates of the core Node kind: a kubelet registering.
fn kubernetes_node_creates() -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec!["CREATE".into()]),
        resources: Some(vec!["nodes".into()]),
        scope: Some("Cluster".into()),
    }]
}

fn only_namespace(namespace: &str) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![namespace.into()]),
        }]),
        match_labels: None,
    }
}

fn metadata(cert_manager_ca_from: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(CONFIGURATION_NAME.into()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".into(),
            "homelab-autoscaler".into(),
        )])),
        annotations: cert_manager_ca_from
            .map(|from| BTreeMap::from([("cert-manager.io/inject-ca-from".into(), from.into())])),
        ..ObjectMeta::default()
    }
}

/// The mutating configuration: stamps new NodeClaims, and gives a registering Kubernetes Node
/// what its slot declares.
pub fn mutating(
    endpoint: &Endpoint,
    namespace: &str,
    ca_bundle: Option<&[u8]>,
    cert_manager_ca_from: Option<&str>,
) -> MutatingWebhookConfiguration {
    // The settings every mutating webhook shares; name, rules and scope are each one's own.
    let webhook =
        |name: &str, path: &str, rules, namespace_selector, reinvocation: &str| MutatingWebhook {
            name: name.into(),
            client_config: client_config(endpoint, path, ca_bundle),
            rules: Some(rules),
            namespace_selector,
            failure_policy: Some(policy(name).failure_policy.into()),
            side_effects: "None".into(),
            timeout_seconds: Some(policy(name).timeout_seconds),
            admission_review_versions: vec!["v1".into()],
            match_policy: Some("Equivalent".into()),
            reinvocation_policy: Some(reinvocation.into()),
            ..MutatingWebhook::default()
        };
    MutatingWebhookConfiguration {
        metadata: metadata(cert_manager_ca_from),
        webhooks: Some(vec![
            webhook(
                STAMP_CLAIMS,
                PATH_MUTATE_CLAIM,
                rule("nodeclaims", &["CREATE"]),
                Some(only_namespace(namespace)),
                "IfNeeded",
            ),
            // A namespace selector does not filter a cluster-scoped kind: none is set.
            webhook(
                DECLARE_KUBERNETES_NODES,
                PATH_MUTATE_KUBERNETES_NODE,
                kubernetes_node_creates(),
                None,
                "Never",
            ),
        ]),
    }
}

/// The validating configuration: claims, slots and groups.
pub fn validating(
    endpoint: &Endpoint,
    namespace: &str,
    ca_bundle: Option<&[u8]>,
    cert_manager_ca_from: Option<&str>,
) -> ValidatingWebhookConfiguration {
    let webhook = |name: &str, path: &str, resource: &str| ValidatingWebhook {
        name: name.into(),
        client_config: client_config(endpoint, path, ca_bundle),
        rules: Some(rule(resource, &["CREATE", "UPDATE"])),
        namespace_selector: Some(only_namespace(namespace)),
        failure_policy: Some(policy(name).failure_policy.into()),
        side_effects: "None".into(),
        timeout_seconds: Some(policy(name).timeout_seconds),
        admission_review_versions: vec!["v1".into()],
        match_policy: Some("Equivalent".into()),
        ..ValidatingWebhook::default()
    };
    ValidatingWebhookConfiguration {
        metadata: metadata(cert_manager_ca_from),
        webhooks: Some(vec![
            webhook(VALIDATE_CLAIMS, PATH_VALIDATE_CLAIM, "nodeclaims"),
            webhook(VALIDATE_SLOTS, PATH_VALIDATE_SLOT, "nodes"),
            webhook(VALIDATE_GROUPS, PATH_VALIDATE_GROUP, "groups"),
        ]),
    }
}

/// The configurations as the chart installs them by default: through the webhook Service, with
/// cert-manager injecting the CA.
pub fn in_cluster(
    namespace: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let endpoint =
        Endpoint::Service { namespace: namespace.into(), name: SERVICE_NAME.into(), port: 443 };
    let ca_from = format!("{namespace}/{SERVICE_NAME}");
    (
        mutating(&endpoint, namespace, None, Some(&ca_from)),
        validating(&endpoint, namespace, None, Some(&ca_from)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selectors_and_policies() -> Vec<(String, LabelSelector, String, i32, Vec<RuleWithOperations>)>
    {
        let (mutating, validating) = in_cluster("homelab-autoscaler-system");
        let mut all = Vec::new();
        for w in mutating.webhooks.unwrap_or_default() {
            all.push((
                w.name,
                w.namespace_selector.unwrap_or_default(),
                w.failure_policy.unwrap_or_default(),
                w.timeout_seconds.unwrap_or_default(),
                w.rules.unwrap_or_default(),
            ));
        }
        for w in validating.webhooks.unwrap_or_default() {
            all.push((
                w.name,
                w.namespace_selector.unwrap_or_default(),
                w.failure_policy.unwrap_or_default(),
                w.timeout_seconds.unwrap_or_default(),
                w.rules.unwrap_or_default(),
            ));
        }
        all
    }

    #[test]
    fn every_webhook_has_its_chosen_policy_and_only_registrations_reach_beyond_the_namespace() {
        let all = selectors_and_policies();
        assert_eq!(all.len(), POLICIES.len(), "one policy per webhook");
        for (name, selector, failure, timeout, rules) in all {
            let chosen = POLICIES.iter().find(|p| p.webhook == name).expect("a chosen policy");
            assert_eq!(
                (failure.as_str(), timeout),
                (chosen.failure_policy, chosen.timeout_seconds)
            );
            assert!((1..=30).contains(&timeout), "{name}: the apiserver allows 1..=30 s");
            if name == DECLARE_KUBERNETES_NODES {
                // Every registration in the cluster passes here: never waits on the operator.
                assert_eq!(failure, "Ignore");
                assert!(timeout <= 2, "a registration waits at most {timeout} s");
                let [rule] = rules.as_slice() else { panic!("one rule: {rules:?}") };
                assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
                assert_eq!(rule.resources.as_deref(), Some(&["nodes".to_string()][..]));
                assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_string()][..]));
                continue;
            }
            // Only the operator's namespace is selected: kube-system never waits on us.
            let requirements = selector.match_expressions.unwrap_or_default();
            assert_eq!(requirements.len(), 1, "{name}");
            let only = &requirements[0];
            assert_eq!(
                (only.key.as_str(), only.operator.as_str()),
                ("kubernetes.io/metadata.name", "In")
            );
            assert_eq!(
                only.values.as_deref(),
                Some(&["homelab-autoscaler-system".to_string()][..])
            );
            // Only our kinds, never DELETE: a claim can always be deleted to power a machine off.
            for rule in rules {
                assert_eq!(rule.api_groups.as_deref(), Some(&[GROUP.to_string()][..]), "{name}");
                let operations = rule.operations.unwrap_or_default();
                assert!(!operations.iter().any(|o| o == "DELETE" || o == "*"), "{name}");
                let resources = rule.resources.unwrap_or_default();
                assert!(resources.iter().all(|r| !r.contains('/') && r != "*"), "{name}");
            }
        }
    }
}
