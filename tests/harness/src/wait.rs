//! Poll-with-deadline, the only way the support code waits: no fixed sleeps, so a fast machine
//! is not slowed down and a slow one fails with what it was waiting for.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How long a component may take to become ready. Generous because a cold machine with two
/// cores starts kube-apiserver in tens of seconds; `HOMELAB_TEST_START_TIMEOUT` (seconds)
/// overrides it.
pub fn start_timeout() -> Duration {
    let secs = std::env::var("HOMELAB_TEST_START_TIMEOUT")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(120);
    Duration::from_secs(secs)
}

/// Calls `probe` until it returns `Ok`, for at most `timeout`. An `Err` from `probe` means "not
/// yet" and is reported if the deadline passes. `alive` is checked before every probe and its
/// error ends the wait at once (a component that exited will not become ready).
pub async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    alive: impl Fn() -> Result<()>,
    mut probe: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut interval = Duration::from_millis(50);
    loop {
        alive()?;
        let last_error = match probe().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last attempt: {last_error:#}");
        }
        tokio::time::sleep(interval.min(deadline.saturating_duration_since(Instant::now()))).await;
        interval = (interval * 2).min(Duration::from_millis(500));
    }
}

/// [`until`] with nothing to watch besides the probe: for tests waiting on the cluster to act.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    until(what, timeout, || Ok(()), probe).await
}

/// Calls `probe` for the whole of `duration` and fails at its first `Err`: the poll-with-deadline
/// for a state that must hold (a machine that must stay on), where [`until`] waits for one to come.
pub async fn stays<F, Fut>(what: &str, duration: Duration, mut probe: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let end = Instant::now() + duration;
    loop {
        if let Err(err) = probe().await {
            bail!(
                "{what} stopped holding after {:?}: {err:#}",
                duration - end.saturating_duration_since(Instant::now())
            );
        }
        if Instant::now() >= end {
            return Ok(());
        }
        tokio::time::sleep(
            Duration::from_millis(500).min(end.saturating_duration_since(Instant::now())),
        )
        .await;
    }
}
