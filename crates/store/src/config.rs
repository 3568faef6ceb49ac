//! Command-line flags of gateway-store; every flag also reads an
//! environment variable.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};

/// The desired-state store for Gateways.
#[derive(Parser, Clone)]
#[command(
    name = "gateway-store",
    version,
    about = "gRPC desired-state store for Gateways, on SQLite (default) or PostgreSQL",
    after_help = "Examples:\n  \
        gateway-store --allow-unauthenticated                     # local, SQLite under ./gantry-data\n  \
        gateway-store --tokens-file tokens.csv --database-url postgres://gantry@db/gantry"
)]
pub struct Config {
    /// Address of the gRPC API.
    #[arg(long, env = "GANTRY_STORE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Address of the HTTP endpoints /healthz, /readyz and /metrics.
    #[arg(long, env = "GANTRY_STORE_HTTP_LISTEN", default_value = "127.0.0.1:9090")]
    pub http_listen: SocketAddr,

    /// Directory of the embedded SQLite database (used when no
    /// --database-url is given).
    #[arg(long, env = "GANTRY_DATA_DIR", default_value = "gantry-data")]
    pub data_dir: PathBuf,

    /// Database URL: `postgres://...` or `sqlite://PATH`. Default: a SQLite
    /// file in --data-dir.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// While a write waits for its commit, and for this long after the
    /// last answer, a thread of idle CPU priority spins, so that the
    /// disk's answer and the client's next request find the CPU awake (a
    /// halted CPU is slow to wake in a virtual machine; 250us measured
    /// best). Only for a store with its CPUs to itself: processes of other
    /// cgroups on the same CPU may wait up to a scheduler tick. Never runs
    /// under a CPU quota. 0 (the default) turns it off.
    #[arg(long, env = "GANTRY_COMMIT_SPIN", default_value = "0", value_parser = gantry_core::duration::parse_duration)]
    pub commit_spin: Duration,

    #[command(flatten)]
    pub auth: AuthArgs,

    #[command(flatten)]
    pub tls: TlsArgs,

    #[command(flatten)]
    pub watch: WatchArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub admin: gantry_runtime::admin::AdminArgs,

    #[command(flatten)]
    pub log: gantry_runtime::LogArgs,
}

/// Watch and event-history flags.
#[derive(Args, Clone, Debug)]
pub struct WatchArgs {
    /// Keep at most this many events in the database for resuming watches.
    #[arg(long, env = "GANTRY_HISTORY_MAX_EVENTS", default_value_t = 100_000)]
    pub history_max_events: u64,

    /// Drop events older than this (e.g. 1h, 30m).
    #[arg(long, env = "GANTRY_HISTORY_MAX_AGE", default_value = "1h", value_parser = gantry_core::duration::parse_duration)]
    pub history_max_age: Duration,

    /// How often old events are compacted.
    #[arg(long, env = "GANTRY_COMPACTION_INTERVAL", default_value = "1m", value_parser = gantry_core::duration::parse_duration)]
    pub compaction_interval: Duration,

    /// Events kept in memory so that resuming watches need no query.
    #[arg(long, env = "GANTRY_WATCH_CACHE_EVENTS", default_value_t = 10_000)]
    pub watch_cache_events: usize,

    /// Encoded bytes of the events kept in memory (the newest event is kept
    /// whatever its size).
    #[arg(long, env = "GANTRY_WATCH_CACHE_BYTES", default_value_t = 64 << 20)]
    pub watch_cache_bytes: usize,

    /// How many events a watcher may fall behind before it is ended with
    /// RESOURCE_EXHAUSTED (it then resumes from its last revision).
    #[arg(long, env = "GANTRY_WATCH_BUFFER", default_value_t = 4096)]
    pub watch_buffer: usize,

    /// How many encoded bytes of events a watcher may fall behind before it
    /// is ended with RESOURCE_EXHAUSTED.
    #[arg(long, env = "GANTRY_WATCH_BUFFER_BYTES", default_value_t = 16 << 20)]
    pub watch_buffer_bytes: usize,

    /// Interval of BOOKMARK events for watches that allow them.
    #[arg(long, env = "GANTRY_BOOKMARK_INTERVAL", default_value = "10s", value_parser = gantry_core::duration::parse_period)]
    pub bookmark_interval: Duration,

    /// The longest a watch holds an event back to send it in one HTTP/2
    /// frame with those committed right after it. Only a watch woken again
    /// within this window of its previous wake-up waits (for the rest of
    /// the window); the first event after a quiet window goes out at once.
    /// 0 sends each event as soon as it is committed.
    #[arg(long, env = "GANTRY_WATCH_COALESCE", default_value = "2ms", value_parser = gantry_core::duration::parse_duration)]
    pub watch_coalesce: Duration,
}

/// Authentication flags.
#[derive(Args, Clone, Debug)]
pub struct AuthArgs {
    /// Static tokens file: one `token,subject,role` line per token; roles
    /// viewer, editor, reconciler, admin.
    #[arg(long, env = "GANTRY_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,

