//! PostgreSQL backend.
//!
//! Revisions in commit order: every batch moves the single
//! `store_revision` row from the revision it read to its own last one,
//! and holds that row's lock until it commits. A second writer, in this
//! process or another replica, blocks on it until the first commits, so
//! revision N+1 is never committed before N, and a reader that sees N sees
//! everything before it. (A sequence would not give this: sequence values
//! are handed out at call time and transactions may commit in another
//! order.)
//!
//! A batch costs two round trips: one statement reads the revision and
//! the batch's rows (`= ANY`); the rules run; one statement, committing on
//! its own, moves the revision only if it is still the one read (a
//! compare-and-set under the row lock) and, only then, updates, inserts
//! and deletes the changed rows, inserts the events (`UNNEST` of arrays)
//! and notifies. When another replica committed in between, nothing is
//! written and the batch runs again, this time in a transaction that
//! takes the revision lock before it reads (four round trips), so that it
//! cannot lose twice. A row changed by a writer outside gateway-store
//! (counts not as planned) aborts the statement, and with it the batch.
//! When every row of a batch is one the writer read or wrote at its last
//! commit ([`super::known_rows`]), it plans on those and skips the read:
//! the compare-and-set on the revision is what makes them current.
//!
//! Several store replicas: each commit sends `NOTIFY gantry_events` inside
//! its transaction (delivered at commit), naming the revision and the
//! store that made it; every replica LISTENs and reads the events table,
//! which stays the source of truth, after the other replicas' commits (its
//! own writer publishes its own).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::Connection as _;

