//! gateway-store: the desired-state store for Gateways.
//!
//! Layers, top to bottom (each imports only the ones under it):
//!
//! ```text
//! server, settings   wiring: parts started in order, stopped in reverse
//! grpc/              the edge: one module per RPC, observe (span,
//!                    timeout, metrics, refusal log), connections, page
//!                    tokens, errors → tonic::Status
//! auth/              who is calling: tokens file, service-account JWTs
//!                    (TokenReview), role bindings
//! writer             group commit: many writes, one transaction, on a
//!                    thread of its own (lane)
//! background, lane,  threads of their own: the writer's, the viewers'
//! awake              lists at a lower CPU priority, and one keeping the
//!                    CPU awake while writes wait
//! watch/             hub (byte-bounded cache), stream (one per subscriber,
//!                    ends with a WatchEnd), tailer, compactor
//! storage/           the Storage trait; SQLite and PostgreSQL
//! ```
//!
//! A write: grpc (request shape) ─► writer.mutate(name, rule) ─► storage
//! [tx: lock row, gantry-core rule, revision + 1, row + event row, commit]
//! ─► hub (watchers) ─► answer. HTTP: /healthz, /readyz (database ping),
//! /metrics.
//!
//! [`serve`] takes its listeners and a shutdown future, so tests bind port 0
//! and stop the server cleanly; [`run`] is what the binary calls.

#![forbid(unsafe_code)]

pub mod auth;
pub mod awake;
pub mod background;
pub mod config;
mod error;
pub mod grpc;
pub mod http;
pub mod lane;
pub mod metrics;
mod server;
pub mod settings;
pub mod storage;
pub mod watch;
pub mod writer;

pub use error::ServeError;
pub use server::{serve, MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES};
pub use settings::{open_storage, settings_from_config, Limits, Settings, Tls, WatchSettings};

use std::future::Future;

use tokio::net::TcpListener;

use crate::config::Config;

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
