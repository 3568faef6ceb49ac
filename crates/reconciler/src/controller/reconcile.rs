//! One pass over one gateway (`reconcile(gateway, ctx) -> Result<Action>`,
//! as in kube-rs' controller-rs): finalizer, render, recovery policy,
//! target apply/observe/delete, and at most one status write. It returns
//! what to do next and never touches the queue; the runtime does. A pass
//! does no IO when there is nothing to do.
//!
//! The recovery record (failures for the current inputs, their
//! fingerprint, the next retry time) lives in the gateway's status: a
//! restarted process or a new leader reads it back and continues.

use std::time::Duration;

use gantry_api::v1::{Gateway, GatewayStatus, ObjectMeta, Phase};
use gantry_core::recovery::{Attempts, Decision, Inputs};
use gantry_core::status::{printable, shorten, MAX_TEXT_BYTES};

use super::action::{Action, Outcome, ReconcileError};
use super::context::{ms_timestamp, Context};
use super::{FINALIZER, RETRY_ANNOTATION};
use crate::render::{render, Rendered};
use crate::status::{self, Observation, Workload};
use crate::targets::Owner;

/// One pass over one gateway: what to do next, or why it could not
/// finish.
pub async fn reconcile(mut gateway: Gateway, ctx: &Context) -> Result<Action, ReconcileError> {
    let meta = gateway.metadata.clone().unwrap_or_default();
    if meta.delete_time.is_some() {
        return finalize(&meta, ctx).await;
    }
    if !meta.finalizers.iter().any(|f| f == FINALIZER) {
        let mut finalizers = meta.finalizers.clone();
        finalizers.push(FINALIZER.to_string());
        gateway = ctx.set_finalizers(&meta, finalizers).await?;
    }
    let meta = gateway.metadata.clone().unwrap_or_default();
    let name = meta.name.as_str();
    let generation = meta.generation;
    ctx.seen(name, generation);
    let current = gateway.status.clone().unwrap_or_default();
    let rendered = render(&gateway, &ctx.settings.render);
    let inputs = Inputs {
        generation,
        fingerprint: rendered.fingerprint.clone(),
        retry_token: meta.annotations.get(RETRY_ANNOTATION).cloned().unwrap_or_default(),
    };
    let record = ctx.record(name, &current, &inputs);
    let owner = Owner::of(&meta);
    let applied = current.observed_generation == generation
        && current.applied_fingerprint == rendered.fingerprint
        && current.phase() != Phase::Failed
        && record.is_none();
    if !applied {
        return apply(&gateway, &owner, &rendered, &inputs, record, ctx).await;
    }
    let observation = ctx.observe(&owner, &rendered).await?;
    if observation.drifted {
        tracing::info!("owned objects drifted; repairing");
        return apply(&gateway, &owner, &rendered, &inputs, record, ctx).await;
    }
    report(&gateway, &rendered, &observation, Outcome::Observed, ctx).await
}

/// Writes the status of what was observed (if it changed) and says when to
/// look again.
async fn report(
    gateway: &Gateway,
    rendered: &Rendered,
    observation: &Observation,
    outcome: Outcome,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let generation = gateway.metadata.as_ref().map_or(0, |m| m.generation);
    let current = gateway.status.clone().unwrap_or_default();
    let has_route = rendered.get("Ingress").is_some();
    let desired = status::applied(generation, &rendered.fingerprint, observation, has_route);
    let moving =
        matches!(observation.workload, Workload::Progressing { .. } | Workload::Stalled { .. });
    let outcome = if status::differs(&current, &desired) {
        ctx.write_status(gateway, desired).await?;
        outcome
    } else if outcome == Outcome::Observed {
        Outcome::Unchanged
    } else {
        outcome
    };
    Ok(if moving { Action::after(outcome, ctx.poll_interval()) } else { Action::done(outcome) })
}

/// Applies the rendered objects unless an unchanged failure waits for its
/// time; records a failure in status.
async fn apply(
    gateway: &Gateway,
    owner: &Owner,
    rendered: &Rendered,
    inputs: &Inputs,
    record: Option<Attempts>,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let name = owner.name.as_str();
    let now = ctx.now_ms();
    let policy = &ctx.settings.policy;
    if let (Some(record), Decision::Wait { until_ms }) =
        (&record, policy.decide(record.as_ref(), inputs, now))
    {
        // An unchanged failure: no apply. The status is written only if it
        // does not show the record yet (an earlier write failed or met a
        // conflict).
        let wait = Duration::from_millis(until_ms.saturating_sub(now));
        let desired = failure_status(gateway, record, ctx);
        let current = gateway.status.clone().unwrap_or_default();
        if status::differs(&current, &desired) {
            ctx.write_status(gateway, desired).await?;
        }
        return Ok(Action::after(Outcome::Waiting, wait));
    }
    match ctx.apply(owner, rendered).await {
        Ok(()) => {
            ctx.keep_record(name, None);
            tracing::info!(target = ctx.target.name(), "manifests applied");
            let observation = match ctx.observe(owner, rendered).await {
                Ok(o) => o,
                Err(e) => Observation {
                    workload: Workload::Progressing { message: format!("cannot observe yet: {e}") },
                    route_address: String::new(),
                    drifted: false,
                },
            };
            report(gateway, rendered, &observation, Outcome::Applied, ctx).await
        }
        Err(e) if !ctx.target.may_write() => Err(ReconcileError::NotLeader(e)),
        Err(e) => {
            // Printable first: a replaced control character takes three bytes.
            let error = shorten(&printable(&e.to_string(), false), MAX_TEXT_BYTES);
            let failure = policy.on_failure(record.as_ref(), inputs, &error, now, fastrand::f64());
            let wait = Duration::from_millis(failure.attempts.retry_at_ms.saturating_sub(now));
            tracing::warn!(error = %e, failures = failure.attempts.failures, exhausted = failure.exhausted, retry_in = ?wait, "apply failed");
            // Kept before the write: a status write that fails does not
            // reset the budget.
            ctx.keep_record(name, Some(failure.attempts.clone()));
            let desired = failure_status(gateway, &failure.attempts, ctx);
            ctx.write_status(gateway, desired).await?;
            Ok(Action::after(Outcome::Failed, wait))
        }
    }
}

/// The status that shows `record`.
fn failure_status(gateway: &Gateway, record: &Attempts, ctx: &Context) -> GatewayStatus {
    let current = gateway.status.clone().unwrap_or_default();
    let exhausted = record.failures >= ctx.settings.policy.budget.max(1);
    status::failed(
        &current,
        record.inputs.generation,
        &record.last_error,
        record.failures,
        exhausted,
        ms_timestamp(record.retry_at_ms),
        record.inputs.key(),
    )
}

/// A deleted gateway: deletes what it owns, then releases the finalizer.
async fn finalize(meta: &ObjectMeta, ctx: &Context) -> Result<Action, ReconcileError> {
    if !meta.finalizers.iter().any(|f| f == FINALIZER) {
        return Ok(Action::done(Outcome::Unchanged));
    }
    if !ctx.delete(&Owner::of(meta)).await? {
        return Ok(Action::after(Outcome::Deleting, ctx.poll_interval()));
    }
    let finalizers: Vec<String> =
        meta.finalizers.iter().filter(|f| *f != FINALIZER).cloned().collect();
    ctx.set_finalizers(meta, finalizers).await?;
    tracing::info!("owned objects deleted; finalizer removed");
    Ok(Action::done(Outcome::Deleted))
}
