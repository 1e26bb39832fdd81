//! A pool's `status.power`, one reading at a time: the source and since when, the outage's
//! start (kept across a moment unread, so a lost reading neither restarts the shedding delay nor
//! ends the outage), and the time mains returned (which starts the staggered return).

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::reading::UpsReading;
use crate::api::{GroupPowerStatus, PowerSource, UpsPolicy};

/// How long the staggered return lasts unless the pool says.
pub const DEFAULT_STAGGER_FOR: SignedDuration = SignedDuration::from_mins(10);
/// How often an unchanged status is written again, so its `readAt` shows the reader alive.
pub const HEARTBEAT: SignedDuration = SignedDuration::from_secs(60);

/// The status after one attempt to read the UPS named `ups`: its reading, or why there is none.
pub fn next(
    previous: Option<&GroupPowerStatus>,
    ups: &str,
    read: Result<&UpsReading, String>,
    policy: &UpsPolicy,
    now: Timestamp,
) -> GroupPowerStatus {
    // A new UPS name starts from nothing: another UPS's outage is not this one's.
    let previous = previous.filter(|p| p.ups == ups);
    let since_if = |source: PowerSource| {
        previous.filter(|p| p.source == source).and_then(|p| p.since.clone()).unwrap_or(Time(now))
    };
    let outage = previous.and_then(|p| p.on_battery_since.clone());
    let returned = previous.and_then(|p| p.mains_returned_at.clone());
    let read = read.and_then(|r| r.source().map(|source| (r, source)));
    let mut status = match read {
        Ok((reading, source)) => {
            let on_battery = matches!(source, PowerSource::Battery | PowerSource::LowBattery);
            GroupPowerStatus {
                ups: ups.to_owned(),
                source,
                summary: String::new(),
                since: Some(since_if(source)),
                on_battery_since: on_battery.then(|| outage.clone().unwrap_or(Time(now))),
                mains_returned_at: match source {
                    PowerSource::Mains if outage.is_some() => Some(Time(now)),
                    PowerSource::Mains => returned.filter(|at| now < at.0 + stagger_for(policy)),
                    _ => None,
                },
                read_at: Some(Time(now)),
                ups_status: Some(reading.status.clone()),
                charge_percent: reading.charge_percent,
                runtime_seconds: reading.runtime_seconds,
                load_percent: reading.load_percent,
                pool_watts: None,
                message: None,
            }
        }
        Err(why) => {
            let kept = previous.cloned().unwrap_or_default();
            GroupPowerStatus {
                ups: ups.to_owned(),
                source: PowerSource::Unread,
                since: Some(since_if(PowerSource::Unread)),
                on_battery_since: outage,
                mains_returned_at: returned,
                message: Some(why),
                ..kept
            }
        }
    };
    status.summary = summary(&status);
    status
}

/// How long the staggered return lasts.
pub fn stagger_for(policy: &UpsPolicy) -> SignedDuration {
    policy
        .on_mains
        .stagger_for
        .and_then(|d| SignedDuration::try_from(std::time::Duration::from(d)).ok())
        .unwrap_or(DEFAULT_STAGGER_FOR)
}

/// The one line `kubectl get hgroup` shows.
pub fn summary(status: &GroupPowerStatus) -> String {
    let battery = |word: &str| {
        let mut out = word.to_owned();
        if let Some(charge) = status.charge_percent {
            out.push_str(&format!(" {charge:.0}%"));
        }
        if let Some(runtime) = status.runtime_seconds {
            out.push_str(&format!(
                "{} {}m",
                if status.charge_percent.is_some() { "," } else { "" },
                runtime / 60
            ));
        }
        out
    };
    match status.source {
        PowerSource::Mains if status.mains_returned_at.is_some() => "mains (returning)".to_owned(),
        PowerSource::Mains => "mains".to_owned(),
        PowerSource::Battery => battery("battery"),
        PowerSource::LowBattery => battery("low battery"),
        PowerSource::Unread => match &status.since {
            Some(since) => format!("unread since {}", since.0.strftime("%H:%M:%S")),
            None => "unread".to_owned(),
        },
    }
}

