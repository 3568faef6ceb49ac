//! Rules for status writes (rules 3 and 4): the observed_generation range,
//! monotonic provisioning steps, condition transition times and phases.

use gantry_api::steps;
use gantry_api::v1::{Condition, ConditionStatus, Phase, ProvisioningStep, StepState};
use prost_types::Timestamp;

use crate::error::RuleError;

/// Longest status text (message, a condition's or a step's message) the
/// store accepts, in bytes.
pub const MAX_TEXT_BYTES: usize = 32 * 1024;

/// Most conditions, and most provisioning steps, in a status.
pub const MAX_ENTRIES: usize = 32;

/// Refuses text with control characters other than newlines and tabs
/// (`single_line`: none at all), which would break logs, terminals and
/// JSON clients reading the status.
pub fn check_text(field: &str, text: &str, max: usize, single_line: bool) -> Result<(), RuleError> {
    if text.len() > max {
        return Err(RuleError::invalid(field, format!("at most {max} bytes")));
    }
    let bad = |c: char| c.is_control() && (single_line || !matches!(c, '\n' | '\t'));
    if text.chars().any(bad) {
        return Err(RuleError::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// `text` with the control characters [`check_text`] refuses replaced by
/// U+FFFD, so text from elsewhere (an API server's error) can always be
/// written to a status.
pub fn printable(text: &str, single_line: bool) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && (single_line || !matches!(c, '\n' | '\t')) {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// Refuses a timestamp outside the range of `google.protobuf.Timestamp`
/// (years 1 to 9999, nanos in `0..1e9`), which JSON clients cannot read.
pub fn check_timestamp(field: &str, t: &Timestamp) -> Result<(), RuleError> {
    let seconds_ok = (-62_135_596_800..=253_402_300_799).contains(&t.seconds);
    if !seconds_ok || !(0..1_000_000_000).contains(&t.nanos) {
        return Err(RuleError::invalid(
            field,
            "must be a valid time (years 1 to 9999, nanos from 0 to 999999999)",
        ));
    }
    Ok(())
}

/// `text` cut to at most `max` bytes keeping its start and its end (an
/// error's cause is often at the end), joined by a marker; on character
/// boundaries.
pub fn shorten(text: &str, max: usize) -> String {
    const MARK: &str = " […] ";
    if text.len() <= max {
        return text.to_string();
    }
    if max <= MARK.len() {
        return text[..floor_boundary(text, max)].to_string();
    }
    let keep = max - MARK.len();
    let head = floor_boundary(text, keep / 2);
    let mut tail = text.len() - (keep - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}{MARK}{}", &text[..head], &text[tail..])
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Rule 3: a new `observed_generation` must satisfy
/// `current <= new <= generation`.
pub fn check_observed_generation(current: i64, new: i64, generation: i64) -> Result<(), RuleError> {
    if new < current {
        Err(RuleError::failed_precondition(
            "gateway.status.observed_generation",
            format!("{new} is below the current observed_generation {current}; observed_generation never moves backwards"),
        ))
    } else if new > generation {
        Err(RuleError::failed_precondition(
            "gateway.status.observed_generation",
            format!("{new} is above the gateway's generation {generation}; a reconciler can only observe a generation that exists"),
        ))
    } else {
        Ok(())
    }
}

fn rank(state: StepState) -> u8 {
    match state {
        StepState::Unspecified => 0,
        StepState::Pending => 1,
        StepState::InProgress => 2,
        StepState::Complete => 3,
        StepState::Failed => 4,
    }
}

/// The state a step takes when `incoming` is written over `current` within
/// one generation: forward only, FAILED always shows, FAILED can recover.
pub fn next_step_state(current: StepState, incoming: StepState) -> StepState {
    match (current, incoming) {
        (_, StepState::Failed) => StepState::Failed,
        (StepState::Failed, next) => next,
        (current, next) if rank(next) > rank(current) => next,
        (current, _) => current,
    }
}

/// Rule 4: merges incoming steps into the current ones by name. Steps the
/// writer did not mention are kept; new steps are appended in the writer's
/// order. A replayed or reordered write therefore never regresses a step
/// of work done ([`steps::MANIFESTS_APPLIED`]); a step that reports what is
/// live ([`steps::OBSERVED`]) takes the state written, back too.
pub fn merge_provisioning(
    current: &[ProvisioningStep],
    incoming: &[ProvisioningStep],
) -> Vec<ProvisioningStep> {
    let mut merged = current.to_vec();
    for step in incoming {
        match merged.iter_mut().find(|s| s.name == step.name) {
            Some(existing) => {
                let next = if steps::OBSERVED.contains(&step.name.as_str()) {
                    step.state()
                } else {
                    next_step_state(existing.state(), step.state())
                };
                if next != existing.state()
                    || (next == step.state() && existing.message != step.message)
                {
                    existing.set_state(next);
                    existing.message.clone_from(&step.message);
                }
            }
            None => merged.push(step.clone()),
        }
    }
    merged
}

/// Checks provisioning steps a writer sends: named, a known state, no
/// duplicates.
pub fn validate_provisioning(steps: &[ProvisioningStep]) -> Result<(), RuleError> {
    if steps.len() > MAX_ENTRIES {
        return Err(RuleError::invalid(
            "gateway.status.provisioning",
            format!("at most {MAX_ENTRIES} steps"),
        ));
    }
    for (i, step) in steps.iter().enumerate() {
        let field = || format!("gateway.status.provisioning[{i}]");
        if step.name.is_empty() || step.name.len() > 128 {
            return Err(RuleError::invalid(field(), "name is required, at most 128 characters"));
        }
        check_text(&format!("{}.message", field()), &step.message, MAX_TEXT_BYTES, false)?;
        check_text(&format!("{}.name", field()), &step.name, 128, true)?;
        if StepState::try_from(step.state).unwrap_or_default() == StepState::Unspecified {
            return Err(RuleError::invalid(
                field(),
                "state must be PENDING, IN_PROGRESS, COMPLETE or FAILED",
            ));
        }
        if steps[..i].iter().any(|s| s.name == step.name) {
            return Err(RuleError::invalid(field(), format!("duplicate step {:?}", step.name)));
        }
    }
    Ok(())
}

/// Sets the conditions to `incoming`, keeping `last_transition_time` of a
/// condition whose status did not change and stamping `now` on one that did
/// (as Kubernetes' `meta.SetStatusCondition`).
pub fn merge_conditions(
    current: &[Condition],
    incoming: &[Condition],
    now: &Timestamp,
) -> Vec<Condition> {
    incoming
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.last_transition_time = match current.iter().find(|old| old.r#type == c.r#type) {
                Some(old) if old.status == c.status => old.last_transition_time,
                _ => Some(*now),
            };
            c
        })
        .collect()
}

/// Checks conditions a writer sends: a type, a known status, no duplicate
/// types.
pub fn validate_conditions(conditions: &[Condition], generation: i64) -> Result<(), RuleError> {
    if conditions.len() > MAX_ENTRIES {
        return Err(RuleError::invalid(
            "gateway.status.conditions",
            format!("at most {MAX_ENTRIES} conditions"),
        ));
    }
    for (i, c) in conditions.iter().enumerate() {
        let field = || format!("gateway.status.conditions[{i}]");
        let type_ok = !c.r#type.is_empty()
            && c.r#type.len() <= 316
            && c.r#type
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '/' | '-' | '_'));
        if !type_ok {
            return Err(RuleError::invalid(
                field(),
                "type is required: letters, digits, '.', '/', '-', '_'",
            ));
        }
        if ConditionStatus::try_from(c.status).unwrap_or_default() == ConditionStatus::Unspecified {
            return Err(RuleError::invalid(field(), "status must be TRUE, FALSE or UNKNOWN"));
        }
        check_text(&format!("{}.reason", field()), &c.reason, 1024, true)?;
        check_text(&format!("{}.message", field()), &c.message, MAX_TEXT_BYTES, false)?;
        if c.reason.len() > 1024 || c.message.len() > MAX_TEXT_BYTES {
            return Err(RuleError::invalid(
                field(),
                "reason at most 1024 and message at most 32768 characters",
            ));
        }
        if !(0..=generation).contains(&c.observed_generation) {
            return Err(RuleError::invalid(
                field(),
                format!("observed_generation must be between 0 and the generation {generation}"),
            ));
        }
        if conditions[..i].iter().any(|o| o.r#type == c.r#type) {
            return Err(RuleError::invalid(
                field(),
                format!("duplicate condition type {:?}", c.r#type),
            ));
        }
    }
    Ok(())
}

/// Checks a phase written by the reconciler. DELETING belongs to the store:
/// it is set by deletion and stays while the gateway is being deleted.
pub fn check_phase(phase: i32, deleting: bool) -> Result<Phase, RuleError> {
    let field = "gateway.status.phase";
    let phase = Phase::try_from(phase)
        .map_err(|_| RuleError::invalid(field, format!("unknown phase {phase}")))?;
    match (phase, deleting) {
        (Phase::Unspecified, _) => {
            Err(RuleError::invalid(field, "required: a phase other than UNSPECIFIED"))
        }
        (Phase::Deleting, false) => Err(RuleError::failed_precondition(
            field,
            "DELETING is set by DeleteGateway, not by a status write",
        )),
        (Phase::Deleting, true) => Ok(phase),
        (_, true) => Err(RuleError::failed_precondition(
            field,
            "the gateway is being deleted; its phase stays DELETING",
        )),
        (_, false) => Ok(phase),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_passes_the_check() {
        let raw = "a\u{0}b\u{1b}[2J\nc\td\r";
        assert!(check_text("f", raw, 100, false).is_err());
        assert!(check_text("f", &printable(raw, false), 100, false).is_ok());
        assert!(check_text("f", &printable(raw, true), 100, true).is_ok());
        assert_eq!(printable("a\nb", false), "a\nb");
    }

    #[test]
    fn shorten_keeps_start_and_end_within_the_limit() {
        assert_eq!(shorten("short", 10), "short");
        let long = format!("start {} the cause", "é".repeat(20_000));
        let cut = shorten(&long, MAX_TEXT_BYTES);
        assert!(cut.len() <= MAX_TEXT_BYTES, "{}", cut.len());
        assert!(cut.starts_with("start ") && cut.ends_with(" the cause"), "{cut:.40}");
        assert!(cut.contains("[…]"));
        assert_eq!(shorten("ééé", 3), "é");
    }

    fn step(name: &str, state: StepState) -> ProvisioningStep {
        ProvisioningStep { name: name.into(), state: state as i32, message: String::new() }
    }

    #[test]
    fn observed_generation_range() {
        assert!(check_observed_generation(1, 1, 2).is_ok());
        assert!(check_observed_generation(1, 2, 2).is_ok());
        let below = check_observed_generation(2, 1, 3).unwrap_err();
        assert!(matches!(below, RuleError::FailedPrecondition { .. }));
        assert_eq!(below.field(), Some("gateway.status.observed_generation"));
        assert!(check_observed_generation(0, 3, 2).is_err());
    }

    #[test]
    fn steps_move_forward_only() {
        use StepState::*;
        assert_eq!(next_step_state(Pending, InProgress), InProgress);
        assert_eq!(next_step_state(Complete, InProgress), Complete);
        assert_eq!(next_step_state(Complete, Pending), Complete);
        assert_eq!(next_step_state(Complete, Failed), Failed);
        assert_eq!(next_step_state(Failed, InProgress), InProgress);
        assert_eq!(next_step_state(Failed, Pending), Pending);
    }

    #[test]
    fn observed_steps_follow_what_is_live_and_work_done_stays_done() {
        let current = vec![
            step(steps::MANIFESTS_APPLIED, StepState::Complete),
            step(steps::WORKLOAD_AVAILABLE, StepState::Complete),
            step(steps::ROUTE_ADMITTED, StepState::Complete),
        ];
        // A re-rollout at the same generation, an address withdrawn.
        let incoming = vec![
            step(steps::MANIFESTS_APPLIED, StepState::InProgress),
            step(steps::WORKLOAD_AVAILABLE, StepState::InProgress),
            step(steps::ROUTE_ADMITTED, StepState::InProgress),
        ];
        let merged = merge_provisioning(&current, &incoming);
        let states: Vec<_> = merged.iter().map(|s| (s.name.as_str(), s.state())).collect();
        assert_eq!(
            states,
            [
                (steps::MANIFESTS_APPLIED, StepState::Complete),
                (steps::WORKLOAD_AVAILABLE, StepState::InProgress),
                (steps::ROUTE_ADMITTED, StepState::InProgress)
            ]
        );
    }

    #[test]
    fn merge_keeps_unmentioned_and_appends_new() {
        let current = vec![
            step("ManifestsApplied", StepState::Complete),
            step("WorkloadAvailable", StepState::InProgress),
        ];
        let incoming = vec![
            step("ManifestsApplied", StepState::Pending),
            step("RouteAdmitted", StepState::Pending),
        ];
        let merged = merge_provisioning(&current, &incoming);
        let states: Vec<_> = merged.iter().map(|s| (s.name.as_str(), s.state())).collect();
        assert_eq!(
            states,
            [
                ("ManifestsApplied", StepState::Complete),
                ("WorkloadAvailable", StepState::InProgress),
                ("RouteAdmitted", StepState::Pending)
            ]
        );
    }

    #[test]
    fn condition_transition_time_moves_only_on_status_change() {
        let t0 = Timestamp { seconds: 100, nanos: 0 };
        let t1 = Timestamp { seconds: 200, nanos: 0 };
        let ready = |status: ConditionStatus, at: Option<Timestamp>| Condition {
            r#type: "Ready".into(),
            status: status as i32,
            last_transition_time: at,
            ..Default::default()
        };
        let current = vec![ready(ConditionStatus::False, Some(t0))];
        let same = merge_conditions(&current, &[ready(ConditionStatus::False, None)], &t1);
        assert_eq!(same[0].last_transition_time, Some(t0));
        let flipped = merge_conditions(&current, &[ready(ConditionStatus::True, None)], &t1);
        assert_eq!(flipped[0].last_transition_time, Some(t1));
    }

    #[test]
    fn invalid_steps_and_conditions() {
        assert!(validate_provisioning(&[step("", StepState::Pending)]).is_err());
        assert!(validate_provisioning(&[step("A", StepState::Unspecified)]).is_err());
        assert!(validate_provisioning(&[
            step("A", StepState::Pending),
            step("A", StepState::Complete)
        ])
        .is_err());
        let c = Condition { r#type: "Ready".into(), status: 9, ..Default::default() };
        assert_eq!(
            validate_conditions(&[c], 1).unwrap_err().field(),
            Some("gateway.status.conditions[0]")
        );
    }

    #[test]
    fn phases() {
        assert_eq!(check_phase(Phase::Running as i32, false), Ok(Phase::Running));
        assert!(check_phase(Phase::Unspecified as i32, false).is_err());
        assert!(check_phase(42, false).is_err());
        assert!(check_phase(Phase::Deleting as i32, false).is_err());
        assert!(check_phase(Phase::Running as i32, true).is_err());
        assert_eq!(check_phase(Phase::Deleting as i32, true), Ok(Phase::Deleting));
    }
}
