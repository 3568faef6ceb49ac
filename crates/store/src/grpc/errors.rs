//! Turning domain and storage errors into gRPC statuses a client can act
//! on: the code, a plain message, and `google.rpc` details naming the field.

use std::collections::HashMap;

use gantry_core::RuleError;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::storage::StorageError;

pub use gantry_api::reasons::ERROR_DOMAIN;

/// Longest message, field and description sent back, and most field
/// violations listed: errors echo parts of the request, and an answer must
/// stay within what every client accepts in response headers (a
/// 10,000-character name once made the error itself fail to arrive).
const MAX_MESSAGE_CHARS: usize = 512;
const MAX_FIELD_CHARS: usize = 128;
const MAX_DESCRIPTION_CHARS: usize = 256;
const MAX_VIOLATIONS: usize = 10;

/// `text` cut to `max` characters, marked with `…` when cut.
fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Per the gRPC status-code spec a message larger than the server accepts
/// is RESOURCE_EXHAUSTED; tonic's decoder answers OUT_OF_RANGE, which gantry
/// uses for revisions outside the history. This rewrites that one answer
/// (a trailers-only response: the status is in the headers).
pub fn too_large_is_resource_exhausted(
    mut response: axum::http::Response<tonic::body::Body>,
) -> axum::http::Response<tonic::body::Body> {
    let headers = response.headers_mut();
    let too_large = headers.get("grpc-status").is_some_and(|v| v == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            // Percent-encoded on the wire (spaces as %20).
            .is_some_and(|m| m.replace("%20", " ").contains("message length too large"));
    if too_large {
        let code = (Code::ResourceExhausted as i32).to_string();
        if let Ok(value) = axum::http::HeaderValue::from_str(&code) {
            headers.insert("grpc-status", value);
        }
    }
    response
}

/// The status for a rule violation.
pub fn rule_status(err: &RuleError) -> Status {
    let message = bounded(&err.to_string(), MAX_MESSAGE_CHARS);
    match err {
        RuleError::Invalid(violations) => {
            let mut listed: Vec<FieldViolation> = violations
                .iter()
                .take(MAX_VIOLATIONS)
                .map(|v| {
                    FieldViolation::new(
                        bounded(&v.field, MAX_FIELD_CHARS),
                        bounded(&v.description, MAX_DESCRIPTION_CHARS),
                    )
                })
                .collect();
            if violations.len() > MAX_VIOLATIONS {
                listed.push(FieldViolation::new(
                    "gateway",
                    format!("{} more violations not listed", violations.len() - MAX_VIOLATIONS),
                ));
            }
            let details = ErrorDetails::with_bad_request(listed);
            Status::with_error_details(Code::InvalidArgument, message, details)
        }
        RuleError::PermissionDenied { field, .. } => {
            error_info(Code::PermissionDenied, message, "FIELD_NOT_OWNED", field)
        }
        RuleError::FailedPrecondition { field, reason } => Status::with_error_details(
            Code::FailedPrecondition,
            message,
            ErrorDetails::with_precondition_failure_violation(
                "STATE",
                bounded(field, MAX_FIELD_CHARS),
                bounded(reason, MAX_DESCRIPTION_CHARS),
            ),
        ),
        RuleError::Conflict { .. } => error_info(
            Code::Aborted,
            message,
            "RESOURCE_VERSION_MISMATCH",
            "gateway.metadata.resource_version",
        ),
        RuleError::NotFound(_) => Status::not_found(message),
        RuleError::AlreadyExists(_) => Status::already_exists(message),
    }
}

fn error_info(code: Code, message: String, reason: &str, field: &str) -> Status {
    let metadata = HashMap::from([("field".to_string(), bounded(field, MAX_FIELD_CHARS))]);
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata),
    )
}

