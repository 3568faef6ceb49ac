//! Follows every gateway through a store watch (list-then-watch), to tell
//! when gateways are converged and how long an update took to be observed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gantry_api::v1::{Gateway, Phase};
use gantry_client::watch::{list_then_watch, WatchOptions, WatchUpdate};
use gantry_client::GatewayClient;
use tokio_stream::StreamExt as _;

#[derive(Default)]
struct State {
    /// name → (generation, observed generation, running)
    gateways: HashMap<String, (i64, i64, bool)>,
    /// (name, generation) → when the update was sent.
    waiting: HashMap<(String, i64), Instant>,
    /// Update → observed latencies, in microseconds.
    observed: Vec<u64>,
}

impl State {
    fn seen(&mut self, g: &Gateway) {
        let Some(meta) = &g.metadata else { return };
        let status = g.status.clone().unwrap_or_default();
        let running = status.phase() == Phase::Running;
        self.gateways
            .insert(meta.name.clone(), (meta.generation, status.observed_generation, running));
        let done: Vec<(String, i64)> = self
            .waiting
            .keys()
            .filter(|(n, gen)| *n == meta.name && *gen <= status.observed_generation)
            .cloned()
            .collect();
        for key in done {
            if let Some(sent) = self.waiting.remove(&key) {
                self.observed.push(sent.elapsed().as_micros() as u64);
            }
        }
    }
}

/// Gateways as last seen on a watch of the store.
#[derive(Clone)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Tracker {
    pub fn start(client: GatewayClient) -> Tracker {
        let state = Arc::new(Mutex::new(State::default()));
        let options = WatchOptions { buffer: 65_536, ..WatchOptions::default() };
        let mut updates = list_then_watch(client, options);
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Some(update) = updates.next().await {
                let mut state = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match update {
                    Ok(WatchUpdate::Init { .. }) => state.gateways.clear(),
                    Ok(WatchUpdate::InitPage { gateways, .. }) => {
                        for g in &gateways {
                            state.seen(g);
                        }
                    }
                    Ok(WatchUpdate::Applied { gateway, .. }) => state.seen(&gateway),
                    Ok(WatchUpdate::Deleted { gateway, .. }) => {
                        if let Some(meta) = gateway.metadata {
                            state.gateways.remove(&meta.name);
                        }
                    }
                    Ok(
                        WatchUpdate::Bookmark { .. }
                        | WatchUpdate::InitDone { .. }
                        | WatchUpdate::Interrupted { .. },
                    ) => {}
                    Err(error) => {
                        eprintln!("tracker: the watch of the store ended: {error}");
                        return;
                    }
                }
            }
        });
        Tracker { state, task: Arc::new(task) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Gateways RUNNING with their newest generation observed.
    pub fn converged(&self) -> usize {
        self.lock().gateways.values().filter(|(g, o, running)| *running && g == o).count()
    }

    /// Waits until `count` gateways are converged; false after `limit`.
    pub async fn wait_converged(&self, count: usize, limit: Duration, label: &str) -> bool {
        let started = Instant::now();
        let mut reported = Instant::now();
        loop {
            let converged = self.converged();
            if converged >= count {
                return true;
            }
            if started.elapsed() > limit {
                return false;
            }
            if reported.elapsed() > Duration::from_secs(5) {
                eprintln!("  {label}: {converged}/{count} converged after {:?}", started.elapsed());
                reported = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts timing an update sent at `sent` that made `generation`.
    pub fn expect(&self, name: &str, generation: i64, sent: Instant) {
        let mut state = self.lock();
        let observed = state.gateways.get(name).map_or(0, |(_, o, _)| *o);
        if observed >= generation {
            state.observed.push(sent.elapsed().as_micros() as u64);
        } else {
            state.waiting.insert((name.to_string(), generation), sent);
        }
    }

    /// Updates not observed yet.
    pub fn pending(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Update → observed latencies so far (microseconds).
    pub fn take_observed(&self) -> Vec<u64> {
        std::mem::take(&mut self.lock().observed)
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}
