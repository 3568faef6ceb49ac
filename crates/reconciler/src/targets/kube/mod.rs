//! The Kubernetes target: kube-rs server-side apply with the field manager
//! `gantry-reconciler`, on objects this gateway owns only.
//!
//! - **Ownership**: every object carries the gateway's name and uid (labels
//!   and an annotation). Before an object is applied, an existing object of
//!   that kind and name without this gateway's uid stops the apply with
//!   "Kind name exists and is not managed by this gateway" (Helm's check);
//!   deletion and pruning select by uid, so they never touch anything else.
//! - **Drift**: an informer-style cache of every owned kind (watches
//!   relisted from the cluster every resync period, spread over it) holds
//!   the live objects; an object is drifted when a field gantry renders has
//!   another value live, judged by server-side apply's merge rules (the
//!   API server's schemas: atomic maps and lists whole, keyed lists by key,
//!   quantities by amount; see `drift`). A converged gateway costs no
//!   cluster request at all, and fields gantry does not render (such as
//!   `replicas` when the spec leaves it to an autoscaler) or that others add
//!   where server-side apply keeps them are never fought.
//! - **Observe**: the rollout from the cached Deployment (as `kubectl
//!   rollout status`); the route from the cached Ingress' load-balancer
//!   address (how long a route may wait for one is the controller's rule).
//!
//! Every call has a bounded timeout; only a genuine NotFound counts as
//! absent.

mod cache;
mod calls;
mod drift;
mod owned_object;
mod replace;
mod retire;
mod rollback;
mod rollout;

pub use calls::CALL_TIMEOUT;
pub use rollout::rollout;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::watcher;
use kube::Client;

use self::cache::{key, track, Cache, Key, Live, Reading};
use self::calls::{api_resource, bounded, delete_object, not_ours};
use self::owned_object::OwnedObject;
use self::retire::Retiring;
use super::{Owner, Target, TargetError};
use crate::leader::Fence;
use crate::render::{
    owned_selector, Manifest, Rendered, LABEL_GATEWAY_UID, LABEL_MANAGED_BY, MANAGED_BY,
    OWNED_KINDS,
};
use crate::status::{Observation, Workload};

/// Tunables of the Kubernetes target.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// Every owned kind is listed again from the cluster about this often
    /// (a watch that missed a change, or resumed on a server that lost the
    /// objects, is corrected within one period).
    pub relist_period: Duration,
    /// Replace an object whose immutable field differs for every gateway
    /// (otherwise only for those that opt in).
    pub recreate_on_immutable: bool,
    /// Longest one call to the cluster may take.
    pub call_timeout: Duration,
}

impl Default for KubeSettings {
    fn default() -> Self {
        Self {
            relist_period: Duration::from_secs(300),
            recreate_on_immutable: false,
            call_timeout: CALL_TIMEOUT,
        }
    }
}

/// Gateways' objects in one namespace of a cluster.
pub struct KubeTarget {
    client: Client,
    namespace: String,
    settings: KubeSettings,
    fence: Fence,
    cache: Arc<Mutex<Cache>>,
    /// Gateways whose replaced Deployment's pods are still to retire.
    retiring: Retiring,
}

