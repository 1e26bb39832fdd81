//! What bounds a ready claim once its boot is over: its machine, as its Node shows it. Pure.
//!
//! A machine whose kubelet is silent or whose Node is gone, for a whole boot window, fails the
//! claim `MachineGone` (a reboot fits in the window and is not an attempt that ends). A kubelet
//! that reports NotReady runs on a machine that is on and talking (a containerd upgrade, a CNI
//! outage): that is not "off". It has a bound of its own, `--not-ready-grace`, counted from the
//! Node's own transition to NotReady, and none at all under a pin, which a person holds on
//! purpose (decisions.md, D36).

use std::time::Duration;

use jiff::Timestamp;

use crate::api::duration::go_duration;
use crate::clock::plus;
use crate::machine::Kubelet;

/// The reason of a claim whose machine was silent or gone for a boot window.
pub const MACHINE_GONE: &str = "MachineGone";
/// The reason of a claim whose machine's kubelet reported NotReady past `--not-ready-grace`.
pub const MACHINE_NOT_READY: &str = "MachineNotReady";

/// What the claim controller knows when it judges a ready claim's machine.
#[derive(Clone, Debug)]
pub struct ReadyMachine<'a> {
    pub node_name: &'a str,
    pub kubelet: &'a Kubelet,
    /// The claim's `status.machineObservedOff`: since when the machine has been seen off.
    pub observed_off: Option<Timestamp>,
    /// The claim is a pin (a person's or a schedule's).
    pub pin: bool,
    pub now: Timestamp,
    /// How long a machine may be off before the claim fails: one boot window.
    pub off_grace: Duration,
    /// How long a kubelet may report NotReady before the claim fails (`--not-ready-grace`).
    pub not_ready_grace: Duration,
}

/// What to do with `status.machineObservedOff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffMark {
    Keep,
    /// The machine is on: clear a mark that a silence left.
    Clear,
    /// The machine is seen off for the first time: mark it now.
    Set,
}

/// The verdict on a ready claim's machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The claim stays ready; judge again at `wake_at` (if nothing changes before).
    Keep { mark: OffMark, wake_at: Option<Timestamp> },
    /// The claim fails, for `reason`, said in `message`.
    Fail { reason: &'static str, message: String },
}

fn keep(mark: OffMark, wake_at: Option<Timestamp>) -> Verdict {
    Verdict::Keep { mark, wake_at }
}

