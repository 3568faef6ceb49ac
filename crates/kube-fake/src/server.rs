//! The HTTP side: routing Kubernetes API paths to the state, discovery,
//! fault injection and the request log (list and watch in `collections`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::collections::{list, watch_response};
use crate::fake::Fake;
use crate::resources::{self, ResourceType};
use crate::state::{ApiError, ApplyOptions, FaultAction, RequestRecord, State};
use crate::util::parse_query;

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
