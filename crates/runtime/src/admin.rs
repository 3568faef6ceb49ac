//! The admin port every gantry service serves: `/healthz` (the process
//! answers), `/readyz` (the service says whether it can do its work, and
//! why not) and `/metrics` (OpenMetrics to a scraper that asks for it, the
//! classic Prometheus text format otherwise: [`crate::metrics`]), served
//! within connection limits ([`serve`]).

mod server;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

pub use server::{serve, AdminArgs, AdminLimits};

/// What a service answers on its admin port.
#[tonic::async_trait]
pub trait Admin: Send + Sync + 'static {
    /// `Ok` when ready; otherwise why not (`/readyz` answers 503 with it).
    async fn readiness(&self) -> Result<(), String>;

    /// The metrics, gauges refreshed, as OpenMetrics text (`/metrics`).
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

async fn metrics(
    State(admin): State<Arc<dyn Admin>>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if crate::metrics::wants_openmetrics(accept) {
        ([(header::CONTENT_TYPE, crate::metrics::OPENMETRICS)], admin.metrics())
    } else {
        let text = crate::metrics::classic_text(&admin.metrics());
        ([(header::CONTENT_TYPE, crate::metrics::CLASSIC_TEXT)], text)
    }
}
