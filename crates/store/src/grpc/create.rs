//! CreateGateway: a new gateway at generation 1, or ALREADY_EXISTS.

use gantry_api::v1::{CreateGatewayRequest, Gateway};
use gantry_core::{lifecycle, validation};
use tonic::Status;

use super::errors::{invalid, rule_status, storage_status};
use crate::auth::Principal;
use crate::writer::Writer;

pub(super) async fn create(
    writer: &Writer,
    principal: Principal,
    request: CreateGatewayRequest,
) -> Result<Gateway, Status> {
    let dry_run = request.validate_only;
    let gateway = request.gateway.ok_or_else(|| invalid("gateway", "required"))?;
    let name = gateway.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
    validation::validate_new_name("gateway.metadata.name", &name).map_err(|e| rule_status(&e))?;
    let uid = uuid::Uuid::new_v4().to_string();
    let (role, now) = (principal.role, super::now());
    // The new generation carries this request's trace to the reconciler.
    let trace = gantry_runtime::traceparent();
    let committed = writer
        .mutate(
            &name,
            Box::new(move |existing| {
                lifecycle::create(existing, gateway.clone(), role, uid.clone(), now)
                    .map(|w| lifecycle::record_trace(w, 0, trace.as_deref()))
            }),
            dry_run,
        )
        .await
        .map_err(storage_status)?;
    if !dry_run {
        tracing::info!(gateway = %name, subject = %principal.subject, "created");
    }
    Ok(committed.gateway)
}
