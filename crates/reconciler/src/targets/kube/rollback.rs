//! Rollback, as `kubectl rollout undo` does it: the Deployment gets back
//! the pod template of the newest earlier ReplicaSet that still has
//! available pods (what served before the rollout that is stuck). Its
//! ConfigMap is still there: configs are content-addressed and an earlier
//! one is retired only after a rollout that replaced it completed.

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::calls::{apply_object, bounded, call_error};
use super::KubeTarget;
use crate::render::{owned_selector, Rendered, ANNOTATION_FINGERPRINT, ANNOTATION_GENERATION};
use crate::targets::{Owner, TargetError};

const REVISION: &str = "deployment.kubernetes.io/revision";

fn annotation<'a>(rs: &'a DynamicObject, key: &str) -> Option<&'a str> {
    rs.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn pods_fingerprint(template: &Value) -> Option<&str> {
    template["metadata"]["annotations"][ANNOTATION_FINGERPRINT].as_str()
}

impl KubeTarget {
    /// See [`crate::targets::Target::roll_back`].
    pub(super) async fn roll_back_deployment(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Option<i64>, TargetError> {
        let Some(manifest) = rendered.get("Deployment") else { return Ok(None) };
        let current = pods_fingerprint(&manifest.body["spec"]["template"]);
        let api: Api<DynamicObject> = self.api("apps/v1", "ReplicaSet");
        let params = ListParams::default().labels(&owned_selector(&owner.uid));
        let timeout = self.settings.call_timeout;
        let sets = bounded(timeout, "list ReplicaSet", api.list(&params)).await?.items;
        let revision = |rs: &DynamicObject| {
            annotation(rs, REVISION).and_then(|r| r.parse::<i64>().ok()).unwrap_or(0)
        };
        let served = sets
            .iter()
            .filter(|rs| pods_fingerprint(&rs.data["spec"]["template"]) != current)
            .filter(|rs| rs.data["status"]["availableReplicas"].as_i64().unwrap_or(0) > 0)
            .max_by_key(|rs| revision(rs));
        let Some(served) = served else { return Ok(None) };
        let generation =
            annotation(served, ANNOTATION_GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0);
        let mut template = served.data["spec"]["template"].clone();
        if let Some(labels) = template["metadata"]["labels"].as_object_mut() {
            labels.remove("pod-template-hash");
        }
        let mut body = manifest.body.clone();
        body["spec"]["template"] = template;
        body["metadata"]["annotations"][ANNOTATION_GENERATION] =
            Value::String(generation.to_string());
        let name = manifest.name.as_str();
        let what = format!("roll back Deployment {name}");
        let deployments = self.api("apps/v1", "Deployment");
        let applied =
            self.fenced(&what, apply_object(timeout, &deployments, "Deployment", name, &body));
        applied.await?.map_err(|e| call_error(&what, &e))?;
        tracing::warn!(
            gateway = owner.name,
            generation,
            "rolled back to the pods that served before"
        );
        Ok(Some(generation))
    }
}
