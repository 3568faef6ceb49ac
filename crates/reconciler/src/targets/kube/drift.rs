//! The drift judge: whether a live object still has every value gantry
//! rendered for it. Fields others added are never fought.

use serde_json::{Map, Value};

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
pub(super) fn drift(live: &Value, manifest: &Value) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
