//! `gantry-bench`: starts what a scenario needs (gateway-store on SQLite or
//! PostgreSQL, gateway-reconciler, kube-fake) on free ports, runs it for a
//! bounded time, and prints one JSON object per measurement: inputs,
//! throughput, latency percentiles and each process's RSS and CPU. Progress
//! goes to stderr. Timings are measured here, never asserted by tests.

mod etcd;
mod procs;
mod report;
mod tracker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use gantry_api::v1::{
    CreateGatewayRequest, Gateway, GatewaySpec, GetGatewayRequest, ListGatewaysRequest, ObjectMeta,
    UpdateGatewayRequest, WatchGatewaysRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use procs::{Etcd, Reconciler, Store, Usage};
use tracker::Tracker;

/// kube-fake runs in this process and holds every object of a scale run
/// (gigabytes of small JSON values); glibc's malloc spent over half of its
/// CPU in `_int_malloc` listing 100,000 gateways' objects.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Benchmark scenarios for gantry.
#[derive(Parser, Debug)]
#[command(name = "gantry-bench", version, about)]
pub struct Args {
    /// Small sizes and short runs (a smoke check, under three minutes).
    #[arg(long, global = true, env = "GANTRY_BENCH_QUICK")]
    quick: bool,
    /// Store backend.
    #[arg(long, global = true, env = "GANTRY_BENCH_BACKEND", value_enum, default_value_t = Backend::Sqlite)]
    backend: Backend,
    /// PostgreSQL server for --backend postgres (a fresh database is made).
    #[arg(
        long,
        global = true,
        env = "GANTRY_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres_url: String,
    /// Also append the results (a section with the command, commit, machine
    /// and tables) to this Markdown file, and write latency plots as SVG
    /// files next to it.
    #[arg(long, global = true, env = "GANTRY_BENCH_APPEND")]
    append: Option<PathBuf>,
    /// Gateways of the `scale` scenario (default 100,000; 1,000 with
    /// --quick), e.g. a smaller fleet to profile.
    #[arg(long, global = true, env = "GANTRY_BENCH_GATEWAYS")]
    gateways: Option<usize>,
    /// The reconciler's --poll-interval (re-check of a rollout in progress;
    /// its watches of the owned objects re-check on every change anyway).
    #[arg(long, global = true, env = "GANTRY_BENCH_POLL_INTERVAL", default_value = "2s")]
    poll_interval: String,
    /// The cluster of the reconciler's scenarios (converge, scale, idle).
    #[arg(long, global = true, env = "GANTRY_BENCH_CLUSTER", value_enum, default_value_t = ClusterKind::Fake)]
    cluster: ClusterKind,
    /// etcd binary for `versus` (Debian's etcd-server installs `etcd`).
    #[arg(long, global = true, env = "GANTRY_BENCH_ETCD_BIN", default_value = "etcd")]
    etcd_bin: PathBuf,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// Concurrent clients doing spec updates (durable acknowledgements).
    Write,
    /// GetGateway round trips, one at a time, for gateways of several sizes
    /// (a reply of several KB must not wait on Nagle's algorithm).
    Read,
    /// Watchers on their own connections or sharing one, while a writer
    /// changes a gateway back to back or at a fixed rate.
    Watch,
    /// Update → observed latency at a fixed update rate, and N gateways
    /// created at once until all RUNNING (reconciler + kube-fake).
    Converge,
    /// Many gateways: store RSS, full pagination, reconciler cold start and
    /// RSS, cluster writes during a no-drift resync.
    Scale,
    /// Converged gateways left alone: CPU, cluster requests, store requests.
    Idle,
    /// The write and watch work run against etcd and gantry in turn, in
    /// one run: each side's numbers and gantry's ratio to etcd.
    Versus,
    /// Every scenario.
    All,
}

fn gateway(name: &str, image: &str, config: &[(&str, String)]) -> Gateway {
    Gateway {
        metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
        spec: Some(GatewaySpec {
            image: image.into(),
            config: config.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            ..Default::default()
        }),
        status: None,
    }
}

async fn update_spec(client: &mut GatewayClient, g: Gateway) -> Result<Gateway, tonic::Status> {
    let mask = Some(prost_types::FieldMask { paths: vec!["spec".into()] });
    client
        .update_gateway(UpdateGatewayRequest {
            gateway: Some(g),
            update_mask: mask,
            validate_only: false,
        })
        .await
        .map(|r| r.into_inner())
}

/// p50/p90/p99/max in microseconds.
fn percentiles(mut micros: Vec<u64>) -> Value {
    if micros.is_empty() {
        return json!(null);
    }
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() as f64 - 1.0) * q).round() as usize];
    json!({"p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99), "max_us": micros[micros.len() - 1], "samples": micros.len()})
}

/// Creates `count` gateways named `{prefix}-{i:06}` from 64 concurrent
/// clients, labelled `team=t{i % 10}`.
async fn create_gateways(store: &Store, prefix: &str, count: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (mut client, next, prefix) = (store.client()?, next.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= count {
                    return Ok::<(), tonic::Status>(());
                }
                let mut g = gateway(&format!("{prefix}-{i:06}"), "ghcr.io/acme/gateway:1.0", &[]);
                g.metadata.as_mut().map(|m| m.labels.insert("team".into(), format!("t{}", i % 10)));
                client
                    .create_gateway(CreateGatewayRequest { gateway: Some(g), validate_only: false })
                    .await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

/// One client reading one gateway of `config_bytes` of config back to back.
async fn read(args: &Args, config_bytes: usize, samples: usize) -> anyhow::Result<Value> {
    let store = Store::start(args, 4096).await?;
    let mut client = store.client()?;
    let config = [("blob", "x".repeat(config_bytes))];
    let stored = client
        .create_gateway(CreateGatewayRequest {
            gateway: Some(gateway("r", "gw:1", &config)),
            validate_only: false,
        })
        .await?
        .into_inner();
    let size = prost::Message::encoded_len(&stored);
    eprintln!("read: {samples} GetGateway of a {size}-byte gateway on {}", args.backend.name());
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        client.get_gateway(GetGatewayRequest { name: "r".into() }).await?;
        latencies.push(started.elapsed().as_micros() as u64);
    }
    let result = json!({
        "scenario": "read", "backend": args.backend.name(), "gateway_bytes": size,
        "latency": percentiles(latencies),
    });
    store.stop().await;
    Ok(result)
}

/// Which server a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    /// gateway-store on `--backend`.
    Gantry,
    /// etcd, on the same client work.
    Etcd,
}

/// etcd values in the side-by-side runs: about the size of a small
/// gateway as the store keeps it.
const ETCD_VALUE_BYTES: usize = 600;

/// A running server of either kind.
enum Server {
    Gantry(Store),
    Etcd(Etcd),
}

/// One connection to a [`Server`].
#[derive(Clone)]
enum Connection {
    Gantry(GatewayClient),
    Etcd { channel: tonic::transport::Channel, kv: etcd::Kv },
}

type Stamps = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Vec<u64>> + Send>>;

impl Server {
    async fn start(args: &Args, system: System, watch_buffer: usize) -> anyhow::Result<Server> {
        Ok(match system {
            System::Gantry => Server::Gantry(Store::start(args, watch_buffer).await?),
            System::Etcd => Server::Etcd(Etcd::start(args).await?),
        })
    }

    fn name(&self, args: &Args) -> &'static str {
        match self {
            Server::Gantry(_) => args.backend.name(),
            Server::Etcd(_) => "etcd",
        }
    }

    fn usage(&self) -> Usage {
        match self {
            Server::Gantry(s) => s.usage(),
            Server::Etcd(e) => e.usage(),
        }
    }

    /// A new connection (HTTP/2, shared by the calls made on clones).
    async fn connect(&self) -> anyhow::Result<Connection> {
        Ok(match self {
            Server::Gantry(s) => Connection::Gantry(
                gantry_client::connect(&ClientConfig {
                    endpoint: s.endpoint.clone(),
                    ..Default::default()
                })
                .await?,
            ),
            Server::Etcd(e) => {
                let channel = e.channel().await?;
                Connection::Etcd { kv: etcd::Kv::new(channel.clone()), channel }
            }
        })
    }

    /// Makes `key` exist, so that writes are updates.
    async fn create(&self, key: &str) -> anyhow::Result<()> {
        if let Server::Gantry(s) = self {
            s.client()?
                .create_gateway(CreateGatewayRequest {
                    gateway: Some(gateway(key, "gw:0", &[])),
                    validate_only: false,
                })
                .await?;
        }
        Ok(())
    }

    async fn stop(self) {
        match self {
            Server::Gantry(s) => s.stop().await,
            Server::Etcd(e) => e.stop(),
        }
    }
}

