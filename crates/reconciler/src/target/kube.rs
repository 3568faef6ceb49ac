//! The Kubernetes target: kube-rs server-side apply with the field manager
//! `gantry-reconciler` (forced: the reconciler owns these objects), prune
//! by label of kinds no longer rendered, rollout observation from the
//! Deployment, and a watch on owned Deployments so that out-of-band edits
//! are repaired. Every call has a bounded timeout; only a genuine NotFound
//! counts as absent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::watcher;
use kube::Client;
use serde_json::Value;

use super::{Owner, Target, TargetError};
use crate::render::{
    owned_selector, Rendered, FIELD_MANAGER, LABEL_GATEWAY, LABEL_MANAGED_BY, MANAGED_BY,
    OWNED_KINDS,
};
use crate::status::{Observation, Workload};

/// Longest any single call to the cluster may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Gateways' objects in one namespace of a cluster.
pub struct KubeTarget {
    client: Client,
    namespace: String,
    /// The Deployment as our last apply left it, per gateway: a different
    /// live spec means someone changed it. (Its generation alone cannot
    /// tell: the API server also bumps it when annotations change, as the
    /// deployment controller's revision annotation does after every
    /// rollout.)
    applied: Mutex<HashMap<String, Applied>>,
    /// Owned objects that exist, as the watches of every owned kind see
    /// them: a rendered object missing here was deleted out of band.
    present: Arc<Mutex<Present>>,
}

/// What the owned-object watches know (an informer cache of names only).
#[derive(Debug, Default)]
struct Present {
    /// Kinds whose watch has finished its initial list.
    synced: HashSet<String>,
    /// `(kind, name)` of existing owned objects → their gateway label.
    objects: HashMap<(String, String), Option<String>>,
    /// `(kind, gateway)` → how many objects of that kind the gateway owns.
    owners: HashMap<(String, String), usize>,
    /// What observing needs of each owned Deployment, by name: resyncs and
    /// restarts then read no Deployment from the API server.
    deployments: HashMap<String, DeploymentView>,
    /// Deployments the watch saw deleted (until the next apply of them).
    deleted_deployments: HashSet<String>,
    /// Completed lists of the Deployment watch.
    deployment_lists: u64,
}

/// What the reconciler remembers of a Deployment it applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Applied {
    /// Its generation: a cached copy older than this is stale.
    generation: i64,
    /// Hash of its `spec` as the API server returned it.
    spec_hash: u64,
    /// How many times the Deployment watch had listed when we applied: a
    /// later list without the object means it is gone.
    lists: u64,
}

/// The part of a live Deployment the reconciler looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeploymentView {
    generation: Option<i64>,
    /// Hash of `spec` (with the server's defaults), to tell drift apart
    /// from metadata-only changes.
    spec_hash: u64,
    /// The rendered fingerprint carried by the pod template.
    fingerprint: Option<String>,
    workload: Workload,
}

impl DeploymentView {
    fn of(deployment: &Deployment) -> DeploymentView {
        let fingerprint = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(crate::render::ANNOTATION_FINGERPRINT))
            .cloned();
        let spec = serde_json::to_vec(&deployment.spec).unwrap_or_default();
        DeploymentView {
            generation: deployment.metadata.generation,
            spec_hash: {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                spec.hash(&mut hasher);
                hasher.finish()
            },
            fingerprint,
            workload: rollout(deployment),
        }
    }
}

impl Present {
    fn insert(&mut self, kind: &str, name: String, gateway: Option<String>) {
        if let Some(old) = self.objects.insert((kind.to_string(), name), gateway.clone()) {
            self.release(kind, old);
        }
        if let Some(gateway) = gateway {
            *self.owners.entry((kind.to_string(), gateway)).or_default() += 1;
        }
    }

    fn remove(&mut self, kind: &str, name: String) {
        if let Some(old) = self.objects.remove(&(kind.to_string(), name)) {
            self.release(kind, old);
        }
    }

