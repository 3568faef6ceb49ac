//! DeleteGateway: marks the gateway for deletion; the reconciler removes
//! what it owns and the row goes once the finalizer is released.

use gantry_api::v1::{DeleteGatewayRequest, Gateway};
use gantry_core::{lifecycle, validation, RuleError};
use tonic::Status;

use super::errors::{rule_status, storage_status};
use crate::auth::Principal;
use crate::writer::Writer;

pub(super) async fn delete(
    writer: &Writer,
    principal: Principal,
    request: DeleteGatewayRequest,
) -> Result<Gateway, Status> {
    validation::validate_name("name", &request.name).map_err(|e| rule_status(&e))?;
    let (role, now, target, rv) =
        (principal.role, super::now(), request.name.clone(), request.resource_version);
    let committed = writer
        .mutate(
            &request.name,
            Box::new(move |current| match current {
                None => Err(RuleError::NotFound(target.clone())),
                Some(current) => lifecycle::delete(current, rv, role, now),
            }),
            request.validate_only,
        )
        .await
        .map_err(storage_status)?;
    if !request.validate_only {
        tracing::info!(gateway = %request.name, subject = %principal.subject, "delete requested");
    }
    Ok(committed.gateway)
}
