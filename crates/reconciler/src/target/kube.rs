//! The Kubernetes target: kube-rs server-side apply with the field manager
//! `gantry-reconciler`, on objects this gateway owns only.
//!
//! - **Ownership**: every object carries the gateway's name and uid (labels
//!   and an annotation). Before an object is applied, an existing object of
//!   that kind and name without this gateway's uid stops the apply with
//!   "Kind name exists and is not managed by this gateway" (Helm's check);
//!   deletion and pruning select by uid, so they never touch anything else.
//! - **Drift**: an informer-style cache of every owned kind (watches
//!   relisted from the cluster every resync period, spread over it) holds
//!   the live objects; an object is drifted when a field gantry renders has
//!   another value live (values compared semantically: quantities by amount,
//!   list items by name). A converged gateway costs no cluster request at
//!   all, and fields gantry does not render (such as `replicas` when the
//!   spec leaves it to an autoscaler) are never fought.
//! - **Observe**: the rollout from the cached Deployment (as `kubectl
//!   rollout status`); the route from the cached Ingress' load-balancer
//!   address, with its own deadline.
//!
//! Every call has a bounded timeout; only a genuine NotFound counts as
//! absent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::watcher;
use kube::Client;
use serde_json::{Map, Value};

use super::{Owner, Target, TargetError};
use crate::leader::Fence;
use crate::render::{
    owned_selector, Rendered, ANNOTATION_FINGERPRINT, FIELD_MANAGER, LABEL_GATEWAY,
    LABEL_GATEWAY_UID, LABEL_MANAGED_BY, MANAGED_BY, OWNED_KINDS,
};
use crate::status::{Observation, Workload};

/// Longest any single call to the cluster may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Tunables of the Kubernetes target.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// Every owned kind is listed again from the cluster about this often
    /// (a watch that missed a change, or resumed on a server that lost the
    /// objects, is corrected within one period).
    pub relist_period: Duration,
    /// How long a route may wait for a load-balancer address before the
    /// gateway is DEGRADED.
    pub route_deadline: Duration,
}

impl Default for KubeSettings {
    fn default() -> Self {
        Self { relist_period: Duration::from_secs(300), route_deadline: Duration::from_secs(600) }
    }
}

/// Gateways' objects in one namespace of a cluster.
pub struct KubeTarget {
    client: Client,
    namespace: String,
    settings: KubeSettings,
    fence: Fence,
    cache: Arc<Mutex<Cache>>,
}

/// `(kind, name)` of an owned object; the kind is one of [`OWNED_KINDS`].
type Key = (&'static str, Box<str>);

/// What the owned-object watches know (an informer cache), kept small: per
/// object its owner, version, what observe reads of it and, until a pass
/// has compared it with a rendering, the fields a rendering can set.
#[derive(Debug, Default)]
struct Cache {
    /// Kinds whose watch has finished a list.
    synced: HashSet<&'static str>,
    /// `(kind, name)` → the live object.
    objects: HashMap<Key, Live>,
    /// A list in progress, per kind: swapped in whole when it is done, so a
    /// relist never shows a half-empty cache.
    listing: HashMap<&'static str, HashMap<Box<str>, Live>>,
    /// `(kind, name)` → resourceVersion our last apply returned, until the
    /// watch brings that version: a cached copy older than that is not
    /// judged (the watch lags our write).
    applied: HashMap<Key, u64>,
    /// `(kind, name)` → while our apply of it is in flight, the newest
    /// deletion of it the watch reported meanwhile. An answer older than
    /// that deletion is of an object that no longer exists: cached, it hid
    /// the deletion (nothing re-created the object) until the next relist.
    applying: HashMap<Key, Option<u64>>,
    /// Gateway uid → the keys of its objects in `objects`: what a gateway
    /// owns without scanning every cached object (a scan per pass made a
    /// fleet of 10,000 quadratic).
    owned: HashMap<Arc<str>, Vec<Key>>,
    /// The texts of objects not judged yet, shared ([`Unjudged`]).
    shapes: HashSet<Arc<str>>,
    /// Size of `shapes` after its last sweep of texts no object holds.
    swept: usize,
}

/// An owned object as the watch last saw it. Not the object: at 100,000
/// gateways the objects' JSON took about 5 KB per gateway, the budget of
/// the whole process is 2.6 KB.
#[derive(Debug, Clone)]
struct Live {
    gateway: Option<Arc<str>>,
    uid: Option<Arc<str>>,
    resource_version: u64,
    /// Read when the object arrives (needs no rendering); behind a
    /// pointer, as most kinds have none (an entry's size counts 400,000
    /// times at 100,000 gateways).
    reading: Option<Arc<Reading>>,
    /// Whether this version has the rendered values.
    judgement: Judgement,
}

/// What observe reads of an object besides drift.
#[derive(Debug, Clone, PartialEq)]
enum Reading {
    /// A Deployment's rollout.
    Rollout(Workload),
    /// An Ingress' load-balancer address and creation time (Unix seconds).
    Route { address: Box<str>, created: Option<i64> },
}

/// Drift of one version of an object from a rendering.
#[derive(Debug, Clone, PartialEq)]
enum Judgement {
    /// Not compared yet: the object as JSON text without what no rendering
    /// sets (status, server-only metadata), parsed by the first pass that
    /// compares it.
    Pending(Unjudged),
    /// Compared with the rendering of this fingerprint: the first rendered
    /// value it lacks, if any. Another rendering is applied before it is
    /// compared (an apply answers the object, which is then judged).
    Judged { fingerprint: Arc<str>, drift: Option<Arc<str>> },
}

/// The text of an object not judged yet, with its gateway's uid, name and
/// fingerprint cut out (placeholders no JSON text holds: serializers
/// escape control characters): the objects of gateways rendered alike
/// share one text, so a restart over a fleet stamped from a few templates
/// holds a few texts per kind while its watches list, not one per object.
#[derive(Debug, Clone, PartialEq)]
struct Unjudged {
    shape: Arc<str>,
    /// The pod template's fingerprint annotation (Deployments).
    fingerprint: Option<Box<str>>,
}

const CUT_UID: &str = "\u{1}";
const CUT_FINGERPRINT: &str = "\u{2}";
const CUT_GATEWAY: &str = "\u{3}";

impl Unjudged {
    /// The cuts of a text, in the order they are made (and undone in
    /// reverse): each value is cut wherever it occurs, so undoing them
    /// restores the text exactly whatever else the values match.
    fn cuts<'a>(
        uid: Option<&'a str>,
        fingerprint: Option<&'a str>,
        gateway: Option<&'a str>,
    ) -> impl DoubleEndedIterator<Item = (&'static str, &'a str)> {
        [(CUT_UID, uid), (CUT_FINGERPRINT, fingerprint), (CUT_GATEWAY, gateway)]
            .into_iter()
            .filter_map(|(cut, value)| Some((cut, value.filter(|v| !v.is_empty())?)))
    }

    fn of(text: &str, uid: Option<&str>, fingerprint: Option<&str>, gateway: Option<&str>) -> Self {
        let mut shape = text.to_string();
        for (cut, value) in Self::cuts(uid, fingerprint, gateway) {
            shape = shape.replace(value, cut);
        }
        Unjudged { shape: Arc::from(shape), fingerprint: fingerprint.map(Box::from) }
    }

    /// The object's text again.
    fn text(&self, uid: Option<&str>, gateway: Option<&str>) -> String {
        let mut text = self.shape.to_string();
        for (cut, value) in Self::cuts(uid, self.fingerprint.as_deref(), gateway).rev() {
            text = text.replace(cut, value);
        }
        text
    }
}

