//! gatewayctl's errors, in words for the person at the terminal: what
//! happened and what to do next.

use tonic::{Code, Status};
use tonic_types::StatusExt;

use gantry_client::manifest;

/// A failure, in words for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("{0}")]
    Message(String),
    #[error("{0}")]
    Manifest(#[from] manifest::ManifestError),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// Some items of a command over several failed; each was reported.
    #[error("{failed} of {total} failed (each is reported above)")]
    Failed { failed: usize, total: usize },
    /// The failure was reported already: exit non-zero, say nothing more.
    #[error("")]
    Reported,
}

pub(crate) fn msg(text: impl Into<String>) -> CtlError {
    CtlError::Message(text.into())
}

/// The message of `status` and of every error under it: tonic keeps the
/// cause of a transport failure (refused, TLS) in the source chain.
fn chain(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let cause = e.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = e.source();
    }
    text
}

/// What went wrong on the way to the store, when the call never reached
/// it: `None` when the store answered.
fn connection_problem(status: &Status, server: &str) -> Option<String> {
    // A status the store sent has no source; one made by the transport
    // on this side has its cause there.
    std::error::Error::source(status)?;
    let detail = chain(status);
    let lower = detail.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    let tls = server.starts_with("https://");
    Some(if tls && has(&["invalidcontenttype", "corrupt message", "wrong version number"]) {
        format!("the store at {server} does not speak TLS ({detail}). If it serves plain text, use http:// in --server or the context.")
    } else if tls && has(&["certificate", "unknownissuer", "handshake"]) {
        format!("the TLS certificate of the store at {server} was not accepted ({detail}). Pass the CA that signed it with --ca (GANTRY_CA) or in the context, and use a host name the certificate names.")
    } else if !tls
        // A TLS server answers an HTTP/2 preface by closing the connection:
        // which of these the client sees depends on timing.
        && has(&[
            "h2 protocol error",
            "http2 error",
            "connection reset",
            "connection closed",
            "frame",
            "broken pipe",
        ])
    {
        format!("the store at {server} broke off the HTTP/2 handshake ({detail}). If it serves TLS, use https:// in --server (with --ca for a private CA).")
    } else if has(&["connection refused"]) {
        format!("nothing is listening at {server} (connection refused). Is gateway-store running there? Check --server or the context in your config.")
    } else if has(&["dns", "failed to lookup", "name or service not known"]) {
        format!("cannot resolve the host of {server} ({detail}). Check --server or the context in your config.")
    } else if has(&["timed out", "timeout"]) {
        format!("the store at {server} did not answer the connection in time ({detail}). Check --server, and that a firewall lets you reach it.")
    } else if has(&["transport", "connect"]) {
        format!("cannot reach the store at {server} ({detail}). Is it running? Check --server or the context in your config.")
    } else {
        return None;
    })
}

/// Explains a gRPC error: what happened and what to do next.
pub fn explain(status: &Status, server: &str) -> String {
    if let Some(problem) = connection_problem(status, server) {
        return problem;
    }
    let detail = status.message();
    match status.code() {
        Code::Unavailable => {
            format!("the store at {server} is unavailable: {detail}. Retry in a moment.")
        }
        Code::Unauthenticated => {
            format!("the store rejected the credentials: {detail}. Check --token (GANTRY_TOKEN) or the context's token.")
        }
        Code::PermissionDenied => format!("not allowed: {detail}"),
        Code::InvalidArgument => {
            let fields: Vec<String> = status
                .get_details_bad_request()
                .map(|b| {
                    b.field_violations
                        .iter()
                        .map(|v| format!("  {}: {}", v.field, v.description))
                        .collect()
                })
                .unwrap_or_default();
            if fields.is_empty() {
                format!("invalid: {detail}")
            } else {
                format!("invalid gateway:\n{}", fields.join("\n"))
            }
        }
        Code::NotFound => detail.to_string(),
        Code::AlreadyExists => detail.to_string(),
        Code::Aborted => format!("{detail} (someone changed it meanwhile; run the command again)"),
        Code::FailedPrecondition => format!("refused: {detail}"),
        Code::DeadlineExceeded => format!("the store at {server} did not answer in time"),
        other => format!("{other:?}: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_text_call_broken_off_by_a_tls_store_says_use_https() {
        // What the transport reports depends on who closes first: a reset,
        // a frame error, the connection closed under the call or, writing
        // after the store closed, a broken pipe (all seen in CI).
        for cause in [
            "connection reset by peer",
            "frame with invalid size",
            "operation was canceled: transport error: connection closed",
            "broken pipe",
        ] {
            let io = std::io::Error::other(format!("transport error: {cause}"));
            let status = Status::from_error(Box::new(io));
            let said = connection_problem(&status, "http://store:50051").unwrap();
            assert!(said.contains("use https://"), "{cause}: {said}");
        }
    }
}
