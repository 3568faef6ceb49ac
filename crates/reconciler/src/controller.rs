//! The control loop.
//!
//! ```text
//! store watch (list-then-watch, restarted) ─┐
//! owned-object watches ─────────────────────┼─► work queue ─► workers
//! periodic resync (jittered) ───────────────┘        ▲           │
//!                                                    │   reconcile(gateway)
//!                                                    └── Action / ReconcileError
//! ```
//!
//! [`Controller::reconcile`] is one pass over one gateway: finalizer,
//! render, recovery policy, target apply/observe/delete, and at most one
//! status write. It returns what to do next ([`Action`]) and never touches
//! the queue itself; the worker loop does. The cache holds the newest
//! Gateway seen (from the watch or from our own writes). A pass does no IO
//! when there is nothing to do.
//!
//! The recovery record (failures for the current inputs, their
//! fingerprint, the next retry time) lives in the gateway's status: a
//! restarted process or a new leader reads it back and continues.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use gantry_api::v1::{Gateway, GatewayStatus, ObjectMeta, Phase};
use gantry_client::watch::WatchUpdate;
use gantry_core::recovery::{Attempts, Decision, Inputs, RecoveryPolicy};
use gantry_core::retry::Backoff;
use gantry_core::status::{printable, shorten, MAX_TEXT_BYTES};
use prost_types::Timestamp;
use tokio::time::Instant;
use tonic::Code;

use crate::metrics::{Metrics, PhaseLabels};
use crate::queue::WorkQueue;
use crate::render::{render, RenderSettings, Rendered};
use crate::status::{self, Observation, Workload, STATUS_PATHS};
use crate::store::GatewayStore;
use crate::targets::{Owner, Target, TargetError};

/// The reconciler's finalizer on every gateway it has seen.
pub const FINALIZER: &str = "gantry.dev/reconciler";
/// Annotation carrying a retry request (a timestamp): a new value resets
/// the retry budget without a spec change (`gatewayctl retry NAME`).
pub const RETRY_ANNOTATION: &str = "gantry.dev/retry-requested-at";
/// Longest a call to the store may take.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an apply or a cleanup of one gateway may take.
pub const TARGET_TIMEOUT: Duration = Duration::from_secs(60);

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

/// What the worker does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    /// For the `reconciles` metric: applied, observed, unchanged, waiting,
    /// failed, deleting, deleted, gone.
    pub outcome: &'static str,
    /// Check again after this long; `None`: when something changes (or at
    /// the next resync).
    pub requeue_after: Option<Duration>,
}

impl Action {
    fn done(outcome: &'static str) -> Self {
        Self { outcome, requeue_after: None }
    }

    fn after(outcome: &'static str, delay: Duration) -> Self {
        Self { outcome, requeue_after: Some(delay) }
    }
}

/// Why a pass could not finish; the worker retries with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The gateway changed since it was read (ABORTED): run again at once
    /// on the fresh copy.
    #[error("the gateway changed meanwhile")]
    Conflict,
    #[error("gateway-store: {0}")]
    Store(String),
    #[error("cannot observe the gateway's objects: {0}")]
    Observe(TargetError),
    #[error("cleanup failed: {0}")]
    Cleanup(TargetError),
    /// This replica's leadership lapsed during the pass: nothing is
    /// recorded or written; the next leader takes over.
    #[error("leadership lapsed: {0}")]
    NotLeader(TargetError),
}

impl ReconcileError {
    /// The `reconciles{outcome=...}` label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Conflict => "status_conflict",
            ReconcileError::Store(_) => "store_error",
            ReconcileError::Observe(_) => "observe_error",
            ReconcileError::Cleanup(_) => "cleanup_error",
            ReconcileError::NotLeader(_) => "not_leader",
        }
    }
}

