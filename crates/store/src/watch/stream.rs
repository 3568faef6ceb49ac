//! WatchGateways: every change after a revision, in revision order, with
//! no gaps and no duplicates.
//!
//! A watch walks through up to three sources, always continuing from the
//! last revision it processed:
//!
//! ```text
//! initial objects (send_initial_events) ─► BOOKMARK(initial_events_end)
//! events table, page by page (resume older than the watch cache)
//! watch cache backlog + live broadcast ─► periodic BOOKMARKs
//! ```
//!
//! The stream is pulled by the gRPC layer: nothing is buffered per
//! subscriber beyond one page read from the database (bounded in bytes,
//! and charged to its identity's [`Budget`]); live events are shared with
//! the watch cache. A subscriber that stops
//! reading falls behind its budget (events or bytes) and is ended with
//! [`WatchEnd::TooSlow`] when it next reads.
//!
//! Items are domain values: the gRPC edge turns a [`WatchEnd`] into a
//! status.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use gantry_api::v1::{EventType, WatchEvent};
use gantry_runtime::Shutdown;
use tokio::time::Instant;

use super::budget::{Budget, Charge, BUDGET_WAIT};
use super::filter::Filter;
use super::hub::{Read, Subscription, WatchHub, WATCH_PAGE_BYTES};
use crate::storage::{Event, Page, Storage, StorageError, Stored};

/// Events read per query when a watch resumes from the events table.
const CATCH_UP_PAGE: usize = 500;
/// Events taken from the watch cache at a time.
const LIVE_READ: usize = 64;
/// Gateways read per query for `send_initial_events`.
const INITIAL_PAGE: usize = 100;
/// The default of [`WatchContext::coalesce`] (`--watch-coalesce`).
pub const DEFAULT_COALESCE: Duration = Duration::from_millis(2);

/// Watch settings shared by every stream.
#[derive(Debug, Clone)]
pub struct WatchContext {
    pub storage: Arc<dyn Storage>,
    pub hub: Arc<WatchHub>,
    pub bookmark_interval: Duration,
    /// The longest an event is held back to go out with the next ones.
    pub coalesce: Duration,
    pub shutdown: Shutdown,
    /// Watchers ended for falling behind (`WATCHER_TOO_SLOW`).
    pub too_slow: prometheus_client::metrics::counter::Counter,
}

/// The initial objects of a `send_initial_events` watch, read page by page
/// as of the watch's starting revision while the subscriber reads.
struct Initial {
    page: std::vec::IntoIter<Stored>,
    /// The last name read; more follow when `more`.
    after: String,
    more: bool,
    /// The page's bytes, held of the identity's budget until it is read.
    _charge: Option<Charge>,
}

impl Initial {
    /// None read yet: the first page is read (and charged) when the
    /// subscriber first pulls, so opening a watch never waits for a budget.
    fn unread() -> Self {
        Initial { page: Vec::new().into_iter(), after: String::new(), more: true, _charge: None }
    }

    /// The page after `after` as of `at`, once `charge` holds its bytes.
    async fn read(
        storage: &dyn Storage,
        mut charge: Charge,
        after: String,
        at: i64,
    ) -> Result<Self, StorageError> {
        let at = Some(at);
        let page = Page { after: &after, limit: INITIAL_PAGE, max_bytes: WATCH_PAGE_BYTES, at };
        let snapshot = storage.list(page).await?;
        charge.resize(snapshot.gateways.iter().map(|g| g.encoded.len() as u64).sum());
        let after = snapshot.gateways.last().map_or(after, |g| g.name.clone());
        Ok(Initial {
            page: snapshot.gateways.into_iter(),
            after,
            more: snapshot.more,
            _charge: Some(charge),
        })
    }
}