/// The kind of [`OWNED_KINDS`] named `kind` ("" for any other).
fn owned_kind(kind: &str) -> &'static str {
    OWNED_KINDS.iter().map(|(_, k)| *k).find(|k| *k == kind).unwrap_or("")
}

impl Live {
    /// Reads what observe needs of `o` and keeps the fields a rendering can
    /// set as text (one serialization, no intermediate copy of the object).
    fn of(kind: &str, o: DynamicObject) -> Live {
        Self::read(kind, o, |data, uid, gateway| {
            let fingerprint = data["spec"]["template"]["metadata"]["annotations"]
                [ANNOTATION_FINGERPRINT]
                .as_str();
            let text = serde_json::to_string(data).unwrap_or_default();
            Judgement::Pending(Unjudged::of(&text, uid, fingerprint, gateway))
        })
    }

    /// An apply's answer for `manifest`, judged at once.
    fn answered(kind: &str, o: DynamicObject, manifest: &Value, fingerprint: &Arc<str>) -> Live {
        Self::read(kind, o, |data, _, _| judge(data, manifest, fingerprint))
    }

    /// What observe needs of `o` besides drift, and `judgement` of the
    /// fields a rendering can set (status and server-only metadata gone),
    /// given the gateway's uid and name.
    fn read(
        kind: &str,
        o: DynamicObject,
        judgement: impl FnOnce(&Value, Option<&str>, Option<&str>) -> Judgement,
    ) -> Live {
        let DynamicObject { metadata, mut data, .. } = o;
        let label = |key: &str| {
            metadata.labels.as_ref().and_then(|l| l.get(key)).map(|v| Arc::from(v.as_str()))
        };
        let status = data.as_object_mut().and_then(|d| d.remove("status"));
        let reading = match kind {
            "Deployment" => {
                let replicas =
                    data["spec"]["replicas"].as_i64().and_then(|r| i32::try_from(r).ok());
                let deployment = Deployment {
                    metadata: kube::api::ObjectMeta {
                        generation: metadata.generation,
                        ..Default::default()
                    },
                    spec: Some(k8s_openapi::api::apps::v1::DeploymentSpec {
                        replicas,
                        ..Default::default()
                    }),
                    status: status.and_then(|s| serde_json::from_value(s).ok()),
                };
                Some(Reading::Rollout(rollout(&deployment)))
            }
            "Ingress" => {
                let lb = status.as_ref().map(|s| &s["loadBalancer"]["ingress"][0]);
                let address = lb
                    .and_then(|lb| {
                        lb["hostname"].as_str().filter(|h| !h.is_empty()).or(lb["ip"].as_str())
                    })
                    .unwrap_or("");
                let created = metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
                Some(Reading::Route { address: address.into(), created })
            }
            _ => None,
        };
        let kept = serde_json::json!({
            "name": metadata.name, "namespace": metadata.namespace,
            "labels": metadata.labels, "annotations": metadata.annotations,
        });
        if let Some(fields) = data.as_object_mut() {
            fields.insert("metadata".into(), kept);
        }
        let (gateway, uid) = (label(LABEL_GATEWAY), label(LABEL_GATEWAY_UID));
        let judgement = judgement(&data, uid.as_deref(), gateway.as_deref());
        Live {
            gateway,
            uid,
            resource_version: resource_version(metadata.resource_version.as_deref()),
            reading: reading.map(Arc::new),
            judgement,
        }
    }

    /// The object's text, if not judged yet.
    #[cfg(test)]
    fn unjudged_text(&self) -> Option<String> {
        match &self.judgement {
            Judgement::Pending(u) => Some(u.text(self.uid.as_deref(), self.gateway.as_deref())),
            Judgement::Judged { .. } => None,
        }
    }
}

fn resource_version(rv: Option<&str>) -> u64 {
    rv.and_then(|rv| rv.parse().ok()).unwrap_or(0)
}

fn key(kind: &str, name: &str) -> Key {
    (owned_kind(kind), name.into())
}

fn kind_and_name(manifest: &Value) -> (&str, &str) {
    (manifest["kind"].as_str().unwrap_or(""), manifest["metadata"]["name"].as_str().unwrap_or(""))
}

/// Whether `live` has every value `want` sets (what gantry applies):
/// fields others added are ignored, quantities compare by amount, list
/// items with a `name` are matched by name, other lists item by item.
pub fn covers(live: &Value, want: &Value) -> bool {
    difference(live, want).is_none()
}

/// The path of the first value `want` sets that `live` does not have.
pub fn difference(live: &Value, want: &Value) -> Option<String> {
    match (live, want) {
        (Value::Object(live), Value::Object(want)) => fields_difference(live, want.iter()),
        (Value::Array(live), Value::Array(want)) => {
            let named = want.iter().all(|w| w.get("name").is_some());
            if named {
                want.iter().find_map(|w| {
                    let name = w["name"].as_str().unwrap_or("");
                    match live.iter().find(|l| l.get("name") == w.get("name")) {
                        Some(l) => difference(l, w).map(|p| format!("[{name}]{p}")),
                        None => Some(format!("[{name}]")),
                    }
                })
            } else if live.len() != want.len() {
                Some(format!(" (length {} instead of {})", live.len(), want.len()))
            } else {
                live.iter()
                    .zip(want)
                    .enumerate()
                    .find_map(|(i, (l, w))| difference(l, w).map(|p| format!("[{i}]{p}")))
            }
        }
        (Value::String(l), Value::String(w)) => {
            let same_amount = matches!(
                (gantry_core::syntax::quantity_nanos(l), gantry_core::syntax::quantity_nanos(w)),
                (Some(a), Some(b)) if a == b
            );
            (l != w && !same_amount).then(String::new)
        }
        (Value::Number(l), Value::Number(w)) => (l.as_f64() != w.as_f64()).then(String::new),
        (l, w) => (l != w && !(l.is_null() && is_empty(w))).then(String::new),
    }
}

/// The first of the fields `want` that `live` does not have.
fn fields_difference<'a>(
    live: &Map<String, Value>,
    mut want: impl Iterator<Item = (&'a String, &'a Value)>,
) -> Option<String> {
    want.find_map(|(k, w)| match live.get(k) {
        Some(l) => difference(l, w).map(|p| format!(".{k}{p}")),
        None if is_empty(w) => None,
        None => Some(format!(".{k}")),
    })
}

