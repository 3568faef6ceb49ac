//! Persistence: one [`Storage`] trait, one module per backend.
//!
//! Every write goes through [`Storage::mutate`]: the backend opens a
//! transaction, locks the row, hands the stored object to a pure rule from
//! `gantry_core::lifecycle`, and, if the rule produced a change, advances the
//! store revision, writes the row and its event row, and commits. The caller
//! is answered only after the commit is durable.

use gantry_api::v1::{EventType, Gateway};
use gantry_core::{RuleError, Write};
use prost::Message;

pub mod postgres;
pub mod sqlite;

/// A write rule run under the row lock: given the stored object, decide
/// what to store.
pub type Mutation = Box<dyn FnOnce(Option<&Gateway>) -> Result<Write, RuleError> + Send>;

/// The outcome of a committed (or no-op) write.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// The object as stored (for a removal, its last state).
    pub gateway: Gateway,
    /// The event written, or `None` when nothing changed.
    pub event: Option<EventType>,
}

/// A page of gateways in name order and the revision it is consistent with.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub gateways: Vec<Gateway>,
    pub revision: i64,
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
    /// Migrations could not be applied.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not decode.
    #[error("stored gateway {name:?} is corrupt: {reason}")]
    Corrupt { name: String, reason: String },
}

/// The store's persistence. Implementations must make each `mutate` atomic
/// and durable, and assign revisions in commit order.
#[tonic::async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    /// The stored gateway of that name.
    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError>;

    /// Up to `limit` gateways with names after `after`, in name order, read
    /// in one snapshot together with the current revision.
    async fn list(&self, after: &str, limit: usize) -> Result<Snapshot, StorageError>;

    /// Runs `mutation` on the row `name` under its lock and commits what it
    /// decides, with a new revision and an event row.
    async fn mutate(&self, name: &str, mutation: Mutation) -> Result<Committed, StorageError>;

    /// Checks that the database answers (readiness).
    async fn ping(&self) -> Result<(), StorageError>;

    /// Which backend this is, for logs and metrics.
    fn backend(&self) -> &'static str;
}

/// Decodes a stored object.
pub(crate) fn decode(name: &str, bytes: &[u8]) -> Result<Gateway, StorageError> {
    Gateway::decode(bytes).map_err(|e| StorageError::Corrupt {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

/// SQL shared by both backends (`$N` placeholders work on SQLite too).
pub(crate) mod sql {
    pub const SELECT_OBJECT: &str = "SELECT object FROM gateways WHERE name = $1";
    pub const NEXT_REVISION: &str =
        "UPDATE store_revision SET revision = revision + 1 WHERE id = 1 RETURNING revision";
    pub const CURRENT_REVISION: &str = "SELECT revision FROM store_revision WHERE id = 1";
    pub const INSERT: &str = "INSERT INTO gateways \
        (name, uid, generation, observed_generation, resource_version, deleting, object) \
        VALUES ($1, $2, $3, $4, $5, $6, $7)";
    pub const UPDATE: &str = "UPDATE gateways SET uid = $2, generation = $3, \
        observed_generation = $4, resource_version = $5, deleting = $6, object = $7 WHERE name = $1";
    pub const DELETE: &str = "DELETE FROM gateways WHERE name = $1";
    pub const INSERT_EVENT: &str = "INSERT INTO gateway_events \
        (revision, event_type, name, object, created_at_ms) VALUES ($1, $2, $3, $4, $5)";
    pub const LIST: &str =
        "SELECT name, object FROM gateways WHERE name > $1 ORDER BY name LIMIT $2";
}

/// Runs one write inside an open transaction `$tx` whose row lock (or
/// writer lock) is already held by `$select` reading the row: decide with
/// the rule, spend a revision, write the row and the event row. The caller
/// commits. Written as a macro because the body is the same for both
/// backends while their transaction types differ.
macro_rules! write_in_transaction {
    ($tx:expr, $name:expr, $mutation:expr, $select:expr) => {{
        use prost::Message as _;
        use $crate::storage::{decode, now_ms, sql, Committed, StorageError};
        let row: Option<(Vec<u8>,)> = sqlx::query_as($select)
            .bind($name)
            .fetch_optional(&mut *$tx)
            .await?;
        let current = row.map(|(bytes,)| decode($name, &bytes)).transpose()?;
        let existed = current.is_some();
        let (mut gateway, event) = match ($mutation)(current.as_ref())? {
            gantry_core::Write::Unchanged(gateway) => {
                return Ok(Committed {
                    gateway,
                    event: None,
                });
            }
            gantry_core::Write::Put(g) if existed => (g, gantry_api::v1::EventType::Modified),
            gantry_core::Write::Put(g) => (g, gantry_api::v1::EventType::Added),
            gantry_core::Write::Remove(g) => (g, gantry_api::v1::EventType::Deleted),
        };
        let (revision,): (i64,) = sqlx::query_as(sql::NEXT_REVISION)
            .fetch_one(&mut *$tx)
            .await?;
        let meta = gateway.metadata.get_or_insert_with(Default::default);
        meta.resource_version = revision;
        let bytes = gateway.encode_to_vec();
        let meta = gateway.metadata.clone().unwrap_or_default();
        let observed = gateway.status.as_ref().map_or(0, |s| s.observed_generation);
        match event {
            gantry_api::v1::EventType::Deleted => {
                sqlx::query(sql::DELETE)
                    .bind($name)
                    .execute(&mut *$tx)
                    .await?;
            }
            _ => {
                let statement = if existed { sql::UPDATE } else { sql::INSERT };
                let result = sqlx::query(statement)
                    .bind($name)
                    .bind(&meta.uid)
                    .bind(meta.generation)
                    .bind(observed)
                    .bind(revision)
                    .bind(meta.delete_time.is_some())
                    .bind(&bytes)
                    .execute(&mut *$tx)
                    .await;
                match result {
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        return Err(StorageError::Rule(gantry_core::RuleError::AlreadyExists(
                            $name.to_string(),
                        )));
                    }
                    other => {
                        other?;
                    }
                }
            }
        }
        sqlx::query(sql::INSERT_EVENT)
            .bind(revision)
            .bind(event as i32)
            .bind($name)
            .bind(&bytes)
            .bind(now_ms())
            .execute(&mut *$tx)
            .await?;
        Committed {
            gateway,
            event: Some(event),
        }
    }};
}
pub(crate) use write_in_transaction;

/// Milliseconds since the Unix epoch, for event rows.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
