//! The gateway-store API over a real gRPC socket, on SQLite and PostgreSQL:
//! the rules of gantry-core (README, "Concepts" and "API") as a client sees them.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use gantry_api::v1::{
    ConditionStatus, DeleteGatewayRequest, Gateway, GatewaySpec, GatewayStatus, GetGatewayRequest,
    ListGatewaysRequest, ObjectMeta, Phase, ProvisioningStep, StepState, UpdateGatewayRequest,
};
use prost_types::FieldMask;
use tonic::{Code, Status};
use tonic_types::StatusExt;

async fn update(client: &mut Client, g: Gateway, paths: &[&str]) -> Result<Gateway, Status> {
    let update_mask = Some(FieldMask { paths: paths.iter().map(|p| p.to_string()).collect() });
    client
        .update_gateway(UpdateGatewayRequest {
            gateway: Some(g),
            update_mask,
            validate_only: false,
        })
        .await
        .map(|r| r.into_inner())
}

async fn get(client: &mut Client, name: &str) -> Result<Gateway, Status> {
    client.get_gateway(GetGatewayRequest { name: name.into() }).await.map(|r| r.into_inner())
}

/// The field a status names in its details, whichever kind they are.
fn field_of(status: &Status) -> Option<String> {
    if let Some(bad) = status.get_details_bad_request() {
        return bad.field_violations.first().map(|v| v.field.clone());
    }
    if let Some(pre) = status.get_details_precondition_failure() {
        return pre.violations.first().map(|v| v.subject.clone());
    }
    status.get_details_error_info().and_then(|info| info.metadata.get("field").cloned())
}

fn status_write(name: &str, rv: i64, observed: i64, steps: Vec<ProvisioningStep>) -> Gateway {
    Gateway {
        metadata: Some(ObjectMeta {
            name: name.into(),
            resource_version: rv,
            ..Default::default()
        }),
        spec: None,
        status: Some(GatewayStatus {
            observed_generation: observed,
            provisioning: steps,
            ..Default::default()
        }),
    }
}

fn step(name: &str, state: StepState) -> ProvisioningStep {
    ProvisioningStep { name: name.into(), state: state as i32, message: String::new() }
}

fn steps_of(g: &Gateway) -> Vec<(String, StepState)> {
    g.status.as_ref().unwrap().provisioning.iter().map(|s| (s.name.clone(), s.state())).collect()
}

async fn create_starts_unconverged_and_the_row_holds_zero(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let g = create(&mut c, gateway("edge", "ghcr.io/acme/gw:1.0")).await;
    assert_eq!(meta(&g).generation, 1);
    assert_eq!(g.status.as_ref().unwrap().observed_generation, 0);
    assert_eq!(g.status.as_ref().unwrap().phase(), Phase::Pending);
    assert!(meta(&g).resource_version > 1, "revision 1 is the bootstrap revision");
    assert!(!meta(&g).uid.is_empty());
    assert_eq!(store.raw_generations("edge").await, Some((1, 0)));
    assert_eq!(get(&mut c, "edge").await.unwrap(), g);

    let again = c
        .create_gateway(gantry_api::v1::CreateGatewayRequest {
            gateway: Some(gateway("edge", "gw")),
            validate_only: false,
        })
        .await;
    assert_eq!(again.unwrap_err().code(), Code::AlreadyExists);
    assert_eq!(get(&mut c, "missing").await.unwrap_err().code(), Code::NotFound);
}

async fn spec_change_advances_generation_by_one(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    create(&mut c, gateway("edge", "gw:1")).await;
    let g = update(&mut c, gateway("edge", "gw:2"), &["spec"]).await.unwrap();
    assert_eq!(meta(&g).generation, 2);
    let mut replicas = gateway("edge", "ignored");
    replicas.spec.as_mut().unwrap().replicas = Some(3);
    let g = update(&mut c, replicas, &["spec.replicas"]).await.unwrap();
    assert_eq!(meta(&g).generation, 3);
    assert_eq!(g.spec.as_ref().unwrap().image, "gw:2", "only the masked field changes");
    assert_eq!(store.raw_generations("edge").await, Some((3, 0)));
}

async fn metadata_only_change_keeps_generation(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let created = create(&mut c, gateway("edge", "gw:1")).await;
    let mut g = gateway("edge", "gw:ignored");
    g.metadata.as_mut().unwrap().labels.insert("team".into(), "payments".into());
    g.metadata.as_mut().unwrap().annotations.insert("note".into(), "hello".into());
    let updated = update(&mut c, g, &["metadata.labels", "metadata.annotations"]).await.unwrap();
    assert_eq!(meta(&updated).generation, 1);
    assert_eq!(meta(&updated).labels["team"], "payments");
    assert!(meta(&updated).resource_version > meta(&created).resource_version);
    assert_eq!(updated.spec, created.spec);
}

