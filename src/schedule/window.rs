//! When a window is open. An opening starts on each listed day at `from`, local time, and ends
//! at `to` the same day, or the next day when `to` is not after `from` (`to == from` is a whole
//! day); an opening belongs to the day it starts on. Openings are half-open: open at their start,
//! closed at their end. Openings that touch (a daily window `00:00`-`00:00`, or `Fri 18:00`-
//! `Sat 00:00` and `Sat 00:00`-...) read as one, so a machine is not released and started again
//! at the seam.
//!
//! Local times become instants so that no window ever loses a day to the clocks:
//! - a start in a spring-forward gap opens at the first instant after the gap (on the day Berlin
//!   jumps from 02:00 to 03:00, a window from 02:30 opens at 03:00 CEST, not an hour late);
//! - an end in a gap is read with jiff's `Disambiguation::Compatible` (the rule of RFC 5545 and
//!   JavaScript's Temporal): with the offset before the gap, moved forward by the gap's length, so
//!   a window wholly inside the gap keeps its length after it, and one that starts in the gap
//!   and ends after it (`02:30`-`03:15`) still opens, from 03:00 to 03:15 CEST; a window the
//!   clocks skip whole (`02:00`-`03:00`) opens after the gap for its wall-clock length;
//! - a local time in a fall-back fold is the earlier of its two instants (02:30 on the day Berlin
//!   falls back is 02:30 CEST).
//!
//! A window's real length follows: `00:00`-`00:00` lasts 23 hours on the spring-forward day and
//! 25 hours on the fall-back day.

use jiff::Timestamp;
use jiff::civil::{Date, Time};
use jiff::tz::AmbiguousOffset;

use super::grammar::Window;

/// One opening of a window (or several that touch), `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opening {
    pub start: Timestamp,
    pub end: Timestamp,
}

impl Opening {
    pub fn contains(&self, at: Timestamp) -> bool {
        self.start <= at && at < self.end
    }
}

/// A window at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Open since `since` until `until` (the current opening); it opens again at `next`.
    Open { since: Timestamp, until: Timestamp, next: Option<Timestamp> },
    /// Closed; it opens at `next`.
    Closed { next: Option<Timestamp> },
}

impl State {
    /// The next instant at which the window opens or closes.
    pub fn boundary(&self) -> Option<Timestamp> {
        match *self {
            State::Open { until, .. } => Some(until),
            State::Closed { next } => next,
        }
    }
}

/// How far ahead the state looks for the end of an opening and the next start. A window with
/// any day opens at least once a week; an always-open window reads as open until this horizon,
/// and the schedule extends its claims as the horizon moves.
pub const HORIZON_DAYS: i64 = 8;

impl Window {
    /// The single opening that starts on `day`, if the window lists that day.
    fn opening_on(&self, day: Date) -> Option<Opening> {
        if !self.days.contains(day.weekday()) {
            return None;
        }
        let end_day = if self.to > self.from { day } else { day.tomorrow().ok()? };
        let start = self.opening_instant(day, self.from)?;
        let end =
            self.zone.to_ambiguous_timestamp(end_day.to_datetime(self.to)).compatible().ok()?;
        if end > start {
            return Some(Opening { start, end });
        }
        // The clocks skipped the whole window (02:00-03:00 on the day they jump from 02:00 to
        // 03:00): it opens after the gap for as long as it lasts on the wall clock.
        let length = day.to_datetime(self.from).duration_until(end_day.to_datetime(self.to));
        let end = start.checked_add(length).ok()?;
        (end > start).then_some(Opening { start, end })
    }

    /// The instant a window opens at local `time` on `date`: the first that is not before it,
    /// which for a time the clocks skip is the moment they land after the gap.
    fn opening_instant(&self, date: Date, time: Time) -> Option<Timestamp> {
        let local = self.zone.to_ambiguous_timestamp(date.to_datetime(time));
        if let AmbiguousOffset::Gap { .. } = local.offset() {
            // Read with the offset after the gap, the local time lands before the transition.
            let before_the_gap = local.earlier().ok()?;
            return self.zone.following(before_the_gap).next().map(|t| t.timestamp());
        }
        local.compatible().ok()
    }

