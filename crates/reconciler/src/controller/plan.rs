//! What a pass decides, without IO: [`plan`] says whether to observe,
//! apply, or only write a status; [`applied`] and [`failed`] say what to
//! write after an apply. `reconcile` gathers the facts (the gateway, its
//! rendered objects, the failure record, an observation, the clock), asks
//! here, and acts once: at most one apply and one status write per pass.

use std::time::Duration;

use gantry_api::v1::{Gateway, GatewayStatus, Phase};
use gantry_core::recovery::{Attempts, Decision, Inputs, RecoveryPolicy};
use gantry_core::status::{printable, shorten, MAX_TEXT_BYTES};

use super::action::{Action, Outcome};
use super::clock::{ms_timestamp, timestamp_ms};
use crate::render::Rendered;
use crate::status::{self, Observation, Workload};

/// The facts a pass decides on.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub gateway: &'a Gateway,
    pub rendered: &'a Rendered,
    pub inputs: &'a Inputs,
    /// Failures recorded for these inputs (this process's or the status's).
    pub record: Option<&'a Attempts>,
    /// Repairs of a drift that came back (this process's).
    pub drift: Option<&'a DriftRecord>,
    pub policy: &'a RecoveryPolicy,
    /// How soon a moving rollout is looked at again.
    pub poll_interval: Duration,
    /// How long a route may wait for an address.
    pub route_deadline: Duration,
    /// A rollout past its progress deadline is rolled back (opted in).
    pub rollback: bool,
    /// Unix milliseconds.
    pub now_ms: u64,
}

/// Repairs of one drift at one set of inputs: a drift that is back after
/// [`DRIFT_REPAIRS`] repairs is reported, not repaired again.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftRecord {
    pub inputs: Inputs,
    /// What drifted ([`Observation::drift`]).
    pub drift: String,
    pub repairs: u32,
}

/// Repairs of the same drift at the same inputs before it is reported as
/// persisting (another writer sets it on every apply) and left alone.
pub const DRIFT_REPAIRS: u32 = 3;

/// What a pass does next.
// One short-lived value per pass: boxing the report would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// The status shows these inputs applied: observe the target, then plan
    /// again with what it shows.
    Observe,
    /// Apply the rendered objects; then [`applied`] or [`failed`].
    Apply,
    /// The rollout exceeded its progress deadline: put back the pods that
    /// served before, then [`rolled_back`]; with nothing to roll back to,
    /// this report.
    RollBack(Report),
    /// No (more) apply: write a status, then act.
    Report(Report),
}

/// The end of a pass: the status to write (`None`: it already shows what
/// is known) and what the runtime does next.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub status: Option<GatewayStatus>,
    pub action: Action,
}

impl Facts<'_> {
    fn current(&self) -> GatewayStatus {
        self.gateway.status.clone().unwrap_or_default()
    }

    fn generation(&self) -> i64 {
        self.gateway.metadata.as_ref().map_or(0, |m| m.generation)
    }

    /// `drift` came back after every one of [`DRIFT_REPAIRS`] repairs of
    /// these inputs.
    fn drift_persists(&self, drift: &str) -> Option<u32> {
        self.drift
            .filter(|r| r.inputs == *self.inputs && r.drift == drift && r.repairs >= DRIFT_REPAIRS)
            .map(|r| r.repairs)
    }

    /// The status already shows these inputs applied, with no failure held.
    fn shows_applied(&self) -> bool {
        let current = self.current();
        current.observed_generation == self.generation()
            && current.applied_fingerprint == self.rendered.fingerprint
            && current.phase() != Phase::Failed
            && self.record.is_none()
    }
}

