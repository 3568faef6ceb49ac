use super::*;
use gantry_api::v1::{ProvisioningStep, StepState};
use proptest::prelude::*;

fn t(seconds: i64) -> Timestamp {
    Timestamp { seconds, nanos: 0 }
}

fn request(name: &str, image: &str) -> Gateway {
    Gateway {
        metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
        spec: Some(GatewaySpec { image: image.into(), ..Default::default() }),
        status: None,
    }
}

fn created() -> Gateway {
    match create(None, request("edge", "gw:1"), Role::Editor, "uid-1".into(), t(1)).unwrap() {
        Write::Put(mut g) => {
            g.metadata.as_mut().unwrap().resource_version = 5;
            g
        }
        other => panic!("{other:?}"),
    }
}

fn put(w: Result<Write, RuleError>) -> Gateway {
    match w.unwrap() {
        Write::Put(g) => g,
        other => panic!("expected a put, got {other:?}"),
    }
}

fn spec_update(current: &Gateway, image: &str) -> Result<Write, RuleError> {
    update(current, &request("edge", image), &["spec".into()], Role::Editor, t(2))
}

fn status_write(observed: i64, steps: Vec<ProvisioningStep>) -> Gateway {
    Gateway {
        metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
        spec: None,
        status: Some(GatewayStatus {
            observed_generation: observed,
            provisioning: steps,
            ..Default::default()
        }),
    }
}

fn status_paths() -> Vec<String> {
    vec!["status.observed_generation".into(), "status.provisioning".into()]
}

fn step(name: &str, state: StepState) -> ProvisioningStep {
    ProvisioningStep { name: name.into(), state: state as i32, message: String::new() }
}

#[test]
fn create_starts_unconverged() {
    let g = created();
    let m = g.metadata.as_ref().unwrap();
    assert_eq!((m.generation, g.status.as_ref().unwrap().observed_generation), (1, 0));
    assert_eq!(g.status.unwrap().phase(), Phase::Pending);
}

#[test]
fn create_ignores_server_fields_and_rejects_foreign_ones() {
    let mut req = request("edge", "gw:1");
    req.metadata.as_mut().unwrap().generation = 9;
    let g = put(create(None, req, Role::Editor, "u".into(), t(1)));
    assert_eq!(g.metadata.unwrap().generation, 1);

    let mut req = request("edge", "gw:1");
    req.status = Some(GatewayStatus { observed_generation: 1, ..Default::default() });
    let err = create(None, req, Role::Editor, "u".into(), t(1)).unwrap_err();
    assert!(matches!(err, RuleError::PermissionDenied { .. }));

    let err = create(Some(&created()), request("edge", "gw:1"), Role::Editor, "u".into(), t(1))
        .unwrap_err();
    assert_eq!(err, RuleError::AlreadyExists("edge".into()));
    let err =
        create(None, request("edge", "gw:1"), Role::Reconciler, "u".into(), t(1)).unwrap_err();
    assert!(matches!(err, RuleError::PermissionDenied { .. }));
    let err = create(None, request("Edge", "gw:1"), Role::Editor, "u".into(), t(1)).unwrap_err();
    assert_eq!(err.field(), Some("gateway.metadata.name"));
}

#[test]
fn spec_change_advances_generation_once_and_clears_provisioning() {
    let mut g = created();
    g.status.as_mut().unwrap().provisioning = vec![step("ManifestsApplied", StepState::Complete)];
    let next = put(spec_update(&g, "gw:2"));
    assert_eq!(next.metadata.as_ref().unwrap().generation, 2);
    assert!(next.status.unwrap().provisioning.is_empty());
    assert!(matches!(spec_update(&g, "gw:1").unwrap(), Write::Unchanged(_)));
}

#[test]
fn metadata_only_change_keeps_generation() {
    let g = created();
    let mut req = request("edge", "ignored:9");
    req.metadata.as_mut().unwrap().labels.insert("team".into(), "a".into());
    let next = put(update(&g, &req, &["metadata.labels".into()], Role::Editor, t(2)));
    assert_eq!(next.metadata.as_ref().unwrap().generation, 1);
    assert_eq!(next.spec, g.spec, "a path not in the mask is not written");
}

