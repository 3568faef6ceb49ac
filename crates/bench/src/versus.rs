//! The store's own scenarios (read, write, watch) and the same work run
//! against etcd side by side (`versus`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_api::v1::{CreateGatewayRequest, GetGatewayRequest};
use gantry_client::{ClientConfig, GatewayClient};
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use crate::args::{Args, Backend};
use crate::etcd;
use crate::fleet::{gateway, percentiles, update_spec};
use crate::pinning;
use crate::procs::{Etcd, Store, Usage};
use crate::stamps::{self, Stamps};

/// One client reading one gateway of `config_bytes` of config back to back.
/// One client reading one gateway of `config_bytes` of config back to back.
pub(crate) async fn read(
    args: &Args,
    config_bytes: usize,
    samples: usize,
) -> anyhow::Result<Value> {
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
pub(crate) enum System {
    /// gateway-store on `--backend`.
    Gantry,
    /// etcd, on the same client work.
    Etcd,
}

/// etcd values in the side-by-side runs: about the size of a small
/// gateway as the store keeps it.
pub(crate) const ETCD_VALUE_BYTES: usize = 600;

/// A running server of either kind.
pub(crate) enum Server {
    Gantry(Store),
    Etcd(Etcd),
}

/// CPU seconds of the server under test and of the load generator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cpu {
    server: f64,
    load: f64,
}

impl Cpu {
    /// The CPU used since `before`, as JSON, with the server's per
    /// `ops` (µs of server CPU per write or per delivered event).
    fn since(self, before: Cpu, ops: u64) -> Value {
        let server = self.server - before.server;
        json!({
            "server_s": (server * 100.0).round() / 100.0,
            "load_s": ((self.load - before.load) * 100.0).round() / 100.0,
            "server_us_per_op": if ops > 0 { (server * 1e6 / ops as f64).round() } else { 0.0 },
        })
    }
}

/// One connection to a [`Server`].
#[derive(Clone)]
pub(crate) enum Connection {
    /// Writes through gantry's client; watches read stamps only
    /// ([`crate::stamps`]) on `channel`, a connection of their own.
    Gantry {
        client: GatewayClient,
        channel: tonic::transport::Channel,
    },
    Etcd {
        channel: tonic::transport::Channel,
        kv: etcd::Kv,
    },
}

impl Server {
    pub(crate) async fn start(
        args: &Args,
        system: System,
        watch_buffer: usize,
    ) -> anyhow::Result<Server> {
        Ok(match system {
            System::Gantry => Server::Gantry(Store::start(args, watch_buffer).await?),
            System::Etcd => Server::Etcd(Etcd::start(args).await?),
        })
    }

    pub(crate) fn name(&self, args: &Args) -> &'static str {
        match self {
            Server::Gantry(_) => args.backend.name(),
            Server::Etcd(_) => "etcd",
        }
    }

    pub(crate) fn usage(&self) -> Usage {
        match self {
            Server::Gantry(s) => s.usage(),
            Server::Etcd(e) => e.usage(),
        }
    }

    /// CPU seconds used so far by the server under test and by this
    /// process (the load generator): for gantry on PostgreSQL, the local
    /// PostgreSQL server's processes count as the server's.
    pub(crate) fn cpu(&self, args: &Args) -> Cpu {
        let database = match (self, args.backend) {
            (Server::Gantry(_), Backend::Postgres) => pinning::cpu_seconds_named("postgres"),
            _ => 0.0,
        };
        let load = Usage::of(std::process::id()).cpu_s;
        Cpu { server: self.usage().cpu_s + database, load }
    }

    /// A new connection (HTTP/2, shared by the calls made on clones).
    pub(crate) async fn connect(&self) -> anyhow::Result<Connection> {
        Ok(match self {
            Server::Gantry(s) => {
                // Each made on its first call: a connection writes or
                // watches, never both.
                let config = ClientConfig { endpoint: s.endpoint.clone(), ..Default::default() };
                let channel = config.endpoint()?.connect_lazy();
                Connection::Gantry { client: config.connect_lazy()?, channel }
            }
            Server::Etcd(e) => {
                let channel = e.channel().await?;
                Connection::Etcd { kv: etcd::Kv::new(channel.clone()), channel }
            }
        })
    }

    /// Makes `key` exist, so that writes are updates.
    pub(crate) async fn create(&self, key: &str) -> anyhow::Result<()> {
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

    pub(crate) async fn stop(self) {
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
    pub(crate) async fn write(
        &mut self,
        key: &str,
        i: u64,
        stamp: Option<u64>,
    ) -> anyhow::Result<()> {
        match self {
            Connection::Gantry { client, .. } => {
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
    pub(crate) async fn watch(&self, key: &str) -> anyhow::Result<Stamps> {
        Ok(match self {
            Connection::Gantry { channel, .. } => stamps::watch(channel.clone()).await?,
            Connection::Etcd { channel, .. } => Box::pin(etcd::watch(channel.clone(), key).await?),
        })
    }
}

impl Connection {
    /// `watchers` watch streams from now on sharing one stream of this
    /// connection (gantry: Watch; etcd: one Watch stream with a create
    /// per watch, as its Go client does).
    pub(crate) async fn watch_many(
        &self,
        key: &str,
        watchers: usize,
    ) -> anyhow::Result<Vec<Stamps>> {
        Ok(match self {
            Connection::Gantry { channel, .. } => {
                stamps::watch_many(channel.clone(), watchers).await?
            }
            Connection::Etcd { channel, .. } => {
                etcd::watch_many(channel.clone(), key, watchers).await?
            }
        })
    }
}

pub(crate) async fn write(
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
    let cpu_before = server.cpu(args);
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
        "cpu": server.cpu(args).since(cpu_before, ops as u64),
    });
    server.stop().await;
    Ok(result)
}

/// How the watch writer paces its writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pace {
    BackToBack,
    PerSecond(u32),
}

/// How a connection carries its watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carry {
    /// One stream per watch (gantry: WatchGateways).
    StreamEach,
    /// One stream per connection for all its watches (gantry: Watch).
    Shared,
}

