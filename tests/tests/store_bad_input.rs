//! A corpus of hostile requests, sent as raw bytes over gRPC to a
//! gateway-store process: each gets a clear error with the right code (and
//! the offending field where there is one), and nothing is stored.
#![allow(clippy::unwrap_used)]

use gantry_api::v1::{
    CreateGatewayRequest, Gateway, GatewaySpec, GatewayStatus, GetGatewayRequest,
    ListGatewaysRequest, UpdateGatewayRequest,
};
use gantry_client::ClientConfig;
use gantry_testkit::gateway::named;
use gantry_testkit::{temp_dir, StoreProcess};
use prost::Message;
use tonic::Code;

async fn raw_call(endpoint: &str, method: &str, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let channel = gantry_testkit::raw_grpc::connect(endpoint).await;
    gantry_testkit::raw_grpc::call(channel, method, body, None).await
}

fn image() -> GatewaySpec {
    GatewaySpec { image: "ghcr.io/acme/gw:1".into(), ..Default::default() }
}

fn create(g: Gateway) -> Vec<u8> {
    CreateGatewayRequest { gateway: Some(g), validate_only: false }.encode_to_vec()
}

/// Replaces the first occurrence of `from` (same length) in `bytes`.
fn patch(mut bytes: Vec<u8>, from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
    bytes[at..at + from.len()].copy_from_slice(to);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_clear_errors_and_store_nothing() {
    let dir = temp_dir("bad-input");
    let url = format!("sqlite://{}", dir.join("gantry.db").display());
    let store = StoreProcess::start(&url, &dir);
    let endpoint = store.endpoint();
    let mut client =
        ClientConfig { endpoint: endpoint.clone(), ..Default::default() }.connect_lazy().unwrap();
    client
        .create_gateway(CreateGatewayRequest {
            gateway: Some(named("kept").with_spec(image()).build()),
            validate_only: false,
        })
        .await
        .unwrap();
    let kept =
        client.get_gateway(GetGatewayRequest { name: "kept".into() }).await.unwrap().into_inner();

    let mut many_labels = named("labels").with_spec(image()).build();
    many_labels.metadata.as_mut().unwrap().labels =
        (0..20_000).map(|i| (format!("k{i}"), "v".to_string())).collect();
    let mut huge_config = image();
    huge_config.config = (0..20_000).map(|i| (format!("key-{i}"), "value".to_string())).collect();
    let mut unknown_phase = kept.clone();
    unknown_phase.status =
        Some(GatewayStatus { phase: 99, observed_generation: 1, ..Default::default() });
    let mut bad_keys = named("badkeys").with_spec(image()).build();
    bad_keys.metadata.as_mut().unwrap().labels =
        (0..60).map(|i| (format!("{i}/{}", "K".repeat(300)), "v".to_string())).collect();
    let mut deep = create(named("deep").with_spec(image()).build());
    // Unknown field 15 as a group nested 200 deep (prost's limit is 100).
    deep.extend(std::iter::repeat_n(0x7b_u8, 200));
    deep.extend(std::iter::repeat_n(0x7c_u8, 200));
    let oversized = create(
        named("oversized")
            .with_spec(GatewaySpec {
                config: [("big".to_string(), "x".repeat(2 << 20))].into(),
                ..image()
            })
            .build(),
    );

    // (case, method, body, expected code, text the message must hold)
    let corpus: Vec<(&str, &str, Vec<u8>, Code, &str)> = vec![
        (
            "invalid UTF-8 in the name",
            "CreateGateway",
            patch(create(named("utf8xx").with_spec(image()).build()), b"utf8xx", b"utf8\xff\xfe"),
            Code::InvalidArgument,
            "ObjectMeta.name",
        ),
        (
            "truncated message",
            "CreateGateway",
            create(named("truncated").with_spec(image()).build())[..9].to_vec(),
            Code::InvalidArgument,
            "protobuf",
        ),
        (
            "nesting beyond the recursion limit",
            "CreateGateway",
            deep,
            Code::InvalidArgument,
            "recursion",
        ),
        (
            "message over the 1 MiB request limit",
            "CreateGateway",
            oversized,
            Code::ResourceExhausted,
            "too large",
        ),
        (
            "20,000 labels",
            "CreateGateway",
            create(many_labels),
            Code::InvalidArgument,
            "gateway.metadata.labels",
        ),
        (
            "20,000 config entries (over 256 KiB)",
            "CreateGateway",
            create(named("config").with_spec(huge_config).build()),
            Code::InvalidArgument,
            "gateway.spec.config",
        ),
        (
            "negative replicas",
            "CreateGateway",
            create(
                named("negative").with_spec(GatewaySpec { replicas: Some(-1), ..image() }).build(),
            ),
            Code::InvalidArgument,
            "gateway.spec.replicas",
        ),
        (
            "unknown enum value",
            "UpdateGateway",
            UpdateGatewayRequest {
                gateway: Some(unknown_phase),
                update_mask: Some(prost_types::FieldMask { paths: vec!["status".into()] }),
                validate_only: false,
            }
            .encode_to_vec(),
            Code::InvalidArgument,
            "gateway.status.phase",
        ),
        (
            "name of 10,000 characters",
            "CreateGateway",
            create(named(&"a".repeat(10_000)).with_spec(image()).build()),
            Code::InvalidArgument,
            "gateway.metadata.name",
        ),
        (
            "60 invalid label keys of 300 characters",
            "CreateGateway",
            create(bad_keys),
            Code::InvalidArgument,
            "gateway.metadata.labels",
        ),
        (
            "not protobuf at all",
            "ListGateways",
            b"\xff\xff\xff\xff".to_vec(),
            Code::InvalidArgument,
            "protobuf",
        ),
    ];
    let mut wrong = Vec::new();
    for (case, method, body, code, text) in corpus {
        match raw_call(&endpoint, method, body).await {
            Ok(_) => wrong.push(format!("{case}: accepted")),
            Err(s) if s.code() != code || !s.message().contains(text) => wrong.push(format!(
                "{case}: {:?} {:?}, want {code:?} mentioning {text:?}",
                s.code(),
                s.message()
            )),
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Nothing stored, nothing changed, and the store still answers.
    let listed = client.list_gateways(ListGatewaysRequest::default()).await.unwrap().into_inner();
    let names: Vec<String> =
        listed.gateways.iter().map(|g| g.metadata.as_ref().unwrap().name.clone()).collect();
    assert_eq!(names, ["kept"]);
    assert_eq!(listed.gateways[0], kept, "a refused update changed the gateway");
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
