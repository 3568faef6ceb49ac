//! What an earlier rollout left, retired once the gateway's Deployment is
//! available at the current rendering: the ConfigMaps of earlier configs
//! (content-addressed, so the old pods read theirs until they are gone)
//! and the ReplicaSets a replaced Deployment left (orphaned, so its pods
//! served meanwhile; the Deployment controller may adopt them first, when
//! they match its selector, and roll them down itself). Observe asks for
//! an apply pass when something is due; the apply retires it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};

use super::cache::{key, Reading};
use super::calls::{bounded, delete_object};
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

    pub(super) fn insert(&self, uid: &str) {
        self.lock().insert(uid.to_string());
    }

    pub(super) fn contains(&self, uid: &str) -> bool {
        self.lock().contains(uid)
    }

    /// Finds the ReplicaSets without an owner that carry a gateway's uid (a
    /// replacement a restart interrupted), once at start.
    pub(super) async fn find_owned(self, api: Api<DynamicObject>, timeout: Duration) {
        let params = ListParams::default().labels(LABEL_GATEWAY_UID);
        match bounded(timeout, "list ReplicaSet", api.list(&params)).await {
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
    /// Once the gateway's new Deployment is available, deletes the
    /// ReplicaSets its replaced one left (those without an owner).
    pub(super) async fn retire(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<(), TargetError> {
        if !self.deployment_available(rendered) {
            return Ok(());
        }
        if self.cache().owns_unrendered(&owner.uid, "ConfigMap", &rendered.objects) {
            let api = self.api("v1", "ConfigMap");
            let current = rendered.get("ConfigMap").map(|m| m.name.as_str());
            for config in self.owned(&api, owner, "ConfigMap").await? {
                let name = config.metadata.name.unwrap_or_default();
                if Some(name.as_str()) != current {
                    let what = format!("retire ConfigMap {name}");
                    self.fenced(
                        &what,
                        delete_object(self.settings.call_timeout, &api, &what, &name),
                    )
                    .await?;
                    tracing::info!(
                        gateway = owner.name,
                        configmap = name,
                        "an earlier config retired"
                    );
                }
            }
        }
        if self.retiring.contains(&owner.uid) {
            let api = self.api("apps/v1", "ReplicaSet");
            let params = ListParams::default().labels(&owned_selector(&owner.uid));
            let timeout = self.settings.call_timeout;
            let sets = bounded(timeout, "list ReplicaSet", api.list(&params)).await?.items;
            for rs in sets.iter().filter(|rs| orphaned(rs)) {
                let name = rs.metadata.name.clone().unwrap_or_default();
                let what = format!("retire ReplicaSet {name}");
                self.fenced(&what, delete_object(self.settings.call_timeout, &api, &what, &name))
                    .await?;
                tracing::info!(
                    gateway = owner.name,
                    replicaset = name,
                    "the replaced Deployment's pods retired"
                );
            }
            self.retiring.lock().remove(&owner.uid);
        }
        Ok(())
    }

    /// Whether something waits to be retired now that the Deployment is
    /// available (observe then asks for a pass that retires it).
    pub(super) fn retirement_due(
        &self,
        owner: &Owner,
        rendered: &Rendered,
        workload: &Workload,
    ) -> bool {
        matches!(workload, Workload::Available)
            && (self.retiring.contains(&owner.uid)
                || self.cache().owns_unrendered(&owner.uid, "ConfigMap", &rendered.objects))
    }

    fn deployment_available(&self, rendered: &Rendered) -> bool {
        let Some(deployment) = rendered.get("Deployment") else { return true };
        let cache = self.cache();
        let reading =
            cache.objects.get(&key("Deployment", &deployment.name)).and_then(|l| l.reading.clone());
        matches!(reading.as_deref(), Some(Reading::Rollout(Workload::Available)))
    }
}