impl Connection {
    /// A durable write of `key`, its `i`th version, carrying `stamp` (the
    /// sender's clock) for watchers: UpdateGateway of a small spec, or an
    /// etcd Put of [`ETCD_VALUE_BYTES`].
    async fn write(&mut self, key: &str, i: u64, stamp: Option<u64>) -> anyhow::Result<()> {
        match self {
            Connection::Gantry(client) => {
                let config: Vec<(&str, String)> =
                    stamp.map(|t| ("t", t.to_string())).into_iter().collect();
                update_spec(client, gateway(key, &format!("gw:{i}"), &config)).await?;
            }
            Connection::Etcd { kv, .. } => {
                etcd::put(kv, key, &etcd::stamped_value(stamp.unwrap_or(i), ETCD_VALUE_BYTES))
                    .await?;
            }
        }
        Ok(())
    }

    /// A watch stream from now on (gantry: every gateway; etcd: `key`),
    /// yielding the stamps of the events of each message received.
    async fn watch(&self, key: &str) -> anyhow::Result<Stamps> {
        Ok(match self {
            Connection::Gantry(client) => {
                let stream = client
                    .clone()
                    .watch_gateways(WatchGatewaysRequest::default())
                    .await?
                    .into_inner();
                Box::pin(stream.map_while(Result::ok).map(|e| {
                    e.gateway
                        .and_then(|g| g.spec?.config.get("t")?.parse().ok())
                        .into_iter()
                        .collect()
                }))
            }
            Connection::Etcd { channel, .. } => Box::pin(etcd::watch(channel.clone(), key).await?),
        })
    }
}

