//! Spans of gRPC calls as OpenTelemetry's RPC semantic conventions name
//! them: `package.Service/Method`, kind SERVER or CLIENT, the `rpc.system`,
//! `rpc.service`, `rpc.method` and `rpc.grpc.status_code` attributes, and
//! ERROR status for the codes the conventions count as errors on each side.

use tonic::Code;
use tracing::field::Empty;
use tracing::Span;

/// Which side of the call a span stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

/// The span of one call to `path` (`/package.Service/Method`), not
/// entered; [`finish`] records how it ended.
pub fn span(side: Side, path: &str) -> Span {
    let full = path.trim_start_matches('/');
    let (service, method) = full.split_once('/').unwrap_or((full, ""));
    let kind = match side {
        Side::Server => "server",
        Side::Client => "client",
    };
    tracing::info_span!(
        "grpc",
        otel.name = full,
        otel.kind = kind,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Whether a call that ended with `code` is an error on `side`: every
/// code but OK for a client; for a server only the codes that say the
/// server failed (the others are the caller's doing).
pub fn is_error(side: Side, code: Code) -> bool {
    match side {
        Side::Client => code != Code::Ok,
        Side::Server => matches!(
            code,
            Code::Unknown
                | Code::DeadlineExceeded
                | Code::Unimplemented
                | Code::Internal
                | Code::Unavailable
                | Code::DataLoss
        ),
    }
}

/// A status code as the gRPC spec and its other tools spell it
/// (`OK`, `INVALID_ARGUMENT`, ...), for the `code` label.
pub fn code_name(code: Code) -> &'static str {
    use Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Records on `span` that its call ended with `code` (and `message`).
pub fn finish(span: &Span, side: Side, code: Code, message: &str) {
    span.record("rpc.grpc.status_code", code as i64);
    if is_error(side, code) {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_per_side_as_the_conventions_say() {
        for code in [Code::NotFound, Code::InvalidArgument, Code::Aborted, Code::PermissionDenied] {
            assert!(is_error(Side::Client, code) && !is_error(Side::Server, code), "{code:?}");
        }
        for code in [Code::Internal, Code::Unavailable, Code::DeadlineExceeded, Code::Unknown] {
            assert!(is_error(Side::Client, code) && is_error(Side::Server, code), "{code:?}");
        }
        assert!(!is_error(Side::Client, Code::Ok) && !is_error(Side::Server, Code::Ok));
    }
}
