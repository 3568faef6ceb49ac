//! Fair queuing per identity, after kube-apiserver's API Priority and
//! Fairness, kept small: each call (a watch until its stream starts) takes
//! a seat of its caller's priority level, and a caller who finds the level
//! full waits in a queue of its own.
//!
//! | level    | who                   | seats (flag)                  |
//! |----------|-----------------------|-------------------------------|
//! | exempt   | reconciler, admin     | never queued                  |
//! | editors  | editor                | `--fair-editor-concurrency`   |
//! | viewers  | viewer                | `--fair-viewer-concurrency`   |
//!
//! A call takes one seat, except a list, which takes one per
//! [`OBJECTS_PER_SEAT`] objects its page may hold (up to the level's
//! seats), as the API server estimates a LIST's work: concurrency alone
//! would let a level of cheap seats spend the CPU of many large pages.
//!
//! A freed seat goes to the next identity in round-robin order, so one
//! identity flooding from many connections gets one turn in N when N
//! identities wait, and never delays another level. A queue holds at most
//! `--fair-queue-length` calls of one identity and a call waits at most
//! `--fair-queue-wait`; past either it is refused RESOURCE_EXHAUSTED
//! (`TOO_MANY_REQUESTS`) with a retry delay, before any work is done.
//!
//! The retry delay is kept: a call of a refused identity that comes back
//! before it is held (no seat, no work) until the delay is over, then
//! admitted or refused as any other. A client ignoring the delay would
//! otherwise cost the store a refusal per call as fast as it can send
//! them (tens of thousands a second); held, it costs at most its
//! concurrency per delay, and the other levels keep the CPU.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use gantry_core::Role;
use tokio::sync::oneshot;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::metrics::FairnessMetrics;

/// How long a refused caller is told to wait.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Objects of a list page that cost one seat.
pub const OBJECTS_PER_SEAT: usize = 100;

/// The seats a call takes: one, or one per [`OBJECTS_PER_SEAT`] objects of
/// a list page of `page_size`.
pub fn width(page_size: Option<usize>) -> usize {
    page_size.map_or(1, |n| n.div_ceil(OBJECTS_PER_SEAT).max(1))
}

/// The limits of the levels that queue.
#[derive(Debug, Clone, Copy)]
pub struct FairnessLimits {
    pub editor_seats: usize,
    pub viewer_seats: usize,
    /// Calls of one identity waiting at one level.
    pub queue_length: usize,
    /// The longest a call waits for a seat.
    pub queue_wait: Duration,
}

impl Default for FairnessLimits {
    fn default() -> Self {
        Self {
            editor_seats: 32,
            viewer_seats: 16,
            queue_length: 64,
            queue_wait: Duration::from_secs(5),
        }
    }
}

/// The levels and their queues.
#[derive(Debug)]
pub struct Fairness {
    editors: Arc<Level>,
    viewers: Arc<Level>,
    limits: FairnessLimits,
}

/// Seats held by one call, given back when dropped (a call's end, a
/// watch's start).
#[derive(Debug)]
pub struct Seat {
    level: Option<Arc<Level>>,
    width: usize,
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Some(level) = self.level.take() {
            level.release(self.width);
        }
    }
}

/// A call's seats kept until its answer is written (encoding and writing a
/// page of objects is work of the call too): put in the response's
/// extensions by the handler and held in the response body by the
/// observe layer until the body's last frame.
#[derive(Debug, Clone)]
pub struct AnswerSeat {
    _seat: Arc<Seat>,
}

impl AnswerSeat {
    /// `message` as a response holding `seat`.
    pub fn respond<T>(seat: Seat, message: T) -> tonic::Response<T> {
        let mut response = tonic::Response::new(message);
        response.extensions_mut().insert(AnswerSeat { _seat: Arc::new(seat) });
        response
    }
}

/// A waiting call: its id, its width and where its seats go.
type Waiter = (u64, usize, oneshot::Sender<Seat>);

