//! Status (pure): what the reconciler reports for what it observed, in
//! kstatus conventions: conditions Ready, Reconciling and Stalled, and the
//! provisioning steps ManifestsApplied, WorkloadAvailable, RouteAdmitted.

use gantry_api::v1::{
    Condition, ConditionStatus, GatewayStatus, Phase, ProvisioningStep, StepState,
};
use gantry_core::status::printable;
use prost_types::Timestamp;

/// What a target reports about a gateway's workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// Written where nothing runs it (the directory target): phase
    /// WRITTEN, Ready Unknown; nothing is observed, nothing is claimed.
    Written,
    /// Rolling out.
    Progressing { message: String },
    /// Rolled out for the applied generation.
    Available,
    /// The rollout is stuck (progress deadline exceeded).
    Stalled { reason: String, message: String },
}

/// The observed state of a gateway's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub workload: Workload,
    pub route_address: String,
    /// What is missing or was changed out of band (`None`: nothing), as
    /// "Deployment edge: .spec.template.spec.containers[gateway].image".
    pub drift: Option<String>,
}

impl Observation {
    /// An owned object is missing or was changed out of band.
    pub fn drifted(&self) -> bool {
        self.drift.is_some()
    }
}

/// Condition type and reason of a drift that every repair leaves in place.
pub const DRIFTED: &str = "Drifted";
pub const DRIFT_PERSISTS: &str = "DriftPersists";

/// `status` with the condition saying that `drift` came back after each of
/// `repairs` repairs and is no longer repaired (Ready is left as it is).
pub fn with_drift_persisting(
    mut status: GatewayStatus,
    drift: &str,
    repairs: u32,
    generation: i64,
) -> GatewayStatus {
    let message = format!(
        "{drift}: still changed after {repairs} repairs (another writer, such as a mutating admission webhook or policy, sets it on every apply); not repaired again until the spec changes or `gatewayctl retry`"
    );
    status.conditions.push(condition(DRIFTED, true, DRIFT_PERSISTS, &message, generation));
    status
}

/// Status fields the reconciler writes (every `status.*` path).
pub const STATUS_PATHS: [&str; 10] = [
    "status.phase",
    "status.observed_generation",
    "status.conditions",
    "status.provisioning",
    "status.route_address",
    "status.applied_fingerprint",
    "status.failure_count",
    "status.next_retry_time",
    "status.message",
    "status.failed_inputs",
];

pub use gantry_api::steps::{
    MANIFESTS_APPLIED as STEP_MANIFESTS, ROUTE_ADMITTED as STEP_ROUTE,
    WORKLOAD_AVAILABLE as STEP_WORKLOAD,
};
/// Reason of Ready (Unknown) for manifests written where nothing runs them.
pub const NOT_OBSERVED: &str = "NotObserved";
const WRITTEN_MESSAGE: &str =
    "manifests written to the directory target; nothing runs them, so nothing is observed";
/// Reason of a route that got no address within its deadline.
pub const ROUTE_NOT_ADMITTED: &str = "RouteNotAdmitted";

fn condition(kind: &str, status: bool, reason: &str, message: &str, generation: i64) -> Condition {
    Condition {
        r#type: kind.into(),
        status: if status { ConditionStatus::True } else { ConditionStatus::False } as i32,
        reason: printable(reason, true),
        message: printable(message, false),
        observed_generation: generation,
        last_transition_time: None,
    }
}

fn step(name: &str, state: StepState, message: &str) -> ProvisioningStep {
    ProvisioningStep { name: name.into(), state: state as i32, message: printable(message, false) }
}

/// The route of a gateway, as the controller judges it from the address
/// the target observed and how long it has waited for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The gateway has none.
    None,
    /// Written where nothing admits it (the directory target).
    Written,
    /// No load-balancer address yet, within the route deadline.
    Waiting { ingress: String },
    /// An ingress controller published this address.
    Admitted { address: String },
    /// No address within the route deadline.
    NotAdmitted { message: String },
}

/// Condition type of the route (its `last_transition_time`, kept by the
/// store while the status stays False, is when the wait began).
pub const ROUTE_CONDITION: &str = "RouteAdmitted";
/// Reasons of the route condition.
pub const WAITING_FOR_ADDRESS: &str = "WaitingForAddress";
pub const ADDRESS_PUBLISHED: &str = "AddressPublished";

