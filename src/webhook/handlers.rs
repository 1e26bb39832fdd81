//! One handler per kind and operation: parse the review, read what the rules need, decide.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::claim_rules::{self, ClaimFacts};
use super::group_rules::{self, GroupFacts};
use super::lookup::{Lookup, LookupError};
use super::node_registration;
use super::slot_rules::{self, SlotFacts};
use super::verdict::{Denial, Verdict};
use super::{Shared, WebhookState};
use crate::api::{Group, Node, NodeClaim};
use crate::{phase, telemetry};

type Review = Json<AdmissionReview<DynamicObject>>;

/// Runs `decide` on a parsed request inside a span, and answers the review.
async fn answer<F, Fut>(
    route: &'static str,
    review: AdmissionReview<DynamicObject>,
    decide: F,
) -> Review
where
    F: FnOnce(AdmissionRequest<DynamicObject>) -> Fut,
    Fut: std::future::Future<Output = (AdmissionRequest<DynamicObject>, Verdict)>,
{
    let started = std::time::Instant::now();
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%error, route, "malformed AdmissionReview");
            telemetry::webhook_answered(
                route,
                started.elapsed(),
                Some(("MalformedReview", &["review_decodes"])),
            );
            let mut response = kube::core::admission::AdmissionResponse::invalid(format!(
                "malformed AdmissionReview: {error}"
            ));
            // Every denial carries a code (kube-rs leaves this one at 0): a bad request.
            response.result.code = 400;
            return Json(response.into_review());
        }
    };
    let span = tracing::info_span!(
        "admission",
        route,
        uid = %request.uid,
        operation = ?request.operation,
        name = %request.name,
        namespace = request.namespace.as_deref().unwrap_or(""),
        user = request.user_info.username.as_deref().unwrap_or(""),
        allowed = tracing::field::Empty,
    );
    async move {
        let (request, verdict) = decide(request).await;
        tracing::Span::current().record("allowed", verdict.is_allowed());
        let denied = match &verdict {
            Verdict::Deny(denial) => Some(denial),
            _ => None,
        };
        if let Some(denial) = denied {
            tracing::info!(code = denial.code, reason = denial.reason, message = %denial.message, "denied");
        }
        telemetry::webhook_answered(
            route,
            started.elapsed(),
            denied.map(|d| (d.reason, d.rules.as_slice())),
        );
        Json(verdict.respond(&request).into_review())
    }
    .instrument(span)
    .await
}

fn parse<T: DeserializeOwned>(object: Option<&DynamicObject>, what: &str) -> Result<T, Verdict> {
    let object = object.ok_or_else(|| {
        Verdict::Deny(Denial::invalid("schema", format!("the request carries no {what}")))
    })?;
    serde_json::to_value(object).and_then(serde_json::from_value).map_err(|e| {
        Verdict::Deny(Denial::invalid(
            "schema",
            format!("the {what} does not match the v2alpha1 schema: {e}"),
        ))
    })
}

fn unavailable(error: LookupError) -> Verdict {
    tracing::warn!(%error, "admission lookup failed");
    Verdict::Deny(Denial {
        code: 503,
        reason: "ServiceUnavailable",
        message: format!("the webhook could not read the cluster ({error}); retry"),
        rules: vec!["cluster_readable"],
    })
}

fn lookup<'a>(state: &'a WebhookState, request: &AdmissionRequest<DynamicObject>) -> Lookup<'a> {
    let namespace = request.namespace.as_deref().unwrap_or(&state.namespace);
    Lookup::new(&state.caches, &state.client, namespace)
}

pub async fn mutate_claim(State(state): State<Arc<Shared>>, Json(review): Review) -> Review {
    answer("mutate-nodeclaim", review, |request| async move {
        let verdict = async {
            if request.operation != Operation::Create {
                return Verdict::allow();
            }
            let claim: NodeClaim = match parse(request.object.as_ref(), "NodeClaim") {
                Ok(claim) => claim,
                Err(verdict) => return verdict,
            };
            let username = request.user_info.username.clone().unwrap_or_default();
            match claim_facts(&state, &request, &claim).await {
                Ok(facts) => {
                    let ns = request.namespace.clone().unwrap_or_default();
                    let facts = facts.as_facts(&state, &ns, state.clock.now());
                    let stamp = claim_rules::stamp(&claim, &username, &facts);
                    let is_operator = state.is_operator(&username);
                    Verdict::Allow {
                        warnings: claim_rules::replaced_attempt_warning(
                            &claim,
                            &stamp,
                            is_operator,
                        )
                        .into_iter()
                        .collect(),
                        patch: claim_rules::stamp_patch(&claim, &stamp),
                    }
                }
                Err(error) => unavailable(error),
            }
        }
        .await;
        (request, verdict)
    })
    .await
}

