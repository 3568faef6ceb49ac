//! The fake API server's state: objects, one resourceVersion counter, the
//! event history for watches, managed fields; reads and writes (deletion
//! and garbage collection in `gc`, the controllers it plays in `rollout`,
//! what the server sets on a write in `prepare`). Every operation runs
//! under one lock, as one etcd transaction would.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use crate::resources::{self, ResourceType};
use crate::schema::Schema;
use crate::ssa::{self, Manager, Scope, Writer};
use crate::util::{is_foreground_deleting, now_rfc3339, owner_uids, FieldSelector, LabelSelector};
use crate::validation;

pub use crate::error::ApiError;

pub(crate) const INGRESSES: &str = "networking.k8s.io/ingresses";
/// The address the ingress controller stand-in publishes on every Ingress.
pub const INGRESS_ADDRESS: &str = "192.0.2.10";

/// Identity of a stored object: resource (`group/plural`), namespace, name.
pub type ObjectKey = (String, String, String);

fn resource_key(rt: &ResourceType) -> String {
    format!("{}/{}", rt.group, rt.plural)
}

/// An object being written: its value (without `managedFields`) and who
/// manages which of its fields.
#[derive(Debug, Clone)]
pub struct Object {
    pub value: Value,
    pub managers: Vec<Manager>,
}

/// A stored object, kept as clients see it (with `managedFields`) and
/// serialized once per change: gets, list pages and watch events copy
/// these bytes instead of rendering the object again, and a fleet's
/// objects take about what their JSON takes (a parsed value with its
/// managed field sets took twenty times that). What selectors, garbage
/// collection and namespace checks read is kept beside it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub json: Arc<str>,
    /// `metadata.labels` (`null` when there are none).
    pub labels: Value,
    pub uid: String,
    /// The uids of `metadata.ownerReferences`.
    pub owners: Vec<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Deleting in the foreground: waits for its dependents to go.
    pub foreground_deleting: bool,
}

impl Stored {
    fn new(json: Arc<str>, value: &Value) -> Stored {
        let meta = &value["metadata"];
        Stored {
            json,
            labels: meta["labels"].clone(),
            uid: meta["uid"].as_str().unwrap_or("").to_string(),
            owners: owner_uids(value).map(String::from).collect(),
            deleting: meta.get("deletionTimestamp").is_some(),
            foreground_deleting: is_foreground_deleting(value),
        }
    }

    /// The object as clients see it.
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.json)
            .unwrap_or_else(|e| unreachable!("a stored object is JSON serde_json wrote: {e}"))
    }

    /// The object to write a new version of.
    pub fn load(&self) -> Object {
        let mut value = self.value();
        let managed = value["metadata"]
            .as_object_mut()
            .and_then(|m| m.remove("managedFields"))
            .unwrap_or(Value::Null);
        let managers =
            managed.as_array().into_iter().flatten().map(ssa::Manager::from_entry).collect();
        Object { value, managers }
    }
}

/// One change, as watches deliver it.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub resource: String,
    pub namespace: String,
    /// ADDED, MODIFIED or DELETED.
    pub name: String,
    pub kind: &'static str,
    /// The object after the change, serialized (shared with the store).
    pub object: Arc<str>,
    /// Its labels after the change.
    pub labels: Value,
    /// Labels before the change (to tell a selector-filtered watch that an
    /// object left its selection).
    pub prev_labels: Option<Value>,
}

/// One request, as a test reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// get, list, watch, create, update, patch, apply, delete.
    pub verb: String,
    /// `group/plural` (`/configmaps` for the core group).
    pub resource: String,
    pub namespace: String,
    pub name: String,
    pub subresource: String,
    pub field_manager: String,
}

impl RequestRecord {
    /// Whether this request could change state.
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "apply" | "delete")
    }
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer this status code (429 gets `Retry-After`).
    Status { code: u16, retry_after: Option<u64> },
    /// Delay the request.
    Latency(Duration),
}

