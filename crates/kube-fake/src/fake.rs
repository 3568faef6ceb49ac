//! The fake API server shared by the HTTP handlers, the rollout simulator
//! and the test handle: the state behind one lock, and the signals that
//! end watches and wake the simulator.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::state::State;

/// The fake API server shared by the HTTP handlers, the rollout
/// simulator and the test handle.
#[derive(Debug)]
pub struct Fake {
    state: Mutex<State>,
    /// Bumped to end every open watch (fault injection).
    pub watch_epoch: watch::Sender<u64>,
    /// Wakes the rollout simulator.
    pub rollout_wake: Notify,
    pub bookmark_interval: Duration,
}

impl Fake {
    pub fn new(history: usize, bookmark_interval: Duration) -> Self {
        Self {
            state: Mutex::new(State::new(history)),
            watch_epoch: watch::channel(0).0,
            rollout_wake: Notify::new(),
            bookmark_interval,
        }
    }

    /// The state; a panic elsewhere never leaves it half-written (every
    /// operation validates before it mutates), so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