/// The controller: cache, queue and the reconcile pass.
#[derive(Debug)]
pub struct Controller {
    store: Arc<dyn GatewayStore>,
    target: Arc<dyn Target>,
    settings: Settings,
    cache: Mutex<HashMap<String, Cached>>,
    /// Failure records this process holds (read from status, or newer than
    /// what status shows when a status write failed).
    records: Mutex<HashMap<String, Attempts>>,
    /// Consecutive errors per gateway, for the worker's backoff.
    errors: Mutex<HashMap<String, u32>>,
    /// When each generation of a gateway not yet observed was first seen.
    first_seen: Mutex<HashMap<String, Vec<(i64, Instant)>>>,
    /// When a store event first queued each gateway since its last pass.
    queued_at: Mutex<HashMap<String, std::time::Instant>>,
    queue: WorkQueue,
    pub metrics: Arc<Metrics>,
    /// Wall clock at `started` (the policy's times are Unix milliseconds;
    /// reading them through tokio's clock lets tests pause time).
    wall_start_ms: u64,
    started: Instant,
    synced: AtomicBool,
    /// The gateways of the store list in progress, page by page.
    listing: Mutex<Option<std::collections::HashSet<String>>>,
    /// Why the store watch is down, while it is.
    watch_down: Mutex<Option<String>>,
}

/// A cached gateway, encoded: decoded, a converged gateway took several
/// times its encoding in memory (at 100,000 gateways, the bulk of the
/// reconciler's budget). A pass decodes it.
#[derive(Debug)]
struct Cached {
    resource_version: i64,
    /// For the phase gauges, read at every scrape.
    phase: Phase,
    bytes: Arc<[u8]>,
}

impl Cached {
    fn of(gateway: &Gateway) -> Self {
        Self {
            resource_version: rv_of(gateway),
            phase: gateway.status.as_ref().map_or(Phase::Unspecified, GatewayStatus::phase),
            bytes: prost::Message::encode_to_vec(gateway).into(),
        }
    }
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

fn timestamp_ms(t: Option<&Timestamp>) -> u64 {
    t.map_or(0, |t| {
        let ms = t.seconds.saturating_mul(1000).saturating_add(i64::from(t.nanos / 1_000_000));
        u64::try_from(ms).unwrap_or(0)
    })
}

fn ms_timestamp(ms: u64) -> Timestamp {
    Timestamp {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

/// A deleted gateway whose last finalizer is gone: the store removed it.
fn is_removed(g: &Gateway) -> bool {
    g.metadata.as_ref().is_some_and(|m| m.delete_time.is_some() && m.finalizers.is_empty())
}

impl Controller {
    pub fn new(
        store: Arc<dyn GatewayStore>,
        target: Arc<dyn Target>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let wall_start_ms = u64::try_from(
            SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis(),
        )
        .unwrap_or(u64::MAX);
        Arc::new(Self {
            store,
            target,
            settings,
            cache: Mutex::default(),
            records: Mutex::default(),
            errors: Mutex::default(),
            first_seen: Mutex::default(),
            queued_at: Mutex::default(),
            queue: WorkQueue::default(),
            metrics,
            wall_start_ms,
            started: Instant::now(),
            synced: AtomicBool::new(false),
            listing: Mutex::default(),
            watch_down: Mutex::default(),
        })
    }

    /// `Ok` when the store is listed and watched; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(reason) = lock(&self.watch_down).clone() {
            return Err(format!("the watch of gateway-store is down: {reason}"));
        }
        if !self.synced.load(Ordering::Relaxed) {
            return Err("the first list of gateway-store is not done".into());
        }
        let unsynced = self.target.unsynced();
        if !unsynced.is_empty() {
            return Err(format!(
                "the watches of {} have not listed yet; check the reconciler's access to them",
                unsynced.join(", ")
            ));
        }
        Ok(())
    }

    /// Whether the first list of the store has been processed.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Refreshes the gauges read at scrape time.
    pub fn update_gauges(&self) {
        self.metrics.queue_depth.set(i64::try_from(self.queue.len()).unwrap_or(i64::MAX));
        let watching = lock(&self.watch_down).is_none() && self.is_synced();
        self.metrics.store_watch_up.set(i64::from(watching));
        let mut counts: HashMap<String, i64> =
            ALL_PHASES.iter().map(|p| (phase_name(*p), 0)).collect();
        for g in lock(&self.cache).values() {
            *counts.entry(phase_name(g.phase)).or_default() += 1;
        }
        for (phase, n) in counts {
            self.metrics.gateways.get_or_create(&PhaseLabels { phase }).set(n);
        }
    }

    /// Unix milliseconds now, on tokio's clock.
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.wall_start_ms.saturating_add(elapsed)
    }

