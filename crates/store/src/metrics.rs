//! Prometheus metrics of the store: per-RPC counts by code and latency.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    level: &'static str,
}

/// Fair queuing by priority level (`grpc::fairness`).
#[derive(Clone, Debug)]
pub struct FairnessMetrics {
    in_flight: Family<LevelLabels, Gauge>,
    queued: Family<LevelLabels, Gauge>,
    rejected: Family<LevelLabels, Counter>,
    early_retries: Family<LevelLabels, Counter>,
    answer_bytes: Family<LevelLabels, Counter>,
    wait: Family<LevelLabels, Histogram, fn() -> Histogram>,
}

impl Default for FairnessMetrics {
    fn default() -> Self {
        Self {
            in_flight: Family::default(),
            queued: Family::default(),
            rejected: Family::default(),
            early_retries: Family::default(),
            answer_bytes: Family::default(),
            wait: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl FairnessMetrics {
    pub fn in_flight(&self, level: &'static str) -> Gauge {
        self.in_flight.get_or_create(&LevelLabels { level }).clone()
    }

    pub fn queued(&self, level: &'static str) -> Gauge {
        self.queued.get_or_create(&LevelLabels { level }).clone()
    }

    pub fn rejected(&self, level: &'static str) -> Counter {
        self.rejected.get_or_create(&LevelLabels { level }).clone()
    }

    pub fn early_retries(&self, level: &'static str) -> Counter {
        self.early_retries.get_or_create(&LevelLabels { level }).clone()
    }

    pub fn answer_bytes(&self, level: &'static str) -> Counter {
        self.answer_bytes.get_or_create(&LevelLabels { level }).clone()
    }

    pub fn wait(&self, level: &'static str) -> Histogram {
        self.wait.get_or_create(&LevelLabels { level }).clone()
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "fairness_in_flight",
            "Calls holding a seat, by priority level",
            self.in_flight.clone(),
        );
        registry.register(
            "fairness_queued",
            "Calls waiting for a seat, by priority level",
            self.queued.clone(),
        );
        registry.register(
            "fairness_rejected",
            "Calls refused RESOURCE_EXHAUSTED (TOO_MANY_REQUESTS), by priority level",
            self.rejected.clone(),
        );
        registry.register(
            "fairness_early_retries",
            "Calls of a refused identity back before its retry delay, held until it ended, by priority level",
            self.early_retries.clone(),
        );
        registry.register(
            "fairness_answer_bytes",
            "Bytes charged to the answers of calls that held a seat (encoded bytes, each object at least 1 KiB), by priority level",
            self.answer_bytes.clone(),
        );
        registry.register(
            "fairness_wait_duration_seconds",
            "How long calls waited for a seat, by priority level",
            self.wait.clone(),
        );
    }
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~52 s: past the default --request-timeout (30 s), so a call
    // that ran into it lands in a finite bucket. Two buckets an octave: a
    // p99 read from them is within a factor of √2, fine enough to tell a
    // latency that doubled under load from one that did not.
    Histogram::new(exponential_buckets(0.000_05, std::f64::consts::SQRT_2, 41))
}

/// The store's metrics and the registry they are exported from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `process_*` and `gantry_build_info`.
    common: gantry_runtime::metrics::Common,
    requests: Family<RpcLabels, Counter>,
    latency: Family<MethodLabels, Histogram, fn() -> Histogram>,
    /// Open watches (WatchGateways streams and the watches of Watch streams).
    pub watch_subscribers: Gauge,
    /// Events held in the watch cache.
    pub watch_cache_events: Gauge,
    /// Encoded bytes of the events held in the watch cache.
    pub watch_cache_bytes: Gauge,
    /// Newest revision published to watchers.
    pub watch_revision: Gauge,
    /// The gRPC listener's connections.
    pub connections: ConnectionMetrics,
    /// Write batches that did not commit (every write in them failed).
    pub write_batches_failed: Counter,
    /// Watchers ended for falling too far behind.
    pub watchers_too_slow: Counter,
    /// Bytes of database pages watches hold (`watch::budget`).
    pub watch_page_bytes: Gauge,
    /// Fair queuing by priority level.
    pub fairness: FairnessMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gantry_store");
        let requests = Family::<RpcLabels, Counter>::default();
        let latency = Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        registry.register(
            "grpc_requests",
            "gRPC requests handled, by method and status code",
            requests.clone(),
        );
        registry.register(
            "grpc_request_duration_seconds",
            "gRPC request latency, by method",
            latency.clone(),
        );
        let (watch_subscribers, watch_cache_events, watch_revision) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        registry.register(
            "watch_subscribers",
            "Open watches (WatchGateways streams and the watches of Watch streams)",
            watch_subscribers.clone(),
        );
        registry.register(
            "watch_cache_events",
            "Events held in the watch cache",
            watch_cache_events.clone(),
        );
        let watch_cache_bytes = Gauge::default();
        registry.register(
            "watch_cache_bytes",
            "Encoded bytes of the events held in the watch cache",
            watch_cache_bytes.clone(),
        );
        registry.register(
            "watch_revision",
            "Newest revision published to watchers",
            watch_revision.clone(),
        );
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        let (write_batches_failed, watchers_too_slow) = (Counter::default(), Counter::default());
        registry.register(
            "write_batches_failed",
            "Write batches that did not commit: every write in them failed (database errors)",
            write_batches_failed.clone(),
        );
        registry.register(
            "watchers_too_slow",
            "Watchers ended RESOURCE_EXHAUSTED (WATCHER_TOO_SLOW) for falling too far behind",
            watchers_too_slow.clone(),
        );
        let watch_page_bytes = Gauge::default();
        registry.register(
            "watch_page_bytes",
            "Bytes of database pages (initial objects, events older than the watch cache) watches hold",
            watch_page_bytes.clone(),
        );
        let fairness = FairnessMetrics::default();
        fairness.register(&mut registry);
        Self {
            watch_page_bytes,
            fairness,
            write_batches_failed,
            watchers_too_slow,
            registry,
            common: gantry_runtime::metrics::Common::new(
                "gateway-store",
                env!("CARGO_PKG_VERSION"),
            ),
            requests,
            latency,
            watch_subscribers,
            watch_cache_events,
            watch_cache_bytes,
            watch_revision,
            connections,
        }
    }
}

