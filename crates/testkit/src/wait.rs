//! Bounded waits on a condition: the one way tests wait for something to
//! happen (never a bare sleep as the verdict). On tokio's clock, so a test
//! with paused time waits on virtual time.

use std::future::Future;
use std::time::Duration;

/// How often a condition is checked again.
pub const POLL: Duration = Duration::from_millis(20);

/// Waits until `check` answers `Some`, checking every [`POLL`]; panics
/// naming `what` if it has not within `within`.
pub async fn eventually_some<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `condition` holds, checking every [`POLL`]; panics naming
/// `what` if it has not within `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(within, what, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// [`eventually`] for code that is not async (a test helper that runs
/// kubectl): checks `condition` every [`POLL`] on the thread's clock.
pub fn eventually_blocking(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_condition_that_comes_true_ends_the_wait_and_one_that_never_does_fails_it() {
        let started = tokio::time::Instant::now();
        let mut checks = 0;
        eventually(Duration::from_secs(1), "the third check", || {
            checks += 1;
            let now = checks;
            async move { now == 3 }
        })
        .await;
        assert_eq!(checks, 3);
        assert_eq!(started.elapsed(), 2 * POLL, "checked every POLL, not sooner");
        let never = tokio::spawn(eventually(Duration::from_secs(1), "never", || async { false }));
        let failure = never.await.unwrap_err();
        assert!(failure.is_panic());
    }
}
