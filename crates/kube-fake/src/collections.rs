//! Reads of a collection: list (with label and field selectors, paging by
//! limit and continue) and watch (events after a resourceVersion, initial
//! events, bookmarks, ended by fault injection).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::error::ApiError;
use crate::fake::Fake;
use crate::resources::ResourceType;
use crate::state::{Event, State};
use crate::util::{FieldSelector, LabelSelector};

fn selectors(query: &BTreeMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

pub(crate) fn list(
    state: &State,
    rt: &ResourceType,
    namespace: Option<&str>,
    query: &BTreeMap<String, String>,
) -> Result<String, ApiError> {
    let (labels, fields) = selectors(query)?;
    let limit: usize =
        query.get("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).unwrap_or(usize::MAX);
    // A paginated list is one snapshot, as the real server's: every page
    // answers the first page's resourceVersion (carried in the continue
    // token), so a client that watches from it is replayed what changed
    // behind its cursor between pages. (Pages are read from the current
    // state; an object changed after the first page may show up in a
    // later page and again as an event, which an informer takes in its
    // stride.)
    let (snapshot, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(token)
                .map_err(|_| ApiError::bad_request("invalid continue token"))?;
            let token = String::from_utf8_lossy(&bytes).into_owned();
            let (rv, after) = token
                .split_once('\n')
                .and_then(|(rv, after)| Some((rv.parse::<u64>().ok()?, after.to_string())))
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            (rv, Some(after))
        }
        None => (state.resource_version(), None),
    };
    // Items are the stored objects' own text, copied, not rendered again.
    let mut items = String::from("[");
    let (mut count, mut last, mut next) = (0, None, None);
    for (key, stored) in state.matching(rt, namespace, &labels, &fields, after.as_deref()) {
        if count == limit {
            use base64::Engine as _;
            let last: &crate::state::ObjectKey = last.unwrap_or(key);
            next = Some(
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(format!("{snapshot}\n{}/{}", last.1, last.2)),
            );
            break;
        }
        if count > 0 {
            items.push(',');
        }
        items.push_str(&stored.json);
        (count, last) = (count + 1, Some(key));
    }
    items.push(']');
    let mut metadata = json!({"resourceVersion": snapshot.to_string()});
    if let Some(token) = next {
        metadata["continue"] = json!(token);
    }
    let head = json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(), "metadata": metadata});
    Ok(splice(&head, "items", &items))
}

/// `object` (a JSON object) with one more member, `key`, whose value is
/// the JSON text `raw`.
fn splice(object: &Value, key: &str, raw: &str) -> String {
    let mut text = object.to_string();
    text.pop();
    let comma = if text.len() > 1 { "," } else { "" };
    text.push_str(&format!("{comma}\"{key}\":{raw}}}"));
    text
}

struct WatchState {
    backlog: std::collections::VecDeque<Bytes>,
    live: broadcast::Receiver<Arc<Event>>,
    resource: String,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    last_rv: u64,
    bookmarks: Option<tokio::time::Interval>,
    deadline: Option<tokio::time::Instant>,
    epoch: watch::Receiver<u64>,
    api_version: String,
    kind: String,
    done: bool,
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    raw_watch_line(kind, &object.to_string())
}

/// A watch event line for an object given as JSON text.
fn raw_watch_line(kind: &str, object: &str) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n"))
}

pub(crate) fn watch_response(
    fake: &Arc<Fake>,
    rt: &'static ResourceType,
    namespace: Option<&str>,
    query: &BTreeMap<String, String>,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query)?;
    let requested = query.get("resourceVersion").cloned().unwrap_or_default();
    let mut state = fake.lock();
    let live = state.sender.subscribe();
    let mut backlog = std::collections::VecDeque::new();
    let resource = format!("{}/{}", rt.group, rt.plural);
    let last_rv = state.resource_version();
    let expire = state.expire_next_watches > 0;
    // An ERROR event ends the stream after it.
    let mut ended = false;
    if expire {
        state.expire_next_watches -= 1;
        let e = ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({last_rv})"),
        );
        backlog.push_back(watch_line("ERROR", &e.to_status()));
        ended = true;
    } else if requested.is_empty() || requested == "0" {
        for (_, stored) in state.matching(rt, namespace, &labels, &fields, None) {
            backlog.push_back(raw_watch_line("ADDED", &stored.json));
        }
    } else {
        let rv: u64 = requested
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {requested:?}")))?;
        match state.events_after(rv) {
            None => {
                let e = ApiError::new(
                    410,
                    "Expired",
                    format!("too old resource version: {rv} ({})", state.compacted() + 1),
                );
                backlog.push_back(watch_line("ERROR", &e.to_status()));
                ended = true;
            }
            Some(events) => {
                for event in events {
                    if let Some(line) = filter_event(&event, &resource, namespace, &labels, &fields)
                    {
                        backlog.push_back(line);
                    }
                }
            }
        }
    }
    drop(state);
    let timeout =
        query.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).filter(|t| *t > 0);
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true").then(|| {
        let mut interval = tokio::time::interval(fake.bookmark_interval);
        interval.reset();
        interval
    });
    let mut epoch = fake.watch_epoch.subscribe();
    epoch.mark_unchanged();
    let state = WatchState {
        done: ended,
        backlog,
        live,
        resource,
        namespace: namespace.map(String::from),
        labels,
        fields,
        last_rv,
        bookmarks,
        deadline: timeout.map(|t| tokio::time::Instant::now() + Duration::from_secs(t)),
        epoch,
        api_version: rt.api_version(),
        kind: rt.kind.to_string(),
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        let line = next_watch_line(&mut s).await?;
        Some((Ok::<Bytes, std::convert::Infallible>(line), s))
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response())
}

fn filter_event(
    event: &Event,
    resource: &str,
    namespace: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
) -> Option<Bytes> {
    if event.resource != resource
        || namespace.is_some_and(|ns| ns != event.namespace)
        || !fields.matches(&event.namespace, &event.name)
    {
        return None;
    }
    let now = labels.matches(&event.labels);
    let before = event.prev_labels.as_ref().is_some_and(|l| labels.matches(l));
    let kind = match (event.kind, before, now) {
        ("ADDED", _, true) => "ADDED",
        ("MODIFIED", true, true) => "MODIFIED",
        ("MODIFIED", false, true) => "ADDED",
        ("MODIFIED", true, false) => "DELETED",
        ("DELETED", b, n) if b || n => "DELETED",
        _ => return None,
    };
    Some(raw_watch_line(kind, &event.object))
}

async fn next_watch_line(s: &mut WatchState) -> Option<Bytes> {
    loop {
        if let Some(line) = s.backlog.pop_front() {
            return Some(line);
        }
        if s.done {
            return None;
        }
        let deadline = async {
            match s.deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let bookmark = async {
            match s.bookmarks.as_mut() {
                Some(i) => {
                    i.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = s.epoch.changed() => return None,
            () = deadline => return None,
            () = bookmark => {
                let object = json!({"apiVersion": s.api_version, "kind": s.kind, "metadata": {"resourceVersion": s.last_rv.to_string()}});
                return Some(watch_line("BOOKMARK", &object));
            }
            received = s.live.recv() => match received {
                Ok(event) => {
                    if event.rv <= s.last_rv {
                        continue;
                    }
                    s.last_rv = event.rv;
                    if let Some(line) = filter_event(&event, &s.resource, s.namespace.as_deref(), &s.labels, &s.fields) {
                        return Some(line);
                    }
                }
                // Too slow: end the stream; the client re-watches from its
                // last resourceVersion.
                Err(_) => return None,
            },
        }
    }
}
