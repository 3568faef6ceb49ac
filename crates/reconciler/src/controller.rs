//! The control loop.
//!
//! ```text
//! store watch (list-then-watch) ─┐
//! owned-object watch ────────────┼─► work queue ─► workers ─► reconcile(name)
//! periodic resync (jittered) ────┘                               │
//!   finalizer ─► render ─► recovery policy ─► target.apply/observe/delete
//!   ─► one UpdateGateway with an update mask and the resource_version read
//! ```
//!
//! The cache holds the newest Gateway seen (from the watch or from our own
//! writes). A pass does no IO when there is nothing to do: a status-only or
//! label-only change of a converged gateway renders the same fingerprint
//! and ends without touching the cluster.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use gantry_api::v1::{
    Gateway, GatewayStatus, GetGatewayRequest, ObjectMeta, Phase, UpdateGatewayRequest,
};
use gantry_client::watch::{list_then_watch, WatchOptions, WatchUpdate};
use gantry_client::GatewayClient;
use gantry_core::recovery::{Attempts, Decision, Inputs, RecoveryPolicy};
use prost_types::{FieldMask, Timestamp};
use tonic::Code;

use crate::metrics::{Metrics, PhaseLabels};
use crate::queue::WorkQueue;
use crate::render::{render, RenderSettings, Rendered};
use crate::status::{self, Workload, STATUS_PATHS};
use crate::target::Target;

/// The reconciler's finalizer on every gateway it has seen.
pub const FINALIZER: &str = "gantry.dev/reconciler";
/// Annotation carrying a retry request (a timestamp): a new value resets
/// the retry budget without a spec change (`gatewayctl retry NAME`).
pub const RETRY_ANNOTATION: &str = "gantry.dev/retry-requested-at";
/// Longest a call to the store may take.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the control loop behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    pub render: RenderSettings,
    pub policy: RecoveryPolicy,
    /// Workers, each on a different gateway.
    pub concurrency: usize,
    /// Every gateway is re-checked about this often.
    pub sync_period: Duration,
    /// Re-check interval while a rollout is in progress or stalled.
    pub poll_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            render: RenderSettings::default(),
            policy: RecoveryPolicy::default(),
            concurrency: 16,
            sync_period: Duration::from_secs(300),
            poll_interval: Duration::from_secs(2),
        }
    }
}

