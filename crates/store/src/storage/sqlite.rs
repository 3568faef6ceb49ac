//! SQLite backend: the embedded default. One file in WAL mode with
//! `synchronous = FULL`, so a commit is on disk before the write is
//! acknowledged. Writes go through a single writer connection (SQLite has
//! one writer at a time; batching them here avoids SQLITE_BUSY), reads use a
//! small pool of readers that see consistent WAL snapshots.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use super::driver::{Dialect, Driver};
use super::{
    batch_names, encode_labels, now_ms, plan_batch, stored_rows, BatchPlan, Committed, Event,
    EventRow, Page, PendingWrite, Retention, RowColumns, Snapshot, Storage, StorageError,
};

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

/// Opens the batch's transaction, taking SQLite's write lock up front (no
/// read in the batch can be invalidated before it writes), and reads the
/// store revision and the rows of a JSON array of names (SQLite has no
/// array parameters): one row with NULL name and object when none exists.
const READ_BATCH: &str =
    "BEGIN IMMEDIATE; SELECT r.revision, g.name, g.object FROM store_revision AS r \
    LEFT JOIN gateways AS g ON g.name IN (SELECT value FROM json_each($1)) WHERE r.id = 1";
/// Everything a batch stores and its commit, as one query string run in
/// one call to SQLite's thread (each statement prepared once): the rows
/// put (`$1`, a JSON array of `[name, uid, generation, observed_generation,
/// resource_version, deleting, offset, length]`, objects cut from the blob
/// `$2`), the rows removed (`$3`, names), the events (`$5`, `[revision,
/// event_type, name, offset, length, prev_labels offset, length,
/// prev_object offset, length]`, `$4` their time) and the new revision
/// (`$6`). `substr` of a blob counts bytes, from 1; of NULL is NULL.
///
/// The upsert cannot overwrite a row this batch did not read, nor the
/// DELETE miss one: the batch holds SQLite's write lock from `BEGIN
/// IMMEDIATE` to its commit.
const WRITE_BATCH: &str = "INSERT INTO gateways \
    (name, uid, generation, observed_generation, resource_version, deleting, object) \
    SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, r.value ->> 4, \
    r.value ->> 5, substr($2, r.value ->> 6, r.value ->> 7) FROM json_each($1) AS r WHERE true \
    ON CONFLICT (name) DO UPDATE SET uid = excluded.uid, generation = excluded.generation, \
    observed_generation = excluded.observed_generation, \
    resource_version = excluded.resource_version, deleting = excluded.deleting, \
    object = excluded.object; \
    DELETE FROM gateways WHERE name IN (SELECT value FROM json_each($3)); \
    INSERT INTO gateway_events \
    (revision, event_type, name, object, created_at_ms, prev_labels, prev_object) \
    SELECT e.value ->> 0, e.value ->> 1, e.value ->> 2, substr($2, e.value ->> 3, e.value ->> 4), \
    $4, substr($2, e.value ->> 5, e.value ->> 6), substr($2, e.value ->> 7, e.value ->> 8) \
    FROM json_each($5) AS e; \
    UPDATE store_revision SET revision = $6 WHERE id = 1; \
    COMMIT";

/// The parameters of [`WRITE_BATCH`] for a plan: every byte string
/// appended once to one blob, referred to by offset and length.
#[derive(Default)]
struct BatchParams {
    blob: Vec<u8>,
    puts: Vec<serde_json::Value>,
    removes: Vec<String>,
    events: Vec<serde_json::Value>,
}

impl BatchParams {
    /// Appends `bytes`; its 1-based offset and length (JSON nulls for none).
    fn slice(&mut self, bytes: Option<&[u8]>) -> [serde_json::Value; 2] {
        match bytes {
            None => [serde_json::Value::Null, serde_json::Value::Null],
            Some(bytes) => {
                let offset = self.blob.len() + 1;
                self.blob.extend_from_slice(bytes);
                [offset.into(), bytes.len().into()]
            }
        }
    }

