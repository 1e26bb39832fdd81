//! Whether two windows can be open at the same instant. Windows in different zones drift
//! against each other with daylight saving, so the question is answered on real instants: the
//! openings of both over the coming year (366 days from the moment asked, every zone's rules
//! for a whole year) are compared, and the first instant both hold is the witness.

use jiff::Timestamp;

use super::grammar::Window;

/// How many days ahead two windows are compared.
pub const OVERLAP_DAYS: i64 = 366;

/// The first instant from `from` on (within [`OVERLAP_DAYS`]) at which both windows are open.
pub fn first_shared_instant(a: &Window, b: &Window, from: Timestamp) -> Option<Timestamp> {
    let runs = |w: &Window| {
        let today = w.zone.to_datetime(from).date();
        let first = today.checked_sub(jiff::Span::new().days(2)).unwrap_or(today);
        let last = today.checked_add(jiff::Span::new().days(OVERLAP_DAYS)).unwrap_or(today);
        w.openings(first, last)
    };
    let (ra, rb) = (runs(a), runs(b));
    let (mut i, mut j) = (0, 0);
    while let (Some(x), Some(y)) = (ra.get(i), rb.get(j)) {
        let start = x.start.max(y.start).max(from);
        if start < x.end.min(y.end) {
            return Some(start);
        }
        if x.end <= y.end {
            i += 1;
        } else {
            j += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::window::tests::window;

    #[test]
    fn overlap_table() {
        let now: Timestamp = "2026-12-02T00:00:00Z".parse().unwrap();
        let office = window("Mon-Fri", "08:00", "18:00", "Europe/Berlin");
        let table = [
            // Touching windows do not overlap (openings are half-open).
            (window("Mon-Fri", "18:00", "20:00", "Europe/Berlin"), false),
            (window("Mon-Fri", "17:59", "20:00", "Europe/Berlin"), true),
            (window("Sat,Sun", "08:00", "18:00", "Europe/Berlin"), false),
            // A Sunday night window runs into Monday morning.
            (window("Sun", "22:00", "08:30", "Europe/Berlin"), true),
            (window("Sun", "22:00", "08:00", "Europe/Berlin"), false),
            // 18:00 London is 19:00 Berlin all year (both change on the same day).
            (window("Mon-Fri", "17:00", "20:00", "Europe/London"), false),
            // New York changes weeks before Berlin: 12:00 NY is 18:00 Berlin most of the year,
            // 17:00 Berlin in the weeks between the two spring changes.
            (window("Mon-Fri", "12:00", "13:00", "America/New_York"), true),
            (window("daily", "00:00", "00:00", "UTC"), true),
        ];
        for (other, overlaps) in table {
            let got = first_shared_instant(&office, &other, now);
            assert_eq!(
                got.is_some(),
                overlaps,
                "{} against {}: {got:?}",
                office.label,
                other.label
            );
            assert_eq!(first_shared_instant(&other, &office, now), got, "symmetric");
        }
        // The witness is an instant both hold.
        let ny = window("Mon-Fri", "12:00", "13:00", "America/New_York");
        let at = first_shared_instant(&office, &ny, now).unwrap();
        assert_eq!(at, "2027-03-15T16:00:00Z".parse::<Timestamp>().unwrap());
    }
}
