//! The grammar of a schedule window, as written in `Group.spec.schedules[]`:
//!
//! - `days`: `daily`, or a comma-separated list of items, each a day (`Mon`, `Tue`, `Wed`,
//!   `Thu`, `Fri`, `Sat`, `Sun`, any case) or a range of days (`Mon-Fri`; a range whose end comes
//!   before its start wraps over the weekend, so `Fri-Mon` is Fri, Sat, Sun, Mon). Spaces around
//!   items are ignored.
//! - `from`, `to`: `HH:MM` or `HH:MM:SS` on a 24-hour clock (`00:00` to `23:59:59`).
//! - `timeZone`: an IANA name (`Europe/Berlin`, `UTC`), looked up in the time-zone database
//!   built into the binary.

use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;

use crate::api::ScheduleWindow;

/// What is wrong with a window as written; each message says what to write instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error(
        "days: {0:?} is not a day list; write days as Mon, Tue, Wed, Thu, Fri, Sat or Sun, ranges \
         such as Mon-Fri, lists such as Mon,Wed-Fri, or daily"
    )]
    Days(String),
    #[error(
        "{field}: {value:?} is not a time of day; write HH:MM or HH:MM:SS on a 24-hour clock, \
         such as 08:00 or 18:30:15 (midnight is 00:00)"
    )]
    Time { field: &'static str, value: String },
    #[error(
        "timeZone: {0:?} is not an IANA time zone; write a name such as Europe/Berlin, \
         America/New_York or UTC"
    )]
    Zone(String),
    #[error("minMachines: {0} is below 1; a window keeps at least one machine on")]
    MinMachines(i32),
}

/// A set of weekdays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Days(u8);

impl Days {
    pub const ALL: Days = Days(0b111_1111);

    pub fn contains(self, day: Weekday) -> bool {
        self.0 & bit(day) != 0
    }

    /// Parses the `days` grammar (see the module's documentation).
    pub fn parse(text: &str) -> Result<Days, GrammarError> {
        let wrong = || GrammarError::Days(text.to_string());
        if text.trim().eq_ignore_ascii_case("daily") {
            return Ok(Days::ALL);
        }
        let mut days = 0u8;
        for item in text.split(',') {
            let item = item.trim();
            match item.split_once('-') {
                Some((first, last)) => {
                    let (first, last) =
                        (day(first.trim()).ok_or_else(wrong)?, day(last.trim()).ok_or_else(wrong)?);
                    let mut at = first;
                    loop {
                        days |= bit(at);
                        if at == last {
                            break;
                        }
                        at = at.next();
                    }
                }
                None => days |= bit(day(item).ok_or_else(wrong)?),
            }
        }
        Ok(Days(days))
    }
}

fn bit(day: Weekday) -> u8 {
    1 << day.to_monday_zero_offset()
}

fn day(name: &str) -> Option<Weekday> {
    const NAMES: [(&str, Weekday); 7] = [
        ("mon", Weekday::Monday),
        ("tue", Weekday::Tuesday),
        ("wed", Weekday::Wednesday),
        ("thu", Weekday::Thursday),
        ("fri", Weekday::Friday),
        ("sat", Weekday::Saturday),
        ("sun", Weekday::Sunday),
    ];
    NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, d)| *d)
}

/// Parses `HH:MM` or `HH:MM:SS`, two digits each.
pub fn time_of_day(field: &'static str, text: &str) -> Result<Time, GrammarError> {
    let wrong = || GrammarError::Time { field, value: text.to_string() };
    let parts: Vec<&str> = text.split(':').collect();
    if !(2..=3).contains(&parts.len())
        || parts.iter().any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(wrong());
    }
    let number = |i: usize| parts.get(i).map_or(Ok(0), |p| p.parse::<i8>().map_err(|_| wrong()));
    let (hour, minute, second) = (number(0)?, number(1)?, number(2)?);
    Time::new(hour, minute, second, 0).map_err(|_| wrong())
}

/// A window read: its days, its local times and its zone, with the label people see.
#[derive(Clone, Debug)]
pub struct Window {
    pub days: Days,
    pub from: Time,
    pub to: Time,
    pub zone: TimeZone,
    /// `<days> <from>-<to> <timeZone>`, as written.
    pub label: String,
}