/// The controller: cache, records, queue and the reconcile pass.
#[derive(Debug)]
pub struct Controller {
    client: GatewayClient,
    target: Arc<dyn Target>,
    settings: Settings,
    cache: Mutex<HashMap<String, Gateway>>,
    records: Mutex<HashMap<String, Attempts>>,
    first_seen: Mutex<HashMap<(String, i64), Instant>>,
    queue: WorkQueue,
    pub metrics: Arc<Metrics>,
    epoch: Instant,
    synced: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn name_of(g: &Gateway) -> String {
    g.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default()
}

fn rv_of(g: &Gateway) -> i64 {
    g.metadata.as_ref().map_or(0, |m| m.resource_version)
}

impl Controller {
    pub fn new(
        client: GatewayClient,
        target: Arc<dyn Target>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            target,
            settings,
            cache: Mutex::default(),
            records: Mutex::default(),
            first_seen: Mutex::default(),
            queue: WorkQueue::default(),
            metrics,
            epoch: Instant::now(),
            synced: AtomicBool::new(false),
        })
    }

    /// Whether the first list of the store has been processed.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Refreshes the gauges read at scrape time.
    pub fn update_gauges(&self) {
        self.metrics.queue_depth.set(i64::try_from(self.queue.len()).unwrap_or(i64::MAX));
        let mut counts: HashMap<String, i64> =
            ALL_PHASES.iter().map(|p| (phase_name(*p), 0)).collect();
        for g in lock(&self.cache).values() {
            let phase = g.status.as_ref().map_or(Phase::Unspecified, GatewayStatus::phase);
            *counts.entry(phase_name(phase)).or_default() += 1;
        }
        for (phase, n) in counts {
            self.metrics.gateways.get_or_create(&PhaseLabels { phase }).set(n);
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Keeps the newer of the cached and the given gateway.
    fn remember(&self, gateway: Gateway) {
        let name = name_of(&gateway);
        let mut cache = lock(&self.cache);
        if cache.get(&name).is_none_or(|c| rv_of(c) <= rv_of(&gateway)) {
            cache.insert(name, gateway);
        }
    }

    fn forget(&self, name: &str) {
        lock(&self.cache).remove(name);
        lock(&self.records).remove(name);
        lock(&self.first_seen).retain(|(n, _), _| n != name);
        self.queue.forget(name);
    }

    /// Runs until `shutdown`, then lets in-flight passes finish.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()> + Send) {
        let (_always, leading) = tokio::sync::watch::channel(true);
        self.run_while_leading(leading, shutdown).await;
    }

    /// As [`Controller::run`], but passes run only while `leading` is true
    /// (leader election). Followers keep their cache warm; a new leader
    /// re-checks every gateway.
    pub async fn run_while_leading(
        self: Arc<Self>,
        leading: tokio::sync::watch::Receiver<bool>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        let mut tasks = Vec::new();
        {
            let (controller, mut leading) = (self.clone(), leading.clone());
            tasks.push(tokio::spawn(async move {
                while leading.changed().await.is_ok() {
                    if *leading.borrow_and_update() {
                        let names: Vec<String> = lock(&controller.cache).keys().cloned().collect();
                        for name in names {
                            controller.queue.add(&name);
                        }
                    }
                }
            }));
        }
        tasks.push(tokio::spawn(self.clone().watch_store()));
        if let Some(mut owned) = self.target.watch_owned() {
            let controller = self.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(name) = owned.next().await {
                    if lock(&controller.cache).contains_key(&name) {
                        controller.queue.add(&name);
                    }
                }
            }));
        }
        tasks.push(tokio::spawn(self.clone().resync()));
        let workers: Vec<_> = (0..self.settings.concurrency.max(1))
            .map(|_| {
                let (controller, mut leading) = (self.clone(), leading.clone());
                tokio::spawn(async move {
                    loop {
                        if leading.wait_for(|l| *l).await.is_err() {
                            return;
                        }
                        let next = tokio::select! {
                            next = controller.queue.next() => next,
                            // Leadership lost: wait to lead again. The
                            // election gone (its sender dropped): stop.
                            lost = leading.wait_for(|l| !*l) => match lost {
                                Ok(_) => continue,
                                Err(_) => return,
                            },
                        };
                        let Some(name) = next else { return };
                        controller.reconcile(&name).await;
                        controller.queue.done(&name);
                    }
                })
            })
            .collect();
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight reconciles");
        self.queue.close();
        for worker in workers {
            let _ = worker.await;
        }
        for task in tasks {
            task.abort();
        }
    }

    async fn watch_store(self: Arc<Self>) {
        let mut updates = list_then_watch(self.client.clone(), WatchOptions::default());
        while let Some(update) = updates.next().await {
            match update {
                Ok(WatchUpdate::Reset { gateways, revision }) => {
                    let names: Vec<String> = gateways.iter().map(name_of).collect();
                    let stale: Vec<String> =
                        lock(&self.cache).keys().filter(|n| !names.contains(n)).cloned().collect();
                    for name in stale {
                        self.forget(&name);
                    }
                    for g in gateways {
                        self.remember(g);
                    }
                    for name in &names {
                        self.queue.add(name);
                    }
                    self.synced.store(true, Ordering::Relaxed);
                    tracing::info!(gateways = names.len(), revision, "listed gateways");
                }
                Ok(WatchUpdate::Applied { gateway, .. }) => {
                    let name = name_of(&gateway);
                    self.remember(gateway);
                    self.queue.add(&name);
                }
                Ok(WatchUpdate::Deleted { gateway, .. }) => self.forget(&name_of(&gateway)),
                Ok(WatchUpdate::Bookmark { .. }) => {}
                Err(status) => {
                    tracing::error!(code = ?status.code(), message = status.message(), "the store refused the watch; check the reconciler's token and role");
                    return;
                }
            }
        }
    }

    async fn resync(self: Arc<Self>) {
        loop {
            let jitter = 0.9 + fastrand::f64() * 0.2;
            tokio::time::sleep(self.settings.sync_period.mul_f64(jitter)).await;
            let names: Vec<String> = lock(&self.cache).keys().cloned().collect();
            for name in names {
                self.queue.add(&name);
            }
        }
    }

    /// One pass over one gateway.
    pub async fn reconcile(&self, name: &str) {
        let Some(gateway) = lock(&self.cache).get(name).cloned() else { return };
        let started = Instant::now();
        let meta = gateway.metadata.clone().unwrap_or_default();
        let span = tracing::info_span!("reconcile", gateway = name, generation = meta.generation);
        let outcome = tracing::Instrument::instrument(self.pass(gateway, meta), span).await;
        self.metrics.outcome(outcome);
        self.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    }

    async fn pass(&self, mut gateway: Gateway, meta: ObjectMeta) -> &'static str {
        let name = meta.name.as_str();
        if meta.delete_time.is_some() {
            return self.finalize(&gateway, &meta).await;
        }
        if !meta.finalizers.iter().any(|f| f == FINALIZER) {
            let mut finalizers = meta.finalizers.clone();
            finalizers.push(FINALIZER.to_string());
            match self.set_finalizers(&meta, finalizers).await {
                Ok(updated) => gateway = updated,
                Err(outcome) => return outcome,
            }
        }
        let meta = gateway.metadata.clone().unwrap_or_default();
        let generation = meta.generation;
        lock(&self.first_seen).entry((name.to_string(), generation)).or_insert_with(Instant::now);
        let current = gateway.status.clone().unwrap_or_default();
        let rendered = render(&gateway, &self.settings.render);
        let inputs = Inputs {
            generation,
            fingerprint: rendered.fingerprint.clone(),
            retry_token: meta.annotations.get(RETRY_ANNOTATION).cloned().unwrap_or_default(),
        };
        let record = lock(&self.records).get(name).cloned();
        let applied = current.observed_generation == generation
            && current.applied_fingerprint == rendered.fingerprint
            && current.phase() != Phase::Failed
            && record.as_ref().is_none_or(|r| r.failures == 0);
        if !applied {
            return self.apply(&gateway, &rendered, &inputs, record.as_ref()).await;
        }
        let observation =
            match tokio::time::timeout(STORE_TIMEOUT, self.target.observe(name, &rendered)).await {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot observe; retrying");
                    self.queue.add_after(name, self.settings.poll_interval);
                    return "error";
                }
                Err(_) => {
                    self.queue.add_after(name, self.settings.poll_interval);
                    return "error";
                }
            };
        if observation.drifted {
            tracing::info!("owned objects drifted; repairing");
            return self.apply(&gateway, &rendered, &inputs, record.as_ref()).await;
        }
        let has_route = rendered.manifests.iter().any(|m| m["kind"] == "Ingress");
        let desired = status::applied(generation, &rendered.fingerprint, &observation, has_route);
        self.poll_if_moving(name, &observation.workload);
        if !status::differs(&current, &desired) {
            return "unchanged";
        }
        match self.write_status(&gateway, desired).await {
            Ok(_) => "observed",
            Err(outcome) => outcome,
        }
    }

    fn poll_if_moving(&self, name: &str, workload: &Workload) {
        if matches!(workload, Workload::Progressing { .. } | Workload::Stalled { .. }) {
            self.queue.add_after(name, self.settings.poll_interval);
        }
    }

    async fn apply(
        &self,
        gateway: &Gateway,
        rendered: &Rendered,
        inputs: &Inputs,
        record: Option<&Attempts>,
    ) -> &'static str {
        let name = name_of(gateway);
        let now = self.now_ms();
        if let Decision::Wait { until_ms } = self.settings.policy.decide(record, inputs, now) {
            // An unchanged failure: no apply, no status write.
            self.queue.add_after(&name, Duration::from_millis(until_ms.saturating_sub(now)));
            return "waiting";
        }
        let current = gateway.status.clone().unwrap_or_default();
        let result = match tokio::time::timeout(
            STORE_TIMEOUT * 4,
            self.target.apply(&name, &rendered.manifests),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(crate::target::TargetError("apply: no answer in time".into())),
        };
        match result {
            Ok(()) => {
                lock(&self.records).remove(&name);
                tracing::info!(target = self.target.name(), "manifests applied");
                let observation = match self.target.observe(&name, rendered).await {
                    Ok(o) => o,
                    Err(e) => status::Observation {
                        workload: Workload::Progressing {
                            message: format!("cannot observe yet: {e}"),
                        },
                        route_address: String::new(),
                        drifted: false,
                    },
                };
                let has_route = rendered.manifests.iter().any(|m| m["kind"] == "Ingress");
                let generation = inputs.generation;
                let desired =
                    status::applied(generation, &rendered.fingerprint, &observation, has_route);
                self.poll_if_moving(&name, &observation.workload);
                match self.write_status(gateway, desired).await {
                    Ok(_) => "applied",
                    Err(outcome) => outcome,
                }
            }
            Err(e) => {
                let failure =
                    self.settings.policy.on_failure(record, inputs, &e.0, now, fastrand::f64());
                let wait = Duration::from_millis(failure.attempts.retry_at_ms.saturating_sub(now));
                tracing::warn!(error = %e, failures = failure.attempts.failures, exhausted = failure.exhausted, retry_in = ?wait, "apply failed");
                let retry_time = Timestamp::from(SystemTime::now() + wait);
                let desired = status::failed(
                    &current,
                    inputs.generation,
                    &e.0,
                    failure.attempts.failures,
                    failure.exhausted,
                    retry_time,
                );
                lock(&self.records).insert(name.clone(), failure.attempts);
                self.queue.add_after(&name, wait);
                if status::differs(&current, &desired) {
                    if let Err(outcome) = self.write_status(gateway, desired).await {
                        return outcome;
                    }
                }
                "failed"
            }
        }
    }

    async fn finalize(&self, gateway: &Gateway, meta: &ObjectMeta) -> &'static str {
        let name = meta.name.as_str();
        if !meta.finalizers.iter().any(|f| f == FINALIZER) {
            return "unchanged";
        }
        match tokio::time::timeout(STORE_TIMEOUT * 4, self.target.delete(name)).await {
            Ok(Ok(true)) => {
                let finalizers: Vec<String> =
                    meta.finalizers.iter().filter(|f| *f != FINALIZER).cloned().collect();
                match self.set_finalizers(meta, finalizers).await {
                    Ok(_) => {
                        tracing::info!("owned objects deleted; finalizer removed");
                        "deleted"
                    }
                    Err(outcome) => outcome,
                }
            }
            Ok(Ok(false)) => {
                self.queue.add_after(name, self.settings.poll_interval);
                "deleting"
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cleanup failed; will retry");
                let _ = gateway;
                self.queue.add_after(name, self.settings.poll_interval);
                "error"
            }
            Err(_) => {
                self.queue.add_after(name, self.settings.poll_interval);
                "error"
            }
        }
    }

    /// Writes `metadata.finalizers`, conditional on the version read.
    async fn set_finalizers(
        &self,
        meta: &ObjectMeta,
        finalizers: Vec<String>,
    ) -> Result<Gateway, &'static str> {
        let update = Gateway {
            metadata: Some(ObjectMeta {
                name: meta.name.clone(),
                resource_version: meta.resource_version,
                finalizers,
                ..Default::default()
            }),
            ..Default::default()
        };
        self.update(update, &["metadata.finalizers"]).await
    }

    async fn write_status(
        &self,
        gateway: &Gateway,
        desired: GatewayStatus,
    ) -> Result<Gateway, &'static str> {
        let name = name_of(gateway);
        let previous = gateway.status.as_ref().map_or(0, |s| s.observed_generation);
        let observed = desired.observed_generation;
        let update = Gateway {
            metadata: Some(ObjectMeta {
                name: name.clone(),
                resource_version: rv_of(gateway),
                ..Default::default()
            }),
            spec: None,
            status: Some(desired),
        };
        let written = self.update(update, &STATUS_PATHS).await;
        if written.is_ok() && observed > previous {
            if let Some(seen) = lock(&self.first_seen).remove(&(name.clone(), observed)) {
                self.metrics.convergence.observe(seen.elapsed().as_secs_f64());
            }
            lock(&self.first_seen).retain(|(n, g), _| n != &name || *g > observed);
        }
        written
    }

    /// One UpdateGateway with a mask and the resource_version read. ABORTED
    /// means re-read and run again; any other failure forgets the record
    /// so the next pass starts afresh.
    async fn update(&self, gateway: Gateway, paths: &[&str]) -> Result<Gateway, &'static str> {
        let name = name_of(&gateway);
        let request = UpdateGatewayRequest {
            gateway: Some(gateway),
            update_mask: Some(FieldMask { paths: paths.iter().map(|p| p.to_string()).collect() }),
        };
        let mut client = self.client.clone();
        let result = tokio::time::timeout(STORE_TIMEOUT, client.update_gateway(request)).await;
        match result {
            Ok(Ok(response)) => {
                let updated = response.into_inner();
                self.remember(updated.clone());
                Ok(updated)
            }
            Ok(Err(status)) if status.code() == Code::Aborted => {
                tracing::debug!("gateway changed meanwhile; re-reading");
                if let Ok(Ok(fresh)) = tokio::time::timeout(
                    STORE_TIMEOUT,
                    client.get_gateway(GetGatewayRequest { name: name.clone() }),
                )
                .await
                {
                    self.remember(fresh.into_inner());
                }
                self.queue.add(&name);
                Err("status_conflict")
            }
            Ok(Err(status)) if status.code() == Code::NotFound => {
                self.forget(&name);
                Err("gone")
            }
            Ok(Err(status)) => {
                tracing::warn!(code = ?status.code(), message = status.message(), "status write failed; forgetting the record");
                lock(&self.records).remove(&name);
                self.queue.add_after(&name, self.settings.poll_interval);
                Err("error")
            }
            Err(_) => {
                lock(&self.records).remove(&name);
                self.queue.add_after(&name, self.settings.poll_interval);
                Err("error")
            }
        }
    }
}

fn phase_name(phase: Phase) -> String {
    phase.as_str_name().trim_start_matches("PHASE_").to_ascii_lowercase()
}

/// Every phase, for the per-phase gauge.
const ALL_PHASES: [Phase; 7] = [
    Phase::Unspecified,
    Phase::Pending,
    Phase::Provisioning,
    Phase::Running,
    Phase::Degraded,
    Phase::Failed,
    Phase::Deleting,
];
