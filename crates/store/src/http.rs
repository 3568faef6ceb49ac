//! The HTTP side port: `/healthz` (the process serves), `/readyz` (the
//! database answers) and `/metrics` (Prometheus text).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::metrics::Metrics;
use crate::storage::Storage;
use crate::watch::hub::WatchHub;

#[derive(Clone)]
struct HttpState {
    storage: Arc<dyn Storage>,
    metrics: Arc<Metrics>,
    hub: Arc<WatchHub>,
}

/// The router of the HTTP port.
pub fn router(storage: Arc<dyn Storage>, metrics: Arc<Metrics>, hub: Arc<WatchHub>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(HttpState { storage, metrics, hub })
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    match tokio::time::timeout(std::time::Duration::from_secs(2), state.storage.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ok\n".to_string()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("database not ready: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "database not ready: no answer within 2s\n".to_string(),
        ),
    }
}

async fn metrics_text(State(state): State<HttpState>) -> impl IntoResponse {
    let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    state.metrics.watch_subscribers.set(gauge(state.hub.subscribers()));
    state.metrics.watch_cache_events.set(gauge(state.hub.retained()));
    state
        .metrics
        .watch_cache_bytes
        .set(i64::try_from(state.hub.retained_bytes()).unwrap_or(i64::MAX));
    state.metrics.watch_revision.set(state.hub.head());
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.encode(),
    )
}