#[test]
fn spec_field_path_changes_only_that_field() {
    let mut g = created();
    g.spec.as_mut().unwrap().credential_driver = "vault".into();
    let mut req = request("edge", "gw:2");
    req.spec.as_mut().unwrap().replicas = Some(3);
    let next = put(update(&g, &req, &["spec.replicas".into()], Role::Editor, t(2)));
    let spec = next.spec.unwrap();
    assert_eq!(
        (spec.image.as_str(), spec.replicas, spec.credential_driver.as_str()),
        ("gw:1", Some(3), "vault")
    );
}

#[test]
fn stale_resource_version_conflicts() {
    let g = created();
    let mut req = request("edge", "gw:2");
    req.metadata.as_mut().unwrap().resource_version = 4;
    let err = update(&g, &req, &["spec".into()], Role::Editor, t(2)).unwrap_err();
    assert_eq!(err, RuleError::Conflict { given: 4, current: 5 });
    req.metadata.as_mut().unwrap().resource_version = 5;
    assert!(update(&g, &req, &["spec".into()], Role::Editor, t(2)).is_ok());
}

#[test]
fn status_rules() {
    let g = put(spec_update(&created(), "gw:2")); // generation 2
    let err =
        update(&g, &status_write(1, vec![]), &status_paths(), Role::Editor, t(3)).unwrap_err();
    assert!(matches!(err, RuleError::PermissionDenied { .. }));
    let err =
        update(&g, &status_write(3, vec![]), &status_paths(), Role::Reconciler, t(3)).unwrap_err();
    assert!(matches!(err, RuleError::FailedPrecondition { .. }));
    let g = put(update(&g, &status_write(2, vec![]), &status_paths(), Role::Reconciler, t(3)));
    assert_eq!(g.status.as_ref().unwrap().observed_generation, 2);
    let err =
        update(&g, &status_write(1, vec![]), &status_paths(), Role::Reconciler, t(3)).unwrap_err();
    assert!(matches!(err, RuleError::FailedPrecondition { .. }));
}

#[test]
fn status_fields_that_would_break_readers_are_refused_naming_the_field() {
    use gantry_api::v1::{Condition, ConditionStatus};
    let g = created();
    let write = |change: fn(&mut GatewayStatus), path: &str| {
        let mut status = GatewayStatus::default();
        change(&mut status);
        let incoming = Gateway {
            metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
            spec: None,
            status: Some(status),
        };
        update(&g, &incoming, &[format!("status.{path}")], Role::Reconciler, t(3))
    };
    let condition = |i: usize| Condition {
        r#type: format!("Type{i}"),
        status: ConditionStatus::True as i32,
        ..Default::default()
    };
    type Case = (&'static str, fn(&mut GatewayStatus), &'static str);
    let refused: Vec<Case> = vec![
        (
            "next_retry_time",
            |s| s.next_retry_time = Some(Timestamp { seconds: 10, nanos: -1 }),
            "gateway.status.next_retry_time",
        ),
        (
            "next_retry_time",
            |s| s.next_retry_time = Some(Timestamp { seconds: i64::MAX, nanos: 0 }),
            "gateway.status.next_retry_time",
        ),
        (
            "route_address",
            |s| s.route_address = "lb\0.example.com".into(),
            "gateway.status.route_address",
        ),
        (
            "route_address",
            |s| s.route_address = "lb.example.com\nFAKE".into(),
            "gateway.status.route_address",
        ),
        ("message", |s| s.message = "boom\u{1b}[2J".into(), "gateway.status.message"),
        (
            "applied_fingerprint",
            |s| s.applied_fingerprint = "x".repeat(200),
            "gateway.status.applied_fingerprint",
        ),
    ];
    for (path, change, field) in refused {
        let err = write(change, path).unwrap_err();
        assert_eq!(err.field(), Some(field), "{path}: {err}");
    }
    let many =
        GatewayStatus { conditions: (0..2_000).map(condition).collect(), ..Default::default() };
    let incoming = Gateway {
        metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
        spec: None,
        status: Some(many),
    };
    let err =
        update(&g, &incoming, &["status.conditions".into()], Role::Reconciler, t(3)).unwrap_err();
    assert_eq!(err.field(), Some("gateway.status.conditions"));
    // A multi-line error message is fine.
    assert!(write(|s| s.message = "apply failed:\n\tcause".into(), "message").is_ok());
}

