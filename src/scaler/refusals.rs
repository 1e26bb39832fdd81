//! The scaler's memory of the slots the scheduler refused a pod on once they were up
//! (docs/decisions.md, D37). Placement judges a machine before it is up by its labels and
//! taints; the scheduler judges the machine itself (its memory, a taint the slot does not
//! declare, the pods already on it). A pod placement sent to a slot that the scheduler then
//! refuses must not wake that slot again: the hold would release the empty machine, the pod
//! would still be pending, and the next pass would wake it again, a power cycle per hold.
//!
//! Per pending pod, per slot: once the scheduler has judged the pod while the slot's machine
//! was up (its claim ready and not being released) and left it pending, the slot is *refused*
//! for the pod until the pod (its uid or spec) or the slot (its generation) changes. A judgment
//! in the very second the machine came up may be the one from before it came up (the API keeps
//! whole seconds), so it refuses only when a later pass, or the wake that would follow the
//! machine's release, still finds the pod pending.
//!
//! The memory lives in the scaler's process: a restarted scaler may wake a refused slot once
//! more before it learns the refusal again.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::placement::pods::PodKey;

/// The event reason on the pod and the slot when a slot is refused.
pub const REASON: &str = "WokenMachineCannotRunPod";

/// The field manager kube-scheduler writes pod status as.
const SCHEDULER_MANAGER: &str = "kube-scheduler";

/// A pending pod as the scheduler last judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgment {
    /// The pod's uid and spec: a pod that changes asks anew.
    version: u64,
    /// When the scheduler last wrote the pod's status, to the second.
    at: Option<Timestamp>,
    /// The scheduler's message on the pod's `PodScheduled` condition.
    pub message: String,
}

impl Judgment {
    pub fn of(pod: &Pod) -> Self {
        let mut hasher = DefaultHasher::new();
        pod.metadata.uid.hash(&mut hasher);
        serde_json::to_string(&pod.spec).unwrap_or_default().hash(&mut hasher);
        let scheduler = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        let at = pod
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|f| f.subresource.as_deref() == Some("status"))
            .filter(|f| {
                let manager = f.manager.as_deref();
                manager == Some(SCHEDULER_MANAGER) || (manager.is_some() && manager == scheduler)
            })
            .filter_map(|f| f.time.as_ref().map(|t| t.0))
            .max();
        let message = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"))
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        Self { version: hasher.finish(), at, message }
    }

    #[cfg(test)]
    pub fn at(version: u64, at: Option<Timestamp>, message: &str) -> Self {
        Self { version, at, message: message.to_owned() }
    }
}

/// A slot as the memory needs it.
#[derive(Clone, Copy, Debug)]
pub struct SlotSeen<'a> {
    pub name: &'a str,
    pub generation: i64,
    /// Its machine is up for pods: a ready claim not being released.
    pub serving: bool,
    /// When its live claim became ready.
    pub ready_at: Option<Timestamp>,
}

/// A slot newly refused for a pod: the scaler says so on both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub pod: PodKey,
    pub slot: String,
    /// The scheduler's words.
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Verdict {
    /// Judged in the second the machine came up: refused if still pending later.
    JudgedAsItCameUp,
    Refused,
}

#[derive(Debug, Default)]
struct PodMemory {
    version: u64,
    /// By slot: its generation when judged, and the verdict.
    slots: BTreeMap<String, (i64, Verdict)>,
    seen_this_pass: bool,
}

/// Per pending pod, the slots refused for it.
#[derive(Debug, Default)]
pub struct Refusals {
    pods: HashMap<PodKey, PodMemory>,
}

impl Refusals {
    /// Whether `slot` is refused for the pod now; `Some` in the second member when this call
    /// refused it. Call it for each slot a pending pod fits, every pass.
    pub fn judge(
        &mut self,
        pod: &PodKey,
        judgment: &Judgment,
        slot: SlotSeen<'_>,
    ) -> (bool, Option<Refusal>) {
        let memory = self.pods.entry(pod.clone()).or_default();
        if memory.version != judgment.version {
            *memory = PodMemory { version: judgment.version, ..PodMemory::default() };
        }
        memory.seen_this_pass = true;
        let known = memory
            .slots
            .get(slot.name)
            .filter(|(g, _)| *g == slot.generation)
            .map(|(_, v)| v.clone());
        let refuse = match (known, slot.serving) {
            (Some(Verdict::Refused), _) => return (true, None),
            (Some(Verdict::JudgedAsItCameUp), true) => judged_since(judgment, slot.ready_at),
            (Some(Verdict::JudgedAsItCameUp), false) => true,
            (None, true) => match (judgment.at, slot.ready_at) {
                (Some(at), Some(ready)) if at > ready => true,
                (Some(at), Some(ready)) if at == ready => {
                    memory
                        .slots
                        .insert(slot.name.to_owned(), (slot.generation, Verdict::JudgedAsItCameUp));
                    false
                }
                _ => false,
            },
            (None, false) => false,
        };
        if !refuse {
            return (false, None);
        }
        memory.slots.insert(slot.name.to_owned(), (slot.generation, Verdict::Refused));
        let refusal = Refusal {
            pod: pod.clone(),
            slot: slot.name.to_owned(),
            message: judgment.message.clone(),
        };
        (true, Some(refusal))
    }

    /// Starts a pass: pods not judged by its end are forgotten.
    pub fn begin_pass(&mut self) {
        for memory in self.pods.values_mut() {
            memory.seen_this_pass = false;
        }
    }

