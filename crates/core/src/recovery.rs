//! The reconciler's recovery policy (README, "The reconciler") as pure
//! decisions over an in-memory record per gateway:
//!
//! - a retry budget per set of deployment inputs (generation, rendered
//!   fingerprint, retry request); when it is spent the gateway is FAILED
//!   with the last error and retried once more after a window of
//!   `max(sync period, 1 minute)`;
//! - new inputs (a spec change, a changed fingerprint, a retry request)
//!   apply at once with a fresh budget;
//! - an unchanged failure waits for its retry time: no apply, no status
//!   write, so no reconcile can loop on its own writes;
//! - the record is kept in the gateway's status (`failure_count`,
//!   `failed_inputs`, `next_retry_time`, `message`): a restarted reconciler
//!   or a new leader continues it ([`Attempts::recorded`],
//!   [`RecoveryPolicy::resume`]) and spreads a fleet of overdue retries over
//!   the window instead of retrying them all at once.
//!
//! Times are milliseconds since the Unix epoch, read by the caller.

use std::time::Duration;

use crate::retry::Backoff;

/// What a set of attempts is for: a change of any part is new input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inputs {
    pub generation: i64,
    pub fingerprint: String,
    /// Value of the retry-request annotation (a timestamp), if any.
    pub retry_token: String,
}

impl Inputs {
    /// A short fingerprint of these inputs, as kept in
    /// `status.failed_inputs`.
    pub fn key(&self) -> String {
        let text = format!("{}\n{}\n{}", self.generation, self.fingerprint, self.retry_token);
        crate::fingerprint::fingerprint(text.as_bytes())
    }
}

/// The reconciler's memory of failed attempts for one gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempts {
    pub inputs: Inputs,
    /// Consecutive failures for these inputs.
    pub failures: u32,
    pub last_error: String,
    /// Milliseconds (on the caller's clock) before which nothing is retried.
    pub retry_at_ms: u64,
}

impl Attempts {
    /// The record a status carries for `inputs`: `None` when it counts no
    /// failure or counts them for other inputs (those are new inputs, with
    /// a fresh budget).
    pub fn recorded(
        inputs: &Inputs,
        failure_count: i32,
        failed_inputs: &str,
        retry_at_ms: u64,
        last_error: &str,
    ) -> Option<Attempts> {
        let failures = u32::try_from(failure_count).ok().filter(|f| *f > 0)?;
        (failed_inputs == inputs.key()).then(|| Attempts {
            inputs: inputs.clone(),
            failures,
            last_error: last_error.to_string(),
            retry_at_ms,
        })
    }
}

/// What to do about a gateway whose manifests need applying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Apply,
    /// Wait until this time (caller's clock, ms); do not apply, do not write.
    Wait {
        until_ms: u64,
    },
}

/// The outcome of recording a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub attempts: Attempts,
    /// The budget is spent: report FAILED.
    pub exhausted: bool,
}

