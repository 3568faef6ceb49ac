//! gantry's two services as [`Process`]es on free ports, started from the
//! workspace's binaries and waited on until they answer.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::calls::wait_for_gateway;
use crate::env::{binary, free_port};
use crate::http::http_get;
use crate::process::Process;

/// How long a service may take to become ready.
const START: Duration = Duration::from_secs(60);
/// Starts on fresh ports when a port was taken meanwhile: `free_port`
/// releases the port it found, and a concurrent test may bind it first.
const PORT_ATTEMPTS: usize = 3;

/// Why a process did not come up.
enum NotUp {
    /// It exited because a port it was given was taken meanwhile.
    PortTaken(String),
    /// Anything else (the message has its logs).
    Failed(String),
}

/// Waits until `GET path` on `port` answers (200 when `ready`), failing as
/// soon as the process exits instead of waiting out [`START`].
fn wait_up(process: &mut Process, port: u16, path: &str, ready: bool) -> Result<String, NotUp> {
    let deadline = Instant::now() + START;
    loop {
        if let Some(answer) = http_get(port, path) {
            if !ready || answer.starts_with("HTTP/1.1 200") {
                return Ok(answer);
            }
        }
        if let Some(status) = process.exited() {
            let logs = process.logs();
            let why = format!("exited ({status}) before 127.0.0.1:{port}{path} answered:\n{logs}");
            return Err(if logs.contains("Address already in use") {
                NotUp::PortTaken(why)
            } else {
                NotUp::Failed(why)
            });
        }
        if Instant::now() >= deadline {
            let logs = process.logs();
            return Err(NotUp::Failed(format!(
                "127.0.0.1:{port}{path} did not answer within {START:?}:\n{logs}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `start` until it comes up, again on fresh ports when a port was
/// taken, at most [`PORT_ATTEMPTS`] times.
fn with_fresh_ports<T>(what: &str, mut start: impl FnMut() -> (T, Result<(), NotUp>)) -> T {
    for attempt in 1..=PORT_ATTEMPTS {
        match start() {
            (service, Ok(())) => return service,
            (_, Err(NotUp::PortTaken(_))) if attempt < PORT_ATTEMPTS => {}
            (_, Err(NotUp::PortTaken(why) | NotUp::Failed(why))) => panic!("{what} {why}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

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
        Self::start_with_env(database_url, data_dir, extra, &[])
    }

    /// A store on `dir/gantry.db` (SQLite) taking the tokens file `tokens`
    /// (its lines: `token,user,role[,expiry]`), written to
    /// `dir/tokens.csv`, with more flags.
    pub fn sqlite_with_tokens(dir: &Path, tokens: &str, extra: &[&str]) -> StoreProcess {
        let database = format!("sqlite://{}", dir.join("gantry.db").display());
        Self::with_tokens(&database, dir, tokens, extra)
    }

    /// As [`StoreProcess::sqlite_with_tokens`], on `database_url`.
    pub fn with_tokens(
        database_url: &str,
        dir: &Path,
        tokens: &str,
        extra: &[&str],
    ) -> StoreProcess {
        let file = dir.join("tokens.csv");
        std::fs::write(&file, tokens).expect("write the tokens file");
        let file = file.display().to_string();
        let flags: Vec<&str> =
            ["--tokens-file", file.as_str()].into_iter().chain(extra.iter().copied()).collect();
        Self::start_with(database_url, dir, &flags)
    }

    /// As [`StoreProcess::start_with`], with environment variables.
    pub fn start_with_env(
        database_url: &str,
        data_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> StoreProcess {
        with_fresh_ports("gateway-store", || {
            let mut store = Self::new(database_url, data_dir, extra, env);
            let up = store.try_spawn();
            (store, up)
        })
    }

    /// As [`StoreProcess::start_with`], run with an open-file limit of
    /// `open_files` (`ulimit -n`).
    pub fn start_with_open_files(
        database_url: &str,
        data_dir: &Path,
        extra: &[&str],
        open_files: u32,
    ) -> StoreProcess {
        with_fresh_ports("gateway-store", || {
            let mut store = Self::new(database_url, data_dir, extra, &[]);
            store.process.set_open_files(open_files);
            let up = store.try_spawn();
            (store, up)
        })
    }

    fn new(
        database_url: &str,
        data_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
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
        let mut process =
            Process::new(binary("gateway-store"), args).log_to(&data_dir.join("gateway-store.log"));
        for (key, value) in env {
            process = process.env(key, value);
        }
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

    /// A client of this store sending `token` (connects on first use).
    pub fn client_with_token(&self, token: &str) -> gantry_client::GatewayClient {
        gantry_client::ClientConfig {
            endpoint: self.endpoint(),
            token: Some(token.into()),
            ..Default::default()
        }
        .connect_lazy()
        .expect("a client of the store")
    }

    /// Starts the process (again) and waits for `/readyz`.
    pub fn spawn(&mut self) {
        if let Err(NotUp::PortTaken(why) | NotUp::Failed(why)) = self.try_spawn() {
            panic!("gateway-store {why}");
        }
    }

    /// Starts the process and waits until `/readyz` answers; it must say
    /// ready.
    fn try_spawn(&mut self) -> Result<(), NotUp> {
        self.process.spawn().expect("start gateway-store");
        let ready = wait_up(&mut self.process, self.http, "/readyz", false)?;
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}\n{}", self.logs());
        Ok(())
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
    /// A reconciler of `store` writing manifests to `directory`, checking
    /// rollouts every 100 ms, with more flags.
    pub fn to_directory(store: &str, directory: &Path, extra: &[&str]) -> ReconcilerProcess {
        let directory = directory.display().to_string();
        let target =
            ["--target", "directory", "--directory", &directory, "--poll-interval", "100ms"];
        Self::start(store, &[&target[..], extra].concat())
    }

    pub fn start(store: &str, extra: &[&str]) -> ReconcilerProcess {
        with_fresh_ports("gateway-reconciler", || {
            let mut reconciler = Self::launch(store, extra);
            let up = wait_up(&mut reconciler.process, reconciler.http, "/readyz", true).map(drop);
            (reconciler, up)
        })
    }

    /// As [`ReconcilerProcess::start`], with more environment variables.
    pub fn start_with_env(store: &str, extra: &[&str], env: &[(&str, &str)]) -> ReconcilerProcess {
        with_fresh_ports("gateway-reconciler", || {
            let mut reconciler = Self::launch_with_env(store, extra, env);
            let up = wait_up(&mut reconciler.process, reconciler.http, "/readyz", true).map(drop);
            (reconciler, up)
        })
    }

    /// As [`ReconcilerProcess::start`], without waiting for it to be ready.
    pub fn launch(store: &str, extra: &[&str]) -> ReconcilerProcess {
        Self::launch_with_env(store, extra, &[])
    }

    fn launch_with_env(store: &str, extra: &[&str], env: &[(&str, &str)]) -> ReconcilerProcess {
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
        for (key, value) in env {
            process = process.env(key, value);
        }
        process.spawn().expect("start gateway-reconciler");
        ReconcilerProcess { process, http, log }
    }

    /// Starts the process (again) and waits for `/readyz`.
    pub fn spawn(&mut self) {
        self.process.spawn().expect("start gateway-reconciler");
        let up = wait_up(&mut self.process, self.http, "/readyz", true);
        if let Err(NotUp::PortTaken(why) | NotUp::Failed(why)) = up {
            panic!("gateway-reconciler {why}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn exiting(script: &str) -> Process {
        let log = std::env::temp_dir().join(format!(
            "gantry-services-{}-{}",
            std::process::id(),
            script.len()
        ));
        let _ = std::fs::remove_file(&log);
        let mut process = Process::new("sh", vec!["-c".into(), script.into()]).log_to(&log);
        process.spawn().expect("spawn sh");
        process
    }

    #[test]
    fn a_process_that_exits_fails_the_wait_at_once_saying_whether_a_port_was_taken() {
        let started = Instant::now();
        let mut taken = exiting("echo 'cannot listen: Address already in use' >&2; exit 1");
        let port = free_port();
        assert!(matches!(wait_up(&mut taken, port, "/readyz", true), Err(NotUp::PortTaken(_))));
        let mut broken = exiting("echo 'the database is corrupt' >&2; exit 2");
        match wait_up(&mut broken, port, "/readyz", true) {
            Err(NotUp::Failed(why)) => assert!(why.contains("the database is corrupt"), "{why}"),
            _ => panic!("a failure other than a taken port"),
        }
        // Both ended long before START: the wait watched the process.
        assert!(started.elapsed() < START / 2);
    }

    #[test]
    fn a_taken_port_is_retried_on_fresh_ports_and_anything_else_is_not() {
        let mut attempts = 0;
        let started = with_fresh_ports("test", || {
            attempts += 1;
            let up = if attempts < PORT_ATTEMPTS {
                Err(NotUp::PortTaken("taken".into()))
            } else {
                Ok(())
            };
            (attempts, up)
        });
        assert_eq!(started, PORT_ATTEMPTS);
        let calls = std::cell::Cell::new(0);
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_fresh_ports("test", || {
                calls.set(calls.get() + 1);
                ((), Err(NotUp::Failed("boom".into())))
            })
        }));
        assert_eq!(calls.get(), 1, "a failure that is not a taken port was retried");
        assert!(failed.is_err());
    }
}
