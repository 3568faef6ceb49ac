//! Every field of `GatewaySpec` and `GatewayStatus`, read from the API's
//! own descriptor (`FILE_DESCRIPTOR_SET`), is covered by the hand-kept
//! parts of the rules: the update masks (`SPEC_FIELDS`, `STATUS_FIELDS`),
//! the copy of a masked spec field, the status merge, the generation rule's
//! canonical form, and the choice of which repeated fields are sets. A new
//! field in the proto fails here until each of those knows it.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use gantry_api::v1::{
    Condition, ConditionStatus, Gateway, GatewaySpec, GatewayStatus, ObjectMeta, Oidc, Phase,
    ProvisioningStep, ResourceRequirements, Route, StepState, FILE_DESCRIPTOR_SET,
};
use gantry_core::access::{SPEC_FIELDS, STATUS_FIELDS};
use gantry_core::canonical::{canonical_spec, spec_changed};
use gantry_core::lifecycle::{create, update};
use gantry_core::{Role, RuleError, Write};
use prost::Message;
use prost_types::field_descriptor_proto::Label;
use prost_types::{FileDescriptorSet, Timestamp};

/// The fields of message `name` of package `gantry.v1`: (name, a list).
fn fields(name: &str) -> Vec<(String, bool)> {
    let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("the API's descriptor");
    let message = set
        .file
        .iter()
        .filter(|f| f.package() == "gantry.v1")
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("message {name} in the descriptor"));
    message
        .field
        .iter()
        .map(|f| {
            // A map is a repeated entry message, not a list.
            let map = f.type_name().ends_with("Entry");
            (f.name().to_string(), f.label() == Label::Repeated && !map)
        })
        .collect()
}

fn names(fields: &[(String, bool)]) -> BTreeSet<String> {
    fields.iter().map(|(n, _)| n.clone()).collect()
}

type SpecChange = fn(&mut GatewaySpec);

/// A value for each spec field, other than the base's.
fn spec_samples() -> Vec<(&'static str, SpecChange)> {
    vec![
        ("image", |s| s.image = "gw:2".into()),
        ("supervisor_image", |s| s.supervisor_image = "sup:2".into()),
        ("replicas", |s| s.replicas = Some(3)),
        ("route", |s| {
            s.route = Some(Route { host: "a.example.com".into(), tls_secret_name: String::new() })
        }),
        ("server_dns_names", |s| s.server_dns_names = vec!["a.example.com".into()]),
        ("oidc", |s| {
            s.oidc = Some(Oidc {
                issuer_url: "https://login.example.com".into(),
                client_id: "c".into(),
                audiences: vec!["api".into()],
            })
        }),
        ("credential_driver", |s| s.credential_driver = "vault".into()),
        ("config", |s| {
            s.config.insert("k".into(), "v".into());
        }),
        ("resources", |s| {
            s.resources = Some(ResourceRequirements {
                requests: [("cpu".to_string(), "100m".to_string())].into(),
                limits: Default::default(),
            })
        }),
    ]
}

fn base() -> Gateway {
    let request = Gateway {
        metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
        spec: Some(GatewaySpec { image: "gw:1".into(), ..Default::default() }),
        status: None,
    };
    match create(None, request, Role::Editor, "uid-1".into(), Timestamp::default()) {
        Ok(Write::Put(mut g)) => {
            g.metadata.as_mut().unwrap().resource_version = 5;
            g
        }
        other => panic!("{other:?}"),
    }
}

fn put(w: Result<Write, RuleError>) -> Gateway {
    match w {
        Ok(Write::Put(g)) => g,
        other => panic!("expected a put, got {other:?}"),
    }
}

#[test]
fn every_spec_field_is_maskable_copied_and_counts_for_the_generation() {
    let described = names(&fields("GatewaySpec"));
    let maskable: BTreeSet<String> = SPEC_FIELDS.iter().map(|f| f.to_string()).collect();
    assert_eq!(maskable, described, "SPEC_FIELDS and the proto's GatewaySpec differ");
    let sampled: BTreeSet<String> = spec_samples().iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(sampled, described, "a spec field without a sample here");
    for (field, change) in spec_samples() {
        let current = base();
        let mut incoming = current.clone();
        change(incoming.spec.as_mut().unwrap());
        let (old, new) = (current.spec.as_ref().unwrap(), incoming.spec.as_ref().unwrap());
        assert!(spec_changed(old, new), "{field}: the canonical form drops it");
        let mask = vec![format!("spec.{field}")];
        let written = put(update(&current, &incoming, &mask, Role::Editor, Timestamp::default()));
        let mut expected = current.spec.clone().unwrap();
        change(&mut expected);
        assert_eq!(written.spec, Some(canonical_spec(expected)), "{field}: not copied");
        assert_eq!(written.metadata.unwrap().generation, 2, "{field}: no new generation");
    }
}