pub use gantry_runtime::rpc_span::code_name;

impl Metrics {
    /// Records one finished RPC.
    pub fn observe(&self, method: &str, started: Instant, code: tonic::Code) {
        let code = code_name(code).to_string();
        self.requests.get_or_create(&RpcLabels { method: method.to_string(), code }).inc();
        self.latency
            .get_or_create(&MethodLabels { method: method.to_string() })
            .observe(started.elapsed().as_secs_f64());
    }

    /// The OpenMetrics text exposition (with `process_*` and
    /// `gantry_build_info`).
    pub fn encode(&self) -> String {
        self.common.encode(&self.registry)
    }
}

/// Counters of the listener, exported as metrics.
#[derive(Debug, Clone)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    /// Calls refused for --max-calls-per-connection.
    pub shed: Counter,
    /// How long refusing a call took, from its arrival at the service.
    pub shed_seconds: Histogram,
    /// Closed at accept: over the limit.
    pub refused: Counter,
    /// Closed for sending no request in time.
    pub handshake_timeouts: Counter,
    /// Closed for having no call in flight for the idle timeout.
    pub idle_closed: Counter,
    /// accept() failures (out of file descriptors and others).
    pub accept_errors: Counter,
}

impl ConnectionMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register("grpc_connections", "Open gRPC connections", self.open.clone());
        registry.register(
            "grpc_calls_shed",
            "Calls refused RESOURCE_EXHAUSTED for --max-calls-per-connection",
            self.shed.clone(),
        );
        registry.register(
            "grpc_shed_duration_seconds",
            "How long refusing a call for --max-calls-per-connection took",
            self.shed_seconds.clone(),
        );
        registry.register(
            "grpc_connections_refused",
            "gRPC connections closed at accept because --max-connections were open",
            self.refused.clone(),
        );
        registry.register(
            "grpc_connections_handshake_timeouts",
            "gRPC connections closed for sending no request within --handshake-timeout",
            self.handshake_timeouts.clone(),
        );
        registry.register(
            "grpc_connections_idle_closed",
            "gRPC connections closed after --idle-timeout with no call in flight",
            self.idle_closed.clone(),
        );
        registry.register(
            "grpc_accept_errors",
            "Failed accepts on the gRPC listener (e.g. out of file descriptors)",
            self.accept_errors.clone(),
        );
    }
}

impl Default for ConnectionMetrics {
    fn default() -> Self {
        Self {
            open: Gauge::default(),
            shed: Counter::default(),
            // 1 µs .. ~16 ms
            shed_seconds: Histogram::new(exponential_buckets(0.000_001, 2.0, 15)),
            refused: Counter::default(),
            handshake_timeouts: Counter::default(),
            idle_closed: Counter::default(),
            accept_errors: Counter::default(),
        }
    }
}
