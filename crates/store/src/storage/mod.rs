//! Persistence: one [`Storage`] trait, one module per backend.
//!
//! Writes arrive in batches from the group-commit writer
//! ([`crate::writer`]): the backend opens one transaction, and for each write
//! reads the row under its lock, hands the stored object to a pure rule from
//! `gantry_core::lifecycle`, and, if the rule produced a change, writes the
//! row and its event row under the next revision. A write fails alone only
//! before it has changed anything (a rule refused it, the name was taken, a
//! row did not decode); a database error fails the whole batch, so nothing
//! is ever half written. The store revision is locked and read once per
//! batch and stored once at its end: three statements per write, and one
//! lock order (revision, then rows) for every writer. Callers are answered
//! only after the commit is durable.

use std::collections::BTreeMap;
use std::sync::Arc;

use gantry_api::v1::{EventType, Gateway, ObjectMeta};
use gantry_core::{RuleError, Write};
use prost::Message;

pub mod postgres;
pub mod sqlite;

/// A write rule run under the row lock: given the stored object, decide
/// what to store.
pub type Mutation = Box<dyn FnOnce(Option<&Gateway>) -> Result<Write, RuleError> + Send>;

/// One write waiting for its batch.
pub struct PendingWrite {
    pub name: String,
    pub mutation: Mutation,
}

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingWrite").field("name", &self.name).finish_non_exhaustive()
    }
}

/// One committed change, as the watch delivers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub revision: i64,
    pub kind: EventType,
    /// The object after the change (for DELETED, its last state).
    pub gateway: Arc<Gateway>,
    /// Labels before the change; `None` for ADDED.
    pub prev_labels: Option<BTreeMap<String, String>>,
}

impl Event {
    pub fn name(&self) -> &str {
        self.gateway.metadata.as_ref().map_or("", |m| m.name.as_str())
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.gateway.metadata.as_ref().map(|m| &m.labels)
    }
}

/// The outcome of a committed (or no-op) write.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// The object as stored (for a removal, its last state).
    pub gateway: Gateway,
    /// The event written, or `None` when nothing changed.
    pub event: Option<Arc<Event>>,
}

/// A page of gateways in name order and the revision it is consistent with.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub gateways: Vec<Gateway>,
    pub revision: i64,
}

/// How much event history to keep: events beyond the newest `max_events`,
/// and events older than `max_age_ms`, are compacted away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_events: i64,
    pub max_age_ms: i64,
}

/// Errors of the persistence layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A domain rule rejected the write; nothing was written.
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// The database failed or could not be reached; the write did not commit.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The batch this write was in did not commit.
    #[error("the transaction did not commit: {0}")]
    NotCommitted(String),
    /// Migrations could not be applied.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not decode.
    #[error("stored gateway {name:?} is corrupt: {reason}")]
    Corrupt { name: String, reason: String },
    /// The history after `requested` has been compacted.
    #[error(
        "revision {requested} is older than the retained history (compacted up to {compacted})"
    )]
    Compacted { requested: i64, compacted: i64 },
}

/// The store's persistence. Implementations must make each write atomic
/// and durable, and assign revisions in commit order.
#[tonic::async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    /// The stored gateway of that name.
    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError>;

    /// Up to `limit` gateways with names after `after`, in name order, read
    /// in one snapshot together with the current revision.
    async fn list(&self, after: &str, limit: usize) -> Result<Snapshot, StorageError>;

    /// Runs the writes in order in one transaction and commits. The outer
    /// error means nothing committed; otherwise each write has its result.
    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError>;

    /// Up to `limit` events after revision `after`, in revision order, or
    /// `Compacted` when history after `after` is no longer complete.
    async fn events_after(&self, after: i64, limit: usize)
        -> Result<Vec<Arc<Event>>, StorageError>;

    /// The newest committed revision.
    async fn current_revision(&self) -> Result<i64, StorageError>;

    /// Drops old events per `retention`; returns the compacted revision.
    async fn compact(&self, retention: Retention) -> Result<i64, StorageError>;

    /// Runs until an error, waking `wake` whenever another process may have
    /// committed. Backends with a single writer process never wake it.
    async fn listen_for_commits(&self, wake: Arc<tokio::sync::Notify>) -> Result<(), StorageError> {
        let _ = wake;
        std::future::pending().await
    }

    /// Checks that the database answers (readiness).
    async fn ping(&self) -> Result<(), StorageError>;

    /// Which backend this is, for logs and metrics.
    fn backend(&self) -> &'static str;
}

