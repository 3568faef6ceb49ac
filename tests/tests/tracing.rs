//! OpenTelemetry traces end to end: gatewayctl, gateway-store and
//! gateway-reconciler as processes export OTLP to a collector this test
//! runs; one `gatewayctl apply` is one trace, from the command through the
//! store's RPC to the reconciler's pass for the generation it made (and
//! the pass's own calls to the store). Off by default: without an
//! endpoint nothing is exported.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_testkit::{binary, temp_dir, ReconcilerProcess, StoreProcess};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

const CREATE: &str = "gantry.v1.GatewayService/CreateGateway";
const UPDATE: &str = "gantry.v1.GatewayService/UpdateGateway";
const GET: &str = "gantry.v1.GatewayService/GetGateway";

/// One exported span: its service, name, ids, kind, attributes, status.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    version: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    kind: SpanKind,
    attributes: BTreeMap<String, String>,
    error: bool,
}

/// An attribute's value as text.
fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter().map(|a| (a.key.clone(), text(a.value.as_ref()))).collect()
}

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let process = attributes(resource.resource.as_ref().map_or(&[][..], |r| &r.attributes));
            let service = process.get("service.name").cloned().unwrap_or_default();
            let version = process.get("service.version").cloned().unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Span {
                        service: service.clone(),
                        version: version.clone(),
                        kind: span.kind(),
                        attributes: attributes(&span.attributes),
                        error: span.status.as_ref().is_some_and(|s| s.code() == StatusCode::Error),
                        name: span.name,
                        trace: span.trace_id,
                        id: span.span_id,
                        parent: span.parent_span_id,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_apply_is_one_trace_from_gatewayctl_through_the_store_to_the_reconcilers_pass() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);

    let dir = temp_dir("tracing");
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    // Batches leave every 100 ms, so that the test need not wait 5 s.
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
    let store = StoreProcess::start_with(&database, &dir, &["--otlp-endpoint", &endpoint]);
    let directory = dir.join("manifests");
    let reconciler = ReconcilerProcess::start(
        &store.endpoint(),
        &[
            "--target",
            "directory",
            "--directory",
            directory.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
        ],
    );

    let manifest = dir.join("edge.yaml");
    std::fs::write(&manifest, "metadata: {name: edge}\nspec: {image: ghcr.io/acme/gw:1}\n")
        .unwrap();
    let out = Command::new(binary("gatewayctl"))
        .args(["--server", &store.endpoint(), "apply", "-f", manifest.to_str().unwrap()])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("HOME", &dir)
        .env_remove("GANTRY_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let gateway = reconciler.wait_observed(&store.client(), "edge", 1).await;
    let traceparent =
        gateway.metadata.as_ref().unwrap().annotations.get(gantry_api::TRACE_ANNOTATION).cloned();
    let traceparent = traceparent.expect("the store recorded the trace of the generation");

    // The command's trace: gatewayctl's root, the store's RPCs under it,
    // the reconciler's pass under the create, and the pass's own calls.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (root, by_id) = loop {
        let spans = collector.spans();
        let root = spans.iter().find(|s| s.service == "gatewayctl" && s.parent.is_empty()).cloned();
        // Each process exports in its own batches: wait for all of them.
        let done = root.as_ref().is_some_and(|root| {
            let traced = |service: &str, name: &str| {
                spans
                    .iter()
                    .any(|s| s.trace == root.trace && s.service == service && s.name == name)
            };
            traced("gateway-store", CREATE)
                && traced("gateway-reconciler", "reconcile")
                && traced("gateway-store", UPDATE)
        });
        if done {
            let by_id: BTreeMap<Vec<u8>, Span> = spans
                .into_iter()
                .filter(|s| s.trace == root.as_ref().unwrap().trace)
                .map(|s| (s.id.clone(), s))
                .collect();
            break (root.unwrap(), by_id);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no trace from gatewayctl to the reconciler; spans: {spans:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(root.name, "gatewayctl apply");
    let hex: String = root.trace.iter().map(|b| format!("{b:02x}")).collect();
    assert!(traceparent.contains(&hex), "the annotation names the command's trace");
    let parent_of = |s: &Span| by_id.get(&s.parent).cloned();
    let store_calls: Vec<&Span> = by_id.values().filter(|s| s.service == "gateway-store").collect();
    let create = store_calls.iter().find(|s| s.name == CREATE).expect("the create's span");
    assert_eq!(create.kind, SpanKind::Server);
    let rpc = |span: &Span| {
        ["rpc.system", "rpc.service", "rpc.method", "rpc.grpc.status_code"]
            .map(|k| span.attributes.get(k).cloned().unwrap_or_default())
    };
    assert_eq!(rpc(create), ["grpc", "gantry.v1.GatewayService", "CreateGateway", "0"]);
    assert!(!create.error);
    // The command's own call is a CLIENT span between its root and the
    // store's SERVER span (the apply's first call is a get, NOT_FOUND).
    let call = parent_of(create).unwrap();
    assert_eq!((call.service.as_str(), call.name.as_str()), ("gatewayctl", CREATE));
    assert_eq!((call.kind, rpc(&call)[3].as_str()), (SpanKind::Client, "0"));
    assert_eq!(parent_of(&call).unwrap().id, root.id, "the call is the command's child");
    let lookup = by_id
        .values()
        .find(|s| s.service == "gatewayctl" && s.name == GET)
        .expect("the apply's read");
    assert!(lookup.error && rpc(lookup)[3] == "5", "a NOT_FOUND call is an error: {lookup:?}");
    let served = by_id.values().find(|s| s.parent == lookup.id).expect("its server span");
    assert!(!served.error && rpc(served)[3] == "5", "NOT_FOUND is the caller's: {served:?}");
    for span in by_id.values() {
        assert_eq!(span.version, env!("CARGO_PKG_VERSION"), "{span:?}");
    }
    let pass = by_id
        .values()
        .find(|s| s.service == "gateway-reconciler" && s.name == "reconcile")
        .expect("the reconciler's pass");
    assert_eq!(parent_of(pass).unwrap().id, create.id, "the pass continues the create");
    assert!(
        store_calls.iter().any(|s| s.name == UPDATE
            && parent_of(s).is_some_and(|p| p.service == "gateway-reconciler"
                && p.kind == SpanKind::Client
                && p.name == UPDATE)),
        "the pass's status write is in the trace too, through its CLIENT span: {by_id:?}"
    );
    drop(reconciler);
    let _ = std::fs::remove_dir_all(dir);
}