/// The next step of a pass. `observation` is what the target showed, once
/// [`Plan::Observe`] asked for it.
pub fn plan(facts: &Facts<'_>, observation: Option<&Observation>) -> Plan {
    if facts.shows_applied() {
        // Rolled back: held, neither re-applied nor repaired, until the
        // inputs change (spec, retry).
        if status::shows_rolled_back(&facts.current(), &facts.inputs.key()) {
            return Plan::Report(Report { status: None, action: Action::done(Outcome::Unchanged) });
        }
        match observation.map(|o| (o, o.drift.as_deref())) {
            None => return Plan::Observe,
            Some((o, _)) if facts.rollback && deadline_exceeded(o) => {
                return Plan::RollBack(report(facts, o, Outcome::Observed));
            }
            Some((o, None)) => return Plan::Report(report(facts, o, Outcome::Observed)),
            // A drift every repair left in place: reported, not repaired.
            Some((o, Some(d))) if facts.drift_persists(d).is_some() => {
                return Plan::Report(report(facts, o, Outcome::Observed));
            }
            // Drifted: repaired as a change would be.
            Some(_) => {}
        }
    }
    if let (Some(record), Decision::Wait { until_ms }) =
        (facts.record, facts.policy.decide(facts.record, facts.inputs, facts.now_ms))
    {
        // An unchanged failure: no apply. The status is written only if it
        // does not show the record yet (an earlier write failed or met a
        // conflict).
        let desired = failure_status(facts, record);
        let status = status::differs(&facts.current(), &desired).then_some(desired);
        let wait = Duration::from_millis(until_ms.saturating_sub(facts.now_ms));
        return Plan::Report(Report { status, action: Action::after(Outcome::Waiting, wait) });
    }
    Plan::Apply
}

/// Whether the rollout exceeded its progress deadline.
fn deadline_exceeded(observation: &Observation) -> bool {
    matches!(&observation.workload, Workload::Stalled { reason, .. } if reason == status::PROGRESS_DEADLINE_EXCEEDED)
}

/// After a rollback put back the pods of generation `served`'s rendering.
pub fn rolled_back(facts: &Facts<'_>, observation: &Observation, served: i64) -> Report {
    let why = match &observation.workload {
        Workload::Stalled { message, .. } => message.as_str(),
        _ => "its rollout stalled",
    };
    let status = status::rolled_back(
        facts.generation(),
        &facts.rendered.fingerprint,
        facts.inputs.key(),
        served,
        why,
    );
    Report { status: Some(status), action: Action::done(Outcome::Applied) }
}

/// After an apply succeeded: the status of what the target shows (`Err`:
/// why it could not be observed yet; the rollout counts as progressing).
pub fn applied(facts: &Facts<'_>, observation: Result<Observation, String>) -> Report {
    let observation = observation.unwrap_or_else(|e| Observation {
        workload: Workload::Progressing { message: format!("cannot observe yet: {e}") },
        route_address: String::new(),
        drift: None,
    });
    report(facts, &observation, Outcome::Applied)
}

/// After an apply failed with `error`: the failure record to keep and the
/// status that shows it. `random` in `[0, 1)` jitters the backoff.
pub fn failed(facts: &Facts<'_>, error: &str, random: f64) -> (Attempts, Report) {
    // Printable first: a replaced control character takes three bytes.
    let error = shorten(&printable(error, false), MAX_TEXT_BYTES);
    let failure = facts.policy.on_failure(facts.record, facts.inputs, &error, facts.now_ms, random);
    let wait = Duration::from_millis(failure.attempts.retry_at_ms.saturating_sub(facts.now_ms));
    let status = failure_status(facts, &failure.attempts);
    let report = Report { status: Some(status), action: Action::after(Outcome::Failed, wait) };
    (failure.attempts, report)
}

/// The status of what was observed, written only if it changed; a moving
/// rollout is looked at again after the poll interval.
fn report(facts: &Facts<'_>, observation: &Observation, outcome: Outcome) -> Report {
    let route = route(facts, observation);
    let generation = facts.generation();
    let mut desired = status::applied(generation, &facts.rendered.fingerprint, observation, &route);
    if let Some((drift, repairs)) =
        observation.drift.as_deref().and_then(|d| Some((d, facts.drift_persists(d)?)))
    {
        desired = status::with_drift_persisting(desired, drift, repairs, generation);
    }
    let moving =
        matches!(observation.workload, Workload::Progressing { .. } | Workload::Stalled { .. })
            || matches!(route, status::Route::Waiting { .. });
    let changed = status::differs(&facts.current(), &desired);
    let outcome =
        if !changed && outcome == Outcome::Observed { Outcome::Unchanged } else { outcome };
    let action =
        if moving { Action::after(outcome, facts.poll_interval) } else { Action::done(outcome) };
    Report { status: changed.then_some(desired), action }
}