async fn write(
    args: &Args,
    system: System,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Value> {
    let server = Server::start(args, system, 4096).await?;
    let backend = server.name(args);
    eprintln!("write: {clients} clients for {duration:?} on {backend}");
    for c in 0..clients {
        server.create(&format!("w{c}")).await?;
    }
    let before = server.usage();
    let mut connections = Vec::with_capacity(clients);
    for _ in 0..clients {
        connections.push(server.connect().await?);
    }
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (c, mut connection) in connections.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (key, mut latencies) = (format!("w{c}"), Vec::new());
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let started = Instant::now();
                if connection.write(&key, i, None).await.is_ok() {
                    latencies.push(started.elapsed().as_micros() as u64);
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    let ops = all.len();
    let result = json!({
        "scenario": "write", "backend": backend, "clients": clients,
        "duration_s": duration.as_secs_f64(), "acknowledged_writes": ops,
        "writes_per_s": (ops as f64 / duration.as_secs_f64()).round(),
        "latency": percentiles(all), "store": server.usage().since(before),
    });
    server.stop().await;
    Ok(result)
}

/// How the watch writer paces its writes.
#[derive(Clone, Copy, Debug)]
enum Pace {
    BackToBack,
    PerSecond(u32),
}

/// `watchers` watch streams spread over `connections` connections while
/// one writer changes one key (`pace`) for `duration`.
async fn watch(
    args: &Args,
    system: System,
    watchers: usize,
    connections: usize,
    pace: Pace,
    duration: Duration,
) -> anyhow::Result<Value> {
    let server = Server::start(args, system, 65_536).await?;
    let backend = server.name(args);
    let connections = connections.clamp(1, watchers.max(1));
    eprintln!(
        "watch: {watchers} watchers on {connections} connection(s), writes {pace:?}, for {duration:?} on {backend}"
    );
    server.create("hot").await?;
    let mut writer = server.connect().await?;
    let rss_before = server.usage().rss_kib;
    let epoch = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut shared = Vec::with_capacity(connections);
    for _ in 0..connections {
        shared.push(server.connect().await?);
    }
    let mut tasks = Vec::new();
    for w in 0..watchers {
        let mut stream = shared[w % connections].watch("hot").await?;
        let (received, stop) = (received.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                tokio::select! {
                    () = stop.notified() => break,
                    event = stream.next() => match event {
                        Some(stamps) => {
                            let now = epoch.elapsed().as_micros() as u64;
                            for sent in &stamps {
                                latencies.push(now.saturating_sub(*sent));
                            }
                            received.fetch_add(stamps.len() as u64, Ordering::Relaxed);
                        }
                        None => break,
                    },
                }
            }
            latencies
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let watching = server.usage();
    let received_before = received.load(Ordering::Relaxed);
    let deadline = Instant::now() + duration;
    let mut writes = 0u64;
    let mut ticks = match pace {
        Pace::PerSecond(rate) => {
            Some(tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1)))))
        }
        Pace::BackToBack => None,
    };
    while Instant::now() < deadline {
        if let Some(ticks) = ticks.as_mut() {
            ticks.tick().await;
        }
        writer.write("hot", writes, Some(epoch.elapsed().as_micros() as u64)).await?;
        writes += 1;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = server.usage();
    stop.notify_waiters();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    let delivered = received.load(Ordering::Relaxed) - received_before;
    let expected = writes * watchers as u64;
    let per_watcher = watching.rss_kib.saturating_sub(rss_before) as f64 / watchers.max(1) as f64;
    let pace_json = match pace {
        Pace::BackToBack => json!("back-to-back"),
        Pace::PerSecond(r) => json!(r),
    };
    let result = json!({
        "scenario": "watch", "backend": backend, "watchers": watchers, "connections": connections,
        "writes_per_s_target": pace_json, "duration_s": duration.as_secs_f64(), "writes": writes,
        "delivered_events": delivered, "undelivered_events": expected.saturating_sub(delivered),
        "delivered_per_s": (delivered as f64 / duration.as_secs_f64()).round(),
        "write_to_receive": percentiles(all),
        "store_rss_per_watcher_kib": (per_watcher * 10.0).round() / 10.0, "store": after.since(watching),
    });
    server.stop().await;
    Ok(result)
}