/// The status for a storage failure. Database trouble is UNAVAILABLE (the
/// write did not commit; retrying is safe); a corrupt row is INTERNAL.
pub fn storage_status(err: StorageError) -> Status {
    match err {
        StorageError::Rule(rule) => rule_status(&rule),
        StorageError::Database(e) => {
            tracing::warn!(error = %e, "database error");
            with_reason(
                Code::Unavailable,
                format!("database unavailable: {e}; nothing was written, retry later"),
                REASON_NOT_COMMITTED,
                &[],
            )
        }
        StorageError::NotCommitted(reason) => with_reason(
            Code::Unavailable,
            format!("the write did not commit ({reason}); nothing was written, retry later"),
            REASON_NOT_COMMITTED,
            &[],
        ),
        // Not "nothing was written": the commit may have landed.
        StorageError::CommitUnknown(reason) => with_reason(
            Code::Unavailable,
            format!(
                "the write's outcome is unknown ({reason}): it may have committed; read the gateway again before retrying"
            ),
            REASON_OUTCOME_UNKNOWN,
            &[],
        ),
        StorageError::Compacted { requested, compacted } => with_reason(
            Code::OutOfRange,
            format!("{err}; list again and watch from the listed revision"),
            REASON_COMPACTED,
            &[
                ("resource_version", requested.to_string()),
                ("compacted_revision", compacted.to_string()),
            ],
        ),
        StorageError::Future { requested, current } => with_reason(
            Code::OutOfRange,
            format!("{err}; list again and watch from the listed revision"),
            REASON_FUTURE,
            &[("resource_version", requested.to_string()), ("current_revision", current.to_string())],
        ),
        StorageError::Setup(reason) => Status::internal(reason),
        StorageError::Migrate(e) => Status::internal(format!("database migration: {e}")),
        StorageError::NotDurable(reason) => Status::internal(reason),
        StorageError::Corrupt { .. } => {
            tracing::error!(error = %err, "corrupt row");
            Status::internal(err.to_string())
        }
    }
}

pub use gantry_api::reasons::{
    COMMIT_OUTCOME_UNKNOWN as REASON_OUTCOME_UNKNOWN, NOT_COMMITTED as REASON_NOT_COMMITTED,
    REVISION_COMPACTED as REASON_COMPACTED, REVISION_FUTURE as REASON_FUTURE,
};

/// A status with `google.rpc.ErrorInfo` of gantry's domain.
pub fn with_reason(
    code: Code,
    message: String,
    reason: &str,
    metadata: &[(&str, String)],
) -> Status {
    let metadata: HashMap<String, String> =
        metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata),
    )
}

/// INVALID_ARGUMENT for one field.
pub fn invalid(field: &str, description: impl Into<String>) -> Status {
    rule_status(&RuleError::invalid(field, description))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_was_written_is_said_only_before_the_commit() {
        let before = storage_status(StorageError::NotCommitted("lock timeout".into()));
        assert!(before.message().contains("nothing was written"), "{before:?}");
        let during = storage_status(StorageError::CommitUnknown("connection reset".into()));
        assert_eq!(during.code(), Code::Unavailable);
        assert_eq!(during.get_details_error_info().unwrap().reason, REASON_OUTCOME_UNKNOWN);
        assert_eq!(before.get_details_error_info().unwrap().reason, REASON_NOT_COMMITTED);
        assert!(!during.message().contains("nothing was written"), "{during:?}");
        assert!(during.message().contains("read the gateway again"), "{during:?}");
    }
    use gantry_core::error::Violations;

    #[test]
    fn bounded_cuts_at_a_character_boundary() {
        assert_eq!(bounded("abc", 3), "abc");
        assert_eq!(bounded("abcd", 3), "abc…");
        assert_eq!(bounded("ééé", 2), "éé…");
    }

    #[test]
    fn an_invalid_argument_stays_small_however_large_the_request() {
        let mut v = Violations::default();
        for i in 0..1000 {
            v.push(
                format!("gateway.metadata.labels[{:?}]", "k".repeat(5000)),
                format!("{i}: {}", "x".repeat(5000)),
            );
        }
        let status = rule_status(&v.into_result().unwrap_err());
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().chars().count() <= MAX_MESSAGE_CHARS + 1);
        let listed = status.get_error_details().bad_request().unwrap().field_violations.clone();
        assert_eq!(listed.len(), MAX_VIOLATIONS + 1);
        assert!(listed.iter().all(|f| f.field.chars().count() <= MAX_FIELD_CHARS + 1));
        assert_eq!(listed[MAX_VIOLATIONS].description, "990 more violations not listed");
        assert!(status.details().len() < 8 * 1024, "{} bytes of details", status.details().len());
    }
}