/// The route as judged now: its address, or how long it has waited for
/// one, counted from the route condition's transition to False (when this
/// reconciler first wrote that it waits; the store keeps that time while
/// it stays False).
fn route(facts: &Facts<'_>, observation: &Observation) -> status::Route {
    let Some(ingress) = facts.rendered.get("Ingress") else { return status::Route::None };
    if observation.workload == Workload::Written {
        return status::Route::Written;
    }
    if !observation.route_address.is_empty() {
        return status::Route::Admitted { address: observation.route_address.clone() };
    }
    let waiting_since = facts.current().conditions.into_iter().find(|c| {
        c.r#type == status::ROUTE_CONDITION && c.status() == gantry_api::v1::ConditionStatus::False
    });
    let since_ms =
        waiting_since.and_then(|c| c.last_transition_time).map(|t| timestamp_ms(Some(&t)));
    let waited =
        Duration::from_millis(since_ms.map_or(0, |since| facts.now_ms.saturating_sub(since)));
    if waited > facts.route_deadline {
        let deadline = facts.route_deadline;
        status::Route::NotAdmitted {
            message: format!(
                "Ingress {} has no load-balancer address after {deadline:?}; check that an ingress controller serves its class",
                ingress.name
            ),
        }
    } else {
        status::Route::Waiting { ingress: ingress.name.clone() }
    }
}

/// The status that shows `record`.
fn failure_status(facts: &Facts<'_>, record: &Attempts) -> GatewayStatus {
    let exhausted = record.failures >= facts.policy.budget.max(1);
    status::failed(
        &facts.current(),
        record.inputs.generation,
        &record.last_error,
        record.failures,
        exhausted,
        ms_timestamp(record.retry_at_ms),
        record.inputs.key(),
    )
}

#[cfg(test)]
mod tests {
    use gantry_api::v1::{GatewaySpec, ObjectMeta};

    use super::*;
    use crate::render::{render, RenderSettings};

    const NOW: u64 = 1_000_000;

    struct Case {
        gateway: Gateway,
        rendered: Rendered,
        inputs: Inputs,
        record: Option<Attempts>,
        drift: Option<DriftRecord>,
        policy: RecoveryPolicy,
    }

    impl Case {
        /// Generation 2 of a gateway, never applied.
        fn new() -> Self {
            let gateway = Gateway {
                metadata: Some(ObjectMeta {
                    name: "web".into(),
                    generation: 2,
                    ..Default::default()
                }),
                spec: Some(GatewaySpec { image: "nginx:1.27".into(), ..Default::default() }),
                status: None,
            };
            let rendered = render(&gateway, &RenderSettings::default());
            let inputs = Inputs {
                generation: 2,
                fingerprint: rendered.fingerprint.clone(),
                retry_token: String::new(),
            };
            Self {
                gateway,
                rendered,
                inputs,
                record: None,
                drift: None,
                policy: RecoveryPolicy::default(),
            }
        }

        fn facts(&self) -> Facts<'_> {
            Facts {
                gateway: &self.gateway,
                rendered: &self.rendered,
                inputs: &self.inputs,
                record: self.record.as_ref(),
                drift: self.drift.as_ref(),
                policy: &self.policy,
                poll_interval: Duration::from_secs(2),
                route_deadline: Duration::from_secs(600),
                rollback: false,
                now_ms: NOW,
            }
        }

        /// The status shows the current inputs applied and `workload`.
        fn applied_as(mut self, workload: Workload) -> Self {
            let status = status::applied(
                2,
                &self.rendered.fingerprint,
                &observed(workload),
                &status::Route::None,
            );
            self.gateway.status = Some(status);
            self
        }

