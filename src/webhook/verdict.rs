//! What a rule decides, and how it travels back to the API server. Denials answer HTTP 200
//! with `allowed: false`, a code (422 invalid, 403 policy), a reason and a message a person can
//! act on; soft problems are warnings; mutations are idempotent JSON patches.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};

/// The decision of one admission rule set.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Allow { warnings: Vec<String>, patch: Vec<json_patch::PatchOperation> },
    Deny(Denial),
}

/// A refusal: what is wrong and what to do instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// The rules the object broke, named for the denials metric (a small fixed set, such as
    /// `one_live_claim_per_slot`), one per problem in the message.
    pub rules: Vec<&'static str>,
}

impl Denial {
    /// The object is malformed: a field is wrong.
    pub fn invalid(rule: &'static str, message: impl Into<String>) -> Self {
        Self { code: 422, reason: "Invalid", message: message.into(), rules: vec![rule] }
    }
    /// The object is well formed but the model forbids it now.
    pub fn forbidden(rule: &'static str, message: impl Into<String>) -> Self {
        Self { code: 403, reason: "Forbidden", message: message.into(), rules: vec![rule] }
    }
}

impl Verdict {
    pub fn allow() -> Self {
        Self::Allow { warnings: Vec::new(), patch: Vec::new() }
    }

    pub fn with_warnings(warnings: Vec<String>) -> Self {
        Self::Allow { warnings, patch: Vec::new() }
    }

    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allow { .. })
    }

    /// The AdmissionResponse for `request`.
    pub fn respond(self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        match self {
            Verdict::Deny(denial) => {
                let mut response = response.deny(denial.message);
                // A metav1.Status that refuses says so; `deny` leaves the summary unset.
                response.result.status = Some(kube::core::response::StatusSummary::Failure);
                response.result.code = denial.code;
                response.result.reason = denial.reason.to_string();
                response
            }
            Verdict::Allow { warnings, patch } => {
                let mut response = response;
                if !warnings.is_empty() {
                    response.warnings = Some(warnings);
                }
                if patch.is_empty() {
                    return response;
                }
                match response.clone().with_patch(json_patch::Patch(patch)) {
                    Ok(patched) => patched,
                    Err(error) => AdmissionResponse::from(request).deny(format!(
                        "internal error: the webhook could not encode its patch: {error}"
                    )),
                }
            }
        }
    }
}

/// Collects denials so that one response names every problem at once. Each problem is
/// recorded with the rule it breaks.
#[derive(Default)]
pub struct Findings {
    invalid: Vec<(&'static str, String)>,
    forbidden: Vec<(&'static str, String)>,
    warnings: Vec<String>,
}

impl Findings {
    pub fn invalid(&mut self, rule: &'static str, message: impl Into<String>) {
        self.invalid.push((rule, message.into()));
    }
    /// Every denial message so far (for table tests of one rule).
    #[cfg(test)]
    pub fn messages(&self) -> Vec<String> {
        self.invalid.iter().chain(&self.forbidden).map(|(_, m)| m.clone()).collect()
    }
    pub fn forbidden(&mut self, rule: &'static str, message: impl Into<String>) {
        self.forbidden.push((rule, message.into()));
    }
    pub fn warn(&mut self, message: impl Into<String>) {
        self.warnings.push(message.into());
    }
    /// Invalid fields come first (422): they must be fixed whatever the cluster's state.
    pub fn verdict(self) -> Verdict {
        let deny = |mut denial: Denial, found: Vec<(&'static str, String)>| {
            let (rules, messages): (Vec<_>, Vec<_>) = found.into_iter().unzip();
            denial.message = messages.join("; ");
            denial.rules = rules;
            Verdict::Deny(denial)
        };
        if !self.invalid.is_empty() {
            deny(Denial::invalid("", ""), self.invalid)
        } else if !self.forbidden.is_empty() {
            deny(Denial::forbidden("", ""), self.forbidden)
        } else {
            Verdict::with_warnings(self.warnings)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(verdict: Verdict) -> Denial {
        match verdict {
            Verdict::Deny(denial) => denial,
            Verdict::Allow { .. } => panic!("expected a denial"),
        }
    }

    #[test]
    fn a_denial_names_every_rule_it_reports() {
        let mut findings = Findings::default();
        findings.forbidden("one_live_claim_per_slot", "slot taken");
        findings.invalid("group_exists", "no group");
        findings.invalid("requested_now", "clock skew");
        let denied = denial(findings.verdict());
        // Invalid fields come first and alone: the forbidden rule is not reported yet.
        assert_eq!((denied.code, denied.reason), (422, "Invalid"));
        assert_eq!(denied.message, "no group; clock skew");
        assert_eq!(denied.rules, ["group_exists", "requested_now"]);

        let mut findings = Findings::default();
        findings.forbidden("one_live_claim_per_slot", "slot taken");
        let denied = denial(findings.verdict());
        assert_eq!((denied.code, denied.reason), (403, "Forbidden"));
        assert_eq!(denied.rules, ["one_live_claim_per_slot"]);

        let mut findings = Findings::default();
        findings.warn("empty group");
        assert!(findings.verdict().is_allowed());
    }
}
