//! Power-off gates: whether the storage that may hold a machine's data can lose the machine
//! now (docs/decisions.md, D40). Which of a pool's gates concern a slot ([`applying`]), reading
//! each one from the user's Prometheus ([`prometheus`]) or from Kubernetes objects through CEL
//! ([`kubernetes`]), and the rule that keeps one data machine at a time on its way off
//! ([`one_at_a_time`]). A gate that cannot be read holds: a missing answer never lets a
//! machine go.

pub mod kubernetes;
pub mod one_at_a_time;
pub mod peers;
pub mod prometheus;

use std::time::Duration;

use crate::api::{GroupSpec, NodeSpec, PowerOffGate};

/// How long after a data machine's shutdown the gates are not yet trusted, unless the pool
/// sets `powerOffGateSettle`.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(120);

/// How long one read of a gate may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What one gate said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub gate: String,
    pub verdict: Verdict,
    /// What was read, in words a person can check against the source.
    pub said: String,
}

/// A gate's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Open,
    Closed,
    /// The gate could not be read (unreachable, an error, a missing object): it holds.
    Unread,
}

impl Reading {
    pub fn open(&self) -> bool {
        self.verdict == Verdict::Open
    }

    /// What holds, as the slot and cluster-autoscaler are told it.
    pub fn holding(&self) -> String {
        let how = if self.verdict == Verdict::Unread { "could not be read" } else { "is closed" };
        format!("gate {} {how}: {}", self.gate, self.said)
    }
}

/// The gates that concern a slot: those it names (`spec.powerOffGates`), or every gate of its
/// pool when it names none. A name the pool does not define comes back as a reading that
/// holds. Pure.
pub fn applying<'a>(pool: &'a GroupSpec, slot: &NodeSpec) -> (Vec<&'a PowerOffGate>, Vec<Reading>) {
    let Some(named) = &slot.power_off_gates else {
        return (pool.power_off_gates.iter().collect(), Vec::new());
    };
    let found = pool.power_off_gates.iter().filter(|g| named.contains(&g.name)).collect();
    let missing = named
        .iter()
        .filter(|name| !pool.power_off_gates.iter().any(|g| &g.name == *name))
        .map(|name| Reading {
            gate: name.clone(),
            verdict: Verdict::Unread,
            said: format!(
                "the slot names gate {name}, which its Group does not define: define it in the Group's spec.powerOffGates, or take it out of the slot's spec.powerOffGates"
            ),
        })
        .collect();
    (found, missing)
}

/// Whether a slot is a data machine: some gate of its pool concerns it. Pure.
pub fn is_data_machine(pool: &GroupSpec, slot: &NodeSpec) -> bool {
    let (gates, missing) = applying(pool, slot);
    !gates.is_empty() || !missing.is_empty()
}

/// How long after a data machine's shutdown the gates are not yet trusted.
pub fn settle(pool: &GroupSpec) -> Duration {
    pool.power_off_gate_settle.map_or(DEFAULT_SETTLE, Into::into)
}

/// Reads gates: an HTTP client for Prometheus and the API client for objects.
pub struct Reader {
    http: Result<reqwest::Client, String>,
    kube: kube::Client,
}

impl Reader {
    pub fn new(kube: kube::Client) -> Self {
        let http = reqwest::Client::builder()
            .timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| format!("no HTTP client for Prometheus: {e}"));
        Self { http, kube }
    }

    /// Reads one gate. Never fails: what could not be read is an `Unread` reading that says why.
    pub async fn read(&self, gate: &PowerOffGate) -> Reading {
        let (verdict, said) = match (&gate.prometheus, &gate.kubernetes) {
            (Some(query), _) => match &self.http {
                Ok(http) => prometheus::read(http, query).await,
                Err(e) => (Verdict::Unread, e.clone()),
            },
            (None, Some(objects)) => kubernetes::read(&self.kube, objects).await,
            (None, None) => {
                (Verdict::Unread, "the gate names no source (prometheus or kubernetes)".into())
            }
        };
        Reading { gate: gate.name.clone(), verdict, said }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(gates: &[&str]) -> GroupSpec {
        let gates: Vec<serde_json::Value> = gates
            .iter()
            .map(|g| serde_json::json!({ "name": g, "prometheus": { "url": "http://p:9090", "query": "up" } }))
            .collect();
        serde_json::from_value(serde_json::json!({ "powerOffGates": gates })).unwrap()
    }

    fn slot(names: Option<&[&str]>) -> NodeSpec {
        serde_json::from_value(serde_json::json!({
            "kubernetesNodeName": "m1",
            "powerOffGates": names,
        }))
        .unwrap()
    }

    #[test]
    fn which_gates_concern_a_slot() {
        let two = pool(&["ceph", "pg"]);
        let names = |s: &NodeSpec| -> Vec<String> {
            applying(&two, s).0.iter().map(|g| g.name.clone()).collect()
        };
        assert_eq!(names(&slot(None)), ["ceph", "pg"], "unset: every gate of the pool");
        assert_eq!(names(&slot(Some(&["pg"]))), ["pg"]);
        assert!(names(&slot(Some(&[]))).is_empty(), "empty: none");
        assert!(!is_data_machine(&two, &slot(Some(&[]))));
        assert!(is_data_machine(&two, &slot(None)));
        assert!(!is_data_machine(&pool(&[]), &slot(None)), "a pool with no gates");
        let (found, missing) = applying(&two, &slot(Some(&["pg", "longhorn"])));
        assert_eq!(found.len(), 1);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].verdict, Verdict::Unread);
        assert!(missing[0].said.contains("gate longhorn, which its Group does not define"));
        assert!(is_data_machine(&pool(&[]), &slot(Some(&["ceph"]))), "an unknown gate holds");
    }
}
