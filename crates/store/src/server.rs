//! [`serve`]: the store's parts started in order (watch cache, writer,
//! tailer, compactor, gRPC edge, HTTP endpoints) and stopped in the reverse
//! order on shutdown: in-flight requests drained, queued writes committed,
//! background tasks ended.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::gateway_service_server::GatewayServiceServer;
use gantry_runtime::Shutdown;
use tokio::net::TcpListener;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tower::Layer;

use crate::auth;
use crate::awake::{self, Awake};
use crate::background::{self, Background};
use crate::error::ServeError;
use crate::grpc::conn::{self, ActiveCallsLayer, Connections};
use crate::grpc::fairness::Fairness;
use crate::grpc::observe::{Observe, ObserveLayer};
use crate::grpc::watch_quota::WatchQuota;
use crate::grpc::{errors, GatewayApi};
use crate::http::StoreAdmin;
use crate::lane::{Lane, Priority};
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::watch::hub::{HubLimits, WatchHub};
use crate::watch::stream::WatchContext;
use crate::watch::{compactor, tailer};
use crate::writer::{self, Writer};

/// Largest request the gRPC API accepts.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Largest response the gRPC API sends (pages are bounded well below).
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The parts under the gRPC edge. Their tasks hold the shutdown's drain
/// guards: `serve` waits for them with `Shutdown::drained`.
struct Core {
    hub: Arc<WatchHub>,
    writer: Writer,
    watch: WatchContext,
}

impl Core {
    async fn start(
        settings: &Settings,
        metrics: &Metrics,
        shutdown: &Shutdown,
    ) -> Result<Core, ServeError> {
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
        let awake = Awake::start(settings.commit_spin)
            .map_err(|source| ServeError::Thread { thread: awake::THREAD, source })?;
        let (writer, writer_task) = Writer::new(
            settings.storage.for_writer(),
            hub.clone(),
            metrics.write_batches_failed.clone(),
            awake,
        );
        let lane = Lane::start(writer::THREAD, Priority::Normal)
            .map_err(|source| ServeError::Thread { thread: writer::THREAD, source })?;
        let writes = lane.spawn(writer_task);
        // The lane lives until the writer has committed what was queued
        // when the store began to stop.
        shutdown.spawn(async move {
            let _ = writes.await;
            drop(lane);
        });
        let storage = settings.storage.clone();
        shutdown.spawn(tailer::run(
            storage.clone(),
            hub.clone(),
            settings.watch.poll_interval,
            shutdown.clone(),
        ));
        shutdown.spawn(compactor::run(
            storage.clone(),
            settings.watch.retention,
            settings.watch.compaction_interval,
            shutdown.clone(),
        ));
        let watch = WatchContext {
            storage,
            hub: hub.clone(),
            bookmark_interval: settings.watch.bookmark_interval,
            coalesce: settings.watch.coalesce,
            shutdown: shutdown.clone(),
            too_slow: metrics.watchers_too_slow.clone(),
        };
        Ok(Core { hub, writer, watch })
    }
}