/// [`difference`] of a cached object from its manifest, but for
/// `apiVersion` and `kind`: listed objects carry no type.
fn drift(live: &Value, manifest: &Value) -> Option<String> {
    match (live, manifest) {
        (Value::Object(live), Value::Object(want)) => fields_difference(
            live,
            want.iter().filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind")),
        ),
        _ => difference(live, manifest),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

impl Cache {
    /// An object the watch brought, its text shared with every other
    /// object of that shape.
    fn arrived(&mut self, kind: &str, o: DynamicObject) -> Live {
        let mut live = Live::of(kind, o);
        self.share(&mut live);
        live
    }

    fn share(&mut self, live: &mut Live) {
        let Judgement::Pending(unjudged) = &mut live.judgement else { return };
        match self.shapes.get(&unjudged.shape) {
            Some(shared) => unjudged.shape = shared.clone(),
            None => {
                self.shapes.insert(unjudged.shape.clone());
                if self.shapes.len() > 2 * self.swept + 1024 {
                    self.shapes.retain(|shape| Arc::strong_count(shape) > 1);
                    self.swept = self.shapes.len();
                }
            }
        }
    }

    /// Caches `live` under `k`, keeping the owner index; the owner's uid
    /// and name are shared by all its objects.
    fn put(&mut self, k: Key, mut live: Live) {
        if let Some(uid) = live.uid.take() {
            let uid = match self.owned.get_key_value(&uid) {
                Some((shared, _)) => shared.clone(),
                None => uid,
            };
            let keys = self.owned.entry(uid.clone()).or_default();
            if !keys.contains(&k) {
                keys.push(k.clone());
            }
            // The gateway's name too, from another of its objects.
            let sibling = keys.iter().find(|other| **other != k).and_then(|o| self.objects.get(o));
            if let Some(shared) = sibling.and_then(|o| o.gateway.clone()) {
                if live.gateway.as_deref() == Some(&*shared) {
                    live.gateway = Some(shared);
                }
            }
            live.uid = Some(uid);
        }
        let new_uid = live.uid.clone();
        if let Some(old) = self.objects.insert(k.clone(), live) {
            if old.uid != new_uid {
                self.unindex(old.uid.as_deref(), &k);
            }
        }
    }

    /// Caches `live` unless the cache holds a newer version of `k` (an
    /// apply's answer arrives before the watch brings the same version).
    /// Of the same version, a judgement replaces what was cached (an apply
    /// that changed nothing is judged against its new rendering), and text
    /// does not replace a judgement (the watch's echo of our apply).
    fn put_newest(&mut self, k: Key, live: Live) {
        let keep = self.objects.get(&k).is_some_and(|cached| {
            cached.resource_version > live.resource_version
                || (cached.resource_version == live.resource_version
                    && matches!(live.judgement, Judgement::Pending(_)))
        });
        if !keep {
            self.put(k, live);
        }
    }

    /// Caches the answer to our apply of `k`, unless the watch reported
    /// `k` deleted after the version answered.
    fn answered(&mut self, k: Key, live: Live) {
        let deleted = self.applying.remove(&k).flatten();
        if deleted.is_some_and(|rv| rv > live.resource_version) {
            return;
        }
        self.applied.insert(k.clone(), live.resource_version);
        self.put_newest(k, live);
    }

    /// Removes `k`, keeping the owner index.
    fn take(&mut self, k: &Key) -> Option<Live> {
        let old = self.objects.remove(k)?;
        self.unindex(old.uid.as_deref(), k);
        Some(old)
    }

    fn unindex(&mut self, uid: Option<&str>, k: &Key) {
        let Some(uid) = uid else { return };
        if let Some(keys) = self.owned.get_mut(uid) {
            keys.retain(|owned| owned != k);
            if keys.is_empty() {
                self.owned.remove(uid);
            }
        }
    }

    /// Whether the gateway `uid` has a cached object of a kind `rendered`
    /// does not hold.
    fn owns_other_kinds(&self, uid: &str, rendered: &[Value]) -> bool {
        self.owned.get(uid).is_some_and(|keys| {
            keys.iter().any(|(kind, _)| !rendered.iter().any(|m| m["kind"] == *kind))
        })
    }

    /// What a list brings for `name`: the cached entry when it is the same
    /// version (what was judged of it stays), else the object read anew.
    fn listed(&mut self, kind: &'static str, o: DynamicObject) -> Live {
        let name = o.metadata.name.as_deref().unwrap_or("");
        let rv = resource_version(o.metadata.resource_version.as_deref());
        match self.objects.get(&(kind, name.into())) {
            Some(cached) if cached.resource_version == rv => cached.clone(),
            _ => self.arrived(kind, o),
        }
    }

    /// Gateways whose objects differ between two lists of one kind (an
    /// object listed at the version cached is no change). The first list
    /// of a kind names none: no pass runs before every kind has listed,
    /// and then every gateway is checked anyway (naming them all queued a
    /// second check of each once the first ones had run).
    fn swap_list(&mut self, kind: &'static str, listed: HashMap<Box<str>, Live>) -> Vec<String> {
        let first = !self.synced.contains(kind);
        let mut changed = Vec::new();
        let gone: Vec<Key> = self
            .objects
            .keys()
            .filter(|(k, name)| *k == kind && !listed.contains_key(name))
            .cloned()
            .collect();
        for k in gone {
            changed.extend(self.take(&k).and_then(|b| b.gateway).map(|g| g.to_string()));
            self.applied.remove(&k);
        }
        for (name, live) in listed {
            let k = (kind, name);
            self.seen(&k, live.resource_version);
            match self.objects.get(&k) {
                Some(before) if before.resource_version == live.resource_version => {}
                before => {
                    changed.extend(before.and_then(|b| b.gateway.as_deref()).map(String::from));
                    changed.extend(live.gateway.as_deref().map(String::from));
                }
            }
            self.put(k, live);
        }
        self.synced.insert(kind);
        if first {
            return Vec::new();
        }
        changed.sort();
        changed.dedup();
        changed
    }

    /// The watch brought version `rv` of `k`: our write of it (or of an
    /// older version) no longer needs remembering.
    fn seen(&mut self, k: &Key, rv: u64) {
        if self.applied.get(k).is_some_and(|applied| *applied <= rv) {
            self.applied.remove(k);
        }
    }

    /// Whether the cached copy of `k` is at least as new as our last apply.
    fn caught_up(&self, k: &Key) -> bool {
        match (self.objects.get(k), self.applied.get(k)) {
            (_, None) => true,
            (Some(live), Some(applied)) => live.resource_version >= *applied,
            (None, Some(_)) => false,
        }
    }

    fn owns_any(&self, kind: &str, uid: &str) -> bool {
        !self.synced.contains(kind)
            || self.owned.get(uid).is_some_and(|keys| keys.iter().any(|(k, _)| *k == kind))
    }

    /// Records what a pass judged of version `rv` of `k` (unless a newer
    /// version arrived meanwhile): the text is no longer kept.
    fn judged(&mut self, k: &Key, rv: u64, judgement: Judgement) {
        if let Some(live) = self.objects.get_mut(k).filter(|l| l.resource_version == rv) {
            live.judgement = judgement;
        }
    }
}

impl std::fmt::Debug for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTarget").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

fn api_resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "Ingress" => "ingresses".to_string(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, TargetError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TargetError(format!("{what}: {}", describe(&e)))),
        Err(_) => Err(TargetError(format!("{what}: no answer within {CALL_TIMEOUT:?}"))),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Deletes one owned object (background propagation); already gone is fine.
async fn delete_object(
    api: &Api<DynamicObject>,
    what: &str,
    name: &str,
) -> Result<(), TargetError> {
    let call = async {
        match api.delete(name, &DeleteParams::background()).await {
            Err(e) if is_not_found(&e) => Ok(()),
            other => other.map(|_| ()),
        }
    };
    bounded(what, call).await
}

/// Whether the API server refused a change to a field that cannot change
/// once set (such as a Deployment's `spec.selector`).
fn is_immutable_change(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("field is immutable"))
}

/// Server-side applies `manifest` (forced: the object is ours, checked
/// before); when the live object differs in a field that cannot change,
/// deletes it and applies again, as `kubectl apply --force` does (retrying
/// the same apply would fail forever).
async fn apply_or_recreate(
    api: &Api<DynamicObject>,
    kind: &str,
    name: &str,
    manifest: &Value,
) -> Result<DynamicObject, TargetError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let what = format!("apply {kind} {name}");
    match tokio::time::timeout(CALL_TIMEOUT, api.patch(name, &params, &Patch::Apply(manifest)))
        .await
    {
        Ok(Err(e)) if is_immutable_change(&e) => {
            tracing::warn!(kind, name, error = %describe(&e), "an immutable field differs; recreating the object");
            delete_object(api, &format!("recreate {kind} {name}"), name).await?;
            bounded(&what, api.patch(name, &params, &Patch::Apply(manifest))).await
        }
        Ok(result) => result.map_err(|e| TargetError(format!("{what}: {}", describe(&e)))),
        Err(_) => Err(TargetError(format!("{what}: no answer within {CALL_TIMEOUT:?}"))),
    }
}

