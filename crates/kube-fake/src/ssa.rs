//! Field management and server-side apply, after Kubernetes'
//! structured-merge-diff: every field of an object is owned by the
//! managers that set it; an apply owns exactly the fields of its applied
//! configuration, conflicts with other owners that hold a different value
//! (unless forced), and removes fields it stops applying that nobody else
//! owns. How lists, maps and structs merge (by key, by value, or whole)
//! comes from the Kubernetes schemas in [`crate::schema`].

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::schema::{ListType, Node, Schema, Shape, Struct};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// A map key: `f:name`.
    Field(String),
    /// A list-map item by its key fields: `k:{"name":"gw"}` (canonical JSON).
    Key(String),
    /// A set-list item by value: `v:"x"`.
    Value(String),
}

/// A path from the object root.
pub type Path = Vec<PathElement>;
/// The fields a manager owns.
pub type FieldSet = BTreeSet<Path>;

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything but `status` (for types with a status subresource).
    Main,
    /// Only `status`.
    Status,
    /// Everything (types without a status subresource).
    Whole,
}

/// A manager's claim on an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Manager {
    pub name: String,
    /// `Apply` or `Update`.
    pub operation: &'static str,
    pub subresource: Option<&'static str>,
    pub time: String,
    pub fields: FieldSet,
}

/// Two managers disagree on a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    /// `.spec.replicas` style.
    pub field: String,
}

fn schema() -> &'static Schema {
    Schema::get()
}

/// The keys and key defaults of a list-map whose items are `item`.
fn map_keys(list: &Node) -> Option<(&[String], Option<&Struct>)> {
    match schema().shape(list) {
        Shape::List(item, ListType::Map(keys)) => {
            let item_struct = match schema().shape(item) {
                Shape::Struct(s) => Some(s),
                _ => None,
            };
            Some((keys.as_slice(), item_struct))
        }
        _ => None,
    }
}

fn item_key(item: &Value, keys: &[String], item_struct: Option<&Struct>) -> String {
    let mut parts: Vec<(String, Value)> = keys
        .iter()
        .filter_map(|k| {
            let v = item
                .get(k)
                .cloned()
                .or_else(|| item_struct.and_then(|s| s.defaults.get(k)).cloned())?;
            Some((k.clone(), v))
        })
        .collect();
    parts.sort_by(|a, b| a.0.cmp(&b.0));
    let body: Vec<String> =
        parts.iter().map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v)).collect();
    format!("{{{}}}", body.join(","))
}

fn scoped(object: &Value, scope: Scope) -> Vec<(&String, &Value)> {
    let Some(map) = object.as_object() else { return Vec::new() };
    map.iter()
        .filter(|(k, _)| match k.as_str() {
            "apiVersion" | "kind" => false,
            "status" => scope != Scope::Main,
            _ => scope != Scope::Status,
        })
        .collect()
}

/// The node of `field` below `node`, or untyped when undeclared.
fn child<'a>(node: &'a Node, field: &str) -> &'a Node {
    static UNTYPED: Node = Node::Untyped;
    schema().field(node, field).unwrap_or(&UNTYPED)
}

/// The fields of an object (or applied configuration) of type `root`
/// within `scope`.
pub fn field_set(root: &Node, object: &Value, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    for (key, value) in scoped(object, scope) {
        let path = vec![PathElement::Field(key.clone())];
        let node = child(root, key);
        if key == "metadata" {
            for (mk, mv) in value.as_object().into_iter().flatten() {
                if matches!(
                    mk.as_str(),
                    "labels" | "annotations" | "ownerReferences" | "finalizers"
                ) {
                    let mut p = path.clone();
                    p.push(PathElement::Field(mk.clone()));
                    walk(child(node, mk), mv, p, &mut out);
                }
            }
        } else {
            walk(node, value, path, &mut out);
        }
    }
    out
}

/// Whether a value of `node` is owned as a whole (atomic struct, map or
/// list, or anything without a structure).
fn is_atomic(node: &Node, value: &Value) -> bool {
    match (schema().shape(node), value) {
        (Shape::Struct(s), Value::Object(map)) => s.atomic || map.is_empty(),
        (Shape::Map(_, atomic), Value::Object(map)) => atomic || map.is_empty(),
        (Shape::Untyped, Value::Object(map)) => map.is_empty(),
        (Shape::List(_, ListType::Map(_) | ListType::Set), Value::Array(_)) => false,
        _ => true,
    }
}

