//! Connection limits of the gRPC listener: how many connections may be
//! open, how long one may take to send its first request, how long one may
//! stay open with no call in flight, and what accepting does when the
//! process is out of file descriptors.
//!
//! ```text
//! accept ─► over --max-connections? close at once (counted)
//!        ─► EMFILE/ENFILE? back off 10 ms .. 1 s (no spinning)
//!        ─► Tracked stream: closed when no request arrived within
//!           --handshake-timeout, or no call was in flight for --idle-timeout
//! ```
//!
//! Calls are counted per connection by [`ActiveCallsLayer`], which finds
//! the connection by the peer address tonic puts in every request.

use std::collections::HashMap;
use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::holding::Holding;
use super::rate_limit::RateLimit;
use crate::metrics::ConnectionMetrics;

/// Limits on the gRPC listener's connections.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectionLimits {
    /// Calls being answered at once per connection (a watch: until its
    /// stream starts); more are refused at once with RESOURCE_EXHAUSTED.
    pub calls_per_connection: usize,
    /// Connections open at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// A connection must send its first request within this time.
    pub handshake_timeout: Duration,
    /// A connection with no call in flight for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            calls_per_connection: 256,
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// File descriptors kept back from connections for the database pool, the
/// listeners, files and the HTTP endpoints.
pub const RESERVED_FILES: u64 = 64;

/// The soft open-file limit of this process (Linux: `/proc/self/limits`).
pub fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

impl ConnectionLimits {
    /// These limits with `max_connections` lowered to what an open-file
    /// limit of `files` allows after [`RESERVED_FILES`]: accepting until the
    /// process runs out of descriptors would starve the database pool
    /// ("unable to open database file") and answer nobody. The second value
    /// says what was lowered, for the log.
    pub fn within_open_files(mut self, files: Option<u64>) -> (Self, Option<String>) {
        let Some(files) = files else { return (self, None) };
        let allowed =
            usize::try_from(files.saturating_sub(RESERVED_FILES).max(1)).unwrap_or(usize::MAX);
        if self.max_connections <= allowed {
            return (self, None);
        }
        let note = format!(
            "--max-connections {} is more than the open-file limit ({files}) allows; serving at most {allowed} connections (raise the limit: ulimit -n, or LimitNOFILE)",
            self.max_connections
        );
        self.max_connections = allowed;
        (self, Some(note))
    }
}

/// One open connection's state shared with the calls on it.
#[derive(Debug)]
struct Connection {
    /// Calls in flight (a watch: until its stream ends).
    active: AtomicUsize,
    /// Calls not answered yet (a watch: until its stream starts).
    answering: AtomicUsize,
    /// Milliseconds after `epoch` when the last call ended; `u64::MAX`
    /// while no request has arrived yet.
    idle_since_ms: AtomicU64,
}

/// The open connections, by peer address.
#[derive(Debug)]
pub struct Connections {
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    open: Mutex<HashMap<SocketAddr, Arc<Connection>>>,
    epoch: Instant,
    refusals_logged: RateLimit,
}

