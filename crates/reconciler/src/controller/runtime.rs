//! The runtime: the only code that runs passes and applies their
//! [`Action`]. It owns the watch loops (the store, the target's owned
//! objects), the periodic resync, the workers and the leadership gate.
//!
//! ```text
//! store watch (list-then-watch, restarted) ─┐
//! owned-object watches ─────────────────────┼─► work queue ─► workers
//! periodic resync (jittered) ───────────────┘        ▲           │
//!                                                    │   reconcile(gateway, ctx)
//!                                                    └── Action / ReconcileError
//! ```

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use gantry_client::watch::WatchUpdate;
use gantry_core::retry::Backoff;
use tokio::sync::watch;
use tokio::time::Instant;

use super::action::{Action, ReconcileError};
use super::context::Context;
use super::reconcile::reconcile;
use super::state::{name_of, State};

/// Runs until `shutdown`, passes only while `leading` is true (leader
/// election): losing it cancels the passes in flight. Followers keep their
/// cache warm; a new leader drops what it held in memory (the status the
/// previous leader wrote is the truth) and re-checks every gateway.
pub(super) async fn run(
    ctx: Arc<Context>,
    leading: watch::Receiver<bool>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let state = ctx.state.clone();
    let mut tasks = vec![
        tokio::spawn(follow_leadership(state.clone(), leading.clone())),
        tokio::spawn(watch_store(ctx.clone())),
        tokio::spawn(resync(state.clone(), ctx.settings.sync_period)),
    ];
    if let Some(mut owned) = ctx.target.watch_owned() {
        let state = state.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(name) = owned.next().await {
                if state.knows(&name) {
                    state.queue.add(&name);
                }
            }
        }));
    }
    // One wait for the target's watches, shared by every worker.
    let (listed, watches_listed) = watch::channel(false);
    let gate = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            wait_for_target_watches(&ctx).await;
            let _ = listed.send(true);
        })
    };
    let workers: Vec<_> = (0..ctx.settings.concurrency.max(1))
        .map(|_| tokio::spawn(work(ctx.clone(), leading.clone(), watches_listed.clone())))
        .collect();
    shutdown.await;
    tracing::info!("shutting down: finishing in-flight reconciles");
    state.queue.close();
    // Workers still waiting for the watches stop too.
    gate.abort();
    for worker in workers {
        let _ = worker.await;
    }
    for task in tasks {
        task.abort();
    }
}

/// Keeps the leader gauge; a replica that becomes leader drops the
/// failure records it held and re-checks every gateway.
async fn follow_leadership(state: Arc<State>, mut leading: watch::Receiver<bool>) {
    state.metrics.leader.set(i64::from(*leading.borrow()));
    while leading.changed().await.is_ok() {
        let now_leading = *leading.borrow_and_update();
        state.metrics.leader.set(i64::from(now_leading));
        if now_leading {
            state.each_entry(|e| {
                e.record = None;
                e.drift = None;
            });
            requeue_all(&state);
        }
    }
}

fn requeue_all(state: &State) {
    for name in state.names() {
        state.queue.add(&name);
    }
}

/// One worker: takes names while leading; a pass in flight when leadership
/// is lost is cancelled (the next leader repairs a partial apply).
async fn work(
    ctx: Arc<Context>,
    mut leading: watch::Receiver<bool>,
    mut watches_listed: watch::Receiver<bool>,
) {
    if watches_listed.wait_for(|listed| *listed).await.is_err() {
        return;
    }
    let queue = &ctx.state.queue;
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        let next = tokio::select! {
            next = queue.next() => next,
            lost = leading.wait_for(|l| !*l) => match lost {
                Ok(_) => continue,
                Err(_) => return,
            },
        };
        let Some(name) = next else { return };
        tokio::select! {
            () = run_pass(&ctx, &name) => {}
            lost = leading.wait_for(|l| !*l) => {
                tracing::warn!(gateway = name, "leadership lost: pass cancelled");
                queue.done(&name);
                if lost.is_err() {
                    return;
                }
                continue;
            }
        }
        queue.done(&name);
    }
}

