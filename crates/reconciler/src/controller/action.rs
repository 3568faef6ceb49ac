//! What a pass returns: an [`Action`] (its [`Outcome`] and when to look
//! again) or a [`ReconcileError`] the runtime retries with backoff. Both
//! name their `reconciles{outcome}` label in one place ([`Outcome::as_str`],
//! [`ReconcileError::metric_label`]).

use std::time::Duration;

use crate::targets::TargetError;

/// How a pass ended, for the `reconciles{outcome}` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The manifests were applied.
    Applied,
    /// Observed; the status changed and was written.
    Observed,
    /// Observed; nothing changed (no write).
    Unchanged,
    /// An unchanged failure waits for its next try (no apply).
    Waiting,
    /// The apply failed; the failure is recorded in status.
    Failed,
    /// Owned objects are still being deleted.
    Deleting,
    /// Owned objects are gone and the finalizer released.
    Deleted,
}

impl Outcome {
    /// Every outcome, for documentation and tests.
    pub const ALL: [Outcome; 7] = [
        Outcome::Applied,
        Outcome::Observed,
        Outcome::Unchanged,
        Outcome::Waiting,
        Outcome::Failed,
        Outcome::Deleting,
        Outcome::Deleted,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Observed => "observed",
            Outcome::Unchanged => "unchanged",
            Outcome::Waiting => "waiting",
            Outcome::Failed => "failed",
            Outcome::Deleting => "deleting",
            Outcome::Deleted => "deleted",
        }
    }
}

/// What the runtime does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    pub outcome: Outcome,
    /// Check again after this long; `None`: when something changes (or at
    /// the next resync).
    pub requeue_after: Option<Duration>,
}

impl Action {
    pub(super) fn done(outcome: Outcome) -> Self {
        Self { outcome, requeue_after: None }
    }

    pub(super) fn after(outcome: Outcome, delay: Duration) -> Self {
        Self { outcome, requeue_after: Some(delay) }
    }
}

/// Why a pass could not finish; the runtime retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The gateway changed since it was read (ABORTED): run again at once
    /// on the fresh copy.
    #[error("the gateway changed meanwhile")]
    Conflict,
    #[error("gateway-store: {0}")]
    Store(String),
    #[error("cannot observe the gateway's objects: {0}")]
    Observe(TargetError),
    #[error("cleanup failed: {0}")]
    Cleanup(TargetError),
    /// This replica's leadership lapsed during the pass: nothing is
    /// recorded or written; the next leader takes over.
    #[error("leadership lapsed: {0}")]
    NotLeader(TargetError),
}

impl ReconcileError {
    /// The `reconciles{outcome=...}` label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Conflict => "status_conflict",
            ReconcileError::Store(_) => "store_error",
            ReconcileError::Observe(_) => "observe_error",
            ReconcileError::Cleanup(_) => "cleanup_error",
            ReconcileError::NotLeader(_) => "not_leader",
        }
    }
}
