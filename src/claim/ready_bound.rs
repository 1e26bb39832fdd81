//! What bounds a ready claim once its boot is over: its machine, as its Node shows it. Pure.
//!
//! A machine whose kubelet is silent or whose Node is gone, for a whole boot window, fails the
//! claim `MachineGone` (a reboot fits in the window and is not an attempt that ends). A kubelet
//! that reports NotReady runs on a machine that is on and talking (a containerd upgrade, a CNI
//! outage): that is not "off". It has a bound of its own, `--not-ready-grace`, counted from the
//! Node's own transition to NotReady, and none at all under a pin, which a person holds on
//! purpose (decisions.md, D36).
//!
//! A silent kubelet on a machine whose plug's meter reads it drawing power, or whose BMC reports
//! it on, in a reading taken since the silence began and still fresh, is a machine on and cut
//! off from the API server: its claim is kept (decisions.md, D28, "Partitions").

use std::time::Duration;

use jiff::Timestamp;

use crate::api::duration::go_duration;
use crate::clock::plus;
use crate::machine::Kubelet;

/// The reason of a claim whose machine was silent or gone for a boot window.
pub const MACHINE_GONE: &str = "MachineGone";
/// The reason of a claim whose machine's kubelet reported NotReady past `--not-ready-grace`.
pub const MACHINE_NOT_READY: &str = "MachineNotReady";

/// The reason of the event on a claim whose silent machine its plug or BMC reads on.
pub const MACHINE_CUT_OFF: &str = "MachineCutOff";

/// What read the machine's power.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReadBy {
    /// The slot's plug meter: the machine is on above `on_above` watts (see [`on_above`]).
    Meter { watts: f64, on_above: f64 },
    /// The slot's BMC (Redfish or IPMI), which reports the power state itself.
    Bmc { on: bool },
}

/// The machine's power as the slot's plug meter or BMC last read it, as the judge reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerReading {
    pub by: ReadBy,
    pub read_at: Timestamp,
}

impl PowerReading {
    /// The slot's plug meter's last reading (`status.draw`), with the draw above which it reads
    /// the machine on; none for a slot without a meter or before its first reading.
    pub fn meter(slot: &crate::api::Node) -> Option<Self> {
        let draw = slot.status.as_ref()?.draw.as_ref()?;
        let on_above = on_above(slot.standby_watts(), slot.running_watts());
        Some(Self { by: ReadBy::Meter { watts: draw.watts, on_above }, read_at: draw.read_at.0 })
    }

    /// The slot's BMC's last reading (`status.bmcReading`).
    pub fn bmc(slot: &crate::api::Node) -> Option<Self> {
        let reading = slot.status.as_ref()?.bmc_reading.as_ref()?;
        let on = reading.power == crate::api::ObservedPower::On;
        Some(Self { by: ReadBy::Bmc { on }, read_at: reading.read_at.0 })
    }

    /// The newer of the slot's meter and BMC readings.
    pub fn of(slot: &crate::api::Node) -> Option<Self> {
        match (Self::meter(slot), Self::bmc(slot)) {
            (Some(meter), Some(bmc)) => Some(if bmc.read_at > meter.read_at { bmc } else { meter }),
            (meter, bmc) => meter.or(bmc),
        }
    }

    /// Whether the reading itself shows the machine on, however old it is.
    pub fn shows_on(&self) -> bool {
        match self.by {
            ReadBy::Meter { watts, on_above } => watts > on_above,
            ReadBy::Bmc { on } => on,
        }
    }

    /// Whether this reading shows the machine on now: no older than `max_age`, and on. Pure.
    pub fn is_on(&self, now: Timestamp, max_age: Duration) -> bool {
        now < plus(self.read_at, max_age) && self.shows_on()
    }

    /// [`Self::is_on`], in a reading taken at or after `since`. Pure.
    pub fn reads_on(&self, since: Timestamp, now: Timestamp, max_age: Duration) -> bool {
        self.read_at >= since && self.is_on(now, max_age)
    }

    /// What shows the machine on, for a message: "the slot's plug reads the machine drawing
    /// power (above 16.7 W)", or "the slot's BMC reports the machine powered on". No reading
    /// in it: it is the same while a cut lasts, so its event is one series, not one per read.
    pub fn shows(&self) -> String {
        match self.by {
            ReadBy::Meter { on_above, .. } => {
                format!("the slot's plug reads the machine drawing power (above {on_above:.1} W)")
            }
            ReadBy::Bmc { .. } => "the slot's BMC reports the machine powered on".into(),
        }
    }
}