pub async fn validate_claim(State(state): State<Arc<Shared>>, Json(review): Review) -> Review {
    answer("validate-nodeclaim", review, |request| async move {
        let verdict = async {
            let claim: NodeClaim = match parse(request.object.as_ref(), "NodeClaim") {
                Ok(claim) => claim,
                Err(verdict) => return verdict,
            };
            match request.operation {
                Operation::Create => {
                    // Judged and remembered under the slot's lock: a second create of the slot
                    // waits, then sees this one (see `admitted`).
                    let _slot = state.admitted.lock_slot(&claim.spec.slot_ref.name).await;
                    let verdict = match claim_facts(&state, &request, &claim).await {
                        Ok(facts) => {
                            let ns = request.namespace.clone().unwrap_or_default();
                            claim_rules::validate_create(
                                &claim,
                                &facts.as_facts(&state, &ns, state.clock.now()),
                            )
                        }
                        Err(error) => unavailable(error),
                    };
                    if verdict.is_allowed() && !request.dry_run {
                        state.admitted.remember(&claim, &state.caches);
                    }
                    verdict
                }
                Operation::Update => {
                    match parse::<NodeClaim>(request.old_object.as_ref(), "stored NodeClaim") {
                        Ok(old) => {
                            let user = request.user_info.username.as_deref().unwrap_or_default();
                            claim_rules::validate_update(
                                &old,
                                &claim,
                                state.is_operator(user),
                                state.clock.now(),
                            )
                        }
                        Err(verdict) => verdict,
                    }
                }
                _ => Verdict::allow(),
            }
        }
        .await;
        (request, verdict)
    })
    .await
}

pub async fn validate_slot(State(state): State<Arc<Shared>>, Json(review): Review) -> Review {
    answer("validate-node", review, |request| async move {
        let verdict = async {
            if !matches!(request.operation, Operation::Create | Operation::Update) {
                return Verdict::allow();
            }
            let slot: Node = match parse(request.object.as_ref(), "Node") {
                Ok(slot) => slot,
                Err(verdict) => return verdict,
            };
            let old: Option<Node> = match request.operation {
                Operation::Update => match parse(request.old_object.as_ref(), "stored Node") {
                    Ok(old) => Some(old),
                    Err(verdict) => return verdict,
                },
                _ => None,
            };
            let lookup = lookup(&state, &request);
            let group = slot.group().map(str::to_owned);
            let group_exists = match &group {
                Some(g) => match lookup.group(g).await {
                    Ok(found) => found.is_some(),
                    Err(error) => return unavailable(error),
                },
                None => false,
            };
            let provider_id_changes =
                old.as_ref().is_some_and(|o| o.spec.provider_id != slot.spec.provider_id);
            let claims = if provider_id_changes {
                match lookup.claims_of_slot(&request.name).await {
                    Ok(claims) => claims,
                    Err(error) => return unavailable(error),
                }
            } else {
                Vec::new()
            };
            let ns = request.namespace.clone().unwrap_or_default();
            let facts = SlotFacts { namespace: &ns, group_exists, claims_of_slot: &claims };
            slot_rules::validate(&slot, old.as_ref(), &facts)
        }
        .await;
        (request, verdict)
    })
    .await
}

pub async fn validate_group(State(state): State<Arc<Shared>>, Json(review): Review) -> Review {
    answer("validate-group", review, |request| async move {
        let verdict = async {
            if !matches!(request.operation, Operation::Create | Operation::Update) {
                return Verdict::allow();
            }
            let group: Group = match parse(request.object.as_ref(), "Group") {
                Ok(group) => group,
                Err(verdict) => return verdict,
            };
            let old: Option<Group> = match request.operation {
                Operation::Update => match parse(request.old_object.as_ref(), "stored Group") {
                    Ok(old) => Some(old),
                    Err(verdict) => return verdict,
                },
                _ => None,
            };
            let lookup = lookup(&state, &request);
            let (slots, claims) = match tokio::try_join!(
                lookup.slots_of_group(&request.name),
                lookup.claims_of_group(&request.name)
            ) {
                Ok(found) => found,
                Err(error) => return unavailable(error),
            };
            let live_claims = claims.iter().filter(|c| phase::is_live(Some(phase::of(c)))).count();
            group_rules::validate(
                &group,
                old.as_ref(),
                &GroupFacts { slots: slots.len(), live_claims, now: state.clock.now() },
            )
        }
        .await;
        (request, verdict)
    })
    .await
}

