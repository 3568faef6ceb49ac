//! The processes a scenario starts (gateway-store, gateway-reconciler) and
//! what is read off them: RSS and CPU from `/proc`, counters from their
//! `/metrics` endpoints.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use gantry_api::v1::ListGatewaysRequest;
use gantry_client::{ClientConfig, GatewayClient};
use serde_json::{json, Value};
use sqlx::Connection as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::args::{Args, Backend};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// A binary built next to `gantry-bench` (same profile).
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Resident memory and CPU time of a process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub rss_kib: u64,
    /// The largest RSS the process has had (`VmHWM`).
    pub peak_rss_kib: u64,
    pub cpu_s: f64,
}

impl Usage {
    pub fn of(pid: u32) -> Usage {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib = |field: &str| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(0)
        };
        let (rss_kib, peak_rss_kib) = (kib("VmRSS:"), kib("VmHWM:"));
        let cpu_s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let fields: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
                let ticks: u64 =
                    fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
                Some(ticks as f64 / 100.0)
            })
            .unwrap_or(0.0);
        Usage { rss_kib, peak_rss_kib, cpu_s }
    }

    /// JSON for a process between `before` and `self`: RSS now, CPU used.
    pub fn since(self, before: Usage) -> Value {
        json!({"rss_kib": self.rss_kib, "cpu_s": ((self.cpu_s - before.cpu_s) * 100.0).round() / 100.0})
    }
}

/// `GET path` on a local HTTP endpoint; the body.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").context("malformed HTTP response")?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    Ok(body.to_string())
}

/// Sum of every sample of a Prometheus metric (all label sets).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A gateway-store process on a fresh SQLite file or PostgreSQL database.
pub struct Store {
    child: Child,
    pub endpoint: String,
    http: u16,
    dir: PathBuf,
    database: Option<(String, String)>,
}

impl Store {
    pub async fn start(args: &Args, watch_buffer: usize) -> anyhow::Result<Store> {
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
            // Capacity is measured here, not the connection limits (the
            // watch runs open 10,000 connections, or 10,000 streams on one).
            .args(["--max-streams-per-connection", "20000", "--max-calls-per-connection", "4096"])
            .args(["--max-connections", "16384"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start gateway-store (build it first: cargo build --release --bins)")?;
        let endpoint = format!("http://127.0.0.1:{grpc}");
        let store = Store { child, endpoint, http, dir, database };
        let client = store.client()?;
        for _ in 0..600 {
            if client.clone().list_gateways(ListGatewaysRequest::default()).await.is_ok() {
                return Ok(store);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("gateway-store did not start")
    }

    pub fn client(&self) -> anyhow::Result<GatewayClient> {
        Ok(ClientConfig { endpoint: self.endpoint.clone(), ..Default::default() }.connect_lazy()?)
    }

    pub fn usage(&self) -> Usage {
        Usage::of(self.child.id())
    }

    /// gRPC requests the store has handled so far.
    pub async fn requests(&self) -> anyhow::Result<u64> {
        let text = http_get(self.http, "/metrics").await?;
        Ok(metric_sum(&text, "gantry_store_grpc_requests_total") as u64)
    }

    pub async fn stop(mut self) {
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

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// A gateway-reconciler process with the kube target.
pub struct Reconciler {
    child: Child,
    http: u16,
}

impl Reconciler {
    /// Starts the reconciler against `store` and the cluster in
    /// `kubeconfig`, and waits for its metrics endpoint.
    pub async fn start(
        store: &Store,
        kubeconfig: &Path,
        namespace: Option<&str>,
        sync_period: Duration,
        poll_interval: &str,
    ) -> anyhow::Result<Reconciler> {
        let http = free_port();
        let child = Command::new(sibling("gateway-reconciler"))
            .args(["--store", &store.endpoint, "--target", "kube", "--kubeconfig"])
            .arg(kubeconfig)
            .args(namespace.map(|n| ["--namespace", n]).into_iter().flatten())
            .args(["--http-listen", &format!("127.0.0.1:{http}")])
            .args(["--sync-period", &format!("{}ms", sync_period.as_millis())])
            .args(["--poll-interval", poll_interval, "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start gateway-reconciler (build it first: cargo build --release --bins)")?;
        let reconciler = Reconciler { child, http };
        for _ in 0..600 {
            if reconciler.reconciles().await.is_ok() {
                return Ok(reconciler);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("gateway-reconciler did not start")
    }

    pub fn usage(&self) -> Usage {
        Usage::of(self.child.id())
    }

    /// Per stage of convergence (queue, apply, observe, status_write): the
    /// seconds spent so far and how many times.
    pub async fn stages(&self) -> anyhow::Result<std::collections::BTreeMap<String, (f64, f64)>> {
        let text = http_get(self.http, "/metrics").await?;
        let mut stages = std::collections::BTreeMap::new();
        for stage in ["queue", "apply", "observe", "status_write"] {
            let labels = format!("{{stage=\"{stage}\"}}");
            let sum =
                metric_sum(&text, &format!("gantry_reconciler_stage_duration_seconds_sum{labels}"));
            let count = metric_sum(
                &text,
                &format!("gantry_reconciler_stage_duration_seconds_count{labels}"),
            );
            stages.insert(stage.to_string(), (sum, count));
        }
        Ok(stages)
    }

    /// Reconcile passes so far, whatever their outcome.
    pub async fn reconciles(&self) -> anyhow::Result<u64> {
        let text = http_get(self.http, "/metrics").await?;
        Ok(metric_sum(&text, "gantry_reconciler_reconciles_total") as u64)
    }

    /// Stops with SIGTERM (graceful), then waits.
    pub fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// An etcd server (Debian's `etcd-server`, or `--etcd-bin`) on a fresh data
/// directory, one member, default durability (fsync on every commit).
pub struct Etcd {
    child: Child,
    pub endpoint: String,
    dir: PathBuf,
}

impl Etcd {
    pub async fn start(args: &Args) -> anyhow::Result<Etcd> {
        let dir = std::env::temp_dir()
            .join(format!("gantry-bench-etcd-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&args.etcd_bin)
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}"), "--log-level", "error"])
            .args(["--logger", "zap"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "start {} (install Debian's etcd-server, or pass --etcd-bin)",
                    args.etcd_bin.display()
                )
            })?;
        let etcd = Etcd { child, endpoint: client_url, dir };
        for _ in 0..600 {
            if let Ok(mut kv) = etcd.kv().await {
                if crate::etcd::put(&mut kv, "ready", b"1").await.is_ok() {
                    return Ok(etcd);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("etcd did not start")
    }

    /// A KV client on a new connection.
    pub async fn kv(&self) -> anyhow::Result<crate::etcd::Kv> {
        Ok(crate::etcd::Kv::new(self.channel().await?))
    }

    /// A new connection.
    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        Ok(tonic::transport::Endpoint::from_shared(self.endpoint.clone())?.connect().await?)
    }

    pub fn usage(&self) -> Usage {
        Usage::of(self.child.id())
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}