/// A wire-compatible stand-in for UpdateGatewayRequest whose map fields are
/// repeated entries, so the test controls the order entries go on the wire.
mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Entry {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Spec {
        #[prost(string, tag = "1")]
        pub image: String,
        #[prost(string, repeated, tag = "5")]
        pub server_dns_names: Vec<String>,
        #[prost(message, repeated, tag = "8")]
        pub config: Vec<Entry>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Gateway {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<gantry_api::v1::ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UpdateRequest {
        #[prost(message, optional, tag = "1")]
        pub gateway: Option<Gateway>,
        #[prost(message, optional, tag = "2")]
        pub update_mask: Option<prost_types::FieldMask>,
    }
}

async fn equal_spec_with_maps_in_another_order_keeps_generation(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let mut g = gateway("edge", "gw:1");
    let spec = g.spec.as_mut().unwrap();
    spec.config =
        [("a", "1"), ("b", "2"), ("c", "3")].map(|(k, v)| (k.to_string(), v.to_string())).into();
    spec.server_dns_names = vec!["a.example.com".into(), "b.example.com".into()];
    let created = create(&mut c, g).await;

    // Same content: config entries reversed on the wire, DNS names reordered
    // and duplicated.
    let request = wire::UpdateRequest {
        gateway: Some(wire::Gateway {
            metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
            spec: Some(wire::Spec {
                image: "gw:1".into(),
                server_dns_names: vec![
                    "b.example.com".into(),
                    "a.example.com".into(),
                    "b.example.com".into(),
                ],
                config: [("c", "3"), ("b", "2"), ("a", "1")]
                    .map(|(k, v)| wire::Entry { key: k.into(), value: v.into() })
                    .to_vec(),
            }),
        }),
        update_mask: Some(FieldMask { paths: vec!["spec".into()] }),
    };
    let mut grpc = tonic::client::Grpc::new(store.channel().await);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(request);
    req.metadata_mut().insert("authorization", format!("Bearer {EDITOR}").parse().unwrap());
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/gantry.v1.GatewayService/UpdateGateway",
    );
    let codec = tonic_prost::ProstCodec::<wire::UpdateRequest, Gateway>::default();
    let updated = grpc.unary(req, path, codec).await.unwrap().into_inner();
    assert_eq!(meta(&updated).generation, 1);
    assert_eq!(
        meta(&updated).resource_version,
        meta(&created).resource_version,
        "a no-op write spends no revision"
    );

    let mut changed = created.clone();
    changed.spec.as_mut().unwrap().config.insert("a".into(), "changed".into());
    assert_eq!(meta(&update(&mut c, changed, &["spec"]).await.unwrap()).generation, 2);
}

async fn stale_resource_version_is_aborted(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let created = create(&mut c, gateway("edge", "gw:1")).await;
    let mut first = gateway("edge", "gw:2");
    first.metadata.as_mut().unwrap().resource_version = meta(&created).resource_version;
    update(&mut c, first.clone(), &["spec"]).await.unwrap();
    first.spec.as_mut().unwrap().image = "gw:3".into();
    let err = update(&mut c, first, &["spec"]).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(field_of(&err).as_deref(), Some("gateway.metadata.resource_version"));
    assert_eq!(get(&mut c, "edge").await.unwrap().spec.unwrap().image, "gw:2");

    let stale_delete = DeleteGatewayRequest {
        name: "edge".into(),
        resource_version: meta(&created).resource_version,
        validate_only: false,
    };
    assert_eq!(c.delete_gateway(stale_delete).await.unwrap_err().code(), Code::Aborted);
}

async fn status_is_written_only_by_the_reconciler(store: &TestStore) {
    let mut editor = store.client(EDITOR).await;
    let mut viewer = store.client(VIEWER).await;
    create(&mut editor, gateway("edge", "gw:1")).await;
    let err =
        update(&mut editor, status_write("edge", 0, 1, vec![]), &["status"]).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(field_of(&err).as_deref(), Some("gateway.status"));
    let err =
        update(&mut editor, status_write("edge", 0, 1, vec![]), &["status.observed_generation"])
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = update(&mut viewer, gateway("edge", "gw:2"), &["spec"]).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let mut reconciler = store.client(RECONCILER).await;
    let err = update(&mut reconciler, gateway("edge", "gw:2"), &["spec"]).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(field_of(&err).as_deref(), Some("gateway.spec"));
    assert_eq!(store.raw_generations("edge").await, Some((1, 0)), "nothing was written");
}

async fn observed_generation_stays_in_range(store: &TestStore) {
    let mut editor = store.client(EDITOR).await;
    let mut reconciler = store.client(RECONCILER).await;
    create(&mut editor, gateway("edge", "gw:1")).await;
    update(&mut editor, gateway("edge", "gw:2"), &["spec"]).await.unwrap(); // generation 2

    let mut write = status_write("edge", 0, 1, vec![]);
    write.status.as_mut().unwrap().phase = Phase::Provisioning as i32;
    let g = update(&mut reconciler, write, &["status.observed_generation", "status.phase"])
        .await
        .unwrap();
    assert_eq!(g.status.as_ref().unwrap().observed_generation, 1);
    assert_eq!(g.status.as_ref().unwrap().phase(), Phase::Provisioning);

    let err = update(
        &mut reconciler,
        status_write("edge", 0, 3, vec![]),
        &["status.observed_generation"],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(field_of(&err).as_deref(), Some("gateway.status.observed_generation"));
    let err = update(
        &mut reconciler,
        status_write("edge", 0, 0, vec![]),
        &["status.observed_generation"],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);

    let g = update(
        &mut reconciler,
        status_write("edge", 0, 2, vec![]),
        &["status.observed_generation"],
    )
    .await
    .unwrap();
    assert_eq!(g.status.as_ref().unwrap().observed_generation, 2);
    assert_eq!(store.raw_generations("edge").await, Some((2, 2)));

    let mut conditions = status_write("edge", 0, 2, vec![]);
    conditions.status.as_mut().unwrap().conditions = vec![gantry_api::v1::Condition {
        r#type: "Ready".into(),
        status: ConditionStatus::True as i32,
        reason: "RolloutComplete".into(),
        observed_generation: 2,
        ..Default::default()
    }];
    let g = update(&mut reconciler, conditions, &["status.conditions"]).await.unwrap();
    assert!(
        g.status.unwrap().conditions[0].last_transition_time.is_some(),
        "the store stamps transitions"
    );
}

async fn steps_of_work_done_never_regress_observed_steps_follow_and_all_reset_with_generation(
    store: &TestStore,
) {
    let mut editor = store.client(EDITOR).await;
    let mut reconciler = store.client(RECONCILER).await;
    create(&mut editor, gateway("edge", "gw:1")).await;
    let paths = ["status.provisioning"];
    let forward = vec![
        step("ManifestsApplied", StepState::Complete),
        step("WorkloadAvailable", StepState::InProgress),
    ];
    update(&mut reconciler, status_write("edge", 0, 0, forward), &paths).await.unwrap();
    // A replayed older write: work done never goes back; a step of what
    // is live takes what was observed (a re-rollout at the same generation).
    let stale = vec![
        step("ManifestsApplied", StepState::Pending),
        step("WorkloadAvailable", StepState::Pending),
    ];
    let g = update(&mut reconciler, status_write("edge", 0, 0, stale), &paths).await.unwrap();
    assert_eq!(
        steps_of(&g),
        [
            ("ManifestsApplied".into(), StepState::Complete),
            ("WorkloadAvailable".into(), StepState::Pending)
        ]
    );
    // FAILED shows, and can recover.
    let g = update(
        &mut reconciler,
        status_write("edge", 0, 0, vec![step("WorkloadAvailable", StepState::Failed)]),
        &paths,
    )
    .await
    .unwrap();
    assert_eq!(steps_of(&g)[1].1, StepState::Failed);
    assert_eq!(steps_of(&g)[0].1, StepState::Complete, "an unmentioned step is kept");
    let g = update(
        &mut reconciler,
        status_write("edge", 0, 0, vec![step("WorkloadAvailable", StepState::Complete)]),
        &paths,
    )
    .await
    .unwrap();
    assert_eq!(steps_of(&g)[1].1, StepState::Complete);

    let g = update(&mut editor, gateway("edge", "gw:2"), &["spec"]).await.unwrap();
    assert_eq!(meta(&g).generation, 2);
    assert!(steps_of(&g).is_empty(), "a generation advance clears provisioning");
}

async fn delete_waits_for_finalizers(store: &TestStore) {
    let mut editor = store.client(EDITOR).await;
    let mut reconciler = store.client(RECONCILER).await;
    create(&mut editor, gateway("edge", "gw:1")).await;
    let mut claim = gateway("edge", "");
    claim.metadata.as_mut().unwrap().finalizers = vec!["gantry.dev/cleanup".into()];
    update(&mut reconciler, claim, &["metadata.finalizers"]).await.unwrap();

    let deleting = editor
        .delete_gateway(DeleteGatewayRequest {
            name: "edge".into(),
            resource_version: 0,
            validate_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(meta(&deleting).delete_time.is_some());
    assert_eq!(deleting.status.as_ref().unwrap().phase(), Phase::Deleting);
    let still = get(&mut editor, "edge").await.unwrap();
    assert_eq!(still.status.as_ref().unwrap().phase(), Phase::Deleting);
    let err = update(&mut editor, gateway("edge", "gw:2"), &["spec"]).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "no spec change while deleting");

    let release = gateway("edge", "");
    update(&mut reconciler, release, &["metadata.finalizers"]).await.unwrap();
    assert_eq!(get(&mut editor, "edge").await.unwrap_err().code(), Code::NotFound);
    assert_eq!(store.raw_generations("edge").await, None);

    create(&mut editor, gateway("plain", "gw:1")).await;
    editor
        .delete_gateway(DeleteGatewayRequest {
            name: "plain".into(),
            resource_version: 0,
            validate_only: false,
        })
        .await
        .unwrap();
    assert_eq!(get(&mut editor, "plain").await.unwrap_err().code(), Code::NotFound);
    let err = editor
        .delete_gateway(DeleteGatewayRequest {
            name: "plain".into(),
            resource_version: 0,
            validate_only: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

async fn list_all(c: &mut Client, selector: &str, page_size: i32) -> (Vec<String>, Vec<i64>) {
    let (mut names, mut revisions, mut token) = (Vec::new(), Vec::new(), String::new());
    loop {
        let page = c
            .list_gateways(ListGatewaysRequest {
                page_size,
                page_token: token,
                label_selector: selector.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.gateways.len() <= usize::try_from(page_size).unwrap());
        names.extend(page.gateways.iter().map(|g| meta(g).name.clone()));
        revisions.push(page.resource_version);
        if page.next_page_token.is_empty() {
            return (names, revisions);
        }
        token = page.next_page_token;
    }
}

async fn pagination_returns_every_row_exactly_once(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let mut expected = Vec::new();
    for i in 0..23 {
        let name = format!("gw-{i:02}");
        create(&mut c, gateway(&name, "gw:1")).await;
        expected.push(name);
    }
    let (names, revisions) = list_all(&mut c, "", 5).await;
    assert_eq!(names, expected);
    assert_eq!(revisions.len(), 5);
    assert!(revisions.iter().all(|r| *r == revisions[0] && *r > 1), "{revisions:?}");

    // Writes between pages: rows that exist throughout still come once.
    let first = c
        .list_gateways(ListGatewaysRequest { page_size: 10, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    create(&mut c, gateway("aaa-new", "gw:1")).await;
    update(&mut c, gateway("gw-15", "gw:2"), &["spec"]).await.unwrap();
    let mut names: Vec<String> = first.gateways.iter().map(|g| meta(g).name.clone()).collect();
    let mut token = first.next_page_token;
    while !token.is_empty() {
        let page = c
            .list_gateways(ListGatewaysRequest {
                page_size: 10,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        names.extend(page.gateways.iter().map(|g| meta(g).name.clone()));
        token = page.next_page_token;
    }
    assert_eq!(names, expected);

    let bad = c
        .list_gateways(ListGatewaysRequest { page_token: "garbage!".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(
        (bad.code(), field_of(&bad).as_deref()),
        (Code::InvalidArgument, Some("page_token"))
    );
    let bad = c
        .list_gateways(ListGatewaysRequest { page_size: -1, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(field_of(&bad).as_deref(), Some("page_size"));
}

async fn label_selectors_filter_on_the_server(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    for (name, labels) in [
        ("a", vec![("env", "prod"), ("tier", "edge")]),
        ("b", vec![("env", "staging")]),
        ("c", vec![("env", "dev"), ("tier", "core")]),
        ("d", vec![]),
    ] {
        let mut g = gateway(name, "gw:1");
        g.metadata.as_mut().unwrap().labels =
            labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        create(&mut c, g).await;
    }
    let cases = [
        ("env=prod", vec!["a"]),
        ("env==staging", vec!["b"]),
        ("env!=prod", vec!["b", "c", "d"]),
        ("env in (prod, dev)", vec!["a", "c"]),
        ("env notin (prod,dev)", vec!["b", "d"]),
        ("tier", vec!["a", "c"]),
        ("!tier", vec!["b", "d"]),
        ("env,tier=core", vec!["c"]),
        ("", vec!["a", "b", "c", "d"]),
    ];
    for (selector, expected) in cases {
        let (names, _) = list_all(&mut c, selector, 1).await;
        assert_eq!(names, expected, "{selector}");
    }
    let err = c
        .list_gateways(ListGatewaysRequest {
            label_selector: "env in (prod".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), field_of(&err).as_deref()),
        (Code::InvalidArgument, Some("label_selector"))
    );
}

async fn invalid_requests_name_the_field(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let cases: Vec<(Gateway, &str)> = vec![
        (gateway("Bad_Name", "gw:1"), "gateway.metadata.name"),
        // Its Service is named after it: an RFC 1035 label.
        (gateway("1edge", "gw:1"), "gateway.metadata.name"),
        (
            Gateway {
                spec: Some(GatewaySpec {
                    image: "gw".into(),
                    resources: Some(gantry_api::v1::ResourceRequirements {
                        requests: [("memory".to_string(), "1Gi".to_string())].into(),
                        limits: [("memory".to_string(), "512Mi".to_string())].into(),
                    }),
                    ..Default::default()
                }),
                ..gateway("edge", "")
            },
            "gateway.spec.resources.requests[\"memory\"]",
        ),
        (gateway("edge", "Not An Image"), "gateway.spec.image"),
        (gateway("edge", ""), "gateway.spec.image"),
        (
            Gateway {
                spec: Some(GatewaySpec {
                    replicas: Some(-1),
                    image: "gw".into(),
                    ..Default::default()
                }),
                ..gateway("edge", "")
            },
            "gateway.spec.replicas",
        ),
        (
            Gateway {
                spec: Some(GatewaySpec {
                    image: "gw".into(),
                    oidc: Some(gantry_api::v1::Oidc {
                        issuer_url: "http://idp".into(),
                        client_id: "c".into(),
                        audiences: vec![],
                    }),
                    ..Default::default()
                }),
                ..gateway("edge", "")
            },
            "gateway.spec.oidc.issuer_url",
        ),
        (
            Gateway {
                spec: Some(GatewaySpec {
                    image: "gw".into(),
                    server_dns_names: (0..101).map(|i| format!("h{i}.example.com")).collect(),
                    ..Default::default()
                }),
                ..gateway("edge", "")
            },
            "gateway.spec.server_dns_names",
        ),
        (Gateway { spec: None, ..gateway("edge", "") }, "gateway.spec"),
    ];
    for (g, field) in cases {
        let err = c
            .create_gateway(gantry_api::v1::CreateGatewayRequest {
                gateway: Some(g),
                validate_only: false,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert_eq!(field_of(&err).as_deref(), Some(field), "{err:?}");
    }
    let err = c
        .create_gateway(gantry_api::v1::CreateGatewayRequest {
            gateway: None,
            validate_only: false,
        })
        .await
        .unwrap_err();
    assert_eq!(field_of(&err).as_deref(), Some("gateway"));

    create(&mut c, gateway("edge", "gw:1")).await;
    let err = update(&mut c, gateway("edge", "gw:2"), &[]).await.unwrap_err();
    assert_eq!(field_of(&err).as_deref(), Some("update_mask"));
    let err = update(&mut c, gateway("edge", "gw:2"), &["spec", "metadata.uid"]).await.unwrap_err();
    assert_eq!(field_of(&err).as_deref(), Some("update_mask.paths[1]"));
    let err = update(&mut c, gateway("edge", "UPPER"), &["spec.image"]).await.unwrap_err();
    assert_eq!(field_of(&err).as_deref(), Some("gateway.spec.image"));
    let err = get(&mut c, "").await.unwrap_err();
    assert_eq!((err.code(), field_of(&err).as_deref()), (Code::InvalidArgument, Some("name")));
    assert_eq!(
        get(&mut c, "edge").await.unwrap().spec.unwrap().image,
        "gw:1",
        "nothing was stored"
    );

    let huge = GatewaySpec {
        image: "gw".into(),
        config: [("big".to_string(), "x".repeat(2 << 20))].into(),
        ..Default::default()
    };
    let err = c
        .create_gateway(gantry_api::v1::CreateGatewayRequest {
            gateway: Some(Gateway { spec: Some(huge), ..gateway("big", "") }),
            validate_only: false,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::ResourceExhausted | Code::OutOfRange | Code::InvalidArgument),
        "{err:?}"
    );
    assert_eq!(get(&mut c, "big").await.unwrap_err().code(), Code::NotFound);
}

async fn calls_without_a_valid_token_are_unauthenticated(store: &TestStore) {
    for token in ["", "not-a-known-token-at-all"] {
        let mut c = store.client(token).await;
        let err = get(&mut c, "edge").await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{token:?}");
        let err = c
            .create_gateway(gantry_api::v1::CreateGatewayRequest {
                gateway: Some(gateway("edge", "gw")),
                validate_only: false,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let err = c.list_gateways(ListGatewaysRequest::default()).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
    }
    let mut viewer = store.client(VIEWER).await;
    let err = viewer
        .create_gateway(gantry_api::v1::CreateGatewayRequest {
            gateway: Some(gateway("edge", "gw")),
            validate_only: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(
        viewer
            .list_gateways(ListGatewaysRequest::default())
            .await
            .unwrap()
            .into_inner()
            .gateways
            .len(),
        0
    );
}

/// 32 clients race spec changes on one gateway with resource_version
/// preconditions: every acknowledged change is kept and counted once.
async fn concurrent_spec_updates_lose_nothing(store: &TestStore) {
    const CLIENTS: usize = 32;
    const CHANGES_PER_CLIENT: usize = 3;
    let mut c = store.client(EDITOR).await;
    create(&mut c, gateway("hot", "gw:0")).await;
    let events_before = store.event_revisions().await.len();

    let mut tasks = Vec::new();
    for client_id in 0..CLIENTS {
        let mut c = store.client(if client_id % 2 == 0 { EDITOR } else { ADMIN }).await;
        tasks.push(tokio::spawn(async move {
            let (mut acks, mut aborted) = (Vec::new(), 0);
            while acks.len() < CHANGES_PER_CLIENT {
                let current = get(&mut c, "hot").await.unwrap();
                let image = format!("gw:c{client_id}-{}", acks.len());
                let mut next = gateway("hot", &image);
                next.metadata.as_mut().unwrap().resource_version = meta(&current).resource_version;
                match update(&mut c, next, &["spec"]).await {
                    Ok(g) => acks.push((meta(&g).generation, image)),
                    Err(e) if e.code() == Code::Aborted => aborted += 1,
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            (acks, aborted)
        }));
    }
    let mut acks = Vec::new();
    let mut aborted = 0;
    for t in tasks {
        let (a, b) = t.await.unwrap();
        acks.extend(a);
        aborted += b;
    }
    acks.sort();
    let accepted = acks.len();
    assert_eq!(accepted, CLIENTS * CHANGES_PER_CLIENT);
    let generations: Vec<i64> = acks.iter().map(|(g, _)| *g).collect();
    let expected: Vec<i64> = (2..=i64::try_from(accepted).unwrap() + 1).collect();
    assert_eq!(generations, expected, "each acknowledged change has its own generation");

    let last = get(&mut c, "hot").await.unwrap();
    assert_eq!(meta(&last).generation, 1 + i64::try_from(accepted).unwrap());
    assert_eq!(
        last.spec.unwrap().image,
        acks.last().unwrap().1,
        "the newest acknowledged change is the stored one"
    );

    let revisions = store.event_revisions().await;
    assert_eq!(revisions.len() - events_before, accepted, "one event per acknowledged change");
    assert!(revisions.windows(2).all(|w| w[1] == w[0] + 1), "revisions are gap-free");
    eprintln!("{:?}: {accepted} accepted, {aborted} aborted by the precondition", store.backend);
}

async fn health_and_readiness_answer(store: &TestStore) {
    let mut health = tonic_health::pb::health_client::HealthClient::new(store.channel().await);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest { service: "gantry.v1.GatewayService".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);

    // Reflection answers without a token, in both protocol versions.
    for v1alpha in [false, true] {
        let names = reflected_services(store, v1alpha).await;
        assert!(names.contains(&"gantry.v1.GatewayService".to_string()), "{names:?}");
    }

    let mut c = store.client(EDITOR).await;
    get(&mut c, "nothing").await.unwrap_err();
    let ready = http_get(store.http, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = http_get(store.http, "/metrics").await;
    assert!(
        metrics.contains(
            "gantry_store_grpc_requests_total{method=\"GetGateway\",code=\"NOT_FOUND\"} 1"
        ),
        "{metrics}"
    );
}

async fn reflected_services(store: &TestStore, v1alpha: bool) -> Vec<String> {
    use tonic_reflection::pb::{v1, v1alpha as alpha};
    let channel = store.channel().await;
    if v1alpha {
        let mut client = alpha::server_reflection_client::ServerReflectionClient::new(channel);
        let request = alpha::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(alpha::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        let mut stream = client
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        match stream.message().await.unwrap().unwrap().message_response.unwrap() {
            alpha::server_reflection_response::MessageResponse::ListServicesResponse(list) => {
                list.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("{other:?}"),
        }
    } else {
        let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel);
        let request = v1::ServerReflectionRequest {
            host: String::new(),
            message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            )),
        };
        let mut stream = client
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        match stream.message().await.unwrap().unwrap().message_response.unwrap() {
            v1::server_reflection_response::MessageResponse::ListServicesResponse(list) => {
                list.service.into_iter().map(|s| s.name).collect()
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The reconciler's failure record (count, the inputs it counts for, the
/// next retry time, the message) survives in the stored status, so a
/// restarted reconciler or a new leader reads it back; a later spec change
/// does not wipe it (the reconciler decides what new inputs mean).
async fn the_failure_record_round_trips_through_the_store(store: &TestStore) {
    let mut editor = store.client(EDITOR).await;
    let mut reconciler = store.client(RECONCILER).await;
    create(&mut editor, gateway("edge", "gw:1")).await;
    let record = GatewayStatus {
        failure_count: 3,
        failed_inputs: "f".repeat(64),
        next_retry_time: Some(prost_types::Timestamp { seconds: 1_800_000_000, nanos: 5 }),
        message: format!("apply failed: {}", "x".repeat(8 * 1024)),
        ..Default::default()
    };
    let paths = [
        "status.failure_count",
        "status.failed_inputs",
        "status.next_retry_time",
        "status.message",
    ];
    let mut g = gateway("edge", "gw:1");
    g.spec = None;
    g.status = Some(record.clone());
    update(&mut reconciler, g, &paths).await.unwrap();
    let mut editor_change = gateway("edge", "gw:2");
    editor_change.metadata.as_mut().unwrap().labels.insert("team".into(), "a".into());
    update(&mut editor, editor_change, &["spec", "metadata.labels"]).await.unwrap();
    let stored = get(&mut editor, "edge").await.unwrap().status.unwrap();
    assert_eq!(
        (stored.failure_count, stored.failed_inputs, stored.next_retry_time, stored.message),
        (record.failure_count, record.failed_inputs, record.next_retry_time, record.message)
    );
    let mut too_long = gateway("edge", "gw:2");
    too_long.spec = None;
    too_long.status = Some(GatewayStatus { failed_inputs: "f".repeat(200), ..Default::default() });
    let refused = update(&mut reconciler, too_long, &["status.failed_inputs"]).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(field_of(&refused).as_deref(), Some("gateway.status.failed_inputs"));
}

/// The store revision, as a list reports it.
async fn revision(client: &mut Client) -> i64 {
    let request = ListGatewaysRequest { page_size: 1, ..Default::default() };
    client.list_gateways(request).await.unwrap().into_inner().resource_version
}

/// The code, message and details of a refusal: what a dry run must answer
/// exactly as the real write does.
fn refusal(result: Result<tonic::Response<Gateway>, Status>) -> (Code, String, Option<String>) {
    let status = result.unwrap_err();
    (status.code(), status.message().to_string(), field_of(&status))
}

async fn validate_only_runs_every_rule_and_stores_nothing(store: &TestStore) {
    use gantry_api::v1::CreateGatewayRequest;
    let mut c = store.client(EDITOR).await;
    let existing = create(&mut c, gateway("edge", "ghcr.io/acme/gw:1.0")).await;
    let (at, events) = (revision(&mut c).await, store.event_revisions().await);
    let unchanged = |c: &mut Client| {
        let mut c = c.clone();
        async move { (revision(&mut c).await, get(&mut c, "edge").await.unwrap()) }
    };

    // Create: the would-be object, and nothing stored.
    let dry = |g: Gateway| CreateGatewayRequest { gateway: Some(g), validate_only: true };
    let would = c.create_gateway(dry(gateway("tail", "ghcr.io/acme/gw:2"))).await.unwrap();
    let would = would.into_inner();
    assert_eq!((meta(&would).name.as_str(), meta(&would).generation), ("tail", 1));
    assert_eq!(meta(&would).resource_version, 0, "no revision spent");
    assert_eq!(would.status.as_ref().unwrap().phase(), Phase::Pending);
    assert_eq!(get(&mut c, "tail").await.unwrap_err().code(), Code::NotFound);

    // The same refusals as a real create.
    let bad = gateway("bad", "Not An Image");
    for (g, code) in [
        (gateway("edge", "ghcr.io/acme/gw:1.0"), Code::AlreadyExists),
        (bad, Code::InvalidArgument),
    ] {
        let real = refusal(
            c.create_gateway(CreateGatewayRequest {
                gateway: Some(g.clone()),
                validate_only: false,
            })
            .await,
        );
        let dry_run = refusal(c.create_gateway(dry(g)).await);
        assert_eq!(dry_run, real);
        assert_eq!(real.0, code);
    }
    let mut viewer = store.client(VIEWER).await;
    let real = refusal(
        viewer
            .create_gateway(CreateGatewayRequest {
                gateway: Some(gateway("v", "ghcr.io/a/b:1")),
                validate_only: false,
            })
            .await,
    );
    assert_eq!(refusal(viewer.create_gateway(dry(gateway("v", "ghcr.io/a/b:1"))).await), real);
    assert_eq!(real.0, Code::PermissionDenied);

    // Update: the would-be spec and generation; the stored one stays.
    let mut changed = existing.clone();
    changed.spec.as_mut().unwrap().image = "ghcr.io/acme/gw:1.1".into();
    let mask = || Some(FieldMask { paths: vec!["spec".into()] });
    let request = |g: Gateway, validate_only| UpdateGatewayRequest {
        gateway: Some(g),
        update_mask: mask(),
        validate_only,
    };
    let would = c.update_gateway(request(changed.clone(), true)).await.unwrap().into_inner();
    assert_eq!(would.spec.as_ref().unwrap().image, "ghcr.io/acme/gw:1.1");
    assert_eq!(meta(&would).generation, 2);
    assert_eq!(meta(&would).resource_version, meta(&existing).resource_version);
    let mut stale = changed.clone();
    stale.metadata.as_mut().unwrap().resource_version = 1;
    let real = refusal(c.update_gateway(request(stale.clone(), false)).await);
    assert_eq!(refusal(c.update_gateway(request(stale, true)).await), real);
    assert_eq!(real.0, Code::Aborted);

    // Delete: the would-be deletion; the gateway stays as it was.
    let delete = |validate_only| DeleteGatewayRequest {
        name: "edge".into(),
        resource_version: 0,
        validate_only,
    };
    let would = c.delete_gateway(delete(true)).await.unwrap().into_inner();
    assert!(meta(&would).delete_time.is_some(), "{would:?}");
    let missing = |validate_only| DeleteGatewayRequest {
        name: "nobody".into(),
        resource_version: 0,
        validate_only,
    };
    let real = refusal(c.delete_gateway(missing(false)).await);
    assert_eq!(refusal(c.delete_gateway(missing(true)).await), real);
    assert_eq!(real.0, Code::NotFound);

    assert_eq!(unchanged(&mut c).await, (at, existing.clone()), "a dry run changed the store");
    assert_eq!(store.event_revisions().await, events, "a dry run wrote an event");
    // The next real write takes the very next revision: none was spent.
    let real = c.update_gateway(request(changed, false)).await.unwrap().into_inner();
    assert_eq!(meta(&real).resource_version, at + 1);
    assert_eq!(meta(&real).generation, 2);
}

/// Dry runs in the same batches as real writes, on gateways of several KB:
/// the real writes take exactly one revision and one event each, the dry
/// runs none, and nothing a dry run proposed is ever stored.
async fn dry_runs_racing_real_writes_spend_nothing(store: &TestStore) {
    use gantry_api::v1::CreateGatewayRequest;
    const NAMES: [&str; 4] = ["a", "b", "c", "d"];
    const ROUNDS: usize = 20;
    let big = |name: &str, image: &str| {
        let mut g = gateway(name, image);
        let config = (0..64).map(|i| (format!("key-{i:02}"), "x".repeat(64))).collect();
        g.spec.as_mut().unwrap().config = config;
        g
    };
    let mut c = store.client(EDITOR).await;
    for name in NAMES {
        create(&mut c, big(name, "ghcr.io/acme/real:0")).await;
    }
    let (base, events_before) = (revision(&mut c).await, store.event_revisions().await.len());
    let mask = || Some(FieldMask { paths: vec!["spec".into()] });
    let mut tasks = Vec::new();
    for (i, name) in NAMES.into_iter().enumerate() {
        let mut real = store.client(EDITOR).await;
        let mut dry = store.client(EDITOR).await;
        tasks.push(tokio::spawn(async move {
            for round in 1..=ROUNDS {
                let image = format!("ghcr.io/acme/real:{round}");
                let request = UpdateGatewayRequest {
                    gateway: Some(big(name, &image)),
                    update_mask: mask(),
                    validate_only: false,
                };
                real.update_gateway(request).await.unwrap();
            }
        }));
        tasks.push(tokio::spawn(async move {
            for round in 1..=ROUNDS {
                let image = format!("ghcr.io/acme/dry:{round}");
                let request = UpdateGatewayRequest {
                    gateway: Some(big(name, &image)),
                    update_mask: mask(),
                    validate_only: true,
                };
                let would = dry.update_gateway(request).await.unwrap().into_inner();
                assert_eq!(would.spec.unwrap().image, image, "the would-be spec is answered");
                let fresh = format!("fresh-{i}-{round}");
                let create = CreateGatewayRequest {
                    gateway: Some(big(&fresh, &image)),
                    validate_only: true,
                };
                assert_eq!(
                    meta(&dry.create_gateway(create).await.unwrap().into_inner()).resource_version,
                    0
                );
                let delete = DeleteGatewayRequest {
                    name: name.into(),
                    resource_version: 0,
                    validate_only: true,
                };
                dry.delete_gateway(delete).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let writes = NAMES.len() * ROUNDS;
    assert_eq!(revision(&mut c).await, base + writes as i64, "only the real writes took revisions");
    let events = store.event_revisions().await;
    assert_eq!(events.len(), events_before + writes, "only the real writes wrote events");
    let (gateways, _) = {
        let request = ListGatewaysRequest { page_size: 100, ..Default::default() };
        let page = c.list_gateways(request).await.unwrap().into_inner();
        (page.gateways, page.resource_version)
    };
    let stored: Vec<(String, String, i64)> = gateways
        .iter()
        .map(|g| (meta(g).name.clone(), g.spec.as_ref().unwrap().image.clone(), meta(g).generation))
        .collect();
    let expected: Vec<(String, String, i64)> = NAMES
        .iter()
        .map(|n| (n.to_string(), format!("ghcr.io/acme/real:{ROUNDS}"), 1 + ROUNDS as i64))
        .collect();
    assert_eq!(stored, expected, "every gateway as the real writer left it, nothing of a dry run");
}

/// `0.25` and `250m` are one amount: respelling a quantity is no new
/// generation and spends no revision, and the stored spec keeps what the
/// user wrote first; another amount is a new generation.
async fn a_respelled_quantity_keeps_generation_and_what_was_written(store: &TestStore) {
    let mut c = store.client(EDITOR).await;
    let with_cpu = |cpu: &str| {
        let mut g = gateway("edge", "gw:1");
        g.spec.as_mut().unwrap().resources = Some(gantry_api::v1::ResourceRequirements {
            requests: [("cpu".to_string(), cpu.to_string())].into(),
            limits: [("memory".to_string(), "1Gi".to_string())].into(),
        });
        g
    };
    let created = create(&mut c, with_cpu("0.25")).await;
    let mut respelled = with_cpu("250m");
    respelled.spec.as_mut().unwrap().resources.as_mut().unwrap().limits =
        [("memory".to_string(), "1024Mi".to_string())].into();
    let same = update(&mut c, respelled, &["spec"]).await.unwrap();
    assert_eq!(meta(&same).generation, 1);
    assert_eq!(meta(&same).resource_version, meta(&created).resource_version, "no write");
    let stored = get(&mut c, "edge").await.unwrap().spec.unwrap().resources.unwrap();
    assert_eq!(
        (stored.requests["cpu"].as_str(), stored.limits["memory"].as_str()),
        ("0.25", "1Gi")
    );
    let more = update(&mut c, with_cpu("0.3"), &["spec"]).await.unwrap();
    assert_eq!(meta(&more).generation, 2);
}

/// A write that changes the spec and sets `observed_generation` (an admin
/// may do both) is range-checked against the generation it makes; a
/// status write that names only the phase keeps `observed_generation`.
async fn the_range_check_sees_its_own_write_and_a_phase_write_keeps_observed(store: &TestStore) {
    let mut editor = store.client(EDITOR).await;
    let mut admin = store.client(ADMIN).await;
    let mut reconciler = store.client(RECONCILER).await;
    create(&mut editor, gateway("edge", "gw:1")).await;
    let both = |image: &str, observed: i64| {
        let mut g = gateway("edge", image);
        g.status = status_write("edge", 0, observed, vec![]).status;
        g
    };
    let paths = ["spec", "status.observed_generation"];
    let g = update(&mut admin, both("gw:2", 2), &paths).await.unwrap();
    assert_eq!((meta(&g).generation, g.status.as_ref().unwrap().observed_generation), (2, 2));
    let err = update(&mut admin, both("gw:3", 4), &paths).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(field_of(&err).as_deref(), Some("gateway.status.observed_generation"));
    assert_eq!(meta(&get(&mut admin, "edge").await.unwrap()).generation, 2, "nothing written");

    let mut phase = status_write("edge", 0, 0, vec![]);
    phase.status.as_mut().unwrap().phase = Phase::Running as i32;
    let g = update(&mut reconciler, phase, &["status.phase"]).await.unwrap();
    let status = g.status.unwrap();
    assert_eq!((status.phase(), status.observed_generation), (Phase::Running, 2));
    assert_eq!(store.raw_generations("edge").await, Some((2, 2)));
}

on_both_backends!(
    the_range_check_sees_its_own_write_and_a_phase_write_keeps_observed,
    a_respelled_quantity_keeps_generation_and_what_was_written,
    validate_only_runs_every_rule_and_stores_nothing,
    dry_runs_racing_real_writes_spend_nothing,
    the_failure_record_round_trips_through_the_store,
    create_starts_unconverged_and_the_row_holds_zero,
    spec_change_advances_generation_by_one,
    metadata_only_change_keeps_generation,
    equal_spec_with_maps_in_another_order_keeps_generation,
    stale_resource_version_is_aborted,
    status_is_written_only_by_the_reconciler,
    observed_generation_stays_in_range,
    steps_of_work_done_never_regress_observed_steps_follow_and_all_reset_with_generation,
    delete_waits_for_finalizers,
    pagination_returns_every_row_exactly_once,
    label_selectors_filter_on_the_server,
    invalid_requests_name_the_field,
    calls_without_a_valid_token_are_unauthenticated,
    concurrent_spec_updates_lose_nothing,
    health_and_readiness_answer,
);

mod writer_thread {
    //! The writer's batches run on a thread of their own and through the
    //! storage's writer connections ([`Storage::for_writer`]), so their
    //! round trips to the database do not wait behind the runtime's other
    //! tasks (HTTP/2 connections writing pages of lists).

    use std::sync::{Arc, Mutex};

    use super::common::hooked::Hooked;
    use super::*;

    /// Where each batch ran: the thread's name and the storage it went
    /// through (`"writer"` for the one [`Storage::for_writer`] gave).
    type Seen = Arc<Mutex<Vec<(Option<String>, &'static str)>>>;

    async fn batches_run_on_the_writer_thread_through_its_own_connections(backend: Backend) {
        let seen = Seen::default();
        let recording = seen.clone();
        let wrap = Hooked::wrap(Arc::new(move |role, _, outcome| {
            let thread = std::thread::current().name().map(str::to_string);
            recording.lock().unwrap().push((thread, role));
            outcome
        }));
        let Some(store) = TestStore::start_wrapped(backend, test_watch_settings(), wrap).await
        else {
            return;
        };
        let mut editor = store.client(EDITOR).await;
        for name in ["a", "b", "c"] {
            create(&mut editor, gateway(name, "img:1")).await;
        }
        let b = get(&mut editor, "b").await.unwrap();
        let mut changed = b.clone();
        changed.spec.as_mut().unwrap().image = "img:2".into();
        update(&mut editor, changed, &["spec.image"]).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert!(!seen.is_empty(), "no batch recorded");
        let writer = (Some(gantry_store::writer::THREAD.to_string()), "writer");
        assert!(seen.iter().all(|s| *s == writer), "{seen:?}");
        if backend == Backend::Postgres {
            // The batches committed on the writer's own connection, not on
            // one of the pool the request handlers read through.
            use sqlx::Connection as _;
            let mut c = sqlx::PgConnection::connect(&store.database.url).await.unwrap();
            let sql = "SELECT application_name, query FROM pg_stat_activity                 WHERE datname = current_database() AND pid <> pg_backend_pid()";
            let backends: Vec<(String, String)> =
                sqlx::query_as(sql).fetch_all(&mut c).await.unwrap();
            let writer = gantry_store::storage::postgres::WRITER_APPLICATION;
            let on_writer: Vec<&String> =
                backends.iter().filter(|(name, _)| name == writer).map(|(_, q)| q).collect();
            assert_eq!(on_writer.len(), 1, "one writer connection: {backends:?}");
            // The last batch's write (a statement that commits on its own,
            // shown cut to 1 KiB) was the writer connection's last one.
            assert!(
                on_writer[0].starts_with("WITH revision AS (UPDATE store_revision"),
                "{backends:?}"
            );
        }
        store.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        batches_run_on_the_writer_thread_through_its_own_connections(Backend::Sqlite).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        batches_run_on_the_writer_thread_through_its_own_connections(Backend::Postgres).await;
    }
}
