//! gateway-store: the desired-state store for Gateways.
//!
//! ```text
//! gRPC (tonic) ─► auth (bearer token → role) ─► service (request shape)
//!             ─► storage.mutate(name, rule) ─► [tx: lock row, gantry-core rule,
//!                 revision + 1, row + event row, commit] ─► answer
//! HTTP ─► /healthz, /readyz (database ping), /metrics
//! ```
//!
//! [`serve`] takes its listeners and a shutdown future, so tests bind port 0
//! and stop the server cleanly; [`run`] is what the binary calls.

#![forbid(unsafe_code)]

pub mod auth;
pub mod background;
pub mod config;
pub mod conn;
pub mod errors;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod service;
pub mod storage;
pub mod watch;
pub mod writer;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::gateway_service_server::GatewayServiceServer;
use tokio::net::TcpListener;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::auth::{Auth, Authenticator};
use crate::config::Config;
use crate::conn::{ActiveCallsLayer, ConnectionLimits, Connections};
use crate::hub::{HubLimits, WatchHub};
use crate::metrics::Metrics;
use crate::service::GatewayApi;
use crate::storage::{
    postgres::PostgresStorage, sqlite::SqliteStorage, Retention, Storage, StorageError,
};
use crate::watch::WatchContext;
use crate::writer::Writer;

/// Largest request the gRPC API accepts.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Largest response the gRPC API sends (pages are bounded well below).
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Why the store could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read {what} {path}: {source}")]
    ReadFile { what: &'static str, path: String, source: std::io::Error },
    #[error(transparent)]
    Tokens(#[from] auth::TokensFileError),
    #[error(
        "no --tokens-file given: refusing to serve without authentication; pass --tokens-file, or --allow-unauthenticated for local development"
    )]
    NoAuthentication,
    #[error("cannot open the database: {0}")]
    Storage(#[from] StorageError),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
}

/// Everything [`serve`] needs besides its listeners.
#[derive(Debug, Clone)]
pub struct Settings {
    pub storage: Arc<dyn Storage>,
    pub auth: Arc<Auth>,
    /// PEM certificate chain and key.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    pub watch: WatchSettings,
    pub limits: Limits,
}

/// What one client can take of the server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// HTTP/2 streams per connection.
    pub streams_per_connection: u32,
    /// Longest a call may take to answer.
    pub request_timeout: Duration,
    /// Connections: how many, how many calls each, and how long they may
    /// wait or idle.
    pub connections: ConnectionLimits,
    /// HTTP/2 keepalive ping interval and the wait for its answer.
    pub keepalive: (Duration, Duration),
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            streams_per_connection: 1024,
            request_timeout: Duration::from_secs(30),
            connections: ConnectionLimits::default(),
            keepalive: (Duration::from_secs(30), Duration::from_secs(10)),
        }
    }
}

/// Watch cache, event history and bookmark settings.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// Events kept in memory for resuming watches without a query.
    pub cache_events: usize,
    /// Encoded bytes of the events kept in memory.
    pub cache_bytes: usize,
    /// How far (in events) a subscriber may fall behind before it is ended.
    pub subscriber_buffer: usize,
    /// How far (in encoded bytes) a subscriber may fall behind before it is
    /// ended.
    pub subscriber_bytes: usize,
    /// Interval of BOOKMARK events for watches that allow them.
    pub bookmark_interval: Duration,
    /// Event history kept in the database.
    pub retention: Retention,
    /// How often old events are compacted.
    pub compaction_interval: Duration,
    /// How often the events table is read even without a notification.
    pub poll_interval: Duration,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            cache_events: 10_000,
            cache_bytes: 64 << 20,
            subscriber_buffer: 4096,
            subscriber_bytes: 16 << 20,
            bookmark_interval: Duration::from_secs(10),
            retention: Retention { max_events: 100_000, max_age_ms: 3_600_000 },
            compaction_interval: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
        }
    }
}

