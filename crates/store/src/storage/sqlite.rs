//! SQLite backend: the embedded default. One file in WAL mode with
//! `synchronous = FULL`, so a commit is on disk before the write is
//! acknowledged. Writes go through a single writer connection (SQLite has
//! one writer at a time; batching them here avoids SQLITE_BUSY), reads use a
//! small pool of readers that see consistent WAL snapshots.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::{
    compact_in, decode, events_after_in, last_revision, list_in, sql, write_batch, Committed,
    Event, PendingWrite, Retention, Snapshot, Storage, StorageError,
};

/// Gateways in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    writer: SqlitePool,
    readers: SqlitePool,
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
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&writer).await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        Ok(Self { writer, readers })
    }
}

#[tonic::async_trait]
impl Storage for SqliteStorage {
    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError> {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as(sql::SELECT_OBJECT).bind(name).fetch_optional(&self.readers).await?;
        row.map(|(bytes,)| decode(name, &bytes)).transpose()
    }

    async fn list(&self, after: &str, limit: usize) -> Result<Snapshot, StorageError> {
        let mut tx = self.readers.begin().await?;
        let snapshot = list_in!(tx, after, limit);
        tx.commit().await?;
        Ok(snapshot)
    }

    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError> {
        // IMMEDIATE takes the write lock up front, so no read in the batch
        // can be invalidated before this transaction writes.
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let results = write_batch!(tx, writes, sql::SELECT_OBJECT);
        if last_revision(&results).is_some() {
            tx.commit().await?;
        }
        Ok(results)
    }

    async fn events_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError> {
        let mut tx = self.readers.begin().await?;
        let events = events_after_in!(tx, after, limit);
        tx.commit().await?;
        Ok(events)
    }

    async fn current_revision(&self) -> Result<i64, StorageError> {
        let (revision,): (i64,) =
            sqlx::query_as(sql::CURRENT_REVISION).fetch_one(&self.readers).await?;
        Ok(revision)
    }

    async fn compact(&self, retention: Retention) -> Result<i64, StorageError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let compacted = compact_in!(tx, retention);
        tx.commit().await?;
        Ok(compacted)
    }

    async fn ping(&self) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}
