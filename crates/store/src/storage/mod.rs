//! Persistence: one [`Storage`] trait, one module per backend.
//!
//! Writes arrive in batches from the group-commit writer
//! ([`crate::writer`]). A backend runs a batch in one transaction with a
//! constant number of statements per batch where the database allows it:
//! lock and read the store revision, read every row the batch names, run
//! the pure rules from `gantry_core::lifecycle` over them in memory
//! ([`plan_batch`]), then store the changed rows, the events and the new
//! revision, and commit. A write refused by its rule fails alone; a
//! database error fails the whole batch, so nothing is ever half written.
//! Callers are answered only after the commit is durable.

use std::collections::{BTreeMap, HashMap};
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
    /// The commit was sent and failed on the way: it may or may not have
    /// committed.
    #[error("the commit's outcome is unknown: {0}")]
    CommitUnknown(String),
    /// The database would not keep acknowledged writes through a crash.
    #[error("{0}")]
    NotDurable(String),
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

    /// The durability settings in force on the store's own connections, as
    /// `name=value` pairs (checked at open; a test reads them).
    async fn durability(&self) -> Result<Vec<(String, String)>, StorageError>;

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

/// SQL shared by both backends (`$N` placeholders work on SQLite too);
/// each backend keeps the statements only it runs.
pub(crate) mod sql {
    pub const SELECT_OBJECT: &str = "SELECT object FROM gateways WHERE name = $1";
    /// Locks the revision row for the batch (a plain SELECT would not on
    /// PostgreSQL) and reads it. Every writer takes it first, so writers
    /// serialize on it and rows need no locks of their own.
    pub const LOCK_REVISION: &str =
        "UPDATE store_revision SET revision = revision WHERE id = 1 RETURNING revision";
    pub const SET_REVISION: &str = "UPDATE store_revision SET revision = $1 WHERE id = 1";
    pub const CURRENT_REVISION: &str = "SELECT revision FROM store_revision WHERE id = 1";
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

/// A stored row as a batch read it: the object, or why it does not decode.
pub(crate) type StoredRow = Result<Gateway, String>;

/// A row a batch changed.
#[derive(Debug)]
pub(crate) struct RowWrite {
    pub name: String,
    /// The row existed before the batch: UPDATE or DELETE, not INSERT.
    pub existed: bool,
    /// Index in [`BatchPlan::events`] of the row's last change.
    last: usize,
}

/// The indexed columns of a stored row besides its name and object.
#[derive(Debug)]
pub(crate) struct RowColumns<'a> {
    pub uid: &'a str,
    pub generation: i64,
    pub observed_generation: i64,
    pub resource_version: i64,
    pub deleting: bool,
}

impl<'a> RowColumns<'a> {
    pub fn of(gateway: &'a Gateway) -> Self {
        let meta = gateway.metadata.as_ref();
        Self {
            uid: meta.map_or("", |m| m.uid.as_str()),
            generation: meta.map_or(0, |m| m.generation),
            observed_generation: gateway.status.as_ref().map_or(0, |s| s.observed_generation),
            resource_version: meta.map_or(0, |m| m.resource_version),
            deleting: meta.is_some_and(|m| m.delete_time.is_some()),
        }
    }
}

/// What a batch's rules decided: the answer to each write, the rows and
/// events to store, and the last revision assigned.
#[derive(Debug)]
pub(crate) struct BatchPlan {
    pub results: Vec<Result<Committed, StorageError>>,
    pub rows: Vec<RowWrite>,
    /// Each event with the encoding of its object.
    pub events: Vec<(Arc<Event>, Vec<u8>)>,
    pub revision: i64,
}

impl BatchPlan {
    /// What to store in `row`: the object and its encoding, or `None` when
    /// its last change removed it.
    pub fn after(&self, row: &RowWrite) -> Option<(&Gateway, &[u8])> {
        let (event, bytes) = &self.events[row.last];
        (event.kind != EventType::Deleted).then(|| (event.gateway.as_ref(), bytes.as_slice()))
    }
}