/// The refusal for an object in the way.
fn not_ours(kind: &str, name: &str) -> TargetError {
    TargetError(format!(
        "{kind} {name} exists and is not managed by this gateway; rename or remove it, or give gateways their own namespace"
    ))
}

impl KubeTarget {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self::with_settings(client, namespace, KubeSettings::default())
    }

    pub fn with_settings(
        client: Client,
        namespace: impl Into<String>,
        settings: KubeSettings,
    ) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            settings,
            fence: Fence::default(),
            cache: Arc::default(),
        }
    }

    /// Writes only while `fence` allows (leader election).
    #[must_use]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// Runs a write only while the fence allows, checked before every poll
    /// of the call: a replica frozen mid-pass (SIGSTOP, a long pause) that
    /// wakes after its tenure drops the call instead of sending it. (A
    /// request whose bytes were already handed to the connection before
    /// the freeze can still go out: leader election without fencing
    /// tokens, as client-go's, cannot rule that out.)
    async fn fenced<T>(
        &self,
        what: &str,
        write: impl std::future::Future<Output = Result<T, TargetError>>,
    ) -> Result<T, TargetError> {
        let mut write = std::pin::pin!(write);
        std::future::poll_fn(|cx| {
            if self.fence.allows() {
                write.as_mut().poll(cx)
            } else {
                std::task::Poll::Ready(Err(TargetError(format!(
                    "{what}: stopped, this replica's leadership has lapsed"
                ))))
            }
        })
        .await
    }

    fn api(&self, api_version: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &api_resource(api_version, kind))
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails unless `kind/name` is absent or marked with `owner`'s uid. The
    /// cache answers for objects it holds; anything else is read (an object
    /// without gantry's labels is not in the cache).
    async fn check_owner(
        &self,
        api: &Api<DynamicObject>,
        kind: &str,
        name: &str,
        owner: &Owner,
    ) -> Result<(), TargetError> {
        let cached =
            self.cache().objects.get(&key(kind, name)).map(|l| l.uid.as_deref().map(String::from));
        let uid = match cached {
            Some(uid) => uid,
            None => {
                let live = bounded(&format!("get {kind} {name}"), api.get_opt(name)).await?;
                match live {
                    None => return Ok(()),
                    Some(o) => o.metadata.labels.and_then(|l| l.get(LABEL_GATEWAY_UID).cloned()),
                }
            }
        };
        if uid.as_deref() == Some(owner.uid.as_str()) && !owner.uid.is_empty() {
            Ok(())
        } else {
            Err(not_ours(kind, name))
        }
    }

    /// Objects of one kind marked with `owner`'s uid.
    async fn owned(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        kind: &str,
    ) -> Result<Vec<DynamicObject>, TargetError> {
        let params = ListParams::default().labels(&owned_selector(&owner.uid));
        Ok(bounded(&format!("list {kind}"), api.list(&params)).await?.items)
    }

    /// The route's state from the cached Ingress: its address, or how long
    /// it has waited for one.
    fn route(&self, name: &str) -> (String, Option<Duration>) {
        let reading =
            self.cache().objects.get(&key("Ingress", name)).and_then(|l| l.reading.clone());
        let Some(Reading::Route { address, created }) = reading.as_deref() else {
            return (String::new(), None);
        };
        let waited = created.map(|c| {
            let secs = k8s_openapi::jiff::Timestamp::now().as_second() - c;
            Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        });
        (address.to_string(), waited)
    }
}
/// Whether a Deployment's rollout of its current generation is complete,
/// in progress, or stalled (kubectl rollout status semantics).
pub fn rollout(deployment: &Deployment) -> Workload {
    let generation = deployment.metadata.generation.unwrap_or(0);
    let desired = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = &deployment.status else {
        return Workload::Progressing { message: "waiting for the deployment controller".into() };
    };
    // As `kubectl rollout status`: a condition describes the generation the
    // controller observed, so nothing counts until it caught up (a stalled
    // rollout that was just fixed is progressing again, not stalled).
    if status.observed_generation.unwrap_or(0) < generation {
        return Workload::Progressing { message: "waiting for the rollout to start".into() };
    }
    if let Some(c) = status.conditions.iter().flatten().find(|c| c.type_ == "Progressing") {
        if c.reason.as_deref() == Some("ProgressDeadlineExceeded") {
            return Workload::Stalled {
                reason: "ProgressDeadlineExceeded".into(),
                message: c
                    .message
                    .clone()
                    .unwrap_or_else(|| "the rollout exceeded its progress deadline".into()),
            };
        }
    }
    let updated = status.updated_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    if updated < desired {
        return Workload::Progressing {
            message: format!("{updated} of {desired} replicas updated"),
        };
    }
    if total > updated {
        return Workload::Progressing {
            message: format!("{} old replicas pending termination", total - updated),
        };
    }
    if available < updated {
        return Workload::Progressing {
            message: format!("{available} of {updated} updated replicas available"),
        };
    }
    Workload::Available
}

