//! The admin port every gantry service serves: `/healthz` (the process
//! answers), `/readyz` (the service says whether it can do its work, and
//! why not) and `/metrics` (the OpenMetrics text exposition).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// What a service answers on its admin port.
#[tonic::async_trait]
pub trait Admin: Send + Sync + 'static {
    /// `Ok` when ready; otherwise why not (`/readyz` answers 503 with it).
    async fn readiness(&self) -> Result<(), String>;

    /// The metrics, gauges refreshed (`/metrics`).
    fn metrics(&self) -> String;
}

/// The router of the admin port.
pub fn router(admin: Arc<dyn Admin>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(admin)
}

async fn readyz(State(admin): State<Arc<dyn Admin>>) -> impl IntoResponse {
    match admin.readiness().await {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

async fn metrics(State(admin): State<Arc<dyn Admin>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        admin.metrics(),
    )
}
