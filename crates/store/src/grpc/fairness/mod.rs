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

use gantry_core::Role;
use tokio::sync::oneshot;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::metrics::FairnessMetrics;

mod charge;
pub use charge::{Charge, OBJECT_CHARGE};

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
mod tests;