fn walk(node: &Node, value: &Value, path: Path, out: &mut FieldSet) {
    if is_atomic(node, value) {
        out.insert(path);
        return;
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let mut p = path.clone();
                p.push(PathElement::Field(k.clone()));
                walk(child(node, k), v, p, out);
            }
        }
        Value::Array(items) => match schema().shape(node) {
            Shape::List(item_node, ListType::Map(keys)) => {
                let item_struct = match schema().shape(item_node) {
                    Shape::Struct(s) => Some(s),
                    _ => None,
                };
                for item in items {
                    let mut p = path.clone();
                    p.push(PathElement::Key(item_key(item, keys, item_struct)));
                    out.insert(p.clone());
                    if is_atomic(item_node, item) {
                        continue;
                    }
                    for (k, v) in item.as_object().into_iter().flatten() {
                        let mut c = p.clone();
                        c.push(PathElement::Field(k.clone()));
                        walk(child(item_node, k), v, c, out);
                    }
                }
            }
            _ => {
                for item in items {
                    let mut p = path.clone();
                    p.push(PathElement::Value(item.to_string()));
                    out.insert(p);
                }
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

fn find_item(items: &[Value], list: &Node, key: &str) -> Option<usize> {
    let (keys, item_struct) = map_keys(list)?;
    items.iter().position(|item| item_key(item, keys, item_struct) == key)
}

/// The node of list items.
fn item_node(list: &Node) -> &Node {
    static UNTYPED: Node = Node::Untyped;
    match schema().shape(list) {
        Shape::List(item, _) => item,
        _ => &UNTYPED,
    }
}

/// The value at `path` of an object of type `root`, if present.
pub fn value_at<'a>(root: &Node, object: &'a Value, path: &[PathElement]) -> Option<&'a Value> {
    let mut current = object;
    let mut node = root;
    for element in path {
        match element {
            PathElement::Field(name) => {
                current = current.get(name)?;
                node = child(node, name);
            }
            PathElement::Key(key) => {
                let items = current.as_array()?;
                current = &items[find_item(items, node, key)?];
                node = item_node(node);
            }
            PathElement::Value(v) => {
                let items = current.as_array()?;
                current = items.iter().find(|item| item.to_string() == *v)?;
                node = item_node(node);
            }
        }
    }
    Some(current)
}

/// Removes the field at `path` of an object of type `root`, if present.
pub fn remove_path(root: &Node, object: &mut Value, path: &[PathElement]) {
    let Some((last, parent_path)) = path.split_last() else { return };
    let mut node = root;
    let mut current = object;
    for element in parent_path {
        let next = match element {
            PathElement::Field(name) => {
                node = child(node, name);
                current.get_mut(name)
            }
            PathElement::Key(key) => {
                let Some(index) = current.as_array().and_then(|items| find_item(items, node, key))
                else {
                    return;
                };
                node = item_node(node);
                current.get_mut(index)
            }
            PathElement::Value(_) => return,
        };
        let Some(next) = next else { return };
        current = next;
    }
    match last {
        PathElement::Field(name) => {
            if let Some(map) = current.as_object_mut() {
                map.remove(name);
            }
        }
        PathElement::Key(key) => {
            let index = current.as_array().and_then(|items| find_item(items, node, key));
            if let (Some(index), Some(items)) = (index, current.as_array_mut()) {
                items.remove(index);
            }
        }
        PathElement::Value(v) => {
            if let Some(items) = current.as_array_mut() {
                items.retain(|item| serde_json::from_str::<Value>(v).ok().as_ref() != Some(item));
            }
        }
    }
}

