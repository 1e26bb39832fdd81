//! Property-based fuzzing (proptest, stable Rust) of admission: AdmissionReview decoding
//! through the real router, and every validation rule on objects mutated from valid ones.
//!
//! Properties: nothing panics; every answer is one of the documented HTTP statuses; a review
//! is answered as a review carrying its request's uid; a denial has a 403/422/503 code and a
//! message; the stamp patch applies to the claim it was computed for and a stamped claim
//! stamps to nothing new (the mutation is idempotent).
//!
//! Cases: `HOMELAB_FUZZ_CASES` (default 256 per property in CI). The long run, with its
//! numbers, is in docs/reliability.md.

mod fuzz_support;

use std::sync::Arc;

use axum::body::Body;
use fuzz_support::{cases, interesting_value, mutated};
use homelab_autoscaler::api::{Group, Node, NodeClaim};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::webhook::claim_rules::{self, ClaimFacts};
use homelab_autoscaler::webhook::group_rules::{self, GroupFacts};
use homelab_autoscaler::webhook::slot_rules::{self, SlotFacts};
use homelab_autoscaler::webhook::verdict::Verdict;
use homelab_autoscaler::webhook::{self, SystemClock, WebhookState};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tower::ServiceExt as _;

const NS: &str = "homelab-autoscaler-system";

fn base_claim() -> Value {
    json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": { "name": "c1", "namespace": NS, "uid": "u-1" },
        "spec": {
            "slotRef": { "name": "mini-1" },
            "request": { "call": "IncreaseSize", "delta": 1, "group": "pool" },
            "requestedAt": "2026-12-01T00:00:00Z", "requestedBy": "admin", "attempt": 1,
            "deadlineAt": "2026-12-01T00:12:10Z", "ttlSecondsAfterFinished": 600,
        },
        "status": { "phase": "booting", "attempt": 1 },
    })
}

fn base_slot() -> Value {
    let pod = json!({ "image": "registry.invalid/power:1", "command": ["wake"] });
    json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": "mini-1", "namespace": NS, "labels": { "group": "pool" },
                      "annotations": { "infra.homecluster.dev/attempts-reset-at": "2026-12-01T00:00:00Z" } },
        "spec": { "kubernetesNodeName": "mini-1", "providerID": "homelab://mini-1",
                  "startupPodSpec": pod, "shutdownPodSpec": pod,
                  "nodeCapacity": { "cpu": "4", "memory": "16Gi" } },
    })
}

fn base_group() -> Value {
    json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "pool", "namespace": NS },
        "spec": {
            "driver": "builtin", "minSize": 0, "maxNodeProvisionTime": "10m",
            "nodeReadinessTaints": [{ "key": "x/not-ready", "effect": "NoSchedule" }],
            "scaleDown": { "utilizationThreshold": 0.5, "unneededTime": "10m", "unreadyTime": "20m" },
            "builtin": { "hold": "2m", "podsPerNode": 4, "maxNodes": 3 },
        },
    })
}

const CLAIM_PATHS: &[&str] = &[
    "metadata:name",
    "metadata:labels",
    "metadata:annotations",
    "metadata:deletionTimestamp",
    "spec:slotRef:name",
    "spec:slotRef",
    "spec:request:call",
    "spec:request:delta",
    "spec:request:group",
    "spec:request",
    "spec:requestedAt",
    "spec:requestedBy",
    "spec:until",
    "spec:attempt",
    "spec:deadlineAt",
    "spec:maxNodeProvisionTime",
    "spec:ttlSecondsAfterFinished",
    "status:phase",
    "status:attempt",
    "status:reason",
    "status:readyAt",
    "status",
];
const SLOT_PATHS: &[&str] = &[
    "metadata:name",
    "metadata:labels:group",
    "metadata:labels",
    "metadata:annotations:infra.homecluster.dev/attempts-reset-at",
    "spec:kubernetesNodeName",
    "spec:providerID",
    "spec:powerState",
    "spec:startupPodSpec:image",
    "spec:startupPodSpec:command",
    "spec:shutdownPodSpec",
    "spec:nodeCapacity:cpu",
    "spec:nodeCapacity",
    "spec:nodeTaints",
    "spec:pricing",
    "spec:startupPodSpec:volumes",
    "spec:startupPodSpec:activeDeadlineSeconds",
    "spec:startupPodSpec:backoffLimit",
];
const GROUP_PATHS: &[&str] = &[
    "spec:driver",
    "spec:minSize",
    "spec:maxNodeProvisionTime",
    "spec:nodeReadinessTaints",
    "spec:scaleDown:utilizationThreshold",
    "spec:scaleDown:gpuUtilizationThreshold",
    "spec:scaleDown:unneededTime",
    "spec:scaleDown:unreadyTime",
    "spec:builtin:hold",
    "spec:builtin:podsPerNode",
    "spec:builtin:maxNodes",
    "spec:pricing",
    "spec:scaleDown",
];

fn now() -> jiff::Timestamp {
    "2026-12-01T00:01:00Z".parse().expect("timestamp")
}

