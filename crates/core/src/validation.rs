//! Validation of a Gateway's metadata and spec against the limits in
//! the README ("API"). Every violation names its field relative to the request
//! (`gateway.spec.image`, `gateway.metadata.labels["team"]`).

use std::collections::BTreeMap;

use gantry_api::v1::{GatewaySpec, ObjectMeta, Oidc, ResourceRequirements, Route};

use crate::error::Violations;
use crate::syntax;

/// At most this many labels, and as many annotations.
pub const MAX_LABELS: usize = 64;
/// At most this many annotations.
pub const MAX_ANNOTATIONS: usize = 64;
/// Total size of annotation keys and values.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
/// Total size of `spec.config` keys and values.
pub const MAX_CONFIG_BYTES: usize = 256 * 1024;
/// At most this many `spec.server_dns_names`.
pub const MAX_SERVER_DNS_NAMES: usize = 100;
/// At most this many finalizers.
pub const MAX_FINALIZERS: usize = 32;
/// At most this many OIDC audiences.
pub const MAX_AUDIENCES: usize = 32;
/// Upper bound on `spec.replicas`.
pub const MAX_REPLICAS: i32 = 1000;
/// Longest credential driver name.
const MAX_DRIVER_LEN: usize = 63;

/// `spec.config` keys with this prefix are reserved: the reconciler
/// renders its own settings into the ConfigMap under them.
pub const RESERVED_CONFIG_PREFIX: &str = "gantry.";

/// The resource names `spec.resources` accepts.
pub const RESOURCE_NAMES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// Field path prefix of the Gateway in every request.
pub const GATEWAY: &str = "gateway";

/// Checks the name of a new gateway: an RFC 1035 label, because its
/// Service is named after it.
pub fn validate_new_name(field: &str, name: &str) -> Result<(), crate::error::RuleError> {
    syntax::dns1035_label(name).map_err(|d| crate::error::RuleError::invalid(field, d))
}

/// Checks a name to look up (RFC 1123 label, so that gateways created
/// before names had to start with a letter can still be read and deleted).
pub fn validate_name(field: &str, name: &str) -> Result<(), crate::error::RuleError> {
    syntax::dns1123_label(name).map_err(|d| crate::error::RuleError::invalid(field, d))
}

fn check(violations: &mut Violations, field: impl FnOnce() -> String, result: Result<(), String>) {
    if let Err(description) = result {
        violations.push(field(), description);
    }
}

/// Checks labels: count, key syntax and value syntax.
pub fn validate_labels(v: &mut Violations, labels: &BTreeMap<String, String>) {
    let field = "gateway.metadata.labels";
    if labels.len() > MAX_LABELS {
        v.push(field, format!("at most {MAX_LABELS} labels, got {}", labels.len()));
    }
    for (key, value) in labels {
        check(v, || format!("{field}[{key:?}]"), syntax::qualified_name(key));
        check(v, || format!("{field}[{key:?}]"), syntax::label_value(value));
    }
}

/// Checks annotations: count, key syntax and total size.
pub fn validate_annotations(v: &mut Violations, annotations: &BTreeMap<String, String>) {
    let field = "gateway.metadata.annotations";
    if annotations.len() > MAX_ANNOTATIONS {
        v.push(field, format!("at most {MAX_ANNOTATIONS} annotations, got {}", annotations.len()));
    }
    let mut total = 0;
    for (key, value) in annotations {
        check(v, || format!("{field}[{key:?}]"), syntax::qualified_name(key));
        total += key.len() + value.len();
    }
    if total > MAX_ANNOTATIONS_BYTES {
        v.push(field, format!("at most {MAX_ANNOTATIONS_BYTES} bytes in total, got {total}"));
    }
}