use super::driver::{Dialect, Driver};
use super::known_rows::KnownRows;
use super::{
    batch_names, changed_behind_our_back, encode_labels, now_ms, plan_batch, stored_rows,
    BatchPlan, Committed, Event, Page, PendingWrite, Retention, RowColumns, Snapshot, Storage,
    StorageError, StoredRow,
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

/// Begins a transaction and takes the revision lock, in one round trip (a
/// simple query of two statements): a batch that lost the race to another
/// replica runs again behind it.
const BEGIN_AND_LOCK: &str = "BEGIN; UPDATE store_revision SET revision = revision WHERE id = 1";
/// The revision and the rows a batch names (one row with NULL name and
/// object when none exists), in one snapshot. Under the lock, a statement
/// after it, so that its snapshot holds every commit made before the lock
/// was granted.
const READ_BATCH: &str = "SELECT r.revision, g.name, g.object FROM store_revision AS r \
    LEFT JOIN gateways AS g ON g.name = ANY($1) WHERE r.id = 1";
/// Everything a batch stores, in one statement, if the revision is still
/// the one the batch read ($25; the compare-and-set waits for a writer
/// holding the row and then sees its commit): rows updated ($1..$7; the
/// `ANY` condition lets the planner find them by the primary key rather
/// than hash-joining a scan), inserted ($8..$14), deleted ($15), the
/// events ($16..$22), the new revision ($23) and the notification to the
/// other replicas (on channel $24, delivered at commit: the revision and
/// the writer's origin $30, see [`notified_revision`]). Answers false when another
/// writer moved the revision (nothing done), true when all is stored; rows
/// not as planned (other than $26 updated, $27 inserted, $28 deleted)
/// raise $29 and roll it all back.
const WRITE_BATCH: &str = "WITH revision AS (UPDATE store_revision SET revision = $23 \
    WHERE id = 1 AND revision = $25 RETURNING 1), \
    updated AS (UPDATE gateways AS g SET uid = u.uid, \
    generation = u.generation, observed_generation = u.observed_generation, \
    resource_version = u.resource_version, deleting = u.deleting, object = u.object \
    FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::bool[], $7::bytea[]) \
    AS u(name, uid, generation, observed_generation, resource_version, deleting, object) \
    WHERE g.name = u.name AND g.name = ANY($1) AND EXISTS (SELECT 1 FROM revision) RETURNING 1), \
    inserted AS (INSERT INTO gateways \
    (name, uid, generation, observed_generation, resource_version, deleting, object) \
    SELECT * FROM UNNEST($8::text[], $9::text[], $10::int8[], $11::int8[], $12::int8[], \
    $13::bool[], $14::bytea[]) WHERE EXISTS (SELECT 1 FROM revision) \
    ON CONFLICT (name) DO NOTHING RETURNING 1), \
    deleted AS (DELETE FROM gateways WHERE name = ANY($15) AND EXISTS (SELECT 1 FROM revision) \
    RETURNING 1), \
    events AS (INSERT INTO gateway_events \
    (revision, event_type, name, object, created_at_ms, prev_labels, prev_object) \
    SELECT * FROM UNNEST($16::int8[], $17::int4[], $18::text[], $19::bytea[], $20::int8[], \
    $21::bytea[], $22::bytea[]) WHERE EXISTS (SELECT 1 FROM revision)), \
    notified AS (SELECT pg_notify($24, $23::text || ' ' || $30) FROM revision) \
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM revision) THEN false \
    WHEN (SELECT COUNT(*) FROM updated) <> $26 OR (SELECT COUNT(*) FROM inserted) <> $27 \
    OR (SELECT COUNT(*) FROM deleted) <> $28 THEN gantry_abort_batch($29) \
    ELSE (SELECT COUNT(*) FROM notified) = 1 END";
/// The SQLSTATE `gantry_abort_batch` raises (migration 0004).
const ABORTED_BATCH: &str = "GA001";
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
    /// Names this store's commits in their notifications, so that its
    /// listener leaves them to its writer ([`notified_revision`]).
    origin: Arc<str>,
    /// The rows the last batches read or wrote (shared by the clones that
    /// write: checked by each batch's compare-and-set).
    known: Arc<std::sync::Mutex<KnownRows>>,
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
        let known = Arc::default();
        let origin = format!("{:016x}", fastrand::u64(..)).into();
        let storage = Self { pool, background, writes, page_token_key, origin, known };
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
        let names = batch_names(&writes);
        let mut conn = self.pool.acquire().await?;
        // Every row known as of this writer's last commit: no read.
        let known = self.known_rows().lookup(&names);
        if let Some((base, stored)) = known {
            match write_planned(&mut conn, &stored, base, &writes, &self.origin, true).await {
                Ok(Outcome::Written(plan)) => return Ok(self.remember(base, &stored, &names, plan)),
                // Nothing changed (answered from a read), another writer
                // came first, or the rows were not as known.
                Ok(Outcome::Unchanged(_) | Outcome::Raced) | Err(StorageError::NotCommitted(_)) => {
                    self.known_rows().forget();
                }
                Err(e) => {
                    self.known_rows().forget();
                    return Err(e);
                }
            }
        }
        let read = sqlx::query_as(READ_BATCH).bind(&names).fetch_all(&mut *conn).await?;
        let (base, stored) = read_rows(read);
        match write_planned(&mut conn, &stored, base, &writes, &self.origin, true).await {
            Ok(Outcome::Written(plan)) => return Ok(self.remember(base, &stored, &names, plan)),
            Ok(Outcome::Unchanged(plan)) => return Ok(plan.results),
            Ok(Outcome::Raced) => self.known_rows().forget(),
            Err(e) => {
                self.known_rows().forget();
                return Err(e);
            }
        }
        // Another replica committed between the read and the write: again,
        // behind it, holding the revision lock from before the read.
        let mut tx = conn.begin_with(BEGIN_AND_LOCK).await?;
        let read = sqlx::query_as(READ_BATCH).bind(&names).fetch_all(&mut *tx).await?;
        let (base, stored) = read_rows(read);
        let plan = match write_planned(&mut tx, &stored, base, &writes, &self.origin, false).await?
        {
            Outcome::Unchanged(plan) => return Ok(plan.results),
            Outcome::Written(plan) => plan,
            Outcome::Raced => {
                let moved = "the revision moved under the batch's lock";
                return Err(StorageError::NotCommitted(moved.into()));
            }
        };
        // Sent: from here a failure leaves the outcome unknown.
        tx.commit().await.map_err(|e| StorageError::CommitUnknown(e.to_string()))?;
        Ok(self.remember(base, &stored, &names, plan))
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
            let notification = listener.recv().await?;
            if let Some(revision) = notified_revision(notification.payload(), &self.origin) {
                committed(revision);
            }
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

impl PostgresStorage {
    fn known_rows(&self) -> std::sync::MutexGuard<'_, KnownRows> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps the rows `plan` committed (made on `stored` as of `base`);
    /// its answers.
    fn remember(
        &self,
        base: i64,
        stored: &HashMap<String, StoredRow>,
        names: &[String],
        plan: BatchPlan,
    ) -> Vec<Result<Committed, StorageError>> {
        self.known_rows().committed(base, stored, names, &plan);
        plan.results
    }
}

/// What [`READ_BATCH`] answers: the revision, and each row's name and
/// object.
type ReadRows = Vec<(i64, Option<String>, Option<Vec<u8>>)>;

/// The revision and the decoded rows of what [`READ_BATCH`] answered.
fn read_rows(read: ReadRows) -> (i64, HashMap<String, StoredRow>) {
    let base = read.first().map_or(0, |(revision, _, _)| *revision);
    let rows = read.into_iter().filter_map(|(_, name, object)| Some((name?, object?)));
    (base, stored_rows(rows.collect()))
}

/// What [`write_planned`] did.
enum Outcome {
    /// Stored and, when alone, committed.
    Written(BatchPlan),
    /// The rules changed nothing: nothing written, the answers stand as
    /// of the rows given.
    Unchanged(BatchPlan),
    /// Another writer moved the revision since `base`: nothing written.
    Raced,
}

/// Runs the rules of `writes` over `stored`, the rows as of revision
/// `base`, and stores the outcome with [`WRITE_BATCH`] if the revision is
/// still `base`. `alone`: the statement commits on its own, so a failure on
/// the way leaves its outcome unknown; otherwise the caller's transaction
/// commits it.
async fn write_planned(
    conn: &mut sqlx::PgConnection,
    stored: &HashMap<String, StoredRow>,
    base: i64,
    writes: &[PendingWrite],
    origin: &str,
    alone: bool,
) -> Result<Outcome, StorageError> {
    let plan = plan_batch(stored, writes, base);
    if plan.revision == base {
        return Ok(Outcome::Unchanged(plan));
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
    let count = |n: usize| n as i64;
    let query = inserts.bind(updates.bind(sqlx::query_as(WRITE_BATCH)));
    let written: Result<(bool,), sqlx::Error> = query
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
        .bind(base)
        .bind(count(updates.names.len()))
        .bind(count(inserts.names.len()))
        .bind(count(deletes.len()))
        .bind(changed_behind_our_back(&plan_names(&plan)))
        .bind(origin)
        .fetch_one(&mut *conn)
        .await;
    match written {
        Ok((true,)) => Ok(Outcome::Written(plan)),
        Ok((false,)) => Ok(Outcome::Raced),
        // The database answered with an error: the statement (and, when
        // alone, its transaction) rolled back.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(ABORTED_BATCH) => {
            Err(StorageError::NotCommitted(e.message().to_string()))
        }
        Err(e @ sqlx::Error::Database(_)) => Err(e.into()),
        Err(e) if alone => Err(StorageError::CommitUnknown(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// What a commit notification asks of the listener of the store whose
/// writer is `origin`: `None`, nothing, when that writer made the commit
/// (it publishes its own events once its commit is answered; read back,
/// each would cost a query whenever the notification outran the answer);
/// otherwise the revision to read up to, or `Some(None)`, read whatever is
/// new, when the payload names none (a store before origins were sent).
/// The payload is `"{revision} {origin}"`.
fn notified_revision(payload: &str, origin: &str) -> Option<Option<i64>> {
    let (revision, from) = payload.split_once(' ').unwrap_or((payload, ""));
    (from != origin).then(|| revision.parse().ok())
}

/// The names of the rows `plan` changes, for an error.
fn plan_names(plan: &BatchPlan) -> String {
    plan.rows.iter().map(|row| row.name.as_str()).collect::<Vec<_>>().join(", ")
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

#[cfg(test)]
mod tests {
    use super::notified_revision;

    #[test]
    fn a_store_leaves_its_own_commits_to_its_writer_and_reads_the_others() {
        assert_eq!(notified_revision("42 00000000000000aa", "00000000000000aa"), None);
        assert_eq!(notified_revision("42 00000000000000bb", "00000000000000aa"), Some(Some(42)));
        // From a store that sends the revision alone, or an unreadable one.
        assert_eq!(notified_revision("42", "00000000000000aa"), Some(Some(42)));
        assert_eq!(notified_revision("", "00000000000000aa"), Some(None));
        assert_eq!(notified_revision("x 00000000000000bb", "00000000000000aa"), Some(None));
    }
}
