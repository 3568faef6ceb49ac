//! A field that cannot change on a live object (a Deployment's selector)
//! differs: nothing live is discarded unless the gateway or the reconciler
//! opted in ([`RECREATE_ANNOTATION`](crate::targets::RECREATE_ANNOTATION),
//! `--recreate-on-immutable`). Without it the apply fails with the field and
//! the way out; with it the object is replaced. A replaced Deployment is
//! deleted with its ReplicaSets orphaned, so the old pods keep serving
//! until `retire` deletes them.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject};
use serde_json::Value;

use super::calls::is_not_found;
use super::calls::{
    apply_object, bounded, call_error, describe, immutable_field, is_immutable_change,
};
use super::KubeTarget;
use crate::targets::{Owner, TargetError};

impl KubeTarget {
    /// Applies one object; a refused immutable field is reported, or, opted
    /// in, the object is replaced.
    pub(super) async fn apply_or_replace(
        &self,
        api: &Api<DynamicObject>,
        kind: &str,
        name: &str,
        manifest: &Value,
        owner: &Owner,
    ) -> Result<DynamicObject, TargetError> {
        let what = format!("apply {kind} {name}");
        let refusal =
            match apply_object(self.settings.call_timeout, api, kind, name, manifest).await? {
                Err(e) if is_immutable_change(&e) => describe(&e),
                result => return result.map_err(|e| call_error(&what, &e)),
            };
        let field = immutable_field(&refusal);
        if !(owner.recreate || self.settings.recreate_on_immutable) {
            return Err(TargetError::Immutable {
                kind: kind.into(),
                name: name.into(),
                field,
                detail: refusal,
            });
        }
        // A Deployment's pods outlive it (orphaned) until the new one is
        // available; anything else has no pods to keep.
        let orphan = kind == "Deployment";
        tracing::warn!(
            kind,
            name,
            field,
            orphan,
            "an immutable field differs; replacing the object (opted in)"
        );
        let params = if orphan { DeleteParams::orphan() } else { DeleteParams::background() };
        let delete = format!("replace {kind} {name}");
        let call = async {
            match api.delete(name, &params).await {
                Err(e) if is_not_found(&e) => Ok(()),
                other => other.map(|_| ()),
            }
        };
        self.fenced(&delete, bounded(self.settings.call_timeout, &delete, call)).await?;
        if orphan {
            self.retiring.insert(&owner.uid);
        }
        // Orphaning finishes when the garbage collector has released the
        // dependents; the name is free only then.
        wait_gone(self.settings.call_timeout, api, &delete, name).await?;
        match apply_object(self.settings.call_timeout, api, kind, name, manifest).await? {
            Ok(applied) => Ok(applied),
            Err(e) => Err(call_error(&what, &e)),
        }
    }
}

/// Waits until `name` is gone (bounded).
async fn wait_gone(
    timeout: Duration,
    api: &Api<DynamicObject>,
    what: &str,
    name: &str,
) -> Result<(), TargetError> {
    let started = tokio::time::Instant::now();
    while bounded(timeout, what, api.get_opt(name)).await?.is_some() {
        if started.elapsed() > timeout {
            return Err(TargetError::Timeout {
                what: format!("{what}: still there"),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
