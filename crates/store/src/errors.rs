//! Turning domain and storage errors into gRPC statuses a client can act
//! on: the code, a plain message, and `google.rpc` details naming the field.

use std::collections::HashMap;

use gantry_core::RuleError;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

use crate::storage::StorageError;

/// Domain of the `google.rpc.ErrorInfo` details gantry sends.
pub const ERROR_DOMAIN: &str = "gantry.dev";

/// The status for a rule violation.
pub fn rule_status(err: &RuleError) -> Status {
    let message = err.to_string();
    match err {
        RuleError::Invalid(violations) => {
            let details = ErrorDetails::with_bad_request(
                violations
                    .iter()
                    .map(|v| FieldViolation::new(v.field.clone(), v.description.clone()))
                    .collect::<Vec<_>>(),
            );
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
                field.clone(),
                reason.clone(),
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
    let metadata = HashMap::from([("field".to_string(), field.to_string())]);
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
            Status::unavailable(format!(
                "database unavailable: {e}; nothing was written, retry later"
            ))
        }
        StorageError::NotCommitted(reason) => Status::unavailable(format!(
            "the write did not commit ({reason}); nothing was written, retry later"
        )),
        StorageError::Compacted { .. } => Status::out_of_range(err.to_string()),
        StorageError::Migrate(e) => Status::internal(format!("database migration: {e}")),
        StorageError::Corrupt { .. } => {
            tracing::error!(error = %err, "corrupt row");
            Status::internal(err.to_string())
        }
    }
}

/// INVALID_ARGUMENT for one field.
pub fn invalid(field: &str, description: impl Into<String>) -> Status {
    rule_status(&RuleError::invalid(field, description))
}