/// The route's step, and its condition (none where nothing admits it).
fn route_parts(route: &Route, generation: i64) -> Option<(ProvisioningStep, Option<Condition>)> {
    match route {
        Route::None => None,
        Route::Written => Some((step(STEP_ROUTE, StepState::Pending, WRITTEN_MESSAGE), None)),
        Route::Waiting { .. } => Some((
            step(STEP_ROUTE, StepState::InProgress, "waiting for a load-balancer address"),
            Some(condition(ROUTE_CONDITION, false, WAITING_FOR_ADDRESS, "", generation)),
        )),
        Route::Admitted { address } => Some((
            step(STEP_ROUTE, StepState::Complete, address),
            Some(condition(ROUTE_CONDITION, true, ADDRESS_PUBLISHED, address, generation)),
        )),
        Route::NotAdmitted { message } => Some((
            step(STEP_ROUTE, StepState::Failed, message),
            Some(condition(ROUTE_CONDITION, false, ROUTE_NOT_ADMITTED, message, generation)),
        )),
    }
}

/// Status after the manifests of `generation` were applied and observed:
/// the workload step follows the Deployment, the route step and condition
/// the route; RUNNING only when both are done.
pub fn applied(
    generation: i64,
    fingerprint: &str,
    observation: &Observation,
    route: &Route,
) -> GatewayStatus {
    let (phase, ready, reconciling, stalled, workload_step, message) =
        match (&observation.workload, route) {
            (Workload::Written, _) => (
                Phase::Written,
                Condition {
                    status: ConditionStatus::Unknown as i32,
                    ..condition("Ready", false, NOT_OBSERVED, WRITTEN_MESSAGE, generation)
                },
                condition("Reconciling", false, "ManifestsWritten", "", generation),
                condition("Stalled", false, "ManifestsWritten", "", generation),
                step(STEP_WORKLOAD, StepState::Pending, WRITTEN_MESSAGE),
                "manifests written; nothing runs or observes them (directory target)".to_string(),
            ),
            (Workload::Available, Route::Waiting { ingress }) => {
                let waiting = format!("waiting for a load-balancer address on Ingress {ingress}");
                (
                    Phase::Provisioning,
                    condition("Ready", false, WAITING_FOR_ADDRESS, &waiting, generation),
                    condition("Reconciling", true, WAITING_FOR_ADDRESS, &waiting, generation),
                    condition("Stalled", false, WAITING_FOR_ADDRESS, "", generation),
                    step(STEP_WORKLOAD, StepState::Complete, ""),
                    waiting,
                )
            }
            (Workload::Available, Route::NotAdmitted { message }) => (
                Phase::Degraded,
                condition("Ready", false, ROUTE_NOT_ADMITTED, message, generation),
                condition("Reconciling", false, ROUTE_NOT_ADMITTED, "", generation),
                condition("Stalled", true, ROUTE_NOT_ADMITTED, message, generation),
                step(STEP_WORKLOAD, StepState::Complete, ""),
                format!("{ROUTE_NOT_ADMITTED}: {message}"),
            ),
            (Workload::Available, _) => (
                Phase::Running,
                condition(
                    "Ready",
                    true,
                    "RolloutComplete",
                    "all replicas are updated and available",
                    generation,
                ),
                condition("Reconciling", false, "RolloutComplete", "", generation),
                condition("Stalled", false, "RolloutComplete", "", generation),
                step(STEP_WORKLOAD, StepState::Complete, ""),
                "running".to_string(),
            ),
            (Workload::Progressing { message }, _) => (
                Phase::Provisioning,
                condition("Ready", false, "RolloutInProgress", message, generation),
                condition("Reconciling", true, "RolloutInProgress", message, generation),
                condition("Stalled", false, "RolloutInProgress", "", generation),
                step(STEP_WORKLOAD, StepState::InProgress, message),
                format!("rolling out: {message}"),
            ),
            (Workload::Stalled { reason, message }, _) => (
                Phase::Degraded,
                condition("Ready", false, reason, message, generation),
                condition("Reconciling", false, reason, "", generation),
                condition("Stalled", true, reason, message, generation),
                step(STEP_WORKLOAD, StepState::Failed, message),
                format!("{reason}: {message}"),
            ),
        };
    let mut provisioning = vec![step(STEP_MANIFESTS, StepState::Complete, ""), workload_step];
    let mut conditions = vec![ready, reconciling, stalled];
    if let Some((route_step, route_condition)) = route_parts(route, generation) {
        provisioning.push(route_step);
        conditions.extend(route_condition);
    }
    GatewayStatus {
        phase: phase as i32,
        observed_generation: generation,
        conditions,
        provisioning,
        route_address: printable(&observation.route_address, true),
        applied_fingerprint: fingerprint.into(),
        failure_count: 0,
        next_retry_time: None,
        message: printable(&message, false),
        failed_inputs: String::new(),
    }
}

