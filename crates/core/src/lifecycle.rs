//! The store's write rules as pure functions: given the stored object (if
//! any), the request and the caller's role, decide the object to store.
//! The store runs these under the row lock inside its transaction, so what
//! they return is exactly what commits.

use gantry_api::v1::{Gateway, GatewaySpec, GatewayStatus, ObjectMeta, Phase};
use prost_types::Timestamp;

use crate::access::{parse_update_mask, FieldPath, Role};
use crate::canonical::{canonical_spec, spec_changed};
use crate::error::RuleError;
use crate::error::Violations;
use crate::status;
use crate::validation;

/// What a write does to the stored row.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Store this object (insert or replace).
    Put(Gateway),
    /// Remove the row; the object is its last state.
    Remove(Gateway),
    /// Nothing changed: no revision is spent and nothing is written.
    Unchanged(Gateway),
}

static NO_METADATA: std::sync::LazyLock<ObjectMeta> = std::sync::LazyLock::new(ObjectMeta::default);

fn meta(g: &Gateway) -> &ObjectMeta {
    g.metadata.as_ref().unwrap_or(&NO_METADATA)
}

fn meta_mut(g: &mut Gateway) -> &mut ObjectMeta {
    g.metadata.get_or_insert_with(Default::default)
}

fn status_mut(g: &mut Gateway) -> &mut GatewayStatus {
    g.status.get_or_insert_with(Default::default)
}

fn check_resource_version(current: &Gateway, given: i64) -> Result<(), RuleError> {
    let stored = meta(current).resource_version;
    if given != 0 && given != stored {
        Err(RuleError::Conflict { given, current: stored })
    } else {
        Ok(())
    }
}

/// Rule 1: a new Gateway starts at generation 1 and observed_generation 0,
/// phase PENDING. Server-owned metadata in the request is ignored, as
/// Kubernetes does; status and finalizers are owned by the reconciler.
pub fn create(
    existing: Option<&Gateway>,
    request: Gateway,
    role: Role,
    uid: String,
    now: Timestamp,
) -> Result<Write, RuleError> {
    role.check_create_and_delete()?;
    let requested_meta = request.metadata.unwrap_or_default();
    if let Some(existing) = existing {
        return Err(RuleError::AlreadyExists(meta(existing).name.clone()));
    }
    if request.status.is_some_and(|s| s != GatewayStatus::default()) {
        return Err(if role.owns(FieldPath::Status) {
            RuleError::invalid(
                "gateway.status",
                "must be empty on create; the reconciler reports status",
            )
        } else {
            RuleError::permission_denied(
                "gateway.status",
                format!("role {role} may not write status; it is written by the reconciler role"),
            )
        });
    }
    if !requested_meta.finalizers.is_empty() && !role.owns(FieldPath::Finalizers) {
        return Err(RuleError::permission_denied(
            "gateway.metadata.finalizers",
            format!(
                "role {role} may not write finalizers; they are written by the reconciler role"
            ),
        ));
    }
    let mut v = Violations::default();
    validation::validate_metadata(&mut v, &requested_meta);
    validation::validate_spec(&mut v, request.spec.as_ref());
    v.into_result()?;

    Ok(Write::Put(Gateway {
        metadata: Some(ObjectMeta {
            name: requested_meta.name,
            uid,
            generation: 1,
            resource_version: 0,
            create_time: Some(now),
            update_time: Some(now),
            delete_time: None,
            labels: requested_meta.labels,
            annotations: requested_meta.annotations,
            finalizers: requested_meta.finalizers,
        }),
        spec: request.spec.map(canonical_spec),
        status: Some(GatewayStatus {
            phase: Phase::Pending as i32,
            observed_generation: 0,
            ..Default::default()
        }),
    }))
}