/// Decodes a stored object.
pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<Gateway, StorageError> {
    Gateway::decode(bytes)
        .map_err(|e| StorageError::Corrupt { name: name.to_string(), reason: e.to_string() })
}

/// Encodes labels for the `prev_labels` column.
pub(crate) fn encode_labels(labels: &BTreeMap<String, String>) -> Vec<u8> {
    ObjectMeta { labels: labels.clone(), ..Default::default() }.encode_to_vec()
}

/// Decodes an event row.
pub(crate) fn decode_event(
    revision: i64,
    kind: i32,
    name: &str,
    object: &[u8],
    prev_labels: Option<&[u8]>,
) -> Result<Arc<Event>, StorageError> {
    let corrupt = |reason: String| StorageError::Corrupt { name: name.to_string(), reason };
    let kind = EventType::try_from(kind).map_err(|e| corrupt(e.to_string()))?;
    let prev_labels = prev_labels
        .map(|bytes| {
            ObjectMeta::decode(bytes).map(|m| m.labels).map_err(|e| corrupt(e.to_string()))
        })
        .transpose()?;
    Ok(Arc::new(Event { revision, kind, gateway: Arc::new(decode(name, object)?), prev_labels }))
}

/// SQL shared by both backends (`$N` placeholders work on SQLite too).
pub(crate) mod sql {
    pub const SELECT_OBJECT: &str = "SELECT object FROM gateways WHERE name = $1";
    /// Locks the revision row for the batch (a plain SELECT would not on
    /// PostgreSQL) and reads it.
    pub const LOCK_REVISION: &str =
        "UPDATE store_revision SET revision = revision WHERE id = 1 RETURNING revision";
    pub const SET_REVISION: &str = "UPDATE store_revision SET revision = $1 WHERE id = 1";
    pub const CURRENT_REVISION: &str = "SELECT revision FROM store_revision WHERE id = 1";
    /// Inserts nothing when the name is taken (by another replica since
    /// the row was read): an error would abort a PostgreSQL transaction.
    pub const INSERT: &str = "INSERT INTO gateways \
        (name, uid, generation, observed_generation, resource_version, deleting, object) \
        VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING";
    pub const UPDATE: &str = "UPDATE gateways SET uid = $2, generation = $3, \
        observed_generation = $4, resource_version = $5, deleting = $6, object = $7 WHERE name = $1";
    pub const DELETE: &str = "DELETE FROM gateways WHERE name = $1";
    pub const INSERT_EVENT: &str = "INSERT INTO gateway_events \
        (revision, event_type, name, object, created_at_ms, prev_labels) VALUES ($1, $2, $3, $4, $5, $6)";
    pub const LIST: &str =
        "SELECT name, object FROM gateways WHERE name > $1 ORDER BY name LIMIT $2";
    pub const COMPACTED_REVISION: &str = "SELECT revision FROM store_compaction WHERE id = 1";
    pub const EVENTS_AFTER: &str = "SELECT revision, event_type, name, object, prev_labels \
        FROM gateway_events WHERE revision > $1 ORDER BY revision LIMIT $2";
    /// The revision to compact up to: every event older than the age
    /// cutoff ($2) or beyond the newest $3 events before the head ($1).
    pub const COMPACTION_TARGET: &str = "SELECT COALESCE(MAX(revision), 0) FROM gateway_events \
        WHERE created_at_ms < $2 OR revision <= $1 - $3";
    pub const DELETE_EVENTS: &str = "DELETE FROM gateway_events WHERE revision <= $1";
    pub const SET_COMPACTED: &str =
        "UPDATE store_compaction SET revision = $1 WHERE id = 1 AND revision < $1";
}

