//! The controller's rules, in process: the in-memory store (gantry-core's
//! rules), a scripted target, and paused time.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU32;

use gantry_api::v1::{ConditionStatus, GatewaySpec};
use gantry_core::Role;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use gantry_api::v1::{GatewayStatus, Phase};
use gantry_core::recovery::Inputs;
use gantry_core::retry::Backoff;
use gantry_core::status::MAX_TEXT_BYTES;
use tokio::time::Instant;

use super::clock::ms_timestamp;
use super::*;
use crate::render::{render, Rendered};
use crate::status::{self, Observation, Workload, STATUS_PATHS};
use crate::store::MemoryStore;
use crate::targets::{Owner, TargetError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A target whose applies fail while `failing` holds an error text, and
/// whose workload is whatever `workload` says.
#[derive(Debug, Default)]
struct ScriptedTarget {
    failing: Mutex<Option<String>>,
    workload: Mutex<Option<Workload>>,
    drifted: AtomicBool,
    /// A drift no apply removes (another writer sets it every time).
    sticky_drift: AtomicBool,
    applies: Mutex<Vec<(String, Instant)>>,
    observes: AtomicU32,
    deletes: AtomicU32,
    /// Its watch of Deployments has not listed yet.
    listing: AtomicBool,
}

impl ScriptedTarget {
    fn fail_with(&self, error: Option<&str>) {
        *lock(&self.failing) = error.map(str::to_string);
    }

    fn applies_of(&self, name: &str) -> usize {
        lock(&self.applies).iter().filter(|(n, _)| n == name).count()
    }

    fn total_applies(&self) -> usize {
        lock(&self.applies).len()
    }
}

#[tonic::async_trait]
impl Target for ScriptedTarget {
    async fn apply(&self, owner: &Owner, _: &Rendered) -> Result<(), TargetError> {
        lock(&self.applies).push((owner.name.clone(), Instant::now()));
        match lock(&self.failing).clone() {
            Some(error) => Err(TargetError::Other(error)),
            None => {
                self.drifted.store(false, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    async fn observe(&self, _: &Owner, _: &Rendered) -> Result<Observation, TargetError> {
        self.observes.fetch_add(1, Ordering::SeqCst);
        Ok(Observation {
            workload: lock(&self.workload).clone().unwrap_or(Workload::Available),
            route_address: String::new(),
            drift: (self.drifted.load(Ordering::SeqCst)
                || self.sticky_drift.load(Ordering::SeqCst))
            .then(|| "Deployment edge: .spec.template.spec.containers[gateway].image".into()),
        })
    }

    async fn delete(&self, _: &Owner) -> Result<bool, TargetError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    fn unsynced(&self) -> Vec<&'static str> {
        if self.listing.load(Ordering::SeqCst) {
            vec!["Deployment"]
        } else {
            Vec::new()
        }
    }

    fn name(&self) -> &'static str {
        "scripted"
    }
}

/// Fixture builders for gateways.
trait Fixture {
    fn test(name: &str) -> Self;
    fn image(self, image: &str) -> Self;
    /// FAILED by an earlier process: the budget spent for `inputs`, the
    /// next try recorded at `retry_at_ms`, the finalizer in place.
    fn failed(self, inputs: &Inputs, retry_at_ms: u64) -> Self;
}

impl Fixture for Gateway {
    fn test(name: &str) -> Self {
        Gateway {
            metadata: Some(MemoryStore::meta(name)),
            spec: Some(GatewaySpec {
                image: "ghcr.io/acme/gateway:1.0".into(),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn image(mut self, image: &str) -> Self {
        self.spec.get_or_insert_with(Default::default).image = image.into();
        self
    }

    fn failed(mut self, inputs: &Inputs, retry_at_ms: u64) -> Self {
        let meta = self.metadata.get_or_insert_with(Default::default);
        meta.finalizers = vec![FINALIZER.into()];
        self.status = Some(status::failed(
            &GatewayStatus::default(),
            inputs.generation,
            "boom",
            BUDGET,
            true,
            ms_timestamp(retry_at_ms),
            inputs.key(),
        ));
        self
    }
}

const BUDGET: u32 = 3;

fn settings() -> Settings {
    Settings {
        policy: RecoveryPolicy {
            budget: BUDGET,
            backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(10),
                jitter: 0.0,
            },
            sync_period: Duration::from_secs(300),
            failed_window_floor: Duration::from_secs(60),
        },
        concurrency: 4,
        sync_period: Duration::from_secs(300),
        poll_interval: Duration::from_secs(2),
        ..Settings::default()
    }
}

/// A running controller over `store` and `target`.
struct Running {
    controller: Arc<Controller>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(store: &MemoryStore, target: &Arc<ScriptedTarget>) -> Running {
        let controller = Controller::new(
            Arc::new(store.clone()),
            target.clone(),
            settings(),
            Arc::new(Metrics::default()),
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(controller.clone().run(async {
            let _ = stopped.await;
        }));
        Running { controller, stop: Some(stop), task }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = (&mut self.task).await;
    }
}

/// Waits (on paused time) until `condition` holds, at most `within`.
async fn until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    gantry_testkit::eventually(within, what, || std::future::ready(condition())).await;
}

fn status(store: &MemoryStore, name: &str) -> GatewayStatus {
    store.stored(name).and_then(|g| g.status).unwrap_or_default()
}

fn is_failed(store: &MemoryStore, name: &str) -> bool {
    status(store, name).phase() == Phase::Failed
}

fn is_running(store: &MemoryStore, name: &str) -> bool {
    let g = store.stored(name).unwrap_or_default();
    let generation = g.metadata.as_ref().map_or(0, |m| m.generation);
    let s = g.status.unwrap_or_default();
    s.phase() == Phase::Running && s.observed_generation == generation
}

fn create(store: &MemoryStore, gateway: Gateway) {
    store.create(gateway).expect("create");
}

fn edit(store: &MemoryStore, name: &str, change: impl FnOnce(&mut Gateway), paths: &[&str]) {
    let mut g = store.stored(name).expect("stored");
    change(&mut g);
    store.update_as(Role::Editor, &g, paths).expect("edit");
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn an_unchanged_failure_writes_nothing_and_applies_nothing_until_its_time() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    target.fail_with(Some("admission webhook denied the request"));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "FAILED after the budget", || is_failed(&store, "edge")).await;
    let s = status(&store, "edge");
    assert_eq!(target.applies_of("edge"), BUDGET as usize);
    assert_eq!(s.failure_count, BUDGET as i32);
    assert_eq!(s.message, "admission webhook denied the request");
    assert!(!s.failed_inputs.is_empty() && s.next_retry_time.is_some());
    let stalled = s.conditions.iter().find(|c| c.r#type == "Stalled").unwrap();
    assert_eq!(stalled.status(), ConditionStatus::True);

    // The window is 5 minutes (the sync period): nothing happens in it,
    // not even on events (a label change queues the gateway).
    let writes = store.reconciler_writes();
    edit(
        &store,
        "edge",
        |g| {
            g.metadata.as_mut().unwrap().labels = BTreeMap::from([("team".into(), "a".into())]);
        },
        &["metadata.labels"],
    );
    tokio::time::sleep(Duration::from_secs(290)).await;
    assert_eq!(target.applies_of("edge"), BUDGET as usize, "applied before its time");
    assert_eq!(store.reconciler_writes(), writes, "wrote status of an unchanged failure");

    // At its time: one more try, FAILED again, and nothing after it.
    until(MINUTE, "one try after the window", || target.applies_of("edge") == 1 + BUDGET as usize)
        .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(target.applies_of("edge"), 1 + BUDGET as usize);
    assert!(is_failed(&store, "edge"));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_status_write_does_not_reset_the_budget() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    // The store goes down as applies start failing: no status write lands.
    target.fail_with(Some("the API server is unavailable"));
    edit(&store, "edge", |g| *g = g.clone().image("ghcr.io/acme/gateway:2.0"), &["spec.image"]);
    store.set_down(true);
    until(MINUTE, "the budget spent while the store is down", || {
        target.applies_of("edge") > BUDGET as usize
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        target.applies_of("edge"),
        1 + BUDGET as usize,
        "retried past the budget: the record was lost with the failed writes"
    );
    store.set_down(false);
    until(MINUTE, "FAILED stored once the store is back", || is_failed(&store, "edge")).await;
    assert_eq!(status(&store, "edge").failure_count, BUDGET as i32);
    assert_eq!(target.applies_of("edge"), 1 + BUDGET as usize);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_oversized_error_is_cut_to_what_the_store_accepts_and_ends_failed() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let error = format!("apply Deployment edge: {} the real cause", "x".repeat(100_000));
    target.fail_with(Some(&error));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "FAILED with a long error", || is_failed(&store, "edge")).await;
    let s = status(&store, "edge");
    assert!(s.message.len() <= MAX_TEXT_BYTES);
    assert!(
        s.message.starts_with("apply Deployment edge: ") && s.message.ends_with("the real cause")
    );
    assert_eq!((s.failure_count, target.applies_of("edge")), (BUDGET as i32, BUDGET as usize));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn aborted_on_the_failed_write_still_ends_with_failed_stored() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    target.fail_with(Some("boom"));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "two failures recorded", || status(&store, "edge").failure_count == 2).await;
    store.abort_next_updates(1);
    until(MINUTE, "FAILED despite the conflict", || is_failed(&store, "edge")).await;
    assert_eq!(target.applies_of("edge"), BUDGET as usize, "the conflict cost no extra apply");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_controller_honours_the_recorded_retry_time() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    target.fail_with(Some("boom"));
    let first = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "FAILED", || is_failed(&store, "edge")).await;
    first.stop().await;
    let failed_at = Instant::now();
    let second = Running::start(&store, &target);
    until(MINUTE, "the new process listed", || second.controller.is_synced()).await;
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert_eq!(target.applies_of("edge"), BUDGET as usize, "retried at once after a restart");
    until(2 * MINUTE, "retried at the recorded time", || {
        target.applies_of("edge") == 1 + BUDGET as usize
    })
    .await;
    let waited = failed_at.elapsed();
    assert!(waited >= Duration::from_secs(295), "retried after {waited:?}, not at its time");
    second.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_controller_spreads_a_fleet_of_overdue_failed_gateways() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let renderer = settings().render;
    let now_ms =
        u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
    for i in 0..40 {
        let name = format!("gw-{i}");
        create(&store, Gateway::test(&name));
        // FAILED by an earlier process, due an hour ago.
        let g = store.stored(&name).unwrap();
        let inputs = Inputs {
            generation: 1,
            fingerprint: render(&g, &renderer).fingerprint,
            retry_token: String::new(),
        };
        let failed = Gateway { spec: None, ..g.failed(&inputs, now_ms - 3_600_000) };
        let mut paths = STATUS_PATHS.to_vec();
        paths.push("metadata.finalizers");
        store.update_as(Role::Reconciler, &failed, &paths).expect("recorded failure");
    }
    let started = Instant::now();
    let running = Running::start(&store, &target);
    until(6 * MINUTE, "every FAILED gateway retried", || target.total_applies() == 40).await;
    let times: Vec<Duration> =
        lock(&target.applies).iter().map(|(_, at)| at.duration_since(started)).collect();
    let in_first_minute = times.iter().filter(|t| **t < MINUTE).count();
    assert!(in_first_minute < 20, "{in_first_minute} of 40 retried in the first minute: a burst");
    assert!(times.iter().all(|t| *t <= Duration::from_secs(300)), "spread beyond the window");
    assert!(store.stored("gw-0").is_some_and(|g| g.status.unwrap().phase() == Phase::Running));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn new_inputs_apply_at_once_with_a_fresh_budget() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    target.fail_with(Some("boom"));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "FAILED", || is_failed(&store, "edge")).await;

    // A spec change: applied at once, and counted from one again.
    edit(&store, "edge", |g| *g = g.clone().image("ghcr.io/acme/gateway:2.0"), &["spec.image"]);
    until(Duration::from_millis(500), "applied at once on a spec change", || {
        target.applies_of("edge") == 1 + BUDGET as usize
    })
    .await;
    until(Duration::from_millis(500), "a fresh budget", || {
        status(&store, "edge").failure_count == 1
    })
    .await;
    until(MINUTE, "FAILED again", || is_failed(&store, "edge")).await;

    // A retry request: the same.
    let applies = target.applies_of("edge");
    edit(
        &store,
        "edge",
        |g| {
            g.metadata.as_mut().unwrap().annotations =
                BTreeMap::from([(RETRY_ANNOTATION.into(), "2026-12-04T09:00:00Z".into())]);
        },
        &["metadata.annotations"],
    );
    until(Duration::from_millis(500), "applied at once on a retry request", || {
        target.applies_of("edge") == applies + 1
    })
    .await;
    target.fail_with(None);
    until(MINUTE, "running after the fix", || is_running(&store, "edge")).await;
    assert_eq!(status(&store, "edge").failure_count, 0);
    assert!(status(&store, "edge").failed_inputs.is_empty());
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_degraded_gateway_reprovisions_on_a_spec_change() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    *lock(&target.workload) = Some(Workload::Stalled {
        reason: "ProgressDeadlineExceeded".into(),
        message: "image pull back-off".into(),
    });
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "DEGRADED", || status(&store, "edge").phase() == Phase::Degraded).await;
    *lock(&target.workload) = None;
    edit(&store, "edge", |g| *g = g.clone().image("ghcr.io/acme/gateway:1.1"), &["spec.image"]);
    until(MINUTE, "running on the new generation", || is_running(&store, "edge")).await;
    assert_eq!(target.applies_of("edge"), 2);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_at_an_equal_generation_recovers_after_the_window_without_a_spec_change() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    // Converged at generation 1; its drift repair fails until the budget
    // is spent: FAILED with observed_generation == generation.
    target.fail_with(Some("quota exceeded"));
    target.drifted.store(true, Ordering::SeqCst);
    running.controller.state().queue.add("edge"); // what the owned-object watch does
    until(MINUTE, "FAILED", || is_failed(&store, "edge")).await;
    let g = store.stored("edge").unwrap();
    let s = g.status.unwrap();
    assert_eq!((s.observed_generation, g.metadata.unwrap().generation), (1, 1));
    assert_eq!((s.failure_count, s.message.as_str()), (BUDGET as i32, "quota exceeded"));
    target.fail_with(None); // the cause went away; nobody touches the spec
    until(6 * MINUTE, "RUNNING after the window", || is_running(&store, "edge")).await;
    let s = status(&store, "edge");
    assert_eq!((s.failure_count, s.message.as_str()), (0, "running"));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_echoes_of_its_own_writes_run_no_pass_and_others_writes_do() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    // One pass: finalizer, apply, observe, status. Its two writes come
    // back on the watch; neither runs another pass.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!((target.applies_of("edge"), target.observes.load(Ordering::SeqCst)), (1, 1));
    // A write by someone else (a label) is news: one pass, nothing to do.
    edit(
        &store,
        "edge",
        |g| {
            g.metadata.as_mut().unwrap().labels.insert("team".into(), "a".into());
        },
        &["metadata.labels"],
    );
    until(Duration::from_secs(5), "the label change checked", || {
        target.observes.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(target.applies_of("edge"), 1);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn drift_is_repaired_and_an_idle_gateway_costs_nothing() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    let writes = store.reconciler_writes();
    tokio::time::sleep(Duration::from_secs(700)).await; // two resyncs
    assert_eq!((target.applies_of("edge"), store.reconciler_writes()), (1, writes));
    target.drifted.store(true, Ordering::SeqCst);
    running.controller.state().queue.add("edge"); // what the owned-object watch does
    until(Duration::from_secs(1), "drift repaired", || target.applies_of("edge") == 2).await;
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_watch_is_not_ready_and_resumes_by_itself() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    until(MINUTE, "ready", || running.controller.readiness().is_ok()).await;
    store.refuse_watches(Some(tonic::Status::unauthenticated("the token expired")));
    until(MINUTE, "not ready while the watch is refused", || {
        running.controller.readiness().is_err_and(|r| r.contains("the token expired"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(running.controller.readiness().is_err(), "ready without a watch");
    create(&store, Gateway::test("edge"));
    store.refuse_watches(None);
    until(MINUTE, "ready again", || running.controller.readiness().is_ok()).await;
    until(MINUTE, "a gateway created meanwhile converges", || is_running(&store, "edge")).await;
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_gateway_is_cleaned_up_and_forgotten_by_the_metrics() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    store.delete("edge").expect("delete");
    until(MINUTE, "removed from the store", || store.stored("edge").is_none()).await;
    assert_eq!(target.deletes.load(Ordering::SeqCst), 1);
    until(MINUTE, "forgotten", || running.controller.cached("edge").is_none()).await;
    running.controller.update_gauges();
    let text = running.controller.metrics.encode();
    assert!(text.contains("gantry_reconciler_gateways{phase=\"deleting\"} 0"), "{text}");
    assert!(text.contains("gantry_reconciler_gateways{phase=\"running\"} 0"), "{text}");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn every_stage_of_a_change_is_timed() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    // Created once the controller watches: the change comes as an event.
    until(MINUTE, "watching", || running.controller.is_synced()).await;
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    let text = running.controller.metrics.encode();
    for stage in ["queue", "apply", "observe", "status_write"] {
        let count = format!("gantry_reconciler_stage_duration_seconds_count{{stage=\"{stage}\"}} ");
        let n: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(count.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("stage {stage} not timed:\n{text}"));
        assert!(n >= 1, "stage {stage} counted {n} times");
    }
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn no_pass_runs_before_the_targets_watches_list_and_a_shutdown_does_not_wait_for_them() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    target.listing.store(true, Ordering::SeqCst);
    create(&store, Gateway::test("edge"));
    let running = Running::start(&store, &target);
    tokio::time::sleep(MINUTE).await;
    assert_eq!(target.total_applies(), 0, "a pass ran before the watches listed");
    let not_ready = running.controller.readiness().unwrap_err();
    assert!(not_ready.contains("Deployment"), "{not_ready}");
    tokio::time::timeout(MINUTE, running.stop())
        .await
        .expect("the shutdown waited for the watches");

    let running = Running::start(&store, &target);
    tokio::time::sleep(MINUTE).await;
    target.listing.store(false, Ordering::SeqCst);
    until(MINUTE, "converged once the watches listed", || is_running(&store, "edge")).await;
    assert_eq!(running.controller.readiness(), Ok(()));
    running.stop().await;
}

fn spec_image(store: &MemoryStore, name: &str) -> String {
    store.stored(name).and_then(|g| g.spec).unwrap_or_default().image
}

fn cached_image(running: &Running, name: &str) -> String {
    running.controller.cached(name).and_then(|g| g.spec).unwrap_or_default().image
}

#[tokio::test(start_paused = true)]
async fn a_store_restored_from_a_backup_is_converged_on_and_later_edits_apply() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    let backup = store.backup();
    // After the backup: an edit (several revisions with its status) and a
    // new gateway, both converged; the cache is now ahead of the backup.
    let image = |i: &'static str| move |g: &mut Gateway| g.spec.as_mut().unwrap().image = i.into();
    edit(&store, "edge", image("ghcr.io/acme/gateway:2.0"), &["spec.image"]);
    create(&store, Gateway::test("late"));
    until(MINUTE, "both converged", || is_running(&store, "edge") && is_running(&store, "late"))
        .await;

    store.restore(&backup, None);
    until(MINUTE, "the restored spec cached", || {
        cached_image(&running, "edge") == "ghcr.io/acme/gateway:1.0"
    })
    .await;
    assert!(running.controller.cached("late").is_none(), "a gateway the backup lacks is gone");
    // An edit after the restore has a revision below those cached before
    // it: applied all the same.
    let applies = target.applies_of("edge");
    edit(&store, "edge", image("ghcr.io/acme/gateway:3.0"), &["spec.image"]);
    until(MINUTE, "the edit after the restore applied", || is_running(&store, "edge")).await;
    assert_eq!(spec_image(&store, "edge"), "ghcr.io/acme/gateway:3.0");
    assert_eq!(target.applies_of("edge"), applies + 1, "one apply for the one edit");
    running.stop().await;
}

#[tokio::test]
async fn a_conflict_against_a_restored_store_is_re_read_once_not_looped() {
    // Real time: a regression loops hot, which paused time would never
    // leave; here the bounded wait fails instead.
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let controller = Controller::new(
        Arc::new(store.clone()),
        target.clone(),
        Settings { sync_period: Duration::from_millis(100), ..settings() },
        Arc::new(Metrics::default()),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(controller.clone().run(async {
        let _ = stopped.await;
    }));
    let running = Running { controller, stop: Some(stop), task };
    create(&store, Gateway::test("edge"));
    until(Duration::from_secs(30), "running", || is_running(&store, "edge")).await;
    let backup = store.backup();
    let label = |g: &mut Gateway| {
        g.metadata.as_mut().unwrap().labels.insert("team".into(), "a".into());
    };
    edit(&store, "edge", label, &["metadata.labels"]);
    until(Duration::from_secs(30), "the label cached", || {
        running.controller.cached("edge").is_some_and(|g| !g.metadata.unwrap().labels.is_empty())
    })
    .await;
    // Restored while the watch is refused: no relist tells the controller.
    // The next pass (a resync) has news to write and meets the conflict
    // of its stale version.
    store.restore(&backup, Some(tonic::Status::unavailable("restarting")));
    store.refuse_watches(Some(tonic::Status::unavailable("restarting")));
    let reads = store.reads();
    *lock(&target.workload) = Some(Workload::Progressing { message: "1 of 2 updated".into() });
    until(Duration::from_secs(30), "the new status written", || {
        status(&store, "edge").phase() == Phase::Provisioning
    })
    .await;
    assert!(store.reads() - reads <= 2, "re-read {} times", store.reads() - reads);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_drift_every_repair_leaves_is_reported_after_its_budget_and_then_costs_nothing() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    until(MINUTE, "running", || is_running(&store, "edge")).await;
    target.sticky_drift.store(true, Ordering::SeqCst);
    let persists = |store: &MemoryStore| {
        status(store, "edge").conditions.iter().any(|c| c.reason == status::DRIFT_PERSISTS)
    };
    // Each apply is answered by a watch event of the re-drifted object.
    until(MINUTE, "the drift reported", || {
        running.controller.state().queue.add("edge");
        persists(&store)
    })
    .await;
    assert_eq!(target.applies_of("edge"), 1 + super::plan::DRIFT_REPAIRS as usize);
    assert!(is_running(&store, "edge"), "the workload is fine: still RUNNING");
    // Resyncs and watch events: nothing more is applied or written.
    let writes = store.reconciler_writes();
    for _ in 0..3 {
        running.controller.state().queue.add("edge");
        tokio::time::sleep(Duration::from_secs(300)).await;
    }
    assert_eq!(target.applies_of("edge"), 1 + super::plan::DRIFT_REPAIRS as usize);
    assert_eq!(store.reconciler_writes(), writes);
    // A spec change is new inputs: applied, and repairs resume.
    edit(
        &store,
        "edge",
        |g| g.spec.as_mut().unwrap().image = "ghcr.io/acme/gateway:2.0".into(),
        &["spec.image"],
    );
    until(MINUTE, "the new generation applied", || {
        target.applies_of("edge") > 1 + super::plan::DRIFT_REPAIRS as usize
    })
    .await;
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_apply_names_its_reason_while_retrying_and_once_the_budget_is_spent() {
    let (store, target) = (MemoryStore::default(), Arc::new(ScriptedTarget::default()));
    target.fail_with(Some("refused by the API server"));
    let running = Running::start(&store, &target);
    create(&store, Gateway::test("edge"));
    let reason = |store: &MemoryStore, kind: &str| {
        let s = status(store, kind.split(':').next().unwrap());
        let kind = kind.split(':').nth(1).unwrap();
        s.conditions.iter().find(|c| c.r#type == kind).map(|c| (c.status(), c.reason.clone()))
    };
    until(MINUTE, "one failure shown", || status(&store, "edge").failure_count == 1).await;
    assert_eq!(
        reason(&store, "edge:Reconciling"),
        Some((ConditionStatus::True, "ApplyFailed".to_string())),
        "retrying"
    );
    assert_eq!(reason(&store, "edge:Ready").map(|r| r.1).as_deref(), Some("ApplyFailed"));
    until(MINUTE, "FAILED", || is_failed(&store, "edge")).await;
    assert_eq!(
        reason(&store, "edge:Stalled"),
        Some((ConditionStatus::True, "RetryBudgetExhausted".to_string()))
    );
    running.stop().await;
}
