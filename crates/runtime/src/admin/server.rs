//! The admin listener's connections, bounded so that a flood of idle or
//! slow connections cannot starve the kubelet's probes or the scraper:
//!
//! - a connection must send a complete request head within
//!   [`AdminLimits::header_timeout`], or it is closed (hyper's header read
//!   timeout, which starts when the connection is accepted);
//! - at most [`AdminLimits::max_connections`] are open; at the limit, a new
//!   connection evicts the oldest one that has not yet sent a request (a
//!   probe always gets in), and is itself closed only when every open
//!   connection is serving requests;
//! - a connection lives at most [`AdminLimits::max_age`] (a client that
//!   keeps one open reconnects);
//! - on shutdown, requests in flight finish and connections close.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// How much of the admin listener one client can take.
#[derive(Debug, Clone, Copy)]
pub struct AdminLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub max_age: Duration,
}

/// The admin listener's flags (every service has them).
#[derive(clap::Args, Debug, Clone)]
pub struct AdminArgs {
    /// Connections open at once on the admin (HTTP) port; at the limit a
    /// new one evicts the oldest that has not sent a request.
    #[arg(long, env = "GANTRY_ADMIN_MAX_CONNECTIONS", default_value_t = 512)]
    pub admin_max_connections: usize,

    /// An admin connection must send its request head within this.
    #[arg(long, env = "GANTRY_ADMIN_HEADER_TIMEOUT", default_value = "10s", value_parser = gantry_core::duration::parse_duration)]
    pub admin_header_timeout: Duration,

    /// An admin connection is closed after this long (its client
    /// reconnects).
    #[arg(long, env = "GANTRY_ADMIN_MAX_CONNECTION_AGE", default_value = "5m", value_parser = gantry_core::duration::parse_duration)]
    pub admin_max_connection_age: Duration,
}

impl AdminArgs {
    pub fn limits(&self) -> AdminLimits {
        AdminLimits {
            max_connections: self.admin_max_connections.max(1),
            header_timeout: self.admin_header_timeout,
            max_age: self.admin_max_connection_age,
        }
    }
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            max_age: Duration::from_secs(300),
        }
    }
}

/// One open connection, as the accept loop sees it.
struct Open {
    /// Set once it has sent a request.
    served: Arc<AtomicBool>,
    /// Closes it (dropped when the connection ends).
    evict: oneshot::Sender<()>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Registry {
    open: Mutex<VecDeque<Open>>,
}

impl Registry {
    /// Room for one more: `true` when under `max` (after forgetting ended
    /// connections), or when the oldest connection that never sent a
    /// request was evicted for it.
    fn make_room(&self, max: usize) -> bool {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        open.retain(|c| !c.evict.is_closed());
        if open.len() < max {
            return true;
        }
        match open.iter().position(|c| !c.served.load(Ordering::Relaxed)) {
            Some(i) => {
                if let Some(oldest) = open.remove(i) {
                    let _ = oldest.evict.send(());
                }
                true
            }
            None => false,
        }
    }

    fn add(&self, served: Arc<AtomicBool>, evict: oneshot::Sender<()>) {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        open.push_back(Open { served, evict });
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: AdminLimits,
    shutdown: impl Future<Output = ()>,
) {
    let registry = Registry::default();
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "admin listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if !registry.make_room(limits.max_connections) {
            continue;
        }
        let _ = tcp.set_nodelay(true);
        let served = Arc::new(AtomicBool::new(false));
        let (evict, evicted) = oneshot::channel();
        registry.add(served.clone(), evict);
        let service = {
            let router = router.clone();
            tower::ServiceExt::map_request(router, move |request| {
                served.store(true, Ordering::Relaxed);
                request
            })
        };
        let connection = graceful
            .watch(builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service)));
        let max_age = limits.max_age;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::timeout(max_age, connection) => {}
                _ = evicted => {}
            }
        });
    }
    // Requests in flight finish; idle connections close now.
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}