/// Runs one write inside the open transaction `$tx`; `$select` reads the
/// row and takes its lock; `$revision` is the last revision assigned and
/// advances only when the write changed something. Evaluates to
/// `Result<Committed, StorageError>`; only a `Database` error can come
/// after a statement changed something. A macro because the body is the
/// same for both backends while their transaction types differ.
macro_rules! write_one {
    ($tx:ident, $name:expr, $mutation:expr, $select:expr, $revision:expr) => {
        async {
            use gantry_api::v1::EventType;
            use prost::Message as _;
            use std::sync::Arc;
            use $crate::storage::{
                decode, encode_labels, now_ms, sql, Committed, Event, StorageError,
            };
            let name: &str = $name;
            let row: Option<(Vec<u8>,)> =
                sqlx::query_as($select).bind(name).fetch_optional(&mut *$tx).await?;
            let current = row.map(|(bytes,)| decode(name, &bytes)).transpose()?;
            let existed = current.is_some();
            let prev_labels =
                current.as_ref().and_then(|g| g.metadata.as_ref()).map(|m| m.labels.clone());
            let (mut gateway, kind) = match ($mutation)(current.as_ref())? {
                gantry_core::Write::Unchanged(gateway) => {
                    return Ok(Committed { gateway, event: None })
                }
                gantry_core::Write::Put(g) if existed => (g, EventType::Modified),
                gantry_core::Write::Put(g) => (g, EventType::Added),
                gantry_core::Write::Remove(g) => (g, EventType::Deleted),
            };
            let revision: i64 = *$revision + 1;
            gateway.metadata.get_or_insert_with(Default::default).resource_version = revision;
            let bytes = gateway.encode_to_vec();
            let meta = gateway.metadata.clone().unwrap_or_default();
            if kind == EventType::Deleted {
                sqlx::query(sql::DELETE).bind(name).execute(&mut *$tx).await?;
            } else {
                let statement = if existed { sql::UPDATE } else { sql::INSERT };
                let result = sqlx::query(statement)
                    .bind(name)
                    .bind(&meta.uid)
                    .bind(meta.generation)
                    .bind(gateway.status.as_ref().map_or(0, |s| s.observed_generation))
                    .bind(revision)
                    .bind(meta.delete_time.is_some())
                    .bind(&bytes)
                    .execute(&mut *$tx)
                    .await;
                if result?.rows_affected() == 0 {
                    return Err(StorageError::Rule(gantry_core::RuleError::AlreadyExists(
                        name.to_string(),
                    )));
                }
            }
            sqlx::query(sql::INSERT_EVENT)
                .bind(revision)
                .bind(kind as i32)
                .bind(name)
                .bind(&bytes)
                .bind(now_ms())
                .bind(prev_labels.as_ref().map(encode_labels))
                .execute(&mut *$tx)
                .await?;
            *$revision = revision;
            let event =
                Arc::new(Event { revision, kind, gateway: Arc::new(gateway.clone()), prev_labels });
            Ok::<Committed, StorageError>(Committed { gateway, event: Some(event) })
        }
        .await
    };
}