/// A fault injected by a test: which requests, what happens, how often.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub verb: Option<String>,
    /// `group/plural`, e.g. `apps/deployments` or `/configmaps`.
    pub resource: Option<String>,
    pub action: FaultAction,
    /// Probability per matching request.
    pub rate: f64,
    /// Remaining injections; `None` is unlimited.
    pub remaining: Option<u32>,
}

/// Deployment rollout simulation settings.
#[derive(Debug, Clone, Default)]
pub struct RolloutConfig {
    pub delay: Duration,
    /// `namespace/name` of Deployments whose rollouts stall.
    pub stalled: BTreeSet<String>,
}

/// Everything behind the lock.
#[derive(Debug)]
pub struct State {
    rv: u64,
    pub objects: BTreeMap<ObjectKey, Stored>,
    events: VecDeque<Arc<Event>>,
    history: usize,
    compacted: u64,
    pub sender: broadcast::Sender<Arc<Event>>,
    pub requests: Vec<RequestRecord>,
    pub faults: Vec<FaultRule>,
    pub expire_next_watches: u32,
    pub rollout: RolloutConfig,
    /// Deployments waiting for their simulated rollout: key -> due time.
    pub pending_rollouts: BTreeMap<ObjectKey, tokio::time::Instant>,
}

/// How an apply request is made.
#[derive(Debug, Clone, Copy)]
pub struct ApplyOptions<'a> {
    pub manager: &'a str,
    /// Take over fields other managers own.
    pub force: bool,
    pub subresource: Option<&'static str>,
}

/// The outcome of a write.
pub type Written = Result<Value, ApiError>;