/// Updates the cache from one watch event; the gateways to re-check.
fn track(
    cache: &Mutex<Cache>,
    kind: &'static str,
    event: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> Vec<String> {
    let mut cache = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match event {
        Ok(watcher::Event::Init) => {
            cache.listing.insert(kind, HashMap::new());
            Vec::new()
        }
        Ok(watcher::Event::InitApply(o)) => {
            let name: Box<str> = o.metadata.name.as_deref().unwrap_or("").into();
            let live = cache.listed(kind, o);
            cache.listing.entry(kind).or_default().insert(name, live);
            Vec::new()
        }
        Ok(watcher::Event::InitDone) => {
            let listed = cache.listing.remove(kind).unwrap_or_default();
            cache.swap_list(kind, listed)
        }
        Ok(watcher::Event::Apply(o)) => {
            let k = key(kind, o.metadata.name.as_deref().unwrap_or(""));
            let live = cache.arrived(kind, o);
            let gateway = live.gateway.as_deref().map(String::from);
            cache.seen(&k, live.resource_version);
            cache.put_newest(k, live);
            gateway.into_iter().collect()
        }
        Ok(watcher::Event::Delete(o)) => {
            let k = key(kind, o.metadata.name.as_deref().unwrap_or(""));
            // Not a later incarnation our apply already answered.
            let rv = resource_version(o.metadata.resource_version.as_deref());
            if let Some(deleted) = cache.applying.get_mut(&k) {
                *deleted = Some(deleted.map_or(rv, |d| d.max(rv)));
            }
            if cache.objects.get(&k).is_none_or(|cached| cached.resource_version <= rv) {
                cache.take(&k);
                cache.applied.remove(&k);
            }
            o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_GATEWAY).cloned())
                .into_iter()
                .collect()
        }
        Err(e) => {
            tracing::warn!(kind, error = %e, "watch of owned objects interrupted; it resumes by itself");
            Vec::new()
        }
    }
}

/// Judges one version of an object against its manifest, rendered with
/// `fingerprint`.
fn judge(object: &Value, manifest: &Value, fingerprint: &Arc<str>) -> Judgement {
    Judgement::Judged {
        fingerprint: fingerprint.clone(),
        drift: drift(object, manifest).map(Arc::from),
    }
}

#[tonic::async_trait]
impl Target for KubeTarget {
    async fn apply(&self, owner: &Owner, rendered: &Rendered) -> Result<(), TargetError> {
        let mut rendered_kinds = Vec::new();
        let fingerprint: Arc<str> = Arc::from(rendered.fingerprint.as_str());
        for manifest in &rendered.manifests {
            let (kind, name) = kind_and_name(manifest);
            let api = self.api(manifest["apiVersion"].as_str().unwrap_or(""), kind);
            self.check_owner(&api, kind, name, owner).await?;
            let what = format!("apply {kind} {name}");
            let k = key(kind, name);
            self.cache().applying.insert(k.clone(), None);
            let applied =
                match self.fenced(&what, apply_or_recreate(&api, kind, name, manifest)).await {
                    Ok(applied) => applied,
                    Err(e) => {
                        self.cache().applying.remove(&k);
                        return Err(e);
                    }
                };
            // The answer is the object as applied: judged now, cached unless
            // the watch already brought a newer version or its deletion.
            let live = Live::answered(k.0, applied, manifest, &fingerprint);
            self.cache().answered(k, live);
            rendered_kinds.push(kind.to_string());
        }
        // Prune: this gateway's objects of kinds no longer rendered. The
        // list is skipped when the kind's watch has listed and holds none
        // of them.
        for (api_version, kind) in OWNED_KINDS.iter().rev() {
            if rendered_kinds.iter().any(|k| k == kind) || !self.cache().owns_any(kind, &owner.uid)
            {
                continue;
            }
            let api = self.api(api_version, kind);
            for object in self.owned(&api, owner, kind).await? {
                let name = object.metadata.name.unwrap_or_default();
                let what = format!("prune {kind} {name}");
                self.fenced(&what, delete_object(&api, &what, &name)).await?;
                tracing::info!(gateway = owner.name, kind, name, "pruned");
            }
        }
        Ok(())
    }