/// Checks finalizers: count, syntax, no duplicates.
pub fn validate_finalizers(v: &mut Violations, finalizers: &[String]) {
    let field = "gateway.metadata.finalizers";
    if finalizers.len() > MAX_FINALIZERS {
        v.push(field, format!("at most {MAX_FINALIZERS} finalizers, got {}", finalizers.len()));
    }
    for (i, finalizer) in finalizers.iter().enumerate() {
        check(v, || format!("{field}[{i}]"), syntax::qualified_name(finalizer));
        if finalizers[..i].contains(finalizer) {
            v.push(format!("{field}[{i}]"), format!("duplicate finalizer {finalizer:?}"));
        }
    }
}

/// Checks the writable metadata of a Gateway.
pub fn validate_metadata(v: &mut Violations, meta: &ObjectMeta) {
    check(v, || "gateway.metadata.name".into(), syntax::dns1035_label(&meta.name));
    validate_labels(v, &meta.labels);
    validate_annotations(v, &meta.annotations);
    validate_finalizers(v, &meta.finalizers);
}

/// Checks a spec as the client sent it, before normalisation.
pub fn validate_spec(v: &mut Violations, spec: Option<&GatewaySpec>) {
    let field = "gateway.spec";
    let Some(spec) = spec else {
        v.push(field, "required: a gateway needs at least spec.image");
        return;
    };
    if spec.image.is_empty() {
        v.push("gateway.spec.image", "required: the gateway container image");
    } else {
        check(v, || "gateway.spec.image".into(), syntax::image_reference(&spec.image));
    }
    if !spec.supervisor_image.is_empty() {
        check(
            v,
            || "gateway.spec.supervisor_image".into(),
            syntax::image_reference(&spec.supervisor_image),
        );
    }
    if let Some(replicas) = spec.replicas {
        if !(0..=MAX_REPLICAS).contains(&replicas) {
            v.push(
                "gateway.spec.replicas",
                format!("must be between 0 and {MAX_REPLICAS}, got {replicas}"),
            );
        }
    }
    if let Some(route) = &spec.route {
        validate_route(v, route);
    }
    validate_server_dns_names(v, &spec.server_dns_names);
    if let Some(oidc) = &spec.oidc {
        validate_oidc(v, oidc);
    }
    if !spec.credential_driver.is_empty() {
        let driver = &spec.credential_driver;
        if driver.len() > MAX_DRIVER_LEN || syntax::dns1123_subdomain(driver).is_err() {
            v.push(
                "gateway.spec.credential_driver",
                format!("{driver:?} is not a driver name: lowercase letters, digits, '-' and '.', at most {MAX_DRIVER_LEN} characters"),
            );
        }
    }
    validate_config(v, &spec.config);
    if let Some(resources) = &spec.resources {
        validate_resources(v, resources);
    }
}

fn validate_route(v: &mut Violations, route: &Route) {
    if route.host.is_empty() {
        if !route.tls_secret_name.is_empty() {
            v.push("gateway.spec.route.host", "required when a route is set");
        }
    } else {
        check(v, || "gateway.spec.route.host".into(), syntax::dns1123_subdomain(&route.host));
    }
    if !route.tls_secret_name.is_empty() {
        check(
            v,
            || "gateway.spec.route.tls_secret_name".into(),
            syntax::dns1123_subdomain(&route.tls_secret_name),
        );
    }
}

fn validate_server_dns_names(v: &mut Violations, names: &[String]) {
    if names.len() > MAX_SERVER_DNS_NAMES {
        v.push(
            "gateway.spec.server_dns_names",
            format!("at most {MAX_SERVER_DNS_NAMES} names, got {}", names.len()),
        );
    }
    for (i, name) in names.iter().enumerate().take(MAX_SERVER_DNS_NAMES + 1) {
        check(v, || format!("gateway.spec.server_dns_names[{i}]"), syntax::server_dns_name(name));
    }
}

