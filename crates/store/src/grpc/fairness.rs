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
//! A level may also have a byte rate (`--fair-viewer-bytes-per-second`):
//! a call's seats are then held, after its answer is written, until the
//! level's share of that rate would have sent the answer (a page charged
//! B bytes on w of the level's S seats holds them B·S / (w·R) seconds from
//! its admission). An answer is charged its encoded bytes, each object in
//! it at least [`OBJECT_CHARGE`]: reading, copying and framing an object
//! costs CPU beyond its bytes. Seats bound how many calls run at once, not
//! what they cost: a flood of lists would otherwise turn every seat over as
//! fast as pages can be read and written, on CPU (the database's, the
//! runtime's workers', the socket's) that is the editors' and the
//! reconciler's too. Held seats bound the level's answers per second
//! whatever a list costs; callers past that wait in their queues and are
//! refused as above.
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

use gantry_api::v1::{Gateway, ListGatewaysResponse};
use gantry_core::Role;
use prost::Message as _;
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

/// The viewers' answer bytes per second by default: 8,192 objects of up
/// to 1 KiB a second (a list of 10,000 gateways in about a second and a
/// quarter), which on a 2-core store keeps the editors' and the
/// reconciler's p99 within 2× of their unloaded p99 under a flood of lists
/// (docs/reliability.md, "Fairness").
pub const DEFAULT_VIEWER_BYTES_PER_SECOND: u64 = 8 * 1024 * 1024;

/// The least an object in an answer is charged, whatever its size.
pub const OBJECT_CHARGE: usize = 1024;

/// What an answer is charged against its level's byte rate.
pub trait Charge {
    /// Its encoded bytes, each object in it at least [`OBJECT_CHARGE`].
    fn charge(&self) -> usize;
}

impl Charge for Gateway {
    fn charge(&self) -> usize {
        self.encoded_len().max(OBJECT_CHARGE)
    }
}

impl Charge for ListGatewaysResponse {
    fn charge(&self) -> usize {
        let encoded = self.encoded_gateways.iter().map(|g| g.len().max(OBJECT_CHARGE));
        let decoded = self.gateways.iter().map(Charge::charge);
        encoded.chain(decoded).sum::<usize>()
            + self.next_page_token.len()
            + std::mem::size_of_val(&self.resource_version)
    }
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
    /// Bytes of answers per second the viewers' level sends at most (its
    /// seats are held until then); 0 for no bound.
    pub viewer_bytes_per_second: u64,
}