/// Merges an applied configuration of type `node` into `live`: granular
/// maps and structs recursively, list maps by key, sets by value,
/// everything atomic replaced.
pub fn merge(node: &Node, live: &mut Value, applied: &Value) {
    if is_atomic(node, applied) && !applied.as_object().is_some_and(Map::is_empty) {
        *live = applied.clone();
        return;
    }
    match (live, applied) {
        (Value::Object(live_map), Value::Object(applied_map)) => {
            for (k, v) in applied_map {
                match live_map.get_mut(k) {
                    Some(existing) => merge(child(node, k), existing, v),
                    None => {
                        live_map.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(live_items), Value::Array(applied_items)) => match map_keys(node) {
            Some((keys, item_struct)) => {
                let item = item_node(node);
                for applied_item in applied_items {
                    let key = item_key(applied_item, keys, item_struct);
                    match live_items.iter_mut().find(|l| item_key(l, keys, item_struct) == key) {
                        Some(existing) => merge(item, existing, applied_item),
                        None => live_items.push(applied_item.clone()),
                    }
                }
            }
            None => {
                for applied_item in applied_items {
                    if !live_items.contains(applied_item) {
                        live_items.push(applied_item.clone());
                    }
                }
            }
        },
        (live, applied) => *live = applied.clone(),
    }
}

/// `.spec.template.spec.containers[name="gw"].image` style, for messages.
pub fn display(path: &[PathElement]) -> String {
    let mut out = String::new();
    for element in path {
        match element {
            PathElement::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            PathElement::Key(k) => {
                let inner: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = inner.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("[{}]", parts.join(",")));
            }
            PathElement::Value(v) => out.push_str(&format!("[={v}]")),
        }
    }
    out
}

/// `metadata.managedFields[].fieldsV1` of a field set.
pub fn to_fields_v1(fields: &FieldSet) -> Value {
    let mut root = Value::Object(Map::new());
    for path in fields {
        let mut node = &mut root;
        for element in path {
            let key = match element {
                PathElement::Field(f) => format!("f:{f}"),
                PathElement::Key(k) => format!("k:{k}"),
                PathElement::Value(v) => format!("v:{v}"),
            };
            node = node
                .as_object_mut()
                .map(|m| m.entry(key).or_insert_with(|| Value::Object(Map::new())))
                .unwrap_or_else(|| unreachable!());
        }
        if let Some(map) = node.as_object_mut() {
            if path.iter().last().is_some_and(|e| matches!(e, PathElement::Key(_))) {
                map.entry(".").or_insert_with(|| Value::Object(Map::new()));
            }
        }
    }
    root
}

/// The field set of `metadata.managedFields[].fieldsV1`: the inverse of
/// [`to_fields_v1`] (a path is owned where its node is empty or marked
/// `.`).
pub fn from_fields_v1(fields: &Value) -> FieldSet {
    fn walk(node: &Value, path: &mut Path, out: &mut FieldSet) {
        let Some(map) = node.as_object() else { return };
        if !path.is_empty() && (map.is_empty() || map.contains_key(".")) {
            out.insert(path.clone());
        }
        for (key, child) in map {
            let element = match key.split_at_checked(2) {
                Some(("f:", f)) => PathElement::Field(f.to_string()),
                Some(("k:", k)) => PathElement::Key(k.to_string()),
                Some(("v:", v)) => PathElement::Value(v.to_string()),
                _ => continue,
            };
            path.push(element);
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

impl Manager {
    /// A manager from its `metadata.managedFields` entry.
    pub fn from_entry(entry: &Value) -> Manager {
        let text = |field: &str| entry[field].as_str().unwrap_or("");
        Manager {
            name: text("manager").to_string(),
            operation: if text("operation") == "Apply" { "Apply" } else { "Update" },
            subresource: match text("subresource") {
                "status" => Some("status"),
                "scale" => Some("scale"),
                _ => None,
            },
            time: text("time").to_string(),
            fields: from_fields_v1(&entry["fieldsV1"]),
        }
    }
}

/// Whether another manager owns `path` or anything below it.
fn owned_by_others(managers: &[Manager], me: &str, path: &Path) -> bool {
    managers
        .iter()
        .filter(|m| !(m.name == me && m.operation == "Apply"))
        .any(|m| m.fields.range(path.clone()..).next().is_some_and(|p| p.starts_with(path)))
}

/// Who writes, to which part of the object, and when.
#[derive(Debug, Clone, Copy)]
pub struct Writer<'a> {
    /// The type of the object written.
    pub root: &'a Node,
    pub manager: &'a str,
    pub subresource: Option<&'static str>,
    pub scope: Scope,
    pub now: &'a str,
}

/// Applies `applied` as `writer` onto `live` (`None` creates), updating
/// `managers`. On conflicts without `force`, nothing changes.
pub fn apply(
    live: Option<&Value>,
    managers: &mut Vec<Manager>,
    writer: Writer<'_>,
    applied: &Value,
    force: bool,
) -> Result<Value, Vec<Conflict>> {
    let Writer { root, manager, subresource, scope, now } = writer;
    let new_set = field_set(root, applied, scope);
    let base = live.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    let mut conflicts = Vec::new();
    for other in managers.iter().filter(|m| !(m.name == manager && m.operation == "Apply")) {
        for path in other.fields.intersection(&new_set) {
            if value_at(root, &base, path) != value_at(root, applied, path) {
                conflicts.push((other.name.clone(), path.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts
            .into_iter()
            .map(|(manager, p)| Conflict { manager, field: display(&p) })
            .collect());
    }
    for (name, path) in &conflicts {
        for m in managers
            .iter_mut()
            .filter(|m| &m.name == name && !(m.name == manager && m.operation == "Apply"))
        {
            m.fields.remove(path);
        }
    }
    let old_set = managers
        .iter()
        .find(|m| m.name == manager && m.operation == "Apply" && m.subresource == subresource)
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    let mut result = base;
    // Shallowest first: removing a list item or map removes what is below.
    let mut dropped: Vec<&Path> = old_set.difference(&new_set).collect();
    dropped.sort_by_key(|p| p.len());
    for path in dropped {
        if !owned_by_others(managers, manager, path) {
            remove_path(root, &mut result, path);
        }
    }
    merge(root, &mut result, applied);
    match managers
        .iter_mut()
        .find(|m| m.name == manager && m.operation == "Apply" && m.subresource == subresource)
    {
        Some(m) => {
            if m.fields != new_set {
                m.time = now.to_string();
            }
            m.fields = new_set;
        }
        None => managers.push(Manager {
            name: manager.to_string(),
            operation: "Apply",
            subresource,
            time: now.to_string(),
            fields: new_set,
        }),
    }
    managers.retain(|m| !m.fields.is_empty());
    Ok(result)
}

/// Records a non-apply write (create, update, patch) by `manager`: it now
/// owns the fields it changed; fields it removed are owned by nobody.
pub fn record_update(
    old: Option<&Value>,
    new: &Value,
    managers: &mut Vec<Manager>,
    writer: Writer<'_>,
) {
    let Writer { root, manager, subresource, scope, now } = writer;
    let new_fields = field_set(root, new, scope);
    let old_fields = old.map(|o| field_set(root, o, scope)).unwrap_or_default();
    let empty = Value::Object(Map::new());
    let old_value = old.unwrap_or(&empty);
    let changed: FieldSet = new_fields
        .iter()
        .filter(|p| value_at(root, old_value, p) != value_at(root, new, p))
        .cloned()
        .collect();
    let removed: FieldSet = old_fields.difference(&new_fields).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    for m in managers.iter_mut() {
        m.fields.retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    if !changed.is_empty() {
        match managers
            .iter_mut()
            .find(|m| m.name == manager && m.operation == "Update" && m.subresource == subresource)
        {
            Some(m) => {
                m.fields.extend(changed);
                m.time = now.to_string();
            }
            None => managers.push(Manager {
                name: manager.to_string(),
                operation: "Update",
                subresource,
                time: now.to_string(),
                fields: changed,
            }),
        }
    }
    managers.retain(|m| !m.fields.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn w(manager: &str) -> Writer<'_> {
        let root = Schema::get().kind("apps/v1", "Deployment");
        Writer { root, manager, subresource: None, scope: Scope::Main, now: "t" }
    }

    fn deployment(image: &str, replicas: Option<i64>) -> Value {
        let mut d = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "gw", "labels": {"app": "gw"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "gw", "image": image, "ports": [{"containerPort": 8080}]},
                {"name": "sup", "image": "sup:1"}
            ]}}}
        });
        if let Some(r) = replicas {
            d["spec"]["replicas"] = json!(r);
        }
        d
    }

    #[test]
    fn field_sets_use_list_keys() {
        let root = Schema::get().kind("apps/v1", "Deployment");
        let set = field_set(root, &deployment("gw:1", Some(2)), Scope::Main);
        let rendered = to_fields_v1(&set);
        let containers = &rendered["f:spec"]["f:template"]["f:spec"]["f:containers"];
        assert!(containers["k:{\"name\":\"gw\"}"]["f:image"].is_object());
        assert!(containers["k:{\"name\":\"gw\"}"]["."].is_object());
        let port = &containers["k:{\"name\":\"gw\"}"]["f:ports"]
            ["k:{\"containerPort\":8080,\"protocol\":\"TCP\"}"];
        assert!(port["f:containerPort"].is_object());
        assert!(rendered["f:metadata"]["f:labels"]["f:app"].is_object());
        assert!(rendered["f:metadata"].get("f:name").is_none());
    }

    #[test]
    fn managed_fields_read_back_are_the_field_sets_written() {
        // Stored objects keep their managers only as `managedFields`; every
        // write reads them back. The reconciler's rendering of a full
        // gateway has keyed lists, set lists, atomic maps and nesting.
        let golden = include_str!("../../reconciler/tests/golden/full.yaml");
        let mut objects: Vec<Value> =
            golden.split("\n---").map(|doc| serde_saphyr::from_str(doc).unwrap()).collect();
        objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "finalizers": ["a/b", "c"], "labels": {}}}));
        for object in &objects {
            let api_version = object["apiVersion"].as_str().unwrap();
            let root = Schema::get().kind(api_version, object["kind"].as_str().unwrap());
            let set = field_set(root, object, Scope::Whole);
            assert!(set.len() >= 3, "{object}");
            assert_eq!(from_fields_v1(&to_fields_v1(&set)), set, "{object}");
        }
        let manager = Manager {
            name: "kube-controller-manager".into(),
            operation: "Update",
            subresource: Some("status"),
            time: "2026-12-04T00:00:00Z".into(),
            fields: field_set(
                Schema::get().kind("v1", "ConfigMap"),
                objects.last().unwrap(),
                Scope::Whole,
            ),
        };
        let entry = json!({"manager": manager.name, "operation": manager.operation,
            "subresource": "status", "time": manager.time, "fieldsV1": to_fields_v1(&manager.fields)});
        assert_eq!(Manager::from_entry(&entry), manager);
        // An applier of the main resource (no subresource field).
        let applier =
            Manager { name: "gantry".into(), operation: "Apply", subresource: None, ..manager };
        let entry = json!({"manager": "gantry", "operation": "Apply", "time": applier.time,
            "fieldsV1": to_fields_v1(&applier.fields)});
        assert_eq!(Manager::from_entry(&entry), applier);
    }

    #[test]
    fn apply_conflicts_force_and_removal() {
        let mut managers = Vec::new();
        let live = apply(None, &mut managers, w("a"), &deployment("gw:1", Some(2)), false).unwrap();
        // Same values: shared ownership, no conflict.
        let live =
            apply(Some(&live), &mut managers, w("b"), &deployment("gw:1", Some(2)), false).unwrap();
        // b changes replicas: conflicts with a.
        let conflicts =
            apply(Some(&live), &mut managers, w("b"), &deployment("gw:1", Some(3)), false)
                .unwrap_err();
        assert_eq!(conflicts, [Conflict { manager: "a".into(), field: ".spec.replicas".into() }]);
        let live =
            apply(Some(&live), &mut managers, w("b"), &deployment("gw:1", Some(3)), true).unwrap();
        assert_eq!(live["spec"]["replicas"], 3);
        // a stops applying replicas: b still owns it, so it stays.
        let live =
            apply(Some(&live), &mut managers, w("a"), &deployment("gw:1", None), false).unwrap();
        assert_eq!(live["spec"]["replicas"], 3);
        // b stops too: nobody owns it, so it goes.
        let live =
            apply(Some(&live), &mut managers, w("b"), &deployment("gw:1", None), false).unwrap();
        assert!(live["spec"].get("replicas").is_none());
    }

    #[test]
    fn dropping_a_list_item_removes_it() {
        let mut managers = Vec::new();
        let live = apply(None, &mut managers, w("a"), &deployment("gw:1", None), false).unwrap();
        let mut one = deployment("gw:2", None);
        one["spec"]["template"]["spec"]["containers"].as_array_mut().unwrap().pop();
        let live = apply(Some(&live), &mut managers, w("a"), &one, false).unwrap();
        let containers = live["spec"]["template"]["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0]["image"], "gw:2");
    }

    #[test]
    fn updates_take_ownership() {
        let mut managers = Vec::new();
        let live = apply(None, &mut managers, w("a"), &deployment("gw:1", Some(2)), false).unwrap();
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(Some(&live), &scaled, &mut managers, w("kubectl-scale"));
        let scaler = managers.iter().find(|m| m.name == "kubectl-scale").unwrap();
        assert_eq!(scaler.fields.len(), 1);
        let conflicts =
            apply(Some(&scaled), &mut managers, w("a"), &deployment("gw:1", Some(2)), false)
                .unwrap_err();
        assert_eq!(conflicts[0].manager, "kubectl-scale");
    }
}
