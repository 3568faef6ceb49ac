//! Prometheus metrics of the reconciler.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

/// The reconciler's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `process_*` and `gantry_build_info`.
    common: gantry_runtime::metrics::Common,
    /// Reconcile passes by outcome: a finished pass's
    /// `controller::Outcome::as_str()` (applied, observed, unchanged,
    /// waiting, failed, deleting, deleted) or a failed pass's
    /// `ReconcileError::metric_label()` (status_conflict, store_error,
    /// observe_error, cleanup_error, not_leader).
    pub reconciles: Family<OutcomeLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub queue_depth: Gauge,
    pub gateways: Family<PhaseLabels, Gauge>,
    /// From first seeing a generation to reporting it observed.
    pub convergence: Histogram,
    /// Time per stage of a change's way to observed: `queue` (store event
    /// to pass start), `apply`, `observe`, `status_write`.
    pub stages: Family<StageLabels, Histogram, fn() -> Histogram>,
    /// 1 while this replica leads (always 1 without leader election).
    pub leader: Gauge,
    /// 1 while the watch of gateway-store is up and has listed.
    pub store_watch_up: Gauge,
}

fn stage_histogram() -> Histogram {
    // 100 µs .. ~52 s: past the store's 10 s and the default 15 s call
    // timeout.
    Histogram::new(exponential_buckets(0.000_1, 2.0, 20))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gantry_reconciler");
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        // 0.5 ms .. ~17 min: past the default --apply-timeout (5 m).
        let reconcile_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 22));
        let queue_depth = Gauge::default();
        let gateways = Family::<PhaseLabels, Gauge>::default();
        let convergence = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register("reconciles", "Reconcile passes by outcome", reconciles.clone());
        registry.register(
            "reconcile_duration_seconds",
            "Duration of a reconcile pass",
            reconcile_duration.clone(),
        );
        registry.register("queue_depth", "Gateways waiting in the work queue", queue_depth.clone());
        registry.register("gateways", "Known gateways by phase", gateways.clone());
        registry.register(
            "convergence_seconds",
            "From a new generation to observed_generation",
            convergence.clone(),
        );
        let stages = Family::<StageLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            stage_histogram,
        );
        registry.register(
            "stage_duration_seconds",
            "Time per stage of convergence: queue (store event to pass start), apply, observe, status_write",
            stages.clone(),
        );
        let (leader, store_watch_up) = (Gauge::default(), Gauge::default());
        registry.register("leader", "1 while this replica leads and reconciles", leader.clone());
        registry.register(
            "store_watch_up",
            "1 while the watch of gateway-store is up and has listed; 0 while it is down or listing",
            store_watch_up.clone(),
        );
        Self {
            leader,
            store_watch_up,
            registry,
            common: gantry_runtime::metrics::Common::new(
                "gateway-reconciler",
                env!("CARGO_PKG_VERSION"),
            ),
            reconciles,
            reconcile_duration,
            queue_depth,
            gateways,
            convergence,
            stages,
        }
    }
}

impl Metrics {
    pub fn outcome(&self, outcome: &str) {
        self.reconciles.get_or_create(&OutcomeLabels { outcome: outcome.to_string() }).inc();
    }

    /// Records the time spent in one stage since `started`.
    pub fn stage(&self, stage: &str, started: std::time::Instant) {
        self.stages
            .get_or_create(&StageLabels { stage: stage.to_string() })
            .observe(started.elapsed().as_secs_f64());
    }

    /// The OpenMetrics text exposition (with `process_*` and
    /// `gantry_build_info`).
    pub fn encode(&self) -> String {
        self.common.encode(&self.registry)
    }
}
