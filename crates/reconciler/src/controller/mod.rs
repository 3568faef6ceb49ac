//! The control loop, in kube-rs' controller-rs shape:
//!
//! - [`State`] (`state`): what this process knows, shared with the HTTP
//!   server (`/readyz`, `/metrics` read only this): one entry per gateway,
//!   the store's sync and watch health, the work queue.
//! - [`Context`] (`context`): what a pass is handed: the store writer, the
//!   target, the settings, the clock; its methods are the pass's IO.
//! - [`reconcile()`] (`reconcile`): one pass, `reconcile(gateway, ctx) ->
//!   Result<Action, ReconcileError>` ([`Action`], [`Outcome`] in `action`);
//!   it gathers the facts and acts on what `plan` (pure, table-tested)
//!   decides.
//! - `runtime`: the watch loops, the workers, the leadership gate; the only
//!   code that runs passes and applies their actions (`error_policy` for
//!   failures).
//!
//! [`Controller`] ties them together for the binary and the tests.

mod action;
mod clock;
mod context;
mod plan;
mod reconcile;
mod runtime;
mod state;

use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use gantry_core::recovery::RecoveryPolicy;

pub use self::action::{Action, Outcome, ReconcileError};
pub use self::context::Context;
pub use self::reconcile::reconcile;
pub use self::state::State;
use crate::metrics::Metrics;
use crate::render::RenderSettings;
use crate::store::GatewayStore;
use crate::targets::Target;

/// The reconciler's finalizer on every gateway it has seen.
pub const FINALIZER: &str = "gantry.dev/reconciler";

pub use gantry_api::RETRY_ANNOTATION;

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
    /// How long a route may wait for a load-balancer address, counted from
    /// when the reconciler first saw it waiting (the route condition's
    /// transition time), before the gateway is DEGRADED.
    pub route_deadline: Duration,
    /// Longest an apply or a cleanup of one gateway may take as a whole.
    pub apply_timeout: Duration,
    /// Roll back every gateway's rollout that exceeds its progress
    /// deadline (otherwise those annotated `gantry.dev/rollback-on-failure`).
    pub rollback_on_failure: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            render: RenderSettings::default(),
            policy: RecoveryPolicy::default(),
            concurrency: 16,
            sync_period: Duration::from_secs(300),
            poll_interval: Duration::from_secs(2),
            route_deadline: Duration::from_secs(600),
            apply_timeout: Duration::from_secs(300),
            rollback_on_failure: false,
        }
    }
}

/// The controller: its shared [`State`] and the [`Context`] of its passes.
#[derive(Debug)]
pub struct Controller {
    state: Arc<State>,
    context: Arc<Context>,
    pub metrics: Arc<Metrics>,
}

impl Controller {
    pub fn new(
        store: Arc<dyn GatewayStore>,
        target: Arc<dyn Target>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let state = Arc::new(State::new(target.clone(), metrics.clone()));
        let context = Arc::new(Context::new(store, target, settings, state.clone()));
        Arc::new(Self { state, context, metrics })
    }

    /// What the HTTP server reads.
    pub fn state(&self) -> Arc<State> {
        self.state.clone()
    }

    /// `Ok` when the store is listed and watched; otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        self.state.readiness()
    }

    /// Whether the first list of the store has been processed.
    pub fn is_synced(&self) -> bool {
        self.state.is_synced()
    }

    /// No pass running or due now: what a test waits for before it asserts
    /// that nothing more happens.
    pub fn is_idle(&self) -> bool {
        self.state.is_idle()
    }

    /// Refreshes the gauges read at scrape time.
    pub fn update_gauges(&self) {
        self.state.update_gauges();
    }

    /// The cached gateway.
    pub fn cached(&self, name: &str) -> Option<Gateway> {
        self.state.cached(name)
    }

    /// One pass over `gateway` (see [`reconcile()`]).
    pub async fn reconcile(&self, gateway: Gateway) -> Result<Action, ReconcileError> {
        reconcile(gateway, &self.context).await
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
        runtime::run(self.context.clone(), leading, shutdown).await;
    }
}

#[cfg(test)]
mod tests;