/// Repeated fields of the spec and what the generation rule makes of their
/// order: a set (sorted, deduplicated) or a list (order counts).
const SETS: [&str; 2] = ["GatewaySpec.server_dns_names", "Oidc.audiences"];
const LISTS: [&str; 0] = [];

#[test]
fn every_repeated_spec_field_is_a_set_or_a_list_by_decision() {
    let mut repeated = BTreeSet::new();
    for message in ["GatewaySpec", "Oidc", "Route", "ResourceRequirements"] {
        for (name, is_list) in fields(message) {
            if is_list {
                repeated.insert(format!("{message}.{name}"));
            }
        }
    }
    let decided: BTreeSet<String> =
        SETS.iter().chain(LISTS.iter()).map(|s| s.to_string()).collect();
    assert_eq!(repeated, decided, "a repeated field with no decision: set or list?");
    // The sets are sets: order and duplicates do not count.
    let a = GatewaySpec {
        server_dns_names: vec!["b".into(), "a".into(), "a".into()],
        oidc: Some(Oidc { audiences: vec!["y".into(), "x".into()], ..Default::default() }),
        ..Default::default()
    };
    let b = GatewaySpec {
        server_dns_names: vec!["a".into(), "b".into()],
        oidc: Some(Oidc { audiences: vec!["x".into(), "y".into()], ..Default::default() }),
        ..Default::default()
    };
    assert!(!spec_changed(&a, &b));
}

type StatusChange = fn(&mut GatewayStatus);

/// A valid value for each status field.
fn status_samples() -> Vec<(&'static str, StatusChange)> {
    vec![
        ("phase", |s| s.phase = Phase::Running as i32),
        ("observed_generation", |s| s.observed_generation = 1),
        ("conditions", |s| {
            s.conditions = vec![Condition {
                r#type: "Ready".into(),
                status: ConditionStatus::True as i32,
                reason: "RolloutComplete".into(),
                message: String::new(),
                observed_generation: 1,
                last_transition_time: None,
            }]
        }),
        ("provisioning", |s| {
            s.provisioning = vec![ProvisioningStep {
                name: "ManifestsApplied".into(),
                state: StepState::Complete as i32,
                message: String::new(),
            }]
        }),
        ("route_address", |s| s.route_address = "lb.example.net".into()),
        ("applied_fingerprint", |s| s.applied_fingerprint = "abc".into()),
        ("failure_count", |s| s.failure_count = 2),
        ("next_retry_time", |s| s.next_retry_time = Some(Timestamp { seconds: 100, nanos: 0 })),
        ("message", |s| s.message = "running".into()),
        ("failed_inputs", |s| s.failed_inputs = "inputs".into()),
    ]
}

#[test]
fn every_status_field_is_maskable_and_merged() {
    let described = names(&fields("GatewayStatus"));
    let maskable: BTreeSet<String> = STATUS_FIELDS.iter().map(|f| f.to_string()).collect();
    assert_eq!(maskable, described, "STATUS_FIELDS and the proto's GatewayStatus differ");
    let sampled: BTreeSet<String> = status_samples().iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(sampled, described, "a status field without a sample here");
    for (field, change) in status_samples() {
        let current = base();
        let mut status = GatewayStatus::default();
        change(&mut status);
        let incoming = Gateway {
            metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
            spec: None,
            status: Some(status),
        };
        let mask = vec![format!("status.{field}")];
        let written =
            put(update(&current, &incoming, &mask, Role::Reconciler, Timestamp::default()));
        let mut got = written.status.unwrap();
        // The store stamps condition transitions itself.
        for c in &mut got.conditions {
            c.last_transition_time = None;
        }
        let mut expected = current.status.clone().unwrap();
        change(&mut expected);
        assert_eq!(got, expected, "{field}: not merged under its mask");
    }
}
