//! The clock rules and controllers judge time by; replaceable so tests can pin it.

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
