//! State shared between the controller and the HTTP server (as in
//! kube-rs' controller-rs): the gateways this process knows, one entry
//! each, whether the store is listed and watched, and the work queue whose
//! depth is a gauge. `/readyz` and `/metrics` read this and nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gantry_api::v1::{Gateway, GatewayStatus, Phase};
use gantry_core::recovery::Attempts;
use tokio::time::Instant;

use super::plan::DriftRecord;
use crate::metrics::{Metrics, PhaseLabels};
use crate::queue::WorkQueue;
use crate::targets::Target;

/// Everything this process holds about one gateway: forgetting a gateway
/// is one removal.
#[derive(Debug)]
pub(super) struct Entry {
    /// The newest version seen (from the watch or from our own writes).
    pub(super) cached: Cached,
    /// The failure record for the current inputs, read from status or
    /// newer than what status shows when a status write failed.
    pub(super) record: Option<Attempts>,
    /// Repairs of a drift that came back.
    pub(super) drift: Option<DriftRecord>,
    /// Consecutive failed passes, for the runtime's backoff.
    pub(super) errors: u32,
    /// When each generation not yet observed was first seen.
    pub(super) first_seen: Vec<(i64, Instant)>,
    /// When a store event first queued it since its last pass.
    pub(super) queued_at: Option<std::time::Instant>,
}

/// A cached gateway, encoded: decoded, a converged gateway took several
/// times its encoding in memory (at 100,000 gateways, the bulk of the
/// reconciler's budget). A pass decodes it.
#[derive(Debug)]
pub(super) struct Cached {
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

/// What the controller knows, shared with the HTTP server.
#[derive(Debug)]
pub struct State {
    gateways: Mutex<HashMap<String, Entry>>,
    /// The first list of the store is done.
    synced: AtomicBool,
    /// Why the store watch is down, while it is.
    watch_down: Mutex<Option<String>>,
    /// Gateways to reconcile; only the runtime adds and takes.
    pub(super) queue: WorkQueue,
    /// Asked only which of its watches have listed (readiness).
    target: Arc<dyn Target>,
    pub metrics: Arc<Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn name_of(g: &Gateway) -> String {
    g.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default()
}

pub(super) fn rv_of(g: &Gateway) -> i64 {
    g.metadata.as_ref().map_or(0, |m| m.resource_version)
}

/// A deleted gateway whose last finalizer is gone: the store removed it.
fn is_removed(g: &Gateway) -> bool {
    g.metadata.as_ref().is_some_and(|m| m.delete_time.is_some() && m.finalizers.is_empty())
}

impl State {
    pub(super) fn new(target: Arc<dyn Target>, metrics: Arc<Metrics>) -> Self {
        Self {
            gateways: Mutex::default(),
            synced: AtomicBool::new(false),
            watch_down: Mutex::default(),
            queue: WorkQueue::default(),
            target,
            metrics,
        }
    }

    /// `Ok` when the store is listed and watched; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(reason) = lock(&self.watch_down).clone() {
            return Err(format!("the watch of gateway-store is down: {reason}"));
        }
        if !self.is_synced() {
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

    /// No pass running or due now (see [`WorkQueue::is_idle`]).
    pub fn is_idle(&self) -> bool {
        self.queue.is_idle()
    }

    /// Whether the first list of the store has been processed.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    pub(super) fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    /// Records why the store watch is down (`None`: it is up); the reason
    /// it was down before.
    pub(super) fn set_watch_down(&self, reason: Option<String>) -> Option<String> {
        std::mem::replace(&mut *lock(&self.watch_down), reason)
    }

    /// Refreshes the gauges read at scrape time.
    pub fn update_gauges(&self) {
        self.metrics.queue_depth.set(i64::try_from(self.queue.len()).unwrap_or(i64::MAX));
        let watching = lock(&self.watch_down).is_none() && self.is_synced();
        self.metrics.store_watch_up.set(i64::from(watching));
        let mut counts: HashMap<String, i64> =
            ALL_PHASES.iter().map(|p| (phase_name(*p), 0)).collect();
        for entry in lock(&self.gateways).values() {
            *counts.entry(phase_name(entry.cached.phase)).or_default() += 1;
        }
        for (phase, n) in counts {
            self.metrics.gateways.get_or_create(&PhaseLabels { phase }).set(n);
        }
    }

    /// The cached gateway.
    pub fn cached(&self, name: &str) -> Option<Gateway> {
        let bytes = lock(&self.gateways).get(name).map(|e| e.cached.bytes.clone())?;
        prost::Message::decode(&*bytes).ok()
    }

    /// Whether `name` is known.
    pub(super) fn knows(&self, name: &str) -> bool {
        lock(&self.gateways).contains_key(name)
    }

    /// The names of every known gateway.
    pub(super) fn names(&self) -> Vec<String> {
        lock(&self.gateways).keys().cloned().collect()
    }

    /// Caches `gateway` unless a newer version is cached (a gateway the
    /// store removed is forgotten instead); whether it is news (a version
    /// this process had not seen). For a watch event or the answer to this
    /// process's own write: either may arrive after a newer one.
    pub(super) fn remember(&self, gateway: Gateway) -> bool {
        self.cache(gateway, false)
    }

    /// Caches `gateway` whatever version is cached: the store's word as of
    /// now (a page of a relist, a re-read), as a Kubernetes informer's
    /// Replace. After a restore from a backup the store's versions are
    /// lower than those this process saw; only this brings them in.
    pub(super) fn replace(&self, gateway: Gateway) {
        self.cache(gateway, true);
    }

    fn cache(&self, gateway: Gateway, replace: bool) -> bool {
        let name = name_of(&gateway);
        if is_removed(&gateway) {
            self.forget(&name);
            return true;
        }
        let cached = Cached::of(&gateway);
        let mut gateways = lock(&self.gateways);
        let known = gateways.get(&name).map(|e| e.cached.resource_version);
        let news = known.is_none_or(|rv| rv != cached.resource_version);
        match gateways.get_mut(&name) {
            Some(entry) if replace || entry.cached.resource_version <= cached.resource_version => {
                entry.cached = cached;
            }
            Some(_) => return false,
            None => {
                let entry = Entry {
                    cached,
                    record: None,
                    drift: None,
                    errors: 0,
                    first_seen: Vec::new(),
                    queued_at: None,
                };
                gateways.insert(name, entry);
            }
        }
        news
    }

    /// Forgets `name`: its entry and its place in the queue.
    pub(super) fn forget(&self, name: &str) {
        lock(&self.gateways).remove(name);
        self.queue.forget(name);
    }

    /// Runs `f` on the entry of `name`, if known.
    pub(super) fn with_entry<T>(&self, name: &str, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        lock(&self.gateways).get_mut(name).map(f)
    }

    /// Runs `f` on every entry.
    pub(super) fn each_entry(&self, mut f: impl FnMut(&mut Entry)) {
        lock(&self.gateways).values_mut().for_each(&mut f);
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