#[derive(Debug, Default)]
struct Queues {
    seats: usize,
    free: usize,
    /// Waiting calls by identity, oldest first.
    waiting: HashMap<String, VecDeque<Waiter>>,
    /// Identities with waiting calls, in turn order.
    turns: VecDeque<String>,
    queued: usize,
    next_id: u64,
    /// When each identity refused lately was told to come back.
    retry_at: HashMap<String, Instant>,
}

/// Identities whose retry times are kept before the passed ones are
/// dropped.
const RETRY_TIMES_KEPT: usize = 1024;

/// One priority level.
#[derive(Debug)]
struct Level {
    name: &'static str,
    queues: Mutex<Queues>,
    metrics: FairnessMetrics,
}

impl Fairness {
    pub fn new(limits: FairnessLimits, metrics: &FairnessMetrics) -> Self {
        let level = |name, seats: usize| {
            Arc::new(Level {
                name,
                queues: Mutex::new(Queues {
                    seats: seats.max(1),
                    free: seats.max(1),
                    ..Default::default()
                }),
                metrics: metrics.clone(),
            })
        };
        Self {
            editors: level("editors", limits.editor_seats),
            viewers: level("viewers", limits.viewer_seats),
            limits,
        }
    }

    /// `width` seats (see [`width`]) for a call of `subject` with `role`:
    /// at once, after a wait in its identity's queue, or
    /// RESOURCE_EXHAUSTED.
    pub async fn admit(&self, subject: &str, role: Role, width: usize) -> Result<Seat, Status> {
        let level = match role {
            Role::Reconciler | Role::Admin => return Ok(Seat { level: None, width: 0 }),
            Role::Editor => &self.editors,
            Role::Viewer => &self.viewers,
        };
        level.acquire(subject, width, &self.limits).await
    }
}

impl Level {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn acquire(
        self: &Arc<Self>,
        who: &str,
        width: usize,
        limits: &FairnessLimits,
    ) -> Result<Seat, Status> {
        if let Some(at) = self.retry_time(who) {
            self.metrics.early_retries(self.name).inc();
            tokio::time::sleep_until(at).await;
        }
        let (id, seat) = {
            let mut q = self.lock();
            let width = width.clamp(1, q.seats);
            if q.free >= width && q.queued == 0 {
                q.free -= width;
                self.metrics.in_flight(self.name).inc_by(gauge(width));
                return Ok(Seat { level: Some(self.clone()), width });
            }
            let waiting = q.waiting.get(who).map_or(0, VecDeque::len);
            if waiting >= limits.queue_length {
                drop(q);
                return Err(self.refuse(
                    who,
                    format!("{waiting} calls are queued, the most one identity may"),
                ));
            }
            let (tx, rx) = oneshot::channel();
            q.next_id += 1;
            let id = q.next_id;
            if waiting == 0 {
                q.turns.push_back(who.to_string());
            }
            q.waiting.entry(who.to_string()).or_default().push_back((id, width, tx));
            q.queued += 1;
            self.metrics.queued(self.name).set(gauge(q.queued));
            (id, rx)
        };
        let started = Instant::now();
        let waited = tokio::time::timeout(limits.queue_wait, seat).await;
        self.metrics.wait(self.name).observe(started.elapsed().as_secs_f64());
        match waited {
            Ok(Ok(seat)) => Ok(seat),
            _ => {
                self.forget(who, id);
                Err(self.refuse(who, format!("no seat within {:?}", limits.queue_wait)))
            }
        }
    }

    /// When `who` was told to retry, if that is still to come.
    fn retry_time(&self, who: &str) -> Option<Instant> {
        let now = Instant::now();
        let mut q = self.lock();
        if q.retry_at.len() > RETRY_TIMES_KEPT {
            q.retry_at.retain(|_, at| *at > now);
        }
        let at = *q.retry_at.get(who)?;
        if at <= now {
            q.retry_at.remove(who);
            return None;
        }
        Some(at)
    }

