//! An owned object as the watches decode it: its metadata and the rest of
//! its fields, each decoded once. `DynamicObject` holds the same, but its
//! fields are `#[serde(flatten)]`, so serde buffers every object whole into
//! its own intermediate form and decodes it a second time into a `Value`
//! (27.5 % of the reconciler's CPU in a profile of a cold start over 20,000
//! gateways, docs/benchmarks.md). Here the object is decoded into a JSON
//! map once, and its metadata taken out of that map.

use std::borrow::Cow;

use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use kube::core::DynamicResourceScope;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// An object of an owned kind: `metadata`, and `data` the other fields
/// without `apiVersion` and `kind` (as `DynamicObject`'s `data`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OwnedObject {
    pub(super) metadata: ObjectMeta,
    pub(super) data: Value,
}

impl<'de> Deserialize<'de> for OwnedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let metadata = match fields.remove("metadata") {
            Some(metadata) => ObjectMeta::deserialize(metadata).map_err(D::Error::custom)?,
            None => ObjectMeta::default(),
        };
        fields.remove("apiVersion");
        fields.remove("kind");
        Ok(OwnedObject { metadata, data: Value::Object(fields) })
    }
}

impl From<DynamicObject> for OwnedObject {
    fn from(o: DynamicObject) -> Self {
        OwnedObject { metadata: o.metadata, data: o.data }
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

    /// Decoded once, the object holds what `DynamicObject` holds, for the
    /// objects the API server sends (a list's items, a watch's events).
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
        assert!(owned.data.get("kind").is_none() && owned.data.get("metadata").is_none());

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
