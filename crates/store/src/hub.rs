//! The watch cache: a bounded ring of the newest committed events, and a
//! broadcast channel that fans each new event out to every subscriber.
//!
//! ```text
//! writer (own commits) ──┐
//!                        ├─► publish(contiguous events) ─► ring ─► broadcast ─► subscribers
//! tailer (events table) ─┘         gap? wake the tailer
//! ```
//!
//! Publishing and subscribing happen under one lock, so a subscriber gets
//! the retained events after its revision plus a receiver that starts right
//! after them: no gap, no duplicate. The broadcast buffer is shared and
//! bounded; a subscriber that falls further behind than it is told so
//! (`Lagged`) and its stream ends, while the others are not slowed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{broadcast, Notify};

use crate::storage::Event;

/// Retained events after a revision, and a receiver for everything newer.
pub type Subscription = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);

#[derive(Debug)]
struct Ring {
    events: VecDeque<Arc<Event>>,
    head: i64,
    capacity: usize,
    sender: broadcast::Sender<Arc<Event>>,
}

/// The store process's watch cache.
#[derive(Debug)]
pub struct WatchHub {
    ring: Mutex<Ring>,
    broadcast_capacity: usize,
    /// Wakes the tailer when a gap shows that another writer committed.
    pub wake_tailer: Arc<Notify>,
}

impl WatchHub {
    /// A hub whose history starts at `head` (the current store revision),
    /// retaining up to `capacity` events, with a per-subscriber lag budget
    /// of `broadcast_capacity` events.
    pub fn new(head: i64, capacity: usize, broadcast_capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(broadcast_capacity.max(1));
        Self {
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(capacity.min(4096)),
                head,
                capacity,
                sender,
            }),
            broadcast_capacity: broadcast_capacity.max(1),
            wake_tailer: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding this lock leaves the ring consistent (every
        // mutation is a push or pop), so a poisoned lock is still usable.
        self.ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The newest published revision.
    pub fn head(&self) -> i64 {
        self.lock().head
    }

    /// Number of live subscribers.
    pub fn subscribers(&self) -> usize {
        self.lock().sender.receiver_count()
    }

    /// Number of events retained in the ring.
    pub fn retained(&self) -> usize {
        self.lock().events.len()
    }

    /// Publishes events in revision order. Already published ones are
    /// skipped; at a gap publishing stops and the tailer is woken to read
    /// the missing events from the database. Returns how many were
    /// published.
    pub fn publish(&self, events: impl IntoIterator<Item = Arc<Event>>) -> usize {
        let mut ring = self.lock();
        let mut published = 0;
        for event in events {
            if event.revision <= ring.head {
                continue;
            }
            if event.revision != ring.head + 1 {
                self.wake_tailer.notify_one();
                break;
            }
            ring.head = event.revision;
            if ring.events.len() == ring.capacity {
                ring.events.pop_front();
            }
            if ring.capacity > 0 {
                ring.events.push_back(event.clone());
            }
            // No receivers is fine: nobody is watching.
            let _ = ring.sender.send(event);
            published += 1;
        }
        published
    }

    /// For a watch resuming after revision `after`: the retained events
    /// after it and a receiver of everything later; `None` when the ring no
    /// longer reaches back to `after` (read the database instead).
    pub fn subscribe(&self, after: i64) -> Option<Subscription> {
        let ring = self.lock();
        let oldest = ring.events.front().map_or(ring.head + 1, |e| e.revision);
        if after < oldest - 1 {
            return None;
        }
        let skip = usize::try_from(after - (oldest - 1)).unwrap_or(0).min(ring.events.len());
        let backlog = ring.events.iter().skip(skip).cloned().collect();
        Some((backlog, ring.sender.subscribe()))
    }

    /// Forgets the retained history and ends every subscriber's stream (they
    /// resume from their own revision), continuing from `head`. Used when
    /// this process can no longer prove its history is complete.
    pub fn reset(&self, head: i64) {
        let mut ring = self.lock();
        ring.events.clear();
        ring.head = head;
        ring.sender = broadcast::channel(self.broadcast_capacity).0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{EventType, Gateway};

    fn event(revision: i64) -> Arc<Event> {
        Arc::new(Event {
            revision,
            kind: EventType::Modified,
            gateway: Arc::new(Gateway::default()),
            prev_labels: None,
        })
    }

    fn revisions(events: &[Arc<Event>]) -> Vec<i64> {
        events.iter().map(|e| e.revision).collect()
    }

    #[test]
    fn subscribe_returns_backlog_then_live_without_gap_or_duplicate() {
        let hub = WatchHub::new(10, 3, 16);
        assert_eq!(hub.publish((11..=14).map(event)), 4);
        assert_eq!(hub.head(), 14);
        assert!(hub.subscribe(10).is_none(), "11 fell out of the ring");
        let (backlog, mut rx) = hub.subscribe(11).unwrap();
        assert_eq!(revisions(&backlog), [12, 13, 14]);
        let (backlog, _) = hub.subscribe(14).unwrap();
        assert!(backlog.is_empty());
        hub.publish([event(15)]);
        assert_eq!(rx.try_recv().unwrap().revision, 15);
    }

    #[test]
    fn duplicates_are_skipped_and_gaps_stop_publishing() {
        let hub = WatchHub::new(0, 10, 16);
        hub.publish([event(1), event(2)]);
        assert_eq!(hub.publish([event(2), event(4), event(5)]), 0);
        assert_eq!(hub.head(), 2);
        assert_eq!(hub.publish([event(3), event(4)]), 2);
    }

    #[test]
    fn a_lagging_receiver_is_told() {
        let hub = WatchHub::new(0, 10, 2);
        let (_, mut rx) = hub.subscribe(0).unwrap();
        hub.publish((1..=5).map(event));
        assert!(matches!(rx.try_recv(), Err(broadcast::error::TryRecvError::Lagged(_))));
    }

    #[test]
    fn reset_closes_subscribers() {
        let hub = WatchHub::new(0, 10, 4);
        let (_, mut rx) = hub.subscribe(0).unwrap();
        hub.reset(100);
        assert!(matches!(rx.try_recv(), Err(broadcast::error::TryRecvError::Closed)));
        assert_eq!(hub.head(), 100);
    }
}
