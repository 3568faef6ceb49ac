//! An owned object as the watches decode it: its metadata, and the rest
//! of its fields as the text the server sent. `DynamicObject` decodes
//! every field into a `Value` (through serde's intermediate form, as its
//! fields are `#[serde(flatten)]`), and the cache turned that `Value` back
//! into text; at a cold start over 20,000 gateways the decoding, the
//! re-serializing and dropping the values took over a third of the
//! reconciler's CPU (docs/benchmarks.md). Here each field other than the
//! metadata is only scanned, and the metadata is decoded without its
//! `managedFields` (the largest part of it, which nothing reads).

use std::borrow::Cow;
use std::fmt;

#[cfg(test)]
use kube::api::DynamicObject;
use kube::api::{ApiResource, ObjectMeta};
use kube::core::DynamicResourceScope;
use serde::de::{Error as _, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// An object of an owned kind: `metadata` (without `managedFields`), and
/// its other fields but `apiVersion` and `kind`, each as the JSON text the
/// server sent, in the order it sent them.
#[derive(Debug, Clone)]
pub(super) struct OwnedObject {
    pub(super) metadata: ObjectMeta,
    pub(super) fields: Vec<(Box<str>, Box<RawValue>)>,
}

impl OwnedObject {
    /// The text of the field `name`, if the object has it.
    pub(super) fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| &**n == name).map(|(_, raw)| raw.get())
    }

    /// The fields as one JSON map (what `DynamicObject`'s `data` holds).
    #[cfg(test)]
    pub(super) fn data(&self) -> Value {
        let fields = self.fields.iter().map(|(name, raw)| {
            (name.to_string(), serde_json::from_str(raw.get()).expect("the server's JSON"))
        });
        Value::Object(fields.collect())
    }
}

/// Test oracle: equal metadata and the same field texts.
#[cfg(test)]
impl PartialEq for OwnedObject {
    fn eq(&self, other: &Self) -> bool {
        let fields = |o: &OwnedObject| {
            o.fields.iter().map(|(n, raw)| (n.clone(), raw.get().to_string())).collect::<Vec<_>>()
        };
        self.metadata == other.metadata && fields(self) == fields(other)
    }
}

impl<'de> Deserialize<'de> for OwnedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ObjectVisitor)
    }
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = OwnedObject;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OwnedObject, A::Error> {
        let mut metadata = None;
        let mut fields = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            match &*name {
                "metadata" => metadata = Some(map.next_value::<Metadata>()?.0),
                "apiVersion" | "kind" => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => fields.push((name.into_boxed_str(), map.next_value::<Box<RawValue>>()?)),
            }
        }
        Ok(OwnedObject { metadata: metadata.unwrap_or_default(), fields })
    }
}

/// `ObjectMeta` decoded without `managedFields`.
struct Metadata(ObjectMeta);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MetadataVisitor;
        impl<'de> Visitor<'de> for MetadataVisitor {
            type Value = Map<String, Value>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object's metadata")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = Map::new();
                while let Some(name) = map.next_key::<String>()? {
                    if name == "managedFields" {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        kept.insert(name, map.next_value()?);
                    }
                }
                Ok(kept)
            }
        }
        let kept = deserializer.deserialize_map(MetadataVisitor)?;
        ObjectMeta::deserialize(Value::Object(kept)).map(Metadata).map_err(D::Error::custom)
    }
}

/// Test oracle: what `DynamicObject` decodes, as this type holds it.
#[cfg(test)]
impl From<DynamicObject> for OwnedObject {
    fn from(o: DynamicObject) -> Self {
        let fields = match o.data {
            Value::Object(fields) => fields
                .into_iter()
                .filter(|(name, _)| !matches!(name.as_str(), "apiVersion" | "kind"))
                .filter_map(|(name, value)| {
                    Some((name.into_boxed_str(), serde_json::value::to_raw_value(&value).ok()?))
                })
                .collect(),
            _ => Vec::new(),
        };
        let metadata = ObjectMeta { managed_fields: None, ..o.metadata };
        OwnedObject { metadata, fields }
    }
}

impl kube::Resource for OwnedObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The object holds what `DynamicObject` holds but `managedFields`, for
    /// the objects the API server sends (a list's items, a watch's events).
    #[test]
    fn an_object_decodes_to_what_a_dynamic_object_holds() {
        let text = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": "edge", "namespace": "default", "uid": "u", "resourceVersion": "42",
                "labels": {"gantry.dev/gateway": "edge"},
                "managedFields": [{"manager": "gantry-reconciler", "operation": "Apply"}],
            },
            "spec": {"replicas": 2, "template": {"metadata": {"annotations": {"a": "b"}}}},
            "status": {"observedGeneration": 1},
        })
        .to_string();
        let owned: OwnedObject = serde_json::from_str(&text).unwrap();
        let dynamic: DynamicObject = serde_json::from_str(&text).unwrap();
        assert_eq!(owned, OwnedObject::from(dynamic));
        assert_eq!(owned.metadata.resource_version.as_deref(), Some("42"));
        let data = owned.data();
        assert!(data.get("kind").is_none() && data.get("metadata").is_none());
        assert_eq!(owned.metadata.managed_fields, None, "nothing reads them");
        // Each field is the text the server sent, not decoded.
        assert_eq!(
            owned.field("spec"),
            Some(r#"{"replicas":2,"template":{"metadata":{"annotations":{"a":"b"}}}}"#)
        );

        // A list, as the watcher's list call decodes it.
        let list =
            format!(r#"{{"apiVersion":"v1","kind":"List","metadata":{{}},"items":[{text}]}}"#);
        let items: kube::core::ObjectList<OwnedObject> = serde_json::from_str(&list).unwrap();
        assert_eq!(items.items, vec![owned]);
    }

    #[test]
    fn metadata_of_the_wrong_shape_is_an_error_not_an_empty_object() {
        let wrong = json!({"kind": "ConfigMap", "metadata": {"labels": ["not", "a", "map"]}});
        assert!(serde_json::from_value::<OwnedObject>(wrong).is_err());
        let none: OwnedObject = serde_json::from_value(json!({"kind": "ConfigMap"})).unwrap();
        assert_eq!(none.metadata, ObjectMeta::default());
    }
}
