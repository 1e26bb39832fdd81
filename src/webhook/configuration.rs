//! The admission configurations, generated from the code into `webhooks/` (and rewritten for
//! tests to a loopback `url` with a `caBundle`). Every webhook: failurePolicy Fail (a rule that
//! cannot be judged is not waived), sideEffects None, 5 s timeout, AdmissionReview v1, rules on
//! the main resources only (status subresources are the controllers' and pass untouched), and a
//! namespace selector that names the operator's namespace alone, so kube-system is never blocked.

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
/// The name of both configurations.
pub const CONFIGURATION_NAME: &str = "homelab-autoscaler";
/// The Service and cert-manager Certificate the chart creates for the webhook server.
pub const SERVICE_NAME: &str = "homelab-autoscaler-webhook";

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

/// The mutating configuration: stamps new NodeClaims.
pub fn mutating(
    endpoint: &Endpoint,
    namespace: &str,
    ca_bundle: Option<&[u8]>,
    cert_manager_ca_from: Option<&str>,
) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: metadata(cert_manager_ca_from),
        webhooks: Some(vec![MutatingWebhook {
            name: "stamp.nodeclaims.infra.homecluster.dev".into(),
            client_config: client_config(endpoint, PATH_MUTATE_CLAIM, ca_bundle),
            rules: Some(rule("nodeclaims", &["CREATE"])),
            namespace_selector: Some(only_namespace(namespace)),
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(5),
            admission_review_versions: vec!["v1".into()],
            match_policy: Some("Equivalent".into()),
            reinvocation_policy: Some("IfNeeded".into()),
            ..MutatingWebhook::default()
        }]),
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
        failure_policy: Some("Fail".into()),
        side_effects: "None".into(),
        timeout_seconds: Some(5),
        admission_review_versions: vec!["v1".into()],
        match_policy: Some("Equivalent".into()),
        ..ValidatingWebhook::default()
    };
    ValidatingWebhookConfiguration {
        metadata: metadata(cert_manager_ca_from),
        webhooks: Some(vec![
            webhook("nodeclaims.infra.homecluster.dev", PATH_VALIDATE_CLAIM, "nodeclaims"),
            webhook("nodes.infra.homecluster.dev", PATH_VALIDATE_SLOT, "nodes"),
            webhook("groups.infra.homecluster.dev", PATH_VALIDATE_GROUP, "groups"),
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
