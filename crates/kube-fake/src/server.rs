//! The HTTP side: routing Kubernetes API paths to the state, discovery,
//! watch streams, fault injection and the request log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch, Notify};

use crate::resources::{self, ResourceType};
use crate::state::{ApiError, ApplyOptions, Event, FaultAction, RequestRecord, State};
use crate::util::{parse_query, FieldSelector, LabelSelector};

/// The fake API server shared by the HTTP handlers, the rollout
/// simulator and the test handle.
#[derive(Debug)]
pub struct Fake {
    state: Mutex<State>,
    /// Bumped to end every open watch (fault injection).
    pub watch_epoch: watch::Sender<u64>,
    /// Wakes the rollout simulator.
    pub rollout_wake: Notify,
    pub bookmark_interval: Duration,
}

impl Fake {
    pub fn new(history: usize, bookmark_interval: Duration) -> Self {
        Self {
            state: Mutex::new(State::new(history)),
            watch_epoch: watch::channel(0).0,
            rollout_wake: Notify::new(),
            bookmark_interval,
        }
    }

    /// The state; a panic elsewhere never leaves it half-written (every
    /// operation validates before it mutates), so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

enum Route {
    Version,
    Api,
    Apis,
    Group(String),
    ResourceList(String, String),
    Resource(Target),
}

struct Target {
    rt: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<&'static str>,
}

fn not_found_path(path: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    )
}

fn parse_route(path: &str) -> Result<Route, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["api"] => return Ok(Route::Api),
        ["apis"] => return Ok(Route::Apis),
        ["apis", group] => return Ok(Route::Group(group.to_string())),
        ["api", version] => return Ok(Route::ResourceList(String::new(), version.to_string())),
        ["apis", group, version] => {
            return Ok(Route::ResourceList(group.to_string(), version.to_string()))
        }
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found_path(path)),
    };
    let namespaced = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if resources::find(group, version, plural).is_some_and(|r| r.namespaced) =>
        {
            Some((ns.to_string(), *plural, tail))
        }
        _ => None,
    };
    let (namespace, plural, tail) = match namespaced {
        Some((ns, plural, tail)) => (Some(ns), plural, tail),
        None => match rest {
            [plural, tail @ ..] => (None, *plural, tail),
            [] => return Err(not_found_path(path)),
        },
    };
    let rt = resources::find(group, version, plural).ok_or_else(|| not_found_path(path))?;
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, "status"] if rt.status_subresource => (Some(name.to_string()), Some("status")),
        _ => return Err(not_found_path(path)),
    };
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return Err(not_found_path(path));
    }
    Ok(Route::Resource(Target { rt, namespace, name, subresource }))
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(code, &e.to_status());
    if let Some(seconds) = e.retry_after {
        if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    response
}

/// Handles every request.
pub async fn handle(
    fake: Arc<Fake>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query = parse_query(uri.query());
    match parse_route(uri.path()) {
        Ok(Route::Version) => json_response(StatusCode::OK, &version()),
        Ok(Route::Api) => json_response(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("")}]}),
        ),
        Ok(Route::Apis) => json_response(StatusCode::OK, &api_group_list()),
        Ok(Route::Group(group)) => match api_group_list()["groups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["name"] == group.as_str()).cloned())
        {
            Some(mut g) => {
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                json_response(StatusCode::OK, &g)
            }
            None => error_response(&not_found_path(uri.path())),
        },
        Ok(Route::ResourceList(group, version)) => match resource_list(&group, &version) {
            Some(list) => json_response(StatusCode::OK, &list),
            None => error_response(&not_found_path(uri.path())),
        },
        Ok(Route::Resource(target)) => {
            match resource_request(&fake, &method, &query, &headers, &body, target).await {
                Ok(response) => response,
                Err(e) => error_response(&e),
            }
        }
        Err(e) => error_response(&e),
    }
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0+gantry-kube-fake", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64"
    })
}

fn api_group_list() -> Value {
    let groups: Vec<Value> = resources::groups()
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

const VERBS: [&str; 8] =
    ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for r in resources::RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        list.push(json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind, "verbs": VERBS, "shortNames": r.short_names}));
        if r.status_subresource {
            list.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    if list.is_empty() {
        return None;
    }
    let group_version =
        if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": list}),
    )
}

fn parse_body(body: &Bytes, yaml: bool) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(e) if yaml => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("the body is not UTF-8"))?;
            serde_saphyr::from_str(text).map_err(|y| {
                ApiError::bad_request(format!("cannot parse the body as JSON ({e}) or YAML ({y})"))
            })
        }
        Err(e) => Err(ApiError::bad_request(format!("cannot parse the body as JSON: {e}"))),
    }
}