    async fn observe(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, TargetError> {
        let progressing = |message: &str, route_address: String| Observation {
            workload: Workload::Progressing { message: message.into() },
            route_address,
            drifted: false,
        };
        let ingress = rendered.manifests.iter().find(|m| m["kind"] == "Ingress");
        let (route_address, route_waited) = match ingress {
            Some(i) => self.route(kind_and_name(i).1),
            None => (String::new(), None),
        };
        // Only lookups under the lock; texts not judged yet are parsed and
        // compared after it is released (passes run concurrently).
        let (found, leftover) = {
            let cache = self.cache();
            let mut found = Vec::with_capacity(rendered.manifests.len());
            for manifest in &rendered.manifests {
                let (kind, name) = kind_and_name(manifest);
                let k = key(kind, name);
                // Read from the watch only, as an informer-based controller
                // does; until it has listed (or caught up with our apply)
                // the rollout is in progress and nothing is judged.
                if !cache.synced.contains(k.0) || !cache.caught_up(&k) {
                    return Ok(progressing("waiting for the watches to catch up", route_address));
                }
                let live = cache.objects.get(&k).map(|live| {
                    let ours = live.uid.as_deref() == Some(owner.uid.as_str());
                    (ours, live.clone())
                });
                found.push((manifest, k, live));
            }
            // Left behind: this gateway's objects of a kind no longer rendered.
            (found, cache.owns_other_kinds(&owner.uid, &rendered.manifests))
        };
        let mut drifted = leftover;
        let mut deployment = None;
        let mut verdicts = Vec::new();
        // One copy for the verdicts of all this gateway's objects.
        let fingerprint: Arc<str> = Arc::from(rendered.fingerprint.as_str());
        for (manifest, k, live) in found {
            let Some((ours, live)) = live else {
                drifted = true;
                continue;
            };
            let changed = match &live.judgement {
                _ if !ours => Some(format!(".metadata.labels.{LABEL_GATEWAY_UID}").into()),
                Judgement::Judged { fingerprint, drift }
                    if **fingerprint == *rendered.fingerprint =>
                {
                    drift.clone()
                }
                // Judged against another rendering, and not kept: applying
                // this one answers the object again.
                Judgement::Judged { .. } => Some(Arc::from("(not compared with this rendering)")),
                Judgement::Pending(unjudged) => {
                    let text = unjudged.text(live.uid.as_deref(), live.gateway.as_deref());
                    let object: Value = serde_json::from_str(&text).unwrap_or_default();
                    let drift: Option<Arc<str>> = drift(&object, manifest).map(Arc::from);
                    let fingerprint = fingerprint.clone();
                    let verdict = Judgement::Judged { fingerprint, drift: drift.clone() };
                    verdicts.push((k.clone(), live.resource_version, verdict));
                    drift
                }
            };
            if let Some(field) = changed {
                tracing::info!(
                    kind = k.0,
                    name = &*k.1,
                    field = &*field,
                    "drifted from what was applied"
                );
                drifted = true;
            }
            if let Some(Reading::Rollout(workload)) = live.reading.as_deref() {
                deployment = Some(workload.clone());
            }
        }
        if !verdicts.is_empty() {
            let mut cache = self.cache();
            for (k, rv, verdict) in verdicts {
                cache.judged(&k, rv, verdict);
            }
        }
        let Some(deployment) = deployment else {
            return Ok(Observation {
                workload: Workload::Progressing { message: "the Deployment is missing".into() },
                route_address,
                drifted: true,
            });
        };
        let mut workload = deployment;
        if ingress.is_some() && route_address.is_empty() && workload == Workload::Available {
            let name = ingress.map_or("", |i| kind_and_name(i).1);
            let deadline = self.settings.route_deadline;
            workload = if route_waited.is_some_and(|w| w > deadline) {
                Workload::Stalled {
                    reason: crate::status::ROUTE_NOT_ADMITTED.into(),
                    message: format!(
                        "Ingress {name} has no load-balancer address after {deadline:?}; check that an ingress controller serves its class"
                    ),
                }
            } else {
                Workload::Progressing {
                    message: format!("waiting for an address on Ingress {name}"),
                }
            };
        }
        Ok(Observation { workload, route_address, drifted })
    }

    async fn delete(&self, owner: &Owner) -> Result<bool, TargetError> {
        if owner.uid.is_empty() {
            return Ok(true);
        }
        let mut gone = true;
        for (api_version, kind) in OWNED_KINDS.iter().rev() {
            let api = self.api(api_version, kind);
            for object in self.owned(&api, owner, kind).await? {
                gone = false;
                if object.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let name = object.metadata.name.unwrap_or_default();
                let what = format!("delete {kind} {name}");
                self.fenced(&what, delete_object(&api, &what, &name)).await?;
            }
        }
        Ok(gone)
    }

    fn watch_owned(&self) -> Option<BoxStream<'static, String>> {
        let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
        let (tx, rx) = tokio::sync::mpsc::channel::<String>(1024);
        let period = self.settings.relist_period;
        for (i, (api_version, kind)) in OWNED_KINDS.iter().enumerate() {
            let api = self.api(api_version, kind);
            let (cache, config, tx) = (self.cache.clone(), config.clone(), tx.clone());
            // Relists of the kinds are spread over the period, and each
            // comes within one period of the last (jitter only shortens).
            let first = period.mul_f64((i + 1) as f64 / OWNED_KINDS.len() as f64);
            tokio::spawn(async move {
                let mut next_relist = tokio::time::Instant::now() + first;
                loop {
                    // Backoff between failed (re)connections: without it a
                    // watcher whose API server is gone retries in a tight loop.
                    let mut events = kube::runtime::WatchStreamExt::default_backoff(watcher(
                        api.clone(),
                        config.clone(),
                    ))
                    .boxed();
                    loop {
                        tokio::select! {
                            event = events.next() => {
                                let Some(event) = event else { break };
                                // A resourceVersion the server never issued
                                // (it lost its data, or is another server):
                                // resuming from it would wait forever, so
                                // list again now.
                                let unknown = matches!(&event, Err(e) if e.to_string().contains("Too large resource version"));
                                for gateway in track(&cache, kind, event) {
                                    if tx.send(gateway).await.is_err() {
                                        return;
                                    }
                                }
                                if unknown {
                                    break;
                                }
                            }
                            () = tokio::time::sleep_until(next_relist) => break,
                            () = tx.closed() => return,
                        }
                    }
                    tracing::debug!(kind, "relisting owned objects");
                    let jitter = 0.8 + fastrand::f64() * 0.2;
                    next_relist = tokio::time::Instant::now() + period.mul_f64(jitter);
                }
            });
        }
        Some(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    fn unsynced(&self) -> Vec<&'static str> {
        let cache = self.cache();
        OWNED_KINDS.iter().map(|(_, k)| *k).filter(|k| !cache.synced.contains(k)).collect()
    }

    fn may_write(&self) -> bool {
        self.fence.allows()
    }

    fn name(&self) -> &'static str {
        "kube"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn live(uid: &str) -> Live {
        Live {
            gateway: Some("edge".into()),
            uid: Some(uid.into()),
            resource_version: 1,
            reading: None,
            judgement: Judgement::Pending(Unjudged::of("{}", None, None, None)),
        }
    }

    #[test]
    fn the_owner_index_follows_every_change_of_the_cache() {
        let mut cache = Cache::default();
        cache.synced.extend(["ConfigMap", "Ingress"]);
        cache.put(key("ConfigMap", "edge"), live("u1"));
        cache.put(key("Ingress", "edge"), live("u1"));
        let name = |k: &str| cache.objects[&key(k, "edge")].gateway.clone().unwrap();
        assert!(Arc::ptr_eq(&name("ConfigMap"), &name("Ingress")), "one name per gateway");
        let rendered = [json!({"kind": "ConfigMap"})];
        assert!(cache.owns_any("Ingress", "u1"));
        assert!(cache.owns_other_kinds("u1", &rendered), "the Ingress is left over");
        // Taken over by another gateway's uid, then deleted.
        cache.put(key("Ingress", "edge"), live("u2"));
        assert!(!cache.owns_any("Ingress", "u1") && cache.owns_any("Ingress", "u2"));
        assert!(!cache.owns_other_kinds("u1", &rendered));
        cache.take(&key("Ingress", "edge"));
        assert!(!cache.owns_any("Ingress", "u2"));
        assert!(!cache.owned.contains_key("u2"), "empty entries go");
        // A relist swaps the kind in whole.
        cache.swap_list("ConfigMap", HashMap::new());
        assert!(cache.owned.is_empty());
        // A kind not listed yet may hold anything.
        assert!(cache.owns_any("Secret", "u1"));
    }

    fn object(kind: &str, name: &str, rv: u64, extra: Value) -> DynamicObject {
        let mut o = json!({
            "apiVersion": "v1", "kind": kind,
            "metadata": {
                "name": name, "namespace": "default", "uid": "server-uid",
                "resourceVersion": rv.to_string(), "generation": 2,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {LABEL_GATEWAY: "edge", LABEL_GATEWAY_UID: "u1"},
                "managedFields": [{"manager": "gantry-reconciler"}],
            },
        });
        if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
            o.extend(extra.clone());
        }
        serde_json::from_value(o).unwrap()
    }

