//! gantry's testkit, shared by every crate's tests and the benchmarks:
//! locate (building if needed) the workspace's binaries and run them as
//! processes ([`StoreProcess`], [`ReconcilerProcess`]), temporary
//! PostgreSQL databases ([`TempPostgres`]), a real Kubernetes control plane
//! ([`k8s`]), a [`Gateway`](gateway::GatewayBuilder) builder, bounded waits
//! on a condition ([`eventually`]), free ports and HTTP probes.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether this is a CI run, where a missing PostgreSQL or missing
/// Kubernetes binaries fail the tests instead of skipping them: `CI` set to
/// anything but empty, `false` or `0`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Says that a test skipped, on the real stderr: libtest captures
/// `eprintln!` of passing tests, so that line would never be seen.
pub fn skipped(reason: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
}

/// Path of a workspace binary, built once per test process with the same
/// cargo that runs the tests (cheap when it is already up to date).
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Cargo sets CARGO_MANIFEST_DIR and friends for the test process;
        // some build scripts track them, so passing them on would rebuild
        // half the dependency tree. Hand the inner cargo a clean slate.
        let mut cargo = Command::new(env!("CARGO"));
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            let set_for_tests = [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
                "CARGO_TARGET_TMPDIR",
            ];
            if set_for_tests.iter().any(|p| key.starts_with(p)) {
                cargo.env_remove(&key);
            }
        }
        // The same targets `cargo test --workspace` builds, so the feature
        // set matches and nothing is rebuilt when the suite runs as a whole.
        let status = cargo
            .current_dir(workspace_root())
            .args(["build", "--quiet", "--workspace", "--all-targets"])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build failed");
    });
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// SIGKILLs `child` after `limit` whatever happens, so that a process a
/// test reads from (a watch) can never hang the suite.
pub fn kill_after(child: &Child, limit: Duration) {
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    });
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A fresh directory under the system temp dir.
pub fn temp_dir(label: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir =
        std::env::temp_dir().join(format!("gantry-e2e-{label}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// `GET path` on 127.0.0.1:port; the raw response, or `None` if nothing
/// listens.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Polls `GET path` until it answers 200, for at most `timeout`.
pub fn wait_ready(port: u16, path: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if http_get(port, path).is_some_and(|answer| answer.starts_with("HTTP/1.1 200")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "127.0.0.1:{port}{path} was not ready within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `GET path` until it answers, for at most `timeout`.
pub fn wait_for_http(port: u16, path: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(answer) = http_get(port, path) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "nothing answered on 127.0.0.1:{port}{path} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A test CA and a server certificate it signed, for DNS `names` and the
/// IP addresses `ips`: `(CA, certificate, key)` in PEM.
pub fn server_certificate(
    common_name: &str,
    names: &[&str],
    ips: &[[u8; 4]],
) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gantry-test-ca");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let mut params = CertificateParams::new(names).expect("server params");
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress((*ip).into()));
    }
    params.distinguished_name.push(DnType::CommonName, common_name);
    let server = params.signed_by(&server_key, &issuer).expect("server certificate");
    (ca.pem(), server.pem(), server_key.serialize_pem())
}

/// A `gateway-store` process on free ports, restartable with the same
/// arguments (same ports, same database).
#[derive(Debug)]
pub struct StoreProcess {
    args: Vec<String>,
    pub grpc: u16,
    pub http: u16,
    child: Option<Child>,
    /// The process's stderr (its logs), appended across restarts.
    log: PathBuf,
    /// The process's open-file limit, when a test sets one.
    pub open_files: Option<u32>,
}

impl StoreProcess {
    /// Starts a store on `database_url` (without authentication unless
    /// `extra` has `--tokens-file`), waiting until it is ready.
    pub fn start(database_url: &str, data_dir: &std::path::Path) -> StoreProcess {
        Self::start_with(database_url, data_dir, &[])
    }

    /// As [`StoreProcess::start`], with more flags.
    pub fn start_with(
        database_url: &str,
        data_dir: &std::path::Path,
        extra: &[&str],
    ) -> StoreProcess {
        let (grpc, http) = (free_port(), free_port());
        let mut args: Vec<String> = vec![
            "--listen".into(),
            format!("127.0.0.1:{grpc}"),
            "--http-listen".into(),
            format!("127.0.0.1:{http}"),
            "--database-url".into(),
            database_url.into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        if !extra.contains(&"--tokens-file") {
            args.push("--allow-unauthenticated".into());
        }
        let log = data_dir.join("gateway-store.log");
        let mut store = StoreProcess { args, grpc, http, child: None, log, open_files: None };
        store.spawn();
        store
    }

    /// As [`StoreProcess::start_with`], run with an open-file limit of
    /// `open_files` (`ulimit -n`).
    pub fn start_with_open_files(
        database_url: &str,
        data_dir: &std::path::Path,
        extra: &[&str],
        open_files: u32,
    ) -> StoreProcess {
        let mut store = Self::start_with(database_url, data_dir, extra);
        store.kill9();
        store.open_files = Some(open_files);
        store.spawn();
        store
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `http://127.0.0.1:<grpc port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    /// A client of this store without a token (connects on first use).
    pub fn client(&self) -> gantry_client::GatewayClient {
        gantry_client::ClientConfig { endpoint: self.endpoint(), ..Default::default() }
            .connect_lazy()
            .expect("a client of the store")
    }

    /// Starts the process (again) and waits for `/readyz`.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the store's log file");
        let mut command = match self.open_files {
            None => Command::new(binary("gateway-store")),
            Some(limit) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("ulimit -n {limit} && exec \"$0\" \"$@\"")])
                    .arg(binary("gateway-store"));
                sh
            }
        };
        let child = command
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gateway-store");
        self.child = Some(child);
        let ready = wait_for_http(self.http, "/readyz", Duration::from_secs(60));
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    }

    /// Everything the process logged so far (all restarts).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-KILL", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }
}

/// A `gateway-reconciler` process, restartable with the same arguments.
#[derive(Debug)]
pub struct ReconcilerProcess {
    args: Vec<String>,
    pub http: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl ReconcilerProcess {
    /// Starts the reconciler against `store` with `extra` flags and waits
    /// until it has listed the store.
    pub fn start(store: &str, extra: &[&str]) -> ReconcilerProcess {
        let reconciler = Self::launch(store, extra);
        wait_ready(reconciler.http, "/readyz", Duration::from_secs(60));
        reconciler
    }

    /// As [`ReconcilerProcess::start`], without waiting for it to be ready.
    pub fn launch(store: &str, extra: &[&str]) -> ReconcilerProcess {
        let http = free_port();
        let mut args: Vec<String> = vec![
            "--store".into(),
            store.into(),
            "--http-listen".into(),
            format!("127.0.0.1:{http}"),
            "--log-format".into(),
            "json".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let log = std::env::temp_dir().join(format!("gantry-e2e-reconciler-{http}.log"));
        let mut reconciler = ReconcilerProcess { args, http, child: None, log };
        reconciler.spawn_unready();
        reconciler
    }

    /// Starts the process (again) and waits for `/readyz`.
    pub fn spawn(&mut self) {
        self.spawn_unready();
        wait_ready(self.http, "/readyz", Duration::from_secs(60));
    }

    fn spawn_unready(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the log file");
        let child = Command::new(binary("gateway-reconciler"))
            .args(&self.args)
            .env("GANTRY_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gateway-reconciler");
        self.child = Some(child);
    }

    /// Everything the process (and its earlier runs) logged.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until this reconciler has observed `generation` of `name`
    /// (a minute at most; the failure shows its logs).
    pub async fn wait_observed(
        &self,
        client: &gantry_client::GatewayClient,
        name: &str,
        generation: i64,
    ) -> gantry_api::v1::Gateway {
        let observed = |g: &gantry_api::v1::Gateway| {
            g.status.as_ref().is_some_and(|s| s.observed_generation == generation)
        };
        let what = format!("observed at generation {generation}");
        wait_for_gateway(client, name, &what, Duration::from_secs(60), observed, || self.logs())
            .await
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`, `-KILL`) to the process.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-KILL", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        child.wait().ok()
    }
}

impl Drop for ReconcilerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A PostgreSQL database made for one test and dropped after it.
#[derive(Debug)]
pub struct TempPostgres {
    pub url: String,
    admin_url: String,
    name: String,
}

impl TempPostgres {
    /// A fresh database through `GANTRY_TEST_POSTGRES_URL` (default the
    /// local server); `None` when unreachable outside CI, a panic under
    /// `CI=true`.
    pub async fn create() -> Option<TempPostgres> {
        use sqlx::Connection;
        let admin_url = std::env::var("GANTRY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let mut admin = match sqlx::PgConnection::connect(&admin_url).await {
            Ok(c) => c,
            Err(e) if !in_ci() => {
                skipped(&format!("PostgreSQL at {admin_url} unreachable ({e})"));
                return None;
            }
            Err(e) => panic!("CI=true and PostgreSQL at {admin_url} is unreachable: {e}"),
        };
        let name = format!("gantry_e2e_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        let base = admin_url.rsplit_once('/').map_or(admin_url.as_str(), |(b, _)| b);
        Some(TempPostgres { url: format!("{base}/{name}"), admin_url, name })
    }

    /// Runs `sql` on the server's admin connection; `{db}` in it stands
    /// for this database's name (to refuse or drop its connections).
    pub async fn admin(&self, sql: &str) {
        use sqlx::Connection;
        let mut admin =
            sqlx::PgConnection::connect(&self.admin_url).await.expect("admin connection");
        sqlx::query(&sql.replace("{db}", &self.name))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Drops the database (stop the processes using it first).
    pub async fn drop_database(self) {
        use sqlx::Connection;
        if let Ok(mut admin) = sqlx::PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
                .execute(&mut admin)
                .await;
        }
    }
}
pub mod gateway;
pub mod k8s;
pub mod linearizability;
pub mod wait;

pub use wait::{eventually, eventually_blocking, eventually_some};

/// Replays the history from the first revision up to `until` and returns
/// its revisions, checking that each event is a creation (the crash and
/// fault tests only create) and that none takes over 30 s to arrive.
pub async fn replay_creations(client: &mut gantry_client::GatewayClient, until: i64) -> Vec<i64> {
    use gantry_api::v1::{EventType, WatchGatewaysRequest};
    use tokio_stream::StreamExt;
    let mut stream = client
        .watch_gateways(WatchGatewaysRequest { resource_version: 1, ..Default::default() })
        .await
        .expect("watch from the first revision")
        .into_inner();
    let mut revisions = Vec::new();
    while revisions.last().is_none_or(|r| *r < until) {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the next event within 30 s")
            .expect("the watch stays open")
            .expect("a watch event");
        assert_eq!(event.r#type(), EventType::Added);
        revisions.push(event.resource_version);
    }
    revisions
}

/// Polls the store until `done` holds for gateway `name`, for at most
/// `patience`; otherwise panics with its last status and `explain()` (for
/// example the reconciler's logs).
pub async fn wait_for_gateway(
    client: &gantry_client::GatewayClient,
    name: &str,
    what: &str,
    patience: Duration,
    done: impl Fn(&gantry_api::v1::Gateway) -> bool,
    explain: impl Fn() -> String,
) -> gantry_api::v1::Gateway {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let request = gantry_api::v1::GetGatewayRequest { name: name.into() };
        let gateway = client.clone().get_gateway(request).await.expect("get the gateway");
        let gateway = gateway.into_inner();
        if done(&gateway) {
            return gateway;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never became {what}: {:?}\n{}",
            gateway.status,
            explain()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