/// The Deployment condition reason of a rollout past its progress deadline
/// (the Deployment controller's word, kept as the gateway's reason).
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// Reason of a rollout that exceeded its progress deadline and was rolled
/// back (opted in).
pub const ROLLED_BACK: &str = "RolledBack";

/// Status after the rollout of `generation` exceeded its progress deadline
/// (`why`) and the pods of `served`'s rendering were put back: DEGRADED,
/// `Stalled=True` with reason RolledBack, and `failed_inputs` naming the
/// inputs rolled back (held until they change).
pub fn rolled_back(
    generation: i64,
    fingerprint: &str,
    failed_inputs: String,
    served: i64,
    why: &str,
) -> GatewayStatus {
    let message = format!(
        "generation {generation} did not become available ({why}); rolled back: the rendering of generation {served} is served. Change the spec or `gatewayctl retry` to roll out again"
    );
    GatewayStatus {
        phase: Phase::Degraded as i32,
        observed_generation: generation,
        conditions: vec![
            condition("Ready", false, ROLLED_BACK, &message, generation),
            condition("Reconciling", false, ROLLED_BACK, "", generation),
            condition("Stalled", true, ROLLED_BACK, &message, generation),
        ],
        provisioning: vec![
            step(STEP_MANIFESTS, StepState::Complete, ""),
            step(STEP_WORKLOAD, StepState::Failed, &message),
        ],
        route_address: String::new(),
        applied_fingerprint: fingerprint.into(),
        failure_count: 0,
        next_retry_time: None,
        message: printable(&message, false),
        failed_inputs,
    }
}

