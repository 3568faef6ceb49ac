//! Rollout judging: a Deployment's rollout as `kubectl rollout status`
//! reads it.

use k8s_openapi::api::apps::v1::Deployment;

use crate::status::{Workload, PROGRESS_DEADLINE_EXCEEDED};

/// Whether a Deployment's rollout of its current generation is complete,
/// in progress, or stalled (kubectl rollout status semantics).
pub fn rollout(deployment: &Deployment) -> Workload {
    let generation = deployment.metadata.generation.unwrap_or(0);
    let desired = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = &deployment.status else {
        return Workload::Progressing { message: "waiting for the deployment controller".into() };
    };
    // As `kubectl rollout status`: a condition describes the generation the
    // controller observed, so nothing counts until it caught up (a stalled
    // rollout that was just fixed is progressing again, not stalled).
    if status.observed_generation.unwrap_or(0) < generation {
        return Workload::Progressing { message: "waiting for the rollout to start".into() };
    }
    if let Some(c) = status.conditions.iter().flatten().find(|c| c.type_ == "Progressing") {
        if c.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED) {
            return Workload::Stalled {
                reason: PROGRESS_DEADLINE_EXCEEDED.into(),
                message: c
                    .message
                    .clone()
                    .unwrap_or_else(|| "the rollout exceeded its progress deadline".into()),
            };
        }
    }
    let updated = status.updated_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    if updated < desired {
        return Workload::Progressing {
            message: format!("{updated} of {desired} replicas updated"),
        };
    }
    if total > updated {
        return Workload::Progressing {
            message: format!("{} old replicas pending termination", total - updated),
        };
    }
    if available < updated {
        return Workload::Progressing {
            message: format!("{available} of {updated} updated replicas available"),
        };
    }
    Workload::Available
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn deployment(generation: i64, status: Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "edge", "generation": generation},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": status,
        }))
        .unwrap_or_default()
    }

    fn deadline_exceeded(observed: i64) -> Value {
        json!({
            "observedGeneration": observed, "replicas": 2, "updatedReplicas": 2,
            "availableReplicas": 0,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}],
        })
    }

    #[test]
    fn a_rollout_is_judged_as_kubectl_rollout_status_does() {
        // The controller has not seen the new generation: its conditions
        // describe the old one, so a fix is not reported as stalled.
        assert!(matches!(
            rollout(&deployment(3, deadline_exceeded(2))),
            Workload::Progressing { .. }
        ));
        assert!(matches!(rollout(&deployment(2, deadline_exceeded(2))), Workload::Stalled { .. }));
        let complete = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert_eq!(rollout(&deployment(2, complete)), Workload::Available);
        let old_pods = json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(matches!(rollout(&deployment(2, old_pods)), Workload::Progressing { .. }));
    }
}
