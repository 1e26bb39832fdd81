//! The clock rules and controllers judge time by; replaceable so tests can pin it.

/// `t` plus `d`, saturating: a duration past what a timestamp holds is "never".
pub fn plus(t: jiff::Timestamp, d: std::time::Duration) -> jiff::Timestamp {
    let d = jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    t.checked_add(d).unwrap_or(jiff::Timestamp::MAX)
}

/// A source of the current time.
pub trait Clock: Send + Sync {
    fn now(&self) -> jiff::Timestamp;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> jiff::Timestamp {
        jiff::Timestamp::now()
    }
}

/// Periodic work until shutdown: `while ticks.next().await { ... }`. A tick missed because the
/// work took longer is not made up in a burst (the next one is one interval after it ends).
pub struct Ticks {
    interval: tokio::time::Interval,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Ticks {
    /// The first tick at once, then every `period`.
    pub fn now(period: std::time::Duration, shutdown: tokio_util::sync::CancellationToken) -> Self {
        Self::starting(tokio::time::Instant::now(), period, shutdown)
    }

    /// The first tick one `period` from now.
    pub fn after(
        period: std::time::Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Self {
        Self::starting(tokio::time::Instant::now() + period, period, shutdown)
    }

    fn starting(
        start: tokio::time::Instant,
        period: std::time::Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Self {
        let mut interval = tokio::time::interval_at(start, period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { interval, shutdown }
    }

    /// Waits for the next tick: true, or false once shut down.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            // Shutdown first: a tick that is also due does not run the work once more.
            biased;
            _ = self.shutdown.cancelled() => false,
            _ = self.interval.tick() => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn ticks_now_or_after_a_period_until_shut_down() {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let period = Duration::from_secs(1);
        let start = tokio::time::Instant::now();
        let mut now = Ticks::now(period, shutdown.clone());
        let mut after = Ticks::after(period, shutdown.clone());
        assert!(now.next().await);
        assert!(start.elapsed() < period, "the first tick at once");
        assert!(after.next().await);
        assert!(start.elapsed() >= period, "the first tick one period later");
        shutdown.cancel();
        assert!(!now.next().await, "shut down");
        assert!(!after.next().await, "shut down");
    }
}