fn copy_spec_field(target: &mut GatewaySpec, source: &GatewaySpec, field: &str) {
    match field {
        "image" => target.image.clone_from(&source.image),
        "supervisor_image" => target.supervisor_image.clone_from(&source.supervisor_image),
        "replicas" => target.replicas = source.replicas,
        "route" => target.route.clone_from(&source.route),
        "server_dns_names" => target.server_dns_names.clone_from(&source.server_dns_names),
        "oidc" => target.oidc.clone_from(&source.oidc),
        "credential_driver" => target.credential_driver.clone_from(&source.credential_driver),
        "config" => target.config.clone_from(&source.config),
        "resources" => target.resources.clone_from(&source.resources),
        other => unreachable!("spec field {other} is not in SPEC_FIELDS"),
    }
}

/// Records on `write` the trace of the request that made a new generation:
/// the annotation [`gantry_api::TRACE_ANNOTATION`] becomes that request's
/// W3C `traceparent`, or is removed when it carried none (a stale one would
/// tie the reconciler's pass to another change). A write that made no new
/// generation keeps the annotation as it was.
pub fn record_trace(write: Write, previous_generation: i64, traceparent: Option<&str>) -> Write {
    let Write::Put(mut gateway) = write else { return write };
    let m = meta_mut(&mut gateway);
    if m.generation != previous_generation {
        match traceparent {
            Some(tp) => m.annotations.insert(gantry_api::TRACE_ANNOTATION.into(), tp.into()),
            None => m.annotations.remove(gantry_api::TRACE_ANNOTATION),
        };
    }
    Write::Put(gateway)
}

/// Rules 2 to 6 for UpdateGateway: applies the fields named in `mask` from
/// `incoming` to `current`, checking ownership, the resource_version
/// precondition, validation, the generation rule and the status rules.
pub fn update(
    current: &Gateway,
    incoming: &Gateway,
    mask: &[String],
    role: Role,
    now: Timestamp,
) -> Result<Write, RuleError> {
    let paths = parse_update_mask(mask, role)?;
    let incoming_meta = incoming.metadata.clone().unwrap_or_default();
    check_resource_version(current, incoming_meta.resource_version)?;
    let deleting = meta(current).delete_time.is_some();

    let mut next = current.clone();
    let empty_spec = GatewaySpec::default();
    let incoming_spec = incoming.spec.as_ref().unwrap_or(&empty_spec);
    let mut spec = next.spec.clone().unwrap_or_default();
    for path in &paths {
        match path {
            FieldPath::Spec => spec = incoming_spec.clone(),
            FieldPath::SpecField(field) => copy_spec_field(&mut spec, incoming_spec, field),
            FieldPath::Labels => meta_mut(&mut next).labels.clone_from(&incoming_meta.labels),
            FieldPath::Annotations => {
                meta_mut(&mut next).annotations.clone_from(&incoming_meta.annotations)
            }
            FieldPath::Finalizers => {
                let added =
                    incoming_meta.finalizers.iter().any(|f| !meta(current).finalizers.contains(f));
                if deleting && added {
                    return Err(RuleError::failed_precondition(
                        "gateway.metadata.finalizers",
                        "the gateway is being deleted; finalizers can only be removed",
                    ));
                }
                meta_mut(&mut next).finalizers.clone_from(&incoming_meta.finalizers);
            }
            FieldPath::Status | FieldPath::StatusField(_) => {}
        }
    }

    let mut v = Violations::default();
    validation::validate_labels(&mut v, &meta(&next).labels);
    validation::validate_annotations(&mut v, &meta(&next).annotations);
    validation::validate_finalizers(&mut v, &meta(&next).finalizers);
    if paths.iter().any(|p| p.is_spec()) {
        validation::validate_spec(&mut v, Some(&spec));
    }
    v.into_result()?;

    let old_spec = current.spec.clone().unwrap_or_default();
    if spec_changed(&old_spec, &spec) {
        if deleting {
            return Err(RuleError::failed_precondition(
                "gateway.spec",
                "the gateway is being deleted; its spec can no longer change",
            ));
        }
        next.spec = Some(canonical_spec(spec));
        let m = meta_mut(&mut next);
        m.generation += 1;
        status_mut(&mut next).provisioning.clear();
    }

    if paths.iter().any(|p| matches!(p, FieldPath::Status | FieldPath::StatusField(_))) {
        let generation = meta(&next).generation;
        let incoming_status = incoming.status.clone().unwrap_or_default();
        apply_status(status_mut(&mut next), &incoming_status, &paths, generation, deleting, &now)?;
    }

    if next == *current {
        return Ok(Write::Unchanged(next));
    }
    if deleting && meta(&next).finalizers.is_empty() {
        return Ok(Write::Remove(next));
    }
    meta_mut(&mut next).update_time = Some(now);
    Ok(Write::Put(next))
}

