//! One pass over one gateway (`reconcile(gateway, ctx) -> Result<Action>`,
//! as in kube-rs' controller-rs): finalizer, render, then the pure
//! [`plan`](super::plan) decides and this acts once (at most one apply and
//! one status write per pass). It returns
//! what to do next and never touches the queue; the runtime does. A pass
//! does no IO when there is nothing to do.
//!
//! The recovery record (failures for the current inputs, their
//! fingerprint, the next retry time) lives in the gateway's status: a
//! restarted process or a new leader reads it back and continues.

use std::time::Duration;

use gantry_api::v1::Gateway;
use gantry_core::recovery::Inputs;

use super::action::{Action, Outcome, ReconcileError};
use super::context::Context;
use super::plan::{self, plan, Facts, Plan, Report};
use super::{FINALIZER, RETRY_ANNOTATION};
use crate::render::render;
use crate::status;
use crate::targets::Owner;
use crate::targets::ROLLBACK_ANNOTATION;

/// One pass over one gateway: what to do next, or why it could not
/// finish.
pub async fn reconcile(mut gateway: Gateway, ctx: &Context) -> Result<Action, ReconcileError> {
    let meta = gateway.metadata.clone().unwrap_or_default();
    if meta.delete_time.is_some() {
        return finalize(&gateway, ctx).await;
    }
    if !meta.finalizers.iter().any(|f| f == FINALIZER) {
        let mut finalizers = meta.finalizers.clone();
        finalizers.push(FINALIZER.to_string());
        gateway = ctx.set_finalizers(&meta, finalizers).await?;
    }
    let meta = gateway.metadata.clone().unwrap_or_default();
    let name = meta.name.as_str();
    ctx.seen(name, meta.generation);
    let current = gateway.status.clone().unwrap_or_default();
    let rendered = render(&gateway, &ctx.settings.render);
    let owner = Owner::of(&meta);
    // A retry request, and the opt-in to replacing what cannot change, are
    // new inputs: each gets a fresh budget at once.
    let mut retry_token = meta.annotations.get(RETRY_ANNOTATION).cloned().unwrap_or_default();
    if owner.recreate {
        retry_token.push_str("+recreate");
    }
    let inputs = Inputs {
        generation: meta.generation,
        fingerprint: rendered.fingerprint.clone(),
        retry_token,
    };
    let record = ctx.record(name, &current, &inputs);
    let drift = ctx.drift_record(name);
    let facts = Facts {
        gateway: &gateway,
        rendered: &rendered,
        inputs: &inputs,
        record: record.as_ref(),
        drift: drift.as_ref(),
        policy: &ctx.settings.policy,
        poll_interval: ctx.poll_interval(),
        route_deadline: ctx.settings.route_deadline,
        rollback: ctx.settings.rollback_on_failure
            || meta.annotations.get(ROLLBACK_ANNOTATION).is_some_and(|v| v == "true"),
        now_ms: ctx.now_ms(),
    };
    let report = match plan(&facts, None) {
        Plan::Report(report) => report,
        Plan::Apply => apply(&facts, &owner, ctx).await?,
        // A plan without an observation never asks for it.
        Plan::RollBack(report) => report,
        Plan::Observe => {
            let observation = ctx.observe(&owner, &rendered).await?;
            match plan(&facts, Some(&observation)) {
                Plan::RollBack(stuck) => match ctx.target.roll_back(&owner, &rendered).await {
                    Ok(Some(served)) => plan::rolled_back(&facts, &observation, served),
                    Ok(None) => {
                        tracing::warn!(
                            "the rollout is stuck and nothing served before it: no rollback"
                        );
                        stuck
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "rollback failed");
                        stuck
                    }
                },
                Plan::Report(report) => {
                    if !observation.drifted() {
                        ctx.forget_drift(name);
                    }
                    report
                }
                // Drifted (a plan given the observation never asks for it).
                Plan::Apply | Plan::Observe => {
                    let drift = observation.drift.unwrap_or_default();
                    tracing::info!(drift, "owned objects drifted; repairing");
                    let report = apply(&facts, &owner, ctx).await?;
                    ctx.note_repair(name, &inputs, drift);
                    report
                }
            }
        }
    };
    if let Some(status) = report.status {
        ctx.write_status(&gateway, status).await?;
    }
    Ok(report.action)
}

/// Applies the rendered objects; plans the status of what followed.
async fn apply(facts: &Facts<'_>, owner: &Owner, ctx: &Context) -> Result<Report, ReconcileError> {
    match ctx.apply(owner, facts.rendered).await {
        Ok(()) => {
            ctx.keep_record(&owner.name, None);
            tracing::info!(target = ctx.target.name(), "manifests applied");
            let observation = ctx.observe(owner, facts.rendered).await.map_err(|e| e.to_string());
            Ok(plan::applied(facts, observation))
        }
        Err(e) if !ctx.target.may_write() => Err(ReconcileError::NotLeader(e)),
        Err(e) => {
            let (record, report) = plan::failed(facts, &e.to_string(), fastrand::f64());
            let retry_in = Duration::from_millis(record.retry_at_ms.saturating_sub(facts.now_ms));
            let exhausted = record.failures >= facts.policy.budget.max(1);
            tracing::warn!(error = %e, failures = record.failures, exhausted, ?retry_in, "apply failed");
            // Kept before the write: a status write that fails does not
            // reset the budget.
            ctx.keep_record(&owner.name, Some(record));
            Ok(report)
        }
    }
}

/// A deleted gateway: deletes what it owns, then releases the finalizer.
/// A cleanup the cluster refuses is shown in status (condition
/// `CleanupBlocked` with the cluster's reason) and retried with backoff.
async fn finalize(gateway: &Gateway, ctx: &Context) -> Result<Action, ReconcileError> {
    let meta = gateway.metadata.clone().unwrap_or_default();
    if !meta.finalizers.iter().any(|f| f == FINALIZER) {
        return Ok(Action::done(Outcome::Unchanged));
    }
    let gone = match ctx.delete(&Owner::of(&meta)).await {
        Ok(gone) => gone,
        Err(ReconcileError::Cleanup(e)) => {
            let current = gateway.status.clone().unwrap_or_default();
            let blocked =
                status::cleanup_blocked(&current, e.reason(), &e.to_string(), meta.generation);
            if status::differs(&current, &blocked) {
                ctx.write_status(gateway, blocked).await?;
            }
            return Err(ReconcileError::Cleanup(e));
        }
        Err(e) => return Err(e),
    };
    if !gone {
        return Ok(Action::after(Outcome::Deleting, ctx.poll_interval()));
    }
    let meta = &meta;
    let finalizers: Vec<String> =
        meta.finalizers.iter().filter(|f| *f != FINALIZER).cloned().collect();
    ctx.set_finalizers(meta, finalizers).await?;
    tracing::info!("owned objects deleted; finalizer removed");
    Ok(Action::done(Outcome::Deleted))
}
