//! The Kubernetes schemas of the kinds gantry renders and kube-fake serves,
//! as server-side apply needs them: which fields exist, which lists are
//! atomic, sets or maps (and by which keys), which maps and structs are
//! atomic, and the defaults of list-map keys. kube-fake merges applies by
//! them; gateway-reconciler's drift judge compares by them.
//!
//! `schema.json` is [`compact`]ed from the real API server's OpenAPI v3
//! documents of the pinned Kubernetes release; the differential test in
//! `tests/tests/kube_fake_differential.rs` checks that it is current and
//! rewrites it with `GANTRY_UPDATE_KUBE_SCHEMA=1`.
//!
//! Compact form: `{"kinds": {"apps/v1/Deployment": NODE}, "types":
//! {"io.k8s.api.apps.v1.DeploymentSpec": {"fields": {NAME: NODE},
//! "atomic": bool, "defaults": {NAME: VALUE}}}}` where a NODE is `"s"`
//! (scalar), `"x"` (anything, kept whole), `{"ref": TYPE}`, `{"list":
//! NODE, "type": "atomic"|"set"|"map", "keys": [...]}` or `{"map": NODE,
//! "atomic": bool}`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

/// How a list merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Replaced as a whole.
    Atomic,
    /// Items are merged by value.
    Set,
    /// Items are merged by these key fields.
    Map(Vec<String>),
}

/// The type of one value.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A string, number, boolean, quantity, time, int-or-string.
    Scalar,
    /// Anything (embedded objects, preserved unknown fields): kept whole.
    Any,
    /// A named struct, in [`Schema::types`].
    Ref(String),
    /// A list.
    List { item: Box<Node>, list_type: ListType },
    /// A map of string keys.
    Map { value: Box<Node>, atomic: bool },
    /// No schema is known: maps merge by key, lists are atomic, every
    /// field is accepted.
    Untyped,
}

/// A struct: its fields, whether it is atomic, and field defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Struct {
    pub fields: BTreeMap<String, Node>,
    pub atomic: bool,
    pub defaults: BTreeMap<String, Value>,
}

/// The schemas of every served kind.
#[derive(Debug, Default)]
pub struct Schema {
    pub kinds: BTreeMap<String, Node>,
    pub types: BTreeMap<String, Struct>,
}

