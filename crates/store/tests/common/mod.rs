//! Test harness: a real gateway-store on real sockets over a fresh SQLite
//! file or a fresh PostgreSQL database, and authenticated gRPC clients.
#![allow(dead_code)]

pub mod hooked;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::gateway_service_client::GatewayServiceClient;
use gantry_api::v1::{CreateGatewayRequest, Gateway, ObjectMeta, WatchEvent, WatchGatewaysRequest};
use gantry_store::auth::{Auth, Authenticator};
use gantry_store::storage::Storage;
use gantry_store::{Settings, WatchSettings};
pub use gantry_testkit::{Backend, TestDatabase};
use sqlx::Connection;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

pub const VIEWER: &str = "viewer-token-0000000001";
pub const EDITOR: &str = "editor-token-0000000002";
pub const RECONCILER: &str = "reconciler-token-00003";
pub const ADMIN: &str = "admin-token-00000000004";

pub const TOKENS_FILE: &str = "# test tokens\n\
    viewer-token-0000000001,vera,viewer\n\
    editor-token-0000000002,eddie,editor\n\
    reconciler-token-00003,gateway-reconciler,reconciler\n\
    admin-token-00000000004,ada,admin\n";

/// A running store.
pub struct TestStore {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub storage: Arc<dyn Storage>,
    pub backend: Backend,
    /// The watch settings it runs with.
    pub watch: WatchSettings,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub database: Arc<TestDatabase>,
    /// The RPC the watch scenarios open their watches with.
    pub watch_shape: WatchShape,
}

/// The RPC a watch scenario runs over: the watch tests are one table run
/// over both.
#[derive(Debug, Clone, Copy, Default)]
pub enum WatchShape {
    /// WatchGateways: one stream per watch.
    #[default]
    Single,
    /// Watch: the watch shares its stream with a second watch of the same
    /// request, read all along, so that every scenario also runs with
    /// another watch's responses interleaved with its own.
    Shared,
}

/// A watch's events, from either RPC.
pub type Events =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchEvent, Status>> + Send>>;

impl WatchShape {
    /// A watch of `request` over this shape's RPC, or the status it was
    /// refused with.
    pub async fn open(self, c: &Client, request: WatchGatewaysRequest) -> Result<Events, Status> {
        match self {
            WatchShape::Single => {
                Ok(Box::pin(c.clone().watch_gateways(request).await?.into_inner()))
            }
            WatchShape::Shared => {
                let shared = gantry_client::shared_watch::SharedWatch::open(c.clone()).await?;
                let mut companion = shared.watch(request.clone()).await?;
                tokio::spawn(async move {
                    while tokio_stream::StreamExt::next(&mut companion).await.is_some() {}
                });
                Ok(Box::pin(shared.watch(request).await?))
            }
        }
    }
}

impl TestStore {
    pub async fn start(backend: Backend) -> Option<TestStore> {
        Self::start_with(backend, test_watch_settings()).await
    }

