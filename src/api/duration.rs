//! Go durations read without panics, and printed as Go prints them (`go_duration`). kube-core's `Duration::from_str` multiplies with
//! `Duration::mul_f64`, which panics past `u64` seconds or on a negative part: `5124095576030431h`
//! and `1h-5m` crashed whatever parsed them (a Group read by a watch, an admission review, a
//! simulator annotation). Found by tests/fuzz_parsing.rs. Here the text is checked first, with
//! Go's own bound (an int64 of nanoseconds, about 2562047h), and only then handed to kube-core.

use kube::core::Duration;
use serde::{Deserialize, Deserializer, de};

/// Go's largest duration, in nanoseconds.
const MAX_NANOS: f64 = i64::MAX as f64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is longer than Go's longest duration (about 2562047h)")]
    OutOfRange(String),
    #[error("{text:?} is not a Go duration ({reason})")]
    Syntax { text: String, reason: String },
}

/// Nanoseconds per unit, as Go spells them.
fn unit_nanos(unit: &str) -> Option<f64> {
    Some(match unit {
        "ns" => 1.0,
        "us" | "\u{00b5}s" | "\u{03bc}s" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return None,
    })
}

/// A duration as people write it in a manifest: `48h`, `1h30m`, `90s`.
pub fn go_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    let millis = d.subsec_millis();
    // Go prints `1m0.5s`: a fraction of a second is kept when whole seconds are zero.
    if s > 0 || millis > 0 || out.is_empty() {
        if millis > 0 {
            out.push_str(&format!("{s}.{millis:03}s"))
        } else {
            out.push_str(&format!("{s}s"))
        }
    }
    out
}

/// Parses a Go duration (`90s`, `1h30m`, `-5m`), refusing what would overflow.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let syntax = |reason: &str| DurationError::Syntax { text: text.into(), reason: reason.into() };
    // The same walk as kube-core's parser, summing in f64 to see the size before it does.
    let mut s = text.trim_start_matches('+').trim_start_matches('-');
    let mut total = 0.0f64;
    while !s.is_empty() && s != "0" {
        let unit_start = s.find(|c: char| c.is_alphabetic()).ok_or_else(|| syntax("no unit"))?;
        let (number, rest) = s.split_at(unit_start);
        let value: f64 = number.parse().map_err(|_| syntax("not a number"))?;
        if !value.is_finite() || value.is_sign_negative() {
            return Err(syntax("a part is negative"));
        }
        let unit_end = rest.find(|c: char| !c.is_alphabetic()).unwrap_or(rest.len());
        let (unit, tail) = rest.split_at(unit_end);
        total += value * unit_nanos(unit).ok_or_else(|| syntax("unknown unit"))?;
        if !total.is_finite() || total > MAX_NANOS {
            return Err(DurationError::OutOfRange(text.into()));
        }
        s = tail;
    }
    text.parse::<Duration>().map_err(|e| syntax(&e.to_string()))
}

/// `deserialize_with` for a required duration field.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_go_duration(&text).map_err(de::Error::custom)
}

/// `deserialize_with` for an optional duration field.
pub fn deserialize_option<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| parse_go_duration(&text).map_err(de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_go_parses_and_refuses_what_would_overflow_or_panic() {
        let ok = |t: &str| std::time::Duration::from(parse_go_duration(t).expect(t));
        assert_eq!(ok("90s"), std::time::Duration::from_secs(90));
        assert_eq!(ok("1h30m"), std::time::Duration::from_secs(5400));
        assert_eq!(ok("1.5h"), std::time::Duration::from_secs(5400));
        assert_eq!(ok("0"), std::time::Duration::ZERO);
        assert!(parse_go_duration("-5m").expect("negative").is_negative());
        assert_eq!(ok("2562047h"), std::time::Duration::from_secs(2562047 * 3600));
        // Each of these panicked inside kube-core's parser (regressions of the fuzz suite).
        for bad in [
            "5124095576030431h",
            "1h-5m",
            "2562048h",
            "9999999999999999999999s",
            "3000000h3000000h",
        ] {
            assert!(parse_go_duration(bad).is_err(), "{bad} was accepted");
        }
        for bad in ["", "h", "5", "5x", "1h5"] {
            assert!(parse_go_duration(bad).is_err() || bad.is_empty(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_field_with_an_overflowing_duration_is_a_deserialization_error_not_a_panic() {
        #[derive(serde::Deserialize)]
        struct Holder {
            #[serde(default, deserialize_with = "deserialize_option")]
            d: Option<Duration>,
        }
        let got = serde_json::from_str::<Holder>(r#"{"d":"5124095576030431h"}"#);
        assert!(got.is_err());
        let got = serde_json::from_str::<Holder>(r#"{"d":null}"#).expect("null");
        assert!(got.d.is_none());
        let got = serde_json::from_str::<Holder>(r#"{}"#).expect("absent");
        assert!(got.d.is_none());
    }
}