    /// Forgets the pods this pass did not see pending: they run, or are gone.
    pub fn end_pass(&mut self) {
        self.pods.retain(|_, m| m.seen_this_pass);
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Judged at or after the machine came up: a second sighting confirms a same-second judgment.
fn judged_since(judgment: &Judgment, ready_at: Option<Timestamp>) -> bool {
    matches!((judgment.at, ready_at), (Some(at), Some(ready)) if at >= ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(second: i64) -> Option<Timestamp> {
        Timestamp::from_second(1_800_000_000 + second).ok()
    }

    fn pod() -> PodKey {
        ("apps".into(), "db".into())
    }

    fn slot(serving: bool, ready: Option<Timestamp>) -> SlotSeen<'static> {
        SlotSeen { name: "gpu-1", generation: 1, serving, ready_at: ready }
    }

    /// Each row: the judgments and slot sightings of successive passes, and whether the slot
    /// is refused after each.
    #[test]
    fn a_slot_is_refused_once_the_scheduler_judged_the_pod_on_the_machine_up() {
        /// One pass: the pod as judged, and the slot as seen.
        type Pass = (Judgment, SlotSeen<'static>);
        let cases: Vec<(&str, Vec<Pass>, Vec<bool>)> = vec![
            (
                "judged after the machine came up: refused at once",
                vec![(Judgment::at(1, t(12), "Insufficient memory"), slot(true, t(10)))],
                vec![true],
            ),
            (
                "judged before it came up: not refused while waiting",
                vec![
                    (Judgment::at(1, t(5), "untolerated taint"), slot(true, t(10))),
                    (Judgment::at(1, t(5), "untolerated taint"), slot(true, t(10))),
                ],
                vec![false, false],
            ),
            (
                "judged in the second it came up: refused on the next pass",
                vec![
                    (Judgment::at(1, t(10), "Insufficient memory"), slot(true, t(10))),
                    (Judgment::at(1, t(10), "Insufficient memory"), slot(true, t(10))),
                ],
                vec![false, true],
            ),
            (
                "judged in the second it came up, then released: refused at the wake",
                vec![
                    (Judgment::at(1, t(10), "Insufficient memory"), slot(true, t(10))),
                    (Judgment::at(1, t(10), "Insufficient memory"), slot(false, None)),
                ],
                vec![false, true],
            ),
            (
                "booting, never judged on it: never refused",
                vec![
                    (Judgment::at(1, None, ""), slot(false, None)),
                    (Judgment::at(1, None, ""), slot(true, t(10))),
                ],
                vec![false, false],
            ),
            (
                "a changed pod asks anew",
                vec![
                    (Judgment::at(1, t(12), "Insufficient memory"), slot(true, t(10))),
                    (Judgment::at(2, t(12), "Insufficient memory"), slot(false, None)),
                ],
                vec![true, false],
            ),
            (
                "a changed slot asks anew",
                vec![
                    (Judgment::at(1, t(12), "Insufficient memory"), slot(true, t(10))),
                    (
                        Judgment::at(1, t(12), "Insufficient memory"),
                        SlotSeen { generation: 2, ..slot(false, None) },
                    ),
                ],
                vec![true, false],
            ),
        ];
        for (name, passes, want) in cases {
            let mut memory = Refusals::default();
            let got: Vec<bool> = passes
                .iter()
                .map(|(judgment, seen)| {
                    memory.begin_pass();
                    let (refused, _) = memory.judge(&pod(), judgment, *seen);
                    memory.end_pass();
                    refused
                })
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_refusal_is_reported_once_with_the_schedulers_words() {
        let mut memory = Refusals::default();
        let judgment = Judgment::at(1, t(12), "0/3 nodes are available: 1 Insufficient memory.");
        let (_, first) = memory.judge(&pod(), &judgment, slot(true, t(10)));
        let (refused, second) = memory.judge(&pod(), &judgment, slot(false, None));
        assert_eq!(
            first,
            Some(Refusal {
                pod: pod(),
                slot: "gpu-1".into(),
                message: "0/3 nodes are available: 1 Insufficient memory.".into(),
            })
        );
        assert!(refused && second.is_none(), "refused still, not reported again");
    }

    #[test]
    fn a_pod_not_seen_pending_in_a_pass_is_forgotten() {
        let mut memory = Refusals::default();
        memory.judge(&pod(), &Judgment::at(1, t(12), "full"), slot(true, t(10)));
        memory.begin_pass();
        memory.end_pass();
        assert!(memory.is_empty());
    }

    #[test]
    fn the_judgment_reads_the_schedulers_status_write_and_message() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "db", "uid": "u1",
                "managedFields": [
                    { "manager": "kubectl-create", "operation": "Update",
                      "time": "2027-01-15T08:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {} },
                    { "manager": "kube-scheduler", "operation": "Update", "subresource": "status",
                      "time": "2027-01-15T08:00:07Z", "fieldsType": "FieldsV1", "fieldsV1": {} },
                ],
            },
            "spec": { "containers": [{ "name": "app" }] },
            "status": { "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/2 nodes are available: 1 Insufficient memory.",
            }] },
        }))
        .expect("pod");
        let judgment = Judgment::of(&pod);
        assert_eq!(judgment.at, "2027-01-15T08:00:07Z".parse().ok());
        assert_eq!(judgment.message, "0/2 nodes are available: 1 Insufficient memory.");
        let mut resized = pod.clone();
        if let Some(spec) = resized.spec.as_mut() {
            spec.priority = Some(5);
        }
        assert_ne!(Judgment::of(&resized).version, judgment.version, "a changed spec asks anew");
    }
}
