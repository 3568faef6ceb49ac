//! gantry's two services as [`Process`]es on free ports, started from the
//! workspace's binaries and waited on until they answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::calls::wait_for_gateway;
use crate::env::{binary, free_port};
use crate::http::{wait_for_http, wait_ready};
use crate::process::Process;

/// How long a service may take to become ready.
const START: Duration = Duration::from_secs(60);

/// A `gateway-store` process on free ports, restartable with the same
/// arguments (same ports, same database).
#[derive(Debug)]
pub struct StoreProcess {
    pub process: Process,
    pub grpc: u16,
    pub http: u16,
}

impl StoreProcess {
    /// Starts a store on `database_url` (without authentication unless
    /// `extra` has `--tokens-file`), waiting until it is ready.
    pub fn start(database_url: &str, data_dir: &Path) -> StoreProcess {
        Self::start_with(database_url, data_dir, &[])
    }

    /// As [`StoreProcess::start`], with more flags.
    pub fn start_with(database_url: &str, data_dir: &Path, extra: &[&str]) -> StoreProcess {
        let mut store = Self::new(database_url, data_dir, extra);
        store.spawn();
        store
    }

    /// As [`StoreProcess::start_with`], run with an open-file limit of
    /// `open_files` (`ulimit -n`).
    pub fn start_with_open_files(
        database_url: &str,
        data_dir: &Path,
        extra: &[&str],
        open_files: u32,
    ) -> StoreProcess {
        let mut store = Self::new(database_url, data_dir, extra);
        store.process.set_open_files(open_files);
        store.spawn();
        store
    }

    fn new(database_url: &str, data_dir: &Path, extra: &[&str]) -> StoreProcess {
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
        let process =
            Process::new(binary("gateway-store"), args).log_to(&data_dir.join("gateway-store.log"));
        StoreProcess { process, grpc, http }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
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
        self.process.spawn().expect("start gateway-store");
        let ready = wait_for_http(self.http, "/readyz", START);
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}\n{}", self.logs());
    }

    /// Everything the process logged so far (all restarts).
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }
}

/// A `gateway-reconciler` process, restartable with the same arguments;
/// its log file is removed with it.
#[derive(Debug)]
pub struct ReconcilerProcess {
    pub process: Process,
    pub http: u16,
    log: PathBuf,
}

impl ReconcilerProcess {
    /// Starts the reconciler against `store` with `extra` flags and waits
    /// until it has listed the store.
    pub fn start(store: &str, extra: &[&str]) -> ReconcilerProcess {
        let reconciler = Self::launch(store, extra);
        wait_ready(reconciler.http, "/readyz", START);
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
        let mut process =
            Process::new(binary("gateway-reconciler"), args).log_to(&log).env("GANTRY_LOG", "info");
        process.spawn().expect("start gateway-reconciler");
        ReconcilerProcess { process, http, log }
    }

    /// Starts the process (again) and waits for `/readyz`.
    pub fn spawn(&mut self) {
        self.process.spawn().expect("start gateway-reconciler");
        wait_ready(self.http, "/readyz", START);
    }

    /// Everything the process (and its earlier runs) logged.
    pub fn logs(&self) -> String {
        self.process.logs()
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
        wait_for_gateway(client, name, &what, START, observed, || self.logs()).await
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`, `-KILL`) to the process.
    pub fn signal(&self, signal: &str) {
        self.process.signal(signal);
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.process.terminate()
    }
}

impl Drop for ReconcilerProcess {
    fn drop(&mut self) {
        self.process.kill9();
        let _ = std::fs::remove_file(&self.log);
    }
}