/// Whether `status` shows `inputs_key` rolled back.
pub fn shows_rolled_back(status: &GatewayStatus, inputs_key: &str) -> bool {
    status.failed_inputs == inputs_key
        && status.conditions.iter().any(|c| c.r#type == "Stalled" && c.reason == ROLLED_BACK)
}

/// Condition type of a deleted gateway whose objects cannot all be
/// deleted yet; its reason is the cluster's.
pub const CLEANUP_BLOCKED: &str = "CleanupBlocked";

/// `current` (DELETING) with the condition saying why the cleanup cannot
/// finish: `reason` from the cluster (`Forbidden`, `Invalid`, ...).
pub fn cleanup_blocked(
    current: &GatewayStatus,
    reason: &str,
    error: &str,
    generation: i64,
) -> GatewayStatus {
    let mut status = current.clone();
    status.phase = Phase::Deleting as i32;
    status.conditions.retain(|c| c.r#type != CLEANUP_BLOCKED);
    status.conditions.push(condition(CLEANUP_BLOCKED, true, reason, error, generation));
    status.message = printable(&format!("deleting: {error}"), false);
    status
}

/// Status after a failed apply. `exhausted` means the retry budget is
/// spent: FAILED with the error, truthfully; otherwise the phase stays and
/// Reconciling says a retry is coming.
pub fn failed(
    current: &GatewayStatus,
    generation: i64,
    error: &str,
    failures: u32,
    exhausted: bool,
    retry_at: Timestamp,
    failed_inputs: String,
) -> GatewayStatus {
    let failure_count = i32::try_from(failures).unwrap_or(i32::MAX);
    let (phase, reconciling, stalled) = if exhausted {
        (
            Phase::Failed,
            condition("Reconciling", false, "RetryBudgetExhausted", "", generation),
            condition("Stalled", true, "RetryBudgetExhausted", error, generation),
        )
    } else {
        let phase = match current.phase() {
            Phase::Unspecified | Phase::Pending => Phase::Provisioning,
            other => other,
        };
        (
            phase,
            condition(
                "Reconciling",
                true,
                "ApplyFailed",
                &format!("attempt {failures} failed; retrying"),
                generation,
            ),
            condition("Stalled", false, "ApplyFailed", "", generation),
        )
    };
    let mut provisioning = current.provisioning.clone();
    provisioning.retain(|s| s.name != STEP_MANIFESTS);
    provisioning.insert(0, step(STEP_MANIFESTS, StepState::Failed, error));
    GatewayStatus {
        phase: phase as i32,
        observed_generation: current.observed_generation,
        conditions: vec![
            condition("Ready", false, "ApplyFailed", error, generation),
            reconciling,
            stalled,
        ],
        provisioning,
        route_address: current.route_address.clone(),
        applied_fingerprint: current.applied_fingerprint.clone(),
        failure_count,
        next_retry_time: Some(retry_at),
        message: printable(error, false),
        failed_inputs,
    }
}

/// Whether writing `desired` would change `current` (transition times are
/// the store's, not compared).
pub fn differs(current: &GatewayStatus, desired: &GatewayStatus) -> bool {
    let strip = |s: &GatewayStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = None;
        }
        s
    };
    strip(current) != strip(desired)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observation(workload: Workload) -> Observation {
        Observation { workload, route_address: String::new(), drift: None }
    }

    #[test]
    fn the_reconciler_writes_every_status_field_of_the_api() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(gantry_api::v1::FILE_DESCRIPTOR_SET)
            .expect("the API's descriptor");
        let status = set
            .file
            .iter()
            .flat_map(|f| &f.message_type)
            .find(|m| m.name() == "GatewayStatus")
            .expect("GatewayStatus");
        let mut described: Vec<String> =
            status.field.iter().map(|f| format!("status.{}", f.name())).collect();
        let mut written: Vec<String> = STATUS_PATHS.iter().map(|p| p.to_string()).collect();
        described.sort();
        written.sort();
        assert_eq!(written, described, "a status field the reconciler's writes would drop");
    }

    #[test]
    fn phases_follow_the_workload() {
        let running = applied(3, "fp", &observation(Workload::Available), &Route::None);
        assert_eq!((running.phase(), running.observed_generation), (Phase::Running, 3));
        assert_eq!(running.conditions[0].status(), ConditionStatus::True);
        let rolling = applied(
            3,
            "fp",
            &observation(Workload::Progressing { message: "1 of 2 updated".into() }),
            &Route::None,
        );
        assert_eq!(rolling.phase(), Phase::Provisioning);
        assert_eq!(rolling.conditions[1].status(), ConditionStatus::True, "Reconciling");
        let stuck = applied(
            3,
            "fp",
            &observation(Workload::Stalled {
                reason: "ProgressDeadlineExceeded".into(),
                message: "timed out".into(),
            }),
            &Route::Waiting { ingress: "edge".into() },
        );
        assert_eq!(stuck.phase(), Phase::Degraded);
        assert_eq!(
            (stuck.conditions[2].r#type.as_str(), stuck.conditions[2].status()),
            ("Stalled", ConditionStatus::True)
        );
        assert_eq!(stuck.conditions[0].reason, "ProgressDeadlineExceeded");
        assert_eq!(stuck.provisioning.len(), 3);
        // Written where nothing runs it: settled, nothing claimed.
        let written = applied(1, "fp", &observation(Workload::Written), &Route::Written);
        assert_eq!(written.phase(), Phase::Written);
        assert_eq!(written.observed_generation, 1);
        let ready = &written.conditions[0];
        assert_eq!(
            (ready.r#type.as_str(), ready.status(), ready.reason.as_str()),
            ("Ready", ConditionStatus::Unknown, NOT_OBSERVED)
        );
        let states: Vec<StepState> = written.provisioning.iter().map(|s| s.state()).collect();
        assert_eq!(states, [StepState::Complete, StepState::Pending, StepState::Pending]);
        assert_eq!(written.route_address, "", "no address was observed");
    }

    #[test]
    fn failures_keep_observed_generation_and_tell_the_truth() {
        let current = applied(1, "old", &observation(Workload::Available), &Route::None);
        let retrying = failed(
            &current,
            2,
            "500 from the API server",
            1,
            false,
            Timestamp { seconds: 10, nanos: 0 },
            "inputs".into(),
        );
        assert_eq!(
            (retrying.phase(), retrying.observed_generation, retrying.failure_count),
            (Phase::Running, 1, 1)
        );
        assert_eq!(retrying.applied_fingerprint, "old");
        let failed = failed(
            &current,
            2,
            "500 from the API server",
            5,
            true,
            Timestamp { seconds: 70, nanos: 0 },
            "inputs".into(),
        );
        assert_eq!(failed.phase(), Phase::Failed);
        assert_eq!(failed.message, "500 from the API server");
        assert_eq!(failed.conditions[2].status(), ConditionStatus::True, "Stalled");
        assert!(differs(&current, &failed));
        let mut stamped = failed.clone();
        stamped.conditions[0].last_transition_time = Some(Timestamp::default());
        assert!(!differs(&stamped, &failed), "transition times do not count");
    }
}