/// Waits until the target's watches have listed, as an informer-based
/// controller waits for its caches: a pass before that would judge every
/// converged gateway as waiting for them (and write that to its status).
/// Says which watches it waits for, every half minute. Workers start after
/// it; a shutdown meanwhile does not wait for it.
async fn wait_for_target_watches(ctx: &Context) {
    let started = Instant::now();
    let mut told = started;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        let unsynced = ctx.target.unsynced();
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
async fn run_pass(ctx: &Context, name: &str) {
    let state = &ctx.state;
    if let Some(queued) = state.with_entry(name, |e| e.queued_at.take()).flatten() {
        state.metrics.stage("queue", queued);
    }
    let Some(gateway) = state.cached(name) else { return };
    let started = std::time::Instant::now();
    let generation = gateway.metadata.as_ref().map_or(0, |m| m.generation);
    let span = tracing::info_span!("reconcile", gateway = name, generation);
    // The pass for a new generation continues the trace of the write that
    // made it (the store recorded its traceparent).
    let observed = gateway.status.as_ref().map_or(0, |s| s.observed_generation);
    let trace =
        gateway.metadata.as_ref().and_then(|m| m.annotations.get(gantry_api::TRACE_ANNOTATION));
    if let (true, Some(traceparent)) = (observed != generation, trace) {
        gantry_runtime::set_parent(&span, gantry_runtime::from_traceparent(traceparent));
    }
    let result = tracing::Instrument::instrument(reconcile(gateway, ctx), span).await;
    state.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    match result {
        Ok(action) => on_action(ctx, name, action),
        Err(e) => error_policy(ctx, name, &e),
    }
}

/// Applies what a finished pass asks for.
fn on_action(ctx: &Context, name: &str, action: Action) {
    let state = &ctx.state;
    state.with_entry(name, |e| e.errors = 0);
    state.metrics.outcome(action.outcome.as_str());
    if let Some(delay) = action.requeue_after {
        state.queue.add_after(name, delay);
    }
}

/// A pass that could not finish: a conflict runs again at once, anything
/// else after a backoff that grows with consecutive failures.
fn error_policy(ctx: &Context, name: &str, error: &ReconcileError) {
    let state = &ctx.state;
    state.metrics.outcome(error.metric_label());
    if matches!(error, ReconcileError::Conflict) {
        state.queue.add(name);
        return;
    }
    let attempt = state
        .with_entry(name, |e| {
            e.errors = e.errors.saturating_add(1);
            e.errors - 1
        })
        .unwrap_or(0);
    let settings = &ctx.settings;
    let backoff = Backoff {
        initial: settings.policy.backoff.initial,
        max: settings.poll_interval.max(settings.policy.backoff.max),
        jitter: 0.5,
    };
    let delay = backoff.delay(attempt, fastrand::f64());
    tracing::warn!(gateway = name, error = %error, retry_in = ?delay, "reconcile failed");
    state.queue.add_after(name, delay);
}

/// Keeps the store watch running: a refused or ended watch is started
/// again after a backoff (the token file is read again by the client), and
/// `/readyz` reports it down meanwhile.
async fn watch_store(ctx: Arc<Context>) {
    let state = &ctx.state;
    let backoff =
        Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30), jitter: 0.5 };
    let mut failures = 0u32;
    let mut listing = Listing::default();
    loop {
        let mut updates = ctx.store.watch();
        let reason = loop {
            match updates.next().await {
                // The watch loop retries by itself; until it is back, readyz
                // says why and each attempt is logged.
                Some(Ok(WatchUpdate::Interrupted { code, message, retry_in, .. })) => {
                    let reason = format!("{code:?}: {message}");
                    tracing::warn!(reason, ?retry_in, "cannot watch gateway-store; retrying (check --store, that the store runs, and the network between them)");
                    state.set_watch_down(Some(reason));
                }
                Some(Ok(update)) => {
                    failures = 0;
                    if state.set_watch_down(None).is_some() {
                        tracing::info!("the watch of gateway-store is back");
                    }
                    on_update(state, &mut listing, update);
                }
                Some(Err(e)) => break e.to_string(),
                None => break "the watch ended".to_string(),
            }
        };
        let delay = backoff.delay(failures, fastrand::f64());
        failures = failures.saturating_add(1);
        tracing::error!(reason, retry_in = ?delay, "the store watch is down; check the reconciler's token file and role");
        state.set_watch_down(Some(reason));
        tokio::time::sleep(delay).await;
    }
}

/// What the store watch has delivered: the newest revision, and the names
/// of the list in progress (page by page).
#[derive(Debug, Default)]
struct Listing {
    newest: i64,
    names: Option<HashSet<String>>,
}

/// One update of the store watch. A relist replaces what was cached (as a
/// Kubernetes informer's Replace): a relist at a revision older than one
/// already seen is a store restored from a backup, and the restored state
/// is the truth.
fn on_update(state: &State, listing: &mut Listing, update: WatchUpdate) {
    let revision = update.revision();
    match update {
        WatchUpdate::Init { revision } => {
            if revision < listing.newest {
                tracing::warn!(
                    revision,
                    seen = listing.newest,
                    "the store's revision went back: it was restored from a backup; converging on the restored gateways (writes made after the backup are gone)"
                );
            }
            listing.names = Some(HashSet::new());
            // Where the history is now, even if that is backwards.
            listing.newest = revision;
            return;
        }
        // Handled by the watch loop (`watch_store`).
        WatchUpdate::Interrupted { .. } => return,
        WatchUpdate::InitPage { gateways, .. } => {
            // Each page is cached and queued as it comes: only the names of
            // the whole list are held until it is done.
            let names = listing.names.get_or_insert_default();
            for g in gateways {
                let name = name_of(&g);
                state.replace(g);
                state.queue.add(&name);
                names.insert(name);
            }
        }
        WatchUpdate::InitDone { revision } => {
            let names = listing.names.take().unwrap_or_default();
            for name in state.names() {
                if !names.contains(&name) {
                    state.forget(&name);
                }
            }
            state.set_synced();
            tracing::info!(gateways = names.len(), revision, "listed gateways");
        }
        WatchUpdate::Applied { gateway, .. } => {
            let name = name_of(&gateway);
            // The echo of this process's own write (its answer is cached
            // already) tells the pass that wrote it nothing new: queueing
            // it would run a pass per write for nothing (a third of the
            // passes of a fleet's first converge).
            if state.remember(gateway) {
                state.with_entry(&name, |e| {
                    e.queued_at.get_or_insert_with(std::time::Instant::now);
                });
                state.queue.add(&name);
            }
        }
        WatchUpdate::Deleted { gateway, .. } => state.forget(&name_of(&gateway)),
        WatchUpdate::Bookmark { .. } => {}
    }
    listing.newest = listing.newest.max(revision);
}

/// Queues every gateway about every `period` (jittered).
async fn resync(state: Arc<State>, period: Duration) {
    loop {
        let jitter = 0.9 + fastrand::f64() * 0.2;
        tokio::time::sleep(period.mul_f64(jitter)).await;
        requeue_all(&state);
    }
}
