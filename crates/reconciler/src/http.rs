//! `/healthz`, `/readyz` (the store is listed and its watch is up) and
//! `/metrics`.

use std::sync::Arc;

use axum::extract::State as Shared;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::controller::State;

/// The router of the HTTP port.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(Shared(state): Shared<Arc<State>>) -> impl IntoResponse {
    match state.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
    }
}

async fn metrics(Shared(state): Shared<Arc<State>>) -> impl IntoResponse {
    state.update_gauges();
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.encode(),
    )
}