    /// The openings that start on the local days `first` through `last`, touching ones joined.
    pub fn openings(&self, first: Date, last: Date) -> Vec<Opening> {
        let mut runs: Vec<Opening> = Vec::new();
        let mut day = first;
        while day <= last {
            if let Some(opening) = self.opening_on(day) {
                match runs.last_mut() {
                    Some(run) if opening.start <= run.end => run.end = run.end.max(opening.end),
                    _ => runs.push(opening),
                }
            }
            match day.tomorrow() {
                Ok(next) => day = next,
                Err(_) => break,
            }
        }
        runs
    }

    /// The openings around `at`: from two local days before it (an opening started yesterday
    /// may still run) to [`HORIZON_DAYS`] after.
    fn openings_around(&self, at: Timestamp) -> Vec<Opening> {
        let today = self.zone.to_datetime(at).date();
        let first = today.checked_sub(jiff::Span::new().days(2)).unwrap_or(today);
        let last = today.checked_add(jiff::Span::new().days(HORIZON_DAYS)).unwrap_or(today);
        self.openings(first, last)
    }

    /// Whether the window is open at `at`, until when, and when it opens next.
    pub fn state_at(&self, at: Timestamp) -> State {
        let runs = self.openings_around(at);
        let next = runs.iter().find(|r| r.start > at).map(|r| r.start);
        match runs.iter().find(|r| r.contains(at)) {
            Some(run) => State::Open { since: run.start, until: run.end, next },
            None => State::Closed { next },
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::api::ScheduleWindow;

    /// A window parsed from its fields, with one machine and any slot.
    pub(in crate::schedule) fn window(days: &str, from: &str, to: &str, zone: &str) -> Window {
        Window::parse(&ScheduleWindow {
            days: days.into(),
            from: from.into(),
            to: to.into(),
            time_zone: zone.into(),
            min_machines: 1,
            slots: vec![],
        })
        .unwrap()
    }

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// The window's state at `at`, as (open, until or next) in UTC.
    fn state(w: &Window, at: &str) -> State {
        w.state_at(ts(at))
    }

    fn open(since: &str, until: &str, next: &str) -> State {
        State::Open { since: ts(since), until: ts(until), next: Some(ts(next)) }
    }

    fn closed(next: &str) -> State {
        State::Closed { next: Some(ts(next)) }
    }

    #[test]
    fn working_hours_in_berlin() {
        let w = window("Mon-Fri", "08:00", "18:00", "Europe/Berlin");
        // 2026-12-07 is a Monday; Berlin is UTC+1 in winter.
        let table = [
            ("2026-12-07T06:59:59Z", closed("2026-12-07T07:00:00Z")),
            (
                "2026-12-07T07:00:00Z",
                open("2026-12-07T07:00:00Z", "2026-12-07T17:00:00Z", "2026-12-08T07:00:00Z"),
            ),
            (
                "2026-12-07T16:59:59Z",
                open("2026-12-07T07:00:00Z", "2026-12-07T17:00:00Z", "2026-12-08T07:00:00Z"),
            ),
            ("2026-12-07T17:00:00Z", closed("2026-12-08T07:00:00Z")),
            // Friday evening: the next opening is Monday.
            ("2026-12-11T17:30:00Z", closed("2026-12-14T07:00:00Z")),
            // Sunday: closed.
            ("2026-12-13T12:00:00Z", closed("2026-12-14T07:00:00Z")),
            // Summer: UTC+2.
            (
                "2026-07-01T06:30:00Z",
                open("2026-07-01T06:00:00Z", "2026-07-01T16:00:00Z", "2026-07-02T06:00:00Z"),
            ),
        ];
        for (at, want) in table {
            assert_eq!(state(&w, at), want, "at {at}");
        }
    }

    #[test]
    fn weekends_and_day_lists() {
        let weekend = window("Sat,Sun", "10:00", "12:00", "UTC");
        let wed_to_fri = window("Mon,Wed-Fri", "10:00", "12:00", "UTC");
        // 2026-12-05 is a Saturday, 2026-12-08 a Tuesday.
        let table = [
            (
                &weekend,
                "2026-12-05T11:00:00Z",
                open("2026-12-05T10:00:00Z", "2026-12-05T12:00:00Z", "2026-12-06T10:00:00Z"),
            ),
            (&weekend, "2026-12-06T12:00:00Z", closed("2026-12-12T10:00:00Z")),
            (&weekend, "2026-12-07T11:00:00Z", closed("2026-12-12T10:00:00Z")),
            (
                &wed_to_fri,
                "2026-12-07T11:00:00Z",
                open("2026-12-07T10:00:00Z", "2026-12-07T12:00:00Z", "2026-12-09T10:00:00Z"),
            ),
            (&wed_to_fri, "2026-12-08T11:00:00Z", closed("2026-12-09T10:00:00Z")),
            (&wed_to_fri, "2026-12-11T13:00:00Z", closed("2026-12-14T10:00:00Z")),
        ];
        for (w, at, want) in table {
            assert_eq!(state(w, at), want, "{} at {at}", w.label);
        }
    }

    #[test]
    fn a_window_across_midnight_belongs_to_the_day_it_starts() {
        // A NAS backup Fri and Sat nights, 23:00 to 02:00 Berlin time.
        let w = window("Fri,Sat", "23:00", "02:00", "Europe/Berlin");
        // 2026-12-11 is a Friday: 23:00 CET = 22:00Z; it ends Saturday 01:00Z.
        let table = [
            ("2026-12-11T21:59:59Z", closed("2026-12-11T22:00:00Z")),
            (
                "2026-12-11T23:30:00Z",
                open("2026-12-11T22:00:00Z", "2026-12-12T01:00:00Z", "2026-12-12T22:00:00Z"),
            ),
            // Sunday 00:30 local belongs to Saturday's opening.
            (
                "2026-12-12T23:30:00Z",
                open("2026-12-12T22:00:00Z", "2026-12-13T01:00:00Z", "2026-12-18T22:00:00Z"),
            ),
            // Friday 00:30 local: Thursday is not listed, so closed.
            ("2026-12-10T23:30:00Z", closed("2026-12-11T22:00:00Z")),
        ];
        for (at, want) in table {
            assert_eq!(state(&w, at), want, "at {at}");
        }
    }

    /// Real hours of the opening that starts on `day`.
    fn hours_on(w: &Window, day: Date) -> f64 {
        let opening = w.opening_on(day).unwrap();
        (opening.end.as_second() - opening.start.as_second()) as f64 / 3600.0
    }

    #[test]
    fn daylight_saving_changes() {
        let date = |y, m, d| jiff::civil::date(y, m, d);
        let berlin_day = window("daily", "00:00", "00:00", "Europe/Berlin");
        let ny_day = window("daily", "00:00", "00:00", "America/New_York");
        let berlin_night = window("daily", "22:00", "06:00", "Europe/Berlin");
        let berlin_office = window("daily", "08:00", "18:00", "Europe/Berlin");
        let table = [
            // Berlin: last Sunday of March (23 h) and of October (25 h).
            (&berlin_day, date(2026, 3, 29), 23.0),
            (&berlin_day, date(2026, 10, 25), 25.0),
            (&berlin_day, date(2026, 10, 24), 24.0),
            // New York: second Sunday of March, first Sunday of November.
            (&ny_day, date(2026, 3, 8), 23.0),
            (&ny_day, date(2026, 11, 1), 25.0),
            // A night window across the change: the Saturday night loses or gains the hour.
            (&berlin_night, date(2026, 3, 28), 7.0),
            (&berlin_night, date(2026, 10, 24), 9.0),
            // Daytime hours are not touched by a change at night.
            (&berlin_office, date(2026, 3, 29), 10.0),
        ];
        for (w, day, hours) in table {
            assert_eq!(hours_on(w, day), hours, "{} on {day}", w.label);
        }
    }

    #[test]
    fn local_times_in_a_gap_or_a_fold() {
        // Berlin 2026-03-29: 02:00 CET jumps to 03:00 CEST. 02:30 does not exist: a window
        // from it opens at the first instant after the gap, 03:00 CEST.
        let gap = window("Sun", "02:30", "04:00", "Europe/Berlin");
        let opening = gap.opening_on(jiff::civil::date(2026, 3, 29)).unwrap();
        assert_eq!(opening.start, ts("2026-03-29T01:00:00Z"));
        assert_eq!(opening.end, ts("2026-03-29T02:00:00Z"));
        // New York 2026-03-08: 02:00 EST jumps to 03:00 EDT; a window wholly inside the gap
        // keeps its length, after the gap.
        let inside = window("Sun", "02:00", "02:30", "America/New_York");
        let opening = inside.opening_on(jiff::civil::date(2026, 3, 8)).unwrap();
        assert_eq!(opening.start, ts("2026-03-08T07:00:00Z"));
        assert_eq!(opening.end, ts("2026-03-08T07:30:00Z"));
        // Berlin 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice and the
        // earlier (CEST, 00:30Z) is taken.
        let fold = window("Sun", "02:30", "05:00", "Europe/Berlin");
        let opening = fold.opening_on(jiff::civil::date(2026, 10, 25)).unwrap();
        assert_eq!(opening.start, ts("2026-10-25T00:30:00Z"));
        assert_eq!(opening.end, ts("2026-10-25T04:00:00Z"));
        // New York 2026-11-01: 01:30 happens twice; EDT (05:30Z) is the earlier.
        let fold = window("Sun", "01:30", "03:00", "America/New_York");
        let opening = fold.opening_on(jiff::civil::date(2026, 11, 1)).unwrap();
        assert_eq!(opening.start, ts("2026-11-01T05:30:00Z"));
        assert_eq!(opening.end, ts("2026-11-01T08:00:00Z"));
    }

    #[test]
    fn a_window_around_a_spring_forward_gap_still_opens_that_day() {
        // from, to, zone, the spring-forward day, opening start and end (UTC)
        let table = [
            ("02:30", "03:15", "Europe/Berlin", (2027, 3, 28), "01:00", "01:15"),
            ("02:45", "03:30", "Europe/Berlin", (2027, 3, 28), "01:00", "01:30"),
            ("02:00", "03:00", "Europe/Berlin", (2027, 3, 28), "01:00", "02:00"),
            ("01:30", "02:30", "Europe/Berlin", (2027, 3, 28), "00:30", "01:30"),
            ("02:30", "03:15", "America/New_York", (2027, 3, 14), "07:00", "07:15"),
            ("02:45", "03:30", "America/New_York", (2027, 3, 14), "07:00", "07:30"),
            ("02:00", "02:30", "America/New_York", (2027, 3, 14), "07:00", "07:30"),
        ];
        for (from, to, zone, (y, m, d), start, end) in table {
            let w = window("daily", from, to, zone);
            let day = jiff::civil::date(y, m, d);
            let label = format!("{from}-{to} in {zone} on {day}");
            let at = |hm: &str| ts(&format!("{day}T{hm}:00Z"));
            let opening = w.opening_on(day).unwrap_or_else(|| panic!("{label}: no opening"));
            assert_eq!((opening.start, opening.end), (at(start), at(end)), "{label}");
            assert!(matches!(w.state_at(at(start)), State::Open { .. }), "{label}");
        }
    }

    #[test]
    fn equal_from_and_to_is_a_whole_day_and_touching_openings_join() {
        let always = window("daily", "00:00", "00:00", "UTC");
        match always.state_at(ts("2026-12-07T12:00:00Z")) {
            State::Open { until, next, .. } => {
                // One run to the horizon, no gap to open again.
                assert!(until >= ts("2026-12-15T00:00:00Z"), "{until}");
                assert_eq!(next, None);
            }
            other => panic!("an always-open window reads {other:?}"),
        }
        // Fri 18:00 to Sat 18:00, and Sat 18:00 to Sun 18:00: one run Friday to Sunday.
        let weekend = window("Fri,Sat", "18:00", "18:00", "UTC");
        assert_eq!(
            state(&weekend, "2026-12-11T20:00:00Z"),
            open("2026-12-11T18:00:00Z", "2026-12-13T18:00:00Z", "2026-12-18T18:00:00Z")
        );
    }

    #[test]
    fn a_state_names_its_next_boundary() {
        let w = window("daily", "08:00", "09:00", "UTC");
        assert_eq!(state(&w, "2026-12-07T08:30:00Z").boundary(), Some(ts("2026-12-07T09:00:00Z")));
        assert_eq!(state(&w, "2026-12-07T10:00:00Z").boundary(), Some(ts("2026-12-08T08:00:00Z")));
    }
}