/// What a value of a [`Node`] looks like once named types are resolved.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    Scalar,
    Any,
    Struct(&'a Struct),
    List(&'a Node, &'a ListType),
    Map(&'a Node, bool),
    Untyped,
}

static UNTYPED: Node = Node::Untyped;

impl Schema {
    /// The schemas compiled in.
    pub fn get() -> &'static Schema {
        static SCHEMA: OnceLock<Schema> = OnceLock::new();
        SCHEMA.get_or_init(|| {
            let compact: Value =
                serde_json::from_str(include_str!("schema.json")).unwrap_or(Value::Null);
            Schema::from_compact(&compact)
        })
    }

    /// Reads the compact form.
    pub fn from_compact(compact: &Value) -> Schema {
        let kinds = entries(&compact["kinds"]).map(|(k, v)| (k.clone(), node_of(v))).collect();
        let types = entries(&compact["types"])
            .map(|(name, t)| {
                let fields = entries(&t["fields"]).map(|(k, v)| (k.clone(), node_of(v))).collect();
                let defaults =
                    entries(&t["defaults"]).map(|(k, v)| (k.clone(), v.clone())).collect();
                (name.clone(), Struct { fields, atomic: t["atomic"] == true, defaults })
            })
            .collect();
        Schema { kinds, types }
    }

    /// The root node of `apiVersion` + `kind`, or [`Node::Untyped`].
    pub fn kind(&self, api_version: &str, kind: &str) -> &Node {
        self.kinds.get(&format!("{api_version}/{kind}")).unwrap_or(&UNTYPED)
    }

    /// Resolves named types.
    pub fn shape<'a>(&'a self, node: &'a Node) -> Shape<'a> {
        match node {
            Node::Scalar => Shape::Scalar,
            Node::Any => Shape::Any,
            Node::Ref(name) => self.types.get(name).map_or(Shape::Untyped, Shape::Struct),
            Node::List { item, list_type } => Shape::List(item, list_type),
            Node::Map { value, atomic } => Shape::Map(value, *atomic),
            Node::Untyped => Shape::Untyped,
        }
    }

    /// The node of field `name` below `node` (`None`: not declared).
    pub fn field<'a>(&'a self, node: &'a Node, name: &str) -> Option<&'a Node> {
        match self.shape(node) {
            Shape::Struct(s) => s.fields.get(name),
            Shape::Map(value, _) => Some(value),
            Shape::Any | Shape::Untyped => Some(&UNTYPED),
            Shape::Scalar | Shape::List(..) => None,
        }
    }

    /// The first field of `value` its schema does not declare, as
    /// `.spec.foo` (what the real server names when it refuses an apply).
    pub fn undeclared(&self, node: &Node, value: &Value) -> Option<String> {
        self.undeclared_at(node, value, String::new())
    }

    fn undeclared_at(&self, node: &Node, value: &Value, path: String) -> Option<String> {
        match (self.shape(node), value) {
            (Shape::Struct(s), Value::Object(map)) => map.iter().find_map(|(k, v)| {
                let child = format!("{path}.{k}");
                match s.fields.get(k) {
                    None if !matches!(k.as_str(), "apiVersion" | "kind") => Some(child),
                    None => None,
                    Some(n) => self.undeclared_at(n, v, child),
                }
            }),
            (Shape::Map(n, _), Value::Object(map)) => {
                map.iter().find_map(|(k, v)| self.undeclared_at(n, v, format!("{path}.{k}")))
            }
            (Shape::List(n, _), Value::Array(items)) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| self.undeclared_at(n, v, format!("{path}[{i}]"))),
            _ => None,
        }
    }
}

/// The entries of a JSON object (none for anything else).
fn entries(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
    v.as_object().into_iter().flatten()
}

