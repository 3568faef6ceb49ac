//! The watch cache: one ring of the newest committed events, bounded in
//! events and in bytes, that every live subscriber reads from by revision.
//!
//! ```text
//! writer (own commits) ──┐
//!                        ├─► publish(contiguous events) ─► ring ─► head ─► subscribers read
//! tailer (events table) ─┘         gap? wake the tailer                    the ring by revision
//! ```
//!
//! A subscriber holds only its revision and a receiver of the head: the
//! events themselves are shared (`Arc`) and held once, by the ring. A
//! subscriber whose unread events exceed its budget (in events or in
//! encoded bytes), or that the ring has moved past, is told so on its next
//! read and its stream ends; the others are not slowed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{watch, Notify};

use crate::storage::Event;

/// Encoded bytes a watch (or the tailer) reads from the database at a time
/// (at least one object): what a subscriber holds beyond the shared cache.
pub const WATCH_PAGE_BYTES: usize = 256 * 1024;

/// How much the cache holds and how far a subscriber may fall behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubLimits {
    /// Events kept in the ring.
    pub cache_events: usize,
    /// Encoded bytes of the events kept in the ring (the newest event is
    /// kept whatever its size).
    pub cache_bytes: usize,
    /// Unread events a subscriber may have before it is ended.
    pub lag_events: usize,
    /// Unread encoded bytes a subscriber may have before it is ended.
    pub lag_bytes: usize,
}

/// What a subscriber's read found.
#[derive(Debug, PartialEq)]
pub enum Read {
    /// The next events after the subscriber's revision.
    Events(Vec<Arc<Event>>),
    /// Nothing newer yet: wait for the head to move.
    Wait,
    /// The subscriber fell too far behind (its unread events or bytes are
    /// over budget, or the ring no longer holds them).
    TooSlow { events: i64, bytes: u64 },
    /// The cache was reset: resume from the subscriber's revision.
    Reset,
}

/// A subscriber's hold on the hub: the cache generation it follows and a
/// receiver woken whenever the head moves.
#[derive(Debug)]
pub struct Subscription {
    epoch: u64,
    pub head: watch::Receiver<i64>,
}

#[derive(Debug)]
struct Ring {
    events: VecDeque<Arc<Event>>,
    /// Encoded bytes published up to and including each retained event.
    offsets: VecDeque<u64>,
    /// Bytes published before the oldest retained event.
    base: u64,
    head: i64,
    /// Bytes published up to the head.
    head_offset: u64,
    /// Bumped by [`WatchHub::reset`]; subscribers of an older epoch end.
    epoch: u64,
    /// When the head was last published.
    published_at: Option<tokio::time::Instant>,
}

impl Ring {
    fn retained_bytes(&self) -> u64 {
        self.head_offset - self.base
    }

    /// For a subscriber at revision `after` (at most the head): how many
    /// retained events it has read (skips), and the encoded bytes it has
    /// not; `None` when the ring no longer holds all it has not read.
    fn unread(&self, after: i64) -> Option<(usize, u64)> {
        let oldest = self.events.front().map_or(self.head + 1, |e| e.revision);
        let skip = usize::try_from(after - (oldest - 1)).ok()?;
        let read_up_to = if skip == 0 { self.base } else { self.offsets[skip - 1] };
        Some((skip, self.head_offset - read_up_to))
    }
}

/// The store process's watch cache.
#[derive(Debug)]
pub struct WatchHub {
    ring: Mutex<Ring>,
    head_tx: watch::Sender<i64>,
    limits: HubLimits,
    /// Wakes the tailer when a gap shows that another writer committed.
    pub wake_tailer: Arc<Notify>,
}

impl WatchHub {
    /// A hub whose history starts at `head` (the current store revision).
    pub fn new(head: i64, limits: HubLimits) -> Self {
        Self {
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(limits.cache_events.min(4096)),
                offsets: VecDeque::with_capacity(limits.cache_events.min(4096)),
                base: 0,
                head,
                head_offset: 0,
                epoch: 0,
                published_at: None,
            }),
            head_tx: watch::channel(head).0,
            limits,
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

    /// When the newest events were published (`None`: none yet).
    pub fn published_at(&self) -> Option<tokio::time::Instant> {
        self.lock().published_at
    }

    /// Number of live subscribers.
    pub fn subscribers(&self) -> usize {
        self.head_tx.receiver_count()
    }

    /// Number of events retained in the ring.
    pub fn retained(&self) -> usize {
        self.lock().events.len()
    }

    /// Encoded bytes of the events retained in the ring.
    pub fn retained_bytes(&self) -> u64 {
        self.lock().retained_bytes()
    }

    /// Publishes events in revision order. Already published ones are
    /// skipped; at a gap publishing stops and the tailer is woken to read
    /// the missing events from the database. Returns how many were
    /// published.
    pub fn publish(&self, events: impl IntoIterator<Item = Arc<Event>>) -> usize {
        let published = self.append(events);
        if published > 0 {
            self.wake();
        }
        published
    }