    fn of(plan: &BatchPlan) -> Self {
        let mut params = Self::default();
        for row in &plan.rows {
            match plan.after(row) {
                None => params.removes.push(row.name.clone()),
                Some((gateway, bytes)) => {
                    let c = RowColumns::of(gateway);
                    let [offset, length] = params.slice(Some(bytes));
                    params.puts.push(serde_json::json!([
                        row.name,
                        c.uid,
                        c.generation,
                        c.observed_generation,
                        c.resource_version,
                        i64::from(c.deleting),
                        offset,
                        length
                    ]));
                }
            }
        }
        for row @ EventRow { event, prev, .. } in &plan.events {
            let [object, object_len] = params.slice(Some(row.bytes()));
            let labels = event.prev_labels.as_ref().map(encode_labels);
            let [labels, labels_len] = params.slice(labels.as_deref());
            let [prev, prev_len] = params.slice(prev.as_deref());
            params.events.push(serde_json::json!([
                event.revision,
                event.kind as i32,
                event.name(),
                object,
                object_len,
                labels,
                labels_len,
                prev,
                prev_len
            ]));
        }
        params
    }
}

/// The writer connection inside a batch's transaction. The transaction is
/// begun and committed by the batch's own statements ([`READ_BATCH`],
/// [`WRITE_BATCH`]), two calls to SQLite's thread instead of four, so sqlx
/// does not track it: dropped before [`BatchTx::done`] (an error, or the
/// task cancelled), the connection is closed, which rolls back whatever
/// was not committed, rather than returned to the pool mid-transaction.
struct BatchTx {
    conn: PoolConnection<Sqlite>,
    done: bool,
}

impl BatchTx {
    /// Ends a transaction that is still open without changing anything.
    /// True when one was open (nothing it held is committed); false when
    /// SQLite had already ended it.
    async fn rollback(mut self) -> bool {
        let open = sqlx::query("ROLLBACK").execute(&mut *self.conn).await.is_ok();
        self.done = open;
        open
    }
}

impl Drop for BatchTx {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}

/// Gateways in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    writer: SqlitePool,
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
            .connect_lazy_with(options);
        let page_token_key = Queries::page_token_key(&writer).await?;
        let storage = Self { writer, readers, background, page_token_key };
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
        Queries::get(&self.readers, name).await
    }

    fn for_background(&self) -> Arc<dyn Storage> {
        Arc::new(Self { readers: self.background.clone(), ..self.clone() })
    }

    async fn list(&self, page: Page<'_>) -> Result<Snapshot, StorageError> {
        Queries::list(&self.readers, page).await
    }

    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError> {
        let mut tx = BatchTx { conn: self.writer.acquire().await?, done: false };
        let names = serde_json::Value::from(batch_names(&writes)).to_string();
        let read: Vec<(i64, Option<String>, Option<Vec<u8>>)> =
            match sqlx::query_as(READ_BATCH).bind(names).fetch_all(&mut *tx.conn).await {
                Ok(read) => read,
                Err(e) => {
                    tx.rollback().await;
                    return Err(e.into());
                }
            };
        let base = read.first().map_or(0, |(revision, _, _)| *revision);
        let rows = read.into_iter().filter_map(|(_, name, object)| Some((name?, object?)));
        let plan = plan_batch(&stored_rows(rows.collect()), writes, base);
        if plan.revision == base {
            // Nothing changed.
            tx.rollback().await;
            return Ok(plan.results);
        }
        let params = BatchParams::of(&plan);
        // sqlx sums `sqlite3_changes()` after every statement of the string,
        // and that counts the last INSERT, UPDATE or DELETE: COMMIT repeats
        // the revision UPDATE's one row.
        let expected = params.puts.len() + params.removes.len() + params.events.len() + 2;
        let written = sqlx::query(WRITE_BATCH)
            .bind(serde_json::Value::from(params.puts).to_string())
            .bind(params.blob)
            .bind(serde_json::Value::from(params.removes).to_string())
            .bind(now_ms())
            .bind(serde_json::Value::from(params.events).to_string())
            .bind(plan.revision)
            .execute(&mut *tx.conn)
            .await;
        match written {
            Ok(written) => {
                tx.done = true;
                if written.rows_affected() != expected as u64 {
                    // Committed: the write lock makes this impossible, so it
                    // is a bug to report, not an outcome to hide.
                    tracing::error!(
                        expected,
                        written = written.rows_affected(),
                        "a SQLite batch wrote another number of rows than it planned"
                    );
                }
                Ok(plan.results)
            }
            // Still open: nothing of the batch is committed.
            Err(e) if tx.rollback().await => Err(e.into()),
            // SQLite ended the transaction itself: the commit may have been
            // under way.
            Err(e) => Err(StorageError::CommitUnknown(e.to_string())),
        }
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