impl Connections {
    pub fn new(limits: ConnectionLimits, metrics: ConnectionMetrics) -> Arc<Self> {
        Arc::new(Self {
            limits,
            metrics,
            open: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            refusals_logged: RateLimit::new(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Number of open connections.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers an accepted connection, or `None` when the limit is reached.
    fn admit(self: &Arc<Self>, tcp: TcpStream, peer: SocketAddr) -> Option<Tracked> {
        let connection = {
            let mut open = self.lock();
            if open.len() >= self.limits.max_connections {
                return None;
            }
            let connection = Arc::new(Connection {
                active: AtomicUsize::new(0),
                answering: AtomicUsize::new(0),
                idle_since_ms: AtomicU64::new(u64::MAX),
            });
            open.insert(peer, connection.clone());
            connection
        };
        self.metrics.open.inc();
        let _ = tcp.set_nodelay(true);
        let info = TcpConnectInfo { local_addr: tcp.local_addr().ok(), remote_addr: Some(peer) };
        let accepted = Instant::now();
        Some(Tracked {
            tcp,
            info,
            peer,
            connection,
            connections: self.clone(),
            accepted,
            timer: Box::pin(tokio::time::sleep_until(accepted + self.limits.handshake_timeout)),
        })
    }

    /// Admits a call on the connection of `peer`: `Err` when the
    /// connection already has its limit of calls being answered; otherwise
    /// guards that mark the call answered and ended when dropped.
    fn call_started(
        self: &Arc<Self>,
        peer: Option<SocketAddr>,
    ) -> Result<Option<(CallGuard, Answering)>, ()> {
        let Some(connection) = peer.and_then(|peer| self.lock().get(&peer).cloned()) else {
            return Ok(None);
        };
        let limit = self.limits.calls_per_connection;
        let admitted = connection
            .answering
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1))
            .is_ok();
        if !admitted {
            return Err(());
        }
        connection.active.fetch_add(1, Ordering::SeqCst);
        let answering = Answering(connection.clone());
        Ok(Some((CallGuard { connection, connections: self.clone() }, answering)))
    }
}

/// A call on a tracked connection not answered yet.
#[derive(Debug)]
struct Answering(Arc<Connection>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A call in flight on a tracked connection.
#[derive(Debug)]
pub struct CallGuard {
    connection: Arc<Connection>,
    connections: Arc<Connections>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.connection.idle_since_ms.store(self.connections.now_ms(), Ordering::SeqCst);
        self.connection.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accept errors that mean the process or system is out of a resource:
/// retrying at once would spin.
fn out_of_resources(e: &io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// The accepted connections of `listener` within `connections`' limits.
/// The stream never ends: accept errors are logged and retried, with a
/// growing pause when out of file descriptors.
pub fn incoming(
    listener: TcpListener,
    connections: Arc<Connections>,
) -> impl Stream<Item = Result<Tracked, io::Error>> {
    const FIRST_PAUSE: Duration = Duration::from_millis(10);
    let state = (listener, connections, FIRST_PAUSE);
    futures_util::stream::unfold(state, |(listener, connections, mut pause)| async move {
        loop {
            match listener.accept().await {
                Ok((tcp, peer)) => {
                    pause = FIRST_PAUSE;
                    if let Some(tracked) = connections.admit(tcp, peer) {
                        return Some((Ok(tracked), (listener, connections, pause)));
                    }
                    connections.metrics.refused.inc();
                    if let Some(suppressed) = connections.refusals_logged.admit() {
                        tracing::warn!(
                            %peer,
                            limit = connections.limits.max_connections,
                            suppressed,
                            "connection closed: the store holds --max-connections connections; raise it or find the client holding them"
                        );
                    }
                }
                Err(e) if out_of_resources(&e) => {
                    connections.metrics.accept_errors.inc();
                    if let Some(suppressed) = connections.refusals_logged.admit() {
                        tracing::error!(error = %e, retry_in = ?pause, open = connections.len(), suppressed, "cannot accept connections: out of file descriptors; lower --max-connections or raise the process's open-file limit");
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                // A connection reset before it was accepted, and the like.
                Err(e) => {
                    connections.metrics.accept_errors.inc();
                    tracing::debug!(error = %e, "accept failed");
                }
            }
        }
    })
}

/// An accepted connection that closes itself when it sends no request in
/// time or stays idle too long.
#[derive(Debug)]
pub struct Tracked {
    tcp: TcpStream,
    info: TcpConnectInfo,
    peer: SocketAddr,
    connection: Arc<Connection>,
    connections: Arc<Connections>,
    accepted: Instant,
    timer: Pin<Box<Sleep>>,
}

impl Tracked {
    /// When this connection is due to close if nothing changes, and why.
    fn deadline(&self) -> (Instant, &'static str) {
        let limits = &self.connections.limits;
        // A call in flight first: a connection whose first call is still
        // running (a watch) has sent its request and is not idle.
        if self.connection.active.load(Ordering::SeqCst) > 0 {
            // Checked again after a while: the call may have ended.
            return (Instant::now() + limits.idle_timeout, "");
        }
        let idle_since = self.connection.idle_since_ms.load(Ordering::SeqCst);
        if idle_since == u64::MAX {
            return (self.accepted + limits.handshake_timeout, "handshake");
        }
        let since = self.connections.epoch + Duration::from_millis(idle_since);
        (since + limits.idle_timeout, "idle")
    }

    /// Ready with an error once the connection is due to close.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let (deadline, why) = self.deadline();
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The timer fired; close only if the deadline still holds.
            let (now_due, why_now) = self.deadline();
            if now_due <= Instant::now() && !why_now.is_empty() && why_now == why {
                let metrics = &self.connections.metrics;
                match why {
                    "handshake" => metrics.handshake_timeouts.inc(),
                    _ => metrics.idle_closed.inc(),
                };
                tracing::debug!(peer = %self.peer, reason = why, "closing connection");
                let message = match why {
                    "handshake" => "no request within --handshake-timeout",
                    _ => "no call in flight for --idle-timeout",
                };
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, message));
            }
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut open = self.connections.lock();
        if open.get(&self.peer).is_some_and(|c| Arc::ptr_eq(c, &self.connection)) {
            open.remove(&self.peer);
        }
        drop(open);
        self.connections.metrics.open.dec();
    }
}

impl Connected for Tracked {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Poll::Ready(result) = Pin::new(&mut self.tcp).poll_read(cx, buf) {
            return Poll::Ready(result);
        }
        self.poll_expired(cx).map(Err)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// The caller's address, as tonic records it on each request (over TLS
/// or not).
pub fn peer_of(extensions: &axum::http::Extensions) -> Option<std::net::SocketAddr> {
    extensions.get::<TcpConnectInfo>().and_then(|i| i.remote_addr).or_else(|| {
        extensions
            .get::<tonic::transport::server::TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|i| i.get_ref().remote_addr)
    })
}

/// Tower layer that counts each call on its connection (see
/// [`Connections::call_started`]) until its response body ends.
#[derive(Debug, Clone)]
pub struct ActiveCallsLayer {
    connections: Arc<Connections>,
}

impl ActiveCallsLayer {
    pub fn new(connections: Arc<Connections>) -> Self {
        Self { connections }
    }
}

impl<S> tower::Layer<S> for ActiveCallsLayer {
    type Service = ActiveCalls<S>;

    fn layer(&self, inner: S) -> ActiveCalls<S> {
        ActiveCalls { inner, connections: self.connections.clone() }
    }
}

/// See [`ActiveCallsLayer`].
#[derive(Debug, Clone)]
pub struct ActiveCalls<S> {
    inner: S,
    connections: Arc<Connections>,
}

type ResponseFuture<E> = Pin<
    Box<
        dyn std::future::Future<Output = Result<axum::http::Response<tonic::body::Body>, E>> + Send,
    >,
>;

impl<S, B> tower::Service<axum::http::Request<B>> for ActiveCalls<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = axum::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let peer = peer_of(request.extensions());
        let arrived = std::time::Instant::now();
        let Ok(guards) = self.connections.call_started(peer) else {
            // Refused at once, not queued: the client backs off or spreads
            // its calls over connections.
            let metrics = &self.connections.metrics;
            metrics.shed.inc();
            let status = tonic::Status::resource_exhausted(format!(
                "{} calls are already being answered on this connection (--max-calls-per-connection); retry with backoff or use more connections",
                self.connections.limits.calls_per_connection
            ));
            let response = status.into_http::<tonic::body::Body>();
            metrics.shed_seconds.observe(arrived.elapsed().as_secs_f64());
            return Box::pin(std::future::ready(Ok(response)));
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let (guard, answering) = guards.unzip();
            let response = response.await?;
            drop(answering);
            Ok(response.map(|body| match guard {
                Some(guard) => Holding::body(body, guard),
                None => body,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_stay_within_the_open_file_limit() {
        let limits = ConnectionLimits { max_connections: 4096, ..ConnectionLimits::default() };
        let (lowered, note) = limits.clone().within_open_files(Some(1024));
        assert_eq!(lowered.max_connections, 960);
        assert!(note.unwrap().contains("open-file limit (1024)"));
        assert_eq!(limits.clone().within_open_files(Some(1 << 20)), (limits.clone(), None));
        assert_eq!(limits.clone().within_open_files(None), (limits.clone(), None));
        assert_eq!(limits.within_open_files(Some(10)).0.max_connections, 1);
        assert!(open_file_limit().is_some_and(|n| n > 0));
    }
}