impl Default for FairnessLimits {
    fn default() -> Self {
        Self {
            editor_seats: 32,
            viewer_seats: 16,
            queue_length: 64,
            queue_wait: Duration::from_secs(5),
            viewer_bytes_per_second: DEFAULT_VIEWER_BYTES_PER_SECOND,
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
    /// When the seats were taken, and until when they are held at least
    /// (set by the answer's bytes).
    taken: Instant,
    until: Instant,
}

impl Seat {
    fn new(level: Option<Arc<Level>>, width: usize) -> Seat {
        let taken = Instant::now();
        Seat { level, width, taken, until: taken }
    }

    /// Charges an answer of `bytes` to the seats' level: they are held at
    /// least until the level's byte rate would have sent it.
    fn charge(&mut self, bytes: usize) {
        let Some(level) = &self.level else { return };
        level.metrics.answer_bytes(level.name).inc_by(bytes as u64);
        if let Some(hold) = level.hold(bytes, self.width) {
            self.until = self.taken + hold;
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let Some(level) = self.level.take() else { return };
        let (width, until) = (self.width, self.until);
        if until <= Instant::now() {
            return level.release(width);
        }
        // Held on past the call: given back by a timer, or at once when
        // there is no runtime to run it (the store is stopping).
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                tokio::time::sleep_until(until).await;
                level.release(width);
            })),
            Err(_) => level.release(width),
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
    /// `message` as a response holding `seat`, charged with its
    /// [`Charge`].
    pub fn respond<T: Charge>(mut seat: Seat, message: T) -> tonic::Response<T> {
        seat.charge(message.charge());
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
    /// When the next call of each identity refused lately is let go: when
    /// it was told to come back, or later while its held calls are let go
    /// one by one.
    retry_at: HashMap<String, Instant>,
}

/// Held calls of one identity are let go one per this interval once its
/// retry delay is over: a flood's calls all held to the same instant would
/// otherwise be judged (and most refused again) in one burst, which takes
/// the CPU from every other call for the milliseconds it lasts, once per
/// delay.
const HELD_SPACING: Duration = Duration::from_millis(1);

/// Identities whose retry times are kept before the passed ones are
/// dropped.
const RETRY_TIMES_KEPT: usize = 1024;

/// One priority level.
#[derive(Debug)]
struct Level {
    name: &'static str,
    /// Answer bytes per second the level sends at most; 0 for no bound.
    bytes_per_second: u64,
    queues: Mutex<Queues>,
    metrics: FairnessMetrics,
}

impl Fairness {
    pub fn new(limits: FairnessLimits, metrics: &FairnessMetrics) -> Self {
        let level = |name, seats: usize, bytes_per_second| {
            Arc::new(Level {
                name,
                bytes_per_second,
                queues: Mutex::new(Queues {
                    seats: seats.max(1),
                    free: seats.max(1),
                    ..Default::default()
                }),
                metrics: metrics.clone(),
            })
        };
        Self {
            editors: level("editors", limits.editor_seats, 0),
            viewers: level("viewers", limits.viewer_seats, limits.viewer_bytes_per_second),
            limits,
        }
    }

    /// `width` seats (see [`width`]) for a call of `subject` with `role`:
    /// at once, after a wait in its identity's queue, or
    /// RESOURCE_EXHAUSTED.
    pub async fn admit(&self, subject: &str, role: Role, width: usize) -> Result<Seat, Status> {
        let level = match role {
            Role::Reconciler | Role::Admin => return Ok(Seat::new(None, 0)),
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
                return Ok(Seat::new(Some(self.clone()), width));
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

    /// How long `width` of the level's seats are held for an answer of
    /// `bytes`: the level's seats together send `bytes_per_second`, these
    /// their share of it. `None` without a byte rate.
    fn hold(&self, bytes: usize, width: usize) -> Option<Duration> {
        if self.bytes_per_second == 0 {
            return None;
        }
        let seats = self.lock().seats;
        let share = self.bytes_per_second as f64 * width as f64 / seats as f64;
        Some(Duration::from_secs_f64(bytes as f64 / share))
    }

    /// Until when a call of `who` is held: the end of its retry delay, or
    /// [`HELD_SPACING`] after the call held before it; `None` when the
    /// delay is over and no call is held.
    fn retry_time(&self, who: &str) -> Option<Instant> {
        let now = Instant::now();
        let mut q = self.lock();
        if q.retry_at.len() > RETRY_TIMES_KEPT {
            q.retry_at.retain(|_, next| *next > now);
        }
        let next = q.retry_at.get_mut(who)?;
        if *next <= now {
            q.retry_at.remove(who);
            return None;
        }
        let release = *next;
        *next = release + HELD_SPACING;
        Some(release)
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
        let at = Instant::now() + RETRY_AFTER;
        let mut q = self.lock();
        // Calls held already keep their turns; the next comes after them.
        let next = q.retry_at.entry(who.to_string()).or_insert(at);
        *next = (*next).max(at);
        drop(q);
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
            let seat = Seat::new(Some(self.clone()), needed);
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
        with_byte_rate(seats, queue_length, 0)
    }

    fn with_byte_rate(seats: usize, queue_length: usize, viewer_bytes_per_second: u64) -> Fairness {
        let limits = FairnessLimits {
            editor_seats: seats,
            viewer_seats: seats,
            queue_length,
            queue_wait: Duration::from_secs(60),
            viewer_bytes_per_second,
        };
        Fairness::new(limits, &FairnessMetrics::default())
    }

    /// How long after `from` a call of `who` with `width` gets its seats.
    async fn seated_after(f: &Fairness, from: Instant, width: usize) -> (Seat, Duration) {
        let seat = f.admit("next", Role::Viewer, width).await.unwrap();
        (seat, from.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn answers_hold_their_seats_until_the_levels_byte_rate_has_sent_them() {
        // Four seats sending 1,000 bytes a second together.
        let f = Arc::new(with_byte_rate(4, 100, 1000));
        // A page on every seat, of 500 bytes: held half a second from its
        // admission, though answered at once.
        let start = Instant::now();
        let mut page = f.admit("lister", Role::Viewer, 4).await.unwrap();
        page.charge(500);
        drop(page);
        let (seat, waited) = seated_after(&f, start, 4).await;
        assert_eq!(waited, Duration::from_millis(500));
        drop(seat);
        // One seat has a quarter of the rate: 500 bytes hold it 2 s, and
        // the other three seats stay free meanwhile.
        let start = Instant::now();
        let mut one = f.admit("getter", Role::Viewer, 1).await.unwrap();
        one.charge(500);
        drop(one);
        let (three, waited) = seated_after(&f, start, 3).await;
        assert_eq!(waited, Duration::ZERO);
        let (_all, waited) = seated_after(&f, start, 1).await;
        assert_eq!(waited, Duration::from_secs(2));
        drop(three);
        // An answer that took longer than its bytes' share is not held on.
        let mut slow = f.admit("slow", Role::Viewer, 1).await.unwrap();
        slow.charge(100);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let start = Instant::now();
        drop(slow);
        let (_seat, waited) = seated_after(&f, start, 3).await;
        assert_eq!(waited, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_byte_rate_and_on_the_editors_level_seats_are_given_back_at_once() {
        for (f, role) in
            [(with_byte_rate(1, 10, 0), Role::Viewer), (with_byte_rate(1, 10, 1), Role::Editor)]
        {
            let mut seat = f.admit("a", role, 1).await.unwrap();
            seat.charge(1_000_000);
            drop(seat);
            let start = Instant::now();
            let _next = f.admit("b", role, 1).await.unwrap();
            assert_eq!(start.elapsed(), Duration::ZERO, "{role:?}");
        }
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
    async fn calls_held_to_one_retry_time_are_let_go_one_by_one() {
        let f = Arc::new(fairness(1, 0));
        let _held = f.admit("flood", Role::Viewer, 1).await.unwrap();
        let refused_at = Instant::now();
        f.admit("flood", Role::Viewer, 1).await.unwrap_err();
        let back: Vec<_> = (0..10)
            .map(|_| {
                let f = f.clone();
                tokio::spawn(async move {
                    let refused = f.admit("flood", Role::Viewer, 1).await.unwrap_err();
                    assert_eq!(refused.code(), Code::ResourceExhausted);
                    refused_at.elapsed()
                })
            })
            .collect();
        let mut judged = Vec::new();
        for call in back {
            judged.push(call.await.unwrap());
        }
        judged.sort();
        let spaced: Vec<_> = (0..10).map(|i| RETRY_AFTER + HELD_SPACING * i).collect();
        assert_eq!(judged, spaced, "not let go one per {HELD_SPACING:?}");
    }

    #[test]
    fn an_answer_is_charged_its_bytes_and_each_object_at_least_a_kib() {
        let small = Gateway::default();
        assert_eq!(small.charge(), OBJECT_CHARGE);
        let big = Gateway {
            metadata: Some(gantry_api::v1::ObjectMeta {
                name: "x".repeat(5000),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(big.charge(), big.encoded_len());
        let page = ListGatewaysResponse {
            encoded_gateways: vec![small.encode_to_vec().into(), big.encode_to_vec().into()],
            next_page_token: "t".repeat(10),
            resource_version: 7,
            ..Default::default()
        };
        assert_eq!(page.charge(), OBJECT_CHARGE + big.encoded_len() + 10 + 8);
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
