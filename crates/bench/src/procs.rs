//! The processes a scenario starts (gateway-store, gateway-reconciler) and
//! what is read off them: RSS and CPU from `/proc`, counters from their
//! `/metrics` endpoints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use gantry_api::v1::ListGatewaysRequest;
use gantry_client::{ClientConfig, GatewayClient};
use gantry_testkit::{free_port, Process, TestDatabase};
use serde_json::{json, Value};

use crate::args::{Args, Backend};

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
    let response = gantry_testkit::fetch(port, path).await?;
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
    process: Process,
    pub endpoint: String,
    http: u16,
    dir: PathBuf,
    database: TestDatabase,
    /// The token its clients send (an admin's), when it takes tokens.
    token: Option<String>,
}

impl Store {
    pub async fn start(args: &Args, watch_buffer: usize) -> anyhow::Result<Store> {
        Self::start_with(args, watch_buffer, None, &[]).await
    }

    /// As [`Store::start`], taking `tokens` (a tokens file, its first line
    /// an admin's) instead of every caller, with more flags.
    pub async fn start_with(
        args: &Args,
        watch_buffer: usize,
        tokens: Option<&str>,
        extra: &[&str],
    ) -> anyhow::Result<Store> {
        let dir =
            std::env::temp_dir().join(format!("gantry-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let database = match args.backend {
            Backend::Sqlite => TestDatabase::sqlite(),
            Backend::Postgres => TestDatabase::postgres_on(&args.postgres_url)
                .await
                .context("create a database on PostgreSQL")?,
        };
        let (grpc, http) = (free_port(), free_port());
        let tokens_file = dir.join("tokens.csv");
        let (auth, token) = match tokens {
            Some(tokens) => {
                std::fs::write(&tokens_file, tokens)?;
                let admin = tokens.lines().next().and_then(|l| l.split(',').next());
                (vec!["--tokens-file".to_string(), tokens_file.display().to_string()], admin)
            }
            None => (vec!["--allow-unauthenticated".to_string()], None),
        };
        let token = token.map(str::to_string);
        let flags = [
            "--database-url",
            &database.url,
            "--data-dir",
            &dir.display().to_string(),
            "--listen",
            &format!("127.0.0.1:{grpc}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
            "--watch-buffer",
            &watch_buffer.to_string(),
            "--log-level",
            "warn",
            // Capacity is measured here, not the connection limits (the
            // watch runs open 10,000 connections, or 10,000 streams on one,
            // all of one identity).
            "--max-streams-per-connection",
            "20000",
            "--max-watches-per-identity",
            "20000",
            "--max-calls-per-connection",
            "4096",
            "--max-connections",
            "16384",
        ];
        let mut flags = strings(&flags);
        flags.extend(auth);
        flags.extend(strings(extra));
        let (program, flags) =
            crate::pinning::command(args.server_cpus(), &sibling("gateway-store"), flags);
        let mut process = Process::new(program, flags);
        process
            .spawn()
            .context("start gateway-store (build it first: cargo build --release --bins)")?;
        let endpoint = format!("http://127.0.0.1:{grpc}");
        let store = Store { process, endpoint, http, dir, database, token };
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
        let config = ClientConfig {
            endpoint: self.endpoint.clone(),
            token: self.token.clone(),
            ..Default::default()
        };
        Ok(config.connect_lazy()?)
    }

    /// Its `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        http_get(self.http, "/metrics").await
    }

    pub fn usage(&self) -> Usage {
        self.process.pid().map(Usage::of).unwrap_or_default()
    }

    /// gRPC requests the store has handled so far.
    pub async fn requests(&self) -> anyhow::Result<u64> {
        let text = http_get(self.http, "/metrics").await?;
        Ok(metric_sum(&text, "gantry_store_grpc_requests_total") as u64)
    }

    pub async fn stop(mut self) {
        self.process.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
        self.database.drop_database().await;
    }
}

/// A gateway-reconciler process with the kube target.
pub struct Reconciler {
    process: Process,
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
        let mut flags = vec![
            "--store",
            &store.endpoint,
            "--target",
            "kube",
            "--kubeconfig",
            kubeconfig.to_str().context("a UTF-8 kubeconfig path")?,
        ];
        flags.extend(namespace.map(|n| ["--namespace", n]).into_iter().flatten());
        let (listen, sync) =
            (format!("127.0.0.1:{http}"), format!("{}ms", sync_period.as_millis()));
        flags.extend(["--http-listen", &listen, "--sync-period", &sync]);
        flags.extend(["--poll-interval", poll_interval, "--log-level", "warn"]);
        let mut process = Process::new(sibling("gateway-reconciler"), strings(&flags));
        process
            .spawn()
            .context("start gateway-reconciler (build it first: cargo build --release --bins)")?;
        let reconciler = Reconciler { process, http };
        for _ in 0..600 {
            if reconciler.reconciles().await.is_ok() {
                return Ok(reconciler);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("gateway-reconciler did not start")
    }

    pub fn usage(&self) -> Usage {
        self.process.pid().map(Usage::of).unwrap_or_default()
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
        self.process.terminate();
    }
}

/// An etcd server (Debian's `etcd-server`, or `--etcd-bin`) on a fresh data
/// directory, one member, default durability (fsync on every commit).
pub struct Etcd {
    process: Process,
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
        let data = dir.join("data").display().to_string();
        let cluster = format!("bench={peer_url}");
        let flags = [
            "--name",
            "bench",
            "--data-dir",
            &data,
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &cluster,
            "--log-level",
            "error",
            "--logger",
            "zap",
        ];
        let (program, flags) =
            crate::pinning::command(args.server_cpus(), &args.etcd_bin, strings(&flags));
        let mut process = Process::new(program, flags);
        process.spawn().with_context(|| {
            format!(
                "start {} (install Debian's etcd-server, or pass --etcd-bin)",
                args.etcd_bin.display()
            )
        })?;
        let etcd = Etcd { process, endpoint: client_url, dir };
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
        self.process.pid().map(Usage::of).unwrap_or_default()
    }

    pub fn stop(mut self) {
        self.process.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn strings(flags: &[&str]) -> Vec<String> {
    flags.iter().map(|f| f.to_string()).collect()
}
