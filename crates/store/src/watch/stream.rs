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
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::{EventType, WatchEvent};
use gantry_runtime::Shutdown;

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

/// Watch settings shared by every stream.
#[derive(Debug, Clone)]
pub struct WatchContext {
    pub storage: Arc<dyn Storage>,
    pub hub: Arc<WatchHub>,
    pub bookmark_interval: Duration,
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
    stopping: bool,
    /// Waited [`BUDGET_WAIT`] for its identity's budget.
    over_budget: bool,
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
        stopping: false,
        over_budget: false,
        done: false,
    };
    Ok(Box::pin(futures_util::stream::unfold(state, |mut state| async move {
        let item = next(&mut state).await?;
        Some((item, state))
    })))
}

async fn next(s: &mut State) -> Option<Result<WatchEvent, WatchEnd>> {
    loop {
        if s.done {
            return None;
        }
        if let Some(initial) = &mut s.initial {
            if let Some(gateway) = initial.page.next() {
                if !s.filter.matches(&gateway) {
                    continue;
                }
                // Its bytes as stored, as every change is sent.
                return Some(Ok(WatchEvent {
                    r#type: EventType::Added as i32,
                    encoded_gateway: Some(gateway.encoded),
                    resource_version: gateway.resource_version,
                    ..Default::default()
                }));
            }
            if initial.more {
                let after = std::mem::take(&mut initial.after);
                // The drained page's bytes go back before the next is charged.
                *initial = Initial::unread();
                let Some(charge) =
                    s.budget.charge_within(WATCH_PAGE_BYTES as u64, BUDGET_WAIT).await
                else {
                    return Some(Err(s.end(|_| WatchEnd::OverBudget { resume: None })));
                };
                match Initial::read(s.ctx.storage.as_ref(), charge, after, s.last).await {
                    Ok(next) => *initial = next,
                    Err(e) => {
                        s.done = true;
                        return Some(Err(WatchEnd::Storage(e)));
                    }
                }
                continue;
            }
            s.initial = None;
            let mut end = bookmark(s.last);
            end.initial_events_end = true;
            return Some(Ok(end));
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
        let Some(live) = s.live.as_mut() else {
            continue;
        };
        // Seen before reading: a publish after this read wakes the wait.
        live.head.borrow_and_update();
        match s.ctx.hub.read(live, s.last, LIVE_READ) {
            Read::Events(events) => {
                s.pending.extend(events);
                continue;
            }
            Read::Wait if s.stopping => {
                return Some(Err(s.end(|last| WatchEnd::ShuttingDown { last })));
            }
            Read::Wait => {}
            Read::TooSlow { events, bytes } => {
                s.ctx.too_slow.inc();
                return Some(Err(s.end(|last| WatchEnd::TooSlow { last, events, bytes })));
            }
            Read::Reset => {
                return Some(Err(s.end(|last| WatchEnd::Reset { last })));
            }
        }
        let stop = s.ctx.shutdown.wait();
        tokio::select! {
            biased;
            // Deliver what was committed before the stop, then end.
            () = stop, if !s.stopping => s.stopping = true,
            changed = live.head.changed() => {
                if changed.is_err() {
                    // The hub is gone: the store is stopping.
                    s.stopping = true;
                }
            }
            _ = tick(&mut s.bookmarks) => {
                return Some(Ok(bookmark(s.last)));
            }
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
