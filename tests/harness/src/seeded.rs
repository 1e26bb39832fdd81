//! Seeded schedules for the randomized suites: a splitmix64 generator (a schedule needs no
//! crate, and a seed must replay the same schedule on every machine) and the environment knobs
//! that size and seed a run.

use std::time::Duration;

/// splitmix64: every value follows from the seed alone.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..=max`.
    pub fn up_to(&mut self, max: u64) -> u64 {
        self.next_u64() % (max + 1)
    }

    /// A duration of `0..=max` milliseconds.
    pub fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.up_to(max))
    }

    /// A duration of `min..=max` whole seconds.
    pub fn seconds(&mut self, min: u64, max: u64) -> Duration {
        Duration::from_secs(min + self.up_to(max.saturating_sub(min)))
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// The number in environment variable `name`, or `default` when it is unset. A value that is
/// not a number fails the run, saying so: a mistyped seed must not run some other schedule.
pub fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// A seed from the clock, for runs that explore (the run prints it, so it replays).
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