    /// Serve without authentication (every caller is admin). Only for local
    /// development; refused together with any authenticator.
    #[arg(
        long,
        env = "GANTRY_ALLOW_UNAUTHENTICATED",
        conflicts_with_all = ["tokens_file", "service_account_tokens", "oidc_issuer_url"]
    )]
    pub allow_unauthenticated: bool,

    /// Accept Kubernetes service-account tokens bound to
    /// --service-account-audience, verified against the keys the API
    /// server publishes (reached by the in-cluster configuration, or
    /// KUBECONFIG). Their role comes from --role-bindings-file.
    #[arg(long, env = "GANTRY_SERVICE_ACCOUNT_TOKENS")]
    pub service_account_tokens: bool,

    /// The audience service-account tokens must be bound to (`kubectl
    /// create token SA --audience gantry`, a projected token's audience).
    #[arg(long, env = "GANTRY_SERVICE_ACCOUNT_AUDIENCE", default_value = "gantry")]
    pub service_account_audience: String,

    /// Also check service-account tokens with the API server
    /// (TokenReview, answers kept 10 s), so that the token of a deleted pod
    /// or account stops working before it expires. Needs the
    /// system:auth-delegator ClusterRole.
    #[arg(long, env = "GANTRY_SERVICE_ACCOUNT_TOKEN_REVIEW", requires = "service_account_tokens")]
    pub service_account_token_review: bool,

    /// Role bindings (YAML): the role of each user, group and service
    /// account (`kind: User|Group|ServiceAccount`); reloaded when it
    /// changes or on SIGHUP. An authenticated identity no binding names is
    /// refused.
    #[arg(long, env = "GANTRY_ROLE_BINDINGS_FILE")]
    pub role_bindings_file: Option<PathBuf>,

    /// Accept OpenID Connect tokens from this issuer (https; its
    /// discovery document and keys are fetched from it), as
    /// kube-apiserver's flag of the same name.
    #[arg(long, env = "GANTRY_OIDC_ISSUER_URL", requires = "oidc_client_id")]
    pub oidc_issuer_url: Option<String>,

    /// The audience OIDC tokens must carry (the client id at the provider).
    #[arg(long, env = "GANTRY_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,

    /// PEM CA certificate(s) of the provider's HTTPS server (default: the
    /// system's roots).
    #[arg(long, env = "GANTRY_OIDC_CA_FILE")]
    pub oidc_ca_file: Option<PathBuf>,

    /// The claim that names the user.
    #[arg(long, env = "GANTRY_OIDC_USERNAME_CLAIM", default_value = "sub")]
    pub oidc_username_claim: String,

    /// Prefix of user names (default: the issuer URL and `#`, unless the
    /// claim is `email`; `-` for none).
    #[arg(long, env = "GANTRY_OIDC_USERNAME_PREFIX")]
    pub oidc_username_prefix: Option<String>,

    /// The claim that lists the user's groups (a string or a list).
    #[arg(long, env = "GANTRY_OIDC_GROUPS_CLAIM")]
    pub oidc_groups_claim: Option<String>,

    /// Prefix of group names.
    #[arg(long, env = "GANTRY_OIDC_GROUPS_PREFIX", default_value = "")]
    pub oidc_groups_prefix: String,
}

