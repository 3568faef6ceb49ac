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
    batch_names, changed_behind_our_back, compact_in, decode, encode_labels, events_after_in,
    list_in, now_ms, page_token_key_in, plan_batch, sql, stored_rows, Committed, Event, Page,
    PendingWrite, Retention, RowColumns, Snapshot, Storage, StorageError,
};

/// Rows of a JSON array of names (SQLite has no array parameters).
const SELECT_ROWS: &str =
    "SELECT name, object FROM gateways WHERE name IN (SELECT value FROM json_each($1))";
/// Inserts nothing when the name is taken: see [`changed_behind_our_back`].
const INSERT: &str = "INSERT INTO gateways \
    (name, uid, generation, observed_generation, resource_version, deleting, object) \
    VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING";
const UPDATE: &str = "UPDATE gateways SET uid = $2, generation = $3, \
    observed_generation = $4, resource_version = $5, deleting = $6, object = $7 WHERE name = $1";
const DELETE: &str = "DELETE FROM gateways WHERE name = $1";
const INSERT_EVENT: &str = "INSERT INTO gateway_events \
    (revision, event_type, name, object, created_at_ms, prev_labels, prev_object) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Gateways in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    writer: SqlitePool,
    readers: SqlitePool,
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
        let page_token_key = page_token_key_in!(&writer);
        let storage = Self { writer, readers, page_token_key };
        super::check_durability(&storage.durability().await?)?;
        Ok(storage)
    }
}

#[tonic::async_trait]
impl Storage for SqliteStorage {
    async fn durability(&self) -> Result<Vec<(String, String)>, StorageError> {
        let (synchronous,): (i64,) =
            sqlx::query_as("PRAGMA synchronous").fetch_one(&self.writer).await?;
        let (journal,): (String,) =
            sqlx::query_as("PRAGMA journal_mode").fetch_one(&self.writer).await?;
        Ok(vec![("synchronous".into(), synchronous.to_string()), ("journal_mode".into(), journal)])
    }

    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError> {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as(sql::SELECT_OBJECT).bind(name).fetch_optional(&self.readers).await?;
        row.map(|(bytes,)| decode(name, &bytes)).transpose()
    }

    async fn list(&self, page: Page<'_>) -> Result<Snapshot, StorageError> {
        let mut tx = self.readers.begin().await?;
        let snapshot = list_in!(tx, page);
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
        let (base,): (i64,) = sqlx::query_as(sql::LOCK_REVISION).fetch_one(&mut *tx).await?;
        let names = serde_json::Value::from(batch_names(&writes)).to_string();
        let rows = sqlx::query_as(SELECT_ROWS).bind(names).fetch_all(&mut *tx).await?;
        let plan = plan_batch(&stored_rows(rows), writes, base);
        if plan.revision == base {
            // Nothing changed: the dropped transaction rolls back.
            return Ok(plan.results);
        }
        for row in &plan.rows {
            let query = match plan.after(row) {
                None => sqlx::query(DELETE).bind(&row.name),
                Some((gateway, bytes)) => {
                    let columns = RowColumns::of(gateway);
                    sqlx::query(if row.existed { UPDATE } else { INSERT })
                        .bind(&row.name)
                        .bind(columns.uid)
                        .bind(columns.generation)
                        .bind(columns.observed_generation)
                        .bind(columns.resource_version)
                        .bind(columns.deleting)
                        .bind(bytes)
                }
            };
            if query.execute(&mut *tx).await?.rows_affected() != 1 {
                return Err(changed_behind_our_back(&row.name));
            }
        }
        let now = now_ms();
        for row @ super::EventRow { event, prev, .. } in &plan.events {
            sqlx::query(INSERT_EVENT)
                .bind(event.revision)
                .bind(event.kind as i32)
                .bind(event.name())
                .bind(row.bytes())
                .bind(now)
                .bind(event.prev_labels.as_ref().map(encode_labels))
                .bind(prev.as_deref())
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(sql::SET_REVISION).bind(plan.revision).execute(&mut *tx).await?;
        // Sent: from here a failure leaves the outcome unknown.
        tx.commit().await.map_err(|e| StorageError::CommitUnknown(e.to_string()))?;
        Ok(plan.results)
    }

    async fn events_after(
        &self,
        after: i64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError> {
        let mut tx = self.readers.begin().await?;
        let events = events_after_in!(tx, after, limit, max_bytes);
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

    fn page_token_key(&self) -> &[u8] {
        &self.page_token_key
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}