/// One row comparing gantry's result `g` with etcd's `e` on the same work:
/// throughput (`rate` field), its ratio, and latency (`latency` field).
fn versus_row(case: &str, load: Value, g: &Value, e: &Value, rate: &str, latency: &str) -> Value {
    let ms = |r: &Value, q: &str| r[latency][q].as_f64().map(|us| (us / 10.0).round() / 100.0);
    let (gr, er) = (g[rate].as_f64().unwrap_or(0.0), e[rate].as_f64().unwrap_or(0.0));
    json!({
        "scenario": "versus", "case": case, "load": load, "backend": g["backend"],
        "gantry_per_s": gr, "etcd_per_s": er,
        "ratio": if er > 0.0 { (gr / er * 100.0).round() / 100.0 } else { 0.0 },
        "gantry_p50_ms": ms(g, "p50_us"), "etcd_p50_ms": ms(e, "p50_us"),
        "gantry_p99_ms": ms(g, "p99_us"), "etcd_p99_ms": ms(e, "p99_us"),
        "gantry_rss_per_watcher_kib": g.get("store_rss_per_watcher_kib"),
        "etcd_rss_per_watcher_kib": e.get("store_rss_per_watcher_kib"),
    })
}

/// The cluster a scenario's reconciler applies to.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterKind {
    /// kube-fake in this process, rollouts done at once.
    Fake,
    /// A real control plane (kube-apiserver, etcd, kube-controller-manager,
    /// kube-scheduler, kwok) built by `tests/k8s/setup.sh k8s`; the
    /// reconciler runs as deploy/'s identity in a namespace of its own.
    Real,
}

enum Cluster {
    Fake(gantry_kube_fake::KubeFake, tempfile_path::TempPath),
    Real {
        plane: Box<gantry_testkit::k8s::ControlPlane>,
        namespace: String,
        /// Audit events already counted.
        counted: usize,
    },
}

fn cluster_name(args: &Args) -> &'static str {
    match args.cluster {
        ClusterKind::Fake => "kube-fake",
        ClusterKind::Real => "real",
    }
}

/// gateway-store, a cluster (kube-fake, or a real control plane), and a
/// gateway-reconciler process between them.
struct Pair {
    store: Store,
    cluster: Cluster,
    reconciler: Option<Reconciler>,
    poll_interval: String,
}