    /// The cached gateway.
    pub fn cached(&self, name: &str) -> Option<Gateway> {
        let bytes = lock(&self.cache).get(name).map(|c| c.bytes.clone())?;
        prost::Message::decode(&*bytes).ok()
    }

    /// Keeps the newer of the cached and the given gateway; a gateway the
    /// store removed is forgotten instead.
    /// Caches `gateway` unless a newer version is cached; whether it is
    /// news (a version this process had not seen).
    fn remember(&self, gateway: Gateway) -> bool {
        let name = name_of(&gateway);
        if is_removed(&gateway) {
            self.forget(&name);
            return true;
        }
        let cached = Cached::of(&gateway);
        let mut cache = lock(&self.cache);
        let known = cache.get(&name).map(|c| c.resource_version);
        if known.is_none_or(|rv| rv <= cached.resource_version) {
            cache.insert(name, cached);
        }
        known.is_none_or(|rv| rv < rv_of(&gateway))
    }

    fn forget(&self, name: &str) {
        lock(&self.cache).remove(name);
        lock(&self.records).remove(name);
        lock(&self.errors).remove(name);
        lock(&self.first_seen).remove(name);
        lock(&self.queued_at).remove(name);
        self.queue.forget(name);
    }

    /// Runs until `shutdown`, then lets in-flight passes finish.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()> + Send) {
        let (_always, leading) = tokio::sync::watch::channel(true);
        self.run_while_leading(leading, shutdown).await;
    }

    /// As [`Controller::run`], but passes run only while `leading` is true
    /// (leader election): losing it cancels the passes in flight. Followers
    /// keep their cache warm; a new leader drops what it held in memory
    /// (the status the previous leader wrote is the truth) and re-checks
    /// every gateway.
    pub async fn run_while_leading(
        self: Arc<Self>,
        leading: tokio::sync::watch::Receiver<bool>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        let mut tasks = Vec::new();
        {
            let (controller, mut leading) = (self.clone(), leading.clone());
            controller.metrics.leader.set(i64::from(*leading.borrow()));
            tasks.push(tokio::spawn(async move {
                while leading.changed().await.is_ok() {
                    let now_leading = *leading.borrow_and_update();
                    controller.metrics.leader.set(i64::from(now_leading));
                    if now_leading {
                        lock(&controller.records).clear();
                        controller.requeue_all();
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
        // One wait for the target's watches, shared by every worker.
        let (listed, watches_listed) = tokio::sync::watch::channel(false);
        let gate = {
            let controller = self.clone();
            tokio::spawn(async move {
                controller.wait_for_target_watches().await;
                let _ = listed.send(true);
            })
        };
        let workers: Vec<_> = (0..self.settings.concurrency.max(1))
            .map(|_| tokio::spawn(self.clone().work(leading.clone(), watches_listed.clone())))
            .collect();
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight reconciles");
        self.queue.close();
        // Workers still waiting for the watches stop too.
        gate.abort();
        for worker in workers {
            let _ = worker.await;
        }
        for task in tasks {
            task.abort();
        }
    }

    fn requeue_all(&self) {
        let names: Vec<String> = lock(&self.cache).keys().cloned().collect();
        for name in names {
            self.queue.add(&name);
        }
    }

    /// One worker: takes names while leading; a pass in flight when
    /// leadership is lost is cancelled (the next leader repairs a partial
    /// apply).
    async fn work(
        self: Arc<Self>,
        mut leading: tokio::sync::watch::Receiver<bool>,
        mut watches_listed: tokio::sync::watch::Receiver<bool>,
    ) {
        if watches_listed.wait_for(|listed| *listed).await.is_err() {
            return;
        }
        loop {
            if leading.wait_for(|l| *l).await.is_err() {
                return;
            }
            let next = tokio::select! {
                next = self.queue.next() => next,
                lost = leading.wait_for(|l| !*l) => match lost {
                    Ok(_) => continue,
                    Err(_) => return,
                },
            };
            let Some(name) = next else { return };
            tokio::select! {
                () = self.run_pass(&name) => {}
                lost = leading.wait_for(|l| !*l) => {
                    tracing::warn!(gateway = name, "leadership lost: pass cancelled");
                    self.queue.done(&name);
                    if lost.is_err() {
                        return;
                    }
                    continue;
                }
            }
            self.queue.done(&name);
        }
    }

    /// Waits until the target's watches have listed, as an informer-based
    /// controller waits for its caches: a pass before that would judge
    /// every converged gateway as waiting for them (and write that to its
    /// status). Says which watches it waits for, every half minute.
    /// Workers start after it; a shutdown meanwhile does not wait for it.
    async fn wait_for_target_watches(&self) {
        let started = Instant::now();
        let mut told = started;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            let unsynced = self.target.unsynced();
            if unsynced.is_empty() {
                return;
            }
            if told.elapsed() >= Duration::from_secs(30) {
                told = Instant::now();
                tracing::warn!(kinds = ?unsynced, waited = ?started.elapsed(), "no gateway is reconciled until these watches have listed; check the reconciler's RBAC and the API server");
            }
            tick.tick().await;
        }
    }

    /// Runs one pass and schedules what it asks for.
    async fn run_pass(&self, name: &str) {
        if let Some(queued) = lock(&self.queued_at).remove(name) {
            self.metrics.stage("queue", queued);
        }
        let Some(gateway) = self.cached(name) else { return };
        let started = std::time::Instant::now();
        let generation = gateway.metadata.as_ref().map_or(0, |m| m.generation);
        let span = tracing::info_span!("reconcile", gateway = name, generation);
        // The pass for a new generation continues the trace of the write
        // that made it (the store recorded its traceparent).
        let observed = gateway.status.as_ref().map_or(0, |s| s.observed_generation);
        let trace =
            gateway.metadata.as_ref().and_then(|m| m.annotations.get(gantry_api::TRACE_ANNOTATION));
        if let (true, Some(traceparent)) = (observed != generation, trace) {
            gantry_telemetry::set_parent(&span, gantry_telemetry::from_traceparent(traceparent));
        }
        let result = tracing::Instrument::instrument(self.reconcile(gateway), span).await;
        self.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(action) => {
                lock(&self.errors).remove(name);
                self.metrics.outcome(action.outcome);
                if let Some(delay) = action.requeue_after {
                    self.queue.add_after(name, delay);
                }
            }
            Err(ReconcileError::Conflict) => {
                self.metrics.outcome(ReconcileError::Conflict.metric_label());
                self.queue.add(name);
            }
            Err(e) => {
                self.metrics.outcome(e.metric_label());
                let attempt = {
                    let mut errors = lock(&self.errors);
                    let n = errors.entry(name.to_string()).or_default();
                    *n = n.saturating_add(1);
                    *n - 1
                };
                let backoff = Backoff {
                    initial: self.settings.policy.backoff.initial,
                    max: self.settings.poll_interval.max(self.settings.policy.backoff.max),
                    jitter: 0.5,
                };
                let delay = backoff.delay(attempt, fastrand::f64());
                tracing::warn!(gateway = name, error = %e, retry_in = ?delay, "reconcile failed");
                self.queue.add_after(name, delay);
            }
        }
    }

    /// Keeps the store watch running: a refused or ended watch is started
    /// again after a backoff (the token file is read again by the client),
    /// and `/readyz` reports it down meanwhile.
    async fn watch_store(self: Arc<Self>) {
        let backoff = Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            jitter: 0.5,
        };
        let mut failures = 0u32;
        loop {
            let mut updates = self.store.watch();
            let reason = loop {
                match updates.next().await {
                    // The watch loop retries by itself; until it is back,
                    // readyz says why and each attempt is logged.
                    Some(Ok(WatchUpdate::Interrupted { code, message, retry_in, .. })) => {
                        let reason = format!("{code:?}: {message}");
                        tracing::warn!(reason, ?retry_in, "cannot watch gateway-store; retrying (check --store, that the store runs, and the network between them)");
                        *lock(&self.watch_down) = Some(reason);
                    }
                    Some(Ok(update)) => {
                        failures = 0;
                        if lock(&self.watch_down).take().is_some() {
                            tracing::info!("the watch of gateway-store is back");
                        }
                        self.on_update(update);
                    }
                    Some(Err(status)) => {
                        break format!("{:?}: {}", status.code(), status.message());
                    }
                    None => break "the watch ended".to_string(),
                }
            };
            let delay = backoff.delay(failures, fastrand::f64());
            failures = failures.saturating_add(1);
            tracing::error!(reason, retry_in = ?delay, "the store watch is down; check the reconciler's token file and role");
            *lock(&self.watch_down) = Some(reason);
            tokio::time::sleep(delay).await;
        }
    }

    fn on_update(&self, update: WatchUpdate) {
        match update {
            WatchUpdate::Init { .. } => *lock(&self.listing) = Some(Default::default()),
            // Handled by the watch loop (`watch_store`).
            WatchUpdate::Interrupted { .. } => {}
            WatchUpdate::InitPage { gateways, .. } => {
                // Each page is cached and queued as it comes: only the
                // names of the whole list are held until it is done.
                let mut names = Vec::with_capacity(gateways.len());
                for g in gateways {
                    let name = name_of(&g);
                    self.remember(g);
                    self.queue.add(&name);
                    names.push(name);
                }
                lock(&self.listing).get_or_insert_default().extend(names);
            }
            WatchUpdate::InitDone { revision } => {
                let names = lock(&self.listing).take().unwrap_or_default();
                let stale: Vec<String> =
                    lock(&self.cache).keys().filter(|n| !names.contains(*n)).cloned().collect();
                for name in stale {
                    self.forget(&name);
                }
                self.synced.store(true, Ordering::Relaxed);
                tracing::info!(gateways = names.len(), revision, "listed gateways");
            }
            WatchUpdate::Applied { gateway, .. } => {
                let name = name_of(&gateway);
                // The echo of this process's own write (its answer is
                // cached already) tells the pass that wrote it nothing new:
                // queueing it would run a pass per write for nothing (a
                // third of the passes of a fleet's first converge).
                if self.remember(gateway) {
                    lock(&self.queued_at)
                        .entry(name.clone())
                        .or_insert_with(std::time::Instant::now);
                    self.queue.add(&name);
                }
            }
            WatchUpdate::Deleted { gateway, .. } => self.forget(&name_of(&gateway)),
            WatchUpdate::Bookmark { .. } => {}
        }
    }

    async fn resync(self: Arc<Self>) {
        loop {
            let jitter = 0.9 + fastrand::f64() * 0.2;
            tokio::time::sleep(self.settings.sync_period.mul_f64(jitter)).await;
            self.requeue_all();
        }
    }

    /// One pass over one gateway: what to do next, or why it could not
    /// finish.
    pub async fn reconcile(&self, mut gateway: Gateway) -> Result<Action, ReconcileError> {
        let meta = gateway.metadata.clone().unwrap_or_default();
        if meta.delete_time.is_some() {
            return self.finalize(&meta).await;
        }
        if !meta.finalizers.iter().any(|f| f == FINALIZER) {
            let mut finalizers = meta.finalizers.clone();
            finalizers.push(FINALIZER.to_string());
            gateway = self.set_finalizers(&meta, finalizers).await?;
        }
        let meta = gateway.metadata.clone().unwrap_or_default();
        let name = meta.name.as_str();
        let generation = meta.generation;
        {
            let mut first_seen = lock(&self.first_seen);
            let seen = first_seen.entry(name.to_string()).or_default();
            if !seen.iter().any(|(g, _)| *g == generation) {
                seen.push((generation, Instant::now()));
            }
        }
        let current = gateway.status.clone().unwrap_or_default();
        let rendered = render(&gateway, &self.settings.render);
        let inputs = Inputs {
            generation,
            fingerprint: rendered.fingerprint.clone(),
            retry_token: meta.annotations.get(RETRY_ANNOTATION).cloned().unwrap_or_default(),
        };
        let record = self.record(name, &current, &inputs);
        let owner = Owner::of(&meta);
        let applied = current.observed_generation == generation
            && current.applied_fingerprint == rendered.fingerprint
            && current.phase() != Phase::Failed
            && record.is_none();
        if !applied {
            return self.apply(&gateway, &owner, &rendered, &inputs, record).await;
        }
        let observation = self.observe(&owner, &rendered).await?;
        if observation.drifted {
            tracing::info!("owned objects drifted; repairing");
            return self.apply(&gateway, &owner, &rendered, &inputs, record).await;
        }
        self.report(&gateway, &rendered, &observation, "observed").await
    }

    /// The failure record for these inputs: this process's, else the one
    /// the status carries (resumed: an overdue retry is spread over its
    /// wait, so a fleet read back after a restart does not retry at once).
    fn record(&self, name: &str, current: &GatewayStatus, inputs: &Inputs) -> Option<Attempts> {
        let mut records = lock(&self.records);
        if let Some(r) = records.get(name) {
            if r.inputs == *inputs {
                return Some(r.clone());
            }
            records.remove(name);
        }
        let recorded = Attempts::recorded(
            inputs,
            current.failure_count,
            &current.failed_inputs,
            timestamp_ms(current.next_retry_time.as_ref()),
            &current.message,
        )?;
        let resumed = self.settings.policy.resume(recorded, self.now_ms(), fastrand::f64());
        records.insert(name.to_string(), resumed.clone());
        Some(resumed)
    }

    async fn observe(
        &self,
        owner: &Owner,
        rendered: &Rendered,
    ) -> Result<Observation, ReconcileError> {
        let started = std::time::Instant::now();
        let observed =
            tokio::time::timeout(STORE_TIMEOUT, self.target.observe(owner, rendered)).await;
        self.metrics.stage("observe", started);
        match observed {
            Ok(Ok(o)) => Ok(o),
            Ok(Err(e)) => Err(ReconcileError::Observe(e)),
            Err(_) => Err(ReconcileError::Observe(TargetError(format!(
                "no answer within {STORE_TIMEOUT:?}"
            )))),
        }
    }

    /// Writes the status of what was observed (if it changed) and says
    /// when to look again.
    async fn report(
        &self,
        gateway: &Gateway,
        rendered: &Rendered,
        observation: &Observation,
        outcome: &'static str,
    ) -> Result<Action, ReconcileError> {
        let generation = gateway.metadata.as_ref().map_or(0, |m| m.generation);
        let current = gateway.status.clone().unwrap_or_default();
        let has_route = rendered.manifests.iter().any(|m| m["kind"] == "Ingress");
        let desired = status::applied(generation, &rendered.fingerprint, observation, has_route);
        let moving =
            matches!(observation.workload, Workload::Progressing { .. } | Workload::Stalled { .. });
        if status::differs(&current, &desired) {
            self.write_status(gateway, desired).await?;
        } else if outcome == "observed" {
            return Ok(self.poll_if(moving, "unchanged"));
        }
        Ok(self.poll_if(moving, outcome))
    }

    fn poll_if(&self, moving: bool, outcome: &'static str) -> Action {
        if moving {
            Action::after(outcome, self.settings.poll_interval)
        } else {
            Action::done(outcome)
        }
    }

    async fn apply(
        &self,
        gateway: &Gateway,
        owner: &Owner,
        rendered: &Rendered,
        inputs: &Inputs,
        record: Option<Attempts>,
    ) -> Result<Action, ReconcileError> {
        let name = owner.name.as_str();
        let now = self.now_ms();
        if let (Some(record), Decision::Wait { until_ms }) =
            (&record, self.settings.policy.decide(record.as_ref(), inputs, now))
        {
            // An unchanged failure: no apply. The status is written only if
            // it does not show the record yet (an earlier write failed or
            // met a conflict).
            let wait = Duration::from_millis(until_ms.saturating_sub(now));
            let desired = self.failure_status(gateway, record);
            let current = gateway.status.clone().unwrap_or_default();
            if status::differs(&current, &desired) {
                self.write_status(gateway, desired).await?;
            }
            return Ok(Action::after("waiting", wait));
        }
        let started = std::time::Instant::now();
        let applied =
            tokio::time::timeout(TARGET_TIMEOUT, self.target.apply(owner, rendered)).await;
        self.metrics.stage("apply", started);
        let result = match applied {
            Ok(r) => r,
            Err(_) => Err(TargetError(format!("apply: no answer within {TARGET_TIMEOUT:?}"))),
        };
        match result {
            Ok(()) => {
                lock(&self.records).remove(name);
                tracing::info!(target = self.target.name(), "manifests applied");
                let observation = match self.observe(owner, rendered).await {
                    Ok(o) => o,
                    Err(e) => Observation {
                        workload: Workload::Progressing {
                            message: format!("cannot observe yet: {e}"),
                        },
                        route_address: String::new(),
                        drifted: false,
                    },
                };
                self.report(gateway, rendered, &observation, "applied").await
            }
            Err(e) if !self.target.may_write() => Err(ReconcileError::NotLeader(e)),
            Err(e) => {
                // Printable first: a replaced control character takes three bytes.
                let error = shorten(&printable(&e.0, false), MAX_TEXT_BYTES);
                let failure = self.settings.policy.on_failure(
                    record.as_ref(),
                    inputs,
                    &error,
                    now,
                    fastrand::f64(),
                );
                let wait = Duration::from_millis(failure.attempts.retry_at_ms.saturating_sub(now));
                tracing::warn!(error = %e, failures = failure.attempts.failures, exhausted = failure.exhausted, retry_in = ?wait, "apply failed");
                // Kept before the write: a status write that fails does not
                // reset the budget.
                lock(&self.records).insert(name.to_string(), failure.attempts.clone());
                let desired = self.failure_status(gateway, &failure.attempts);
                self.write_status(gateway, desired).await?;
                Ok(Action::after("failed", wait))
            }
        }
    }

    /// The status that shows `record`.
    fn failure_status(&self, gateway: &Gateway, record: &Attempts) -> GatewayStatus {
        let current = gateway.status.clone().unwrap_or_default();
        let exhausted = record.failures >= self.settings.policy.budget.max(1);
        status::failed(
            &current,
            record.inputs.generation,
            &record.last_error,
            record.failures,
            exhausted,
            ms_timestamp(record.retry_at_ms),
            record.inputs.key(),
        )
    }

    async fn finalize(&self, meta: &ObjectMeta) -> Result<Action, ReconcileError> {
        if !meta.finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(Action::done("unchanged"));
        }
        let owner = Owner::of(meta);
        match tokio::time::timeout(TARGET_TIMEOUT, self.target.delete(&owner)).await {
            Ok(Ok(true)) => {
                let finalizers: Vec<String> =
                    meta.finalizers.iter().filter(|f| *f != FINALIZER).cloned().collect();
                self.set_finalizers(meta, finalizers).await?;
                tracing::info!("owned objects deleted; finalizer removed");
                Ok(Action::done("deleted"))
            }
            Ok(Ok(false)) => Ok(Action::after("deleting", self.settings.poll_interval)),
            Ok(Err(e)) if !self.target.may_write() => Err(ReconcileError::NotLeader(e)),
            Ok(Err(e)) => Err(ReconcileError::Cleanup(e)),
            Err(_) => Err(ReconcileError::Cleanup(TargetError(format!(
                "no answer within {TARGET_TIMEOUT:?}"
            )))),
        }
    }

    /// Writes `metadata.finalizers`, conditional on the version read.
    async fn set_finalizers(
        &self,
        meta: &ObjectMeta,
        finalizers: Vec<String>,
    ) -> Result<Gateway, ReconcileError> {
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
    ) -> Result<Gateway, ReconcileError> {
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
        let started = std::time::Instant::now();
        let written = self.update(update, &STATUS_PATHS).await;
        self.metrics.stage("status_write", started);
        let written = written?;
        if observed > previous {
            let mut first_seen = lock(&self.first_seen);
            if let Some(seen) = first_seen.get_mut(&name) {
                if let Some((_, at)) = seen.iter().find(|(g, _)| *g == observed) {
                    self.metrics.convergence.observe(at.elapsed().as_secs_f64());
                }
                seen.retain(|(g, _)| *g > observed);
                if seen.is_empty() {
                    first_seen.remove(&name);
                }
            }
        }
        Ok(written)
    }

    /// One UpdateGateway with a mask and the resource_version read. ABORTED
    /// re-reads the gateway so the next pass (run at once) works on the
    /// fresh copy; NOT_FOUND forgets it.
    async fn update(&self, gateway: Gateway, paths: &[&str]) -> Result<Gateway, ReconcileError> {
        let name = name_of(&gateway);
        match tokio::time::timeout(STORE_TIMEOUT, self.store.update(gateway, paths)).await {
            Ok(Ok(updated)) => {
                self.remember(updated.clone());
                Ok(updated)
            }
            Ok(Err(status)) if status.code() == Code::Aborted => {
                tracing::debug!("gateway changed meanwhile; re-reading");
                match tokio::time::timeout(STORE_TIMEOUT, self.store.get(&name)).await {
                    Ok(Ok(fresh)) => {
                        self.remember(fresh);
                    }
                    Ok(Err(status)) if status.code() == Code::NotFound => self.forget(&name),
                    _ => {}
                }
                Err(ReconcileError::Conflict)
            }
            Ok(Err(status)) if status.code() == Code::NotFound => {
                self.forget(&name);
                Err(ReconcileError::Store(format!("gateway {name} is gone")))
            }
            Ok(Err(status)) => {
                Err(ReconcileError::Store(format!("{:?}: {}", status.code(), status.message())))
            }
            Err(_) => Err(ReconcileError::Store(format!("no answer within {STORE_TIMEOUT:?}"))),
        }
    }
}

fn phase_name(phase: Phase) -> String {
    phase.as_str_name().trim_start_matches("PHASE_").to_ascii_lowercase()
}

/// Every phase, for the per-phase gauge.
const ALL_PHASES: [Phase; 8] = [
    Phase::Unspecified,
    Phase::Pending,
    Phase::Provisioning,
    Phase::Running,
    Phase::Degraded,
    Phase::Failed,
    Phase::Deleting,
    Phase::Written,
];

#[cfg(test)]
mod tests;