    pub async fn start_with(backend: Backend, watch: WatchSettings) -> Option<TestStore> {
        // Logs when RUST_LOG is set, e.g. RUST_LOG=gantry_store=debug.
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt().with_test_writer().try_init();
        }
        let database = Arc::new(TestDatabase::create(backend).await?);
        Some(Self::serve_on(database, backend, watch).await)
    }

    /// Another store process on the same database (a replica).
    pub async fn replica(&self) -> TestStore {
        self.replica_with(test_watch_settings()).await
    }

    /// As [`TestStore::replica`], with other watch settings.
    pub async fn replica_with(&self, watch: WatchSettings) -> TestStore {
        Self::serve_on(self.database.clone(), self.backend, watch).await
    }

    /// A store whose storage is `wrap` of the one it would open.
    pub async fn start_wrapped(
        backend: Backend,
        watch: WatchSettings,
        wrap: impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage>,
    ) -> Option<TestStore> {
        let database = Arc::new(TestDatabase::create(backend).await?);
        Some(Self::serve_wrapped(database, backend, watch, wrap).await)
    }

    async fn serve_on(
        database: Arc<TestDatabase>,
        backend: Backend,
        watch: WatchSettings,
    ) -> TestStore {
        Self::serve_wrapped(database, backend, watch, |storage| storage).await
    }

    async fn serve_wrapped(
        database: Arc<TestDatabase>,
        backend: Backend,
        watch: WatchSettings,
        wrap: impl FnOnce(Arc<dyn Storage>) -> Arc<dyn Storage>,
    ) -> TestStore {
        let storage = wrap(gantry_store::open_storage(&database.url).await.unwrap());
        let auth = Authenticator::parse_tokens_file(TOKENS_FILE).unwrap();
        let settings = Settings {
            storage: storage.clone(),
            auth: Arc::new(Auth::new(auth)),
            tls: None,
            watch: watch.clone(),
            limits: Default::default(),
            // On with SQLite (off by default), so that the suites' writes
            // and faults run with the thread spinning beside them; off with
            // PostgreSQL, whose processes may share the CPU (awake.rs).
            commit_spin: if database.url.starts_with("postgres") {
                Duration::ZERO
            } else {
                gantry_store::awake::SUGGESTED_LINGER
            },
        };
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            gantry_store::serve(settings, grpc, http, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        TestStore {
            grpc: grpc_addr,
            http: http_addr,
            storage,
            backend,
            watch,
            stop: Some(stop),
            task: Some(task),
            database,
            watch_shape: WatchShape::Single,
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc)).unwrap().connect().await.unwrap()
    }

    /// A client that sends `token` (or none when empty).
    pub async fn client(&self, token: &str) -> Client {
        GatewayServiceClient::with_interceptor(self.channel().await, Bearer(token.to_string()))
    }

    /// `(generation, observed_generation)` read straight from the row.
    pub async fn raw_generations(&self, name: &str) -> Option<(i64, i64)> {
        let sql = "SELECT generation, observed_generation FROM gateways WHERE name = $1";
        match self.backend {
            Backend::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.database.url).await.unwrap();
                sqlx::query_as(sql).bind(name).fetch_optional(&mut c).await.unwrap()
            }
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.database.url).await.unwrap();
                sqlx::query_as(sql).bind(name).fetch_optional(&mut c).await.unwrap()
            }
        }
    }

    /// Runs `sql` (several statements allowed) on the store's database over
    /// a connection of the test's own.
    pub async fn execute_raw(&self, sql: &str) {
        match self.backend {
            Backend::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.database.url).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            }
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.database.url).await.unwrap();
                sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
            }
        }
    }

    /// Every revision in the events table, in order.
    pub async fn event_revisions(&self) -> Vec<i64> {
        let sql = "SELECT revision FROM gateway_events ORDER BY revision";
        let rows: Vec<(i64,)> = match self.backend {
            Backend::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.database.url).await.unwrap();
                sqlx::query_as(sql).fetch_all(&mut c).await.unwrap()
            }
            Backend::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.database.url).await.unwrap();
                sqlx::query_as(sql).fetch_all(&mut c).await.unwrap()
            }
        };
        rows.into_iter().map(|(r,)| r).collect()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("store stops within 10s")
                .unwrap();
        }
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Watch settings for tests: short bookmark interval, default elsewhere.
pub fn test_watch_settings() -> WatchSettings {
    WatchSettings { bookmark_interval: Duration::from_millis(200), ..WatchSettings::default() }
}

/// Adds `authorization: Bearer T`.
#[derive(Clone)]
pub struct Bearer(pub String);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if !self.0.is_empty() {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {}", self.0).parse().unwrap());
        }
        Ok(request)
    }
}

pub type Client = GatewayServiceClient<InterceptedService<Channel, Bearer>>;

/// A Gateway with a name and an image.
pub fn gateway(name: &str, image: &str) -> Gateway {
    gantry_testkit::gateway::gateway(name).image(image).build()
}

pub async fn create(client: &mut Client, g: Gateway) -> Gateway {
    client
        .create_gateway(CreateGatewayRequest { gateway: Some(g), validate_only: false })
        .await
        .unwrap()
        .into_inner()
}

pub fn meta(g: &Gateway) -> &ObjectMeta {
    g.metadata.as_ref().unwrap()
}

/// Runs each listed scenario `async fn(&TestStore)` against both backends,
/// in modules `sqlite` and `postgres` with the test watch settings, or in
/// named modules with settings per scenario:
/// `on_both_backends!(sqlite_x, postgres_x; scenario => settings(), ...)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        $crate::on_both_backends!(sqlite, postgres; $($scenario => $crate::common::test_watch_settings()),*);
    };
    ($sqlite:ident, $postgres:ident; $($scenario:ident => $settings:expr),* $(,)?) => {
        $crate::on_both_backends!($sqlite, $postgres, shape = $crate::common::WatchShape::Single; $($scenario => $settings),*);
    };
    ($sqlite:ident, $postgres:ident, shape = $shape:expr; $($scenario:ident => $settings:expr),* $(,)?) => {
        mod $sqlite {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let backend = $crate::common::Backend::Sqlite;
                    let mut store = $crate::common::TestStore::start_with(backend, $settings).await.unwrap();
                    store.watch_shape = $shape;
                    super::$scenario(&store).await;
                    store.stop().await;
                }
            )*
        }
        mod $postgres {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let backend = $crate::common::Backend::Postgres;
                    let Some(mut store) = $crate::common::TestStore::start_with(backend, $settings).await else {
                        return;
                    };
                    store.watch_shape = $shape;
                    super::$scenario(&store).await;
                    store.stop().await;
                }
            )*
        }
    };
}

/// `GET path` over plain HTTP/1.1; the whole response.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    gantry_testkit::fetch(addr.port(), path).await.unwrap()
}