fn read(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|source| ServeError::ReadFile {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// Opens the storage a URL names: `postgres://` or `postgresql://` is
/// PostgreSQL, anything else SQLite.
pub async fn open_storage(url: &str) -> Result<Arc<dyn Storage>, StorageError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStorage::open(url).await?))
    } else {
        Ok(Arc::new(SqliteStorage::open(url).await?))
    }
}

/// Builds [`Settings`] from flags: reads the tokens and TLS files and opens
/// the database (creating the data directory for SQLite).
pub async fn settings_from_config(config: &Config) -> Result<Settings, ServeError> {
    let auth = match (&config.auth.tokens_file, config.auth.allow_unauthenticated) {
        (Some(path), _) => {
            let text = read("tokens file", path)?;
            Authenticator::parse_tokens_file(&String::from_utf8_lossy(&text))?
        }
        (None, true) => {
            tracing::warn!(
                "serving WITHOUT authentication (--allow-unauthenticated): every caller is admin"
            );
            Authenticator::Unauthenticated
        }
        (None, false) => return Err(ServeError::NoAuthentication),
    };
    let tls = match (&config.tls.tls_cert, &config.tls.tls_key) {
        (Some(cert), Some(key)) => Some((read("TLS certificate", cert)?, read("TLS key", key)?)),
        _ => None,
    };
    if config.database_url.is_none() {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServeError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        })?;
    }
    let url = config.effective_database_url();
    let storage = open_storage(&url).await?;
    tracing::info!(database = %config::redact_url(&url), backend = storage.backend(), "database open");
    let watch = WatchSettings {
        cache_events: config.watch.watch_cache_events,
        cache_bytes: config.watch.watch_cache_bytes,
        subscriber_buffer: config.watch.watch_buffer,
        subscriber_bytes: config.watch.watch_buffer_bytes,
        bookmark_interval: config.watch.bookmark_interval,
        retention: Retention {
            max_events: i64::try_from(config.watch.history_max_events).unwrap_or(i64::MAX),
            max_age_ms: i64::try_from(config.watch.history_max_age.as_millis()).unwrap_or(i64::MAX),
        },
        compaction_interval: config.watch.compaction_interval,
        poll_interval: WatchSettings::default().poll_interval,
    };
    let limits = Limits {
        streams_per_connection: config.limits.max_streams_per_connection.max(1),
        request_timeout: config.limits.request_timeout,
        connections: ConnectionLimits {
            calls_per_connection: config.limits.max_calls_per_connection.max(1),
            max_connections: config.limits.max_connections.max(1),
            handshake_timeout: config.limits.handshake_timeout,
            idle_timeout: config.limits.idle_timeout,
        },
        keepalive: (config.limits.keepalive_interval, config.limits.keepalive_timeout),
    };
    let auth = Auth::with_path(auth, config.auth.tokens_file.clone());
    Ok(Settings { storage, auth: Arc::new(auth), tls, watch, limits })
}

/// Binds the configured addresses and serves until `shutdown` completes.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let settings = settings_from_config(&config).await?;
    let bind = |addr: std::net::SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr: addr.to_string(), source })
    };
    let grpc = bind(config.listen).await?;
    let http = bind(config.http_listen).await?;
    serve(settings, grpc, http, shutdown).await
}