fn apply_status(
    status: &mut GatewayStatus,
    incoming: &GatewayStatus,
    paths: &[FieldPath],
    generation: i64,
    deleting: bool,
    now: &Timestamp,
) -> Result<(), RuleError> {
    let covers = |field: &str| paths.iter().any(|p| p.covers_status_field(field));
    if covers("observed_generation") {
        status::check_observed_generation(
            status.observed_generation,
            incoming.observed_generation,
            generation,
        )?;
        status.observed_generation = incoming.observed_generation;
    }
    if covers("phase") {
        status.phase = status::check_phase(incoming.phase, deleting)? as i32;
    }
    if covers("conditions") {
        status::validate_conditions(&incoming.conditions, generation)?;
        status.conditions = status::merge_conditions(&status.conditions, &incoming.conditions, now);
    }
    if covers("provisioning") {
        status::validate_provisioning(&incoming.provisioning)?;
        status.provisioning =
            status::merge_provisioning(&status.provisioning, &incoming.provisioning);
    }
    if covers("route_address") {
        status::check_text("gateway.status.route_address", &incoming.route_address, 253, true)?;
        status.route_address.clone_from(&incoming.route_address);
    }
    if covers("applied_fingerprint") {
        let fingerprint = &incoming.applied_fingerprint;
        status::check_text("gateway.status.applied_fingerprint", fingerprint, 128, true)?;
        status.applied_fingerprint.clone_from(fingerprint);
    }
    if covers("failure_count") {
        if incoming.failure_count < 0 {
            return Err(RuleError::invalid("gateway.status.failure_count", "must be 0 or more"));
        }
        status.failure_count = incoming.failure_count;
    }
    if covers("next_retry_time") {
        if let Some(t) = &incoming.next_retry_time {
            status::check_timestamp("gateway.status.next_retry_time", t)?;
        }
        status.next_retry_time = incoming.next_retry_time;
    }
    if covers("message") {
        status::check_text(
            "gateway.status.message",
            &incoming.message,
            status::MAX_TEXT_BYTES,
            false,
        )?;
        status.message.clone_from(&incoming.message);
    }
    if covers("failed_inputs") {
        status::check_text("gateway.status.failed_inputs", &incoming.failed_inputs, 128, true)?;
        status.failed_inputs.clone_from(&incoming.failed_inputs);
    }
    Ok(())
}

/// Rule 6 for DeleteGateway: without finalizers the row goes at once;
/// otherwise `delete_time` is set, phase becomes DELETING and the row stays
/// until the reconciler removes its finalizer. Deleting twice is a no-op.
pub fn delete(
    current: &Gateway,
    resource_version: i64,
    role: Role,
    now: Timestamp,
) -> Result<Write, RuleError> {
    role.check_create_and_delete()?;
    check_resource_version(current, resource_version)?;
    let mut next = current.clone();
    if meta(current).delete_time.is_some() {
        return Ok(Write::Unchanged(next));
    }
    let m = meta_mut(&mut next);
    m.delete_time = Some(now);
    let no_finalizers = m.finalizers.is_empty();
    status_mut(&mut next).phase = Phase::Deleting as i32;
    if no_finalizers {
        Ok(Write::Remove(next))
    } else {
        meta_mut(&mut next).update_time = Some(now);
        Ok(Write::Put(next))
    }
}

#[cfg(test)]
mod tests;
