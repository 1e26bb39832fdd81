//! The boot budget: the sum of every deadline one attempt can spend, in series, plus a margin.
//! The clock runs from `spec.requestedAt`, before the startup Job exists, so the Job's own
//! timeout is part of it.

use std::time::Duration;

use jiff::Timestamp;

/// The startup Job's timeout (its activeDeadlineSeconds ceiling).
pub const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// How long a machine whose startup Job completed has to register its node object.
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a registered node has to become Ready and clear the readiness taints.
pub const DEFAULT_READINESS_GATE_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// Slack for what the deadlines above do not time: API latency, the watch events that report a
/// Job's end or a node's change, a reconcile pass, and uncordoning the ready node.
pub const BUDGET_MARGIN: Duration = Duration::from_secs(100);

/// One named member of the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetConstant {
    pub name: &'static str,
    pub value: Duration,
}

/// The set the budget is the sum of. Growing a deadline without listing it here, or dropping a
/// member, fails the budget tests.
pub fn budget_constants() -> [BudgetConstant; 4] {
    [
        BudgetConstant { name: "DEFAULT_JOB_TIMEOUT", value: DEFAULT_JOB_TIMEOUT },
        BudgetConstant {
            name: "DEFAULT_REGISTRATION_TIMEOUT",
            value: DEFAULT_REGISTRATION_TIMEOUT,
        },
        BudgetConstant {
            name: "DEFAULT_READINESS_GATE_TIMEOUT",
            value: DEFAULT_READINESS_GATE_TIMEOUT,
        },
        BudgetConstant { name: "BUDGET_MARGIN", value: BUDGET_MARGIN },
    ]
}

/// The boot budget, 12m10s.
pub const BOOT_BUDGET: Duration = Duration::from_secs(
    DEFAULT_JOB_TIMEOUT.as_secs()
        + DEFAULT_REGISTRATION_TIMEOUT.as_secs()
        + DEFAULT_READINESS_GATE_TIMEOUT.as_secs()
        + BUDGET_MARGIN.as_secs(),
);

/// The deadlines of one attempt, as the operator runs with them. The defaults are the
/// constants above; an operator (or a test) may shorten them, and the budget follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub job_timeout: Duration,
    /// How long a machine has to register its node after the startup Job completed.
    pub registration: Duration,
    pub readiness_gate: Duration,
    pub margin: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            job_timeout: DEFAULT_JOB_TIMEOUT,
            registration: DEFAULT_REGISTRATION_TIMEOUT,
            readiness_gate: DEFAULT_READINESS_GATE_TIMEOUT,
            margin: BUDGET_MARGIN,
        }
    }
}

impl Timeouts {
    /// The boot budget: every deadline of an attempt in series, plus the margin.
    pub fn budget(&self) -> Duration {
        self.job_timeout + self.registration + self.readiness_gate + self.margin
    }

    /// The end of a claim's boot window: `requestedAt + max(budget, maxNodeProvisionTime)`.
    /// Never shorter than the pool's maxNodeProvisionTime, because cluster-autoscaler waits that
    /// long and answers a claim failed early with another IncreaseSize.
    pub fn deadline_at(
        &self,
        requested_at: Timestamp,
        max_node_provision_time: Option<Duration>,
    ) -> Timestamp {
        let budget = self.budget();
        let window = max_node_provision_time.map_or(budget, |m| m.max(budget));
        let window = jiff::SignedDuration::try_from(window).unwrap_or(jiff::SignedDuration::MAX);
        requested_at.checked_add(window).unwrap_or(Timestamp::MAX)
    }
}

/// [`Timeouts::deadline_at`] with the default timeouts.
pub fn deadline_at(
    requested_at: Timestamp,
    max_node_provision_time: Option<Duration>,
) -> Timestamp {
    Timeouts::default().deadline_at(requested_at, max_node_provision_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_twelve_minutes_ten_seconds() {
        assert_eq!(BOOT_BUDGET, Duration::from_secs(12 * 60 + 10));
        let sum: Duration = budget_constants().iter().map(|c| c.value).sum();
        assert_eq!(sum, BOOT_BUDGET, "the budget is the sum of its members");
        assert_eq!(
            Timeouts::default().budget(),
            BOOT_BUDGET,
            "the default timeouts are the constants"
        );
    }

    #[test]
    fn each_member_is_the_named_constant() {
        let members = budget_constants();
        let expect = [
            ("DEFAULT_JOB_TIMEOUT", DEFAULT_JOB_TIMEOUT),
            ("DEFAULT_REGISTRATION_TIMEOUT", DEFAULT_REGISTRATION_TIMEOUT),
            ("DEFAULT_READINESS_GATE_TIMEOUT", DEFAULT_READINESS_GATE_TIMEOUT),
            ("BUDGET_MARGIN", BUDGET_MARGIN),
        ];
        assert_eq!(members.len(), expect.len());
        for (name, value) in expect {
            let member = members.iter().find(|c| c.name == name);
            assert_eq!(member.map(|c| c.value), Some(value), "{name} is a member of the budget");
        }
    }

    #[test]
    fn no_proper_subset_adds_up_to_the_budget() {
        // The clock starts before the Job exists, so a budget without the Job's timeout (7m10s)
        // would fail boots that are on time: dropping any member must fall short.
        let members = budget_constants();
        let n = members.len();
        for mask in 0..(1u32 << n) - 1 {
            let sum: Duration =
                (0..n).filter(|i| mask & (1 << i) != 0).map(|i| members[i].value).sum();
            assert_ne!(sum, BOOT_BUDGET, "subset {mask:#b} must not add up to the budget");
        }
        assert!(BOOT_BUDGET > Duration::from_secs(7 * 60 + 10));
    }

    #[test]
    fn the_deadline_is_floored_by_the_pools_provision_time() {
        let t0: Timestamp = "2026-03-04T09:38:15Z".parse().unwrap();
        let table = [
            (None, "2026-03-04T09:50:25Z"),
            (Some(Duration::from_secs(60)), "2026-03-04T09:50:25Z"),
            (Some(BOOT_BUDGET), "2026-03-04T09:50:25Z"),
            (Some(Duration::from_secs(20 * 60)), "2026-03-04T09:58:15Z"),
        ];
        for (mnpt, want) in table {
            let want: Timestamp = want.parse().unwrap();
            assert_eq!(deadline_at(t0, mnpt), want, "maxNodeProvisionTime {mnpt:?}");
        }
    }
}
