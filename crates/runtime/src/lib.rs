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
mod init;
pub mod log_args;
pub mod metrics;
mod propagation;
pub mod rpc_span;
pub mod shutdown;

pub use init::{init, otlp_endpoint, LogStyle, Telemetry, TelemetryError};
pub use log_args::{LogArgs, LogFormat};
pub use opentelemetry::Context;
pub use propagation::{extract, from_traceparent, inject, set_parent, traceparent};
pub use shutdown::{DrainGuard, Shutdown};