/// Runs a batch of writes in the open transaction `$tx`. A write refused
/// before it changed anything fails alone; a database error returns from
/// the enclosing function, and the dropped transaction rolls back. Evaluates
/// to the per-write results; the caller commits when any write changed
/// something.
macro_rules! write_batch {
    ($tx:ident, $writes:expr, $select:expr) => {{
        use $crate::storage::{sql, PendingWrite, StorageError};
        let writes: Vec<PendingWrite> = $writes;
        let (base,): (i64,) = sqlx::query_as(sql::LOCK_REVISION).fetch_one(&mut *$tx).await?;
        let mut revision = base;
        let mut results = Vec::with_capacity(writes.len());
        for PendingWrite { name, mutation } in writes {
            match $crate::storage::write_one!($tx, &name, mutation, $select, &mut revision) {
                Err(StorageError::Database(e)) => return Err(StorageError::Database(e)),
                result => results.push(result),
            }
        }
        if revision != base {
            sqlx::query(sql::SET_REVISION).bind(revision).execute(&mut *$tx).await?;
        }
        results
    }};
}

pub(crate) use {write_batch, write_one};

/// The newest revision among committed results, if any changed.
pub(crate) fn last_revision(results: &[Result<Committed, StorageError>]) -> Option<i64> {
    results.iter().filter_map(|r| r.as_ref().ok()?.event.as_ref().map(|e| e.revision)).max()
}

/// Milliseconds since the Unix epoch, for event rows.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Reads a snapshot page in the open read transaction `$tx`.
macro_rules! list_in {
    ($tx:ident, $after:expr, $limit:expr) => {{
        use $crate::storage::{decode, sql, Snapshot};
        let (revision,): (i64,) =
            sqlx::query_as(sql::CURRENT_REVISION).fetch_one(&mut *$tx).await?;
        let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(sql::LIST)
            .bind($after)
            .bind(i64::try_from($limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *$tx)
            .await?;
        let gateways =
            rows.iter().map(|(name, bytes)| decode(name, bytes)).collect::<Result<_, _>>()?;
        Snapshot { gateways, revision }
    }};
}

/// Reads events after a revision in the open read transaction `$tx`,
/// checking the compaction mark in the same snapshot.
macro_rules! events_after_in {
    ($tx:ident, $after:expr, $limit:expr) => {{
        use $crate::storage::{decode_event, sql, StorageError};
        let after: i64 = $after;
        let (compacted,): (i64,) =
            sqlx::query_as(sql::COMPACTED_REVISION).fetch_one(&mut *$tx).await?;
        if after < compacted {
            return Err(StorageError::Compacted { requested: after, compacted });
        }
        let rows: Vec<(i64, i32, String, Vec<u8>, Option<Vec<u8>>)> =
            sqlx::query_as(sql::EVENTS_AFTER)
                .bind(after)
                .bind(i64::try_from($limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *$tx)
                .await?;
        rows.iter()
            .map(|(revision, kind, name, object, prev)| {
                decode_event(*revision, *kind, name, object, prev.as_deref())
            })
            .collect::<Result<Vec<_>, _>>()?
    }};
}

/// Compacts the event history in the open write transaction `$tx`;
/// evaluates to the compacted revision.
macro_rules! compact_in {
    ($tx:ident, $retention:expr) => {{
        use $crate::storage::{now_ms, sql};
        let retention: $crate::storage::Retention = $retention;
        let (head,): (i64,) = sqlx::query_as(sql::CURRENT_REVISION).fetch_one(&mut *$tx).await?;
        let (target,): (i64,) = sqlx::query_as(sql::COMPACTION_TARGET)
            .bind(head)
            .bind(now_ms() - retention.max_age_ms)
            .bind(retention.max_events)
            .fetch_one(&mut *$tx)
            .await?;
        if target > 0 {
            sqlx::query(sql::DELETE_EVENTS).bind(target).execute(&mut *$tx).await?;
            sqlx::query(sql::SET_COMPACTED).bind(target).execute(&mut *$tx).await?;
        }
        let (compacted,): (i64,) =
            sqlx::query_as(sql::COMPACTED_REVISION).fetch_one(&mut *$tx).await?;
        compacted
    }};
}

pub(crate) use {compact_in, events_after_in, list_in};