/// Runs the writes' rules in order over the rows the batch read (`stored`,
/// by name; absent means no row), each write seeing the ones before it.
/// Every change gets the next revision after `base`; a write its rule
/// refuses, or whose row does not decode, fails alone and spends nothing.
/// Pure: the backends read before and store after.
pub(crate) fn plan_batch(
    stored: &HashMap<String, StoredRow>,
    writes: Vec<PendingWrite>,
    base: i64,
) -> BatchPlan {
    // Names changed so far, with the index of their last event.
    let mut last_change: BTreeMap<String, usize> = BTreeMap::new();
    let mut results = Vec::with_capacity(writes.len());
    let mut events: Vec<(Arc<Event>, Vec<u8>)> = Vec::new();
    let mut revision = base;
    for PendingWrite { name, mutation } in writes {
        let state = match last_change.get(&name) {
            Some(&i) => {
                let event = &events[i].0;
                (event.kind != EventType::Deleted).then_some(event.gateway.as_ref())
            }
            None => match stored.get(&name) {
                Some(Ok(g)) => Some(g),
                Some(Err(reason)) => {
                    results.push(Err(StorageError::Corrupt { name, reason: reason.clone() }));
                    continue;
                }
                None => None,
            },
        };
        let prev_labels = state.and_then(|g| g.metadata.as_ref()).map(|m| m.labels.clone());
        let (mut gateway, kind) = match mutation(state) {
            Err(e) => {
                results.push(Err(e.into()));
                continue;
            }
            Ok(Write::Unchanged(gateway)) => {
                results.push(Ok(Committed { gateway, event: None }));
                continue;
            }
            Ok(Write::Put(g)) if state.is_some() => (g, EventType::Modified),
            Ok(Write::Put(g)) => (g, EventType::Added),
            Ok(Write::Remove(g)) => (g, EventType::Deleted),
        };
        revision += 1;
        gateway.metadata.get_or_insert_with(Default::default).resource_version = revision;
        let bytes = gateway.encode_to_vec();
        let event =
            Arc::new(Event { revision, kind, gateway: Arc::new(gateway.clone()), prev_labels });
        last_change.insert(name, events.len());
        events.push((event.clone(), bytes));
        results.push(Ok(Committed { gateway, event: Some(event) }));
    }
    let rows = last_change
        .into_iter()
        .filter_map(|(name, last)| {
            let existed = stored.contains_key(&name);
            // Created and removed within the batch: no row to touch.
            let removed = events[last].0.kind == EventType::Deleted;
            (existed || !removed).then_some(RowWrite { name, existed, last })
        })
        .collect();
    BatchPlan { results, rows, events, revision }
}

/// The distinct names a batch writes, to read their rows in one statement.
pub(crate) fn batch_names(writes: &[PendingWrite]) -> Vec<String> {
    let names: std::collections::BTreeSet<&str> = writes.iter().map(|w| w.name.as_str()).collect();
    names.into_iter().map(str::to_string).collect()
}

/// Decodes the rows a batch read; a row that does not decode fails only
/// the writes to it.
pub(crate) fn stored_rows(rows: Vec<(String, Vec<u8>)>) -> HashMap<String, StoredRow> {
    rows.into_iter()
        .map(|(name, bytes)| {
            let row = Gateway::decode(bytes.as_slice()).map_err(|e| e.to_string());
            (name, row)
        })
        .collect()
}

/// Refuses settings under which an acknowledged write could be lost in a
/// crash: SQLite `synchronous` below FULL (2), PostgreSQL `fsync` or
/// `synchronous_commit` off.
pub fn check_durability(settings: &[(String, String)]) -> Result<(), StorageError> {
    for (name, value) in settings {
        let unsafe_value = match name.as_str() {
            "synchronous" => value.parse::<i64>().map_or(true, |v| v < 2),
            "fsync" | "synchronous_commit" => value == "off",
            _ => false,
        };
        if unsafe_value {
            return Err(StorageError::NotDurable(format!(
                "the database runs with {name}={value}: acknowledged writes could be lost in a crash; gateway-store refuses to start (fix the database's configuration)"
            )));
        }
    }
    Ok(())
}

