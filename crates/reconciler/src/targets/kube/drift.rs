//! The drift judge: whether a live object still has every value gantry
//! applies, judged the way server-side apply merges what it applies (the
//! schemas of [`gantry_k8s_schema`], compacted from the real API server's
//! OpenAPI):
//!
//! - structs and granular maps by key: keys others added are theirs;
//! - atomic maps, structs and lists whole (a Service's `selector`, a
//!   container's `args`, a label selector): a key or item someone added is
//!   drift, since the next apply replaces the whole value;
//! - list-maps by their keys (containers by `name`, ports by
//!   `containerPort` and `protocol`): items others added are theirs, a
//!   changed value inside one of ours is drift;
//! - sets by value.
//!
//! Scalars compare semantically: quantities by amount, numbers by value.

use gantry_k8s_schema::{ListType, Node, Schema, Shape, Struct};
use serde_json::{Map, Value};

/// The path of the first value `manifest` applies that `live` (a cached
/// object, which carries no `apiVersion` or `kind`) does not have, judged
/// by the schema of the manifest's kind.
pub(super) fn drift(live: &Value, manifest: &Value) -> Option<String> {
    let schema = Schema::get();
    let api_version = manifest["apiVersion"].as_str().unwrap_or("");
    let kind = manifest["kind"].as_str().unwrap_or("");
    let node = schema.kind(api_version, kind);
    match (live, manifest) {
        (Value::Object(live), Value::Object(want)) => {
            let typed = want.iter().filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind"));
            fields_difference(schema, node, live, typed, false)
        }
        _ => difference(schema, node, live, manifest, false),
    }
}

/// The path of the first value `want` sets that `live` does not have;
/// `whole`: inside an atomic value, where nothing may be added either.
fn difference(
    schema: &Schema,
    node: &Node,
    live: &Value,
    want: &Value,
    whole: bool,
) -> Option<String> {
    match (schema.shape(node), live, want) {
        (Shape::Struct(s), Value::Object(l), Value::Object(w)) => {
            let whole = whole || s.atomic;
            added(l, w, whole).or_else(|| fields_difference(schema, node, l, w.iter(), whole))
        }
        (Shape::Map(_, atomic), Value::Object(l), Value::Object(w)) => {
            let whole = whole || atomic;
            added(l, w, whole).or_else(|| fields_difference(schema, node, l, w.iter(), whole))
        }
        (Shape::List(item, ListType::Map(keys)), Value::Array(l), Value::Array(w)) if !whole => {
            let defaults = match schema.shape(item) {
                Shape::Struct(Struct { defaults, .. }) => Some(defaults),
                _ => None,
            };
            let key_of = |v: &Value| item_key(v, keys, defaults);
            // Each live item's key once, not once per wanted item.
            let live: Vec<(String, &Value)> = l.iter().map(|v| (key_of(v), v)).collect();
            w.iter().find_map(|wanted| {
                let key = key_of(wanted);
                match live.iter().find(|(candidate, _)| *candidate == key) {
                    Some((_, found)) => difference(schema, item, found, wanted, false)
                        .map(|p| format!("[{key}]{p}")),
                    None => Some(format!("[{key}]")),
                }
            })
        }
        (Shape::List(item, ListType::Set), Value::Array(l), Value::Array(w)) if !whole => w
            .iter()
            .find(|wanted| !l.iter().any(|v| difference(schema, item, v, wanted, false).is_none()))
            .map(|missing| format!("[{missing}]")),
        (Shape::List(item, _), Value::Array(l), Value::Array(w)) => {
            if l.len() != w.len() {
                return Some(format!(" (length {} instead of {})", l.len(), w.len()));
            }
            l.iter().zip(w).enumerate().find_map(|(i, (l, w))| {
                difference(schema, item, l, w, true).map(|p| format!("[{i}]{p}"))
            })
        }
        (Shape::Untyped | Shape::Any, Value::Object(l), Value::Object(w)) => {
            added(l, w, whole).or_else(|| fields_difference(schema, node, l, w.iter(), whole))
        }
        (Shape::Untyped | Shape::Any, Value::Array(l), Value::Array(w)) => {
            untyped_list_difference(schema, l, w, whole)
        }
        (_, Value::String(l), Value::String(w)) => {
            let same_amount = matches!(
                (gantry_core::syntax::quantity_nanos(l), gantry_core::syntax::quantity_nanos(w)),
                (Some(a), Some(b)) if a == b
            );
            (l != w && !same_amount).then(String::new)
        }
        (_, Value::Number(l), Value::Number(w)) => (l.as_f64() != w.as_f64()).then(String::new),
        (_, l, w) => (l != w && !(l.is_null() && is_empty(w))).then(String::new),
    }
}