    /// [`publish`](Self::publish) without waking the subscribers: the
    /// events are readable (a watch started now, or one reading for
    /// another reason, sees them) but no subscriber is woken for them
    /// until [`wake`](Self::wake). The writer answers its callers in
    /// between, so that their answers are not queued behind the fan-out.
    pub fn append(&self, events: impl IntoIterator<Item = Arc<Event>>) -> usize {
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
            ring.head_offset += event.size() as u64;
            let offset = ring.head_offset;
            ring.events.push_back(event);
            ring.offsets.push_back(offset);
            while ring.events.len() > self.limits.cache_events.max(1)
                || (ring.events.len() > 1 && ring.retained_bytes() > self.limits.cache_bytes as u64)
            {
                ring.events.pop_front();
                if let Some(offset) = ring.offsets.pop_front() {
                    ring.base = offset;
                }
            }
            published += 1;
        }
        if published > 0 {
            ring.published_at = Some(tokio::time::Instant::now());
        }
        published
    }

    /// Wakes the subscribers, unless a later wake already told them of
    /// the head (the writer's and the tailer's may cross).
    pub fn wake(&self) {
        let head = self.head();
        self.head_tx.send_if_modified(|told| {
            let newer = head > *told;
            if newer {
                *told = head;
            }
            newer
        });
    }

    /// For a watch continuing after revision `after`: a subscription when
    /// the ring reaches back to it and what it has yet to read is within
    /// what a live subscriber may fall behind; `None` otherwise (read the
    /// database first). A subscriber ended for falling behind resumes
    /// from where it was, further behind than that: subscribed, its first
    /// read would end it again, and again at every retry while no newer
    /// write moves the ring past it.
    pub fn subscribe(&self, after: i64) -> Option<Subscription> {
        let ring = self.lock();
        if after > ring.head {
            return None;
        }
        let (_, bytes) = ring.unread(after)?;
        (!self.over_lag(ring.head - after, bytes))
            .then(|| Subscription { epoch: ring.epoch, head: self.head_tx.subscribe() })
    }

    /// Whether `events` (`bytes`) unread are more than a subscriber may
    /// fall behind.
    fn over_lag(&self, events: i64, bytes: u64) -> bool {
        events > i64::try_from(self.limits.lag_events).unwrap_or(i64::MAX)
            || bytes > self.limits.lag_bytes as u64
    }

    /// Up to `max` events after revision `after` for `subscription`.
    pub fn read(&self, subscription: &Subscription, after: i64, max: usize) -> Read {
        let ring = self.lock();
        if ring.epoch != subscription.epoch {
            return Read::Reset;
        }
        if after >= ring.head {
            return Read::Wait;
        }
        let events = ring.head - after;
        let Some((skip, bytes)) = ring.unread(after) else {
            // The ring moved past this subscriber's position.
            return Read::TooSlow { events, bytes: ring.retained_bytes() };
        };
        if self.over_lag(events, bytes) {
            return Read::TooSlow { events, bytes };
        }
        Read::Events(ring.events.iter().skip(skip).take(max.max(1)).cloned().collect())
    }

    /// Forgets the retained history and ends every subscriber's stream (they
    /// resume from their own revision), continuing from `head`. Used when
    /// this process can no longer prove its history is complete.
    pub fn reset(&self, head: i64) {
        let mut ring = self.lock();
        ring.events.clear();
        ring.offsets.clear();
        ring.base = ring.head_offset;
        ring.head = head;
        ring.epoch += 1;
        drop(ring);
        self.head_tx.send_replace(head);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{EventType, Gateway};

    fn sized(revision: i64, size: usize) -> Arc<Event> {
        let encoded = vec![0u8; size].into();
        Arc::new(Event::new(revision, EventType::Modified, &Gateway::default(), None, encoded))
    }

    fn event(revision: i64) -> Arc<Event> {
        sized(revision, 10)
    }

    fn limits(cache_events: usize, lag_events: usize) -> HubLimits {
        HubLimits { cache_events, cache_bytes: usize::MAX, lag_events, lag_bytes: usize::MAX }
    }

    fn revisions(read: Read) -> Vec<i64> {
        match read {
            Read::Events(events) => events.iter().map(|e| e.revision).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_subscriber_reads_every_event_after_its_revision_without_gap_or_duplicate() {
        let hub = WatchHub::new(10, limits(3, 100));
        assert_eq!(hub.publish((11..=14).map(event)), 4);
        assert_eq!(hub.head(), 14);
        assert!(hub.subscribe(10).is_none(), "11 fell out of the ring");
        let sub = hub.subscribe(11).unwrap();
        assert_eq!(revisions(hub.read(&sub, 11, 10)), [12, 13, 14]);
        assert_eq!(revisions(hub.read(&sub, 12, 1)), [13]);
        assert_eq!(hub.read(&sub, 14, 10), Read::Wait);
        hub.publish([event(15)]);
        assert_eq!(revisions(hub.read(&sub, 14, 10)), [15]);
    }

    #[test]
    fn publishing_wakes_subscribers() {
        let hub = WatchHub::new(0, limits(10, 100));
        let mut sub = hub.subscribe(0).unwrap();
        sub.head.borrow_and_update();
        hub.publish([event(1)]);
        assert!(sub.head.has_changed().unwrap());
        assert_eq!(*sub.head.borrow_and_update(), 1);
    }

    /// The writer appends, answers its callers, then wakes: the events
    /// are readable before any subscriber is woken for them, and a wake
    /// that crossed a later one (the tailer's) neither wakes again nor
    /// takes the head back.
    #[test]
    fn appended_events_are_readable_before_the_wake_and_wakes_only_move_forward() {
        let hub = WatchHub::new(0, limits(10, 100));
        let mut sub = hub.subscribe(0).unwrap();
        sub.head.borrow_and_update();
        assert_eq!(hub.append([event(1), event(2)]), 2);
        assert!(!sub.head.has_changed().unwrap(), "woken before the writer answered");
        assert_eq!(revisions(hub.read(&sub, 0, 10)), [1, 2]);
        assert_eq!(hub.head(), 2);
        hub.wake();
        assert!(sub.head.has_changed().unwrap());
        assert_eq!(*sub.head.borrow_and_update(), 2);
        // Told already (a later publish woke them): no second wake.
        hub.publish([event(3)]);
        sub.head.borrow_and_update();
        hub.wake();
        assert!(!sub.head.has_changed().unwrap());
        assert_eq!(*sub.head.borrow(), 3);
    }

    #[test]
    fn duplicates_are_skipped_and_gaps_stop_publishing() {
        let hub = WatchHub::new(0, limits(10, 100));
        hub.publish([event(1), event(2)]);
        assert_eq!(hub.publish([event(2), event(4), event(5)]), 0);
        assert_eq!(hub.head(), 2);
        assert_eq!(hub.publish([event(3), event(4)]), 2);
    }

    #[test]
    fn a_subscriber_over_its_event_or_byte_budget_or_past_the_ring_is_too_slow() {
        let hub = WatchHub::new(0, limits(10, 2));
        let sub = hub.subscribe(0).unwrap();
        hub.publish((1..=5).map(event));
        assert_eq!(hub.read(&sub, 0, 10), Read::TooSlow { events: 5, bytes: 50 });
        assert_eq!(revisions(hub.read(&sub, 3, 10)), [4, 5]);

        let bytes = HubLimits { lag_bytes: 250, ..limits(10, 100) };
        let hub = WatchHub::new(0, bytes);
        let sub = hub.subscribe(0).unwrap();
        hub.publish([sized(1, 100), sized(2, 100), sized(3, 100)]);
        assert_eq!(hub.read(&sub, 0, 10), Read::TooSlow { events: 3, bytes: 300 });
        assert_eq!(revisions(hub.read(&sub, 1, 10)), [2, 3]);

        let hub = WatchHub::new(0, limits(2, 100));
        let sub = hub.subscribe(0).unwrap();
        hub.publish((1..=4).map(event));
        assert!(matches!(hub.read(&sub, 0, 10), Read::TooSlow { events: 4, .. }));
    }

    #[test]
    fn a_subscriber_further_behind_than_its_lag_budget_reads_the_database_first() {
        let hub = WatchHub::new(0, limits(10, 2));
        hub.publish((1..=5).map(event));
        // Held by the ring, but 3 or more behind: the database first.
        assert!(hub.subscribe(0).is_none());
        assert!(hub.subscribe(2).is_none());
        // Within the budget: live.
        let sub = hub.subscribe(3).unwrap();
        assert_eq!(revisions(hub.read(&sub, 3, 10)), [4, 5]);
        assert!(hub.subscribe(5).is_some());
        assert!(hub.subscribe(6).is_none(), "ahead of the head");
        // In bytes too.
        let hub = WatchHub::new(0, HubLimits { lag_bytes: 250, ..limits(10, 100) });
        hub.publish([sized(1, 100), sized(2, 100), sized(3, 100)]);
        assert!(hub.subscribe(0).is_none());
        assert!(hub.subscribe(1).is_some());
    }

    #[test]
    fn the_ring_is_bounded_in_bytes_but_keeps_the_newest_event() {
        let hub = WatchHub::new(0, HubLimits { cache_bytes: 250, ..limits(100, 100) });
        hub.publish([sized(1, 100), sized(2, 100), sized(3, 100)]);
        assert_eq!((hub.retained(), hub.retained_bytes()), (2, 200));
        hub.publish([sized(4, 1000)]);
        assert_eq!((hub.retained(), hub.retained_bytes()), (1, 1000));
        assert!(hub.subscribe(2).is_none());
        assert!(hub.subscribe(3).is_some());
    }

    #[test]
    fn reset_ends_subscribers() {
        let hub = WatchHub::new(0, limits(10, 4));
        let sub = hub.subscribe(0).unwrap();
        hub.reset(100);
        assert_eq!(hub.read(&sub, 0, 10), Read::Reset);
        assert_eq!(hub.head(), 100);
        let fresh = hub.subscribe(100).unwrap();
        assert_eq!(hub.read(&fresh, 100, 10), Read::Wait);
    }
}