#[test]
fn deletion_waits_for_finalizers() {
    let mut g = created();
    g.metadata.as_mut().unwrap().finalizers = vec!["gantry.dev/cleanup".into()];
    let deleting = put(delete(&g, 0, Role::Editor, t(5)));
    assert!(deleting.metadata.as_ref().unwrap().delete_time.is_some());
    assert_eq!(deleting.status.as_ref().unwrap().phase(), Phase::Deleting);
    assert!(matches!(delete(&deleting, 0, Role::Editor, t(6)).unwrap(), Write::Unchanged(_)));
    assert!(spec_update(&deleting, "gw:2").is_err(), "no spec change while deleting");

    let mut release = status_write(0, vec![]);
    release.metadata.as_mut().unwrap().finalizers.clear();
    let w = update(&deleting, &release, &["metadata.finalizers".into()], Role::Reconciler, t(7))
        .unwrap();
    assert!(matches!(w, Write::Remove(_)));

    assert!(matches!(delete(&created(), 0, Role::Editor, t(5)).unwrap(), Write::Remove(_)));
    assert!(matches!(
        delete(&created(), 4, Role::Editor, t(5)).unwrap_err(),
        RuleError::Conflict { .. }
    ));
    assert!(delete(&created(), 0, Role::Viewer, t(5)).is_err());
}

fn arb_state() -> impl Strategy<Value = StepState> {
    prop_oneof![
        Just(StepState::Pending),
        Just(StepState::InProgress),
        Just(StepState::Complete),
        Just(StepState::Failed)
    ]
}

fn arb_spec() -> impl Strategy<Value = GatewaySpec> {
    (
        prop_oneof![Just("gw:1"), Just("gw:2")],
        proptest::option::of(0..3i32),
        proptest::collection::vec(prop_oneof![Just("a.example.com"), Just("b.example.com")], 0..4),
        proptest::collection::btree_map(
            prop_oneof![Just("k1"), Just("k2")],
            prop_oneof![Just("x"), Just("y")],
            0..3,
        ),
    )
        .prop_map(|(image, replicas, names, config)| GatewaySpec {
            image: image.into(),
            replicas,
            server_dns_names: names.into_iter().map(String::from).collect(),
            config: config.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        })
}