/// Tunables of the policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecoveryPolicy {
    /// Attempts per set of inputs before FAILED.
    pub budget: u32,
    pub backoff: Backoff,
    pub sync_period: Duration,
    /// Shortest wait after the budget is spent.
    pub failed_window_floor: Duration,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        Self {
            budget: 5,
            backoff: Backoff::default(),
            sync_period: Duration::from_secs(300),
            failed_window_floor: Duration::from_secs(60),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RecoveryPolicy {
    /// The wait after the budget is spent.
    pub fn failed_window(&self) -> Duration {
        self.sync_period.max(self.failed_window_floor)
    }

    /// A record read back from a status (after a restart or a change of
    /// leader): a retry time still ahead is honoured; an overdue one is
    /// moved to a random point (`random` in `[0, 1)`) of the wait it was
    /// on, so a fleet of gateways that failed together is not retried in
    /// one burst.
    pub fn resume(&self, mut recorded: Attempts, now_ms: u64, random: f64) -> Attempts {
        if recorded.retry_at_ms > now_ms {
            return recorded;
        }
        let wait = if recorded.failures >= self.budget.max(1) {
            self.failed_window()
        } else {
            self.backoff.delay(recorded.failures - 1, 0.0)
        };
        recorded.retry_at_ms = now_ms.saturating_add(ms(wait.mul_f64(random.clamp(0.0, 1.0))));
        recorded
    }

    /// Whether to apply now.
    pub fn decide(&self, record: Option<&Attempts>, inputs: &Inputs, now_ms: u64) -> Decision {
        match record {
            Some(r) if r.inputs == *inputs && r.failures > 0 && now_ms < r.retry_at_ms => {
                Decision::Wait { until_ms: r.retry_at_ms }
            }
            _ => Decision::Apply,
        }
    }

    /// Records a failed attempt; `random` in `[0, 1)` jitters the backoff.
    pub fn on_failure(
        &self,
        record: Option<&Attempts>,
        inputs: &Inputs,
        error: &str,
        now_ms: u64,
        random: f64,
    ) -> Failure {
        let failures = match record {
            Some(r) if r.inputs == *inputs => r.failures.saturating_add(1),
            _ => 1,
        };
        let exhausted = failures >= self.budget.max(1);
        let wait =
            if exhausted { self.failed_window() } else { self.backoff.delay(failures - 1, random) };
        Failure {
            attempts: Attempts {
                inputs: inputs.clone(),
                failures,
                last_error: error.to_string(),
                retry_at_ms: now_ms.saturating_add(ms(wait)),
            },
            exhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RecoveryPolicy {
        RecoveryPolicy {
            budget: 3,
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
                jitter: 0.0,
            },
            sync_period: Duration::from_secs(10),
            failed_window_floor: Duration::from_secs(60),
        }
    }

    fn inputs(fingerprint: &str) -> Inputs {
        Inputs { generation: 1, fingerprint: fingerprint.into(), retry_token: String::new() }
    }

    #[test]
    fn budget_then_failed_window_then_one_more_try() {
        let p = policy();
        let i = inputs("a");
        assert_eq!(p.decide(None, &i, 0), Decision::Apply);
        let f1 = p.on_failure(None, &i, "boom", 0, 0.0);
        assert_eq!((f1.attempts.failures, f1.exhausted, f1.attempts.retry_at_ms), (1, false, 100));
        assert_eq!(p.decide(Some(&f1.attempts), &i, 50), Decision::Wait { until_ms: 100 });
        assert_eq!(p.decide(Some(&f1.attempts), &i, 100), Decision::Apply);
        let f2 = p.on_failure(Some(&f1.attempts), &i, "boom", 100, 0.0);
        assert_eq!(f2.attempts.retry_at_ms, 300);
        let f3 = p.on_failure(Some(&f2.attempts), &i, "still boom", 300, 0.0);
        assert!(f3.exhausted);
        assert_eq!(f3.attempts.retry_at_ms, 300 + 60_000, "window = max(sync period, 1 minute)");
        assert_eq!(f3.attempts.last_error, "still boom");
        assert_eq!(p.decide(Some(&f3.attempts), &i, 60_299), Decision::Wait { until_ms: 60_300 });
        let f4 = p.on_failure(Some(&f3.attempts), &i, "boom", 60_300, 0.0);
        assert!(f4.exhausted, "after the window one more try, then FAILED again");
    }

    #[test]
    fn new_inputs_apply_at_once_with_a_fresh_budget() {
        let p = policy();
        let failed = p.on_failure(None, &inputs("a"), "boom", 0, 0.0).attempts;
        assert_eq!(
            p.decide(Some(&failed), &inputs("b"), 1),
            Decision::Apply,
            "a changed fingerprint"
        );
        let retry = Inputs { retry_token: "2026-12-03T10:00:00Z".into(), ..inputs("a") };
        assert_eq!(p.decide(Some(&failed), &retry, 1), Decision::Apply, "a retry request");
        let next = p.on_failure(Some(&failed), &retry, "boom", 1, 0.0);
        assert_eq!(next.attempts.failures, 1, "the budget was reset");
    }

    #[test]
    fn a_record_survives_in_status_and_resumes_spread_out() {
        let p = policy();
        let i = inputs("a");
        let failed = p.on_failure(None, &i, "boom", 0, 0.0).attempts;
        let read =
            Attempts::recorded(&i, 1, &i.key(), failed.retry_at_ms, "boom").expect("a record");
        assert_eq!(read, failed, "what the status keeps is the whole record");
        assert_eq!(Attempts::recorded(&inputs("b"), 1, &i.key(), 100, "boom"), None, "new inputs");
        assert_eq!(Attempts::recorded(&i, 0, &i.key(), 100, ""), None, "no failures");
        let retry = Inputs { retry_token: "now".into(), ..i.clone() };
        assert_ne!(retry.key(), i.key(), "a retry request is new input");
        // Ahead: honoured as recorded.
        assert_eq!(p.resume(failed.clone(), 50, 0.9).retry_at_ms, 100);
        // Overdue and FAILED: spread over the window.
        let exhausted = Attempts { failures: 3, retry_at_ms: 1_000, ..failed };
        let spread: Vec<u64> = [0.0, 0.5, 0.99]
            .iter()
            .map(|r| p.resume(exhausted.clone(), 5_000, *r).retry_at_ms)
            .collect();
        assert_eq!(spread, [5_000, 35_000, 64_400]);
    }

    #[test]
    fn the_window_is_at_least_a_minute() {
        let p = RecoveryPolicy { sync_period: Duration::from_secs(5), ..policy() };
        assert_eq!(p.failed_window(), Duration::from_secs(60));
        let p = RecoveryPolicy { sync_period: Duration::from_secs(600), ..policy() };
        assert_eq!(p.failed_window(), Duration::from_secs(600));
    }
}