/// Resource limits: how much of the store one client can take.
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// Calls handled at once per connection; beyond it calls are refused
    /// at once with RESOURCE_EXHAUSTED (load shedding) rather than queued.
    /// A watch counts only until its stream starts.
    #[arg(long, env = "GANTRY_MAX_CALLS_PER_CONNECTION", default_value_t = 256)]
    pub max_calls_per_connection: usize,

    /// Calls of editors answered at once (their priority level's seats);
    /// more wait in a queue per identity, served in turn.
    #[arg(long, env = "GANTRY_FAIR_EDITOR_CONCURRENCY", default_value_t = 32)]
    pub fair_editor_concurrency: usize,

    /// Calls of viewers answered at once; more wait in a queue per
    /// identity, served in turn. (The reconciler and admins never wait.)
    #[arg(long, env = "GANTRY_FAIR_VIEWER_CONCURRENCY", default_value_t = 16)]
    pub fair_viewer_concurrency: usize,

    /// Answer bytes per second the viewers' level sends at most, each
    /// object counted as at least 1 KiB: a call's seats are held, after
    /// its answer, until the level's share of this rate would have sent
    /// it, so a flood of lists costs a bounded part of the CPU however
    /// cheap each list is. 0 for no bound.
    #[arg(long, env = "GANTRY_FAIR_VIEWER_BYTES_PER_SECOND", default_value_t = crate::grpc::fairness::DEFAULT_VIEWER_BYTES_PER_SECOND)]
    pub fair_viewer_bytes_per_second: u64,

    /// Calls of one identity that may wait at its level; one more is
    /// refused RESOURCE_EXHAUSTED (TOO_MANY_REQUESTS) with a retry delay.
    #[arg(long, env = "GANTRY_FAIR_QUEUE_LENGTH", default_value_t = 64)]
    pub fair_queue_length: usize,

    /// The longest a call waits for a seat before it is refused.
    #[arg(long, env = "GANTRY_FAIR_QUEUE_WAIT", default_value = "5s", value_parser = gantry_core::duration::parse_duration)]
    pub fair_queue_wait: Duration,

    /// Watch streams one identity (user, service account, certificate
    /// subject) may hold open; one more is refused RESOURCE_EXHAUSTED.
    #[arg(long, env = "GANTRY_MAX_WATCHES_PER_IDENTITY", default_value_t = 2048)]
    pub max_watches_per_identity: usize,

    /// Bytes of database pages (initial objects, events older than the
    /// watch cache) one identity's watches may hold while their
    /// subscribers read them; past it a watch waits for another of them to
    /// drain its page. One page (256 KiB) always fits.
    #[arg(long, env = "GANTRY_MAX_WATCH_BYTES_PER_IDENTITY", default_value_t = 64 << 20)]
    pub max_watch_bytes_per_identity: u64,

    /// HTTP/2 streams (calls and open watches) per connection.
    #[arg(long, env = "GANTRY_MAX_STREAMS_PER_CONNECTION", default_value_t = 1024)]
    pub max_streams_per_connection: u32,

    /// Longest a call may take to answer (a watch: to start streaming).
    #[arg(long, env = "GANTRY_REQUEST_TIMEOUT", default_value = "30s", value_parser = gantry_core::duration::parse_duration)]
    pub request_timeout: Duration,

    /// gRPC connections open at once; more are closed as soon as accepted
    /// (keep it below the process's open-file limit).
    #[arg(long, env = "GANTRY_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// A new connection must send its first request within this time.
    #[arg(long, env = "GANTRY_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = gantry_core::duration::parse_duration)]
    pub handshake_timeout: Duration,

    /// A connection with no call in flight (an open watch counts) for this
    /// long is closed; clients reconnect when they next call.
    #[arg(long, env = "GANTRY_IDLE_TIMEOUT", default_value = "5m", value_parser = gantry_core::duration::parse_duration)]
    pub idle_timeout: Duration,

    /// Interval of HTTP/2 keepalive pings on every connection.
    #[arg(long, env = "GANTRY_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = gantry_core::duration::parse_duration)]
    pub keepalive_interval: Duration,

    /// A connection whose peer does not answer a keepalive ping within
    /// this time is closed.
    #[arg(long, env = "GANTRY_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = gantry_core::duration::parse_duration)]
    pub keepalive_timeout: Duration,
}

/// TLS flags.
#[derive(Args, Clone, Debug)]
pub struct TlsArgs {
    /// PEM certificate chain of the gRPC server; enables TLS.
    #[arg(long, env = "GANTRY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key matching --tls-cert.
    #[arg(long, env = "GANTRY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificate(s) for client certificates: a client that
    /// presents one signed by it is the certificate's subject (CN the user,
    /// each O a group; roles from --role-bindings-file); an unsigned or
    /// expired one is refused at the handshake. Clients without one still
    /// connect (and present tokens).
    #[arg(long, env = "GANTRY_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
}

impl Config {
    /// Every flag at its environment variable or its default, as the
    /// binary starts with no flags (for gantry-local, which then sets the
    /// fields it decides).
    pub fn from_env() -> Result<Self, clap::Error> {
        Self::try_parse_from(["gateway-store"])
    }

    /// The database URL in effect.
    pub fn effective_database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("gantry.db").display()),
        }
    }
}

/// Hides the password of a database URL.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("http_listen", &self.http_listen)
            .field("data_dir", &self.data_dir)
            .field("database_url", &self.database_url.as_deref().map(redact_url))
            .field("commit_spin", &self.commit_spin)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .field("watch", &self.watch)
            .field("log", &self.log)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_url_password_is_hidden() {
        assert_eq!(
            redact_url("postgres://gantry:s3cret@db:5432/gantry"),
            "postgres://gantry:***@db:5432/gantry"
        );
        let config =
            Config::parse_from(["gateway-store", "--database-url", "postgres://u:pw@h/db"]);
        assert!(!format!("{config:?}").contains("pw@"));
    }

    #[test]
    fn default_database_is_sqlite_in_data_dir() {
        let config = Config::parse_from(["gateway-store", "--data-dir", "/var/lib/gantry"]);
        assert_eq!(config.effective_database_url(), "sqlite:///var/lib/gantry/gantry.db");
    }

    #[test]
    fn commit_spin_is_off_unless_asked_for() {
        let config = Config::parse_from(["gateway-store"]);
        assert_eq!(config.commit_spin, Duration::ZERO);
        let on = Config::parse_from(["gateway-store", "--commit-spin", "250us"]);
        assert_eq!(on.commit_spin, crate::awake::SUGGESTED_LINGER);
    }

    #[test]
    fn tokens_and_unauthenticated_conflict() {
        let parsed = Config::try_parse_from([
            "gateway-store",
            "--tokens-file",
            "t",
            "--allow-unauthenticated",
        ]);
        assert!(parsed.is_err());
    }
}
