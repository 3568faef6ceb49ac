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
use prost::bytes::Bytes;
use prost::Message;

mod driver;
mod known_rows;
pub mod postgres;
pub mod sqlite;
mod sqlite_writer;

/// A write rule: given the stored object, decide what to store. A backend
/// may run it more than once (again after reading the row anew when
/// another writer committed first); only the last run's outcome counts.
pub type Mutation = Box<dyn Fn(Option<&Gateway>) -> Result<Write, RuleError> + Send + Sync>;

/// One write waiting for its batch.
pub struct PendingWrite {
    pub name: String,
    pub mutation: Mutation,
    /// Validate only: the rule runs on the batch's view of the row and its
    /// outcome is answered, but nothing is stored and no revision spent.
    pub dry_run: bool,
}

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingWrite").field("name", &self.name).finish_non_exhaustive()
    }
}

/// One committed change, as the watch delivers it: what subscribers'
/// filters read, and the object's encoding, made once and sent as is to
/// every subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub revision: i64,
    pub kind: EventType,
    pub name: String,
    /// Labels after the change (for DELETED, the last ones).
    pub labels: BTreeMap<String, String>,
    /// Labels before the change; `None` for ADDED.
    pub prev_labels: Option<BTreeMap<String, String>>,
    /// The protobuf encoding of the object after the change (for DELETED,
    /// its last state).
    pub encoded: Bytes,
}

impl Event {
    /// An event of `gateway` and its encoding.
    pub fn new(
        revision: i64,
        kind: EventType,
        gateway: &Gateway,
        prev_labels: Option<BTreeMap<String, String>>,
        encoded: Bytes,
    ) -> Self {
        let meta = gateway.metadata.as_ref();
        Self {
            revision,
            kind,
            name: meta.map(|m| m.name.clone()).unwrap_or_default(),
            labels: meta.map(|m| m.labels.clone()).unwrap_or_default(),
            prev_labels,
            encoded,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        Some(&self.labels)
    }

    /// Encoded size of the object, for the watch cache's byte budgets.
    pub fn size(&self) -> usize {
        self.encoded.len()
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
    pub gateways: Vec<Stored>,
    pub revision: i64,
    /// More gateways follow the last one of this page.
    pub more: bool,
}

/// Which page of a listing to read: names after `after`, at most `limit`
/// gateways and, past the first, at most `max_bytes` of encoded objects;
/// as of revision `at` (`None`: the current revision).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<'a> {
    pub after: &'a str,
    pub limit: usize,
    pub max_bytes: usize,
    pub at: Option<i64>,
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
    /// The store could not set itself up (e.g. no source of randomness).
    #[error("{0}")]
    Setup(String),
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
    /// The store has not reached `requested` (a revision of another store,
    /// or of this one before a restore).
    #[error("revision {requested} is a future revision: the store is at {current}")]
    Future { requested: i64, current: i64 },
}

/// The store's persistence. Implementations must make each write atomic
/// and durable, and assign revisions in commit order.
#[tonic::async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    /// The stored gateway of that name.
    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError>;