/// The draw above which a machine counts as on: halfway between its standby draw (`whenOff`,
/// 0 if not declared) and its running draw (the last one metered while it served, else
/// `whenOn`), or 5 W above standby when no running draw is known. A machine halted on mains
/// draws its power supply's standby rail (a watt or two); a running one tens of watts. Pure.
pub fn on_above(standby: Option<f64>, running: Option<f64>) -> f64 {
    let standby = standby.unwrap_or(0.0).max(0.0);
    match running {
        Some(on) if on > standby => standby + (on - standby) / 2.0,
        _ => standby + 5.0,
    }
}

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
    /// The newest reading of the slot's plug meter or BMC, if it has either.
    pub reading: Option<PowerReading>,
    /// How long a reading counts (a few meter intervals).
    pub reading_max_age: Duration,
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
    /// The kubelet is silent but the plug or BMC reads the machine on: cut off, not off. The claim
    /// stays ready (any off mark is cleared); judge again at `wake_at`, when the reading goes
    /// stale.
    CutOff { mark: OffMark, message: String, wake_at: Timestamp },
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
            if let (Kubelet::Silent { since }, Some(reading)) = (kubelet, machine.reading) {
                let silent_from = since.or(observed_off).unwrap_or(now);
                let stale_at = plus(reading.read_at, machine.reading_max_age);
                if reading.reads_on(silent_from, now, machine.reading_max_age) {
                    let message = format!(
                        "the kubelet of node {node_name} has been silent since {silent_from}, but {}: the machine is on and cut off from the API server, not off. The claim is kept; the kubelet takes its node back when the network returns",
                        reading.shows()
                    );
                    return Verdict::CutOff { mark: on_mark, message, wake_at: stale_at };
                }
            }
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
            reading: None,
            reading_max_age: Duration::from_secs(180),
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
            Verdict::Keep { .. } | Verdict::CutOff { .. } => None,
        }
    }

    /// A silent kubelet whose plug reads the machine on: kept, as long as the reading was
    /// taken since the silence began, is fresh, and is above the machine's standby.
    #[test]
    fn a_silent_machine_its_plug_reads_on_is_cut_off_not_off() {
        let judge_with = |observed_off: Option<&str>, plug: Option<(f64, &str)>, now: &str| {
            let kubelet = Kubelet::Silent { since: Some(at("09:00:00")) };
            judge(&ReadyMachine {
                node_name: NODE,
                kubelet: &kubelet,
                observed_off: observed_off.map(at),
                pin: false,
                now: at(now),
                off_grace: Duration::from_secs(730),
                not_ready_grace: Duration::from_secs(3600),
                reading: plug.map(|(watts, read)| PowerReading {
                    by: ReadBy::Meter { watts, on_above: on_above(Some(1.4), Some(32.0)) },
                    read_at: at(read),
                }),
                reading_max_age: Duration::from_secs(180),
            })
        };
        let cut_off = |verdict: &Verdict| match verdict {
            Verdict::CutOff { mark, wake_at, message } => Some((*mark, *wake_at, message.clone())),
            _ => None,
        };
        type Row<'a> = (&'a str, Option<&'a str>, Option<(f64, &'a str)>, &'a str, Option<OffMark>);
        let rows: [Row; 7] = [
            ("no plug: the silence counts", Some("09:00:05"), None, "09:05:00", None),
            (
                "on, read since the silence",
                Some("09:00:05"),
                Some((32.0, "09:04:00")),
                "09:05:00",
                Some(OffMark::Clear),
            ),
            (
                "on, no off mark yet",
                None,
                Some((32.0, "09:00:30")),
                "09:01:00",
                Some(OffMark::Keep),
            ),
            (
                "on, but read before the silence began",
                Some("09:00:05"),
                Some((32.0, "08:59:00")),
                "09:01:00",
                None,
            ),
            (
                "on, but the reading is stale",
                Some("09:00:05"),
                Some((32.0, "09:01:00")),
                "09:05:00",
                None,
            ),
            ("at standby: off", Some("09:00:05"), Some((1.4, "09:04:00")), "09:05:00", None),
            (
                "past the window, still read on",
                Some("09:00:05"),
                Some((30.0, "09:14:00")),
                "09:15:00",
                Some(OffMark::Clear),
            ),
        ];
        for (name, observed_off, plug, now, want) in rows {
            let verdict = judge_with(observed_off, plug, now);
            assert_eq!(cut_off(&verdict).map(|(mark, ..)| mark), want, "{name}: {verdict:?}");
        }
        // Without the plug, past the window, the same silence fails the claim.
        assert_eq!(fails(&judge_with(Some("09:00:05"), None, "09:15:00")), Some(MACHINE_GONE));
        let (_, wake_at, message) =
            cut_off(&judge_with(None, Some((32.0, "09:00:30")), "09:01:00")).unwrap();
        assert_eq!(wake_at, at("09:03:30"), "judged again when the reading goes stale");
        assert!(message.contains("cut off from the API server, not off"), "{message}");
        assert!(message.contains("above 16.7 W"), "{message}");
    }

    /// A silent kubelet whose BMC reports the machine on: kept like a plug's reading, and the
    /// message names the BMC. A BMC reporting it off lets the silence count.
    #[test]
    fn a_silent_machine_its_bmc_reports_on_is_cut_off_not_off() {
        let judge_with = |on: bool, read: &str, now: &str| {
            let kubelet = Kubelet::Silent { since: Some(at("09:00:00")) };
            judge(&ReadyMachine {
                node_name: NODE,
                kubelet: &kubelet,
                observed_off: Some(at("09:00:05")),
                pin: false,
                now: at(now),
                off_grace: Duration::from_secs(730),
                not_ready_grace: Duration::from_secs(3600),
                reading: Some(PowerReading { by: ReadBy::Bmc { on }, read_at: at(read) }),
                reading_max_age: Duration::from_secs(180),
            })
        };
        let rows = [
            ("on, read since the silence, past the window", true, "09:14:00", "09:15:00", None),
            ("off: the silence counts", false, "09:14:00", "09:15:00", Some(MACHINE_GONE)),
            ("on, but stale", true, "09:10:00", "09:15:00", Some(MACHINE_GONE)),
            ("on, but read before the silence", true, "08:59:00", "09:01:00", None),
        ];
        for (name, on, read, now, want) in rows {
            let verdict = judge_with(on, read, now);
            assert_eq!(fails(&verdict), want, "{name}: {verdict:?}");
        }
        let before = judge_with(true, "08:59:00", "09:01:00");
        assert!(
            matches!(before, Verdict::Keep { .. }),
            "within the window, not cut off: {before:?}"
        );
        let Verdict::CutOff { message, .. } = judge_with(true, "09:14:00", "09:15:00") else {
            panic!("cut off")
        };
        assert!(message.contains("the slot's BMC reports the machine powered on"), "{message}");
    }

    /// The judge reads the newer of a slot's meter and BMC readings.
    #[test]
    fn the_newer_of_the_meter_and_the_bmc_reading_counts() {
        let slot = |draw_at: Option<&str>, bmc: Option<(&str, &str)>| -> crate::api::Node {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "m1" },
                "spec": { "kubernetesNodeName": "m1", "power": { "watts": { "whenOn": 32.0, "whenOff": 1.4 } } },
                "status": {
                    "draw": draw_at.map(|t| serde_json::json!({ "watts": 1.4, "readAt": format!("2026-03-04T{t}Z") })),
                    "bmcReading": bmc.map(|(power, t)| serde_json::json!({ "power": power, "readAt": format!("2026-03-04T{t}Z") })),
                },
            }))
            .unwrap()
        };
        let rows = [
            ("neither", slot(None, None), None),
            ("the meter alone, at standby", slot(Some("09:00:00"), None), Some(false)),
            ("the BMC alone", slot(None, Some(("on", "09:00:00"))), Some(true)),
            ("the BMC newer", slot(Some("09:00:00"), Some(("on", "09:01:00"))), Some(true)),
            ("the meter newer", slot(Some("09:02:00"), Some(("on", "09:01:00"))), Some(false)),
        ];
        for (name, slot, want) in rows {
            let got = PowerReading::of(&slot).map(|r| r.shows_on());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_machine_is_on_above_halfway_to_its_running_draw() {
        let rows = [
            ("standby and running known", Some(1.4), Some(32.0), 16.7),
            ("no standby declared", None, Some(30.0), 15.0),
            ("no running draw known", Some(2.0), None, 7.0),
            ("nothing known", None, None, 5.0),
            ("a running draw below standby is no guide", Some(10.0), Some(4.0), 15.0),
        ];
        for (name, standby, running, want) in rows {
            let got = on_above(standby, running);
            assert!((got - want).abs() < 1e-9, "{name}: {got} != {want}");
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