    fn release(&mut self, kind: &str, gateway: Option<String>) {
        let Some(gateway) = gateway else { return };
        let key = (kind.to_string(), gateway);
        if let Some(count) = self.owners.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.owners.remove(&key);
            }
        }
    }

    /// Forgets a kind while its watch lists again.
    fn relisting(&mut self, kind: &str) {
        self.synced.remove(kind);
        if kind == "Deployment" {
            self.deployments.clear();
        }
        self.objects.retain(|(k, _), _| k != kind);
        self.owners.retain(|(k, _), _| k != kind);
    }

    /// Whether `gateway` may own objects of `kind`: always, until that
    /// kind's watch has listed; afterwards, whether the watch saw one.
    fn may_own(&self, kind: &str, gateway: &str) -> bool {
        !self.synced.contains(kind) || self.owners.contains_key(&(kind.to_string(), gateway.into()))
    }

    fn exists(&self, kind: &str, name: &str) -> bool {
        self.objects.contains_key(&(kind.to_string(), name.to_string()))
    }
}

impl std::fmt::Debug for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTarget").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

fn api_resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let plural = match kind {
        "Ingress" => "ingresses".to_string(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural)
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}

async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, TargetError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TargetError(format!("{what}: {}", describe(&e)))),
        Err(_) => Err(TargetError(format!("{what}: no answer within {CALL_TIMEOUT:?}"))),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Deletes one owned object (background propagation); already gone is fine.
async fn delete_object(
    api: &Api<DynamicObject>,
    what: &str,
    name: &str,
) -> Result<(), TargetError> {
    let call = async {
        match api.delete(name, &DeleteParams::background()).await {
            Err(e) if is_not_found(&e) => Ok(()),
            other => other.map(|_| ()),
        }
    };
    bounded(what, call).await
}

/// Whether the API server refused a change to a field that cannot change
/// once set (such as a Deployment's `spec.selector`).
fn is_immutable_change(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 422 && s.message.contains("field is immutable"))
}

/// Server-side applies `manifest`; when the live object differs in a field
/// that cannot change, deletes it and applies again, as
/// `kubectl apply --force` does (retrying the same apply would fail
/// forever).
async fn apply_or_recreate(
    api: &Api<DynamicObject>,
    kind: &str,
    name: &str,
    manifest: &Value,
) -> Result<DynamicObject, TargetError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let what = format!("apply {kind} {name}");
    match tokio::time::timeout(CALL_TIMEOUT, api.patch(name, &params, &Patch::Apply(manifest)))
        .await
    {
        Ok(Err(e)) if is_immutable_change(&e) => {
            tracing::warn!(kind, name, error = %describe(&e), "an immutable field differs; recreating the object");
            delete_object(api, &format!("recreate {kind} {name}"), name).await?;
            bounded(&what, api.patch(name, &params, &Patch::Apply(manifest))).await
        }
        Ok(result) => result.map_err(|e| TargetError(format!("{what}: {}", describe(&e)))),
        Err(_) => Err(TargetError(format!("{what}: no answer within {CALL_TIMEOUT:?}"))),
    }
}

