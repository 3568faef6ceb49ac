//! The work queue: one entry per gateway (adding a queued name again is a
//! no-op), never handed to two workers at once (a name added while it is
//! being worked on is queued again when the worker is done), and delayed
//! entries for backoff and polling.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<String>,
    queued: HashSet<String>,
    active: HashSet<String>,
    /// Added while active: queue again on `done`.
    dirty: HashSet<String>,
    delayed: BTreeSet<(Instant, String)>,
    delayed_at: HashMap<String, Instant>,
    closed: bool,
}

impl State {
    fn add(&mut self, name: &str) {
        if self.active.contains(name) {
            self.dirty.insert(name.to_string());
        } else if self.queued.insert(name.to_string()) {
            self.ready.push_back(name.to_string());
        }
    }

    fn promote_due(&mut self, now: Instant) {
        while let Some((at, name)) = self.delayed.first().cloned() {
            if at > now {
                break;
            }
            self.delayed.pop_first();
            self.delayed_at.remove(&name);
            self.add(&name);
        }
    }
}

/// The reconciler's work queue.
#[derive(Debug, Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    notify: Notify,
}

impl WorkQueue {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `name` now.
    pub fn add(&self, name: &str) {
        self.lock().add(name);
        self.notify.notify_waiters();
    }

    /// Queues `name` after `delay` (the earliest of several requests wins).
    pub fn add_after(&self, name: &str, delay: Duration) {
        let at = Instant::now() + delay;
        let mut state = self.lock();
        match state.delayed_at.get(name).copied() {
            Some(existing) if existing <= at => return,
            Some(existing) => {
                state.delayed.remove(&(existing, name.to_string()));
            }
            None => {}
        }
        state.delayed.insert((at, name.to_string()));
        state.delayed_at.insert(name.to_string(), at);
        drop(state);
        self.notify.notify_waiters();
    }

    /// The next name to work on; `None` once closed.
    pub async fn next(&self) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut state = self.lock();
                if state.closed {
                    return None;
                }
                state.promote_due(Instant::now());
                if let Some(name) = state.ready.pop_front() {
                    state.queued.remove(&name);
                    state.active.insert(name.clone());
                    return Some(name);
                }
                state.delayed.first().map(|(at, _)| *at)
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `name` finished; it runs again if it was added meanwhile.
    pub fn done(&self, name: &str) {
        let mut state = self.lock();
        state.active.remove(name);
        if state.dirty.remove(name) {
            state.add(name);
            drop(state);
            self.notify.notify_waiters();
        }
    }

    /// Forgets any delayed entry of `name` (it was deleted).
    pub fn forget(&self, name: &str) {
        let mut state = self.lock();
        if let Some(at) = state.delayed_at.remove(name) {
            state.delayed.remove(&(at, name.to_string()));
        }
    }

    /// Names ready or waiting.
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.ready.len() + state.delayed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Nothing to work on now: no name ready, none being worked on (one
    /// waiting for its time, for backoff or polling, may remain).
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.ready.is_empty() && state.active.is_empty() && state.dirty.is_empty()
    }

    /// Wakes every waiter with `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deduplicates_and_never_hands_out_an_active_name_twice() {
        let q = WorkQueue::default();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await.as_deref(), Some("a"));
        q.add("a"); // while active: remembered, not handed out
        assert_eq!(q.next().await.as_deref(), Some("b"));
        assert!(q.is_empty());
        q.done("a");
        assert_eq!(q.next().await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_only_when_nothing_is_ready_or_being_worked_on() {
        let q = WorkQueue::default();
        assert!(q.is_idle());
        q.add("a");
        assert!(!q.is_idle(), "one ready");
        assert_eq!(q.next().await.as_deref(), Some("a"));
        assert!(!q.is_idle(), "one being worked on");
        q.add_after("a", Duration::from_secs(5));
        q.done("a");
        assert!(q.is_idle(), "only a delayed entry left");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_entries_come_due_earliest_first() {
        let q = WorkQueue::default();
        q.add_after("slow", Duration::from_secs(10));
        q.add_after("slow", Duration::from_secs(2));
        q.add_after("fast", Duration::from_secs(1));
        let started = Instant::now();
        assert_eq!(q.next().await.as_deref(), Some("fast"));
        assert_eq!(q.next().await.as_deref(), Some("slow"));
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        q.close();
        assert_eq!(q.next().await, None);
    }
}
