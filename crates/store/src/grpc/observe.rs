//! What every call of the API goes through, as a tower layer around
//! `GatewayServiceServer`: a span (the caller's trace as parent), the
//! --request-timeout, per-method metrics by code, a log of failures and a
//! rate-limited audit log of refusals, and the store's version on every
//! answer.
//!
//! The layer sees the HTTP response, not the handler's `Result`: its code
//! is the `grpc-status` of a trailers-only answer (every error a handler
//! or tonic's decoder returns), else OK. A watch is counted when it
//! starts, as a unary call is when it answers; an error that ends a stream
//! later travels in its trailers and is not counted here.

use gantry_runtime::rpc_span::{self, Side};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, Request, Response};
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tracing::Instrument;

use super::errors::too_large_is_resource_exhausted;
use super::fairness::AnswerSeat;
use super::holding::Holding;
use super::rate_limit::RateLimit;
use crate::auth::{Auth, Credentials};
use crate::metrics::Metrics;

/// Refusal log lines written per second at most.
pub const REFUSALS_LOGGED_PER_SECOND: u32 = 10;

/// The API's methods: the only values of the `method` label (a path that
/// names none of them is passed through unobserved; tonic answers
/// UNIMPLEMENTED).
const METHODS: [&str; 7] = [
    "CreateGateway",
    "GetGateway",
    "ListGateways",
    "UpdateGateway",
    "DeleteGateway",
    "WatchGateways",
    "Watch",
];

/// Wraps a gRPC service in [`Observe`] (see the module doc).
#[derive(Debug, Clone)]
pub struct ObserveLayer {
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    /// Longest a call may take to answer (a watch: to start).
    request_timeout: Duration,
    refusals: Arc<RateLimit>,
}

impl ObserveLayer {
    pub fn new(auth: Arc<Auth>, metrics: Arc<Metrics>, request_timeout: Duration) -> Self {
        let refusals = Arc::new(RateLimit::new(REFUSALS_LOGGED_PER_SECOND));
        Self { auth, metrics, request_timeout, refusals }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner, layer: self.clone() }
    }
}

/// See [`ObserveLayer`].
#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
    layer: ObserveLayer,
}

impl<S: NamedService> NamedService for Observe<S> {
    const NAME: &'static str = S::NAME;
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<S> tower::Service<Request<Body>> for Observe<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> ResponseFuture {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        let Some(method) = METHODS.iter().copied().find(|m| *m == method) else {
            return Box::pin(self.inner.call(request));
        };
        let caller = Caller::of(&request);
        let span = rpc_span::span(Side::Server, request.uri().path());
        gantry_runtime::set_parent(&span, caller.parent.clone());
        let started = Instant::now();
        let answer = tokio::time::timeout(self.layer.request_timeout, self.inner.call(request));
        let layer = self.layer.clone();
        Box::pin(async move {
            let mut response = match answer.instrument(span.clone()).await {
                Ok(Ok(response)) => too_large_is_resource_exhausted(response),
                Err(_elapsed) => Status::deadline_exceeded(format!(
                    "{method} did not finish within {:?} (--request-timeout); a write may still commit: read the gateway again before retrying",
                    layer.request_timeout
                ))
                .into_http(),
            };
            // The call's seats, held until its answer is written.
            if let Some(seat) = response.extensions_mut().remove::<AnswerSeat>() {
                response = response.map(|body| Holding::body(body, seat));
            }
            let status = Status::from_header_map(response.headers());
            let code = status.as_ref().map_or(Code::Ok, Status::code);
            rpc_span::finish(
                &span,
                Side::Server,
                code,
                status.as_ref().map_or("", Status::message),
            );
            layer.metrics.observe(method, started, code);
            if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
                layer.log(method, &caller, &status);
            }
            // Every answer says which version of the store gave it.
            response.headers_mut().insert(
                gantry_api::VERSION_HEADER,
                HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
            );
            Ok(response)
        })
    }
}

impl ObserveLayer {
    fn log(&self, method: &str, caller: &Caller, status: &Status) {
        match status.code() {
            Code::Internal | Code::Unavailable => {
                tracing::warn!(method, code = ?status.code(), error = status.message(), "request failed");
            }
            // An audit trail of refusals, bounded: one client hammering
            // with a bad token must not fill the disk. Messages never hold
            // a token.
            Code::Unauthenticated | Code::PermissionDenied => {
                if let Some(suppressed) = self.refusals.admit() {
                    let peer = caller.peer.map(|p| p.to_string()).unwrap_or_default();
                    let call = Credentials {
                        metadata: &caller.authorization,
                        certificates: caller.certificates.as_deref().map(Vec::as_slice),
                    };
                    let (subject, authenticator) = self.auth.describe(&call).unwrap_or_default();
                    tracing::info!(method, code = ?status.code(), error = status.message(), peer, subject, authenticator, suppressed, "request refused");
                }
            }
            _ => {}
        }
    }
}