proptest! {
    /// Generation never moves backwards, and advances exactly when the
    /// canonical spec changes.
    #[test]
    fn generation_never_moves_backwards(specs in proptest::collection::vec(arb_spec(), 1..20)) {
        let mut g = created();
        for spec in specs {
            let before = g.metadata.as_ref().unwrap().generation;
            let req = Gateway { spec: Some(spec.clone()), ..request("edge", "") };
            let changed = spec_changed(g.spec.as_ref().unwrap(), &spec);
            match update(&g, &req, &["spec".into()], Role::Editor, t(2)).unwrap() {
                Write::Put(next) => g = next,
                Write::Unchanged(_) => {}
                Write::Remove(_) => unreachable!(),
            }
            let after = g.metadata.as_ref().unwrap().generation;
            prop_assert_eq!(after, before + i64::from(changed));
        }
    }

    /// A spec equal after normalisation (reordered, duplicated set fields)
    /// never advances generation.
    #[test]
    fn equal_spec_after_normalisation_is_unchanged(spec in arb_spec(), seed in any::<u64>()) {
        let mut g = created();
        g.spec = Some(canonical_spec(spec.clone()));
        let mut shuffled = spec;
        shuffled.server_dns_names.reverse();
        if seed % 2 == 0 {
            let dup = shuffled.server_dns_names.first().cloned();
            shuffled.server_dns_names.extend(dup);
        }
        let req = Gateway { spec: Some(shuffled), ..request("edge", "") };
        let w = update(&g, &req, &["spec".into()], Role::Editor, t(2)).unwrap();
        prop_assert!(matches!(w, Write::Unchanged(_)));
    }

    /// Replaying or reordering the same status writes never leaves a step
    /// behind where the in-order sequence left it, unless a FAILED shows.
    #[test]
    fn replayed_or_reordered_status_writes_never_regress_work_done(
        writes in proptest::collection::vec(
            proptest::collection::vec((0..3usize, arb_state()), 1..4), 1..8),
        order in proptest::collection::vec(any::<proptest::sample::Index>(), 1..16),
    ) {
        let names = ["ManifestsApplied", "WorkloadAvailable", "RouteAdmitted"];
        let writes: Vec<Vec<ProvisioningStep>> = writes
            .into_iter()
            .map(|w| {
                let mut seen = Vec::new();
                w.into_iter()
                    .filter(|(n, _)| { let fresh = !seen.contains(n); seen.push(*n); fresh })
                    .map(|(n, s)| step(names[n], s))
                    .collect()
            })
            .collect();
        let mut g = created();
        for index in order {
            let steps = writes[index.index(writes.len())].clone();
            let before = g.status.as_ref().unwrap().provisioning.clone();
            let w = update(&g, &status_write(0, steps.clone()), &status_paths(), Role::Reconciler, t(3)).unwrap();
            if let Write::Put(next) = w { g = next; }
            for s in &g.status.as_ref().unwrap().provisioning {
                let previous = before.iter().find(|b| b.name == s.name);
                let incoming_failed = steps.iter().any(|i| i.name == s.name && i.state() == StepState::Failed);
                let was_failed = previous.is_some_and(|p| p.state() == StepState::Failed);
                let written = steps.iter().find(|i| i.name == s.name);
                if let (true, Some(w)) = (gantry_api::steps::OBSERVED.contains(&s.name.as_str()), written) {
                    // A step of what is live takes the state written.
                    prop_assert_eq!(s.state, w.state, "{} does not show what was observed", &s.name);
                } else if let Some(p) = previous {
                    if !incoming_failed && !was_failed {
                        prop_assert!(s.state >= p.state, "{} regressed", s.name);
                    }
                }
            }
            for b in &before {
                prop_assert!(g.status.as_ref().unwrap().provisioning.iter().any(|s| s.name == b.name), "step {} dropped", b.name);
            }
        }
    }
}

#[test]
fn the_trace_annotation_follows_the_request_that_made_the_generation() {
    let gateway = |generation: i64, trace: Option<&str>| Gateway {
        metadata: Some(ObjectMeta {
            name: "edge".into(),
            generation,
            annotations: trace
                .map(|t| (gantry_api::TRACE_ANNOTATION.to_string(), t.to_string()))
                .into_iter()
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let annotation = |w: &Write| match w {
        Write::Put(g) | Write::Remove(g) | Write::Unchanged(g) => g
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.get(gantry_api::TRACE_ANNOTATION).cloned()),
    };
    // A new generation takes the request's trace, or none.
    let w = record_trace(Write::Put(gateway(2, Some("old"))), 1, Some("new"));
    assert_eq!(annotation(&w).as_deref(), Some("new"));
    let w = record_trace(Write::Put(gateway(2, Some("old"))), 1, None);
    assert_eq!(annotation(&w), None, "a stale trace is not kept");
    // No new generation (labels, status): the annotation stays.
    let w = record_trace(Write::Put(gateway(2, Some("old"))), 2, Some("status write"));
    assert_eq!(annotation(&w).as_deref(), Some("old"));
    let w = record_trace(Write::Unchanged(gateway(2, Some("old"))), 1, Some("new"));
    assert_eq!(annotation(&w).as_deref(), Some("old"));
}