    /// A page of gateways in name order as of one revision, read in one
    /// snapshot: the current one, or an earlier one rebuilt from the event
    /// history (`Compacted` when that history is gone).
    async fn list(&self, page: Page<'_>) -> Result<Snapshot, StorageError>;

    /// The same database, read through connections of its own, for work
    /// run at a lower CPU priority ([`crate::background`]).
    fn for_background(&self) -> Arc<dyn Storage>;

    /// The same database, written through a connection of its own, for the
    /// writer's thread ([`crate::writer::THREAD`]).
    fn for_writer(&self) -> Arc<dyn Storage>;

    /// The secret that authenticates ListGateways page tokens, the same for
    /// every replica on this database.
    fn page_token_key(&self) -> &[u8];

    /// Runs the writes in order in one transaction and commits. The outer
    /// error means nothing committed; otherwise each write has its result.
    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError>;

    /// Events after revision `after` in revision order, at most `limit` and
    /// (past the first) at most `max_bytes` of encoded objects, or
    /// `Compacted` when history after `after` is no longer complete.
    async fn events_after(
        &self,
        after: i64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError>;

    /// The newest committed revision.
    async fn current_revision(&self) -> Result<i64, StorageError>;

    /// Drops old events per `retention`; returns the compacted revision.
    async fn compact(&self, retention: Retention) -> Result<i64, StorageError>;

    /// Runs until an error, calling `committed` whenever another process
    /// may have committed: with the revision committed when the backend
    /// says it, `None` when it does not (once at start, for anything
    /// committed before it listened). Backends with a single writer process
    /// never call it.
    async fn listen_for_commits(
        &self,
        committed: &(dyn Fn(Option<i64>) + Send + Sync),
    ) -> Result<(), StorageError> {
        let _ = committed;
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

/// A gateway as read from the database: its encoding, sent on as it is,
/// and what the store looks at to filter and page it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub resource_version: i64,
    /// The protobuf encoding of the gateway, as stored.
    pub encoded: Bytes,
}

impl Stored {
    /// Checks that `bytes` decode (a corrupt row is an error, not bytes
    /// passed on to a client) and keeps them.
    pub(crate) fn decode(name: &str, bytes: Vec<u8>) -> Result<Stored, StorageError> {
        let meta = decode(name, &bytes)?.metadata.unwrap_or_default();
        Ok(Stored {
            name: name.to_string(),
            labels: meta.labels,
            resource_version: meta.resource_version,
            encoded: Bytes::from(bytes),
        })
    }
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
    let gateway = decode(name, object)?;
    Ok(Arc::new(Event::new(revision, kind, &gateway, prev_labels, Bytes::copy_from_slice(object))))
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

/// An event as a batch plans it: the event, its object and the encoding
/// of the object before the change (`None` for ADDED).
#[derive(Debug)]
pub(crate) struct EventRow {
    pub event: Arc<Event>,
    pub gateway: Gateway,
    pub prev: Option<Vec<u8>>,
}

impl EventRow {
    /// The encoding of the object after the change.
    pub fn bytes(&self) -> &[u8] {
        &self.event.encoded
    }
}

/// What a batch's rules decided: the answer to each write, the rows and
/// events to store, and the last revision assigned.
#[derive(Debug)]
pub(crate) struct BatchPlan {
    pub results: Vec<Result<Committed, StorageError>>,
    pub rows: Vec<RowWrite>,
    pub events: Vec<EventRow>,
    pub revision: i64,
}

impl BatchPlan {
    /// What to store in `row`: the object and its encoding, or `None` when
    /// its last change removed it.
    pub fn after(&self, row: &RowWrite) -> Option<(&Gateway, &[u8])> {
        let EventRow { event, gateway, .. } = &self.events[row.last];
        (event.kind != EventType::Deleted).then(|| (gateway, event.encoded.as_ref()))
    }
}

/// Runs the writes' rules in order over the rows the batch read (`stored`,
/// by name; absent means no row), each write seeing the ones before it.
/// Every change gets the next revision after `base`; a write its rule
/// refuses, or whose row does not decode, fails alone and spends nothing.
/// Pure: the backends read before and store after.
pub(crate) fn plan_batch(
    stored: &HashMap<String, StoredRow>,
    writes: &[PendingWrite],
    base: i64,
) -> BatchPlan {
    // Names changed so far, with the index of their last event.
    let mut last_change: BTreeMap<String, usize> = BTreeMap::new();
    let mut results = Vec::with_capacity(writes.len());
    let mut events: Vec<EventRow> = Vec::new();
    let mut revision = base;
    for PendingWrite { name, mutation, dry_run } in writes {
        let state = match last_change.get(name) {
            Some(&i) => {
                let row = &events[i];
                (row.event.kind != EventType::Deleted).then_some(&row.gateway)
            }
            None => match stored.get(name) {
                Some(Ok(g)) => Some(g),
                Some(Err(reason)) => {
                    let (name, reason) = (name.clone(), reason.clone());
                    results.push(Err(StorageError::Corrupt { name, reason }));
                    continue;
                }
                None => None,
            },
        };
        let prev_labels = state.and_then(|g| g.metadata.as_ref()).map(|m| m.labels.clone());
        let prev = state.map(Message::encode_to_vec);
        let (mut gateway, kind) = match mutation(state) {
            Err(e) => {
                results.push(Err(e.into()));
                continue;
            }
            Ok(Write::Unchanged(gateway)) => {
                results.push(Ok(Committed { gateway, event: None }));
                continue;
            }
            Ok(Write::Put(mut gateway) | Write::Remove(mut gateway)) if *dry_run => {
                let current =
                    state.and_then(|g| g.metadata.as_ref()).map_or(0, |m| m.resource_version);
                gateway.metadata.get_or_insert_with(Default::default).resource_version = current;
                results.push(Ok(Committed { gateway, event: None }));
                continue;
            }
            Ok(Write::Put(g)) if state.is_some() => (g, EventType::Modified),
            Ok(Write::Put(g)) => (g, EventType::Added),
            Ok(Write::Remove(g)) => (g, EventType::Deleted),
        };
        revision += 1;
        gateway.metadata.get_or_insert_with(Default::default).resource_version = revision;
        let encoded = Bytes::from(gateway.encode_to_vec());
        let event = Arc::new(Event::new(revision, kind, &gateway, prev_labels, encoded));
        last_change.insert(name.clone(), events.len());
        events.push(EventRow { event: event.clone(), gateway: gateway.clone(), prev });
        results.push(Ok(Committed { gateway, event: Some(event) }));
    }
    let rows = last_change
        .into_iter()
        .filter_map(|(name, last)| {
            let existed = stored.contains_key(&name);
            // Created and removed within the batch: no row to touch.
            let removed = events[last].event.kind == EventType::Deleted;
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

/// Why a batch did not commit when a row changed between its read and its
/// write: store replicas cannot cause it (a batch writes only if the
/// revision is still the one it read), only a writer that bypasses
/// gateway-store.
pub(crate) fn changed_behind_our_back(names: &str) -> String {
    format!(
        "gateway(s) {names} changed meanwhile by a writer outside gateway-store; \
         nothing was written, retry"
    )
}

/// Milliseconds since the Unix epoch, for event rows.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Where a page ends: the last name it holds, and whether more follow.
#[derive(Debug, PartialEq)]
pub(crate) struct PageCut {
    pub last: Option<String>,
    pub more: bool,
}

/// Merges the names of unchanged rows and of rows rebuilt from history
/// (each sorted, disjoint, each at most `limit` long, with their encoded
/// sizes) and cuts the page at `limit` names or `max_bytes`, whichever
/// comes first; the first name is always taken.
pub(crate) fn page_cut(
    unchanged: &[(String, i64)],
    changed: &[(String, i64)],
    limit: usize,
    max_bytes: usize,
) -> PageCut {
    let (mut i, mut j, mut taken, mut bytes) = (0, 0, 0usize, 0usize);
    let mut last = None;
    loop {
        let next = match (unchanged.get(i), changed.get(j)) {
            (Some(a), Some(b)) if a.0 < b.0 => {
                i += 1;
                a
            }
            (_, Some(b)) => {
                j += 1;
                b
            }
            (Some(a), None) => {
                i += 1;
                a
            }
            (None, None) => {
                // A source that filled its limit may hold more.
                let more = unchanged.len() >= limit || changed.len() >= limit;
                return PageCut { last, more: more && taken > 0 };
            }
        };
        let size = usize::try_from(next.1).unwrap_or(0);
        if taken == limit || (taken > 0 && bytes + size > max_bytes) {
            return PageCut { last, more: true };
        }
        taken += 1;
        bytes += size;
        last = Some(next.0.clone());
    }
}

/// The last revision of an events page: at most `max_bytes` of objects
/// (at least one event) from `sizes` (revision, size) in revision order.
pub(crate) fn events_cut(sizes: &[(i64, i64)], max_bytes: usize) -> Option<i64> {
    let mut bytes = 0usize;
    let mut last = None;
    for &(revision, size) in sizes {
        let size = usize::try_from(size).unwrap_or(0);
        if last.is_some() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        last = Some(revision);
    }
    last
}

/// Gateways and writes for the storage modules' unit tests.
#[cfg(test)]
pub(crate) mod test_writes {
    use super::*;

    pub fn named(name: &str, image: &str) -> Gateway {
        Gateway {
            metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
            spec: Some(gantry_api::v1::GatewaySpec { image: image.into(), ..Default::default() }),
            status: None,
        }
    }

    pub fn put(name: &str, image: &str) -> PendingWrite {
        let g = named(name, image);
        PendingWrite {
            name: name.into(),
            mutation: Box::new(move |_| Ok(Write::Put(g.clone()))),
            dry_run: false,
        }
    }

    pub fn remove(name: &str) -> PendingWrite {
        PendingWrite {
            name: name.into(),
            mutation: Box::new(|current| match current {
                Some(g) => Ok(Write::Remove(g.clone())),
                None => Err(RuleError::NotFound("gone".into())),
            }),
            dry_run: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_writes::{named, put, remove};
    use super::*;

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
        let plan = plan_batch(&stored, &writes, 10);
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
        let revisions: Vec<i64> = plan.events.iter().map(|e| e.event.revision).collect();
        let prevs: Vec<Option<String>> = plan
            .events
            .iter()
            .map(|e| {
                e.prev.as_ref().map(|b| Gateway::decode(b.as_slice()).unwrap().spec.unwrap().image)
            })
            .collect();
        assert_eq!(
            prevs,
            [None, Some("a".into()), Some("v1".into()), None],
            "each event keeps the object before it"
        );
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

    fn sized(names: &[(&str, i64)]) -> Vec<(String, i64)> {
        names.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    #[test]
    fn a_page_merges_both_sources_in_name_order_and_cuts_at_the_count_or_the_bytes() {
        let unchanged = sized(&[("a", 10), ("c", 10), ("e", 10)]);
        let changed = sized(&[("b", 10), ("d", 10)]);
        let cut = |limit, bytes| page_cut(&unchanged, &changed, limit, bytes);
        assert_eq!(cut(10, 1000), PageCut { last: Some("e".into()), more: false });
        assert_eq!(cut(2, 1000), PageCut { last: Some("b".into()), more: true });
        assert_eq!(cut(10, 25), PageCut { last: Some("b".into()), more: true });
        // The first object is taken however large.
        assert_eq!(cut(10, 1), PageCut { last: Some("a".into()), more: true });
        assert_eq!(page_cut(&[], &[], 10, 10), PageCut { last: None, more: false });
        // A source that filled its limit may hold more beyond it.
        let full = sized(&[("a", 1), ("b", 1)]);
        assert_eq!(page_cut(&full, &[], 2, 100), PageCut { last: Some("b".into()), more: true });
        assert_eq!(page_cut(&[], &full, 2, 100), PageCut { last: Some("b".into()), more: true });
    }

    #[test]
    fn an_events_page_stops_before_its_bytes_run_over_but_holds_one_event() {
        assert_eq!(events_cut(&[(5, 10), (6, 10), (7, 10)], 25), Some(6));
        assert_eq!(events_cut(&[(5, 100), (6, 10)], 25), Some(5));
        assert_eq!(events_cut(&[], 25), None);
    }

    #[test]
    fn a_gateway_created_and_removed_in_one_batch_touches_no_row() {
        let plan = plan_batch(&HashMap::new(), &[put("x", "a"), remove("x")], 1);
        assert_eq!(plan.events.len(), 2);
        assert!(plan.rows.is_empty());
    }

    #[test]
    fn a_row_that_does_not_decode_fails_only_the_writes_to_it() {
        let stored = HashMap::from([("bad".to_string(), Err("truncated".to_string()))]);
        let plan = plan_batch(&stored, &[put("bad", "a"), put("good", "a")], 1);
        assert!(
            matches!(plan.results[0], Err(StorageError::Corrupt { ref name, .. }) if name == "bad")
        );
        assert_eq!(kinds(&plan)[1], Some(EventType::Added));
        assert_eq!(plan.revision, 2);
    }
}
