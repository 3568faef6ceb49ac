//! The runtime every gantry process shares: logs and traces set up the
//! same way ([`LogArgs`]), one [`Shutdown`] with one signal handler
//! ([`shutdown::signal`]), and the admin port (`admin::router`:
//! `/healthz`, `/readyz`, `/metrics`).
//!
//! Logs go to stderr (human or JSON; colour only on a terminal). Traces are
//! off unless an OTLP endpoint is given (`--otlp-endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`): then every `tracing` span is also an
//! OpenTelemetry span, exported over OTLP/gRPC in batches. The W3C trace
//! context travels in gRPC metadata (`traceparent`): gatewayctl's command
//! is the parent of the store's RPC, and the store records the context of
//! the write that made a new generation on the gateway (the annotation
//! `gantry_api::TRACE_ANNOTATION`), which the reconciler's pass for that
//! generation takes as its parent.

#![forbid(unsafe_code)]

pub mod admin;
pub mod log_args;
pub mod shutdown;

pub use log_args::{LogArgs, LogFormat};
pub use shutdown::Shutdown;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

pub use opentelemetry::Context;

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot set up the OTLP exporter for {endpoint}: {source}")]
    Exporter { endpoint: String, source: opentelemetry_otlp::ExporterBuildError },
    #[error("cannot install the log subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStyle {
    Pretty,
    Json,
    /// No log output (gatewayctl: only traces, when asked for).
    Off,
}

/// The installed telemetry; dropping it flushes the spans not yet
/// exported (so keep it alive until the process ends).
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether traces are exported.
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("traces not all exported: {e}");
            }
        }
    }
}

/// The OTLP endpoint: the flag's value, else `OTEL_EXPORTER_OTLP_ENDPOINT`;
/// none (traces off) when both are empty.
pub fn otlp_endpoint(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_string)
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|e| !e.trim().is_empty())
}

/// Installs the process's subscriber: logs in `style` filtered by `filter`
/// and, with an `otlp` endpoint, spans exported as `service`. Needs a
/// tokio runtime when traces are on.
pub fn init(
    service: &'static str,
    filter: EnvFilter,
    style: LogStyle,
    otlp: Option<&str>,
) -> Result<Telemetry, TelemetryError> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = match style {
        LogStyle::Off => None,
        LogStyle::Pretty => Some(
            tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).boxed(),
        ),
        LogStyle::Json => Some(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .boxed(),
        ),
    };
    let logs = logs.map(|l| l.with_filter(filter));
    let (provider, traces) = match otlp {
        None => (None, None),
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .map_err(|source| TelemetryError::Exporter { endpoint: endpoint.into(), source })?;
            let resource =
                opentelemetry_sdk::Resource::builder().with_service_name(service).build();
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(service))
                // Only gantry's own spans, not every dependency's.
                .with_filter(EnvFilter::new(
                    "gantry_store=info,gantry_reconciler=info,gantry_ctl=info,gatewayctl=info,warn",
                ));
            (Some(provider), Some(layer))
        }
    };
    tracing_subscriber::registry().with(logs).with(traces).try_init()?;
    Ok(Telemetry { provider })
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) =
            (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_str()))
        {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a axum::http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// Puts the current span's trace context into outgoing gRPC metadata (a
/// no-op without a valid, sampled span).
pub fn inject(metadata: &mut MetadataMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
    }
}

/// The trace context an incoming request's headers carry (empty without
/// one).
pub fn extract(headers: &axum::http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// The current span's W3C `traceparent`, when it has a valid, sampled
/// context.
pub fn traceparent() -> Option<String> {
    let mut metadata = MetadataMap::new();
    inject(&mut metadata);
    metadata.get("traceparent").and_then(|v| v.to_str().ok()).map(String::from)
}

/// The context a `traceparent` text names.
pub fn from_traceparent(traceparent: &str) -> Context {
    let mut headers = axum::http::HeaderMap::new();
    if let Ok(value) = axum::http::HeaderValue::try_from(traceparent) {
        headers.insert("traceparent", value);
    }
    extract(&headers)
}

/// Makes `parent` the parent of `span` (when it is a valid context).
pub fn set_parent(span: &tracing::Span, parent: Context) {
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}