fn node_of(v: &Value) -> Node {
    match v {
        Value::String(s) if s == "s" => Node::Scalar,
        Value::String(s) if s == "x" => Node::Any,
        Value::Object(m) if m.contains_key("ref") => {
            Node::Ref(v["ref"].as_str().unwrap_or("").into())
        }
        Value::Object(m) if m.contains_key("list") => Node::List {
            item: Box::new(node_of(&v["list"])),
            list_type: match v["type"].as_str() {
                Some("set") => ListType::Set,
                Some("map") => ListType::Map(
                    v["keys"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect(),
                ),
                _ => ListType::Atomic,
            },
        },
        Value::Object(m) if m.contains_key("map") => {
            Node::Map { value: Box::new(node_of(&v["map"])), atomic: v["atomic"] == true }
        }
        _ => Node::Untyped,
    }
}

/// Compacts OpenAPI v3 documents (`/openapi/v3/api/v1`, `/apis/apps/v1`,
/// ...) into the form above, keeping the types reachable from `kinds`
/// (`(apiVersion, kind)` pairs).
pub fn compact(documents: &[Value], kinds: &[(String, String)]) -> Value {
    let mut definitions = Map::new();
    for document in documents {
        for (name, schema) in document["components"]["schemas"].as_object().into_iter().flatten() {
            definitions.insert(name.clone(), schema.clone());
        }
    }
    let mut out_kinds = Map::new();
    let mut types = Map::new();
    let mut pending: Vec<String> = Vec::new();
    for (api_version, kind) in kinds {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let found = definitions.iter().find(|(_, s)| {
            s["x-kubernetes-group-version-kind"].as_array().is_some_and(|gvks| {
                gvks.iter().any(|g| {
                    g["group"] == group && g["version"] == version && g["kind"] == kind.as_str()
                })
            })
        });
        if let Some((name, _)) = found {
            out_kinds.insert(format!("{api_version}/{kind}"), json!({"ref": name}));
            pending.push(name.clone());
        }
    }
    while let Some(name) = pending.pop() {
        if types.contains_key(&name) {
            continue;
        }
        let Some(schema) = definitions.get(&name) else { continue };
        let mut fields = Map::new();
        let mut defaults = Map::new();
        for (field, property) in schema["properties"].as_object().into_iter().flatten() {
            fields.insert(field.clone(), compact_node(property, &definitions, &mut pending));
            if let Some(default) = property.get("default").filter(|d| !d.is_object()) {
                defaults.insert(field.clone(), default.clone());
            }
        }
        let mut t = json!({"fields": fields});
        if schema["x-kubernetes-map-type"] == "atomic" {
            t["atomic"] = json!(true);
        }
        if !defaults.is_empty() {
            t["defaults"] = Value::Object(defaults);
        }
        types.insert(name, t);
    }
    json!({"kinds": out_kinds, "types": types})
}

fn reference(schema: &Value) -> Option<&str> {
    schema["$ref"]
        .as_str()
        .or_else(|| schema["allOf"].as_array()?.first()?["$ref"].as_str())
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
}

fn compact_node(
    schema: &Value,
    definitions: &Map<String, Value>,
    pending: &mut Vec<String>,
) -> Value {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return json!("x");
    }
    if let Some(name) = reference(schema) {
        let Some(target) = definitions.get(name) else { return json!("x") };
        if target.get("properties").is_some() {
            pending.push(name.to_string());
            return json!({"ref": name});
        }
        if target["x-kubernetes-preserve-unknown-fields"] == true
            || (target["type"] == "object" && target.get("additionalProperties").is_none())
        {
            return json!("x");
        }
        return compact_node(target, definitions, pending);
    }
    match schema["type"].as_str() {
        Some("array") => {
            let item = compact_node(&schema["items"], definitions, pending);
            let list_type = schema["x-kubernetes-list-type"].as_str().unwrap_or("atomic");
            let mut out = json!({"list": item, "type": list_type});
            if list_type == "map" {
                out["keys"] = schema["x-kubernetes-list-map-keys"].clone();
            }
            out
        }
        Some("object") => match schema.get("additionalProperties") {
            Some(value) => {
                let mut out = json!({"map": compact_node(value, definitions, pending)});
                if schema["x-kubernetes-map-type"] == "atomic" {
                    out["atomic"] = json!(true);
                }
                out
            }
            None => json!("x"),
        },
        _ => json!("s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_schemas_know_what_apply_relies_on() {
        let schema = Schema::get();
        let deployment = schema.kind("apps/v1", "Deployment");
        let spec = schema.field(deployment, "spec").unwrap();
        let selector = schema.field(spec, "selector").unwrap();
        assert!(
            matches!(schema.shape(selector), Shape::Struct(s) if s.atomic),
            "selectors are atomic"
        );
        let template = schema.field(spec, "template").unwrap();
        let pod = schema.field(template, "spec").unwrap();
        let containers = schema.field(pod, "containers").unwrap();
        assert!(
            matches!(schema.shape(containers), Shape::List(_, ListType::Map(keys)) if keys == &["name"]),
            "containers merge by name"
        );
        let Shape::List(container, _) = schema.shape(containers) else { unreachable!() };
        let ports = schema.field(container, "ports").unwrap();
        let Shape::List(port, ListType::Map(keys)) = schema.shape(ports) else { panic!("ports") };
        assert_eq!(keys, &["containerPort", "protocol"]);
        assert!(matches!(schema.shape(port), Shape::Struct(s) if s.defaults["protocol"] == "TCP"));
        let meta = schema.field(deployment, "metadata").unwrap();
        let owners = schema.field(meta, "ownerReferences").unwrap();
        assert!(
            matches!(schema.shape(owners), Shape::List(_, ListType::Map(keys)) if keys == &["uid"])
        );
        assert_eq!(
            schema.undeclared(deployment, &json!({"spec": {"replicas": 1, "replcas": 2}})),
            Some(".spec.replcas".to_string())
        );
        assert_eq!(
            schema.undeclared(deployment, &json!({"metadata": {"labels": {"a": "b"}}})),
            None
        );
    }
}