struct State {
    ctx: WatchContext,
    /// The page bytes this subscriber's identity may hold.
    budget: Arc<Budget>,
    filter: Filter,
    /// Every change up to here has been processed for this subscriber.
    last: i64,
    initial: Option<Initial>,
    pending: VecDeque<Arc<Event>>,
    /// While `pending` holds a page read from the database: its bytes.
    pending_charge: Option<Charge>,
    live: Option<Subscription>,
    bookmarks: Option<tokio::time::Interval>,
    /// Completes when the store stops. Made once: each new wait would join
    /// (and each dropped one leave) the waiter list of the shutdown signal,
    /// which every watch of the store shares, at every wait for an event
    /// (12 % of the store's CPU with 1,000 watches, docs/benchmarks.md).
    stop: futures_util::future::Fuse<Pin<Box<dyn Future<Output = ()> + Send>>>,
    stopping: bool,
    /// Waited [`BUDGET_WAIT`] for its identity's budget.
    over_budget: bool,
    /// When the stream last read the watch cache after waiting for it.
    woken: Option<Instant>,

    done: bool,
}

impl State {
    /// Ends the stream: `why`, and (in it) where to resume.
    fn end(&mut self, why: impl FnOnce(i64) -> WatchEnd) -> WatchEnd {
        self.done = true;
        why(self.last)
    }
}

/// Why a watch ended before its subscriber closed it. `last`: every change
/// up to this revision was delivered; the subscriber resumes after it.
#[derive(Debug)]
pub enum WatchEnd {
    /// The store is stopping (everything committed before was delivered).
    ShuttingDown { last: i64 },
    /// The subscriber fell behind its budget of events or bytes.
    TooSlow { last: i64, events: i64, bytes: u64 },
    /// The watch cache was reset (it fell behind compaction).
    Reset { last: i64 },
    /// Its identity's other watches held their budget of page bytes
    /// unread for [`BUDGET_WAIT`]. `resume`: where to resume; `None` in
    /// the initial objects (start again with them).
    OverBudget { resume: Option<i64> },
    /// Reading the database failed.
    Storage(StorageError),
}

/// What a subscriber asked for, checked by the caller.
#[derive(Debug, Clone)]
pub struct Params {
    pub filter: Filter,
    /// 0: from now; else every change after this revision.
    pub resource_version: i64,
    /// The matching objects first, then a BOOKMARK marking their end.
    pub send_initial_events: bool,
    /// Periodic BOOKMARKs with the revision reached.
    pub allow_bookmarks: bool,
}

/// The events of one watch, pulled by its subscriber.
pub type Events = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<WatchEvent, WatchEnd>> + Send + 'static>,
>;

fn bookmark(revision: i64) -> WatchEvent {
    WatchEvent {
        r#type: EventType::Bookmark as i32,
        resource_version: revision,
        ..Default::default()
    }
}

/// A committed change as sent: the object's bytes as encoded at commit,
/// shared with every other subscriber.
fn change_out(kind: EventType, event: &Event) -> WatchEvent {
    WatchEvent {
        r#type: kind as i32,
        encoded_gateway: Some(event.encoded.clone()),
        resource_version: event.revision,
        ..Default::default()
    }
}

