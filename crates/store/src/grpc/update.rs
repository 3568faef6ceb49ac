//! UpdateGateway: the fields of the update mask (or the whole gateway),
//! with a new generation when the desired spec changed.

use gantry_api::v1::{Gateway, UpdateGatewayRequest};
use gantry_core::{lifecycle, validation, RuleError};
use tonic::Status;

use super::errors::{invalid, rule_status, storage_status};
use crate::auth::Principal;
use crate::writer::Writer;

pub(super) async fn update(
    writer: &Writer,
    principal: Principal,
    request: UpdateGatewayRequest,
) -> Result<Gateway, Status> {
    let gateway = request.gateway.ok_or_else(|| invalid("gateway", "required"))?;
    let name = gateway.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
    validation::validate_name("gateway.metadata.name", &name).map_err(|e| rule_status(&e))?;
    let paths = request.update_mask.map(|m| m.paths).unwrap_or_default();
    let (role, now, target, dry_run) =
        (principal.role, super::now(), name.clone(), request.validate_only);
    let trace = gantry_runtime::traceparent();
    let committed = writer
        .mutate(
            &name,
            Box::new(move |current| match current {
                None => Err(RuleError::NotFound(target.clone())),
                Some(current) => {
                    let generation = current.metadata.as_ref().map_or(0, |m| m.generation);
                    lifecycle::update(current, &gateway, &paths, role, now)
                        .map(|w| lifecycle::record_trace(w, generation, trace.as_deref()))
                }
            }),
            dry_run,
        )
        .await
        .map_err(storage_status)?;
    if committed.event.is_some() {
        tracing::debug!(gateway = %name, subject = %principal.subject, "updated");
    }
    Ok(committed.gateway)
}
