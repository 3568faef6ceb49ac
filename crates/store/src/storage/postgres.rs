//! PostgreSQL backend.
//!
//! Revisions in commit order: a batch first locks the single
//! `store_revision` row (`UPDATE ... RETURNING`) and holds it until
//! commit. A second writer, in this process or another replica, blocks on
//! it until the first commits, so revision N+1 is never committed before N,
//! and a reader that sees N sees everything before it. (A sequence would
//! not give this: sequence values are handed out at call time and
//! transactions may commit in another order.) As every writer takes that
//! lock first, the batch reads its rows without row locks and cannot
//! deadlock.
//!
//! A batch costs four round trips whatever its size: BEGIN with the lock,
//! one read of all its rows (`= ANY`), one statement that updates, inserts
//! and deletes the changed rows, inserts the events (`UNNEST` of arrays),
//! sets the revision and notifies, and COMMIT.
//!
//! Several store replicas: each commit sends `NOTIFY gantry_events` inside
//! its transaction (delivered at commit); every replica LISTENs and then
//! reads the events table, which stays the source of truth.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};

use super::driver::{Dialect, Driver};
use super::{
    batch_names, changed_behind_our_back, encode_labels, now_ms, plan_batch, stored_rows,
    Committed, Event, Page, PendingWrite, Retention, RowColumns, Snapshot, Storage, StorageError,
};

/// PostgreSQL's statements for the shared [`Driver`].
struct PostgresDialect;

impl Dialect for PostgresDialect {
    type Db = sqlx::Postgres;
    const BEGIN_READ: Option<&'static str> =
        Some("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    /// Takes the revision lock, as a batch does: the compaction mark and
    /// the deleted rows change together, and no event commits in between.
    const BEGIN_COMPACT: &'static str =
        "BEGIN; SELECT revision FROM store_revision WHERE id = 1 FOR UPDATE";
}

type Queries = Driver<PostgresDialect>;

/// Begins the batch's transaction and takes the revision lock, in one
/// round trip (a simple query of two statements). Every writer takes the
/// lock first, so writers serialize on it and rows need no locks of their
/// own.
const BEGIN_AND_LOCK: &str = "BEGIN; UPDATE store_revision SET revision = revision WHERE id = 1";
/// The locked revision and the rows a batch names (one row with NULL name
/// and object when none exists). A statement after the lock, so that its
/// snapshot holds every commit made before the lock was granted.
const READ_BATCH: &str = "SELECT r.revision, g.name, g.object FROM store_revision AS r \
    LEFT JOIN gateways AS g ON g.name = ANY($1) WHERE r.id = 1";
/// Everything a batch stores, in one statement: rows updated ($1..$7; the
/// `ANY` condition lets the planner find them by the primary key rather
/// than hash-joining a scan), inserted ($8..$14), deleted ($15), the
/// events ($16..$22), the new revision ($23) and the notification to the
/// other replicas ($24, delivered at commit). Answers how many rows were
/// updated, inserted and deleted (a data-modifying CTE runs whether or not
/// the query reads it).
const WRITE_BATCH: &str = "WITH updated AS (UPDATE gateways AS g SET uid = u.uid, \
    generation = u.generation, observed_generation = u.observed_generation, \
    resource_version = u.resource_version, deleting = u.deleting, object = u.object \
    FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::bool[], $7::bytea[]) \
    AS u(name, uid, generation, observed_generation, resource_version, deleting, object) \
    WHERE g.name = u.name AND g.name = ANY($1) RETURNING 1), \
    inserted AS (INSERT INTO gateways \
    (name, uid, generation, observed_generation, resource_version, deleting, object) \
    SELECT * FROM UNNEST($8::text[], $9::text[], $10::int8[], $11::int8[], $12::int8[], \
    $13::bool[], $14::bytea[]) ON CONFLICT (name) DO NOTHING RETURNING 1), \
    deleted AS (DELETE FROM gateways WHERE name = ANY($15) RETURNING 1), \
    events AS (INSERT INTO gateway_events \
    (revision, event_type, name, object, created_at_ms, prev_labels, prev_object) \
    SELECT * FROM UNNEST($16::int8[], $17::int4[], $18::text[], $19::bytea[], $20::int8[], \
    $21::bytea[], $22::bytea[])), \
    revision AS (UPDATE store_revision SET revision = $23 WHERE id = 1) \
    SELECT (SELECT COUNT(*) FROM updated), (SELECT COUNT(*) FROM inserted), \
    (SELECT COUNT(*) FROM deleted), pg_notify($24, $23::text)::text";
const CHANNEL: &str = "gantry_events";
/// The `application_name` of the store's connections, of the background
/// thread's ([`crate::background`]) and of the writer's.
pub const APPLICATION: &str = "gantry-store";
pub const BACKGROUND_APPLICATION: &str = "gantry-store background";
pub const WRITER_APPLICATION: &str = "gantry-store writer";

/// Gateways in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStorage {
    pool: PgPool,
    /// Connections for the background thread, made by it when first used:
    /// a connection's socket belongs to the runtime that opened it, and the
    /// background runtime stops before the store's last writes.
    background: PgPool,
    /// The writer thread's connection, made by it when first used: a batch
    /// runs one statement after another, so one is enough.
    writes: PgPool,
    page_token_key: Vec<u8>,
}