mod tempfile_path {
    /// A file removed when dropped.
    pub struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Pair {
    async fn start(args: &Args) -> anyhow::Result<Pair> {
        let store = Store::start(args, 4096).await?;
        let cluster = match args.cluster {
            ClusterKind::Fake => {
                let kube = gantry_kube_fake::KubeFake::start_with(gantry_kube_fake::Options {
                    rollout_delay: Duration::ZERO,
                    ..Default::default()
                })
                .await?;
                let path = std::env::temp_dir()
                    .join(format!("gantry-bench-kubeconfig-{}", uuid::Uuid::new_v4().simple()));
                std::fs::write(&path, kube.kubeconfig())?;
                Cluster::Fake(kube, tempfile_path::TempPath(path))
            }
            ClusterKind::Real => {
                let bin = gantry_testkit::k8s::bin_dir().ok_or_else(|| {
                    anyhow::anyhow!("no Kubernetes binaries: run tests/k8s/setup.sh k8s")
                })?;
                eprintln!("starting a control plane from {}", bin.display());
                let plane = tokio::task::spawn_blocking(move || {
                    let plane = gantry_testkit::k8s::ControlPlane::start(&bin);
                    let namespace = plane.namespace("bench");
                    (plane, namespace)
                })
                .await?;
                Cluster::Real { plane: Box::new(plane.0), namespace: plane.1, counted: 0 }
            }
        };
        Ok(Pair { store, cluster, reconciler: None, poll_interval: args.poll_interval.clone() })
    }

    async fn start_reconciler(&mut self, sync_period: Duration) -> anyhow::Result<&Reconciler> {
        let (kubeconfig, namespace) = match &self.cluster {
            Cluster::Fake(_, path) => (path.0.as_path(), None),
            Cluster::Real { plane, namespace, .. } => {
                (plane.reconciler_kubeconfig.as_path(), Some(namespace.as_str()))
            }
        };
        let reconciler =
            Reconciler::start(&self.store, kubeconfig, namespace, sync_period, &self.poll_interval)
                .await?;
        Ok(self.reconciler.insert(reconciler))
    }

    fn reconciler(&self) -> anyhow::Result<&Reconciler> {
        self.reconciler.as_ref().ok_or_else(|| anyhow::anyhow!("the reconciler is not running"))
    }

    /// The reconciler's cluster requests since the last call: (all,
    /// writes). On a real cluster, read from the API server's audit log.
    fn take_kube_requests(&mut self) -> (usize, usize) {
        match &mut self.cluster {
            Cluster::Fake(kube, _) => {
                let requests = kube.requests();
                kube.clear_requests();
                (requests.len(), requests.iter().filter(|r| r.is_write()).count())
            }
            Cluster::Real { plane, counted, .. } => {
                let events = plane.audit_events();
                let ours: Vec<&Value> = events[(*counted).min(events.len())..]
                    .iter()
                    .filter(|e| e["user"]["username"] == gantry_testkit::k8s::RECONCILER_USER)
                    .collect();
                *counted = events.len();
                let writes = ours
                    .iter()
                    .filter(|e| {
                        matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete"))
                    })
                    .count();
                (ours.len(), writes)
            }
        }
    }

    async fn stop(mut self) {
        if let Some(r) = self.reconciler.take() {
            r.stop();
        }
        match self.cluster {
            Cluster::Fake(kube, _) => kube.stop().await,
            Cluster::Real { plane, .. } => {
                drop(tokio::task::spawn_blocking(move || drop(plane)).await)
            }
        }
        self.store.stop().await;
    }
}

/// Waits until `pair`'s reconciler has made `count` passes since it
/// started; false after `limit`.
async fn wait_reconciles(pair: &Pair, count: u64, limit: Duration) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut reported = Instant::now();
    loop {
        let done = pair.reconciler()?.reconciles().await?;
        if done >= count {
            return Ok(true);
        }
        if started.elapsed() > limit {
            return Ok(false);
        }
        if reported.elapsed() > Duration::from_secs(5) {
            eprintln!("  {done}/{count} reconcile passes after {:?}", started.elapsed());
            reported = Instant::now();
        }
        // A scrape recounts every gateway's phase: scraping every 20 ms
        // (as the first version did) cost the reconciler 15% of its CPU
        // at 100,000 gateways. Prometheus scrapes every 15 s or so.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// First the update → observed latency at `rate` updates/s over 10
/// gateways, then each burst: that many gateways created at once, timed
/// until all are RUNNING.
async fn converge(
    args: &Args,
    bursts: &[usize],
    rate: u32,
    rate_duration: Duration,
) -> anyhow::Result<Vec<Value>> {
    let mut pair = Pair::start(args).await?;
    pair.start_reconciler(Duration::from_secs(300)).await?;
    let tracker = Tracker::start(pair.store.client()?);
    let mut results = Vec::new();

    eprintln!("converge: {rate} updates/s for {rate_duration:?} over 10 gateways");
    create_gateways(&pair.store, "steady", 10).await?;
    anyhow::ensure!(
        tracker.wait_converged(10, Duration::from_secs(60), "steady").await,
        "10 gateways did not converge"
    );
    let (store_before, reconciler_before) = (pair.store.usage(), pair.reconciler()?.usage());
    let stages_before = pair.reconciler()?.stages().await?;
    pair.take_kube_requests();
    // Clients share a few connections, as real ones do (the store bounds
    // connections; one per call would also time connection setup).
    let clients =
        (0..16).map(|_| pair.store.client()).collect::<Result<Vec<GatewayClient>, _>>()?;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let deadline = Instant::now() + rate_duration;
    let mut updates = Vec::new();
    let mut i = 0usize;
    while Instant::now() < deadline {
        ticks.tick().await;
        i += 1;
        let (mut client, tracker) = (clients[i % clients.len()].clone(), tracker.clone());
        updates.push(tokio::spawn(async move {
            let name = format!("steady-{:06}", i % 10);
            let sent = Instant::now();
            let g = gateway(&name, &format!("ghcr.io/acme/gateway:1.{i}"), &[]);
            let updated = update_spec(&mut client, g).await?;
            tracker.expect(&name, updated.metadata.map_or(0, |m| m.generation), sent);
            Ok::<(), tonic::Status>(())
        }));
    }
    for u in updates {
        u.await??;
    }
    let settle = Instant::now();
    while tracker.pending() > 0 && settle.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (kube_requests, kube_writes) = pair.take_kube_requests();
    // Mean milliseconds per pass in each stage over the run.
    let stages: serde_json::Map<String, Value> = pair
        .reconciler()?
        .stages()
        .await?
        .into_iter()
        .map(|(stage, (sum, count))| {
            let (sum0, count0) = stages_before.get(&stage).copied().unwrap_or_default();
            let mean_ms =
                if count > count0 { (sum - sum0) / (count - count0) * 1000.0 } else { 0.0 };
            (stage, json!((mean_ms * 100.0).round() / 100.0))
        })
        .collect();
    results.push(json!({
        "scenario": "converge", "mode": "fixed-rate", "cluster": cluster_name(args), "stage_mean_ms": stages, "backend": args.backend.name(),
        "updates_per_s": rate, "duration_s": rate_duration.as_secs_f64(), "updates": i,
        "not_observed_within_10s": tracker.pending(),
        "update_to_observed": percentiles(tracker.take_observed()),
        "kube_requests_per_update": (kube_requests as f64 / i.max(1) as f64 * 10.0).round() / 10.0,
        "kube_writes_per_update": (kube_writes as f64 / i.max(1) as f64 * 10.0).round() / 10.0,
        "store": pair.store.usage().since(store_before),
        "reconciler": pair.reconciler()?.usage().since(reconciler_before),
    }));

    let mut existing = 10;
    for (b, &gateways) in bursts.iter().enumerate() {
        eprintln!("converge: {gateways} gateways created at once ({existing} already there)");
        let (store_before, reconciler_before) = (pair.store.usage(), pair.reconciler()?.usage());
        let started = Instant::now();
        let mut creates = Vec::new();
        for i in 0..gateways {
            let mut client = clients[i % clients.len()].clone();
            creates.push(tokio::spawn(async move {
                client
                    .create_gateway(CreateGatewayRequest {
                        gateway: Some(gateway(&format!("burst{b}-{i:06}"), "gw:1", &[])),
                        validate_only: false,
                    })
                    .await
            }));
        }
        for c in creates {
            c.await??;
        }
        let created = started.elapsed();
        existing += gateways;
        anyhow::ensure!(
            tracker.wait_converged(existing, Duration::from_secs(900), "burst").await,
            "not all {gateways} gateways RUNNING after 15 minutes"
        );
        let all_running = started.elapsed();
        let (kube_requests, kube_writes) = pair.take_kube_requests();
        results.push(json!({
            "scenario": "converge", "mode": "burst", "cluster": cluster_name(args), "backend": args.backend.name(), "gateways": gateways,
            "created_s": created.as_secs_f64(), "all_running_s": all_running.as_secs_f64(),
            "kube_requests_per_gateway": (kube_requests as f64 / gateways as f64 * 10.0).round() / 10.0,
            "kube_writes_per_gateway": (kube_writes as f64 / gateways as f64 * 10.0).round() / 10.0,
            "store": pair.store.usage().since(store_before),
            "reconciler": pair.reconciler()?.usage().since(reconciler_before),
        }));
    }
    drop(tracker);
    pair.stop().await;
    Ok(results)
}

async fn scale(args: &Args, gateways: usize, sync_period: Duration) -> anyhow::Result<Value> {
    let mut pair = Pair::start(args).await?;
    eprintln!("scale: {gateways} gateways in the store on {}", args.backend.name());
    let rss_empty = pair.store.usage().rss_kib;
    let created = create_gateways(&pair.store, "gw", gateways).await?;
    let rss_full = pair.store.usage().rss_kib;
    let list = |selector: &'static str| {
        let mut client = pair.store.client();
        async move {
            let client = client.as_mut().map_err(|e| tonic::Status::internal(e.to_string()))?;
            let started = Instant::now();
            let (mut count, mut token, mut pages) = (0usize, String::new(), 0usize);
            loop {
                let page = client
                    .list_gateways(ListGatewaysRequest {
                        page_size: 1000,
                        page_token: token,
                        label_selector: selector.into(),
                    })
                    .await?
                    .into_inner();
                count += page.gateways.len();
                pages += 1;
                if page.next_page_token.is_empty() {
                    return Ok::<_, tonic::Status>((count, pages, started.elapsed()));
                }
                token = page.next_page_token;
            }
        }
    };
    let (listed, pages, all_time) = list("").await?;
    let (selected, _, selected_time) = list("team=t3").await?;
    anyhow::ensure!(listed == gateways, "listed {listed} of {gateways}");

    eprintln!("scale: the reconciler converges {gateways} gateways");
    let tracker = Tracker::start(pair.store.client()?);
    let started = Instant::now();
    pair.start_reconciler(sync_period).await?;
    anyhow::ensure!(
        tracker.wait_converged(gateways, Duration::from_secs(3600), "first converge").await,
        "not all gateways converged within an hour"
    );
    let first_converge = started.elapsed();
    drop(tracker);
    if let Some(r) = pair.reconciler.take() {
        r.stop();
    }
    pair.take_kube_requests();

    eprintln!("scale: reconciler cold start over {gateways} converged gateways");
    let started = Instant::now();
    pair.start_reconciler(sync_period).await?;
    anyhow::ensure!(
        wait_reconciles(&pair, gateways as u64, Duration::from_secs(600)).await?,
        "the restarted reconciler did not check every gateway within 10 minutes"
    );
    let cold_start = started.elapsed();
    let after_start = pair.reconciler()?.usage();
    let (cold_requests, cold_writes) = pair.take_kube_requests();

    eprintln!("scale: waiting for a periodic resync (sync period {sync_period:?})");
    let resync_limit = sync_period * 2 + Duration::from_secs(600);
    anyhow::ensure!(
        wait_reconciles(&pair, 2 * gateways as u64, resync_limit).await?,
        "no full resync within {resync_limit:?}"
    );
    let after_resync = pair.reconciler()?.usage();
    let (resync_requests, resync_writes) = pair.take_kube_requests();
    let result = json!({
        "scenario": "scale", "backend": args.backend.name(), "gateways": gateways,
        "create_s": created.as_secs_f64(), "creates_per_s": (gateways as f64 / created.as_secs_f64()).round(),
        "store_rss_empty_kib": rss_empty, "store_rss_kib": rss_full,
        "list_all_s": all_time.as_secs_f64(), "list_pages": pages,
        "list_selector_s": selected_time.as_secs_f64(), "list_selector_matches": selected,
        "reconciler_first_converge_s": first_converge.as_secs_f64(),
        "reconciler_cold_start_s": cold_start.as_secs_f64(),
        "reconciler_cold_start_kube_requests": cold_requests, "reconciler_cold_start_kube_writes": cold_writes,
        "resync_kube_requests": resync_requests, "resync_kube_writes": resync_writes,
        "reconciler_rss_kib": after_start.rss_kib.max(after_resync.rss_kib),
        // The restarted reconciler's peak: its cold start and the resync.
        "reconciler_peak_rss_kib": after_resync.peak_rss_kib,
        "store_rss_with_reconciler_kib": pair.store.usage().rss_kib,
        // kube-fake runs in this process: what it holds for the fleet.
        "kube_fake_process_rss_kib": Usage::of(std::process::id()).rss_kib,
    });
    pair.stop().await;
    Ok(result)
}

async fn idle(args: &Args, gateways: usize, duration: Duration) -> anyhow::Result<Value> {
    let mut pair = Pair::start(args).await?;
    eprintln!("idle: {gateways} converged gateways for {duration:?} on {}", args.backend.name());
    create_gateways(&pair.store, "idle", gateways).await?;
    let tracker = Tracker::start(pair.store.client()?);
    // The default sync period: an idle resync happens in a 5-minute window.
    pair.start_reconciler(Duration::from_secs(300)).await?;
    anyhow::ensure!(
        tracker.wait_converged(gateways, Duration::from_secs(1800), "idle setup").await,
        "gateways did not converge"
    );
    drop(tracker);
    // Let the last status writes and watch events settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pair.take_kube_requests();
    let (store_before, reconciler_before) = (pair.store.usage(), pair.reconciler()?.usage());
    let (store_requests_before, passes_before) =
        (pair.store.requests().await?, pair.reconciler()?.reconciles().await?);
    tokio::time::sleep(duration).await;
    let (store_after, reconciler_after) = (pair.store.usage(), pair.reconciler()?.usage());
    let (store_requests_after, passes_after) =
        (pair.store.requests().await?, pair.reconciler()?.reconciles().await?);
    let (kube_requests, kube_writes) = pair.take_kube_requests();
    let seconds = duration.as_secs_f64();
    let core_percent = |after: Usage, before: Usage| {
        ((after.cpu_s - before.cpu_s) / seconds * 1000.0).round() / 10.0
    };
    let result = json!({
        "scenario": "idle", "backend": args.backend.name(), "gateways": gateways, "duration_s": seconds,
        "kube_requests": kube_requests, "kube_writes": kube_writes,
        "store_grpc_requests": store_requests_after - store_requests_before,
        "reconcile_passes": passes_after - passes_before,
        "store_core_percent": core_percent(store_after, store_before),
        "reconciler_core_percent": core_percent(reconciler_after, reconciler_before),
        "store": store_after.since(store_before), "reconciler": reconciler_after.since(reconciler_before),
    });
    pair.stop().await;
    Ok(result)
}

async fn run(args: &Args, scenario: Scenario) -> anyhow::Result<Vec<Value>> {
    let quick = args.quick;
    let secs = Duration::from_secs;
    let mut out = Vec::new();
    match scenario {
        Scenario::Read => {
            for config_bytes in [0, 4 * 1024, 64 * 1024] {
                out.push(read(args, config_bytes, if quick { 200 } else { 2000 }).await?);
            }
        }
        Scenario::Write => {
            let (clients, seconds): (&[usize], u64) =
                if quick { (&[1, 16], 2) } else { (&[1, 16, 64, 256], 10) };
            for c in clients {
                out.push(write(args, System::Gantry, *c, secs(seconds)).await?);
            }
        }
        Scenario::Watch => {
            // (watchers, connections, pace)
            let runs: &[(usize, usize, Pace)] = if quick {
                &[
                    (1, 1, Pace::BackToBack),
                    (100, 100, Pace::BackToBack),
                    (100, 1, Pace::PerSecond(100)),
                ]
            } else {
                &[
                    (1, 1, Pace::BackToBack),
                    (100, 100, Pace::BackToBack),
                    (1000, 1000, Pace::BackToBack),
                    (1000, 1, Pace::BackToBack),
                    (1000, 1000, Pace::PerSecond(100)),
                    (10_000, 10_000, Pace::PerSecond(10)),
                    (10_000, 1, Pace::PerSecond(10)),
                ]
            };
            for (watchers, connections, pace) in runs {
                let duration = secs(if quick { 2 } else { 10 });
                out.push(
                    watch(args, System::Gantry, *watchers, *connections, *pace, duration).await?,
                );
            }
        }
        Scenario::Versus => {
            let (clients, seconds): (&[usize], u64) =
                if quick { (&[1, 16], 2) } else { (&[1, 16, 64], 10) };
            for c in clients {
                let e = write(args, System::Etcd, *c, secs(seconds)).await?;
                let g = write(args, System::Gantry, *c, secs(seconds)).await?;
                out.push(versus_row("write", json!(c), &g, &e, "writes_per_s", "latency"));
                out.extend([e, g]);
            }
            // (watchers, connections, pace). Back to back, each side writes
            // as fast as it acknowledges (etcd slows its Puts while it fans
            // out; gantry does not), so events/s compares fan-out capacity
            // but latencies cover different loads; paced below both
            // capacities, both deliver the same events and latencies
            // compare.
            let runs: &[(usize, usize, Pace)] = if quick {
                &[(100, 100, Pace::BackToBack), (100, 10, Pace::BackToBack)]
            } else {
                &[
                    (1000, 1000, Pace::BackToBack),
                    (1000, 10, Pace::BackToBack),
                    (1000, 1000, Pace::PerSecond(20)),
                    (1000, 10, Pace::PerSecond(50)),
                ]
            };
            for (watchers, connections, pace) in runs {
                let run =
                    |system| watch(args, system, *watchers, *connections, *pace, secs(seconds));
                let e = run(System::Etcd).await?;
                let g = run(System::Gantry).await?;
                let load = match pace {
                    Pace::BackToBack => json!(format!("{watchers}/{connections}")),
                    Pace::PerSecond(r) => {
                        json!(format!("{watchers}/{connections} at {r} writes/s"))
                    }
                };
                out.push(versus_row("watch", load, &g, &e, "delivered_per_s", "write_to_receive"));
                out.extend([e, g]);
            }
        }
        Scenario::Converge => {
            // A real control plane's Deployment controller and kwok on the
            // same two cores: bursts of a tenth of the size.
            let real = args.cluster == ClusterKind::Real;
            out.extend(match (quick, real) {
                (true, _) => converge(args, &[100], 50, secs(3)).await?,
                (false, false) => converge(args, &[1000, 10_000], 50, secs(20)).await?,
                (false, true) => converge(args, &[100, 1000], 50, secs(20)).await?,
            });
        }
        Scenario::Scale => out.push(match (quick, args.gateways) {
            (_, Some(n)) => scale(args, n, secs(120)).await?,
            (true, None) => scale(args, 1_000, secs(5)).await?,
            (false, None) => scale(args, 100_000, secs(120)).await?,
        }),
        Scenario::Idle => out.push(if quick {
            idle(args, 200, secs(5)).await?
        } else {
            idle(args, 10_000, secs(300)).await?
        }),
        Scenario::All => unreachable!("expanded by main"),
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => vec![
            Scenario::Read,
            Scenario::Write,
            Scenario::Watch,
            Scenario::Converge,
            Scenario::Scale,
            Scenario::Idle,
            Scenario::Versus,
        ],
        one => vec![one],
    };
    let mut results = Vec::new();
    for scenario in scenarios {
        for r in run(&args, scenario).await? {
            println!("{r}");
            results.push(r);
        }
    }
    if let Some(path) = &args.append {
        report::append(path, &results)?;
        eprintln!("appended the results to {}", path.display());
    }
    Ok(())
}
