//! The tracing subscriber of a gantry process: logs (pretty or JSON) and,
//! with an OTLP endpoint, traces.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

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
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                // Every gantry binary shares the workspace's version.
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build();
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(service))
                // Only gantry's own spans, not every dependency's.
                .with_filter(EnvFilter::new(
                    "gantry_store=info,gantry_reconciler=info,gantry_ctl=info,gatewayctl=info,gantry_runtime::rpc_span=info,warn",
                ));
            (Some(provider), Some(layer))
        }
    };
    tracing_subscriber::registry().with(logs).with(traces).try_init()?;
    Ok(Telemetry { provider })
}
