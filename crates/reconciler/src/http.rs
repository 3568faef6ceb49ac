//! `/healthz`, `/readyz` (the store is listed and its watch is up) and
//! `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::controller::Controller;

/// The router of the HTTP port.
pub fn router(controller: Arc<Controller>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(controller)
}

async fn readyz(State(controller): State<Arc<Controller>>) -> impl IntoResponse {
    match controller.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
    }
}

async fn metrics(State(controller): State<Arc<Controller>>) -> impl IntoResponse {
    controller.update_gauges();
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        controller.metrics.encode(),
    )
}