/// Serves the gRPC API on `grpc` and the HTTP endpoints on `http` until
/// `shutdown` completes, then drains in-flight requests.
pub async fn serve(
    settings: Settings,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics = Arc::new(Metrics::default());
    let head = settings.storage.current_revision().await?;
    let hub = Arc::new(WatchHub::new(
        head,
        HubLimits {
            cache_events: settings.watch.cache_events,
            cache_bytes: settings.watch.cache_bytes,
            lag_events: settings.watch.subscriber_buffer,
            lag_bytes: settings.watch.subscriber_bytes,
        },
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (writer, writer_task) =
        Writer::spawn(settings.storage.clone(), hub.clone(), metrics.write_batches_failed.clone());
    let tailer = tokio::spawn(background::run_tailer(
        settings.storage.clone(),
        hub.clone(),
        settings.watch.poll_interval,
        stop_rx.clone(),
    ));
    let compactor = tokio::spawn(background::run_compactor(
        settings.storage.clone(),
        settings.watch.retention,
        settings.watch.compaction_interval,
        stop_rx.clone(),
    ));
    let watch = WatchContext {
        storage: settings.storage.clone(),
        hub: hub.clone(),
        bookmark_interval: settings.watch.bookmark_interval,
        stop: stop_rx.clone(),
        too_slow: metrics.watchers_too_slow.clone(),
    };
    tokio::spawn(auth::reload_on_change(settings.auth.clone(), stop_rx.clone()));
    let api = GatewayApi::new(writer, watch, settings.auth.clone(), metrics.clone())
        .with_request_timeout(settings.limits.request_timeout);

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<GatewayServiceServer<GatewayApi>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(gantry_api::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    // Older tools (grpcurl before 1.9) only speak the v1alpha protocol.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(gantry_api::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let limits = &settings.limits;
    let (connection_limits, lowered) =
        limits.connections.clone().within_open_files(conn::open_file_limit());
    if let Some(note) = lowered {
        tracing::warn!("{note}");
    }
    let connections = Connections::new(connection_limits, metrics.connections.clone());
    let mut builder = Server::builder()
        .max_concurrent_streams(limits.streams_per_connection)
        // The service answers DEADLINE_EXCEEDED at --request-timeout; tonic's
        // own timeout (which answers CANCELLED) is only a backstop.
        .timeout(limits.request_timeout + Duration::from_secs(1))
        .layer(tower::util::MapResponseLayer::new(
            errors::too_large_is_resource_exhausted as fn(_) -> _,
        ))
        .layer(ActiveCallsLayer::new(connections.clone()))
        .http2_keepalive_interval(Some(limits.keepalive.0))
        .http2_keepalive_timeout(Some(limits.keepalive.1));
    if let Some((cert, key)) = &settings.tls {
        builder =
            builder.tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))?;
    }
    let grpc_addr = grpc.local_addr().ok();
    let http_addr = http.local_addr().ok();
    let router = builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(
            GatewayServiceServer::new(api)
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        );

    let http_server = axum::serve(
        axum::serve::ListenerExt::tap_io(http, |tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        http::router(settings.storage.clone(), metrics, hub.clone()),
    )
    .with_graceful_shutdown(stopped(stop_rx.clone()));
    tracing::info!(grpc = ?grpc_addr, http = ?http_addr, tls = settings.tls.is_some(), "gateway-store serving");

    let reporter = health_reporter.clone();
    let grpc_stop = stop_rx.clone();
    // Within the connection limits, with TCP_NODELAY on every accepted
    // connection: a reply of several KB is written in more than one
    // segment, and Nagle's algorithm would hold the last one until the
    // client's delayed ACK (about 40 ms).
    let incoming = conn::incoming(grpc, connections);
    let grpc_server = router.serve_with_incoming_shutdown(incoming, async move {
        stopped(grpc_stop).await;
        reporter.set_not_serving::<GatewayServiceServer<GatewayApi>>().await;
        tracing::info!("shutting down: draining in-flight requests");
    });
    let (grpc_result, http_result) = tokio::join!(grpc_server, http_server);
    // The service (and with it the last writer handle) is gone: the writer
    // finishes what was queued, then the background tasks stop.
    let _ = writer_task.await;
    let _ = tokio::join!(tailer, compactor);
    grpc_result?;
    http_result.map_err(ServeError::Http)?;
    tracing::info!("gateway-store stopped");
    Ok(())
}

/// Installs the tracing subscriber for a binary.
pub fn init_logging(
    args: &config::LogArgs,
) -> Result<gantry_telemetry::Telemetry, gantry_telemetry::TelemetryError> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let style = match args.log_format {
        config::LogFormat::Json => gantry_telemetry::LogStyle::Json,
        config::LogFormat::Pretty => gantry_telemetry::LogStyle::Pretty,
    };
    let otlp = gantry_telemetry::otlp_endpoint(args.otlp_endpoint.as_deref());
    gantry_telemetry::init("gateway-store", filter, style, otlp.as_deref())
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutdown signal received");
}