/// Serves the gRPC API on `grpc` and the HTTP endpoints on `http` until
/// `shutdown` completes, then drains in-flight requests.
pub async fn serve(
    settings: Settings,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let shutdown = Shutdown::on(shutdown);
    let metrics = Arc::new(Metrics::default());
    let core = Core::start(&settings, &metrics, &shutdown).await?;
    tokio::spawn(auth::reload_on_change(settings.auth.clone(), shutdown.clone()));
    tokio::spawn(fetch_issuer_keys(settings.auth.clone()));
    let api = GatewayApi::new(
        core.writer,
        settings.storage.clone(),
        core.watch,
        settings.auth.clone(),
        WatchQuota::new(
            settings.limits.watches_per_identity,
            settings.limits.watch_bytes_per_identity,
            metrics.watch_page_bytes.clone(),
        ),
        Arc::new(Fairness::new(settings.limits.fairness, &metrics.fairness)),
        Arc::new(
            Background::start(&settings.storage)
                .map_err(|source| ServeError::Thread { thread: background::THREAD, source })?,
        ),
    );
    let observe =
        ObserveLayer::new(settings.auth.clone(), metrics.clone(), settings.limits.request_timeout);

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<GatewayServiceServer<GatewayApi>>().await;
    let limits = &settings.limits;
    let (connection_limits, lowered) =
        limits.connections.clone().within_open_files(conn::open_file_limit());
    if let Some(note) = lowered {
        tracing::warn!("{note}");
    }
    let connections = Connections::new(connection_limits, metrics.connections.clone());
    let (grpc_addr, http_addr) = (grpc.local_addr().ok(), http.local_addr().ok());
    let grpc_stop = shutdown.wait();
    let api = observe.layer(
        GatewayServiceServer::new(api)
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_BYTES)
            // gzip-compressed requests are read (the limit above bounds the
            // message decompressed), and a client that accepts gzip gets
            // its answers compressed.
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
            .send_compressed(tonic::codec::CompressionEncoding::Gzip),
    );
    let grpc_server = grpc_server(&settings, api, health_service, grpc, connections, async move {
        grpc_stop.await;
        health_reporter.set_not_serving::<GatewayServiceServer<GatewayApi>>().await;
        tracing::info!("shutting down: draining in-flight requests");
    })?;

    let http_server = gantry_runtime::admin::serve(
        http,
        gantry_runtime::admin::router(Arc::new(StoreAdmin {
            storage: settings.storage.clone(),
            metrics,
            hub: core.hub.clone(),
        })),
        settings.limits.admin,
        shutdown.wait(),
    );
    tracing::info!(grpc = ?grpc_addr, http = ?http_addr, tls = settings.tls.is_some(), "gateway-store serving");

    let (grpc_result, ()) = tokio::join!(grpc_server, http_server);
    // The service (and with it the last writer handle) is gone: the writer
    // finishes what was queued, and the tailer and compactor stop.
    shutdown.drained().await;
    grpc_result?;
    tracing::info!("gateway-store stopped");
    Ok(())
}

/// The gRPC server on `listener` until `stop`: health, reflection (v1 and
/// v1alpha) and the API, with the limits, TLS and the layers every call
/// goes through.
fn grpc_server(
    settings: &Settings,
    api: Observe<GatewayServiceServer<GatewayApi>>,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    listener: TcpListener,
    connections: Arc<Connections>,
    stop: impl Future<Output = ()> + Send,
) -> Result<impl Future<Output = Result<(), tonic::transport::Error>>, ServeError> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(gantry_api::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // The error details the store sends (google.rpc.BadRequest,
        // ErrorInfo, ...), so that grpcurl and grpcui decode them.
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    // Older tools (grpcurl before 1.9) only speak the v1alpha protocol.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(gantry_api::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let limits = &settings.limits;
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
    if let Some(tls) = &settings.tls {
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert, &tls.key));
        if let Some(ca) = &tls.client_ca {
            config = config
                .client_ca_root(tonic::transport::Certificate::from_pem(ca))
                .client_auth_optional(true);
        }
        builder = builder.tls_config(config)?;
    }
    let router = builder
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(api);
    // Within the connection limits, with TCP_NODELAY on every accepted
    // connection: a reply of several KB is written in more than one
    // segment, and Nagle's algorithm would hold the last one until the
    // client's delayed ACK (about 40 ms).
    Ok(router.serve_with_incoming_shutdown(conn::incoming(listener, connections), stop))
}

/// Fetches every issuer's keys once at start, so that a misconfiguration
/// is in the log before the first caller meets it.
async fn fetch_issuer_keys(auth: Arc<auth::Auth>) {
    for issuer in auth.issuers() {
        if let Err(error) = issuer.refresh().await {
            tracing::warn!(authenticator = issuer.authenticator, %error, "cannot fetch the issuer's keys yet; retried on the first token");
        }
    }
}
