//! gantry-kube-fake: an HTTP server that speaks enough of the Kubernetes
//! API for gantry's tests and benchmarks, so that the real kube-rs client
//! (and the real kubectl) can be exercised without a cluster.
//!
//! ```text
//! kube-rs / kubectl ──HTTP──► server (routing, discovery, faults, request log)
//!                               │
//!                               ▼
//!                     state (objects, resourceVersion, events, managed fields,
//!                            finalizers, garbage collection)
//!                               ▲
//!              rollout simulator (Deployment status after a delay, or stalled;
//!              an address on every Ingress, as an ingress controller would)
//! ```
//!
//! In tests: [`KubeFake::start`] on `127.0.0.1:0`, then point a client at
//! [`KubeFake::url`]; inject faults and read the request log through the
//! handle. As a binary: `gantry-kube-fake --listen ADDR --kubeconfig PATH`.

#![forbid(unsafe_code)]

mod collections;
pub mod error;
mod fake;
mod gc;
mod prepare;
pub mod protobuf;
pub mod resources;
mod rollout;
pub use gantry_k8s_schema as schema;
pub mod server;
pub mod ssa;
pub mod state;
pub mod util;
pub mod validation;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use tokio::net::TcpListener;

pub use fake::Fake;
pub use state::{FaultAction, FaultRule, RequestRecord, INGRESS_ADDRESS};

/// Options of a fake API server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Watch events kept for resuming watches; older ones get 410 Gone.
    pub history: usize,
    /// Delay of the simulated Deployment rollouts.
    pub rollout_delay: Duration,
    /// Interval of watch BOOKMARK events.
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            history: 100_000,
            rollout_delay: Duration::from_millis(50),
            bookmark_interval: Duration::from_secs(1),
        }
    }
}

/// A running fake API server.
#[derive(Debug)]
pub struct KubeFake {
    pub addr: SocketAddr,
    pub fake: Arc<Fake>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl KubeFake {
    /// Starts on `127.0.0.1:0` with default options.
    pub async fn start() -> std::io::Result<KubeFake> {
        Self::start_with(Options::default()).await
    }

    /// Starts on `127.0.0.1:0`.
    pub async fn start_with(options: Options) -> std::io::Result<KubeFake> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, fake, serving) = serve(listener, options, async {
            let _ = stopped.await;
        })?;
        let task = tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::warn!(error = %e, "kube-fake stopped with an error");
            }
        });
        Ok(KubeFake { addr, fake, stop: Some(stop), task: Some(task) })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) pointing at this server.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(&self.url())
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.fake.lock().requests.clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.fake.lock().requests.clear();
    }

    /// Injects a fault.
    pub fn inject(&self, rule: FaultRule) {
        self.fake.lock().faults.push(rule);
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.fake.lock().faults.clear();
    }

    /// Ends every open watch stream now.
    pub fn drop_watches(&self) {
        self.fake.watch_epoch.send_modify(|e| *e += 1);
    }

    /// The next `n` watches get a 410 Gone error event.
    pub fn expire_next_watches(&self, n: u32) {
        self.fake.lock().expire_next_watches += n;
    }

    /// Forgets the watch history: any watch from an older resourceVersion
    /// gets 410 Gone.
    pub fn compact(&self) {
        self.fake.lock().compact_all();
    }

    /// Loses every object of `namespace` without a watch event, as a server
    /// restored from an old backup (or restarted empty) would: watchers
    /// keep their caches and learn nothing until they list again.
    pub fn lose_objects(&self, namespace: &str) {
        let mut state = self.fake.lock();
        state.objects.retain(|(_, ns, _), _| ns != namespace);
        state.pending_rollouts.retain(|(_, ns, _), _| ns != namespace);
    }

    /// Sets the delay of simulated rollouts.
    pub fn set_rollout_delay(&self, delay: Duration) {
        self.fake.lock().rollout.delay = delay;
    }

    /// Makes the rollout of `namespace/name` stall (ProgressDeadlineExceeded),
    /// or progress again.
    pub fn set_stalled(&self, namespace: &str, name: &str, stalled: bool) {
        let mut state = self.fake.lock();
        let key = format!("{namespace}/{name}");
        if stalled {
            state.rollout.stalled.insert(key);
        } else {
            state.rollout.stalled.remove(&key);
        }
        let object = ("apps/deployments".to_string(), namespace.to_string(), name.to_string());
        if state.objects.contains_key(&object) {
            state.pending_rollouts.insert(object, tokio::time::Instant::now());
        }
        drop(state);
        self.fake.rollout_wake.notify_one();
    }

    /// Stops serving and waits for the server to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            // A watch opened just before the stop would hold graceful
            // shutdown open forever; a test tool does not wait for it.
            let abort = task.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(5), task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for KubeFake {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A kubeconfig for `url` with one context, `kube-fake`.
pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-fake\n  cluster:\n    server: {url}\ncontexts:\n- name: kube-fake\n  context:\n    cluster: kube-fake\n    user: kube-fake\n    namespace: default\ncurrent-context: kube-fake\nusers:\n- name: kube-fake\n  user:\n    token: kube-fake\n"
    )
}

/// Serves on `listener` until `shutdown`; returns the address, the shared
/// state and the serving future.
pub fn serve(
    listener: TcpListener,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, Arc<Fake>, impl Future<Output = std::io::Result<()>>)> {
    let addr = listener.local_addr()?;
    let fake = Arc::new(Fake::new(options.history, options.bookmark_interval));
    fake.lock().rollout.delay = options.rollout_delay;
    let app = axum::Router::new().fallback({
        let fake = fake.clone();
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let fake = fake.clone();
            async move { server::handle(fake, method, uri, headers, body).await }
        }
    });
    let simulator = tokio::spawn(run_rollouts(fake.clone()));
    let watch_fake = fake.clone();
    let serving = async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                // End the watches, or graceful shutdown would wait for them.
                watch_fake.watch_epoch.send_modify(|e| *e += 1);
            })
            .await;
        simulator.abort();
        result
    };
    Ok((addr, fake, serving))
}

/// The Deployment controller stand-in: when a rollout is due, writes the
/// status a real controller would (complete, or stalled).
async fn run_rollouts(fake: Arc<Fake>) {
    loop {
        let next_due = {
            let mut state = fake.lock();
            let now = tokio::time::Instant::now();
            let due: Vec<_> = state
                .pending_rollouts
                .iter()
                .filter(|(_, t)| **t <= now)
                .map(|(k, _)| k.clone())
                .collect();
            for key in due {
                state.pending_rollouts.remove(&key);
                state.complete_rollout(&key);
            }
            state.pending_rollouts.values().min().copied()
        };
        match next_due {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = fake.rollout_wake.notified() => {}
                }
            }
            None => fake.rollout_wake.notified().await,
        }
    }
}
