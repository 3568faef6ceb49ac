//! The errors the fake API server answers, as Kubernetes `Status` bodies.

use serde_json::{json, Value};

use crate::resources::ResourceType;

/// An error answered as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None, retry_after: None }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        let resource = if rt.group.is_empty() {
            rt.plural.to_string()
        } else {
            format!("{}.{}", rt.plural, rt.group)
        };
        let mut e = Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "group": rt.group, "kind": rt.plural}));
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