fn field_manager(query: &BTreeMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|h| h.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

async fn resource_request(
    fake: &Arc<Fake>,
    method: &Method,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
    target: Target,
) -> Result<Response, ApiError> {
    let content_type =
        headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("");
    let body = decoded_body(content_type, body)?;
    let verb = verb_of(method, &target, query, content_type)?;
    let rt = target.rt;
    let namespace = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let manager = field_manager(query, headers);
    let record = RequestRecord {
        verb: verb.to_string(),
        resource: format!("{}/{}", rt.group, rt.plural),
        namespace: namespace.clone(),
        name: name.clone(),
        subresource: target.subresource.unwrap_or("").to_string(),
        field_manager: if matches!(verb, "create" | "update" | "patch" | "apply") {
            manager.clone()
        } else {
            String::new()
        },
    };
    let (delay, failure) = {
        let mut state = fake.lock();
        state.requests.push(record.clone());
        injected_faults(&mut state, &record)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    if verb == "watch" {
        return watch_response(fake, rt, target.namespace.as_deref(), query);
    }
    if verb == "list" {
        let body = list(&fake.lock(), rt, target.namespace.as_deref(), query)?;
        return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    let request = Request {
        verb,
        rt,
        namespace: &namespace,
        name: &name,
        subresource: target.subresource,
        manager: &manager,
        content_type,
        query,
        body: &body,
    };
    let result = request.run(&mut fake.lock());
    fake.rollout_wake.notify_one();
    let value = result?;
    let code = if verb == "create" { StatusCode::CREATED } else { StatusCode::OK };
    Ok(json_response(code, &value))
}

/// The request's body as JSON text: kubectl's imperative commands send
/// protobuf for built-in types; the kinds they create are read, anything
/// else is refused with 415.
fn decoded_body(content_type: &str, body: &Bytes) -> Result<Bytes, ApiError> {
    if !content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return Ok(body.clone());
    }
    let object = crate::protobuf::decode(body).map_err(|why| {
        ApiError::new(415, "UnsupportedMediaType", format!("{content_type}: {why}; send JSON"))
    })?;
    Ok(Bytes::from(object.to_string()))
}

/// The API verb of a request on a resource path.
fn verb_of(
    method: &Method,
    target: &Target,
    query: &BTreeMap<String, String>,
    content_type: &str,
) -> Result<&'static str, ApiError> {
    let is_watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    Ok(match (method.as_str(), &target.name) {
        ("GET", Some(_)) => "get",
        ("GET", None) if is_watch => "watch",
        ("GET", None) => "list",
        ("POST", None) => "create",
        ("PUT", Some(_)) => "update",
        ("PATCH", Some(_)) if content_type.starts_with("application/apply-patch") => "apply",
        ("PATCH", Some(_)) => "patch",
        ("DELETE", Some(_)) => "delete",
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{method} is not supported on this path"),
            ))
        }
    })
}

/// A read or write of one object, run under the state's lock.
struct Request<'a> {
    verb: &'static str,
    rt: &'static ResourceType,
    namespace: &'a str,
    name: &'a str,
    subresource: Option<&'static str>,
    manager: &'a str,
    content_type: &'a str,
    query: &'a BTreeMap<String, String>,
    body: &'a Bytes,
}

impl Request<'_> {
    fn run(&self, state: &mut State) -> Result<Value, ApiError> {
        let (rt, namespace, name, manager) = (self.rt, self.namespace, self.name, self.manager);
        let subresource = self.subresource;
        match self.verb {
            "get" => state.get(rt, namespace, name),
            "create" => {
                if subresource.is_some() {
                    return Err(ApiError::new(
                        405,
                        "MethodNotAllowed",
                        "create is not supported on subresources",
                    ));
                }
                state.create(rt, namespace, parse_body(self.body, false)?, manager)
            }
            "update" => {
                let body = parse_body(self.body, false)?;
                state.update(rt, namespace, name, body, manager, subresource)
            }
            "patch" => {
                if self.content_type.starts_with("application/json-patch") {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "JSON patch is not supported by kube-fake; use merge patch or apply",
                    ));
                }
                let patch = parse_body(self.body, false)?;
                state.merge_patch(rt, namespace, name, &patch, manager, subresource)
            }
            "apply" => {
                let force = self.query.get("force").is_some_and(|f| f == "true");
                let options = ApplyOptions { manager, force, subresource };
                state.apply(rt, namespace, name, parse_body(self.body, true)?, options)
            }
            "delete" => {
                let options = parse_body(self.body, false)?;
                let policy = self.query.get("propagationPolicy").cloned().unwrap_or_default();
                state.delete(rt, namespace, name, &options, &policy)
            }
            other => Err(ApiError::new(405, "MethodNotAllowed", other.to_string())),
        }
    }
}

fn injected_faults(
    state: &mut State,
    record: &RequestRecord,
) -> (Option<Duration>, Option<ApiError>) {
    let (mut delay, mut failure) = (None, None);
    for rule in state.faults.iter_mut() {
        let applies = rule.verb.as_ref().is_none_or(|v| *v == record.verb)
            && rule.resource.as_ref().is_none_or(|r| *r == record.resource)
            && rule.remaining != Some(0);
        if !applies || fastrand::f64() >= rule.rate {
            continue;
        }
        match &rule.action {
            FaultAction::Latency(d) => delay = Some(delay.unwrap_or_default() + *d),
            FaultAction::Status { code, retry_after } if failure.is_none() => {
                let reason = match code {
                    409 => "Conflict",
                    410 => "Expired",
                    429 => "TooManyRequests",
                    500 => "InternalError",
                    503 => "ServiceUnavailable",
                    _ => "Unknown",
                };
                let mut e = ApiError::new(
                    *code,
                    reason,
                    format!("injected fault: {code} on {} {}", record.verb, record.resource),
                );
                e.retry_after = *retry_after;
                failure = Some(e);
            }
            FaultAction::Status { .. } => continue,
        }
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
    }
    (delay, failure)
}

fn selectors(query: &BTreeMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn list(
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

fn watch_response(
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