impl std::fmt::Debug for KubeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTarget").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl KubeTarget {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self::with_settings(client, namespace, KubeSettings::default())
    }

    pub fn with_settings(
        client: Client,
        namespace: impl Into<String>,
        settings: KubeSettings,
    ) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            settings,
            fence: Fence::default(),
            cache: Arc::default(),
            retiring: Retiring::default(),
        }
    }

    /// Writes only while `fence` allows (leader election).
    #[must_use]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// Runs a write only while the fence allows, checked before every poll
    /// of the call: a replica frozen mid-pass (SIGSTOP, a long pause) that
    /// wakes after its tenure drops the call instead of sending it. (A
    /// request whose bytes were already handed to the connection before
    /// the freeze can still go out: leader election without fencing
    /// tokens, as client-go's, cannot rule that out.)
    async fn fenced<T>(
        &self,
        what: &str,
        write: impl std::future::Future<Output = Result<T, TargetError>>,
    ) -> Result<T, TargetError> {
        let mut write = std::pin::pin!(write);
        std::future::poll_fn(|cx| {
            if self.fence.allows() {
                write.as_mut().poll(cx)
            } else {
                std::task::Poll::Ready(Err(TargetError::Fenced { what: what.into() }))
            }
        })
        .await
    }

    /// The objects of a kind in the target's namespace, as `K`
    /// (`DynamicObject`, or `OwnedObject` for the owned-object watches).
    fn api<K>(&self, api_version: &str, kind: &str) -> Api<K>
    where
        K: kube::Resource<
            DynamicType = kube::api::ApiResource,
            Scope = kube::core::DynamicResourceScope,
        >,
    {
        Api::namespaced_with(self.client.clone(), &self.namespace, &api_resource(api_version, kind))
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails unless `kind/name` is absent or marked with `owner`'s uid. The
    /// cache answers for objects it holds; anything else is read (an object
    /// without gantry's labels is not in the cache).
    async fn check_owner(
        &self,
        api: &Api<DynamicObject>,
        kind: &str,
        name: &str,
        owner: &Owner,
    ) -> Result<(), TargetError> {
        let cached =
            self.cache().objects.get(&key(kind, name)).map(|l| l.uid.as_deref().map(String::from));
        let uid = match cached {
            Some(uid) => uid,
            None => {
                let timeout = self.settings.call_timeout;
                let live =
                    bounded(timeout, &format!("get {kind} {name}"), api.get_opt(name)).await?;
                match live {
                    None => return Ok(()),
                    Some(o) => o.metadata.labels.and_then(|l| l.get(LABEL_GATEWAY_UID).cloned()),
                }
            }
        };
        if uid.as_deref() == Some(owner.uid.as_str()) && !owner.uid.is_empty() {
            Ok(())
        } else {
            Err(not_ours(kind, name))
        }
    }

    /// Objects of one kind marked with `owner`'s uid.
    async fn owned(
        &self,
        api: &Api<DynamicObject>,
        owner: &Owner,
        kind: &str,
    ) -> Result<Vec<DynamicObject>, TargetError> {
        let params = ListParams::default().labels(&owned_selector(&owner.uid));
        Ok(bounded(self.settings.call_timeout, &format!("list {kind}"), api.list(&params))
            .await?
            .items)
    }

    /// The cached copy of each rendered object (with whether it is still
    /// marked as this gateway's), and whether the gateway owns objects of a
    /// kind no longer rendered; `None` until the watches have listed and
    /// caught up with our last apply (read from the watch only, as an
    /// informer-based controller does). Only lookups under the lock: texts
    /// not judged yet are parsed and compared after it is released (passes
    /// run concurrently).
    #[allow(clippy::type_complexity)]
    fn lookup<'r>(
        &self,
        owner: &Owner,
        rendered: &'r Rendered,
    ) -> Option<(Vec<(&'r Manifest, Key, Option<(bool, Live)>)>, bool)> {
        let cache = self.cache();
        let mut found = Vec::with_capacity(rendered.objects.len());
        for manifest in &rendered.objects {
            let k = key(manifest.kind, &manifest.name);
            if !cache.synced.contains(k.0) || !cache.caught_up(&k) {
                return None;
            }
            let live = cache.objects.get(&k).map(|live| {
                let ours = live.uid.as_deref() == Some(owner.uid.as_str());
                (ours, live.clone())
            });
            found.push((manifest, k, live));
        }
        // Left behind: this gateway's objects of a kind no longer rendered.
        Some((found, cache.owns_other_kinds(&owner.uid, &rendered.objects)))
    }

    /// The route's load-balancer address from the cached Ingress ("" while
    /// it has none).
    fn route(&self, name: &str) -> String {
        let reading =
            self.cache().objects.get(&key("Ingress", name)).and_then(|l| l.reading.clone());
        match reading.as_deref() {
            Some(Reading::Route { address }) => address.to_string(),
            _ => String::new(),
        }
    }
}

