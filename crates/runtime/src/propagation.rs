//! W3C trace context across gRPC calls: put into outgoing metadata, read
//! from incoming headers, carried as a `traceparent` text.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

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