/// Inside a value applied whole: the first key live has that `want` does
/// not set.
fn added(live: &Map<String, Value>, want: &Map<String, Value>, whole: bool) -> Option<String> {
    if !whole {
        return None;
    }
    live.iter()
        .find(|(k, v)| !want.contains_key(*k) && !is_empty(v))
        .map(|(k, _)| format!(".{k} (added by another writer)"))
}

/// Lists without a schema (kept whole by kube-fake too): items with a
/// `name` matched by name, others item by item.
fn untyped_list_difference(
    schema: &Schema,
    live: &[Value],
    want: &[Value],
    whole: bool,
) -> Option<String> {
    let untyped = Node::Untyped;
    let named = !whole && want.iter().all(|w| w.get("name").is_some());
    if named {
        return want.iter().find_map(|w| {
            let name = w["name"].as_str().unwrap_or("");
            match live.iter().find(|l| l.get("name") == w.get("name")) {
                Some(l) => {
                    difference(schema, &untyped, l, w, false).map(|p| format!("[{name}]{p}"))
                }
                None => Some(format!("[{name}]")),
            }
        });
    }
    if live.len() != want.len() {
        return Some(format!(" (length {} instead of {})", live.len(), want.len()));
    }
    live.iter().zip(want).enumerate().find_map(|(i, (l, w))| {
        difference(schema, &untyped, l, w, whole).map(|p| format!("[{i}]{p}"))
    })
}

/// The first of the fields `want` that `live` does not have.
fn fields_difference<'a>(
    schema: &Schema,
    node: &Node,
    live: &Map<String, Value>,
    mut want: impl Iterator<Item = (&'a String, &'a Value)>,
    whole: bool,
) -> Option<String> {
    want.find_map(|(k, w)| {
        let child = schema.field(node, k).unwrap_or(&Node::Untyped);
        match live.get(k) {
            Some(l) => difference(schema, child, l, w, whole).map(|p| format!(".{k}{p}")),
            None if is_empty(w) => None,
            None => Some(format!(".{k}")),
        }
    })
}

