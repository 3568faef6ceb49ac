//! What every RPC goes through on its way out: a span (the caller's trace
//! as parent), the --request-timeout, per-method metrics by code, a log of
//! failures and a rate-limited audit log of refusals, and the store's
//! version on every answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use super::auth::Auth;
use super::rate_limit::RateLimit;
use crate::metrics::Metrics;

/// Refusal log lines written per second at most.
pub const REFUSALS_LOGGED_PER_SECOND: u32 = 10;

/// Who made a call.
#[derive(Debug, Clone)]
pub(super) struct Caller {
    peer: Option<std::net::SocketAddr>,
    /// The call's `authorization` metadata, authenticated again only when a
    /// refusal is logged (not on every call).
    authorization: tonic::metadata::MetadataMap,
    /// The caller's trace (W3C `traceparent`), parent of this call's span.
    parent: gantry_telemetry::Context,
}

impl Caller {
    /// Who is calling, for the log of refusals: the peer address and the
    /// credentials (the subject of a valid token is looked up when logged).
    pub(super) fn of<T>(request: &Request<T>) -> Caller {
        let mut authorization = tonic::metadata::MetadataMap::new();
        if let Some(value) = request.metadata().get("authorization") {
            authorization.insert("authorization", value.clone());
        }
        let parent = gantry_telemetry::extract(request.metadata());
        Caller { peer: request.remote_addr(), authorization, parent }
    }
}

/// Wraps each RPC's work (see the module doc).
#[derive(Debug, Clone)]
pub(super) struct Observer {
    pub(super) auth: Arc<Auth>,
    pub(super) metrics: Arc<Metrics>,
    /// Longest a call may take to answer (a watch: to start).
    pub(super) request_timeout: Duration,
    pub(super) refusals: Arc<RateLimit>,
}

impl Observer {
    pub(super) async fn observed<T>(
        &self,
        method: &str,
        caller: Caller,
        work: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let span = tracing::info_span!(
            "gantry.store.rpc",
            otel.name = method,
            rpc.system = "grpc",
            rpc.method = method
        );
        gantry_telemetry::set_parent(&span, caller.parent.clone());
        let work =
            tracing::Instrument::instrument(tokio::time::timeout(self.request_timeout, work), span);
        let result = match work.await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{method} did not finish within {:?} (--request-timeout); a write may still commit: read the gateway again before retrying",
                self.request_timeout
            ))),
        };
        let code = result.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        self.metrics.observe(method, started, code);
        if let Err(status) = &result {
            match status.code() {
                tonic::Code::Internal | tonic::Code::Unavailable => {
                    tracing::warn!(method, code = ?status.code(), error = status.message(), "request failed");
                }
                // An audit trail of refusals, bounded: one client hammering
                // with a bad token must not fill the disk. Messages never
                // hold a token.
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                    if let Some(suppressed) = self.refusals.admit() {
                        let peer = caller.peer.map(|p| p.to_string()).unwrap_or_default();
                        let principal = self.auth.authenticate(&caller.authorization).ok();
                        let subject = principal.as_ref().map_or("", |p| p.subject.as_str());
                        tracing::info!(method, code = ?status.code(), error = status.message(), peer, subject, suppressed, "request refused");
                    }
                }
                _ => {}
            }
        }
        // Every answer says which version of the store gave it.
        let version = tonic::metadata::MetadataValue::from_static(env!("CARGO_PKG_VERSION"));
        match result {
            Ok(answer) => {
                let mut response = Response::new(answer);
                response.metadata_mut().insert(gantry_api::VERSION_HEADER, version);
                Ok(response)
            }
            Err(mut status) => {
                status.metadata_mut().insert(gantry_api::VERSION_HEADER, version);
                Err(status)
            }
        }
    }
}