/// Whether `next` says something `previous` did not, so it is worth a write: any field but the
/// read time, and the read time once it is a heartbeat old.
pub fn worth_writing(
    previous: Option<&GroupPowerStatus>,
    next: &GroupPowerStatus,
    now: Timestamp,
) -> bool {
    let Some(previous) = previous else { return true };
    let without_read = |s: &GroupPowerStatus| GroupPowerStatus { read_at: None, ..s.clone() };
    if without_read(previous) != without_read(next) {
        return true;
    }
    match (&previous.read_at, &next.read_at) {
        (Some(before), Some(after)) => {
            after.0 != before.0 && now.duration_since(before.0) >= HEARTBEAT
        }
        (None, Some(_)) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    fn policy() -> UpsPolicy {
        UpsPolicy {
            name: "ups@nut:3493".into(),
            credentials_secret: None,
            poll_interval: None,
            on_battery: Default::default(),
            on_mains: Default::default(),
        }
    }

    fn reading(status: &str, charge: f64, runtime: i64) -> UpsReading {
        UpsReading {
            status: status.into(),
            charge_percent: Some(charge),
            runtime_seconds: Some(runtime),
            load_percent: Some(20.0),
        }
    }

    /// The statuses after a sequence of readings (`None`: unread), one per minute.
    fn run(readings: &[Option<UpsReading>]) -> Vec<GroupPowerStatus> {
        let mut previous: Option<GroupPowerStatus> = None;
        let mut out = Vec::new();
        for (minute, read) in readings.iter().enumerate() {
            let now = at("2026-12-06T10:00:00Z") + SignedDuration::from_mins(minute as i64);
            let read = read.as_ref().ok_or_else(|| "connection refused".to_owned());
            let next = next(previous.as_ref(), "ups@nut:3493", read, &policy(), now);
            previous = Some(next.clone());
            out.push(next);
        }
        out
    }

    #[test]
    fn an_outage_is_timed_from_its_start_through_a_moment_unread() {
        let s = run(&[
            Some(reading("OL", 100.0, 3600)),
            Some(reading("OB DISCHRG", 90.0, 1800)),
            None,
            Some(reading("OB DISCHRG", 70.0, 1200)),
            Some(reading("OB LB", 9.0, 120)),
            Some(reading("OL CHRG", 10.0, 300)),
            Some(reading("OL CHRG", 20.0, 600)),
        ]);
        let sources: Vec<PowerSource> = s.iter().map(|s| s.source).collect();
        use PowerSource::*;
        assert_eq!(sources, [Mains, Battery, Unread, Battery, LowBattery, Mains, Mains]);
        let outage = Some(Time(at("2026-12-06T10:01:00Z")));
        assert_eq!(s[1].on_battery_since, outage);
        assert_eq!(s[2].on_battery_since, outage, "a lost reading keeps the outage");
        assert_eq!(s[3].on_battery_since, outage, "and does not restart it");
        assert_eq!(s[4].on_battery_since, outage);
        assert_eq!(s[3].since, Some(Time(at("2026-12-06T10:03:00Z"))), "the source's own since");
        assert_eq!(s[5].on_battery_since, None);
        assert_eq!(s[5].mains_returned_at, Some(Time(at("2026-12-06T10:05:00Z"))));
        assert_eq!(s[6].mains_returned_at, s[5].mains_returned_at, "the return is kept");
        assert_eq!(s[0].mains_returned_at, None, "mains without an outage is no return");
        assert_eq!(s[2].charge_percent, Some(90.0), "unread keeps the last values");
        assert_eq!(s[2].message.as_deref(), Some("connection refused"));
        assert_eq!(s[2].read_at, Some(Time(at("2026-12-06T10:01:00Z"))), "and the last read");
        let summaries: Vec<&str> = s.iter().map(|s| s.summary.as_str()).collect();
        assert_eq!(
            summaries,
            [
                "mains",
                "battery 90%, 30m",
                "unread since 10:02:00",
                "battery 70%, 20m",
                "low battery 9%, 2m",
                "mains (returning)",
                "mains (returning)"
            ]
        );
    }

    #[test]
    fn the_return_ends_after_its_window() {
        let mut readings = vec![Some(reading("OB", 50.0, 600)), Some(reading("OL", 50.0, 600))];
        readings.extend(std::iter::repeat_n(Some(reading("OL", 60.0, 900)), 10));
        let s = run(&readings);
        assert!(s[10].mains_returned_at.is_some(), "9 minutes after the return");
        assert_eq!(s[11].mains_returned_at, None, "10 minutes after");
        assert_eq!(s[11].summary, "mains");
    }

    #[test]
    fn a_status_without_a_source_flag_is_unread() {
        let s = run(&[Some(reading("OFF", 100.0, 3600))]);
        assert_eq!(s[0].source, PowerSource::Unread);
        assert!(s[0].message.as_deref().unwrap_or_default().contains("neither OL"));
    }

    #[test]
    fn only_a_change_or_a_heartbeat_is_written() {
        let t0 = at("2026-12-06T10:00:00Z");
        let read = reading("OL", 100.0, 3600);
        let first = next(None, "ups@nut:3493", Ok(&read), &policy(), t0);
        assert!(worth_writing(None, &first, t0));
        let later = |secs| t0 + SignedDuration::from_secs(secs);
        let same = next(Some(&first), "ups@nut:3493", Ok(&read), &policy(), later(5));
        assert!(!worth_writing(Some(&first), &same, later(5)));
        let beat = next(Some(&first), "ups@nut:3493", Ok(&read), &policy(), later(60));
        assert!(worth_writing(Some(&first), &beat, later(60)));
        let changed =
            next(Some(&first), "ups@nut:3493", Ok(&reading("OL", 99.0, 3600)), &policy(), later(5));
        assert!(worth_writing(Some(&first), &changed, later(5)));
    }
}
