//! A CLIENT span around every call to the store ([`gantry_runtime::rpc_span`]):
//! entered while the request is sent, so the `traceparent` the call
//! carries names it, and ended when the answer's status is known (in the
//! headers of a trailers-only answer, else in its trailers). Each ended
//! call is also one DEBUG event of target [`CALLS_TARGET`] (method, code,
//! time): `gatewayctl -v=6` prints them.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use gantry_runtime::rpc_span::{self, Side};
use http_body::{Body, Frame, SizeHint};
use tonic::codegen::{http, Service};
use tonic::{Code, Status};
use tracing::{Instrument as _, Span};

/// Target of the event each ended call logs at DEBUG.
pub const CALLS_TARGET: &str = "gantry_client::calls";

/// A call in flight: its span, method and start.
#[derive(Debug)]
struct Call {
    span: Span,
    method: String,
    started: std::time::Instant,
}

/// The service under a gRPC client that traces each call.
#[derive(Debug, Clone)]
pub struct Traced<S>(pub S);

type Answer<B, E> = Result<http::Response<TracedBody<B>>, E>;

impl<S, B, ReqBody> Service<http::Request<ReqBody>> for Traced<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<TracedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Answer<B, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        let span = rpc_span::span(Side::Client, path);
        let method = path.trim_start_matches('/').to_string();
        // The bearer interceptor below injects the current span's context.
        let call = span.in_scope(|| self.0.call(request));
        let started = std::time::Instant::now();
        Box::pin(async move {
            let answer = call.instrument(span.clone()).await;
            let mut call = Some(Call { span, method, started });
            match answer {
                Ok(response) => {
                    if let Some(status) = Status::from_header_map(response.headers()) {
                        end(&mut call, status.code(), status.message());
                    }
                    Ok(response.map(|inner| TracedBody { inner, call }))
                }
                Err(e) => {
                    end(&mut call, Code::Unavailable, "no answer");
                    Err(e)
                }
            }
        })
    }
}

fn end(call: &mut Option<Call>, code: Code, message: &str) {
    if let Some(call) = call.take() {
        rpc_span::finish(&call.span, Side::Client, code, message);
        let ms = call.started.elapsed().as_secs_f64() * 1000.0;
        let code = rpc_span::code_name(code);
        tracing::debug!(target: CALLS_TARGET, "{} {code} in {ms:.1} ms {message}", call.method);
    }
}

/// An answer's body that ends its call's span at the trailers.
#[derive(Debug)]
pub struct TracedBody<B> {
    inner: B,
    call: Option<Call>,
}

impl<B> Body for TracedBody<B>
where
    B: Body + Unpin,
    B::Error: std::fmt::Display,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let status = Status::from_header_map(trailers);
                    let (code, message) =
                        status.as_ref().map_or((Code::Ok, ""), |s| (s.code(), s.message()));
                    end(&mut self.call, code, message);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let message = e.to_string();
                end(&mut self.call, Code::Unavailable, &message);
            }
            Poll::Ready(None) => end(&mut self.call, Code::Ok, ""),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