fn validate_oidc(v: &mut Violations, oidc: &Oidc) {
    if *oidc != Default::default() {
        check(v, || "gateway.spec.oidc.issuer_url".into(), syntax::https_url(&oidc.issuer_url));
        if oidc.client_id.is_empty() || oidc.client_id.len() > 256 {
            v.push("gateway.spec.oidc.client_id", "required, at most 256 characters");
        }
        if oidc.audiences.len() > MAX_AUDIENCES {
            v.push("gateway.spec.oidc.audiences", format!("at most {MAX_AUDIENCES} audiences"));
        }
        for (i, audience) in oidc.audiences.iter().enumerate().take(MAX_AUDIENCES + 1) {
            if audience.is_empty() || audience.len() > 256 {
                v.push(format!("gateway.spec.oidc.audiences[{i}]"), "must be 1 to 256 characters");
            }
        }
    }
}

fn validate_config(v: &mut Violations, config: &BTreeMap<String, String>) {
    let mut config_bytes = 0;
    for (key, value) in config {
        check(v, || format!("gateway.spec.config[{key:?}]"), syntax::config_key(key));
        if key.starts_with(RESERVED_CONFIG_PREFIX) {
            v.push(
                format!("gateway.spec.config[{key:?}]"),
                format!("keys starting with {RESERVED_CONFIG_PREFIX:?} are reserved for gantry"),
            );
        }
        config_bytes += key.len() + value.len();
    }
    if config_bytes > MAX_CONFIG_BYTES {
        v.push(
            "gateway.spec.config",
            format!("at most {MAX_CONFIG_BYTES} bytes in total, got {config_bytes}"),
        );
    }
}