impl Window {
    /// Reads a window; every problem is reported, not only the first.
    pub fn parse(window: &ScheduleWindow) -> Result<Window, Vec<GrammarError>> {
        let days = Days::parse(&window.days);
        let from = time_of_day("from", &window.from);
        let to = time_of_day("to", &window.to);
        let zone = TimeZone::get(&window.time_zone)
            .map_err(|_| GrammarError::Zone(window.time_zone.clone()));
        let min = if window.min_machines < 1 {
            Err(GrammarError::MinMachines(window.min_machines))
        } else {
            Ok(())
        };
        match (days, from, to, zone, min) {
            (Ok(days), Ok(from), Ok(to), Ok(zone), Ok(())) => {
                Ok(Window { days, from, to, zone, label: label(window) })
            }
            (days, from, to, zone, min) => {
                Err([days.err(), from.err(), to.err(), zone.err(), min.err()]
                    .into_iter()
                    .flatten()
                    .collect())
            }
        }
    }
}

/// How a window is named to people: `Mon-Fri 08:00-18:00 Europe/Berlin`.
pub fn label(window: &ScheduleWindow) -> String {
    format!("{} {}-{} {}", window.days.trim(), window.from, window.to, window.time_zone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Weekday::*;

    fn set(days: &[Weekday]) -> Days {
        Days(days.iter().fold(0, |acc, d| acc | bit(*d)))
    }

    #[test]
    fn days_grammar() {
        let table: [(&str, Option<Days>); 14] = [
            ("Mon-Fri", Some(set(&[Monday, Tuesday, Wednesday, Thursday, Friday]))),
            ("Sat,Sun", Some(set(&[Saturday, Sunday]))),
            ("Mon,Wed-Fri", Some(set(&[Monday, Wednesday, Thursday, Friday]))),
            ("daily", Some(Days::ALL)),
            ("Daily", Some(Days::ALL)),
            ("mon - wed , SUN", Some(set(&[Monday, Tuesday, Wednesday, Sunday]))),
            ("Fri-Mon", Some(set(&[Friday, Saturday, Sunday, Monday]))),
            ("Sun-Sat", Some(Days::ALL)),
            ("Wed", Some(set(&[Wednesday]))),
            ("", None),
            ("Mon,", None),
            ("Monday", None),
            ("Mon-", None),
            ("weekdays", None),
        ];
        for (text, want) in table {
            assert_eq!(Days::parse(text).ok(), want, "{text:?}");
        }
        assert!(!set(&[Saturday, Sunday]).contains(Monday));
        assert!(set(&[Saturday, Sunday]).contains(Sunday));
    }

    #[test]
    fn times_of_day() {
        let table = [
            ("08:00", Some((8, 0, 0))),
            ("00:00", Some((0, 0, 0))),
            ("23:59:59", Some((23, 59, 59))),
            ("18:30:15", Some((18, 30, 15))),
            ("24:00", None),
            ("8:00", None),
            ("08:60", None),
            ("08:00:60", None),
            ("0800", None),
            ("08:00:00:00", None),
            ("+8:00", None),
            ("ab:cd", None),
            ("", None),
        ];
        for (text, want) in table {
            let got = time_of_day("from", text).ok().map(|t| (t.hour(), t.minute(), t.second()));
            assert_eq!(got, want, "{text:?}");
        }
        let error = time_of_day("to", "25:00").unwrap_err().to_string();
        assert!(error.starts_with("to: \"25:00\" is not a time of day; write HH:MM"), "{error}");
    }

    fn written(days: &str, from: &str, to: &str, zone: &str, min: i32) -> ScheduleWindow {
        crate::fixtures::window(days, from, to, zone, min, &[])
    }

    #[test]
    fn a_window_reads_or_says_every_problem() {
        let good =
            Window::parse(&written("Mon-Fri", "08:00", "18:00", "Europe/Berlin", 1)).unwrap();
        assert_eq!(good.label, "Mon-Fri 08:00-18:00 Europe/Berlin");
        assert_eq!(good.zone.iana_name(), Some("Europe/Berlin"));
        let errors =
            Window::parse(&written("Mon-Fry", "8", "18:00", "Europe/Berln", 0)).unwrap_err();
        assert_eq!(
            errors,
            vec![
                GrammarError::Days("Mon-Fry".into()),
                GrammarError::Time { field: "from", value: "8".into() },
                GrammarError::Zone("Europe/Berln".into()),
                GrammarError::MinMachines(0),
            ]
        );
        assert!(Window::parse(&written("daily", "00:00", "00:00", "UTC", 3)).is_ok());
    }
}