impl KubeTarget {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            applied: Mutex::default(),
            present: Arc::default(),
        }
    }

    fn api(&self, api_version: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &api_resource(api_version, kind))
    }

    fn remember(&self, gateway: &str, deployment: Option<&DeploymentView>) {
        let lists = {
            let mut present =
                self.present.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            present.deleted_deployments.remove(gateway);
            present.deployment_lists
        };
        let mut map = self.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match deployment {
            Some(d) => map.insert(
                gateway.to_string(),
                Applied { generation: d.generation.unwrap_or(0), spec_hash: d.spec_hash, lists },
            ),
            None => map.remove(gateway),
        };
    }

    fn remembered(&self, gateway: &str) -> Option<Applied> {
        self.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(gateway).copied()
    }

    /// The Deployment as the watch last saw it (`Some(None)`: absent), when
    /// that is at least as new as our last apply; `None` until the watch
    /// can tell (not listed yet, or it lags our apply).
    fn cached_deployment(&self, gateway: &str) -> Option<Option<DeploymentView>> {
        let present = self.present.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !present.synced.contains("Deployment") {
            return None;
        }
        let applied = self.remembered(gateway);
        match (present.deployments.get(gateway), applied) {
            (Some(view), Some(applied)) if view.generation.unwrap_or(0) < applied.generation => {
                None
            }
            (Some(view), _) => Some(Some(view.clone())),
            (None, None) => Some(None),
            // Applied, and since then deleted or missing from a new list.
            (None, Some(applied))
                if present.deleted_deployments.contains(gateway)
                    || present.deployment_lists > applied.lists =>
            {
                Some(None)
            }
            (None, Some(_)) => None,
        }
    }

    fn may_own(&self, kind: &str, gateway: &str) -> bool {
        self.present
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .may_own(kind, gateway)
    }

    /// Names of owned objects of one kind.
    async fn owned(
        &self,
        api: &Api<DynamicObject>,
        gateway: &str,
        kind: &str,
    ) -> Result<Vec<DynamicObject>, TargetError> {
        let params = ListParams::default().labels(&owned_selector(gateway));
        Ok(bounded(&format!("list {kind}"), api.list(&params)).await?.items)
    }
}

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
        if c.reason.as_deref() == Some("ProgressDeadlineExceeded") {
            return Workload::Stalled {
                reason: "ProgressDeadlineExceeded".into(),
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

/// Updates what exists from one watch event; the gateway to re-check, if
/// the event concerns one.
fn track(
    present: &Mutex<Present>,
    kind: &str,
    event: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> Option<String> {
    let mut present = present.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let gateway_of =
        |o: &DynamicObject| o.metadata.labels.as_ref().and_then(|l| l.get(LABEL_GATEWAY).cloned());
    match event {
        Ok(watcher::Event::Init) => {
            present.relisting(kind);
            None
        }
        Ok(watcher::Event::InitDone) => {
            present.synced.insert(kind.to_string());
            if kind == "Deployment" {
                present.deployment_lists += 1;
            }
            None
        }
        Ok(watcher::Event::InitApply(o) | watcher::Event::Apply(o)) => {
            let gateway = gateway_of(&o);
            let name = o.metadata.name.clone().unwrap_or_default();
            if kind == "Deployment" {
                match o.try_parse::<Deployment>() {
                    Ok(d) => {
                        present.deployments.insert(name.clone(), DeploymentView::of(&d));
                    }
                    Err(e) => {
                        tracing::warn!(name, error = %e, "cannot read a watched Deployment");
                        present.deployments.remove(&name);
                    }
                }
            }
            present.insert(kind, name, gateway.clone());
            gateway
        }
        Ok(watcher::Event::Delete(o)) => {
            let gateway = gateway_of(&o);
            let name = o.metadata.name.unwrap_or_default();
            if kind == "Deployment" {
                present.deployments.remove(&name);
                present.deleted_deployments.insert(name.clone());
            }
            present.remove(kind, name);
            gateway
        }
        Err(e) => {
            tracing::warn!(kind, error = %e, "watch of owned objects interrupted; it resumes by itself");
            None
        }
    }
}

#[tonic::async_trait]
impl Target for KubeTarget {
    async fn apply(&self, owner: &Owner, manifests: &[Value]) -> Result<(), TargetError> {
        let gateway = owner.name.as_str();
        let mut rendered_kinds = Vec::new();
        for manifest in manifests {
            let (api_version, kind) = (
                manifest["apiVersion"].as_str().unwrap_or(""),
                manifest["kind"].as_str().unwrap_or(""),
            );
            let name = manifest["metadata"]["name"].as_str().unwrap_or("");
            let api = self.api(api_version, kind);
            let applied = apply_or_recreate(&api, kind, name, manifest).await?;
            if kind == "Deployment" {
                let view = applied.try_parse::<Deployment>().ok().map(|d| DeploymentView::of(&d));
                self.remember(gateway, view.as_ref());
            }
            rendered_kinds.push(kind.to_string());
        }
        // Prune: owned objects of kinds no longer rendered, newest kinds
        // first. The list is skipped when the kind's watch has listed and
        // saw none of this gateway's (a production cluster would otherwise
        // serve one label-selected list per kind per apply).
        for (api_version, kind) in OWNED_KINDS.iter().rev() {
            if rendered_kinds.iter().any(|k| k == kind) || !self.may_own(kind, gateway) {
                continue;
            }
            let api = self.api(api_version, kind);
            for object in self.owned(&api, gateway, kind).await? {
                let name = object.metadata.name.unwrap_or_default();
                delete_object(&api, &format!("prune {kind} {name}"), &name).await?;
                tracing::info!(gateway, kind, name, "pruned");
            }
        }
        Ok(())
    }

    async fn observe(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, TargetError> {
        let gateway = owner.name.as_str();
        let has_route = rendered.manifests.iter().any(|m| m["kind"] == "Ingress");
        let route_address = if has_route {
            let ingress = self.api("networking.k8s.io/v1", "Ingress");
            let live = bounded("get Ingress", ingress.get_opt(gateway)).await?;
            let lb = live.as_ref().map(|i| &i.data["status"]["loadBalancer"]["ingress"][0]);
            let from_status =
                lb.and_then(|lb| lb["hostname"].as_str().or(lb["ip"].as_str())).unwrap_or("");
            let host = rendered
                .manifests
                .iter()
                .find(|m| m["kind"] == "Ingress")
                .and_then(|i| i["spec"]["rules"][0]["host"].as_str())
                .unwrap_or("");
            if from_status.is_empty() {
                host.to_string()
            } else {
                from_status.to_string()
            }
        } else {
            String::new()
        };
        // Deployments are read from the watch only, as an informer-based
        // controller does: no GET per check, and the Role needs no `get`.
        // Until the watch has caught up the rollout is reported as in
        // progress, and the gateway is checked again at the poll interval.
        let Some(deployment) = self.cached_deployment(gateway) else {
            return Ok(Observation {
                workload: Workload::Progressing {
                    message: "waiting for the Deployment watch to catch up".into(),
                },
                route_address,
                drifted: false,
            });
        };
        // Out of band: a rendered object deleted, or an object of a kind no
        // longer rendered left behind (its prune was skipped or failed).
        let (missing, leftover) = {
            let present = self.present.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let kind_of = |m: &Value| m["kind"].as_str().unwrap_or("").to_string();
            let missing = present.synced.len() == OWNED_KINDS.len()
                && rendered.manifests.iter().any(|m| {
                    !present.exists(&kind_of(m), m["metadata"]["name"].as_str().unwrap_or(""))
                });
            let leftover = OWNED_KINDS.iter().any(|(_, kind)| {
                present.synced.contains(*kind)
                    && present.owners.contains_key(&(kind.to_string(), gateway.to_string()))
                    && !rendered.manifests.iter().any(|m| m["kind"] == *kind)
            });
            (missing, leftover)
        };
        let Some(deployment) = deployment else {
            return Ok(Observation {
                workload: Workload::Progressing { message: "the Deployment is missing".into() },
                route_address,
                drifted: true,
            });
        };
        let drifted = match self.remembered(gateway) {
            Some(applied) => deployment.spec_hash != applied.spec_hash,
            // After a restart nothing is remembered: compare what we render.
            None => {
                let current = deployment.fingerprint.as_ref() == Some(&rendered.fingerprint);
                if current {
                    self.remember(gateway, Some(&deployment));
                }
                !current
            }
        };
        Ok(Observation {
            workload: deployment.workload,
            route_address,
            drifted: drifted || missing || leftover,
        })
    }

    async fn delete(&self, owner: &Owner) -> Result<bool, TargetError> {
        let gateway = owner.name.as_str();
        self.remember(gateway, None);
        let mut gone = true;
        for (api_version, kind) in OWNED_KINDS.iter().rev() {
            let api = self.api(api_version, kind);
            for object in self.owned(&api, gateway, kind).await? {
                gone = false;
                if object.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let name = object.metadata.name.unwrap_or_default();
                delete_object(&api, &format!("delete {kind} {name}"), &name).await?;
            }
        }
        Ok(gone)
    }

    fn watch_owned(&self) -> Option<BoxStream<'static, String>> {
        let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
        let streams = OWNED_KINDS.iter().map(|(api_version, kind)| {
            let api = self.api(api_version, kind);
            let present = self.present.clone();
            let kind = kind.to_string();
            // Backoff between failed (re)connections: without it a watcher
            // whose API server is gone retries in a tight loop.
            kube::runtime::WatchStreamExt::default_backoff(watcher(api, config.clone()))
                .filter_map(move |event| {
                    let present = present.clone();
                    let kind = kind.clone();
                    async move { track(&present, &kind, event) }
                })
                .boxed()
        });
        Some(futures_util::stream::select_all(streams).boxed())
    }

    fn name(&self) -> &'static str {
        "kube"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn only_a_refused_immutable_change_recreates() {
        let refusal = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status { code, message: message.into(), ..Default::default() }.boxed(),
            )
        };
        assert!(is_immutable_change(&refusal(
            422,
            "Deployment.apps \"edge\" is invalid: spec.selector: Invalid value: {}: field is immutable"
        )));
        assert!(!is_immutable_change(&refusal(422, "spec.replicas: Invalid value: -1")));
        assert!(!is_immutable_change(&refusal(409, "field is immutable")));
    }
}
