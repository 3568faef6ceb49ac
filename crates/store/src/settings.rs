//! What [`crate::serve`] needs besides its listeners, and how flags become
//! it: the tokens and TLS files read, the database opened.

use std::sync::Arc;
use std::time::Duration;

use crate::auth::oidc::{self, OidcSettings};
use crate::auth::service_account::{self, TokenReviewer};
use crate::auth::{Auth, Authenticator, Bindings};
use crate::config::{self, AuthArgs, Config};
use crate::error::ServeError;
use crate::grpc::conn::ConnectionLimits;
use crate::grpc::fairness::FairnessLimits;
use crate::storage::{
    postgres::PostgresStorage, sqlite::SqliteStorage, Retention, Storage, StorageError,
};

/// Everything [`serve`] needs besides its listeners.
#[derive(Debug, Clone)]
pub struct Settings {
    pub storage: Arc<dyn Storage>,
    pub auth: Arc<Auth>,
    pub tls: Option<Tls>,
    pub watch: WatchSettings,
    pub limits: Limits,
    /// How long a thread keeps the CPU awake after the last write's answer
    /// (0: no thread); see [`crate::awake`].
    pub commit_spin: Duration,
}

/// TLS on the gRPC listener.
#[derive(Debug, Clone)]
pub struct Tls {
    /// PEM certificate chain.
    pub cert: Vec<u8>,
    /// PEM private key.
    pub key: Vec<u8>,
    /// PEM CA certificate(s) that client certificates are verified against
    /// (`--client-ca`); clients without a certificate still connect.
    pub client_ca: Option<Vec<u8>>,
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
    /// The admin (HTTP) listener's connections.
    pub admin: gantry_runtime::admin::AdminLimits,
    /// Watch streams one identity may hold open.
    pub watches_per_identity: usize,
    /// Bytes of database pages one identity's watches may hold.
    pub watch_bytes_per_identity: u64,
    /// Seats and queues of the priority levels.
    pub fairness: FairnessLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            streams_per_connection: 1024,
            request_timeout: Duration::from_secs(30),
            connections: ConnectionLimits::default(),
            keepalive: (Duration::from_secs(30), Duration::from_secs(10)),
            admin: gantry_runtime::admin::AdminLimits::default(),
            watches_per_identity: 2048,
            watch_bytes_per_identity: 64 << 20,
            fairness: FairnessLimits::default(),
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
    /// The longest a watch holds an event back to send it together with
    /// those committed right after it (0: each at once); see
    /// [`crate::watch::stream`].
    pub coalesce: Duration,
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
            coalesce: crate::watch::stream::DEFAULT_COALESCE,
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
    let mut auth = auth_from_config(&config.auth).await?;
    if config.tls.client_ca.is_some() {
        auth = auth.with_client_certificates();
    }
    let tls = match (&config.tls.tls_cert, &config.tls.tls_key) {
        (Some(cert), Some(key)) => Some(Tls {
            cert: read("TLS certificate", cert)?,
            key: read("TLS key", key)?,
            client_ca: config.tls.client_ca.as_deref().map(|p| read("client CA", p)).transpose()?,
        }),
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
        coalesce: config.watch.watch_coalesce,
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
        admin: config.admin.limits(),
        watches_per_identity: config.limits.max_watches_per_identity.max(1),
        watch_bytes_per_identity: config.limits.max_watch_bytes_per_identity,
        fairness: FairnessLimits {
            editor_seats: config.limits.fair_editor_concurrency.max(1),
            viewer_seats: config.limits.fair_viewer_concurrency.max(1),
            queue_length: config.limits.fair_queue_length,
            queue_wait: config.limits.fair_queue_wait,
            viewer_bytes_per_second: config.limits.fair_viewer_bytes_per_second,
        },
    };
    let commit_spin = config.commit_spin;
    Ok(Settings { storage, auth: Arc::new(auth), tls, watch, limits, commit_spin })
}

/// The authenticators and role bindings the flags name.
async fn auth_from_config(config: &AuthArgs) -> Result<Auth, ServeError> {
    let tokens = match (&config.tokens_file, config.allow_unauthenticated) {
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
        (None, false) if config.service_account_tokens || config.oidc_issuer_url.is_some() => {
            Authenticator::Tokens(Vec::new())
        }
        (None, false) => return Err(ServeError::NoAuthentication),
    };
    let mut auth = Auth::with_path(tokens, config.tokens_file.clone());
    if let Some(path) = &config.role_bindings_file {
        let bindings =
            Bindings::parse(&String::from_utf8_lossy(&read("role bindings file", path)?))?;
        auth = auth.with_bindings(bindings, Some(path.clone()));
    }
    if config.service_account_tokens {
        let client =
            kube::Client::try_default().await.map_err(|e| ServeError::Kube(e.to_string()))?;
        let audience = config.service_account_audience.clone();
        auth = auth.with_issuer(service_account::issuer(client.clone(), audience.clone()));
        if config.service_account_token_review {
            auth = auth.with_token_review(TokenReviewer::new(client, audience.clone()));
        }
        tracing::info!(
            audience,
            token_review = config.service_account_token_review,
            "service-account tokens accepted"
        );
    }
    if let Some(issuer_url) = &config.oidc_issuer_url {
        let ca_pem = config.oidc_ca_file.as_deref().map(|p| read("OIDC CA file", p)).transpose()?;
        let settings = OidcSettings {
            issuer_url: issuer_url.clone(),
            client_id: config.oidc_client_id.clone().unwrap_or_default(),
            ca_pem,
            username_claim: config.oidc_username_claim.clone(),
            username_prefix: config.oidc_username_prefix.clone(),
            groups_claim: config.oidc_groups_claim.clone(),
            groups_prefix: config.oidc_groups_prefix.clone(),
        };
        auth = auth.with_issuer(oidc::issuer(&settings).map_err(ServeError::Oidc)?);
        tracing::info!(issuer = issuer_url, "OIDC tokens accepted");
    }
    if (config.service_account_tokens || config.oidc_issuer_url.is_some())
        && config.role_bindings_file.is_none()
    {
        tracing::warn!("tokens from issuers are accepted but no --role-bindings-file gives any identity a role: every one is refused");
    }
    Ok(auth)
}
