//! Gateway manifests as people write them (YAML or JSON, camelCase, in the
//! style of Kubernetes objects) and their conversion to and from the wire
//! messages.

use std::collections::BTreeMap;

use gantry_api::v1 as pb;
use serde::{Deserialize, Serialize};

pub const API_VERSION: &str = "gantry.dev/v1";
pub const KIND: &str = "Gateway";

/// A Gateway document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayDoc {
    #[serde(default = "api_version")]
    pub api_version: String,
    #[serde(default = "kind")]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

fn api_version() -> String {
    API_VERSION.into()
}

fn kind() -> String {
    KIND.into()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resource_version: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub create_time: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub update_time: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub delete_time: String,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    #[serde(default)]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub supervisor_image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_dns_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<Oidc>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential_driver: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Route {
    pub host: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tls_secret_name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Oidc {
    pub issuer_url: String,
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

/// Observed state, for output only (read back leniently: `apply` of a
/// printed gateway ignores it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Status {
    pub phase: String,
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub provisioning: Vec<Step>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub route_address: String,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub failure_count: i32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub next_retry_time: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub name: String,
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// RFC 3339 for a protobuf timestamp; empty for none.
pub fn time(t: Option<&prost_types::Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_default()
}

fn enum_name(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_string()
}

impl GatewayDoc {
    /// The wire message for create and update (spec and writable metadata).
    pub fn to_proto(&self) -> pb::Gateway {
        let s = &self.spec;
        pb::Gateway {
            metadata: Some(pb::ObjectMeta {
                name: self.metadata.name.clone(),
                labels: self.metadata.labels.clone(),
                annotations: self.metadata.annotations.clone(),
                ..Default::default()
            }),
            spec: Some(pb::GatewaySpec {
                image: s.image.clone(),
                supervisor_image: s.supervisor_image.clone(),
                replicas: s.replicas,
                route: s.route.as_ref().map(|r| pb::Route {
                    host: r.host.clone(),
                    tls_secret_name: r.tls_secret_name.clone(),
                }),
                server_dns_names: s.server_dns_names.clone(),
                oidc: s.oidc.as_ref().map(|o| pb::Oidc {
                    issuer_url: o.issuer_url.clone(),
                    client_id: o.client_id.clone(),
                    audiences: o.audiences.clone(),
                }),
                credential_driver: s.credential_driver.clone(),
                config: s.config.clone(),
                resources: s.resources.as_ref().map(|r| pb::ResourceRequirements {
                    requests: r.requests.clone(),
                    limits: r.limits.clone(),
                }),
            }),
            status: None,
        }
    }

    /// The document of a stored gateway, with status.
    pub fn from_proto(g: &pb::Gateway) -> GatewayDoc {
        let meta = g.metadata.clone().unwrap_or_default();
        let spec = g.spec.clone().unwrap_or_default();
        let status = g.status.as_ref().map(|s| Status {
            phase: enum_name(s.phase().as_str_name(), "PHASE_"),
            observed_generation: s.observed_generation,
            conditions: s
                .conditions
                .iter()
                .map(|c| Condition {
                    kind: c.r#type.clone(),
                    status: enum_name(c.status().as_str_name(), "CONDITION_STATUS_"),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_transition_time: time(c.last_transition_time.as_ref()),
                })
                .collect(),
            provisioning: s
                .provisioning
                .iter()
                .map(|p| Step {
                    name: p.name.clone(),
                    state: enum_name(p.state().as_str_name(), "STEP_STATE_"),
                    message: p.message.clone(),
                })
                .collect(),
            route_address: s.route_address.clone(),
            failure_count: s.failure_count,
            next_retry_time: time(s.next_retry_time.as_ref()),
            message: s.message.clone(),
        });
        GatewayDoc {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            metadata: Metadata {
                name: meta.name,
                labels: meta.labels,
                annotations: meta.annotations,
                uid: meta.uid,
                generation: meta.generation,
                resource_version: meta.resource_version,
                finalizers: meta.finalizers,
                create_time: time(meta.create_time.as_ref()),
                update_time: time(meta.update_time.as_ref()),
                delete_time: time(meta.delete_time.as_ref()),
            },
            spec: Spec {
                image: spec.image,
                supervisor_image: spec.supervisor_image,
                replicas: spec.replicas,
                route: spec
                    .route
                    .map(|r| Route { host: r.host, tls_secret_name: r.tls_secret_name }),
                server_dns_names: spec.server_dns_names,
                oidc: spec.oidc.map(|o| Oidc {
                    issuer_url: o.issuer_url,
                    client_id: o.client_id,
                    audiences: o.audiences,
                }),
                credential_driver: spec.credential_driver,
                config: spec.config,
                resources: spec
                    .resources
                    .map(|r| Resources { requests: r.requests, limits: r.limits }),
            },
            status,
        }
    }
}

/// Errors reading manifests, with where.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}: not a valid Gateway manifest: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: document {index}: {message}")]
    Invalid { file: String, index: usize, message: String },
}

/// The list kinds `parse` unwraps into their items: `get -o json|yaml`
/// prints a `GatewayList`, and kubectl users write `List`.
pub const LIST_KINDS: [&str; 2] = ["GatewayList", "List"];

/// The items of a list document (`kind: GatewayList` or `List`), or the
/// document itself.
fn expand_list(value: serde_json::Value) -> Result<Vec<serde_json::Value>, String> {
    let kind = value.get("kind").and_then(serde_json::Value::as_str).unwrap_or_default();
    if !LIST_KINDS.contains(&kind) {
        return Ok(vec![value]);
    }
    match value.get("items") {
        Some(serde_json::Value::Array(items)) => Ok(items.clone()),
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(_) => Err(format!("the items of a {kind} must be a list")),
    }
}

/// Parses one or more Gateway documents (YAML, `---`-separated, or JSON;
/// a `GatewayList` or `List` stands for its items).
pub fn parse(text: &str, source: &str) -> Result<Vec<GatewayDoc>, ManifestError> {
    let parse_error = |message: String| ManifestError::Parse { file: source.into(), message };
    let json = text.trim_start().starts_with(['{', '[']);
    let values: Vec<serde_json::Value> = if json {
        match serde_json::from_str(text).map_err(|e| parse_error(e.to_string()))? {
            serde_json::Value::Array(items) => items,
            single => vec![single],
        }
    } else {
        serde_saphyr::from_multiple(text).map_err(|e| parse_error(e.to_string()))?
    };
    let is_list = |v: &serde_json::Value| {
        LIST_KINDS.contains(&v.get("kind").and_then(serde_json::Value::as_str).unwrap_or_default())
    };
    let docs: Vec<GatewayDoc> = if json || values.iter().any(is_list) {
        let mut items = Vec::new();
        for value in values {
            items.extend(expand_list(value).map_err(parse_error)?);
        }
        items
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()
            .map_err(|e| parse_error(e.to_string()))?
    } else {
        // Typed from the text itself, so that a mistake names its line.
        serde_saphyr::from_multiple(text).map_err(|e| parse_error(e.to_string()))?
    };
    for (i, doc) in docs.iter().enumerate() {
        let invalid =
            |message: String| ManifestError::Invalid { file: source.into(), index: i + 1, message };
        if doc.api_version != API_VERSION || doc.kind != KIND {
            return Err(invalid(format!(
                "apiVersion/kind must be {API_VERSION}/{KIND}, got {}/{}",
                doc.api_version, doc.kind
            )));
        }
        if doc.metadata.name.is_empty() {
            return Err(invalid("metadata.name is required".into()));
        }
    }
    if docs.is_empty() {
        return Err(parse_error("no documents".into()));
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "apiVersion: gantry.dev/v1\nkind: Gateway\nmetadata:\n  name: edge\nspec:\n  image: ghcr.io/acme/gw:1\n";

    #[test]
    fn yaml_and_json_parse_to_the_same_gateway() {
        let yaml = parse(MINIMAL, "a.yaml").unwrap();
        let json = parse(r#"{"apiVersion":"gantry.dev/v1","kind":"Gateway","metadata":{"name":"edge"},"spec":{"image":"ghcr.io/acme/gw:1"}}"#, "a.json").unwrap();
        assert_eq!(yaml, json);
        assert_eq!(yaml[0].to_proto().spec.unwrap().image, "ghcr.io/acme/gw:1");
        let two =
            parse(&format!("{MINIMAL}---\n{}", MINIMAL.replace("edge", "core")), "b.yaml").unwrap();
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn a_list_stands_for_its_items() {
        let item = r#"{"apiVersion":"gantry.dev/v1","kind":"Gateway","metadata":{"name":"NAME","resourceVersion":4},"spec":{"image":"x"},"status":{"phase":"RUNNING"}}"#;
        let list = format!(
            r#"{{"apiVersion":"gantry.dev/v1","kind":"GatewayList","metadata":{{"resourceVersion":9}},"items":[{},{}]}}"#,
            item.replace("NAME", "a"),
            item.replace("NAME", "b")
        );
        let names = |docs: Vec<GatewayDoc>| -> Vec<String> {
            docs.into_iter().map(|d| d.metadata.name).collect()
        };
        assert_eq!(names(parse(&list, "list.json").unwrap()), ["a", "b"]);
        let yaml = format!("apiVersion: v1\nkind: List\nitems:\n- {}\n", item.replace("NAME", "c"));
        assert_eq!(names(parse(&yaml, "list.yaml").unwrap()), ["c"]);
        let empty = "apiVersion: gantry.dev/v1\nkind: GatewayList\nitems: []\n";
        assert!(parse(empty, "empty.yaml").unwrap_err().to_string().contains("no documents"));
    }

    #[test]
    fn mistakes_are_reported_with_the_document() {
        let err =
            parse("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "f.yaml").unwrap_err();
        assert!(
            err.to_string().contains("document 1")
                && err.to_string().contains("gantry.dev/v1/Gateway"),
            "{err}"
        );
        let err = parse(
            "apiVersion: gantry.dev/v1\nkind: Gateway\nmetadata: {name: x}\nspec: {imag: x}\n",
            "f.yaml",
        )
        .unwrap_err();
        assert!(err.to_string().contains("imag"), "{err}");
        assert!(parse("", "empty.yaml").is_err());
    }

    #[test]
    fn the_examples_pass_validation() {
        for (file, text) in [
            ("minimal.yaml", include_str!("../../../examples/minimal.yaml")),
            ("full.yaml", include_str!("../../../examples/full.yaml")),
        ] {
            for doc in parse(text, file).unwrap() {
                let g = doc.to_proto();
                let mut v = gantry_core::error::Violations::default();
                gantry_core::validation::validate_metadata(&mut v, g.metadata.as_ref().unwrap());
                gantry_core::validation::validate_spec(&mut v, g.spec.as_ref());
                assert!(v.into_result().is_ok(), "{file} does not validate");
            }
        }
    }

    #[test]
    fn round_trip_through_the_wire_message() {
        let doc = &parse(include_str!("../../../examples/full.yaml"), "full.yaml").unwrap()[0];
        let back = GatewayDoc::from_proto(&doc.to_proto());
        assert_eq!(back.spec, doc.spec);
        assert_eq!(back.metadata.labels, doc.metadata.labels);
    }
}
