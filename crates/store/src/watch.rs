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
//! subscriber beyond one page read from the database (bounded in bytes);
//! live events are shared with the watch cache. A subscriber that stops
//! reading falls behind its budget (events or bytes) and is ended with
//! RESOURCE_EXHAUSTED when it next reads.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::{EventType, Gateway, WatchEvent, WatchGatewaysRequest};
use gantry_core::{validation, Selector};
use tokio::sync::watch;
use tonic::{Code, Status};

use crate::errors::{invalid, rule_status, storage_status, with_reason};
use crate::hub::{Read, Subscription, WatchHub};
use crate::service::WatchStream;
use crate::storage::{Event, Page, Storage, StorageError};

/// Events read per query when a watch resumes from the events table.
const CATCH_UP_PAGE: usize = 500;
/// Events taken from the watch cache at a time.
const LIVE_READ: usize = 64;
/// Gateways read per query for `send_initial_events`.
const INITIAL_PAGE: usize = 100;
/// Encoded bytes a watch reads from the database at a time (at least one
/// object): what a subscriber holds beyond the shared watch cache.
pub const WATCH_PAGE_BYTES: usize = 256 * 1024;

pub use gantry_api::reasons::{
    STORE_SHUTTING_DOWN as REASON_SHUTTING_DOWN, WATCHER_TOO_SLOW as REASON_TOO_SLOW,
};

/// Which events a subscriber wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    selector: Selector,
    name: Option<String>,
}

impl Filter {
    /// Parses and checks the request's filters.
    pub fn from_request(request: &WatchGatewaysRequest) -> Result<Filter, Status> {
        let selector = Selector::parse(&request.label_selector)
            .map_err(|e| invalid("label_selector", e.to_string()))?;
        let name = if request.name.is_empty() {
            None
        } else {
            validation::validate_name("name", &request.name).map_err(|e| rule_status(&e))?;
            Some(request.name.clone())
        };
        Ok(Filter { selector, name })
    }

    fn matches_labels(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        static EMPTY: BTreeMap<String, String> = BTreeMap::new();
        self.selector.matches(labels.unwrap_or(&EMPTY))
    }

    /// Whether an object is in the watched set.
    pub fn matches(&self, gateway: &Gateway) -> bool {
        let meta = gateway.metadata.as_ref();
        let name = meta.map_or("", |m| m.name.as_str());
        self.name.as_deref().is_none_or(|n| n == name)
            && self.matches_labels(meta.map(|m| &m.labels))
    }

    /// What a subscriber sees of an event: an object entering the selected
    /// set is ADDED, one leaving it is DELETED, one outside it is nothing.
    pub fn apply(&self, event: &Event) -> Option<EventType> {
        if self.name.as_deref().is_some_and(|n| n != event.name()) {
            return None;
        }
        let now = self.matches_labels(event.labels());
        let before = event.prev_labels.as_ref().is_some_and(|l| self.matches_labels(Some(l)));
        match (event.kind, before, now) {
            (EventType::Added, _, true) => Some(EventType::Added),
            (EventType::Modified, true, true) => Some(EventType::Modified),
            (EventType::Modified, false, true) => Some(EventType::Added),
            (EventType::Modified, true, false) => Some(EventType::Deleted),
            (EventType::Deleted, b, n) if b || n => Some(EventType::Deleted),
            _ => None,
        }
    }
}

/// Watch settings shared by every stream.
#[derive(Debug, Clone)]
pub struct WatchContext {
    pub storage: Arc<dyn Storage>,
    pub hub: Arc<WatchHub>,
    pub bookmark_interval: Duration,
    pub stop: watch::Receiver<bool>,
    /// Watchers ended for falling behind (`WATCHER_TOO_SLOW`).
    pub too_slow: prometheus_client::metrics::counter::Counter,
}

/// The initial objects of a `send_initial_events` watch, read page by page
/// as of the watch's starting revision while the subscriber reads.
struct Initial {
    page: std::vec::IntoIter<Gateway>,
    /// The last name read; more follow when `more`.
    after: String,
    more: bool,
}

