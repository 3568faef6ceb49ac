//! How `apply` merges, as kubectl's client-side apply does: three ways,
//! between the manifest last applied (kept in an annotation), the gateway
//! as it is live, and the file. Pure functions over JSON documents.

use serde_json::{Map, Value};

/// What applying `new` over `live` makes: every key of `new` set, every
/// key `last` had and `new` dropped removed, every other key of `live`
/// (set by someone else) kept. Objects merge key by key; lists and
/// scalars are replaced whole (as JSON merge patch, RFC 7386). Without a
/// `last` nothing is removed.
pub fn three_way(last: Option<&Value>, live: &Value, new: &Value) -> Value {
    let (Value::Object(new), Value::Object(live)) = (new, live) else {
        return new.clone();
    };
    let last = last.and_then(Value::as_object);
    let mut merged: Map<String, Value> = live.clone();
    if let Some(last) = last {
        for key in last.keys().filter(|k| !new.contains_key(*k)) {
            merged.remove(key);
        }
    }
    for (key, value) in new {
        let before = last.and_then(|l| l.get(key));
        let merged_value = match live.get(key) {
            Some(live_value) => three_way(before, live_value, value),
            None => value.clone(),
        };
        merged.insert(key.clone(), merged_value);
    }
    Value::Object(merged)
}

/// The parts of a manifest `apply` owns and records: labels, annotations
/// and spec (never status, versions or times), without the record itself.
pub fn applied_parts(doc: &Value, record_key: &str) -> Value {
    let metadata = &doc["metadata"];
    let mut meta = Map::new();
    meta.insert("name".into(), metadata["name"].clone());
    for key in ["labels", "annotations"] {
        if let Some(Value::Object(map)) = metadata.get(key) {
            let mut map = map.clone();
            map.remove(record_key);
            if !map.is_empty() {
                meta.insert(key.into(), Value::Object(map));
            }
        }
    }
    let mut parts = Map::new();
    parts.insert("metadata".into(), Value::Object(meta));
    if let Some(spec) = doc.get("spec") {
        parts.insert("spec".into(), spec.clone());
    }
    Value::Object(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_the_file_dropped_go_and_keys_others_set_stay() {
        let last = json!({"metadata": {"labels": {"team": "a", "tier": "1"}},
            "spec": {"image": "x:1", "replicas": 3, "config": {"a": "1", "b": "2"}}});
        let live = json!({"metadata": {"labels": {"team": "a", "tier": "1", "owner": "bob"}},
            "spec": {"image": "x:1", "replicas": 3, "config": {"a": "1", "b": "2", "c": "3"},
                "serverDnsNames": ["a.example"]}});
        let new = json!({"metadata": {"labels": {"team": "b"}},
            "spec": {"image": "x:2", "config": {"a": "1"}}});
        let merged = three_way(Some(&last), &live, &new);
        assert_eq!(
            merged,
            json!({"metadata": {"labels": {"team": "b", "owner": "bob"}},
                "spec": {"image": "x:2", "config": {"a": "1", "c": "3"},
                    "serverDnsNames": ["a.example"]}})
        );
    }

    #[test]
    fn without_a_record_nothing_is_removed_and_lists_are_replaced_whole() {
        let live = json!({"spec": {"serverDnsNames": ["a", "b"], "replicas": 2}});
        let new = json!({"spec": {"serverDnsNames": ["c"]}});
        assert_eq!(
            three_way(None, &live, &new),
            json!({"spec": {"serverDnsNames": ["c"], "replicas": 2}})
        );
    }

    #[test]
    fn the_record_keeps_only_what_apply_owns() {
        let doc = json!({"apiVersion": "gantry.dev/v1", "kind": "Gateway",
            "metadata": {"name": "edge", "resourceVersion": 7, "uid": "u",
                "annotations": {"rec": "old", "a": "1"}, "labels": {}},
            "spec": {"image": "x"}, "status": {"phase": "RUNNING"}});
        assert_eq!(
            applied_parts(&doc, "rec"),
            json!({"metadata": {"name": "edge", "annotations": {"a": "1"}}, "spec": {"image": "x"}})
        );
    }
}
