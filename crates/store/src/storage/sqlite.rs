//! SQLite backend: the embedded default. One file in WAL mode with
//! `synchronous = FULL`, so a commit is on disk before the write is
//! acknowledged. The store's writes go in batches through one connection on
//! a thread of its own (`sqlite_writer`; SQLite has one writer at a time),
//! reads use a small pool of readers that see consistent WAL snapshots.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use super::driver::{Dialect, Driver};
use super::sqlite_writer::BatchWriter;
use super::{Committed, Event, Page, PendingWrite, Retention, Snapshot, Storage, StorageError};

/// SQLite's statements for the shared [`Driver`].
struct SqliteDialect;

impl Dialect for SqliteDialect {
    type Db = Sqlite;
    /// A deferred transaction reads one WAL snapshot.
    const BEGIN_READ: Option<&'static str> = None;
    /// Takes the write lock up front, as a batch does.
    const BEGIN_COMPACT: &'static str = "BEGIN IMMEDIATE";
}

type Queries = Driver<SqliteDialect>;

/// Gateways in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    /// Migrations, compaction and the store's keys.
    writer: SqlitePool,
    /// The batches of the store's writes (see `sqlite_writer`).
    batches: BatchWriter,
    readers: SqlitePool,
    /// Readers for the background thread: connected by it when first
    /// used, so that SQLite's threads for them take its priority.
    background: SqlitePool,
    page_token_key: Vec<u8>,
}

impl SqliteStorage {
    /// Opens (creating if needed) the database at `url` (`sqlite://PATH`)
    /// and applies the migrations.
    pub async fn open(url: &str) -> Result<Self, StorageError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        // No ping before each acquire: a connection to a local file does not
        // go stale, and each ping is one more hand-off to SQLite's thread
        // on every batch and every read.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&writer).await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let background = SqlitePoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(options.clone());
        let page_token_key = Queries::page_token_key(&writer).await?;
        super::check_durability(&durability(&writer).await?)?;
        let batches = BatchWriter::open(options.get_filename())?;
        Ok(Self { writer, batches, readers, background, page_token_key })
    }
}

/// The durability settings of a connection of `pool`.
async fn durability(pool: &SqlitePool) -> Result<Vec<(String, String)>, StorageError> {
    let (synchronous,): (i64,) = sqlx::query_as("PRAGMA synchronous").fetch_one(pool).await?;
    let (journal,): (String,) = sqlx::query_as("PRAGMA journal_mode").fetch_one(pool).await?;
    Ok(vec![("synchronous".into(), synchronous.to_string()), ("journal_mode".into(), journal)])
}

#[tonic::async_trait]
impl Storage for SqliteStorage {
    async fn durability(&self) -> Result<Vec<(String, String)>, StorageError> {
        durability(&self.writer).await
    }

    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError> {
        Queries::get(&self.readers, name).await
    }

    fn for_background(&self) -> Arc<dyn Storage> {
        Arc::new(Self { readers: self.background.clone(), ..self.clone() })
    }

    /// The writer's batches run on its own thread (`sqlite_writer`).
    fn for_writer(&self) -> Arc<dyn Storage> {
        Arc::new(Self { batches: self.batches.inline(), ..self.clone() })
    }

    async fn list(&self, page: Page<'_>) -> Result<Snapshot, StorageError> {
        Queries::list(&self.readers, page).await
    }

    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError> {
        self.batches.write(writes).await
    }

    async fn events_after(
        &self,
        after: i64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError> {
        Queries::events_after(&self.readers, after, limit, max_bytes).await
    }

    async fn current_revision(&self) -> Result<i64, StorageError> {
        Queries::current_revision(&self.readers).await
    }

    async fn compact(&self, retention: Retention) -> Result<i64, StorageError> {
        Queries::compact(&self.writer, retention).await
    }

    async fn ping(&self) -> Result<(), StorageError> {
        Queries::ping(&self.readers).await
    }

    fn page_token_key(&self) -> &[u8] {
        &self.page_token_key
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}