impl Initial {
    async fn read(
        storage: &dyn Storage,
        after: String,
        at: Option<i64>,
    ) -> Result<(Self, i64), Status> {
        let page = Page { after: &after, limit: INITIAL_PAGE, max_bytes: WATCH_PAGE_BYTES, at };
        let snapshot = storage.list(page).await.map_err(storage_status)?;
        let after = snapshot
            .gateways
            .last()
            .and_then(|g| g.metadata.as_ref())
            .map_or(after, |m| m.name.clone());
        let initial = Initial { page: snapshot.gateways.into_iter(), after, more: snapshot.more };
        Ok((initial, snapshot.revision))
    }
}

struct State {
    ctx: WatchContext,
    filter: Filter,
    /// Every change up to here has been processed for this subscriber.
    last: i64,
    initial: Option<Initial>,
    pending: VecDeque<Arc<Event>>,
    live: Option<Subscription>,
    bookmarks: Option<tokio::time::Interval>,
    stopping: bool,
    done: bool,
}

impl State {
    /// Ends the stream with `code`: `why`, and where to resume.
    fn end(&mut self, code: Code, why: String, reason: &str) -> Status {
        self.done = true;
        let last = self.last;
        with_reason(
            code,
            format!("{why}; resume the watch from revision {last}"),
            reason,
            &[("resource_version", last.to_string())],
        )
    }
}