/// Who made a call.
#[derive(Debug, Clone)]
struct Caller {
    peer: Option<std::net::SocketAddr>,
    /// The call's `authorization` metadata, looked up again only when a
    /// refusal is logged (not on every call).
    authorization: MetadataMap,
    /// The client certificate chain the TLS handshake verified.
    certificates: Option<Arc<Vec<rustls::pki_types::CertificateDer<'static>>>>,
    /// The caller's trace (W3C `traceparent`), parent of this call's span.
    parent: gantry_runtime::Context,
}

impl Caller {
    fn of<B>(request: &Request<B>) -> Caller {
        let headers = request.headers();
        let mut only_authorization = HeaderMap::new();
        if let Some(value) = headers.get("authorization") {
            only_authorization.insert("authorization", value.clone());
        }
        let authorization = MetadataMap::from_headers(only_authorization);
        let parent = gantry_runtime::extract(headers);
        let certificates = request
            .extensions()
            .get::<tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>>()
            .and_then(|info| info.peer_certs());
        Caller {
            peer: super::conn::peer_of(request.extensions()),
            authorization,
            certificates,
            parent,
        }
    }
}

#[cfg(test)]
mod tests {
    use tower::{Layer, ServiceExt};

    use super::*;
    use crate::auth::Authenticator;

    /// A service that answers every call with `status` (OK: an empty body
    /// and no `grpc-status` header, as a unary success begins).
    fn answering(
        status: Option<Status>,
    ) -> impl tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Send + 'static,
    > + Clone {
        tower::service_fn(move |_| {
            let response =
                status.clone().map_or_else(|| Response::new(Body::empty()), Status::into_http);
            std::future::ready(Ok::<_, Infallible>(response))
        })
    }

    fn layer(metrics: &Arc<Metrics>, timeout: Duration) -> ObserveLayer {
        let auth = Arc::new(Auth::new(Authenticator::Unauthenticated));
        ObserveLayer::new(auth, metrics.clone(), timeout)
    }

    async fn call<S>(service: &mut S, path: &str) -> Response<Body>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    {
        let request = Request::builder().uri(path).body(Body::empty()).expect("a request");
        let ready = service.ready().await.expect("ready");
        ready.call(request).await.expect("infallible")
    }

    fn counted(metrics: &Metrics, method: &str, code: &str) -> bool {
        metrics.encode().lines().any(|l| {
            l.starts_with("gantry_store_grpc_requests_total")
                && l.contains(&format!("method=\"{method}\""))
                && l.contains(&format!("code=\"{code}\""))
                && !l.ends_with(" 0")
        })
    }

    #[tokio::test]
    async fn an_error_in_the_headers_is_counted_under_its_code_and_answers_carry_the_version() {
        let metrics = Arc::new(Metrics::default());
        let denied = Some(Status::permission_denied("viewer"));
        let mut service = layer(&metrics, Duration::from_secs(5)).layer(answering(denied));
        let response = call(&mut service, "/gantry.v1.GatewayService/UpdateGateway").await;
        assert!(counted(&metrics, "UpdateGateway", "PERMISSION_DENIED"), "{}", metrics.encode());
        assert!(response.headers().contains_key(gantry_api::VERSION_HEADER));
    }

    #[tokio::test]
    async fn a_success_is_counted_as_ok() {
        let metrics = Arc::new(Metrics::default());
        let mut service = layer(&metrics, Duration::from_secs(5)).layer(answering(None));
        let response = call(&mut service, "/gantry.v1.GatewayService/GetGateway").await;
        assert!(counted(&metrics, "GetGateway", "OK"), "{}", metrics.encode());
        assert!(response.headers().contains_key(gantry_api::VERSION_HEADER));
    }

    #[tokio::test]
    async fn a_path_that_names_no_method_is_not_a_label() {
        let metrics = Arc::new(Metrics::default());
        let mut service = layer(&metrics, Duration::from_secs(5)).layer(answering(None));
        call(&mut service, "/gantry.v1.GatewayService/Anything").await;
        assert!(!metrics.encode().contains("Anything"), "{}", metrics.encode());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_the_request_timeout_answers_deadline_exceeded() {
        let metrics = Arc::new(Metrics::default());
        let never = tower::service_fn(|_: Request<Body>| {
            std::future::pending::<Result<Response<Body>, Infallible>>()
        });
        let mut service = layer(&metrics, Duration::from_secs(5)).layer(never);
        let response = call(&mut service, "/gantry.v1.GatewayService/ListGateways").await;
        let status = Status::from_header_map(response.headers()).expect("a status");
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(status.message().contains("--request-timeout"), "{}", status.message());
        assert!(counted(&metrics, "ListGateways", "DEADLINE_EXCEEDED"), "{}", metrics.encode());
    }
}