fn validate_resources(v: &mut Violations, resources: &ResourceRequirements) {
    for (kind, map) in [("requests", &resources.requests), ("limits", &resources.limits)] {
        for (name, quantity) in map {
            let field = || format!("gateway.spec.resources.{kind}[{name:?}]");
            if !RESOURCE_NAMES.contains(&name.as_str()) {
                v.push(field(), format!("unknown resource {name:?}; one of {RESOURCE_NAMES:?}"));
            } else {
                check(v, field, syntax::quantity(quantity));
            }
        }
    }
    // As the API server: a container's request may not exceed its limit.
    for (name, request) in &resources.requests {
        let Some(limit) = resources.limits.get(name) else { continue };
        if let (Some(r), Some(l)) = (syntax::quantity_nanos(request), syntax::quantity_nanos(limit))
        {
            if r > l {
                v.push(
                    format!("gateway.spec.resources.requests[{name:?}]"),
                    format!("{request:?} must be less than or equal to the {name} limit {limit:?}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::{Oidc, ResourceRequirements, Route};

    fn spec() -> GatewaySpec {
        GatewaySpec { image: "ghcr.io/acme/gw:1.0".into(), ..Default::default() }
    }

    fn fields(spec: &GatewaySpec) -> Vec<String> {
        let mut v = Violations::default();
        validate_spec(&mut v, Some(spec));
        match v.into_result() {
            Ok(()) => vec![],
            Err(crate::error::RuleError::Invalid(list)) => {
                list.into_iter().map(|f| f.field).collect()
            }
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn minimal_spec_is_valid() {
        assert!(fields(&spec()).is_empty());
    }

    #[test]
    fn missing_spec_and_image_are_named() {
        let mut v = Violations::default();
        validate_spec(&mut v, None);
        assert_eq!(v.into_result().unwrap_err().field(), Some("gateway.spec"));
        assert_eq!(fields(&GatewaySpec::default()), ["gateway.spec.image"]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = GatewaySpec {
            image: "Bad Image".into(),
            replicas: Some(-1),
            route: Some(Route { host: "Host!".into(), tls_secret_name: "ok".into() }),
            server_dns_names: vec!["ok.example.com".into(), "bad_name".into()],
            oidc: Some(Oidc {
                issuer_url: "http://x".into(),
                client_id: String::new(),
                audiences: vec![],
            }),
            credential_driver: "Vault!".into(),
            config: [("bad/key".to_string(), "v".to_string())].into(),
            resources: Some(ResourceRequirements {
                requests: [("gpu".to_string(), "1".to_string())].into(),
                limits: [("cpu".to_string(), "lots".to_string())].into(),
            }),
            ..spec()
        };
        assert_eq!(
            fields(&bad),
            [
                "gateway.spec.image",
                "gateway.spec.replicas",
                "gateway.spec.route.host",
                "gateway.spec.server_dns_names[1]",
                "gateway.spec.oidc.issuer_url",
                "gateway.spec.oidc.client_id",
                "gateway.spec.credential_driver",
                "gateway.spec.config[\"bad/key\"]",
                "gateway.spec.resources.requests[\"gpu\"]",
                "gateway.spec.resources.limits[\"cpu\"]",
            ]
        );
    }

    #[test]
    fn requests_may_not_exceed_limits() {
        let resources = |request: &str, limit: &str| GatewaySpec {
            resources: Some(ResourceRequirements {
                requests: [("cpu".to_string(), request.to_string())].into(),
                limits: [("cpu".to_string(), limit.to_string())].into(),
            }),
            ..spec()
        };
        assert_eq!(fields(&resources("2", "500m")), ["gateway.spec.resources.requests[\"cpu\"]"]);
        assert!(fields(&resources("500m", "0.5")).is_empty());
        assert!(fields(&resources("100m", "1")).is_empty());
    }

    #[test]
    fn new_names_start_with_a_letter() {
        assert!(validate_new_name("gateway.metadata.name", "edge-1").is_ok());
        let err = validate_new_name("gateway.metadata.name", "1edge").unwrap_err();
        assert_eq!(err.field(), Some("gateway.metadata.name"));
        // Looked up, an older name that starts with a digit is still valid.
        assert!(validate_name("name", "1edge").is_ok());
        let mut v = Violations::default();
        validate_metadata(&mut v, &ObjectMeta { name: "1edge".into(), ..Default::default() });
        assert_eq!(v.into_result().unwrap_err().field(), Some("gateway.metadata.name"));
    }

    #[test]
    fn zero_replicas_is_allowed() {
        assert!(fields(&GatewaySpec { replicas: Some(0), ..spec() }).is_empty());
    }

    #[test]
    fn size_limits() {
        let names = (0..=MAX_SERVER_DNS_NAMES).map(|i| format!("h{i}.example.com")).collect();
        assert_eq!(
            fields(&GatewaySpec { server_dns_names: names, ..spec() }),
            ["gateway.spec.server_dns_names"]
        );
        let reserved = [("gantry.json".to_string(), "{}".to_string())].into();
        assert_eq!(
            fields(&GatewaySpec { config: reserved, ..spec() }),
            ["gateway.spec.config[\"gantry.json\"]"]
        );
        let config = [("big".to_string(), "x".repeat(MAX_CONFIG_BYTES))].into();
        assert_eq!(fields(&GatewaySpec { config, ..spec() }), ["gateway.spec.config"]);

        let mut v = Violations::default();
        let labels = (0..=MAX_LABELS).map(|i| (format!("k{i}"), "v".to_string())).collect();
        validate_labels(&mut v, &labels);
        assert_eq!(v.into_result().unwrap_err().field(), Some("gateway.metadata.labels"));
    }

    #[test]
    fn metadata_keys() {
        let mut v = Violations::default();
        let meta = ObjectMeta {
            name: "edge".into(),
            labels: [("team".to_string(), "a b".to_string())].into(),
            annotations: [("/bad".to_string(), String::new())].into(),
            finalizers: vec!["gantry.dev/cleanup".into(), "gantry.dev/cleanup".into()],
            ..Default::default()
        };
        validate_metadata(&mut v, &meta);
        let err = v.into_result().unwrap_err();
        let crate::error::RuleError::Invalid(list) = err else { panic!() };
        let fields: Vec<_> = list.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "gateway.metadata.labels[\"team\"]",
                "gateway.metadata.annotations[\"/bad\"]",
                "gateway.metadata.finalizers[1]"
            ]
        );
    }
}