/// Judges a ready claim's machine.
pub fn judge(machine: &ReadyMachine<'_>) -> Verdict {
    let ReadyMachine { node_name, kubelet, observed_off, pin, now, .. } = *machine;
    let on_mark = if observed_off.is_some() { OffMark::Clear } else { OffMark::Keep };
    match kubelet {
        Kubelet::Ready => keep(on_mark, None),
        Kubelet::NotReady { .. } if pin => keep(on_mark, None),
        Kubelet::NotReady { since, says } => {
            // The Node's own transition time is the clock (it survives a restart of the
            // operator); a Node without one falls back to the claim's mark.
            let (mark, start) = match (since, observed_off) {
                (Some(since), _) => (on_mark, *since),
                (None, Some(marked)) => (OffMark::Keep, marked),
                (None, None) => (OffMark::Set, now),
            };
            let end = plus(start, machine.not_ready_grace);
            if now < end {
                return keep(mark, Some(end));
            }
            Verdict::Fail {
                reason: MACHINE_NOT_READY,
                message: format!(
                    "node {node_name} has not been Ready since {start} (kubelet says: {says}), longer than --not-ready-grace ({}); a pin (homelab-autoscaler keep-on) keeps a machine on through maintenance",
                    go_duration(machine.not_ready_grace)
                ),
            }
        }
        Kubelet::NoNode | Kubelet::Registering | Kubelet::Silent { .. } => {
            let Some(marked) = observed_off else {
                return keep(OffMark::Set, Some(plus(now, machine.off_grace)));
            };
            let end = plus(marked, machine.off_grace);
            if now < end {
                return keep(OffMark::Keep, Some(end));
            }
            let message = match kubelet {
                Kubelet::Silent { since } => format!(
                    "the kubelet of node {node_name} has been silent since {}",
                    since.map_or(marked, |since| since.min(marked))
                ),
                Kubelet::NoNode => format!("node {node_name} has been gone since {marked}"),
                _ => format!("node {node_name} has not reported since {marked}"),
            };
            Verdict::Fail { reason: MACHINE_GONE, message }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "m1";

    fn at(s: &str) -> Timestamp {
        format!("2026-03-04T{s}Z").parse().unwrap()
    }

    fn judge_at(kubelet: Kubelet, observed_off: Option<&str>, pin: bool, now: &str) -> Verdict {
        judge(&ReadyMachine {
            node_name: NODE,
            kubelet: &kubelet,
            observed_off: observed_off.map(at),
            pin,
            now: at(now),
            off_grace: Duration::from_secs(730),
            not_ready_grace: Duration::from_secs(3600),
        })
    }

    fn not_ready(since: Option<&str>) -> Kubelet {
        Kubelet::NotReady {
            since: since.map(at),
            says: "KubeletNotReady: container runtime is down".into(),
        }
    }

    fn fails(verdict: &Verdict) -> Option<&'static str> {
        match verdict {
            Verdict::Fail { reason, .. } => Some(reason),
            Verdict::Keep { .. } => None,
        }
    }

    #[test]
    fn the_bounds_of_a_ready_claims_machine() {
        use OffMark::*;
        let keep = |mark, wake: Option<&str>| Verdict::Keep { mark, wake_at: wake.map(at) };
        let silent = |since: &str| Kubelet::Silent { since: Some(at(since)) };
        let table: Vec<(&str, Verdict, Verdict)> = vec![
            ("ready", judge_at(Kubelet::Ready, None, false, "10:00:00"), keep(Keep, None)),
            (
                "ready again after a silence clears the mark",
                judge_at(Kubelet::Ready, Some("09:55:00"), false, "10:00:00"),
                keep(Clear, None),
            ),
            (
                "silent: marked now, judged again a boot window later",
                judge_at(silent("09:59:00"), None, false, "10:00:00"),
                keep(Set, Some("10:12:10")),
            ),
            (
                "silent within the window",
                judge_at(silent("09:59:00"), Some("10:00:00"), false, "10:12:00"),
                keep(Keep, Some("10:12:10")),
            ),
            (
                "no node within the window",
                judge_at(Kubelet::NoNode, Some("10:00:00"), true, "10:05:00"),
                keep(Keep, Some("10:12:10")),
            ),
            // NotReady is on: the kubelet reports. Its bound is its own, from the Node's clock.
            (
                "not ready: kept, judged at the Node's transition plus the grace",
                judge_at(not_ready(Some("09:30:00")), None, false, "10:00:00"),
                keep(Keep, Some("10:30:00")),
            ),
            (
                "not ready after a silence clears the off mark",
                judge_at(not_ready(Some("09:30:00")), Some("09:40:00"), false, "10:00:00"),
                keep(Clear, Some("10:30:00")),
            ),
            (
                "not ready with no transition time: the claim's mark is the clock",
                judge_at(not_ready(None), None, false, "10:00:00"),
                keep(Set, Some("11:00:00")),
            ),
            (
                "not ready with no transition time, marked before",
                judge_at(not_ready(None), Some("09:10:00"), false, "10:00:00"),
                keep(Keep, Some("10:10:00")),
            ),
            (
                "not ready under a pin: no bound at all",
                judge_at(not_ready(Some("02:00:00")), None, true, "10:00:00"),
                keep(Keep, None),
            ),
        ];
        for (name, got, want) in table {
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_machine_fails_its_claim_only_past_its_own_bound() {
        // Past a boot window of NotReady (the case that failed the claim MachineGone before):
        // kept.
        let maintenance = judge_at(not_ready(Some("09:00:00")), None, false, "09:20:00");
        assert_eq!(fails(&maintenance), None, "{maintenance:?}");
        let pinned = judge_at(not_ready(Some("01:00:00")), Some("01:00:00"), true, "10:00:00");
        assert_eq!(fails(&pinned), None, "{pinned:?}");

        let Verdict::Fail { reason, message } =
            judge_at(not_ready(Some("09:00:00")), None, false, "10:00:00")
        else {
            panic!("not ready past the grace fails");
        };
        assert_eq!(reason, MACHINE_NOT_READY);
        assert!(message.contains("not been Ready since 2026-03-04T09:00:00Z"), "{message}");
        assert!(
            message.contains("(kubelet says: KubeletNotReady: container runtime is down)"),
            "{message}"
        );
        assert!(message.contains("--not-ready-grace (1h)"), "{message}");
        assert!(message.contains("keep-on"), "{message}");

        let silent = Kubelet::Silent { since: Some(at("09:59:30")) };
        let Verdict::Fail { reason, message } =
            judge_at(silent, Some("10:00:00"), true, "10:12:10")
        else {
            panic!("silent for a boot window fails, pin or not");
        };
        assert_eq!(reason, MACHINE_GONE);
        assert!(message.contains("silent since 2026-03-04T09:59:30Z"), "{message}");

        let Verdict::Fail { message, .. } =
            judge_at(Kubelet::NoNode, Some("10:00:00"), false, "10:20:00")
        else {
            panic!("gone for a boot window fails");
        };
        assert!(message.contains("node m1 has been gone since 2026-03-04T10:00:00Z"), "{message}");
    }
}
