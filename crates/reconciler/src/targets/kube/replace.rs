//! A field that cannot change on a live object (a Deployment's selector)
//! differs: nothing live is discarded unless the gateway or the reconciler
//! opted in ([`RECREATE_ANNOTATION`](crate::targets::RECREATE_ANNOTATION),
//! `--recreate-on-immutable`). Without it the apply fails with the field and
//! the way out; with it the object is replaced. A replaced Deployment is
//! deleted with its ReplicaSets orphaned, so the old pods keep serving; the
//! ReplicaSets it left are deleted once the new Deployment is available
//! (the Deployment controller may adopt them first, when they match its
//! selector, and roll them down itself).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use serde_json::Value;

use super::cache::{key, Reading};
use super::calls::{apply_object, bounded, describe, immutable_field, is_immutable_change};
use super::calls::{is_not_found, CALL_TIMEOUT};
use super::KubeTarget;
use crate::render::{owned_selector, Rendered, LABEL_GATEWAY_UID};
use crate::status::Workload;
use crate::targets::{Owner, TargetError};

/// The uids of gateways whose replaced Deployment left ReplicaSets behind.
#[derive(Debug, Clone, Default)]
pub(super) struct Retiring(Arc<Mutex<HashSet<String>>>);

impl Retiring {
    fn lock(&self) -> MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn contains(&self, uid: &str) -> bool {
        self.lock().contains(uid)
    }

    /// Finds the ReplicaSets without an owner that carry a gateway's uid (a
    /// replacement a restart interrupted), once at start.
    pub(super) async fn find_owned(self, api: Api<DynamicObject>) {
        let params = ListParams::default().labels(LABEL_GATEWAY_UID);
        match bounded("list ReplicaSet", api.list(&params)).await {
            Ok(list) => {
                let mut retiring = self.lock();
                for rs in list.items.iter().filter(|rs| orphaned(rs)) {
                    if let Some(uid) =
                        rs.metadata.labels.as_ref().and_then(|l| l.get(LABEL_GATEWAY_UID))
                    {
                        retiring.insert(uid.clone());
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list ReplicaSets: ReplicaSets left by a replaced Deployment before this start are not deleted; check the reconciler's Role")
            }
        }
    }
}

fn orphaned(rs: &DynamicObject) -> bool {
    rs.metadata.owner_references.as_ref().is_none_or(Vec::is_empty)
}

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
        let refusal = match apply_object(api, kind, name, manifest).await? {
            Err(e) if is_immutable_change(&e) => describe(&e),
            result => return result.map_err(|e| TargetError::Call { what, message: describe(&e) }),
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
        self.fenced(&delete, bounded(&delete, call)).await?;
        if orphan {
            self.retiring.lock().insert(owner.uid.clone());
        }
        // Orphaning finishes when the garbage collector has released the
        // dependents; the name is free only then.
        wait_gone(api, &delete, name).await?;
        match apply_object(api, kind, name, manifest).await? {
            Ok(applied) => Ok(applied),
            Err(e) => Err(TargetError::Call { what, message: describe(&e) }),
        }
    }

    /// Once the gateway's new Deployment is available, deletes the
    /// ReplicaSets its replaced one left (those without an owner).
    pub(super) async fn retire(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<(), TargetError> {
        if !self.retiring.contains(&owner.uid) || !self.deployment_available(rendered) {
            return Ok(());
        }
        let api = self.api("apps/v1", "ReplicaSet");
        let params = ListParams::default().labels(&owned_selector(&owner.uid));
        let sets = bounded("list ReplicaSet", api.list(&params)).await?.items;
        for rs in sets.iter().filter(|rs| orphaned(rs)) {
            let name = rs.metadata.name.clone().unwrap_or_default();
            let what = format!("delete ReplicaSet {name}");
            let call = async {
                match api.delete(&name, &DeleteParams::background()).await {
                    Err(e) if is_not_found(&e) => Ok(()),
                    other => other.map(|_| ()),
                }
            };
            self.fenced(&what, bounded(&what, call)).await?;
            tracing::info!(
                gateway = owner.name,
                replicaset = name,
                "the replaced Deployment's pods retired"
            );
        }
        self.retiring.lock().remove(&owner.uid);
        Ok(())
    }

    /// Whether old pods wait to be retired now that the new Deployment is
    /// available (observe then asks for a pass that retires them).
    pub(super) fn retirement_due(&self, owner: &Owner, workload: &Workload) -> bool {
        matches!(workload, Workload::Available) && self.retiring.contains(&owner.uid)
    }

    fn deployment_available(&self, rendered: &Rendered) -> bool {
        let Some(deployment) = rendered.get("Deployment") else { return true };
        let cache = self.cache();
        let reading =
            cache.objects.get(&key("Deployment", &deployment.name)).and_then(|l| l.reading.clone());
        matches!(reading.as_deref(), Some(Reading::Rollout(Workload::Available)))
    }
}

/// Waits until `name` is gone (bounded).
async fn wait_gone(api: &Api<DynamicObject>, what: &str, name: &str) -> Result<(), TargetError> {
    let started = tokio::time::Instant::now();
    while bounded(what, api.get_opt(name)).await?.is_some() {
        if started.elapsed() > CALL_TIMEOUT {
            return Err(TargetError::Timeout {
                what: format!("{what}: still there"),
                after: CALL_TIMEOUT,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