/// A kubelet registering its Node: the node gets what its slot declares. Never refused: a node
/// that is no slot's, that cannot be read, or whose slot cannot be read registers as sent.
pub async fn mutate_kubernetes_node(
    State(state): State<Arc<Shared>>,
    Json(review): Review,
) -> Review {
    answer("mutate-kubernetes-node", review, |request| async move {
        let verdict = async {
            if request.operation != Operation::Create {
                return Verdict::allow();
            }
            let Some(raw) = request.object.as_ref().and_then(|o| serde_json::to_value(o).ok())
            else {
                return Verdict::allow();
            };
            let node: CoreNode = match serde_json::from_value(raw.clone()) {
                Ok(node) => node,
                Err(error) => {
                    tracing::warn!(%error, "a registering node that does not decode: left as sent");
                    return Verdict::allow();
                }
            };
            let lookup = lookup(&state, &request);
            let slot = match lookup.slots_of_node(&request.name).await {
                Ok(slots) => match <[Node; 1]>::try_from(slots) {
                    Ok([slot]) => slot,
                    // No slot's machine, or two slots naming one node (the slots' own problem).
                    Err(_) => return Verdict::allow(),
                },
                Err(error) => {
                    tracing::warn!(%error, "the node's slot cannot be read: left as sent");
                    return Verdict::allow();
                }
            };
            let slot_name = slot.metadata.name.clone().unwrap_or_default();
            let claims = match lookup.claims_of_slot(&slot_name).await {
                Ok(claims) => claims,
                Err(error) => {
                    tracing::warn!(%error, "the slot's claims cannot be read: left as sent");
                    return Verdict::allow();
                }
            };
            let patch = node_registration::patch(&raw, &node, &slot, &claims);
            tracing::info!(slot = slot_name, changes = patch.len(), "a slot's node registers");
            Verdict::Allow { warnings: vec![], patch }
        }
        .await;
        (request, verdict)
    })
    .await
}

/// The cluster state a claim's rules read, owned.
struct OwnedClaimFacts {
    slot: Option<Node>,
    group: Option<Group>,
    others: Vec<NodeClaim>,
}

impl OwnedClaimFacts {
    fn as_facts<'a>(
        &'a self,
        state: &WebhookState,
        namespace: &'a str,
        now: jiff::Timestamp,
    ) -> ClaimFacts<'a> {
        ClaimFacts {
            timeouts: state.timeouts,
            namespace,
            slot: self.slot.as_ref(),
            group: self.group.as_ref(),
            other_claims_of_slot: &self.others,
            now,
        }
    }
}

async fn claim_facts(
    state: &Shared,
    request: &AdmissionRequest<DynamicObject>,
    claim: &NodeClaim,
) -> Result<OwnedClaimFacts, LookupError> {
    let lookup = lookup(state, request);
    let (slot, group, mut claims) = tokio::try_join!(
        lookup.slot(&claim.spec.slot_ref.name),
        lookup.group(&claim.spec.request.group),
        lookup.claims_of_slot(&claim.spec.slot_ref.name),
    )?;
    if lookup.is_cached() {
        // What this replica admitted and the caches do not show yet.
        claims.extend(state.admitted.unseen(&claim.spec.slot_ref.name, &state.caches));
    }
    // On create the claim may have only a generateName; match by name and uid both.
    let me = (claim.metadata.name.as_deref(), claim.metadata.uid.as_deref());
    let others = claims
        .into_iter()
        .filter(|c| {
            let same_name = me.0.is_some() && c.metadata.name.as_deref() == me.0;
            let same_uid = me.1.is_some() && c.metadata.uid.as_deref() == me.1;
            !(same_name || same_uid)
        })
        .collect();
    Ok(OwnedClaimFacts { slot, group, others })
}
