//! The logging flags every gantry service takes, and the one setup they
//! run from them.

use clap::{Args, ValueEnum};

use crate::init::{init, otlp_endpoint, LogStyle, Telemetry, TelemetryError};

/// Logging and tracing flags (flattened into each service's flags).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Logging and tracing")]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "GANTRY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,

    /// Log filter, in tracing's EnvFilter syntax.
    #[arg(long, env = "GANTRY_LOG", default_value = "info")]
    pub log_level: String,

    /// OTLP/gRPC endpoint to export traces to (e.g. http://collector:4317);
    /// traces are off when it is not set.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// How logs are written.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

impl LogArgs {
    /// Installs the tracing subscriber of the service `name` (a filter that
    /// does not parse falls back to `info`); keep the answer until the
    /// process ends (dropping it flushes the traces).
    pub fn init(&self, name: &'static str) -> Result<Telemetry, TelemetryError> {
        let filter = tracing_subscriber::EnvFilter::try_new(&self.log_level)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let style = match self.log_format {
            LogFormat::Json => LogStyle::Json,
            LogFormat::Pretty => LogStyle::Pretty,
        };
        let otlp = otlp_endpoint(self.otlp_endpoint.as_deref());
        init(name, filter, style, otlp.as_deref())
    }
}