fn event_out(kind: EventType, gateway: Option<Gateway>, revision: i64) -> WatchEvent {
    WatchEvent { r#type: kind as i32, gateway, resource_version: revision, ..Default::default() }
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

/// Starts a watch for `request`.
pub async fn start(
    ctx: WatchContext,
    request: WatchGatewaysRequest,
) -> Result<WatchStream, Status> {
    let filter = Filter::from_request(&request)?;
    if request.resource_version < 0 {
        return Err(invalid("resource_version", "must be 0 (from now) or a revision"));
    }
    // A revision ahead of this replica's cache may have been committed
    // through another replica: only the database can say it is ahead.
    if request.resource_version > ctx.hub.head() {
        let current = ctx.storage.current_revision().await.map_err(storage_status)?;
        if request.resource_version > current {
            return Err(storage_status(StorageError::Future {
                requested: request.resource_version,
                current,
            }));
        }
    }
    let (last, initial) = if request.send_initial_events {
        let (initial, revision) = Initial::read(ctx.storage.as_ref(), String::new(), None).await?;
        (revision, Some(initial))
    } else if request.resource_version == 0 {
        (ctx.hub.head(), None)
    } else {
        (request.resource_version, None)
    };
    let bookmarks = request.allow_bookmarks.then(|| {
        let mut interval = tokio::time::interval(ctx.bookmark_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.reset();
        interval
    });
    let state = State {
        ctx,
        filter,
        last,
        initial,
        pending: VecDeque::new(),
        live: None,
        bookmarks,
        stopping: false,
        done: false,
    };
    Ok(Box::pin(futures_util::stream::unfold(state, |mut state| async move {
        let item = next(&mut state).await?;
        Some((item, state))
    })))
}

async fn next(s: &mut State) -> Option<Result<WatchEvent, Status>> {
    loop {
        if s.done {
            return None;
        }
        if let Some(initial) = &mut s.initial {
            if let Some(gateway) = initial.page.next() {
                if !s.filter.matches(&gateway) {
                    continue;
                }
                let revision = gateway.metadata.as_ref().map_or(0, |m| m.resource_version);
                return Some(Ok(event_out(EventType::Added, Some(gateway), revision)));
            }
            if initial.more {
                let after = std::mem::take(&mut initial.after);
                match Initial::read(s.ctx.storage.as_ref(), after, Some(s.last)).await {
                    Ok((next, _)) => *initial = next,
                    Err(status) => {
                        s.done = true;
                        return Some(Err(status));
                    }
                }
                continue;
            }
            s.initial = None;
            let mut end = event_out(EventType::Bookmark, None, s.last);
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
        if s.live.is_none() {
            if let Err(status) = attach(s).await {
                s.done = true;
                return Some(Err(status));
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
                return Some(Err(s.end(
                    Code::Unavailable,
                    "gateway-store is shutting down".into(),
                    REASON_SHUTTING_DOWN,
                )));
            }
            Read::Wait => {}
            Read::TooSlow { events, bytes } => {
                let why =
                    format!("watcher fell {events} events ({bytes} bytes) behind and was ended");
                s.ctx.too_slow.inc();
                return Some(Err(s.end(Code::ResourceExhausted, why, REASON_TOO_SLOW)));
            }
            Read::Reset => {
                return Some(Err(s.end(
                    Code::Unavailable,
                    "the watch cache was reset".into(),
                    REASON_SHUTTING_DOWN,
                )));
            }
        }
        let stop = crate::background::stopped(s.ctx.stop.clone());
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
                return Some(Ok(event_out(EventType::Bookmark, None, s.last)));
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
async fn attach(s: &mut State) -> Result<(), Status> {
    if let Some(live) = s.ctx.hub.subscribe(s.last) {
        s.live = Some(live);
        return Ok(());
    }
    match s.ctx.storage.events_after(s.last, CATCH_UP_PAGE, WATCH_PAGE_BYTES).await {
        Ok(events) if events.is_empty() => {
            // The cache has moved past `last` but its events are not
            // readable yet; try again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        }
        Ok(events) => {
            s.pending.extend(events);
            Ok(())
        }
        Err(e) => Err(storage_status(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::ObjectMeta;

    fn event(
        kind: EventType,
        name: &str,
        labels: &[(&str, &str)],
        prev: Option<&[(&str, &str)]>,
    ) -> Event {
        let map =
            |l: &[(&str, &str)]| l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let gateway = Gateway {
            metadata: Some(ObjectMeta {
                name: name.into(),
                labels: map(labels),
                ..Default::default()
            }),
            ..Default::default()
        };
        Event::new(5, kind, &gateway, prev.map(map), Default::default())
    }

    fn filter(selector: &str, name: &str) -> Filter {
        Filter::from_request(&WatchGatewaysRequest {
            label_selector: selector.into(),
            name: name.into(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn objects_entering_and_leaving_the_selection() {
        let f = filter("env=prod", "");
        let prod: &[(&str, &str)] = &[("env", "prod")];
        let dev: &[(&str, &str)] = &[("env", "dev")];
        assert_eq!(f.apply(&event(EventType::Added, "a", prod, None)), Some(EventType::Added));
        assert_eq!(f.apply(&event(EventType::Added, "a", dev, None)), None);
        assert_eq!(
            f.apply(&event(EventType::Modified, "a", prod, Some(prod))),
            Some(EventType::Modified)
        );
        assert_eq!(
            f.apply(&event(EventType::Modified, "a", prod, Some(dev))),
            Some(EventType::Added)
        );
        assert_eq!(
            f.apply(&event(EventType::Modified, "a", dev, Some(prod))),
            Some(EventType::Deleted)
        );
        assert_eq!(f.apply(&event(EventType::Modified, "a", dev, Some(dev))), None);
        assert_eq!(
            f.apply(&event(EventType::Deleted, "a", prod, Some(prod))),
            Some(EventType::Deleted)
        );
        assert_eq!(f.apply(&event(EventType::Deleted, "a", dev, Some(dev))), None);
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

    #[test]
    fn name_filter() {
        let f = filter("", "edge");
        assert_eq!(f.apply(&event(EventType::Added, "edge", &[], None)), Some(EventType::Added));
        assert_eq!(f.apply(&event(EventType::Added, "other", &[], None)), None);
        assert!(Filter::from_request(&WatchGatewaysRequest {
            name: "Bad!".into(),
            ..Default::default()
        })
        .is_err());
        assert!(Filter::from_request(&WatchGatewaysRequest {
            label_selector: "a in (".into(),
            ..Default::default()
        })
        .is_err());
    }
}