/// A denial says why, with a code a person and kube-apiserver understand.
fn check_verdict(verdict: &Verdict) -> Result<(), TestCaseError> {
    if let Verdict::Deny(denial) = verdict {
        prop_assert!([403, 422, 503].contains(&denial.code), "code {}", denial.code);
        prop_assert!(!denial.message.trim().is_empty(), "a denial without a message");
    }
    Ok(())
}

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: cases(256), failure_persistence: None, ..Config::default() })
}

#[test]
fn claim_rules_hold_on_mutated_claims() {
    let strategy = (
        mutated(base_claim(), CLAIM_PATHS),
        mutated(base_claim(), CLAIM_PATHS),
        mutated(base_slot(), SLOT_PATHS),
        mutated(base_group(), GROUP_PATHS),
        any::<bool>(),
    );
    runner()
        .run(&strategy, |(new, old, slot, group, is_operator)| {
            let Ok(claim) = serde_json::from_value::<NodeClaim>(new.clone()) else {
                return Ok(());
            };
            let slot = serde_json::from_value::<Node>(slot).ok();
            let group = serde_json::from_value::<Group>(group).ok();
            let others: Vec<NodeClaim> =
                serde_json::from_value::<NodeClaim>(old.clone()).into_iter().collect();
            let facts = ClaimFacts {
                namespace: NS,
                slot: slot.as_ref(),
                group: group.as_ref(),
                other_claims_of_slot: &others,
                now: now(),
                timeouts: Timeouts::default(),
            };
            check_verdict(&claim_rules::validate_create(&claim, &facts))?;
            if let Some(old) = others.first() {
                check_verdict(&claim_rules::validate_update(old, &claim, is_operator, now()))?;
            }
            // The stamp patch applies, and the stamped claim stamps to nothing new.
            let stamp = claim_rules::stamp(&claim, "fuzzer", &facts);
            let patch = claim_rules::stamp_patch(&claim, &stamp);
            let mut patched = serde_json::to_value(&claim).expect("serialise");
            json_patch::patch(&mut patched, &patch)
                .map_err(|e| TestCaseError::fail(format!("the stamp patch does not apply: {e}")))?;
            let stamped: NodeClaim = serde_json::from_value(patched)
                .map_err(|e| TestCaseError::fail(format!("the stamped claim is invalid: {e}")))?;
            let again = claim_rules::stamp(&stamped, "fuzzer", &facts);
            prop_assert!(
                claim_rules::stamp_patch(&stamped, &again).is_empty(),
                "stamping is not idempotent: {:?}",
                claim_rules::stamp_patch(&stamped, &again)
            );
            Ok(())
        })
        .expect("claim rules");
}

#[test]
fn slot_rules_hold_on_mutated_slots() {
    let strategy = (
        mutated(base_slot(), SLOT_PATHS),
        mutated(base_slot(), SLOT_PATHS),
        mutated(base_claim(), CLAIM_PATHS),
        any::<bool>(),
    );
    runner()
        .run(&strategy, |(new, old, claim, group_exists)| {
            let Ok(slot) = serde_json::from_value::<Node>(new) else { return Ok(()) };
            let old = serde_json::from_value::<Node>(old).ok();
            let claims: Vec<NodeClaim> = serde_json::from_value(claim).into_iter().collect();
            let facts = SlotFacts { namespace: NS, group_exists, claims_of_slot: &claims };
            check_verdict(&slot_rules::validate(&slot, None, &facts))?;
            check_verdict(&slot_rules::validate(&slot, old.as_ref(), &facts))?;
            Ok(())
        })
        .expect("slot rules");
}

#[test]
fn group_rules_hold_on_mutated_groups() {
    let strategy = (
        mutated(base_group(), GROUP_PATHS),
        mutated(base_group(), GROUP_PATHS),
        0usize..10,
        0usize..10,
    );
    runner()
        .run(&strategy, |(new, old, slots, live_claims)| {
            let Ok(group) = serde_json::from_value::<Group>(new) else { return Ok(()) };
            let old = serde_json::from_value::<Group>(old).ok();
            let facts = GroupFacts { slots, live_claims, now: jiff::Timestamp::UNIX_EPOCH };
            check_verdict(&group_rules::validate(&group, None, &facts))?;
            check_verdict(&group_rules::validate(&group, old.as_ref(), &facts))?;
            Ok(())
        })
        .expect("group rules");
}

/// The router of the real server over a client whose API server refuses connections: the
/// rules that need the cluster answer 503 at once, which is all decoding needs.
fn router() -> axum::Router {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a url"));
    let client = kube::Client::try_from(config).expect("a client");
    let state = Arc::new(WebhookState {
        caches: homelab_autoscaler::cache::Stores::start(&client, NS),
        client,
        namespace: NS.into(),
        operator_usernames: vec!["admin".into()],
        clock: Box::new(SystemClock),
        timeouts: Timeouts::default(),
    });
    webhook::router(state)
}

fn review(object: Value, old: Value, operation: &str, kind: &str, resource: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0c0ffee0-0000-4000-8000-00000000f022",
            "kind": { "group": "infra.homecluster.dev", "version": "v2alpha1", "kind": kind },
            "resource": { "group": "infra.homecluster.dev", "version": "v2alpha1", "resource": resource },
            "name": "x", "namespace": NS, "operation": operation,
            "userInfo": { "username": "admin" },
            "object": object, "oldObject": old,
        },
    })
}

