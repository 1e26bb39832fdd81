//! How a lifecycle Job ended, read from its conditions. Pure: the controllers that run the Jobs
//! and the simulator that plays the machines behind them both read it here.

use k8s_openapi::api::batch::v1::Job;

/// How a Job ended, if it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    Running,
    Succeeded { at: Option<jiff::Timestamp> },
    Failed,
}

/// How a Job ended. Since Kubernetes 1.31 a Job first gets `FailureTarget` (or
/// `SuccessCriteriaMet`) and only later `Failed` (`Complete`), once its pods are gone; the
/// outcome is known at the first.
pub fn outcome(job: &Job) -> JobOutcome {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let has = |t: &str| {
        conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
    };
    if has("Complete") || has("SuccessCriteriaMet") {
        let at = job.status.as_ref().and_then(|s| s.completion_time.as_ref()).map(|t| t.0);
        JobOutcome::Succeeded { at }
    } else if has("Failed") || has("FailureTarget") {
        JobOutcome::Failed
    } else {
        JobOutcome::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn job(conditions: &[(&str, &str)], completed: Option<&str>) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| JobCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..JobCondition::default()
                        })
                        .collect(),
                ),
                completion_time: completed.map(|t| Time(t.parse().unwrap())),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    #[test]
    fn outcome_table() {
        let at = "2026-03-04T09:00:00Z";
        let table = [
            ("no conditions", job(&[], None), JobOutcome::Running),
            (
                "a condition that is not True",
                job(&[("Failed", "False")], None),
                JobOutcome::Running,
            ),
            (
                "failure decided, pods not gone yet",
                job(&[("FailureTarget", "True")], None),
                JobOutcome::Failed,
            ),
            ("failed", job(&[("Failed", "True")], None), JobOutcome::Failed),
            (
                "success decided, with its time",
                job(&[("SuccessCriteriaMet", "True")], Some(at)),
                JobOutcome::Succeeded { at: Some(at.parse().unwrap()) },
            ),
            ("complete", job(&[("Complete", "True")], None), JobOutcome::Succeeded { at: None }),
        ];
        for (name, job, want) in table {
            assert_eq!(outcome(&job), want, "{name}");
        }
    }
}
