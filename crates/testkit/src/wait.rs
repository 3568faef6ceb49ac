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
/// Called from a multi-threaded tokio runtime, it first hands this
/// worker's other tasks to the other workers (`block_in_place`), so a
/// blocking wait never starves the clients and servers the test runs.
pub fn eventually_blocking(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let mut wait = || {
        let deadline = std::time::Instant::now() + within;
        while !condition() {
            assert!(std::time::Instant::now() < deadline, "not within {within:?}: {what}");
            std::thread::sleep(POLL);
        }
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
        _ => wait(),
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

    /// On a multi-threaded runtime a blocking wait leaves the other tasks
    /// running: here, with one worker, the task that makes its condition
    /// true (without `block_in_place` the waiter holds the only worker).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocking_wait_does_not_starve_the_task_it_waits_for() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let flag = std::sync::Arc::new(AtomicBool::new(false));
        let seen = flag.clone();
        let waiter = tokio::spawn(async move {
            eventually_blocking(Duration::from_secs(5), "the spawned task ran", || {
                seen.load(Ordering::SeqCst)
            });
        });
        tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        waiter.await.expect("the wait ends once the other task ran");
    }
}