/// A list-map item's key: its key fields (defaulted as the server
/// defaults them), as `8443/TCP`.
fn item_key(
    item: &Value,
    keys: &[String],
    defaults: Option<&std::collections::BTreeMap<String, Value>>,
) -> String {
    keys.iter()
        .map(|k| {
            let value = match item.get(k) {
                Some(v) if !v.is_null() => v.clone(),
                _ => defaults.and_then(|d| d.get(k)).cloned().unwrap_or(Value::Null),
            };
            match value {
                Value::String(s) => s,
                other => other.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "edge", "labels": {"a": "1"}},
            "spec": {"template": {"spec": {"containers": [{
                "name": "gateway", "image": "gw:1", "args": ["--a"],
                "ports": [{"name": "https", "containerPort": 8443, "protocol": "TCP"}],
                "env": [{"name": "A", "value": "1"}],
                "resources": {"limits": {"memory": "1024Mi"}},
            }]}}},
        })
    }

    /// What the server returns: defaults and other writers' additions where
    /// server-side apply keeps them (a label, a sidecar, an env var, a port),
    /// quantities in its spelling, no type.
    fn served() -> Value {
        json!({
            "metadata": {"name": "edge", "uid": "x", "labels": {"a": "1", "other": "2"}},
            "spec": {"replicas": 7, "template": {"spec": {"containers": [
                {"name": "injected-sidecar", "image": "mesh:1"},
                {"name": "gateway", "image": "gw:1", "args": ["--a"],
                 "terminationMessagePath": "/dev/termination-log",
                 "ports": [{"name": "metrics", "containerPort": 9090},
                           {"name": "https", "containerPort": 8443, "protocol": "TCP"}],
                 "env": [{"name": "B", "value": "theirs"}, {"name": "A", "value": "1"}],
                 "resources": {"limits": {"memory": "1Gi"}}},
            ]}}},
        })
    }

    #[test]
    fn what_server_side_apply_keeps_is_no_drift() {
        assert_eq!(drift(&served(), &deployment()), None);
    }

    #[test]
    fn a_changed_value_of_ours_or_an_addition_to_what_we_own_whole_is_drift() {
        let gateway = "/spec/template/spec/containers/1";
        for (path, value, expected) in [
            ("/image", json!("evil:1"), ".spec.template.spec.containers[gateway].image"),
            // args is atomic: an added argument is replaced by the next apply.
            (
                "/args",
                json!(["--a", "--debug"]),
                ".spec.template.spec.containers[gateway].args (length 2 instead of 1)",
            ),
            (
                "/ports/1/name",
                json!("renamed"),
                ".spec.template.spec.containers[gateway].ports[8443/TCP].name",
            ),
            ("/env/1/value", json!("2"), ".spec.template.spec.containers[gateway].env[A].value"),
            (
                "/resources/limits/memory",
                json!("2Gi"),
                ".spec.template.spec.containers[gateway].resources.limits.memory",
            ),
        ] {
            let mut changed = served();
            *changed.pointer_mut(&format!("{gateway}{path}")).unwrap() = value;
            assert_eq!(drift(&changed, &deployment()).as_deref(), Some(expected), "{path}");
        }
        let mut relabelled = served();
        relabelled["metadata"]["labels"]["a"] = json!("2");
        assert_eq!(drift(&relabelled, &deployment()).as_deref(), Some(".metadata.labels.a"));
        let mut gone = served();
        gone["spec"]["template"]["spec"]["containers"][1]["env"] = json!([{"name": "B"}]);
        assert_eq!(
            drift(&gone, &deployment()).as_deref(),
            Some(".spec.template.spec.containers[gateway].env[A]")
        );
    }

    #[test]
    fn an_atomic_map_is_compared_whole_and_a_keyed_list_by_its_keys() {
        let service = json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "edge"},
            "spec": {"selector": {"gantry.dev/gateway": "edge"},
                     "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]},
        });
        let live = json!({
            "metadata": {"name": "edge", "annotations": {"theirs": "kept"}},
            "spec": {"selector": {"gantry.dev/gateway": "edge"}, "clusterIP": "10.0.0.1",
                     "ports": [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"},
                               {"name": "debug", "port": 9999, "protocol": "TCP"}]},
        });
        assert_eq!(drift(&live, &service), None, "another writer's port and annotation stay");
        let mut selected = live.clone();
        selected["spec"]["selector"]["app"] = json!("elsewhere");
        assert_eq!(
            drift(&selected, &service).as_deref(),
            Some(".spec.selector.app (added by another writer)")
        );
        let mut retargeted = live.clone();
        retargeted["spec"]["ports"][0]["targetPort"] = json!(9999);
        assert_eq!(
            drift(&retargeted, &service).as_deref(),
            Some(".spec.ports[443/TCP].targetPort")
        );
    }

    #[test]
    fn the_type_of_a_cached_object_is_never_compared() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "edge-1"}, "data": {"mode": "safe"}});
        let live =
            json!({"metadata": {"name": "edge-1"}, "data": {"mode": "safe", "extra": "kept"}});
        assert_eq!(drift(&live, &config), None);
        let mut removed = live.clone();
        removed["data"].as_object_mut().unwrap().remove("mode");
        assert_eq!(drift(&removed, &config).as_deref(), Some(".data.mode"));
    }
}