#[tonic::async_trait]
impl Target for KubeTarget {
    async fn apply(&self, owner: &Owner, rendered: &Rendered) -> Result<(), TargetError> {
        let mut rendered_kinds = Vec::new();
        let fingerprint: Arc<str> = Arc::from(rendered.fingerprint.as_str());
        for manifest in &rendered.objects {
            let (kind, name) = (manifest.kind, manifest.name.as_str());
            let api = self.api(manifest.api_version, kind);
            self.check_owner(&api, kind, name, owner).await?;
            let what = format!("apply {kind} {name}");
            let k = key(kind, name);
            self.cache().applying.insert(k.clone(), None);
            let applied = match self
                .fenced(&what, self.apply_or_replace(&api, kind, name, &manifest.body, owner))
                .await
            {
                Ok(applied) => applied,
                Err(e) => {
                    self.cache().applying.remove(&k);
                    return Err(e);
                }
            };
            // The answer is the object as applied: judged now, cached unless
            // the watch already brought a newer version or its deletion.
            let live = Live::answered(k.0, applied, &manifest.body, &fingerprint);
            self.cache().answered(k, live);
            rendered_kinds.push(kind.to_string());
        }
        // Prune: this gateway's objects of kinds no longer rendered. The
        // list is skipped when the kind's watch has listed and holds none
        // of them.
        for (api_version, kind) in OWNED_KINDS.iter().rev() {
            if rendered_kinds.iter().any(|k| k == kind) || !self.cache().owns_any(kind, &owner.uid)
            {
                continue;
            }
            let api = self.api(api_version, kind);
            for object in self.owned(&api, owner, kind).await? {
                let name = object.metadata.name.unwrap_or_default();
                let what = format!("prune {kind} {name}");
                self.fenced(&what, delete_object(self.settings.call_timeout, &api, &what, &name))
                    .await?;
                tracing::info!(gateway = owner.name, kind, name, "pruned");
            }
        }
        self.retire(owner, rendered).await
    }

