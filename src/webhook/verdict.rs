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
}

impl Denial {
    /// The object is malformed: a field is wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self { code: 422, reason: "Invalid", message: message.into() }
    }
    /// The object is well formed but the model forbids it now.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self { code: 403, reason: "Forbidden", message: message.into() }
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

/// Collects denials so that one response names every problem at once.
#[derive(Default)]
pub struct Findings {
    invalid: Vec<String>,
    forbidden: Vec<String>,
    warnings: Vec<String>,
}

impl Findings {
    pub fn invalid(&mut self, message: impl Into<String>) {
        self.invalid.push(message.into());
    }
    /// Every denial message so far (for table tests of one rule).
    #[cfg(test)]
    pub fn messages(&self) -> Vec<String> {
        self.invalid.iter().chain(&self.forbidden).cloned().collect()
    }
    pub fn forbidden(&mut self, message: impl Into<String>) {
        self.forbidden.push(message.into());
    }
    pub fn warn(&mut self, message: impl Into<String>) {
        self.warnings.push(message.into());
    }
    /// Invalid fields come first (422): they must be fixed whatever the cluster's state.
    pub fn verdict(self) -> Verdict {
        if !self.invalid.is_empty() {
            Verdict::Deny(Denial::invalid(self.invalid.join("; ")))
        } else if !self.forbidden.is_empty() {
            Verdict::Deny(Denial::forbidden(self.forbidden.join("; ")))
        } else {
            Verdict::with_warnings(self.warnings)
        }
    }
}