/// The error when a row changed between the batch's read and its write:
/// store replicas cannot cause it (they all take the revision lock first),
/// only a writer that bypasses gateway-store.
pub(crate) fn changed_behind_our_back(name: &str) -> StorageError {
    StorageError::NotCommitted(format!(
        "gateway {name:?} was changed meanwhile by a writer outside gateway-store; \
         nothing was written, retry"
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str, image: &str) -> Gateway {
        Gateway {
            metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
            spec: Some(gantry_api::v1::GatewaySpec { image: image.into(), ..Default::default() }),
            status: None,
        }
    }

    fn put(name: &str, image: &str) -> PendingWrite {
        let g = named(name, image);
        PendingWrite { name: name.into(), mutation: Box::new(move |_| Ok(Write::Put(g))) }
    }

    fn remove(name: &str) -> PendingWrite {
        PendingWrite {
            name: name.into(),
            mutation: Box::new(|current| match current {
                Some(g) => Ok(Write::Remove(g.clone())),
                None => Err(RuleError::NotFound("gone".into())),
            }),
        }
    }

    fn kinds(plan: &BatchPlan) -> Vec<Option<EventType>> {
        plan.results
            .iter()
            .map(|r| r.as_ref().ok().and_then(|c| c.event.as_ref().map(|e| e.kind)))
            .collect()
    }

    #[test]
    fn each_write_sees_the_ones_before_it_and_rows_keep_only_the_last_state() {
        let stored = HashMap::from([("old".to_string(), Ok(named("old", "v1")))]);
        let writes =
            vec![put("new", "a"), put("new", "b"), remove("old"), put("old", "v2"), remove("gone")];
        let plan = plan_batch(&stored, writes, 10);
        assert_eq!(
            kinds(&plan),
            [
                Some(EventType::Added),
                Some(EventType::Modified),
                Some(EventType::Deleted),
                Some(EventType::Added),
                None
            ]
        );
        assert!(matches!(plan.results[4], Err(StorageError::Rule(RuleError::NotFound(_)))));
        let revisions: Vec<i64> = plan.events.iter().map(|(e, _)| e.revision).collect();
        assert_eq!(revisions, [11, 12, 13, 14], "a revision per change, none for the refusal");
        assert_eq!(plan.revision, 14);
        let rows: Vec<(&str, bool, Option<&str>)> = plan
            .rows
            .iter()
            .map(|r| {
                let image =
                    plan.after(r).and_then(|(g, _)| g.spec.as_ref()).map(|s| s.image.as_str());
                (r.name.as_str(), r.existed, image)
            })
            .collect();
        // "old" was removed and created again: its row is updated, not
        // deleted and inserted.
        assert_eq!(rows, [("new", false, Some("b")), ("old", true, Some("v2"))]);
        let (stored_new, bytes) = plan.after(&plan.rows[0]).unwrap();
        assert_eq!(stored_new.metadata.as_ref().unwrap().resource_version, 12);
        assert_eq!(Gateway::decode(bytes).unwrap(), *stored_new);
    }

    #[test]
    fn a_gateway_created_and_removed_in_one_batch_touches_no_row() {
        let plan = plan_batch(&HashMap::new(), vec![put("x", "a"), remove("x")], 1);
        assert_eq!(plan.events.len(), 2);
        assert!(plan.rows.is_empty());
    }

    #[test]
    fn a_row_that_does_not_decode_fails_only_the_writes_to_it() {
        let stored = HashMap::from([("bad".to_string(), Err("truncated".to_string()))]);
        let plan = plan_batch(&stored, vec![put("bad", "a"), put("good", "a")], 1);
        assert!(
            matches!(plan.results[0], Err(StorageError::Corrupt { ref name, .. }) if name == "bad")
        );
        assert_eq!(kinds(&plan)[1], Some(EventType::Added));
        assert_eq!(plan.revision, 2);
    }
}