    #[test]
    fn an_object_is_kept_as_what_observe_reads_of_it() {
        let status = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        let spec =
            json!({"replicas": 2, "template": {"spec": {"containers": [{"name": "gateway"}]}}});
        let live = Live::of(
            "Deployment",
            object("Deployment", "edge", 7, json!({"spec": spec, "status": status})),
        );
        assert_eq!(live.resource_version, 7);
        assert_eq!((live.gateway.as_deref(), live.uid.as_deref()), (Some("edge"), Some("u1")));
        assert_eq!(live.reading.as_deref(), Some(&Reading::Rollout(Workload::Available)));
        let kept: Value = serde_json::from_str(&live.unjudged_text().unwrap()).unwrap();
        assert_eq!(kept["spec"], spec, "every field a rendering can set");
        assert_eq!(kept["metadata"]["labels"][LABEL_GATEWAY], "edge");
        for gone in ["status", "apiVersion", "kind"] {
            assert!(kept.get(gone).is_none(), "{gone} kept: {kept}");
        }
        for gone in ["uid", "resourceVersion", "generation", "creationTimestamp", "managedFields"] {
            assert!(kept["metadata"].get(gone).is_none(), "metadata.{gone} kept: {kept}");
        }
        // A rollout behind its generation is in progress.
        let behind = json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        let live = Live::of(
            "Deployment",
            object("Deployment", "edge", 8, json!({"spec": spec, "status": behind})),
        );
        assert!(matches!(
            live.reading.as_deref(),
            Some(Reading::Rollout(Workload::Progressing { .. }))
        ));

        let lb = json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.9"}]}});
        let live =
            Live::of("Ingress", object("Ingress", "edge", 9, json!({"spec": {}, "status": lb})));
        let Some(Reading::Route { address, created }) = live.reading.as_deref() else { panic!() };
        assert_eq!((&**address, *created), ("10.0.0.9", Some(1_767_225_600)));
    }

    #[test]
    fn objects_of_gateways_rendered_alike_share_their_text_until_judged() {
        let deployment = |gateway: &str, uid: &str, fingerprint: &str| {
            let mut o = object(
                "Deployment",
                gateway,
                3,
                json!({"spec": {
                    "selector": {"matchLabels": {LABEL_GATEWAY: gateway}},
                    "template": {"metadata": {"annotations": {ANNOTATION_FINGERPRINT: fingerprint}},
                        "spec": {"containers": [{"name": "gateway", "image": "gw:1", "args": [format!("--name={gateway}")]}]}},
                }}),
            );
            o.metadata.labels = Some(
                [
                    (LABEL_GATEWAY.to_string(), gateway.to_string()),
                    (LABEL_GATEWAY_UID.to_string(), uid.to_string()),
                ]
                .into(),
            );
            o
        };
        let mut cache = Cache::default();
        let mut texts = Vec::new();
        let mut lives = Vec::new();
        // "a" occurs in other values too ("gateway", "args"): cut and
        // restored wherever it occurs, the text comes back exactly.
        for (gateway, uid, fingerprint) in
            [("edge", "u-1", "f00d"), ("core", "u-2", "beef"), ("a", "u-3", "cafe")]
        {
            let o = deployment(gateway, uid, fingerprint);
            let mut expected = serde_json::to_value(&o).unwrap();
            let labels = expected["metadata"]["labels"].clone();
            expected["metadata"] = json!({"name": gateway, "namespace": "default", "labels": labels, "annotations": null});
            for gone in ["apiVersion", "kind"] {
                expected.as_object_mut().unwrap().remove(gone);
            }
            let mut live = Live::of("Deployment", o);
            cache.share(&mut live);
            let text: Value = serde_json::from_str(&live.unjudged_text().unwrap()).unwrap();
            assert_eq!(text, expected, "{gateway}");
            texts.push(text);
            lives.push(live);
        }
        let shape = |l: &Live| match &l.judgement {
            Judgement::Pending(u) => u.shape.clone(),
            Judgement::Judged { .. } => panic!("judged"),
        };
        assert!(Arc::ptr_eq(&shape(&lives[0]), &shape(&lives[1])), "one text for both");
        assert_eq!(cache.shapes.len(), 2);
        assert_ne!(texts[0], texts[1]);
    }

    #[test]
    fn a_judgement_lasts_as_long_as_the_version_it_judged() {
        let cache = Mutex::new(Cache::default());
        let verdict = || Judgement::Judged { fingerprint: "f1".into(), drift: None };
        let list = |rv: u64| {
            track(&cache, "ConfigMap", Ok(watcher::Event::Init));
            track(
                &cache,
                "ConfigMap",
                Ok(watcher::Event::InitApply(object("ConfigMap", "edge", rv, json!({})))),
            );
            track(&cache, "ConfigMap", Ok(watcher::Event::InitDone))
        };
        let cached =
            |cache: &Mutex<Cache>| cache.lock().unwrap().objects[&key("ConfigMap", "edge")].clone();
        assert!(list(5).is_empty(), "the first list: every gateway is checked after it anyway");
        assert_eq!(list(4), ["edge"], "a relist that found another version");
        assert_eq!(list(5), ["edge"]);
        cache.lock().unwrap().judged(&key("ConfigMap", "edge"), 5, verdict());
        // A relist of the same version keeps the verdict (no text again).
        assert!(list(5).is_empty());
        assert_eq!(cached(&cache).judgement, verdict());
        // The watch's echo of the same version too; an older one is ignored.
        let apply = |rv| {
            Ok(watcher::Event::Apply(object("ConfigMap", "edge", rv, json!({"data": {"a": "1"}}))))
        };
        track(&cache, "ConfigMap", apply(5));
        track(&cache, "ConfigMap", apply(4));
        assert_eq!((cached(&cache).resource_version, cached(&cache).judgement), (5, verdict()));
        // A verdict for a version that was replaced meanwhile is dropped.
        track(&cache, "ConfigMap", apply(6));
        cache.lock().unwrap().judged(&key("ConfigMap", "edge"), 5, verdict());
        assert!(matches!(cached(&cache).judgement, Judgement::Pending(_)));
        // Of the same version, a judgement (an apply's answer) replaces text.
        let mut answered = Live::of("ConfigMap", object("ConfigMap", "edge", 6, json!({})));
        answered.judgement = verdict();
        cache.lock().unwrap().put_newest(key("ConfigMap", "edge"), answered);
        assert_eq!(cached(&cache).judgement, verdict());
        // Our write is remembered until the watch brings its version.
        cache.lock().unwrap().applied.insert(key("ConfigMap", "edge"), 8);
        track(&cache, "ConfigMap", apply(7));
        assert!(!cache.lock().unwrap().caught_up(&key("ConfigMap", "edge")));
        track(&cache, "ConfigMap", apply(8));
        assert!(cache.lock().unwrap().applied.is_empty(), "forgotten once seen");
        assert!(cache.lock().unwrap().caught_up(&key("ConfigMap", "edge")));
        // The deletion of an older incarnation leaves the newer one cached.
        track(
            &cache,
            "ConfigMap",
            Ok(watcher::Event::Delete(object("ConfigMap", "edge", 3, json!({})))),
        );
        assert_eq!(cached(&cache).resource_version, 8);
        track(
            &cache,
            "ConfigMap",
            Ok(watcher::Event::Delete(object("ConfigMap", "edge", 9, json!({})))),
        );
        assert!(cache.lock().unwrap().objects.is_empty() && cache.lock().unwrap().owned.is_empty());
    }