        fn failed_until(mut self, retry_at_ms: u64) -> Self {
            self.record = Some(Attempts {
                inputs: self.inputs.clone(),
                failures: 1,
                last_error: "refused".into(),
                retry_at_ms,
            });
            self
        }
    }

    fn observed(workload: Workload) -> Observation {
        Observation { workload, route_address: String::new(), drift: None }
    }

    fn reported(plan: Plan) -> Report {
        match plan {
            Plan::Report(report) => report,
            other => panic!("expected a report, got {other:?}"),
        }
    }

    #[test]
    fn new_inputs_are_applied_without_looking_at_the_target() {
        let case = Case::new();
        assert_eq!(plan(&case.facts(), None), Plan::Apply);
    }

    #[test]
    fn inputs_shown_applied_are_observed_first() {
        let case = Case::new().applied_as(Workload::Available);
        assert_eq!(plan(&case.facts(), None), Plan::Observe);
    }

    #[test]
    fn an_unchanged_observation_writes_nothing_and_waits_for_a_change() {
        let case = Case::new().applied_as(Workload::Available);
        let plan = plan(&case.facts(), Some(&observed(Workload::Available)));
        let nothing = Report { status: None, action: Action::done(Outcome::Unchanged) };
        assert_eq!(plan, Plan::Report(nothing));
    }

    #[test]
    fn a_changed_observation_is_written_and_a_moving_rollout_polled() {
        let case = Case::new().applied_as(Workload::Available);
        let moving = Workload::Progressing { message: "1 of 2 updated".into() };
        let report = reported(plan(&case.facts(), Some(&observed(moving))));
        assert_eq!(report.action, Action::after(Outcome::Observed, Duration::from_secs(2)));
        let status = report.status.expect("a status write");
        assert_eq!(status.phase(), Phase::Provisioning);
        let reconciling = status.conditions.iter().find(|c| c.r#type == "Reconciling").unwrap();
        assert_eq!(reconciling.reason, "RolloutInProgress");
    }

    #[test]
    fn drift_is_repaired_by_an_apply() {
        let case = Case::new().applied_as(Workload::Available);
        let drifted = Observation {
            drift: Some("Service edge: .spec".into()),
            ..observed(Workload::Available)
        };
        assert_eq!(plan(&case.facts(), Some(&drifted)), Plan::Apply);
    }

    #[test]
    fn a_drift_back_after_every_repair_is_reported_and_left_alone() {
        let drift = "Deployment edge: .spec.template.spec.containers[gateway].image";
        let drifted = Observation { drift: Some(drift.into()), ..observed(Workload::Available) };
        let mut case = Case::new().applied_as(Workload::Available);
        let record =
            |repairs| DriftRecord { inputs: case.inputs.clone(), drift: drift.into(), repairs };
        case.drift = Some(record(DRIFT_REPAIRS - 1));
        assert_eq!(plan(&case.facts(), Some(&drifted)), Plan::Apply, "one more repair");
        case.drift = Some(record(DRIFT_REPAIRS));
        let report = reported(plan(&case.facts(), Some(&drifted)));
        assert_eq!(report.action, Action::done(Outcome::Observed));
        let status = report.status.expect("the drift is reported");
        assert_eq!(status.phase(), Phase::Running, "the workload is fine");
        let ready = status.conditions.iter().find(|c| c.r#type == "Ready").unwrap();
        assert_eq!(ready.status(), gantry_api::v1::ConditionStatus::True);
        let persists = status.conditions.iter().find(|c| c.r#type == status::DRIFTED).unwrap();
        assert_eq!(persists.reason, status::DRIFT_PERSISTS);
        assert!(persists.message.starts_with(drift), "{}", persists.message);
        // Shown: nothing more to write.
        let case =
            Case { gateway: Gateway { status: Some(status), ..case.gateway.clone() }, ..case };
        let again = reported(plan(&case.facts(), Some(&drifted)));
        assert_eq!(again.status, None);
        // Another drift, or new inputs, are repaired.
        let other =
            Observation { drift: Some("Service edge: .spec.selector".into()), ..drifted.clone() };
        assert_eq!(plan(&case.facts(), Some(&other)), Plan::Apply);
        let mut changed = case;
        changed.inputs.generation = 3;
        assert_eq!(plan(&changed.facts(), Some(&drifted)), Plan::Apply);
    }

    #[test]
    fn a_rollout_past_its_deadline_is_rolled_back_when_opted_in_and_then_held() {
        let stuck = Workload::Stalled {
            reason: status::PROGRESS_DEADLINE_EXCEEDED.into(),
            message: "ReplicaSet edge-2 has timed out progressing".into(),
        };
        let mut case = Case::new().applied_as(Workload::Available);
        assert!(matches!(plan(&case.facts(), Some(&observed(stuck.clone()))), Plan::Report(_)));
        case.policy = RecoveryPolicy::default();
        let facts = Facts { rollback: true, ..case.facts() };
        let Plan::RollBack(fallback) = plan(&facts, Some(&observed(stuck.clone()))) else {
            panic!("a rollback")
        };
        assert_eq!(
            fallback.status.expect("DEGRADED if nothing to roll back to").phase(),
            Phase::Degraded
        );
        let report = rolled_back(&facts, &observed(stuck.clone()), 1);
        let shown = report.status.expect("the rollback shown");
        assert_eq!(shown.phase(), Phase::Degraded);
        let stalled = shown.conditions.iter().find(|c| c.r#type == "Stalled").unwrap();
        assert_eq!(stalled.reason, status::ROLLED_BACK);
        assert!(stalled.message.contains("generation 1 is served"), "{}", stalled.message);
        assert!(stalled.message.contains("timed out progressing"), "{}", stalled.message);
        // Held: no apply, no repair, nothing written, until the inputs change.
        let held =
            Case { gateway: Gateway { status: Some(shown), ..case.gateway.clone() }, ..case };
        let facts = Facts { rollback: true, ..held.facts() };
        let drifted = Observation {
            drift: Some("Deployment edge: .spec.template".into()),
            ..observed(Workload::Available)
        };
        let nothing = Report { status: None, action: Action::done(Outcome::Unchanged) };
        assert_eq!(plan(&facts, None), Plan::Report(nothing.clone()));
        assert_eq!(plan(&facts, Some(&drifted)), Plan::Report(nothing));
        let mut retried = held;
        retried.inputs.retry_token = "2026-12-05T16:00:00Z".into();
        let facts = Facts { rollback: true, ..retried.facts() };
        assert_eq!(plan(&facts, Some(&drifted)), Plan::Apply, "a retry rolls out again");
    }

    #[test]
    fn an_unchanged_failure_waits_for_its_time_and_writes_it_once() {
        let case = Case::new().failed_until(NOW + 5_000);
        let first = reported(plan(&case.facts(), None));
        assert_eq!(first.action, Action::after(Outcome::Waiting, Duration::from_secs(5)));
        let shown = first.status.expect("the record is not shown yet");
        assert_eq!(shown.failure_count, 1);
        let case =
            Case { gateway: Gateway { status: Some(shown), ..case.gateway.clone() }, ..case };
        let second = reported(plan(&case.facts(), None));
        assert_eq!(second.status, None, "already shown: no second write");
    }

    #[test]
    fn a_failure_whose_time_has_come_is_applied_again() {
        let case = Case::new().failed_until(NOW);
        assert_eq!(plan(&case.facts(), None), Plan::Apply);
    }

    #[test]
    fn a_held_failure_is_not_taken_as_applied() {
        // The status shows the inputs applied, but this process holds a
        // failure for them (a later apply failed): not observed as healthy.
        let case = Case::new().applied_as(Workload::Available).failed_until(NOW + 1);
        assert_eq!(reported(plan(&case.facts(), None)).action.outcome, Outcome::Waiting);
    }

    #[test]
    fn an_apply_that_cannot_be_observed_yet_counts_as_progressing() {
        let case = Case::new();
        let report = applied(&case.facts(), Err("watch not listed".into()));
        assert_eq!(report.action, Action::after(Outcome::Applied, Duration::from_secs(2)));
        let status = report.status.expect("a status write");
        assert_eq!(status.phase(), Phase::Provisioning);
        assert_eq!(status.observed_generation, 2);
    }

    #[test]
    fn a_failed_apply_counts_and_shows_its_error_printably() {
        let case = Case::new().failed_until(NOW);
        let (record, report) = failed(&case.facts(), "refused\u{7}", 0.0);
        assert_eq!(record.failures, 2);
        assert!(record.retry_at_ms > NOW);
        assert_eq!(report.action.outcome, Outcome::Failed);
        let status = report.status.expect("a status write");
        assert_eq!(status.failure_count, 2);
        assert!(!status.message.contains('\u{7}'), "{}", status.message);
    }

    #[test]
    fn a_spent_budget_shows_failed() {
        let mut case = Case::new().failed_until(NOW);
        case.policy.budget = 2;
        let (_, report) = failed(&case.facts(), "refused", 0.0);
        assert_eq!(report.status.expect("a status write").phase(), Phase::Failed);
    }
}