    async fn observe(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, TargetError> {
        let route_address =
            rendered.get("Ingress").map(|i| self.route(&i.name)).unwrap_or_default();
        let Some((found, leftover)) = self.lookup(owner, rendered) else {
            return Ok(Observation {
                workload: Workload::Progressing {
                    message: "waiting for the watches to catch up".into(),
                },
                route_address,
                drift: None,
            });
        };
        let mut drift = leftover.then(|| "objects of kinds no longer rendered".to_string());
        let mut deployment = None;
        let mut verdicts = Vec::new();
        // One copy for the verdicts of all this gateway's objects.
        let fingerprint: Arc<str> = Arc::from(rendered.fingerprint.as_str());
        for (manifest, k, live) in found {
            let Some((ours, live)) = live else {
                drift.get_or_insert_with(|| format!("{} {} is missing", k.0, k.1));
                continue;
            };
            let (changed, verdict) = live.drift_from(ours, &manifest.body, &fingerprint);
            verdicts.extend(verdict.map(|v| (k.clone(), live.resource_version, v)));
            if let Some(field) = changed {
                tracing::info!(
                    kind = k.0,
                    name = &*k.1,
                    field = &*field,
                    "drifted from what was applied"
                );
                drift.get_or_insert_with(|| format!("{} {}: {field}", k.0, k.1));
            }
            if let Some(Reading::Rollout(workload)) = live.reading.as_deref() {
                deployment = Some(workload.clone());
            }
        }
        if !verdicts.is_empty() {
            let mut cache = self.cache();
            for (k, rv, verdict) in verdicts {
                cache.judged(&k, rv, verdict);
            }
        }
        let Some(deployment) = deployment else {
            return Ok(Observation {
                workload: Workload::Progressing { message: "the Deployment is missing".into() },
                route_address,
                drift: Some(drift.unwrap_or_else(|| "the Deployment is missing".into())),
            });
        };
        // What an earlier rollout left retires in an apply pass.
        if self.retirement_due(owner, rendered, &deployment) {
            drift.get_or_insert_with(|| "what an earlier rollout left is to retire".into());
        }
        Ok(Observation { workload: deployment, route_address, drift })
    }

    async fn delete(&self, owner: &Owner) -> Result<bool, TargetError> {
        if owner.uid.is_empty() {
            return Ok(true);
        }
        let mut gone = true;
        for (api_version, kind) in OWNED_KINDS.iter().rev() {
            let api = self.api(api_version, kind);
            for object in self.owned(&api, owner, kind).await? {
                gone = false;
                if object.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let name = object.metadata.name.unwrap_or_default();
                let what = format!("delete {kind} {name}");
                self.fenced(&what, delete_object(self.settings.call_timeout, &api, &what, &name))
                    .await?;
            }
        }
        Ok(gone)
    }

    async fn roll_back(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Option<i64>, TargetError> {
        self.roll_back_deployment(owner, rendered).await
    }

    fn watch_owned(&self) -> Option<BoxStream<'static, String>> {
        let config = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
        let (tx, rx) = tokio::sync::mpsc::channel::<String>(1024);
        let period = self.settings.relist_period;
        let replica_sets = self.api("apps/v1", "ReplicaSet");
        tokio::spawn(self.retiring.clone().find_owned(replica_sets, self.settings.call_timeout));
        for (i, (api_version, kind)) in OWNED_KINDS.iter().enumerate() {
            let api = self.api::<OwnedObject>(api_version, kind);
            let (cache, config, tx) = (self.cache.clone(), config.clone(), tx.clone());
            // Relists of the kinds are spread over the period, and each
            // comes within one period of the last (jitter only shortens).
            let first = period.mul_f64((i + 1) as f64 / OWNED_KINDS.len() as f64);
            tokio::spawn(async move {
                let mut next_relist = tokio::time::Instant::now() + first;
                loop {
                    // Backoff between failed (re)connections: without it a
                    // watcher whose API server is gone retries in a tight loop.
                    let mut events = kube::runtime::WatchStreamExt::default_backoff(watcher(
                        api.clone(),
                        config.clone(),
                    ))
                    .boxed();
                    loop {
                        tokio::select! {
                            event = events.next() => {
                                let Some(event) = event else { break };
                                // A resourceVersion the server never issued
                                // (it lost its data, or is another server):
                                // resuming from it would wait forever, so
                                // list again now.
                                let unknown = matches!(&event, Err(e) if e.to_string().contains("Too large resource version"));
                                for gateway in track(&cache, kind, event) {
                                    if tx.send(gateway).await.is_err() {
                                        return;
                                    }
                                }
                                if unknown {
                                    break;
                                }
                            }
                            () = tokio::time::sleep_until(next_relist) => break,
                            () = tx.closed() => return,
                        }
                    }
                    tracing::debug!(kind, "relisting owned objects");
                    let jitter = 0.8 + fastrand::f64() * 0.2;
                    next_relist = tokio::time::Instant::now() + period.mul_f64(jitter);
                }
            });
        }
        Some(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    fn unsynced(&self) -> Vec<&'static str> {
        let cache = self.cache();
        OWNED_KINDS.iter().map(|(_, k)| *k).filter(|k| !cache.synced.contains(k)).collect()
    }

    fn may_write(&self) -> bool {
        self.fence.allows()
    }

    fn name(&self) -> &'static str {
        "kube"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_that_wakes_after_the_tenure_is_dropped() {
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
            .expect("a client (no connection is made)");
        let fence = Fence::elected();
        fence.hold_until(Some(tokio::time::Instant::now() + Duration::from_secs(1)));
        let target = KubeTarget::new(client, "default").with_fence(fence);
        let sent = std::sync::atomic::AtomicBool::new(false);
        // A call suspended for longer than the tenure (a frozen process).
        let write = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            sent.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        let outcome = target.fenced("apply ConfigMap edge", write).await;
        assert!(outcome.unwrap_err().to_string().contains("leadership has lapsed"));
        assert!(!sent.load(std::sync::atomic::Ordering::SeqCst), "the write went on");
        let quick = target.fenced("apply ConfigMap edge", async { Ok(()) }).await;
        assert!(quick.is_err(), "a write started after the tenure");
    }
}
