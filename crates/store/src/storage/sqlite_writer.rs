//! SQLite's write path (rusqlite). A batch takes the write lock, reads
//! the rows it changes, runs the rules ([`plan_batch`]), stores the plan
//! with cached prepared statements and commits, all on one thread. Through
//! sqlx each call was a hand-off to SQLite's worker thread and back (two
//! per batch, the rows passed as JSON and taken apart by `json_each`).
//! Reads, migrations and compaction stay on sqlx; both use the same SQLite
//! library and file, and SQLite's lock orders their writes.
//!
//! The store's writer runs on a thread of its own ([`crate::writer`], a
//! lane), and its batches run there ([`BatchWriter::inline`]): nothing
//! else waits for that thread, and the hand-off to another thread and back
//! would cost two wake-ups a batch. Any other caller's batch is handed to
//! a thread of the writer's own, as a runtime's worker must not wait for
//! an fsync.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::oneshot;

use super::{
    batch_names, encode_labels, now_ms, plan_batch, stored_rows, BatchPlan, Committed, EventRow,
    PendingWrite, RowColumns, StorageError,
};

const REVISION: &str = "SELECT revision FROM store_revision WHERE id = 1";
const ROW: &str = "SELECT object FROM gateways WHERE name = ?1";
const PUT: &str = "INSERT INTO gateways \
    (name, uid, generation, observed_generation, resource_version, deleting, object) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
    ON CONFLICT (name) DO UPDATE SET uid = excluded.uid, generation = excluded.generation, \
    observed_generation = excluded.observed_generation, \
    resource_version = excluded.resource_version, deleting = excluded.deleting, \
    object = excluded.object";
const REMOVE: &str = "DELETE FROM gateways WHERE name = ?1";
const EVENT: &str = "INSERT INTO gateway_events \
    (revision, event_type, name, object, created_at_ms, prev_labels, prev_object) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const SET_REVISION: &str = "UPDATE store_revision SET revision = ?1 WHERE id = 1";

type Results = Vec<Result<Committed, StorageError>>;

struct Job {
    writes: Vec<PendingWrite>,
    reply: oneshot::Sender<Result<Results, StorageError>>,
}

/// The writer's connection, and the thread that runs batches handed to it;
/// the thread ends when the last clone is dropped, after the batches
/// already handed to it.
#[derive(Debug, Clone)]
pub(super) struct BatchWriter {
    conn: Arc<Mutex<Connection>>,
    jobs: mpsc::Sender<Job>,
    /// Batches run on the caller's thread.
    inline: bool,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("writes", &self.writes.len()).finish_non_exhaustive()
    }
}

impl BatchWriter {
    /// Opens the (migrated) database file at `path` and starts the thread.
    pub(super) fn open(path: &Path) -> Result<BatchWriter, StorageError> {
        let conn = open(path)
            .map_err(|e| StorageError::Setup(format!("open {} to write: {e}", path.display())))?;
        check_durability(&conn)?;
        let conn = Arc::new(Mutex::new(conn));
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = conn.clone();
        std::thread::Builder::new()
            .name("gantry-sqlite-writer".into())
            .spawn(move || {
                for job in queue {
                    // The caller may have gone away; the batch stands.
                    let _ = job.reply.send(write_batch(&mut lock(&thread), job.writes));
                }
            })
            .map_err(|e| StorageError::Setup(format!("start the SQLite writer thread: {e}")))?;
        Ok(BatchWriter { conn, jobs, inline: false })
    }

    /// The same writer, running each batch on the thread that calls
    /// [`BatchWriter::write`], which waits for its commit: for a caller
    /// with a thread of its own (the store's writer lane).
    pub(super) fn inline(&self) -> BatchWriter {
        BatchWriter { inline: true, ..self.clone() }
    }

    /// Runs `writes` in one transaction: each write's answer, or why the
    /// batch did not commit.
    pub(super) async fn write(&self, writes: Vec<PendingWrite>) -> Result<Results, StorageError> {
        if self.inline {
            return write_batch(&mut lock(&self.conn), writes);
        }
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { writes, reply }).map_err(|_| {
            StorageError::NotCommitted("the SQLite writer thread has stopped".into())
        })?;
        answer.await.map_err(|_| {
            StorageError::CommitUnknown("the SQLite writer thread stopped during the batch".into())
        })?
    }
}