impl PostgresStorage {
    /// Connects to `url` (`postgres://...`) and applies the migrations.
    pub async fn open(url: &str) -> Result<Self, StorageError> {
        // Each pool names its connections, so an operator (and a test)
        // can tell them apart in pg_stat_activity.
        let options = |connections, name: &str| -> Result<_, StorageError> {
            let connect = PgConnectOptions::from_str(url)?.application_name(name);
            let pool = PgPoolOptions::new()
                .max_connections(connections)
                .acquire_timeout(Duration::from_secs(10))
                // A database or role may default to synchronous_commit=off:
                // every connection of the store commits durably regardless.
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        sqlx::query("SET synchronous_commit = on").execute(conn).await?;
                        Ok(())
                    })
                });
            Ok((pool, connect))
        };
        let (pool, connect) = options(16, APPLICATION)?;
        let pool = pool.connect_with(connect).await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        let (background, connect) = options(1, BACKGROUND_APPLICATION)?;
        let background = background.connect_lazy_with(connect);
        let (writes, connect) = options(1, WRITER_APPLICATION)?;
        let writes = writes.connect_lazy_with(connect);
        let page_token_key = Queries::page_token_key(&pool).await?;
        let storage = Self { pool, background, writes, page_token_key };
        super::check_durability(&storage.durability().await?)?;
        Ok(storage)
    }
}

#[tonic::async_trait]
impl Storage for PostgresStorage {
    async fn durability(&self) -> Result<Vec<(String, String)>, StorageError> {
        let mut conn = self.pool.acquire().await?;
        let mut out = Vec::new();
        for name in ["fsync", "synchronous_commit"] {
            let (value,): (String,) =
                sqlx::query_as(&format!("SHOW {name}")).fetch_one(&mut *conn).await?;
            out.push((name.to_string(), value));
        }
        Ok(out)
    }

    fn for_background(&self) -> Arc<dyn Storage> {
        Arc::new(Self { pool: self.background.clone(), ..self.clone() })
    }

    fn for_writer(&self) -> Arc<dyn Storage> {
        Arc::new(Self { pool: self.writes.clone(), ..self.clone() })
    }

    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError> {
        Queries::get(&self.pool, name).await
    }

