//! `gantry-bench`: starts what a scenario needs (gateway-store as a process
//! on SQLite or PostgreSQL, the reconciler, kube-fake) on free ports, runs
//! it for a bounded time, and prints one JSON object per scenario: inputs,
//! throughput, latency percentiles and the store's RSS and CPU. Progress
//! goes to stderr. Timings are measured here, never asserted by tests.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use gantry_api::v1::{
    CreateGatewayRequest, Gateway, GatewaySpec, ListGatewaysRequest, ObjectMeta, Phase,
    UpdateGatewayRequest, WatchGatewaysRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use serde_json::{json, Value};
use sqlx::Connection as _;
use tokio_stream::StreamExt;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// Benchmark scenarios for gantry.
#[derive(Parser, Debug)]
#[command(name = "gantry-bench", version, about)]
struct Args {
    /// Small sizes and short runs (a smoke check, about a minute in all).
    #[arg(long, global = true, env = "GANTRY_BENCH_QUICK")]
    quick: bool,
    /// Store backend.
    #[arg(long, global = true, value_enum, default_value_t = Backend::Sqlite)]
    backend: Backend,
    /// PostgreSQL server for --backend postgres (a fresh database is made).
    #[arg(
        long,
        global = true,
        env = "GANTRY_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    postgres_url: String,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// Concurrent clients doing spec updates (durable acknowledgements).
    Write,
    /// Watchers on their own connections while a writer changes gateways.
    Watch,
    /// N gateways created at once until all RUNNING (reconciler + kube-fake).
    Converge,
    /// Many gateways in the store: store RSS and full ListGateways pagination.
    Scale,
    /// Every scenario.
    All,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A gateway-store process for a scenario.
struct Store {
    child: Child,
    endpoint: String,
    dir: PathBuf,
    database: Option<(String, String)>,
}

impl Store {
    async fn start(args: &Args, watch_buffer: usize) -> anyhow::Result<Store> {
        let dir =
            std::env::temp_dir().join(format!("gantry-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let (url, database) = match args.backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.join("gantry.db").display()), None),
            Backend::Postgres => {
                let name = format!("gantry_bench_{}", uuid::Uuid::new_v4().simple());
                let mut admin = sqlx::PgConnection::connect(&args.postgres_url)
                    .await
                    .context("connect to PostgreSQL")?;
                sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await?;
                let base = args
                    .postgres_url
                    .rsplit_once('/')
                    .map_or(args.postgres_url.as_str(), |(b, _)| b)
                    .to_string();
                (format!("{base}/{name}"), Some((args.postgres_url.clone(), name)))
            }
        };
        let (grpc, http) = (free_port(), free_port());
        let child = Command::new(sibling("gateway-store"))
            .args(["--allow-unauthenticated", "--database-url", &url, "--data-dir"])
            .arg(&dir)
            .args([
                "--listen",
                &format!("127.0.0.1:{grpc}"),
                "--http-listen",
                &format!("127.0.0.1:{http}"),
            ])
            .args(["--watch-buffer", &watch_buffer.to_string(), "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start gateway-store (build it first: cargo build --release --bins)")?;
        let endpoint = format!("http://127.0.0.1:{grpc}");
        let store = Store { child, endpoint, dir, database };
        let client = store.client()?;
        for _ in 0..600 {
            if client.clone().list_gateways(ListGatewaysRequest::default()).await.is_ok() {
                return Ok(store);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("gateway-store did not start")
    }

    fn client(&self) -> anyhow::Result<GatewayClient> {
        Ok(ClientConfig { endpoint: self.endpoint.clone(), ..Default::default() }.connect_lazy()?)
    }

    /// (RSS in KiB, CPU seconds) of the store process.
    fn usage(&self) -> (u64, f64) {
        let pid = self.child.id();
        let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0);
        let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let fields: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
                let ticks: u64 =
                    fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
                Some(ticks as f64 / 100.0)
            })
            .unwrap_or(0.0);
        (rss, cpu)
    }

    async fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some((admin_url, name)) = self.database.take() {
            if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await;
            }
        }
    }
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
        .update_gateway(UpdateGatewayRequest { gateway: Some(g), update_mask: mask })
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

async fn write(args: &Args, clients: usize, duration: Duration) -> anyhow::Result<Value> {
    let store = Store::start(args, 4096).await?;
    eprintln!("write: {clients} clients for {duration:?} on {:?}", args.backend);
    let mut setup = store.client()?;
    for c in 0..clients {
        setup
            .create_gateway(CreateGatewayRequest {
                gateway: Some(gateway(&format!("w{c}"), "gw:0", &[])),
            })
            .await?;
    }
    let (_, cpu_before) = store.usage();
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = ClientConfig { endpoint: store.endpoint.clone(), ..Default::default() }
            .connect_lazy()?;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let started = Instant::now();
                if update_spec(&mut client, gateway(&format!("w{c}"), &format!("gw:{i}"), &[]))
                    .await
                    .is_ok()
                {
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
    let (rss, cpu_after) = store.usage();
    let ops = all.len();
    let result = json!({
        "scenario": "write", "backend": format!("{:?}", args.backend).to_lowercase(), "clients": clients,
        "duration_s": duration.as_secs_f64(), "acknowledged_writes": ops,
        "writes_per_s": (ops as f64 / duration.as_secs_f64()).round(),
        "latency": percentiles(all), "store_rss_kib": rss, "store_cpu_s": cpu_after - cpu_before,
    });
    store.stop().await;
    Ok(result)
}

async fn watch(args: &Args, watchers: usize, duration: Duration) -> anyhow::Result<Value> {
    let store = Store::start(args, 65_536).await?;
    eprintln!(
        "watch: {watchers} watchers on {watchers} connections for {duration:?} on {:?}",
        args.backend
    );
    let mut writer = store.client()?;
    writer
        .create_gateway(CreateGatewayRequest { gateway: Some(gateway("hot", "gw:0", &[])) })
        .await?;
    let (rss_before, _) = store.usage();
    let epoch = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        // Each watcher on its own connection.
        let mut client = gantry_client::connect(&ClientConfig {
            endpoint: store.endpoint.clone(),
            ..Default::default()
        })
        .await?;
        let mut stream = client.watch_gateways(WatchGatewaysRequest::default()).await?.into_inner();
        let (received, stop) = (received.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                tokio::select! {
                    () = stop.notified() => break,
                    event = stream.next() => match event {
                        Some(Ok(e)) => {
                            let sent: Option<u64> = e.gateway.and_then(|g| g.spec?.config.get("t")?.parse().ok());
                            if let Some(sent) = sent {
                                let now = epoch.elapsed().as_micros() as u64;
                                latencies.push(now.saturating_sub(sent));
                                received.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => break,
                    },
                }
            }
            latencies
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_watching, cpu_before) = store.usage();
    let received_before = received.load(Ordering::Relaxed);
    let deadline = Instant::now() + duration;
    let mut writes = 0u64;
    while Instant::now() < deadline {
        let t = epoch.elapsed().as_micros().to_string();
        update_spec(&mut writer, gateway("hot", &format!("gw:{writes}"), &[("t", t)])).await?;
        writes += 1;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_after, cpu_after) = store.usage();
    stop.notify_waiters();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    let delivered = received.load(Ordering::Relaxed) - received_before;
    let per_watcher = rss_watching.saturating_sub(rss_before) as f64 / watchers.max(1) as f64;
    let result = json!({
        "scenario": "watch", "backend": format!("{:?}", args.backend).to_lowercase(), "watchers": watchers, "connections": watchers,
        "duration_s": duration.as_secs_f64(), "writes": writes, "delivered_events": delivered,
        "delivered_per_s": (delivered as f64 / duration.as_secs_f64()).round(),
        "write_to_receive": percentiles(all),
        "store_rss_kib": rss_after, "store_rss_per_watcher_kib": (per_watcher * 10.0).round() / 10.0, "store_cpu_s": cpu_after - cpu_before,
    });
    store.stop().await;
    Ok(result)
}

async fn converge(args: &Args, gateways: usize) -> anyhow::Result<Value> {
    use gantry_reconciler::controller::{Controller, Settings};
    let store = Store::start(args, 4096).await?;
    eprintln!("converge: {gateways} gateways at once, kube target on kube-fake (no rollout delay)");
    let kube = gantry_kube_fake::KubeFake::start_with(gantry_kube_fake::Options {
        rollout_delay: Duration::ZERO,
        ..Default::default()
    })
    .await?;
    let kube_client = kube::Client::try_from(kube::Config::new(kube.url().parse()?))?;
    let target = Arc::new(gantry_reconciler::target::kube::KubeTarget::new(kube_client, "default"));
    let settings = Settings { poll_interval: Duration::from_millis(50), ..Settings::default() };
    let controller = Controller::new(
        store.client()?,
        target,
        settings,
        Arc::new(gantry_reconciler::metrics::Metrics::default()),
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let reconciler = tokio::spawn(controller.run(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let client = store.client()?;
    let started = Instant::now();
    let mut creates = Vec::new();
    for i in 0..gateways {
        let mut c = client.clone();
        creates.push(tokio::spawn(async move {
            c.create_gateway(CreateGatewayRequest {
                gateway: Some(gateway(&format!("g{i}"), "gw:1", &[])),
            })
            .await
        }));
    }
    for c in creates {
        c.await??;
    }
    let created = started.elapsed();
    loop {
        let mut running = 0;
        let mut token = String::new();
        loop {
            let page = client
                .clone()
                .list_gateways(ListGatewaysRequest {
                    page_size: 1000,
                    page_token: token,
                    label_selector: String::new(),
                })
                .await?
                .into_inner();
            running += page
                .gateways
                .iter()
                .filter(|g| {
                    g.status
                        .as_ref()
                        .is_some_and(|s| s.phase() == Phase::Running && s.observed_generation == 1)
                })
                .count();
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        if running == gateways {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "not all RUNNING after 10 minutes ({running}/{gateways})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_running = started.elapsed();
    let requests = kube.requests().len();
    let _ = stop_tx.send(true);
    let _ = reconciler.await;
    let (rss, _) = store.usage();
    let result = json!({
        "scenario": "converge", "backend": format!("{:?}", args.backend).to_lowercase(), "gateways": gateways,
        "created_s": created.as_secs_f64(), "all_running_s": all_running.as_secs_f64(),
        "kube_requests_per_gateway": (requests as f64 / gateways as f64 * 10.0).round() / 10.0, "store_rss_kib": rss,
    });
    kube.stop().await;
    store.stop().await;
    Ok(result)
}

async fn scale(args: &Args, gateways: usize) -> anyhow::Result<Value> {
    let store = Store::start(args, 4096).await?;
    eprintln!("scale: {gateways} gateways in the store on {:?}", args.backend);
    let (rss_empty, _) = store.usage();
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (mut client, next) = (store.client()?, next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= gateways {
                    return Ok::<(), tonic::Status>(());
                }
                let mut g = gateway(&format!("gw-{i:06}"), "ghcr.io/acme/gateway:1.0", &[]);
                g.metadata.as_mut().map(|m| m.labels.insert("team".into(), format!("t{}", i % 10)));
                client.create_gateway(CreateGatewayRequest { gateway: Some(g) }).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let created = started.elapsed();
    let (rss_full, _) = store.usage();
    let client = store.client()?;
    let list = |selector: &'static str| {
        let mut client = client.clone();
        async move {
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
    let result = json!({
        "scenario": "scale", "backend": format!("{:?}", args.backend).to_lowercase(), "gateways": gateways,
        "create_s": created.as_secs_f64(), "creates_per_s": (gateways as f64 / created.as_secs_f64()).round(),
        "store_rss_empty_kib": rss_empty, "store_rss_kib": rss_full,
        "list_all_s": all_time.as_secs_f64(), "list_pages": pages,
        "list_selector_s": selected_time.as_secs_f64(), "list_selector_matches": selected,
    });
    store.stop().await;
    Ok(result)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let quick = args.quick;
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => {
            vec![Scenario::Write, Scenario::Watch, Scenario::Converge, Scenario::Scale]
        }
        one => vec![one],
    };
    for scenario in scenarios {
        let results = match scenario {
            Scenario::Write => {
                let (clients, seconds): (&[usize], u64) =
                    if quick { (&[1, 16], 2) } else { (&[1, 16, 64, 256], 10) };
                let mut out = Vec::new();
                for c in clients {
                    out.push(write(&args, *c, Duration::from_secs(seconds)).await?);
                }
                out
            }
            Scenario::Watch => {
                let (watchers, seconds): (&[usize], u64) =
                    if quick { (&[1, 100], 2) } else { (&[1, 100, 1000], 10) };
                let mut out = Vec::new();
                for w in watchers {
                    out.push(watch(&args, *w, Duration::from_secs(seconds)).await?);
                }
                out
            }
            Scenario::Converge => vec![converge(&args, if quick { 100 } else { 1000 }).await?],
            Scenario::Scale => vec![scale(&args, if quick { 2_000 } else { 100_000 }).await?],
            Scenario::All => unreachable!("expanded above"),
        };
        for r in results {
            println!("{r}");
        }
    }
    Ok(())
}
