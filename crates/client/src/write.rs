//! Writes whose outcome is unknown.
//!
//! A write can fail after the store sent its commit (the store answers
//! UNAVAILABLE with reason `COMMIT_OUTCOME_UNKNOWN`) or after the request
//! left the client (the connection broke, the deadline passed): it may
//! have committed. Retrying blindly could apply it twice; giving up could
//! lose it. [`update_gateway`] resolves a conditional update (one with
//! `metadata.resource_version`) by reading the gateway back: if it is
//! still at the version the update was conditioned on, the update is sent
//! again (its condition lets at most one of the two commit); if it moved
//! on, the answer is ABORTED, as for any conflict: read again and decide.

use gantry_api::v1::{Gateway, GetGatewayRequest, UpdateGatewayRequest};
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use crate::GatewayClient;

pub use gantry_api::reasons::{
    COMMIT_OUTCOME_UNKNOWN as REASON_OUTCOME_UNKNOWN, NOT_COMMITTED as REASON_NOT_COMMITTED,
};

/// Whether a failed write may nevertheless have committed: the store said
/// so, or the call broke off without an answer from the store.
pub fn is_outcome_unknown(status: &Status) -> bool {
    let reason = status.get_details_error_info().map(|info| info.reason);
    match (status.code(), reason.as_deref()) {
        (_, Some(REASON_OUTCOME_UNKNOWN)) => true,
        // The store answered: it knows nothing was written.
        (Code::Unavailable, Some(_)) => false,
        // No answer from the store itself: transport failure or deadline.
        (Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown, None) => {
            true
        }
        _ => false,
    }
}

/// UpdateGateway, resolving an unknown outcome of a conditional update as
/// the module describes. Unconditional updates (`resource_version` 0) and
/// every other failure are answered as they came.
pub async fn update_gateway(
    client: &mut GatewayClient,
    request: UpdateGatewayRequest,
) -> Result<Gateway, Status> {
    let condition = request
        .gateway
        .as_ref()
        .and_then(|g| g.metadata.as_ref())
        .map(|m| (m.name.clone(), m.resource_version));
    let first = match client.update_gateway(request.clone()).await {
        Ok(answer) => return Ok(answer.into_inner()),
        Err(status) => status,
    };
    let Some((name, version)) = condition.filter(|(_, v)| *v > 0) else {
        return Err(first);
    };
    if !is_outcome_unknown(&first) {
        return Err(first);
    }
    let stored = client.get_gateway(GetGatewayRequest { name: name.clone() }).await?.into_inner();
    let now = stored.metadata.as_ref().map_or(0, |m| m.resource_version);
    if now != version {
        return Err(Status::aborted(format!(
            "the update of {name} may have committed ({}); the gateway is now at resource_version {now}: read it and decide again",
            first.message()
        )));
    }
    tracing::debug!(gateway = %name, error = first.message(), "write outcome unknown and not visible; sending it again");
    client.update_gateway(request).await.map(tonic::Response::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tonic_types::ErrorDetails;

    fn with_reason(code: Code, reason: &str) -> Status {
        let details = ErrorDetails::with_error_info(
            reason,
            gantry_api::reasons::ERROR_DOMAIN,
            HashMap::new(),
        );
        Status::with_error_details(code, "x", details)
    }

    #[test]
    fn which_failures_leave_the_outcome_unknown() {
        assert!(is_outcome_unknown(&with_reason(Code::Unavailable, REASON_OUTCOME_UNKNOWN)));
        assert!(!is_outcome_unknown(&with_reason(Code::Unavailable, REASON_NOT_COMMITTED)));
        assert!(is_outcome_unknown(&Status::unavailable("connection reset")));
        assert!(is_outcome_unknown(&Status::deadline_exceeded("deadline")));
        assert!(!is_outcome_unknown(&Status::aborted("conflict")));
        assert!(!is_outcome_unknown(&Status::invalid_argument("bad")));
    }
}