/// A request body: raw bytes, a JSON value of any shape, or a review of a mutated object
/// whose envelope is mutated too.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let reviews = (
        prop_oneof![
            (mutated(base_claim(), CLAIM_PATHS), mutated(base_claim(), CLAIM_PATHS))
                .prop_map(|(o, p)| (o, p, "NodeClaim", "nodeclaims")),
            (mutated(base_slot(), SLOT_PATHS), mutated(base_slot(), SLOT_PATHS))
                .prop_map(|(o, p)| (o, p, "Node", "nodes")),
            (mutated(base_group(), GROUP_PATHS), mutated(base_group(), GROUP_PATHS))
                .prop_map(|(o, p)| (o, p, "Group", "groups")),
        ],
        prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE"), Just("CONNECT"), Just("??")],
    )
        .prop_map(|((object, old, kind, resource), operation)| {
            review(object, old, operation, kind, resource)
        });
    let envelope = mutated(
        review(base_claim(), base_claim(), "CREATE", "NodeClaim", "nodeclaims"),
        &[
            "apiVersion",
            "kind",
            "request",
            "request:uid",
            "request:kind",
            "request:operation",
            "request:userInfo",
            "request:userInfo:username",
            "request:object",
            "request:oldObject",
            "request:namespace",
            "response",
        ],
    );
    prop_oneof![
        3 => reviews.prop_map(|v| v.to_string().into_bytes()),
        2 => envelope.prop_map(|v| v.to_string().into_bytes()),
        1 => interesting_value().prop_map(|v| v.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..256),
    ]
}

#[test]
fn admission_reviews_of_any_shape_get_an_answer() {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let _guard = runtime.enter();
    homelab_autoscaler::tls::install_crypto_provider();
    let router = router();
    let paths = prop_oneof![
        Just("/mutate/nodeclaims"),
        Just("/validate/nodeclaims"),
        Just("/validate/nodes"),
        Just("/validate/groups"),
        Just("/mutate/kubernetes-nodes"),
    ];
    runner()
        .run(&(paths, body()), |(path, body)| {
            let request = http::Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))
                .expect("request");
            let response = runtime
                .block_on(router.clone().oneshot(request))
                .map_err(|e| TestCaseError::fail(format!("the router failed: {e}")))?;
            let status = response.status().as_u16();
            prop_assert!([200, 400, 422].contains(&status), "status {status}");
            let bytes = runtime
                .block_on(axum::body::to_bytes(response.into_body(), 1 << 24))
                .map_err(|e| TestCaseError::fail(format!("reading the answer: {e}")))?;
            if status == 200 {
                let answer: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
                let sent: Option<Value> = serde_json::from_slice(&body).ok();
                // A review is answered in the sender's own type (kube-apiserver sends
                // AdmissionReview; a sender that names another kind gets its kind echoed).
                let sent_kind = sent.as_ref().map(|v| v["kind"].clone()).unwrap_or_default();
                prop_assert!(
                    answer["kind"] == "AdmissionReview" || answer["kind"] == sent_kind,
                    "kind {} for a review of kind {}",
                    answer["kind"],
                    sent_kind
                );
                if let Some(uid) = sent.as_ref().and_then(|v| v["request"]["uid"].as_str())
                    && !uid.is_empty()
                    && answer["response"]["allowed"] == true
                {
                    prop_assert_eq!(answer["response"]["uid"].as_str(), Some(uid));
                }
                if answer["response"]["allowed"] == false {
                    let code = answer["response"]["status"]["code"].as_u64().unwrap_or(0);
                    prop_assert!([400, 403, 422, 503].contains(&code), "code {code}: {answer}");
                }
            }
            Ok(())
        })
        .expect("admission decoding");
}

/// Regressions found by this suite, kept as plain tests.
mod regressions {
    use super::*;

    /// A review without a request was refused with status code 0 (kube-rs's default).
    #[tokio::test]
    async fn a_review_without_a_request_is_refused_with_code_400() {
        homelab_autoscaler::tls::install_crypto_provider();
        let body = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        let request = http::Request::post("/mutate/nodeclaims")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let response = router().oneshot(request).await.expect("answer");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        let answer: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["status"]["code"], 400, "{answer}");
    }

    /// A Group whose duration overflows made kube-core's parser panic inside the handler (the
    /// connection dropped); it is now a schema denial with a reason.
    #[tokio::test]
    async fn a_group_with_an_overflowing_duration_is_denied_not_dropped() {
        homelab_autoscaler::tls::install_crypto_provider();
        let mut group = base_group();
        group["spec"]["maxNodeProvisionTime"] = json!("5124095576030431h");
        let body = review(group, Value::Null, "CREATE", "Group", "groups").to_string();
        let request = http::Request::post("/validate/groups")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let response = router().oneshot(request).await.expect("answer");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        let answer: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["status"]["code"], 422, "{answer}");
        let message = answer["response"]["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("longest duration"), "{answer}");
    }
}