    /// Takes a timed-out waiter out of its queue.
    fn forget(&self, who: &str, id: u64) {
        let mut q = self.lock();
        if let Some(queue) = q.waiting.get_mut(who) {
            let before = queue.len();
            queue.retain(|(i, _, _)| *i != id);
            let removed = before - queue.len();
            if queue.is_empty() {
                q.waiting.remove(who);
                q.turns.retain(|w| w != who);
            }
            q.queued -= removed;
            self.metrics.queued(self.name).set(gauge(q.queued));
        }
    }

    fn refuse(&self, who: &str, why: String) -> Status {
        self.metrics.rejected(self.name).inc();
        self.lock().retry_at.insert(who.to_string(), Instant::now() + RETRY_AFTER);
        let mut details = ErrorDetails::with_error_info(
            gantry_api::reasons::TOO_MANY_REQUESTS,
            gantry_api::reasons::ERROR_DOMAIN,
            HashMap::from([("level".to_string(), self.name.to_string())]),
        );
        details.set_retry_info(Some(RETRY_AFTER));
        Status::with_error_details(
            Code::ResourceExhausted,
            format!(
                "too many calls of {who} at priority level {}: {why}; retry after {RETRY_AFTER:?}",
                self.name
            ),
            details,
        )
    }

    /// Takes back `width` seats and hands seats to the oldest waiter of
    /// each identity in turn while enough are free (a wide list waits for
    /// its seats; the identities behind it wait their turn, as in the API
    /// server).
    fn release(self: Arc<Self>, width: usize) {
        let mut q = self.lock();
        q.free += width;
        self.metrics.in_flight(self.name).dec_by(gauge(width));
        while let Some(who) = q.turns.front().cloned() {
            let Some(needed) = q.waiting.get(&who).and_then(|w| w.front()).map(|w| w.1) else {
                q.waiting.remove(&who);
                q.turns.pop_front();
                continue;
            };
            if needed > q.free {
                break;
            }
            let Some((_, _, waiter)) = q.waiting.get_mut(&who).and_then(VecDeque::pop_front) else {
                break;
            };
            if q.waiting.get(&who).is_some_and(VecDeque::is_empty) {
                q.waiting.remove(&who);
            }
            q.turns.pop_front();
            if q.waiting.contains_key(&who) {
                q.turns.push_back(who);
            }
            q.queued -= 1;
            q.free -= needed;
            self.metrics.in_flight(self.name).inc_by(gauge(needed));
            let seat = Seat { level: Some(self.clone()), width: needed };
            if let Err(mut back) = waiter.send(seat) {
                // Its caller gave up: the seats are free again (disarmed,
                // so that dropping them does not release them twice).
                back.level = None;
                q.free += needed;
                self.metrics.in_flight(self.name).dec_by(gauge(needed));
            }
        }
        self.metrics.queued(self.name).set(gauge(q.queued));
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fairness(seats: usize, queue_length: usize) -> Fairness {
        let limits = FairnessLimits {
            editor_seats: seats,
            viewer_seats: seats,
            queue_length,
            queue_wait: Duration::from_secs(60),
        };
        Fairness::new(limits, &FairnessMetrics::default())
    }

    #[tokio::test(start_paused = true)]
    async fn seats_go_round_robin_between_identities() {
        let f = Arc::new(fairness(1, 10));
        let held = f.admit("flood", Role::Viewer, 1).await.unwrap();
        // The flood queues three calls, then alice one.
        let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        for who in ["flood", "flood", "flood", "alice"] {
            let (f, tx) = (f.clone(), tx.clone());
            tokio::spawn(async move {
                let seat = f.admit(who, Role::Viewer, 1).await.unwrap();
                tx.send(who).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(seat);
            });
            tokio::task::yield_now().await;
        }
        drop(held);
        let mut served = Vec::new();
        for _ in 0..4 {
            served.push(order.recv().await.unwrap());
        }
        // Alice's one call is served second, not after the flood's three.
        assert_eq!(served, ["flood", "alice", "flood", "flood"]);
    }

    #[tokio::test(start_paused = true)]
    async fn full_queues_and_long_waits_are_refused_and_other_levels_never_wait() {
        let f = Arc::new(fairness(1, 2));
        let _held = f.admit("flood", Role::Viewer, 1).await.unwrap();
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let f = f.clone();
                tokio::spawn(async move { f.admit("flood", Role::Viewer, 1).await.map(drop) })
            })
            .collect();
        tokio::task::yield_now().await;
        let refused = f.admit("flood", Role::Viewer, 1).await.unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(refused.message().contains("2 calls are queued"), "{refused:?}");
        let details = refused.get_error_details();
        assert_eq!(details.retry_info().and_then(|r| r.retry_delay), Some(RETRY_AFTER));
        // Editors, the reconciler and admins do not wait for viewers.
        let _editor = f.admit("eddie", Role::Editor, 1).await.unwrap();
        let _reconciler = f.admit("gateway-reconciler", Role::Reconciler, 1).await.unwrap();
        // A queued call waits at most the queue wait.
        for w in waiting {
            let timed_out = w.await.unwrap().unwrap_err();
            assert!(timed_out.message().contains("no seat within"), "{timed_out:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_back_before_its_retry_delay_is_held_until_it_ends() {
        let f = Arc::new(fairness(1, 0));
        let held = f.admit("flood", Role::Viewer, 1).await.unwrap();
        let refused_at = Instant::now();
        f.admit("flood", Role::Viewer, 1).await.unwrap_err();
        // Back at once: held for the delay (no seat taken), then judged
        // as any call: the seat is still taken, so refused again.
        let again = f.admit("flood", Role::Viewer, 1).await.unwrap_err();
        assert_eq!(again.code(), Code::ResourceExhausted);
        assert_eq!(refused_at.elapsed(), RETRY_AFTER, "not held for the retry delay");
        // Another identity is not held (refused at once: no seat, no queue).
        let other_at = Instant::now();
        f.admit("alice", Role::Viewer, 1).await.unwrap_err();
        assert_eq!(other_at.elapsed(), Duration::ZERO);
        // Back after the delay, with a seat free: served at once.
        drop(held);
        tokio::time::sleep(RETRY_AFTER).await;
        let back_at = Instant::now();
        let _seat = f.admit("flood", Role::Viewer, 1).await.unwrap();
        assert_eq!(back_at.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_gave_up_does_not_keep_the_seat() {
        let f = Arc::new(fairness(1, 10));
        let held = f.admit("a", Role::Viewer, 1).await.unwrap();
        let gave_up = {
            let f = f.clone();
            tokio::spawn(async move { f.admit("b", Role::Viewer, 1).await })
        };
        tokio::task::yield_now().await;
        gave_up.abort();
        let _ = gave_up.await;
        drop(held);
        // The seat is free again: the next call takes it at once.
        let again =
            tokio::time::timeout(Duration::from_millis(1), f.admit("c", Role::Viewer, 1)).await;
        assert!(again.is_ok_and(|s| s.is_ok()), "the seat was lost");
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_takes_seats_by_its_page_and_waits_for_them() {
        assert_eq!((width(None), width(Some(1)), width(Some(100)), width(Some(101))), (1, 1, 1, 2));
        let f = Arc::new(fairness(4, 10));
        // A page of 1,000 takes every seat of the level (4), not 10.
        let wide = f.admit("lister", Role::Viewer, width(Some(1000))).await.unwrap();
        let small = {
            let f = f.clone();
            tokio::spawn(async move { f.admit("other", Role::Viewer, 1).await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert!(!small.is_finished(), "a call got a seat while a full-width list held them all");
        drop(wide);
        small.await.unwrap().unwrap();
        // Two pages of 200 fit beside each other; a third waits.
        let (a, b) = (
            f.admit("x", Role::Viewer, width(Some(200))).await.unwrap(),
            f.admit("y", Role::Viewer, width(Some(200))).await.unwrap(),
        );
        let third = {
            let f = f.clone();
            tokio::spawn(
                async move { f.admit("z", Role::Viewer, width(Some(200))).await.map(drop) },
            )
        };
        tokio::task::yield_now().await;
        assert!(!third.is_finished());
        drop(a);
        third.await.unwrap().unwrap();
        drop(b);
    }
}