    async fn list(&self, page: Page<'_>) -> Result<Snapshot, StorageError> {
        Queries::list(&self.pool, page).await
    }

    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError> {
        let mut tx = self.pool.begin_with(BEGIN_AND_LOCK).await?;
        let read: Vec<(i64, Option<String>, Option<Vec<u8>>)> =
            sqlx::query_as(READ_BATCH).bind(batch_names(&writes)).fetch_all(&mut *tx).await?;
        let base = read.first().map_or(0, |(revision, _, _)| *revision);
        let rows = read.into_iter().filter_map(|(_, name, object)| Some((name?, object?)));
        let plan = plan_batch(&stored_rows(rows.collect()), writes, base);
        if plan.revision == base {
            // Nothing changed: the dropped transaction rolls back.
            return Ok(plan.results);
        }
        let (mut updates, mut inserts) = (ColumnArrays::default(), ColumnArrays::default());
        let mut deletes = Vec::new();
        for row in &plan.rows {
            match (plan.after(row), row.existed) {
                (None, _) => deletes.push(row.name.as_str()),
                (Some(after), true) => updates.push(&row.name, after),
                (Some(after), false) => inserts.push(&row.name, after),
            }
        }
        let events = &plan.events;
        let query = inserts.bind(updates.bind(sqlx::query_as(WRITE_BATCH)));
        let (updated, inserted, deleted, _): (i64, i64, i64, String) = query
            .bind(&deletes)
            .bind(events.iter().map(|e| e.event.revision).collect::<Vec<_>>())
            .bind(events.iter().map(|e| e.event.kind as i32).collect::<Vec<_>>())
            .bind(events.iter().map(|e| e.event.name()).collect::<Vec<_>>())
            .bind(events.iter().map(super::EventRow::bytes).collect::<Vec<_>>())
            .bind(vec![now_ms(); events.len()])
            .bind(
                events
                    .iter()
                    .map(|e| e.event.prev_labels.as_ref().map(encode_labels))
                    .collect::<Vec<_>>(),
            )
            .bind(events.iter().map(|e| e.prev.as_deref()).collect::<Vec<_>>())
            .bind(plan.revision)
            .bind(CHANNEL)
            .fetch_one(&mut *tx)
            .await?;
        for (done, columns) in [(updated, &updates.names), (inserted, &inserts.names)] {
            if done != columns.len() as i64 {
                return Err(changed_behind_our_back(&columns.join(", ")));
            }
        }
        if deleted != deletes.len() as i64 {
            return Err(changed_behind_our_back(&deletes.join(", ")));
        }
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
        Queries::events_after(&self.pool, after, limit, max_bytes).await
    }

    async fn current_revision(&self) -> Result<i64, StorageError> {
        Queries::current_revision(&self.pool).await
    }

    async fn compact(&self, retention: Retention) -> Result<i64, StorageError> {
        Queries::compact(&self.pool, retention).await
    }

    async fn listen_for_commits(
        &self,
        committed: &(dyn Fn(Option<i64>) + Send + Sync),
    ) -> Result<(), StorageError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        // Anything committed before LISTEN took effect is picked up by the
        // reader this wakes.
        committed(None);
        loop {
            // The payload is the revision the batch committed.
            let notification = listener.recv().await?;
            committed(notification.payload().parse().ok());
        }
    }

    async fn ping(&self) -> Result<(), StorageError> {
        Queries::ping(&self.pool).await
    }

    fn page_token_key(&self) -> &[u8] {
        &self.page_token_key
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}

/// Row columns as arrays, for one `UNNEST` statement.
#[derive(Debug, Default)]
struct ColumnArrays<'a> {
    names: Vec<&'a str>,
    uids: Vec<&'a str>,
    generations: Vec<i64>,
    observed: Vec<i64>,
    resource_versions: Vec<i64>,
    deleting: Vec<bool>,
    objects: Vec<&'a [u8]>,
}

impl<'a> ColumnArrays<'a> {
    fn push(&mut self, name: &'a str, (gateway, bytes): (&'a Gateway, &'a [u8])) {
        let columns = RowColumns::of(gateway);
        self.names.push(name);
        self.uids.push(columns.uid);
        self.generations.push(columns.generation);
        self.observed.push(columns.observed_generation);
        self.resource_versions.push(columns.resource_version);
        self.deleting.push(columns.deleting);
        self.objects.push(bytes);
    }

    fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.names)
            .bind(&self.uids)
            .bind(&self.generations)
            .bind(&self.observed)
            .bind(&self.resource_versions)
            .bind(&self.deleting)
            .bind(&self.objects)
    }
}
