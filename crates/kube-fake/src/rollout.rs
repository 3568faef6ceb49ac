//! The controllers kube-fake plays: the Deployment controller's status
//! for a rollout (finished, or stalled when asked), and the ingress
//! controller's address on an Ingress.

use serde_json::{json, Value};

use crate::schema::Schema;
use crate::ssa::{self, Scope, Writer};
use crate::state::{ObjectKey, State, Stored, INGRESSES, INGRESS_ADDRESS};
use crate::util::now_rfc3339;

impl State {
    pub(crate) fn schedule_rollout(&mut self, key: &ObjectKey, value: &Value) {
        let generation = value["metadata"]["generation"].as_i64().unwrap_or(0);
        let observed = value["status"]["observedGeneration"].as_i64().unwrap_or(0);
        if generation != observed && value["metadata"].get("deletionTimestamp").is_none() {
            let due = tokio::time::Instant::now() + self.rollout.delay;
            self.pending_rollouts.entry(key.clone()).or_insert(due);
        }
    }

    /// The Deployment controller's status write for a finished (or
    /// stalled) rollout; for an Ingress, the ingress controller's address.
    pub fn complete_rollout(&mut self, key: &ObjectKey) {
        let Some(old) = self.objects.get(key).map(Stored::load) else { return };
        if key.0 == INGRESSES {
            let now = now_rfc3339();
            let mut new = old.clone();
            new.value["status"] = json!({"loadBalancer": {"ingress": [{"ip": INGRESS_ADDRESS}]}});
            let writer = Writer {
                root: Schema::get().kind("networking.k8s.io/v1", "Ingress"),
                manager: "ingress-controller",
                subresource: Some("status"),
                scope: Scope::Status,
                now: &now,
            };
            ssa::record_update(Some(&old.value), &new.value, &mut new.managers, writer);
            self.replace(key, &old, new);
            return;
        }
        let value = &old.value;
        let generation = value["metadata"]["generation"].as_i64().unwrap_or(1);
        let replicas = value["spec"]["replicas"].as_i64().unwrap_or(1);
        let stalled = self.rollout.stalled.contains(&format!("{}/{}", key.1, key.2));
        let now = now_rfc3339();
        let (available, progressing) = if stalled {
            (
                json!({"type": "Available", "status": if replicas == 0 { "True" } else { "False" }, "reason": "MinimumReplicasUnavailable", "message": "Deployment does not have minimum availability.", "lastUpdateTime": now, "lastTransitionTime": now}),
                json!({"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": format!("ReplicaSet \"{}\" has timed out progressing.", key.2), "lastUpdateTime": now, "lastTransitionTime": now}),
            )
        } else {
            (
                json!({"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability.", "lastUpdateTime": now, "lastTransitionTime": now}),
                json!({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "message": format!("ReplicaSet \"{}\" has successfully progressed.", key.2), "lastUpdateTime": now, "lastTransitionTime": now}),
            )
        };
        let ready = if stalled { 0 } else { replicas };
        let status = json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": if stalled { 0 } else { replicas },
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [available, progressing],
        });
        let mut new = old.clone();
        new.value["status"] = status;
        let writer = Writer {
            root: Schema::get().kind("apps/v1", "Deployment"),
            manager: "kube-controller-manager",
            subresource: Some("status"),
            scope: Scope::Status,
            now: &now,
        };
        ssa::record_update(Some(&old.value), &new.value, &mut new.managers, writer);
        self.replace(key, &old, new);
    }
}