/// `watchers` watches on "hot" spread over `connections`, carried as
/// `carry` says.
async fn open_watches(
    connections: &[Connection],
    watchers: usize,
    carry: Carry,
) -> anyhow::Result<Vec<Stamps>> {
    let mut streams = Vec::with_capacity(watchers);
    match carry {
        Carry::StreamEach => {
            for w in 0..watchers {
                streams.push(connections[w % connections.len()].watch("hot").await?);
            }
        }
        Carry::Shared => {
            let count = connections.len();
            for (c, connection) in connections.iter().enumerate() {
                let n = watchers / count + usize::from(c < watchers % count);
                streams.extend(connection.watch_many("hot", n).await?);
            }
        }
    }
    Ok(streams)
}

/// `watchers` watches spread over `connections` connections, carried as
/// `carry` says, while one writer changes one key (`pace`) for `duration`.
pub(crate) async fn watch(
    args: &Args,
    system: System,
    (watchers, connections, carry): (usize, usize, Carry),
    pace: Pace,
    duration: Duration,
) -> anyhow::Result<Value> {
    let server = Server::start(args, system, 65_536).await?;
    let backend = server.name(args);
    let connections = connections.clamp(1, watchers.max(1));
    eprintln!(
        "watch: {watchers} watchers on {connections} connection(s) ({carry:?}), writes {pace:?}, for {duration:?} on {backend}"
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
    let streams = open_watches(&shared, watchers, carry).await?;
    let mut tasks = Vec::new();
    for mut stream in streams {
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
    let cpu_before = server.cpu(args);
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
    let cpu_after = server.cpu(args);
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
        "shared_streams": carry == Carry::Shared,
        "writes_per_s_target": pace_json, "duration_s": duration.as_secs_f64(), "writes": writes,
        "delivered_events": delivered, "undelivered_events": expected.saturating_sub(delivered),
        "delivered_per_s": (delivered as f64 / duration.as_secs_f64()).round(),
        "write_to_receive": percentiles(all),
        "store_rss_per_watcher_kib": (per_watcher * 10.0).round() / 10.0, "store": after.since(watching),
        "cpu": cpu_after.since(cpu_before, delivered),
    });
    server.stop().await;
    Ok(result)
}

/// One row comparing gantry's result `g` with etcd's `e` on the same work:
/// throughput (`rate` field), its ratio, and latency (`latency` field).
pub(crate) fn versus_row(
    case: &str,
    load: Value,
    g: &Value,
    e: &Value,
    rate: &str,
    latency: &str,
) -> Value {
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
        "gantry_server_cpu_us_per_op": g["cpu"]["server_us_per_op"],
        "etcd_server_cpu_us_per_op": e["cpu"]["server_us_per_op"],
    })
}
