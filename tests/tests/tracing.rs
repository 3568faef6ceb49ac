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

/// One exported span: its service, name, ids.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
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
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s),
                    ) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Span {
                        service: service.clone(),
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
            traced("gateway-store", "CreateGateway")
                && traced("gateway-reconciler", "reconcile")
                && traced("gateway-store", "UpdateGateway")
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
    let create = store_calls.iter().find(|s| s.name == "CreateGateway").expect("the create's span");
    assert_eq!(parent_of(create).unwrap().id, root.id, "the store's RPC is the command's child");
    let pass = by_id
        .values()
        .find(|s| s.service == "gateway-reconciler" && s.name == "reconcile")
        .expect("the reconciler's pass");
    assert_eq!(parent_of(pass).unwrap().id, create.id, "the pass continues the create");
    assert!(
        store_calls.iter().any(|s| s.name == "UpdateGateway"
            && parent_of(s).is_some_and(|p| p.service == "gateway-reconciler")),
        "the pass's status write is in the trace too: {by_id:?}"
    );
    drop(reconciler);
    let _ = std::fs::remove_dir_all(dir);
}