    #[test]
    fn a_deletion_reported_while_our_apply_is_in_flight_is_not_hidden_by_its_answer() {
        let cache = Mutex::new(Cache::default());
        let k = key("Service", "edge");
        let answer = |rv| {
            let mut live = Live::of("Service", object("Service", "edge", rv, json!({})));
            live.judgement = Judgement::Judged { fingerprint: "f1".into(), drift: None };
            live
        };
        let deleted = |rv| {
            track(
                &cache,
                "Service",
                Ok(watcher::Event::Delete(object("Service", "edge", rv, json!({})))),
            )
        };
        // Our apply updated the object (version 5), someone deleted it
        // (version 6), and the watch told us before the answer came back.
        cache.lock().unwrap().applying.insert(k.clone(), None);
        assert_eq!(deleted(6), ["edge"]);
        cache.lock().unwrap().answered(k.clone(), answer(5));
        let state = cache.lock().unwrap();
        assert!(!state.objects.contains_key(&k), "the answer hid the deletion");
        assert!(!state.applied.contains_key(&k) && state.applying.is_empty());
        drop(state);

        // An apply that re-creates it after the deletion is cached.
        cache.lock().unwrap().applying.insert(k.clone(), None);
        deleted(6);
        cache.lock().unwrap().answered(k.clone(), answer(7));
        assert_eq!(cache.lock().unwrap().objects[&k].resource_version, 7);
        assert_eq!(cache.lock().unwrap().applied[&k], 7);
        // A deletion reported after the answer is taken as before.
        deleted(8);
        assert!(cache.lock().unwrap().objects.is_empty());
    }

    fn deployment(generation: i64, status: Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "edge", "generation": generation},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": status,
        }))
        .unwrap_or_default()
    }

    fn deadline_exceeded(observed: i64) -> Value {
        json!({
            "observedGeneration": observed, "replicas": 2, "updatedReplicas": 2,
            "availableReplicas": 0,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}],
        })
    }

    #[test]
    fn a_rollout_is_judged_as_kubectl_rollout_status_does() {
        // The controller has not seen the new generation: its conditions
        // describe the old one, so a fix is not reported as stalled.
        assert!(matches!(
            rollout(&deployment(3, deadline_exceeded(2))),
            Workload::Progressing { .. }
        ));
        assert!(matches!(rollout(&deployment(2, deadline_exceeded(2))), Workload::Stalled { .. }));
        let complete = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert_eq!(rollout(&deployment(2, complete)), Workload::Available);
        let old_pods = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(matches!(rollout(&deployment(2, old_pods)), Workload::Progressing { .. }));
    }

    #[test]
    fn drift_is_a_rendered_value_changed_live_and_nothing_else() {
        let want = json!({
            "metadata": {"name": "edge", "labels": {"a": "1"}},
            "data": {"mode": "safe"},
            "spec": {
                "ports": [{"name": "https", "port": 443}],
                "template": {"spec": {"containers": [{"name": "gateway", "image": "gw:1",
                    "resources": {"limits": {"memory": "1024Mi"}}}]}},
            },
        });
        // What the server returns: defaults and other managers' fields added,
        // quantities canonicalised, lists in its own order.
        let live = json!({
            "metadata": {"name": "edge", "uid": "x", "labels": {"a": "1", "other": "2"}},
            "data": {"mode": "safe", "extra": "kept"},
            "spec": {
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 443}],
                "replicas": 7,
                "template": {"spec": {"containers": [
                    {"name": "injected-sidecar", "image": "mesh:1"},
                    {"name": "gateway", "image": "gw:1", "terminationMessagePath": "/dev/termination-log",
                     "resources": {"limits": {"memory": "1Gi"}}},
                ]}},
            },
        });
        assert!(covers(&live, &want));
        for (path, value) in [
            ("/data/mode", json!("HACKED")),
            ("/spec/ports/0/port", json!(8443)),
            ("/spec/template/spec/containers/1/image", json!("evil:1")),
            ("/spec/template/spec/containers/1/resources/limits/memory", json!("2Gi")),
            ("/metadata/labels/a", json!("2")),
        ] {
            let mut changed = live.clone();
            *changed.pointer_mut(path).unwrap() = value;
            assert!(!covers(&changed, &want), "{path} changed and not seen");
        }
        let mut removed = live.clone();
        removed["data"].as_object_mut().unwrap().remove("mode");
        assert!(!covers(&removed, &want), "a removed key");

        // A manifest names its type; listed objects do not carry it, and
        // that alone is no drift. Anything else still is.
        let mut manifest = want.clone();
        manifest["apiVersion"] = json!("v1");
        manifest["kind"] = json!("ConfigMap");
        assert!(!covers(&live, &manifest), "difference compares every field");
        assert_eq!(drift(&live, &manifest), None);
        assert_eq!(drift(&removed, &manifest).as_deref(), Some(".data.mode"));
        let mut typed = live.clone();
        typed["kind"] = json!("Secret");
        assert_eq!(drift(&typed, &manifest), None, "the type is never compared");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_wakes_after_the_tenure_is_dropped() {
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .expect("a client (no connection is made)");
        let fence = Fence::elected();
        fence.hold_until(Some(tokio::time::Instant::now() + Duration::from_secs(1)));
        let target = KubeTarget::new(client, "default").with_fence(fence);
        let sent = std::sync::atomic::AtomicBool::new(false);
        // A call suspended for longer than the tenure (a frozen process).
        let write = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            sent.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        let outcome = target.fenced("apply ConfigMap edge", write).await;
        assert!(outcome.unwrap_err().0.contains("leadership has lapsed"));
        assert!(!sent.load(std::sync::atomic::Ordering::SeqCst), "the write went on");
        let quick = target.fenced("apply ConfigMap edge", async { Ok(()) }).await;
        assert!(quick.is_err(), "a write started after the tenure");
    }

    #[test]
    fn only_a_refused_immutable_change_recreates() {
        let refusal = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status { code, message: message.into(), ..Default::default() }.boxed(),
            )
        };
        assert!(is_immutable_change(&refusal(
            422,
            "Deployment.apps \"edge\" is invalid: spec.selector: Invalid value: {}: field is immutable"
        )));
        assert!(!is_immutable_change(&refusal(422, "spec.replicas: Invalid value: -1")));
        assert!(!is_immutable_change(&refusal(409, "field is immutable")));
    }
}