impl State {
    pub fn new(history: usize) -> Self {
        let (sender, _) = broadcast::channel(16_384);
        let mut state = State {
            rv: 0,
            objects: BTreeMap::new(),
            events: VecDeque::new(),
            history,
            compacted: 0,
            sender,
            requests: Vec::new(),
            faults: Vec::new(),
            expire_next_watches: 0,
            rollout: RolloutConfig::default(),
            pending_rollouts: BTreeMap::new(),
        };
        let Some(ns) = resources::find("", "v1", "namespaces") else { return state };
        for name in ["default", "kube-system", "kube-public"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            let _ = state.create(ns, "", body, "kube-apiserver");
        }
        state
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Oldest resourceVersion a watch may start from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub(crate) fn key(rt: &ResourceType, namespace: &str, name: &str) -> ObjectKey {
        (
            resource_key(rt),
            if rt.namespaced { namespace.to_string() } else { String::new() },
            name.to_string(),
        )
    }

    /// The object as clients see it, with `managedFields`.
    pub fn render(object: &Object) -> Value {
        let mut value = object.value.clone();
        let managed: Vec<Value> = object
            .managers
            .iter()
            .map(|m| {
                let mut entry = json!({
                    "manager": m.name, "operation": m.operation,
                    "apiVersion": value["apiVersion"].clone(), "time": m.time,
                    "fieldsType": "FieldsV1", "fieldsV1": ssa::to_fields_v1(&m.fields),
                });
                if let Some(sub) = m.subresource {
                    entry["subresource"] = json!(sub);
                }
                entry
            })
            .collect();
        if !managed.is_empty() {
            value["metadata"]["managedFields"] = Value::Array(managed);
        }
        value
    }

    pub(crate) fn commit(
        &mut self,
        key: &ObjectKey,
        kind: &'static str,
        mut object: Object,
        prev_labels: Option<Value>,
    ) -> Value {
        self.rv += 1;
        object.value["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let rendered = Self::render(&object);
        let stored = Stored::new(rendered.to_string().into(), &object.value);
        let event = Arc::new(Event {
            rv: self.rv,
            resource: key.0.clone(),
            namespace: key.1.clone(),
            name: key.2.clone(),
            kind,
            object: stored.json.clone(),
            labels: stored.labels.clone(),
            prev_labels,
        });
        if key.0 == "apps/deployments" && kind != "DELETED" {
            self.schedule_rollout(key, &object.value);
        }
        if kind == "DELETED" {
            self.objects.remove(key);
        } else {
            self.objects.insert(key.clone(), stored);
        }
        self.events.push_back(event.clone());
        while self.events.len() > self.history {
            if let Some(old) = self.events.pop_front() {
                self.compacted = old.rv;
            }
        }
        let _ = self.sender.send(event);
        if key.0 == INGRESSES
            && kind != "DELETED"
            && rendered["status"]["loadBalancer"]["ingress"].is_null()
        {
            // The ingress controller stand-in publishes an address.
            let due = tokio::time::Instant::now() + self.rollout.delay;
            self.pending_rollouts.entry(key.clone()).or_insert(due);
        }
        rendered
    }

    /// Drops all retained history: every watch from an older version gets
    /// 410 Gone.
    pub fn compact_all(&mut self) {
        self.events.clear();
        self.compacted = self.rv;
    }

    /// Events after `rv` for a watch, or `None` when that history is gone.
    pub fn events_after(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        if rv < self.compacted {
            return None;
        }
        Some(self.events.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Written {
        let key = Self::key(rt, namespace, name);
        self.objects.get(&key).map(Stored::value).ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Objects of a type (one namespace or all), filtered, in key order.
    /// Objects of `rt` (in `namespace`, if given) matching the selectors,
    /// in key order, starting after `after` (`namespace/name`). Only the
    /// resource's key range is scanned, and nothing is rendered here: a
    /// page of a large list costs the page.
    pub fn matching<'a>(
        &'a self,
        rt: &ResourceType,
        namespace: Option<&'a str>,
        labels: &'a LabelSelector,
        fields: &'a FieldSelector,
        after: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Stored)> + 'a {
        let resource = resource_key(rt);
        let (from_ns, from_name) = match after.and_then(|a| a.split_once('/')) {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (namespace.unwrap_or("").to_string(), String::new()),
        };
        let start = (resource.clone(), from_ns, from_name);
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.0 == resource)
            .filter(move |(k, _)| {
                after.is_none_or(|a| format!("{}/{}", k.1, k.2).as_str() > a)
                    && namespace.is_none_or(|ns| k.1 == ns)
                    && fields.matches(&k.1, &k.2)
            })
            .filter(|(_, o)| labels.matches(&o.labels))
    }

    fn check_namespace(&self, rt: &ResourceType, namespace: &str) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let key = ("/namespaces".to_string(), String::new(), namespace.to_string());
        match self.objects.get(&key) {
            None => {
                let mut e = ApiError::new(404, "NotFound", format!("namespaces \"{namespace}\" not found"));
                e.details = Some(json!({"name": namespace, "kind": "namespaces"}));
                Err(e)
            }
            Some(ns) if ns.deleting => Err(ApiError::new(
                403,
                "Forbidden",
                format!("unable to create new content in namespace {namespace} because it is being terminated"),
            )),
            Some(_) => Ok(()),
        }
    }

    fn scope(rt: &ResourceType, subresource: Option<&str>) -> Scope {
        match (rt.status_subresource, subresource) {
            (true, Some("status")) => Scope::Status,
            (true, _) => Scope::Main,
            (false, _) => Scope::Whole,
        }
    }

    fn name_of(body: &Value) -> Result<String, ApiError> {
        let name = body["metadata"]["name"].as_str().unwrap_or("");
        if name.is_empty() {
            if let Some(prefix) =
                body["metadata"]["generateName"].as_str().filter(|p| !p.is_empty())
            {
                let suffix: String =
                    (0..5).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect();
                return Ok(format!("{prefix}{suffix}"));
            }
            return Err(ApiError::new(
                422,
                "Invalid",
                "metadata.name: Required value: name or generateName is required",
            ));
        }
        let valid = name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !valid {
            return Err(ApiError::new(422, "Invalid", format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'")));
        }
        Ok(name.to_string())
    }

    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        mut body: Value,
        manager: &str,
    ) -> Written {
        let name = Self::name_of(&body)?;
        self.check_namespace(rt, namespace)?;
        let key = Self::key(rt, namespace, &name);
        if self.objects.contains_key(&key) {
            let mut e = ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", rt.plural),
            );
            e.details = Some(json!({"name": name, "kind": rt.plural}));
            return Err(e);
        }
        body["metadata"]["name"] = json!(name);
        let scope = Self::scope(rt, None);
        crate::prepare::prepare(rt, namespace, None, &mut body, scope)?;
        validation::validate(rt, None, &body)?;
        let mut managers = Vec::new();
        let now = now_rfc3339();
        let root = Schema::get().kind(&rt.api_version(), rt.kind);
        let writer = Writer { root, manager, subresource: None, scope, now: &now };
        ssa::record_update(None, &body, &mut managers, writer);
        Ok(self.commit(&key, "ADDED", Object { value: body, managers }, None))
    }

    pub(crate) fn existing(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<(ObjectKey, Object), ApiError> {
        let key = Self::key(rt, namespace, name);
        let stored = self.objects.get(&key).ok_or_else(|| ApiError::not_found(rt, name))?;
        Ok((key, stored.load()))
    }

    /// Stores a new version of an existing object; removes it when it was
    /// being deleted and has no finalizers left.
    pub(crate) fn replace(&mut self, key: &ObjectKey, old: &Object, new: Object) -> Value {
        if new.value == old.value && new.managers == old.managers {
            return Self::render(old);
        }
        let prev_labels = Some(old.value["metadata"]["labels"].clone());
        let deleting = new.value["metadata"].get("deletionTimestamp").is_some();
        let no_finalizers =
            new.value["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
        // Only a deletion or a change of owners can make garbage: a full
        // scan after every status write would make large clusters quadratic.
        let owners_changed =
            new.value["metadata"]["ownerReferences"] != old.value["metadata"]["ownerReferences"];
        let rendered = if deleting && no_finalizers {
            self.commit(key, "DELETED", new, prev_labels)
        } else {
            self.commit(key, "MODIFIED", new, prev_labels)
        };
        if deleting || owners_changed {
            self.collect_garbage();
        }
        rendered
    }

    pub(crate) fn check_preconditions(
        stored: &Value,
        body_rv: Option<&str>,
        uid: Option<&str>,
    ) -> Result<(), ApiError> {
        let current = stored["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if let Some(rv) = body_rv.filter(|rv| !rv.is_empty()) {
            if rv != current {
                let name = stored["metadata"]["name"].as_str().unwrap_or("");
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on {name}: the object has been modified; please apply your changes to the latest version and try again"),
                ));
            }
        }
        if let Some(uid) = uid.filter(|u| !u.is_empty()) {
            if stored["metadata"]["uid"].as_str() != Some(uid) {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition does not match the object",
                ));
            }
        }
        Ok(())
    }

    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        mut body: Value,
        manager: &str,
        subresource: Option<&'static str>,
    ) -> Written {
        let (key, old) = self.existing(rt, namespace, name)?;
        if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name in the URL",
            ));
        }
        Self::check_preconditions(
            &old.value,
            body["metadata"]["resourceVersion"].as_str(),
            body["metadata"]["uid"].as_str(),
        )?;
        body["metadata"]["name"] = json!(name);
        let scope = Self::scope(rt, subresource);
        crate::prepare::prepare(rt, namespace, Some(&old.value), &mut body, scope)?;
        validation::validate(rt, Some(&old.value), &body)?;
        let deleting = old.value["metadata"].get("deletionTimestamp").is_some();
        let added_finalizer = body["metadata"]["finalizers"].as_array().is_some_and(|new| {
            new.iter().any(|f| {
                !old.value["metadata"]["finalizers"].as_array().is_some_and(|o| o.contains(f))
            })
        });
        if deleting && added_finalizer {
            return Err(ApiError::new(422, "Invalid", "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"));
        }
        let mut managers = old.managers.clone();
        let now = now_rfc3339();
        let root = Schema::get().kind(&rt.api_version(), rt.kind);
        let writer = Writer { root, manager, subresource, scope, now: &now };
        ssa::record_update(Some(&old.value), &body, &mut managers, writer);
        body["metadata"]["resourceVersion"] = old.value["metadata"]["resourceVersion"].clone();
        Ok(self.replace(&key, &old, Object { value: body, managers }))
    }

    pub fn merge_patch(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        patch: &Value,
        manager: &str,
        subresource: Option<&'static str>,
    ) -> Written {
        let (_, old) = self.existing(rt, namespace, name)?;
        let mut body = old.value.clone();
        json_merge_patch(&mut body, patch);
        let rv = patch["metadata"]["resourceVersion"].as_str();
        if rv.is_none() {
            body["metadata"]["resourceVersion"] = Value::Null;
        }
        self.update(rt, namespace, name, body, manager, subresource)
    }

    pub fn apply(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        mut applied: Value,
        options: ApplyOptions<'_>,
    ) -> Written {
        let ApplyOptions { manager, force, subresource } = options;
        if manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests",
            ));
        }
        if applied["metadata"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name in the URL",
            ));
        }
        if applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
            return Err(ApiError::bad_request(
                "apiVersion and kind are required in an applied configuration",
            ));
        }
        let root = Schema::get().kind(&rt.api_version(), rt.kind);
        if let Some(field) = Schema::get().undeclared(root, &applied) {
            let (group_version, kind) = (rt.api_version(), rt.kind);
            let group_version =
                if rt.group.is_empty() { format!("/{group_version}") } else { group_version };
            return Err(ApiError::new(
                500,
                "",
                format!("failed to create typed patch object ({namespace}/{name}; {group_version}, Kind={kind}): {field}: field not declared in schema"),
            ));
        }
        applied["metadata"]["name"] = json!(name);
        let scope = Self::scope(rt, subresource);
        let key = Self::key(rt, namespace, name);
        let old = self.objects.get(&key).map(Stored::load);
        if old.is_none() {
            self.check_namespace(rt, namespace)?;
        }
        let mut managers = old.as_ref().map(|o| o.managers.clone()).unwrap_or_default();
        let now = now_rfc3339();
        let root = Schema::get().kind(&rt.api_version(), rt.kind);
        let writer = Writer { root, manager, subresource, scope, now: &now };
        let merged = ssa::apply(old.as_ref().map(|o| &o.value), &mut managers, writer, &applied, force)
            .map_err(|conflicts| {
                let causes: Vec<Value> = conflicts
                    .iter()
                    .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.field}))
                    .collect();
                let summary: Vec<String> = conflicts.iter().map(|c| format!("conflict with \"{}\": {}", c.manager, c.field)).collect();
                let noun = if conflicts.len() == 1 { "conflict" } else { "conflicts" };
                let mut e = ApiError::new(409, "Conflict", format!("Apply failed with {} {noun}: {}", conflicts.len(), summary.join("\n")));
                e.details = Some(json!({"name": name, "kind": rt.plural, "causes": causes}));
                e
            })?;
        let mut value = merged;
        crate::prepare::prepare(rt, namespace, old.as_ref().map(|o| &o.value), &mut value, scope)?;
        validation::validate(rt, old.as_ref().map(|o| &o.value), &value)?;
        match old {
            None => Ok(self.commit(&key, "ADDED", Object { value, managers }, None)),
            Some(old) => {
                value["metadata"]["resourceVersion"] =
                    old.value["metadata"]["resourceVersion"].clone();
                Ok(self.replace(&key, &old, Object { value, managers }))
            }
        }
    }
}

/// RFC 7386 JSON merge patch.
pub fn json_merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(patch_map) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Some(target_map) = target.as_object_mut() {
                for (k, v) in patch_map {
                    if v.is_null() {
                        target_map.remove(k);
                    } else {
                        json_merge_patch(target_map.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}
