//! Errors of the domain rules. The gRPC edge maps each variant to one status
//! code; every variant names the field at fault so a client can act on it.

use std::fmt;

/// One invalid field: `field` is the path relative to the request, such as
/// `gateway.spec.replicas`, and `description` says what a valid value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    pub field: String,
    pub description: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self { field: field.into(), description: description.into() }
    }
}

impl fmt::Display for FieldViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.description)
    }
}

/// Why a request breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The request is malformed (INVALID_ARGUMENT).
    #[error("invalid request: {}", join(.0))]
    Invalid(Vec<FieldViolation>),
    /// The caller's role may not do this (PERMISSION_DENIED).
    #[error("permission denied on {field}: {reason}")]
    PermissionDenied { field: String, reason: String },
    /// The request is well formed but the object's state forbids it
    /// (FAILED_PRECONDITION).
    #[error("failed precondition on {field}: {reason}")]
    FailedPrecondition { field: String, reason: String },
    /// The `resource_version` precondition does not hold (ABORTED).
    #[error(
        "resource_version {given} does not match the current {current}: read the gateway again and retry"
    )]
    Conflict { given: i64, current: i64 },
    /// No gateway of that name (NOT_FOUND).
    #[error("gateway {0:?} not found")]
    NotFound(String),
    /// A gateway of that name exists (ALREADY_EXISTS).
    #[error("gateway {0:?} already exists")]
    AlreadyExists(String),
}

impl RuleError {
    /// One invalid field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        RuleError::Invalid(vec![FieldViolation::new(field, description)])
    }

    pub fn permission_denied(field: impl Into<String>, reason: impl Into<String>) -> Self {
        RuleError::PermissionDenied { field: field.into(), reason: reason.into() }
    }

    pub fn failed_precondition(field: impl Into<String>, reason: impl Into<String>) -> Self {
        RuleError::FailedPrecondition { field: field.into(), reason: reason.into() }
    }

    /// The field at fault, if the error names one.
    pub fn field(&self) -> Option<&str> {
        match self {
            RuleError::Invalid(v) => v.first().map(|v| v.field.as_str()),
            RuleError::PermissionDenied { field, .. }
            | RuleError::FailedPrecondition { field, .. } => Some(field),
            RuleError::Conflict { .. } => Some("gateway.metadata.resource_version"),
            RuleError::NotFound(_) | RuleError::AlreadyExists(_) => Some("name"),
        }
    }
}

fn join(violations: &[FieldViolation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Collects violations while validating a whole message, so a client learns
/// every problem in one round trip.
#[derive(Debug, Default)]
pub struct Violations(Vec<FieldViolation>);

impl Violations {
    pub fn push(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok` when nothing was pushed, else `RuleError::Invalid`.
    pub fn into_result(self) -> Result<(), RuleError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RuleError::Invalid(self.0))
        }
    }
}
