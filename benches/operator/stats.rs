//! Latency samples and their percentiles, printed one line per measurement.

use std::time::Duration;

/// The latencies of one measurement.
#[derive(Default)]
pub struct Samples {
    values: Vec<Duration>,
    /// Calls that failed (counted, not timed).
    pub errors: usize,
}

impl Samples {
    pub fn push(&mut self, took: Duration) {
        self.values.push(took);
    }

    /// Adds every sample and error of `other` (rounds of one measurement, pooled).
    pub fn absorb(&mut self, other: &Samples) {
        self.values.extend_from_slice(&other.values);
        self.errors += other.errors;
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// The arithmetic mean; zero when empty.
    pub fn mean(&self) -> Duration {
        match u32::try_from(self.values.len()) {
            Ok(n) if n > 0 => self.values.iter().sum::<Duration>() / n,
            _ => Duration::ZERO,
        }
    }

    /// The `q` quantile (0..=1), nearest rank; zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    /// `name  n=…  p50=…  p99=…  p99.9=…  max=…` in milliseconds.
    pub fn line(&self, name: &str) -> String {
        let errors =
            if self.errors > 0 { format!("  errors={}", self.errors) } else { String::new() };
        format!(
            "{name:<52} n={:<6} p50={:>8}  p99={:>8}  p99.9={:>8}  max={:>8}{errors}",
            self.len(),
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            ms(self.quantile(0.999)),
            ms(self.quantile(1.0)),
        )
    }
}

/// Calls and mean per call of several measurements of one thing, each given as its calls and
/// its mean: the calls add up, the mean is weighted by them.
pub fn pooled_mean(parts: impl IntoIterator<Item = (u64, Duration)>) -> (u64, Duration) {
    let (mut calls, mut total) = (0u64, 0.0f64);
    for (n, mean) in parts {
        calls += n;
        total += mean.as_secs_f64() * n as f64;
    }
    let mean =
        if calls == 0 { Duration::ZERO } else { Duration::from_secs_f64(total / calls as f64) };
    (calls, mean)
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}ms", d.as_secs_f64() * 1000.0)
}

/// `a / b` of two durations, for the ratios the report compares within one run.
pub fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() { f64::NAN } else { a.as_secs_f64() / b.as_secs_f64() }
}