/// The connection, whatever a batch that panicked left: its transaction
/// was dropped, so rolled back.
fn lock(conn: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(PoisonError::into_inner)
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    // No mutex of SQLite's own: one thread at a time uses the connection
    // (behind the writer's lock).
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

/// The writer's connection keeps every acknowledged write through a
/// crash: the file is in WAL mode (sqlx's connections made it so) and
/// commits are synced (`synchronous = FULL`, 2).
fn check_durability(conn: &Connection) -> Result<(), StorageError> {
    let read = |pragma: &str| {
        conn.pragma_query_value(None, pragma, |r| r.get::<_, rusqlite::types::Value>(0))
            .map_err(|e| StorageError::Setup(format!("read PRAGMA {pragma}: {e}")))
    };
    let (journal, synchronous) = (read("journal_mode")?, read("synchronous")?);
    let wal = matches!(&journal, rusqlite::types::Value::Text(mode) if mode == "wal");
    let full = matches!(synchronous, rusqlite::types::Value::Integer(2));
    if !(wal && full) {
        return Err(StorageError::NotDurable(format!(
            "the SQLite writer's connection has journal_mode {journal:?} and synchronous \
             {synchronous:?}; it needs WAL and FULL (2)"
        )));
    }
    Ok(())
}

/// Why a statement of the batch failed; nothing of it is committed.
fn not_committed(e: rusqlite::Error) -> StorageError {
    StorageError::NotCommitted(format!("SQLite: {e}"))
}

fn write_batch(conn: &mut Connection, writes: Vec<PendingWrite>) -> Result<Results, StorageError> {
    // The write lock up front: no row read here can change before the
    // batch writes. Dropped before its COMMIT, the transaction rolls back.
    let tx =
        conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(not_committed)?;
    let base: i64 = tx
        .prepare_cached(REVISION)
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(not_committed)?;
    let mut rows = Vec::new();
    {
        let mut read = tx.prepare_cached(ROW).map_err(not_committed)?;
        for name in batch_names(&writes) {
            let object = read.query_row([&name], |r| r.get::<_, Vec<u8>>(0)).optional();
            if let Some(object) = object.map_err(not_committed)? {
                rows.push((name, object));
            }
        }
    }
    let plan = plan_batch(&stored_rows(rows), &writes, base);
    if plan.revision == base {
        // Nothing changed; the transaction rolls back.
        return Ok(plan.results);
    }
    store(&tx, &plan)?;
    match tx.execute_batch("COMMIT") {
        Ok(()) => Ok(plan.results),
        // Still open: the drop rolls it back, nothing is committed.
        Err(e) if !tx.is_autocommit() => Err(not_committed(e)),
        // SQLite ended the transaction itself: the commit may have been
        // under way.
        Err(e) => Err(StorageError::CommitUnknown(format!("SQLite: {e}"))),
    }
}

/// Stores `plan`'s rows, events and revision; each statement must change
/// exactly one row (the write lock makes anything else a bug, refused
/// before the commit).
fn store(conn: &Connection, plan: &BatchPlan) -> Result<(), StorageError> {
    let one = |changed: rusqlite::Result<usize>, what: &str| match changed.map_err(not_committed)? {
        1 => Ok(()),
        n => Err(StorageError::NotCommitted(format!("{what} changed {n} rows, not 1"))),
    };
    let prepare = |sql| conn.prepare_cached(sql).map_err(not_committed);
    let (mut put, mut remove) = (prepare(PUT)?, prepare(REMOVE)?);
    for row in &plan.rows {
        match plan.after(row) {
            None => one(remove.execute([&row.name]), "a gateway's removal")?,
            Some((gateway, bytes)) => {
                let c = RowColumns::of(gateway);
                let changed = put.execute(rusqlite::params![
                    row.name,
                    c.uid,
                    c.generation,
                    c.observed_generation,
                    c.resource_version,
                    c.deleting,
                    bytes
                ]);
                one(changed, "a gateway's row")?;
            }
        }
    }
    let (mut event, created_at) = (prepare(EVENT)?, now_ms());
    for row @ EventRow { event: e, prev, .. } in &plan.events {
        let labels = e.prev_labels.as_ref().map(encode_labels);
        let changed = event.execute(rusqlite::params![
            e.revision,
            e.kind as i32,
            e.name(),
            row.bytes(),
            created_at,
            labels,
            prev
        ]);
        one(changed, "an event")?;
    }
    one(prepare(SET_REVISION)?.execute([plan.revision]), "the store revision")
}

#[cfg(test)]
mod tests {
    use gantry_api::v1::{GatewaySpec, ObjectMeta};

    use super::*;
    use crate::storage::sqlite::SqliteStorage;
    use crate::storage::{Storage, Write};

    fn put(name: &str, image: &str) -> PendingWrite {
        let gateway = gantry_api::v1::Gateway {
            metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
            spec: Some(GatewaySpec { image: image.into(), ..Default::default() }),
            status: None,
        };
        PendingWrite {
            name: name.into(),
            mutation: Box::new(move |_| Ok(Write::Put(gateway.clone()))),
            dry_run: false,
        }
    }

    async fn image(storage: &SqliteStorage, name: &str) -> Option<String> {
        storage.get(name).await.unwrap().and_then(|g| Some(g.spec?.image))
    }

    async fn storage(label: &str) -> (SqliteStorage, std::path::PathBuf) {
        let file = gantry_testkit::temp_dir(label).join("gantry.db");
        let storage = SqliteStorage::open(&format!("sqlite://{}", file.display())).await.unwrap();
        (storage, file)
    }

    #[tokio::test]
    async fn a_batch_waits_for_the_write_lock_another_connection_holds() {
        let (storage, file) = storage("writer-waits").await;
        // Compaction, or another process, holding SQLite's write lock.
        let other = Connection::open(&file).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let batch = tokio::spawn({
            let storage = storage.clone();
            async move { storage.write_batch(vec![put("a", "v1")]).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!batch.is_finished(), "the batch did not wait for the lock");
        other.execute_batch("COMMIT").unwrap();
        batch.await.unwrap().unwrap().remove(0).unwrap();
        assert_eq!(image(&storage, "a").await.as_deref(), Some("v1"));
    }

    #[tokio::test]
    async fn objects_of_several_kb_and_a_remove_then_recreate_are_stored_as_planned() {
        let (storage, _) = storage("writer-large").await;
        let large = |name: &str, fill: char| {
            let gateway = gantry_api::v1::Gateway {
                metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
                spec: Some(GatewaySpec {
                    image: "gw:1".into(),
                    config: [("blob".to_string(), fill.to_string().repeat(48 * 1024))].into(),
                    ..Default::default()
                }),
                status: None,
            };
            PendingWrite {
                name: name.into(),
                mutation: Box::new(move |_| Ok(Write::Put(gateway.clone()))),
                dry_run: false,
            }
        };
        let remove = |name: &str| PendingWrite {
            name: name.into(),
            mutation: Box::new(|current| Ok(Write::Remove(current.cloned().unwrap()))),
            dry_run: false,
        };
        let start = storage.current_revision().await.unwrap();
        storage.write_batch(vec![large("a", 'a'), large("b", 'b')]).await.unwrap();
        // One batch: b removed and made again, a changed, c new.
        let results = storage
            .write_batch(vec![remove("b"), large("b", 'B'), large("a", 'A'), large("c", 'c')])
            .await
            .unwrap();
        let committed: Vec<Committed> = results.into_iter().map(Result::unwrap).collect();
        for (name, fill) in [("a", 'A'), ("b", 'B'), ("c", 'c')] {
            let stored = storage.get(name).await.unwrap().unwrap();
            let blob = &stored.spec.as_ref().unwrap().config["blob"];
            assert_eq!(blob.len(), 48 * 1024);
            assert!(blob.chars().all(|c| c == fill), "{name} holds another object's bytes");
        }
        // Every event in order, each with the object the batch planned.
        let events = storage.events_after(start, 100, usize::MAX).await.unwrap();
        let revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
        assert_eq!(revisions, ((start + 1)..=(start + 6)).collect::<Vec<_>>());
        for (event, planned) in events[2..].iter().zip(&committed) {
            let planned = planned.event.as_ref().unwrap();
            assert_eq!((event.kind, &event.encoded), (planned.kind, &planned.encoded));
        }
        assert_eq!(storage.current_revision().await.unwrap(), start + 6);
    }

    /// The store's writer runs batches on its own thread; anyone else's go
    /// to the writer's thread, never blocking a runtime's worker.
    #[test]
    fn the_writer_lane_runs_its_batches_itself_and_other_callers_hand_them_over() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (storage, _) = runtime.block_on(storage("writer-inline"));
        let ran_on = Arc::new(Mutex::new(Vec::new()));
        let write = |name: &str| {
            let ran_on = ran_on.clone();
            let gateway = gantry_api::v1::Gateway {
                metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
                ..Default::default()
            };
            PendingWrite {
                name: name.into(),
                mutation: Box::new(move |_| {
                    ran_on.lock().unwrap().push(std::thread::current().name().map(String::from));
                    Ok(Write::Put(gateway.clone()))
                }),
                dry_run: false,
            }
        };
        let lane =
            crate::lane::Lane::start("writer-lane-test", crate::lane::Priority::Normal).unwrap();
        let writer = storage.for_writer();
        let batch = write("a");
        let on_lane = lane.spawn(async move { writer.write_batch(vec![batch]).await });
        runtime.block_on(on_lane).unwrap().unwrap().remove(0).unwrap();
        runtime.block_on(storage.write_batch(vec![write("b")])).unwrap().remove(0).unwrap();
        let threads = ran_on.lock().unwrap().clone();
        assert_eq!(
            threads,
            [Some("writer-lane-test".to_string()), Some("gantry-sqlite-writer".to_string())]
        );
        for name in ["a", "b"] {
            assert!(runtime.block_on(storage.get(name)).unwrap().is_some(), "{name} not stored");
        }
    }

    #[test]
    fn a_file_not_in_wal_mode_is_refused() {
        let file = gantry_testkit::temp_dir("writer-journal").join("gantry.db");
        Connection::open(&file).unwrap().execute_batch("PRAGMA journal_mode = DELETE").unwrap();
        let refused = BatchWriter::open(&file).expect_err("a rollback-journal file was accepted");
        assert!(
            matches!(refused, StorageError::NotDurable(ref m) if m.contains("WAL")),
            "{refused}"
        );
    }
}