/// Starts a watch whose database pages are charged to `budget`; fails
/// when `params.resource_version` is ahead of the store
/// (`StorageError::Future`) or the database cannot be read.
pub async fn start(
    ctx: WatchContext,
    params: Params,
    budget: Arc<Budget>,
) -> Result<Events, StorageError> {
    let Params { filter, resource_version, send_initial_events, allow_bookmarks } = params;
    // A revision ahead of this replica's cache may have been committed
    // through another replica: only the database can say it is ahead.
    if resource_version > ctx.hub.head() {
        let current = ctx.storage.current_revision().await?;
        if resource_version > current {
            return Err(StorageError::Future { requested: resource_version, current });
        }
    }
    let (last, initial) = if send_initial_events {
        // The initial objects are those as of this revision.
        (ctx.storage.current_revision().await?, Some(Initial::unread()))
    } else if resource_version == 0 {
        (ctx.hub.head(), None)
    } else {
        (resource_version, None)
    };
    let bookmarks = allow_bookmarks.then(|| {
        let mut interval = tokio::time::interval(ctx.bookmark_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.reset();
        interval
    });
    let stop = (Box::pin(ctx.shutdown.wait()) as Pin<Box<dyn Future<Output = ()> + Send>>).fuse();
    let state = State {
        ctx,
        budget,
        filter,
        last,
        initial,
        pending: VecDeque::new(),
        pending_charge: None,
        live: None,
        bookmarks,
        stop,
        stopping: false,
        over_budget: false,
        woken: None,
        done: false,
    };
    Ok(Box::pin(futures_util::stream::unfold(state, |mut state| async move {
        let item = next(&mut state).await?;
        Some((item, state))
    })))
}

/// A stream item: the next event, or why the watch ended (`None` once it
/// has ended).
type Item = Option<Result<WatchEvent, WatchEnd>>;

async fn next(s: &mut State) -> Item {
    loop {
        if s.done {
            return None;
        }
        if s.initial.is_some() {
            if let Some(item) = next_initial(s).await {
                return item;
            }
            continue;
        }
        if let Some(event) = s.pending.pop_front() {
            if event.revision <= s.last {
                continue;
            }
            s.last = event.revision;
            if let Some(kind) = s.filter.apply(&event) {
                return Some(Ok(change_out(kind, &event)));
            }
            continue;
        }
        // The database page is drained: its bytes go back.
        s.pending_charge = None;
        if s.live.is_none() && s.stopping {
            return Some(Err(s.end(|last| WatchEnd::ShuttingDown { last })));
        }
        if s.over_budget {
            return Some(Err(s.end(|last| WatchEnd::OverBudget { resume: Some(last) })));
        }
        if s.live.is_none() {
            if let Err(e) = attach(s).await {
                s.done = true;
                return Some(Err(WatchEnd::Storage(e)));
            }
            continue;
        }
        if let Some(item) = next_live(s).await {
            return item;
        }
    }
}

/// The next of the initial objects, or the BOOKMARK that ends them;
/// `None` to go on (an object the filter skips, a page read).
async fn next_initial(s: &mut State) -> Option<Item> {
    let initial = s.initial.as_mut()?;
    if let Some(gateway) = initial.page.next() {
        if !s.filter.matches(&gateway) {
            return None;
        }
        // Its bytes as stored, as every change is sent.
        return Some(Some(Ok(WatchEvent {
            r#type: EventType::Added as i32,
            encoded_gateway: Some(gateway.encoded),
            resource_version: gateway.resource_version,
            ..Default::default()
        })));
    }
    if initial.more {
        let after = std::mem::take(&mut initial.after);
        // The drained page's bytes go back before the next is charged.
        *initial = Initial::unread();
        let Some(charge) = s.budget.charge_within(WATCH_PAGE_BYTES as u64, BUDGET_WAIT).await
        else {
            return Some(Some(Err(s.end(|_| WatchEnd::OverBudget { resume: None }))));
        };
        match Initial::read(s.ctx.storage.as_ref(), charge, after, s.last).await {
            Ok(next) => s.initial = Some(next),
            Err(e) => {
                s.done = true;
                return Some(Some(Err(WatchEnd::Storage(e))));
            }
        }
        return None;
    }
    s.initial = None;
    let mut end = bookmark(s.last);
    end.initial_events_end = true;
    Some(Some(Ok(end)))
}

/// Takes the next events from the watch cache into `pending`, or waits
/// for the head to move (or the stop, or a BOOKMARK's tick); an item when
/// the watch ends or a BOOKMARK is due, `None` to go on.
async fn next_live(s: &mut State) -> Option<Item> {
    let live = s.live.as_mut()?;
    // Seen before reading: a publish after this read wakes the wait.
    live.head.borrow_and_update();
    match s.ctx.hub.read(live, s.last, LIVE_READ) {
        Read::Events(events) => {
            s.pending.extend(events);
            return None;
        }
        Read::Wait if s.stopping => {
            return Some(Some(Err(s.end(|last| WatchEnd::ShuttingDown { last }))));
        }
        Read::Wait => {}
        Read::TooSlow { events, bytes } => {
            s.ctx.too_slow.inc();
            return Some(Some(Err(s.end(|last| WatchEnd::TooSlow { last, events, bytes }))));
        }
        Read::Reset => {
            return Some(Some(Err(s.end(|last| WatchEnd::Reset { last }))));
        }
    }
    tokio::select! {
        biased;
        // Deliver what was committed before the stop, then end.
        () = &mut s.stop, if !s.stopping => s.stopping = true,
        changed = live.head.changed() => {
            if changed.is_err() {
                // The hub is gone: the store is stopping.
                s.stopping = true;
            } else {
                gather(s).await;
            }
        }
        _ = tick(&mut s.bookmarks) => {
            return Some(Some(Ok(bookmark(s.last))));
        }
    }
    None
}

/// Before a woken stream reads the watch cache it may wait, at most
/// [`WatchContext::coalesce`], so that the events committed meanwhile go
/// out together: tonic writes the messages a stream has ready in one
/// HTTP/2 DATA frame, and a frame per event per watcher is most of a busy
/// watch's cost. It waits when woken again within the window of its
/// previous wake-up (for the rest of that window), or when it runs more
/// than a window after the publish that woke it (the store is busy: for a
/// window from now, while the writer and the other streams run: the
/// writer's next commits land in it). A stream woken on time after a
/// quiet window reads at once. (Skipping the wait after one that gathered
/// a lone event was measured: the back-to-back gain is gone, as it comes
/// from every busy stream waiting, which lets the writer run.)
async fn gather(s: &mut State) {
    let (now, window) = (Instant::now(), s.ctx.coalesce);
    let late = s.ctx.hub.published_at().is_some_and(|at| now.duration_since(at) > window);
    let until = match s.woken.map(|previous| previous + window) {
        Some(end) if now < end => end,
        _ if late => now + window,
        _ => now,
    };
    s.woken = Some(until);
    if until > now {
        tokio::select! {
            biased;
            () = &mut s.stop, if !s.stopping => s.stopping = true,
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Finds where the events after `s.last` are: the watch cache (then the
/// stream goes live) or, for an older revision, the next page of the
/// events table.
async fn attach(s: &mut State) -> Result<(), StorageError> {
    if let Some(live) = s.ctx.hub.subscribe(s.last) {
        s.live = Some(live);
        return Ok(());
    }
    let (budget, shutdown) = (s.budget.clone(), s.ctx.shutdown.clone());
    let charge = tokio::select! {
        charge = budget.charge_within(WATCH_PAGE_BYTES as u64, BUDGET_WAIT) => Some(charge),
        () = shutdown.wait() => None,
    };
    let mut charge = match charge {
        Some(Some(charge)) => charge,
        Some(None) => {
            s.over_budget = true;
            return Ok(());
        }
        // Waiting for its identity's budget when the store stops: every
        // event up to `last` was delivered; the subscriber resumes there.
        None => {
            s.stopping = true;
            return Ok(());
        }
    };
    match s.ctx.storage.events_after(s.last, CATCH_UP_PAGE, WATCH_PAGE_BYTES).await {
        Ok(events) if events.is_empty() => {
            // The cache has moved past `last` but its events are not
            // readable yet; try again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        }
        Ok(events) => {
            charge.resize(events.iter().map(|e| e.size() as u64).sum());
            s.pending_charge = Some(charge);
            s.pending.extend(events);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{Gateway, ObjectMeta};

    fn event(revision: i64) -> Arc<Event> {
        let gateway = Gateway {
            metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
            ..Default::default()
        };
        let encoded = prost::bytes::Bytes::from(prost::Message::encode_to_vec(&gateway));
        Arc::new(Event::new(revision, EventType::Modified, &gateway, None, encoded))
    }

    /// When each event was published and received, in ms from the start
    /// (paused time): `(revision, published, received)`.
    type Times = Vec<(i64, u64, u64)>;

    /// Events published by `schedule` — `(at ms, late ms)`: revision
    /// `i + 1` published at `at`, its subscriber run `late` ms after (the
    /// runtime busy) — on a stream that gathers events for `coalesce`.
    async fn published_and_received(coalesce: Duration, schedule: &[(u64, u64)]) -> Times {
        let dir = gantry_testkit::temp_dir("stream-coalesce");
        let url = format!("sqlite://{}", dir.join("gantry.db").display());
        // A live watch from the head never reads the database.
        let storage = Arc::new(crate::storage::sqlite::SqliteStorage::open(&url).await.unwrap());
        tokio::time::pause();
        let limits = super::super::hub::HubLimits {
            cache_events: 64,
            cache_bytes: 1 << 20,
            lag_events: 64,
            lag_bytes: 1 << 20,
        };
        let hub = Arc::new(WatchHub::new(0, limits));
        let ctx = WatchContext {
            storage,
            hub: hub.clone(),
            bookmark_interval: Duration::from_secs(3600),
            coalesce,
            shutdown: Shutdown::new(),
            too_slow: Default::default(),
        };
        let params = Params {
            filter: Filter::new(gantry_core::Selector::default(), None),
            resource_version: 0,
            send_initial_events: false,
            allow_bookmarks: false,
        };
        let budget = super::super::budget::Budget::new(1 << 20, Default::default());
        let mut events = start(ctx, params, budget).await.unwrap();
        let started = Instant::now();
        let ms = move || started.elapsed().as_millis() as u64;
        let n = schedule.len();
        let subscriber = tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < n {
                let event = futures_util::StreamExt::next(&mut events).await.unwrap().unwrap();
                got.push((event.resource_version, ms()));
            }
            got
        });
        let mut published = Vec::new();
        for (i, (at, late)) in schedule.iter().enumerate() {
            // The subscriber waits on the head from the start.
            tokio::time::sleep_until(started + Duration::from_millis(*at)).await;
            published.push(ms());
            hub.publish([event(i as i64 + 1)]);
            if *late > 0 {
                // The clock moves on before the subscriber runs.
                tokio::time::advance(Duration::from_millis(*late)).await;
            }
        }
        let got = subscriber.await.unwrap();
        tokio::time::resume();
        let _ = std::fs::remove_dir_all(dir);
        got.into_iter()
            .zip(published)
            .map(|((revision, got), sent)| (revision, sent, got))
            .collect()
    }

    #[tokio::test]
    async fn events_close_together_go_out_together_and_none_waits_longer_than_the_window() {
        let window = Duration::from_millis(20);
        let schedule = [(1, 0), (5, 0), (10, 0), (100, 0), (200, 25), (230, 0), (400, 25)];
        let got = published_and_received(window, &schedule).await;
        // tokio's timer fires on a 1 ms tick.
        let about = |got: u64, want: u64| got == want || got == want + 1;
        let revisions: Vec<i64> = got.iter().map(|(r, _, _)| *r).collect();
        assert_eq!(revisions, [1, 2, 3, 4, 5, 6, 7]);
        let (at, sent) = (|i: usize| got[i].2, |i: usize| got[i].1);
        // The first event after a quiet window goes out at once; the two
        // published within the window after it together when it ends.
        assert_eq!(at(0), sent(0), "{got:?}");
        assert!(at(1) == at(2) && about(at(1), at(0) + 20), "{got:?}");
        // After a quiet window, at once again.
        assert_eq!(at(3), sent(3), "{got:?}");
        // Run late (25 ms after its publish): it waits a window, and the
        // event published meanwhile goes out with it.
        assert!(at(4) == at(5) && about(at(4), sent(4) + 25 + 20), "{got:?}");
        // Late again: it waits a window whether or not more come.
        assert!(about(at(6), sent(6) + 25 + 20), "{got:?}");
        // No event held more than a window past when its subscriber ran.
        for (i, (_, sent, received)) in got.iter().enumerate() {
            let ran = sent + schedule[i].1;
            assert!(*received <= ran + 21, "{got:?}");
        }
        // Without a window each goes out as soon as its subscriber runs.
        let got = published_and_received(Duration::ZERO, &schedule).await;
        assert!(got.iter().zip(&schedule).all(|((_, s, r), (_, late))| *r == s + late), "{got:?}");
    }

    #[test]
    fn every_subscriber_sends_the_bytes_encoded_at_commit() {
        let gateway = Gateway {
            metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
            ..Default::default()
        };
        let encoded = prost::bytes::Bytes::from(prost::Message::encode_to_vec(&gateway));
        let event = Event::new(7, EventType::Modified, &gateway, None, encoded);
        let (a, b) =
            (change_out(EventType::Modified, &event), change_out(EventType::Added, &event));
        for out in [a, b] {
            let shared = out.encoded_gateway.unwrap();
            assert_eq!(shared.as_ptr(), event.encoded.as_ptr(), "a copy, not the shared bytes");
            assert_eq!(out.resource_version, 7);
        }
    }
}
