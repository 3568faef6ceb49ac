//! The reads, the compaction and the setup both SQL backends share, written
//! once over a [`Dialect`] (as kine's generic driver over its `Dialect`):
//! a backend names its database and the statements that open its
//! transactions; [`Driver`] runs the same queries on either. What only one
//! backend can do (its write batch, its commit notifications, its
//! durability settings) stays in that backend's module.

use std::marker::PhantomData;
use std::sync::Arc;

use gantry_api::v1::Gateway;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Type};

use super::{
    decode, decode_event, events_cut, now_ms, page_cut, Event, Page, Retention, Snapshot,
    StorageError, Stored,
};

/// An event row: revision, event type, name, object, previous labels.
type EventColumns = (i64, i32, String, Vec<u8>, Option<Vec<u8>>);

/// What differs between the SQL databases the store runs on.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The sqlx database.
    type Db: Database;
    /// Opens a read-only transaction whose reads all see one snapshot
    /// (`None`: the database's plain `BEGIN` does).
    const BEGIN_READ: Option<&'static str>;
    /// Opens the compaction's transaction, serialised with every batch
    /// (no event commits between the mark and the deletion).
    const BEGIN_COMPACT: &'static str;
}

async fn begin<DB: Database>(
    pool: &Pool<DB>,
    statement: Option<&'static str>,
) -> Result<sqlx::Transaction<'static, DB>, sqlx::Error> {
    match statement {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
}

/// The queries both backends run, over dialect `D`.
pub(crate) struct Driver<D>(PhantomData<D>);

impl<D, DB> Driver<D>
where
    D: Dialect<Db = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    i32: Type<DB> + for<'r> Decode<'r, DB>,
    i64: Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB>,
    String: Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB>,
    Vec<u8>: Type<DB> + for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB>,
{
    /// The stored gateway of that name.
    pub async fn get(pool: &Pool<DB>, name: &str) -> Result<Option<Gateway>, StorageError> {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as(sql::SELECT_OBJECT).bind(name.to_string()).fetch_optional(pool).await?;
        row.map(|(bytes,)| decode(name, &bytes)).transpose()
    }

    /// The newest committed revision.
    pub async fn current_revision(pool: &Pool<DB>) -> Result<i64, StorageError> {
        let (revision,): (i64,) = sqlx::query_as(sql::CURRENT_REVISION).fetch_one(pool).await?;
        Ok(revision)
    }

    /// Checks that the database answers.
    pub async fn ping(pool: &Pool<DB>) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(pool).await?;
        Ok(())
    }

    /// The page token key in this database, created by the first store to
    /// open it.
    pub async fn page_token_key(pool: &Pool<DB>) -> Result<Vec<u8>, StorageError> {
        let mut key = vec![0u8; 32];
        getrandom::getrandom(&mut key).map_err(|e| {
            StorageError::Setup(format!("no randomness for the page token key: {e}"))
        })?;
        sqlx::query(sql::INSERT_PAGE_TOKEN_KEY).bind(key).execute(pool).await?;
        let (key,): (Vec<u8>,) = sqlx::query_as(sql::PAGE_TOKEN_KEY).fetch_one(pool).await?;
        Ok(key)
    }

    /// A page of a listing, read in one snapshot.
    pub async fn list(pool: &Pool<DB>, page: Page<'_>) -> Result<Snapshot, StorageError> {
        let mut tx = begin(pool, D::BEGIN_READ).await?;
        let (current,): (i64,) = sqlx::query_as(sql::CURRENT_REVISION).fetch_one(&mut *tx).await?;
        let revision = match page.at {
            None => current,
            Some(at) if at > current => {
                return Err(StorageError::Future { requested: at, current });
            }
            Some(at) => {
                let (compacted,): (i64,) =
                    sqlx::query_as(sql::COMPACTED_REVISION).fetch_one(&mut *tx).await?;
                if at < compacted {
                    return Err(StorageError::Compacted { requested: at, compacted });
                }
                at
            }
        };
        let after = page.after.to_string();
        let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
        let unchanged: Vec<(String, i64)> = sqlx::query_as(sql::PAGE_SIZES)
            .bind(after.clone())
            .bind(revision)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        // Rows changed since `revision` are shown as they were then.
        let historic = revision < current;
        let changed: Vec<(String, i64)> = if historic {
            sqlx::query_as(sql::PAGE_SIZES_CHANGED)
                .bind(after.clone())
                .bind(revision)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?
        } else {
            Vec::new()
        };
        let cut = page_cut(&unchanged, &changed, page.limit, page.max_bytes);
        let mut rows: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(last) = cut.last {
            rows = sqlx::query_as(sql::PAGE_OBJECTS)
                .bind(after.clone())
                .bind(revision)
                .bind(last.clone())
                .fetch_all(&mut *tx)
                .await?;
            if historic {
                let older: Vec<(String, Vec<u8>)> = sqlx::query_as(sql::PAGE_OBJECTS_CHANGED)
                    .bind(after)
                    .bind(revision)
                    .bind(last)
                    .fetch_all(&mut *tx)
                    .await?;
                rows.extend(older);
                rows.sort_by(|a, b| a.0.cmp(&b.0));
            }
        }
        tx.commit().await?;
        let gateways = rows
            .into_iter()
            .map(|(name, bytes)| Stored::decode(&name, bytes))
            .collect::<Result<_, _>>()?;
        Ok(Snapshot { gateways, revision, more: cut.more })
    }

    /// Events after `after` in revision order (see
    /// [`Storage::events_after`](super::Storage::events_after)), checking
    /// the compaction mark in the same snapshot.
    pub async fn events_after(
        pool: &Pool<DB>,
        after: i64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError> {
        let mut tx = begin(pool, D::BEGIN_READ).await?;
        let (compacted,): (i64,) =
            sqlx::query_as(sql::COMPACTED_REVISION).fetch_one(&mut *tx).await?;
        if after < compacted {
            return Err(StorageError::Compacted { requested: after, compacted });
        }
        let sizes: Vec<(i64, i64)> = sqlx::query_as(sql::EVENT_SIZES)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        let Some(last) = events_cut(&sizes, max_bytes) else {
            tx.commit().await?;
            return Ok(Vec::new());
        };
        let rows: Vec<EventColumns> =
            sqlx::query_as(sql::EVENTS_BETWEEN).bind(after).bind(last).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows.iter()
            .map(|(revision, kind, name, object, prev)| {
                decode_event(*revision, *kind, name, object, prev.as_deref())
            })
            .collect()
    }

    /// Drops old events per `retention`; returns the compacted revision.
    pub async fn compact(pool: &Pool<DB>, retention: Retention) -> Result<i64, StorageError> {
        let mut tx = pool.begin_with(D::BEGIN_COMPACT).await?;
        let (head,): (i64,) = sqlx::query_as(sql::CURRENT_REVISION).fetch_one(&mut *tx).await?;
        let (target,): (i64,) = sqlx::query_as(sql::COMPACTION_TARGET)
            .bind(head)
            .bind(now_ms() - retention.max_age_ms)
            .bind(retention.max_events)
            .fetch_one(&mut *tx)
            .await?;
        if target > 0 {
            sqlx::query(sql::DELETE_EVENTS).bind(target).execute(&mut *tx).await?;
            sqlx::query(sql::SET_COMPACTED).bind(target).execute(&mut *tx).await?;
        }
        let (compacted,): (i64,) =
            sqlx::query_as(sql::COMPACTED_REVISION).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(compacted)
    }
}

/// The statements the driver runs (`$N` placeholders work on SQLite too);
/// each backend keeps the statements only it runs.
mod sql {
    pub const SELECT_OBJECT: &str = "SELECT object FROM gateways WHERE name = $1";
    pub const CURRENT_REVISION: &str = "SELECT revision FROM store_revision WHERE id = 1";
    /// Names and sizes of the rows unchanged since revision $2, after $1.
    pub const PAGE_SIZES: &str = "SELECT name, CAST(LENGTH(object) AS BIGINT) FROM gateways \
        WHERE name > $1 AND resource_version <= $2 ORDER BY name LIMIT $3";
    /// Those rows up to the name $3.
    pub const PAGE_OBJECTS: &str = "SELECT name, object FROM gateways \
        WHERE name > $1 AND resource_version <= $2 AND name <= $3 ORDER BY name";
    /// Names changed after revision $2 that existed at it (their first later
    /// event has a previous object), with the size of that object.
    pub const PAGE_SIZES_CHANGED: &str = "SELECT name, CAST(LENGTH(prev_object) AS BIGINT) \
        FROM gateway_events WHERE revision IN (SELECT MIN(revision) FROM gateway_events \
        WHERE revision > $2 AND name > $1 GROUP BY name) AND prev_object IS NOT NULL \
        ORDER BY name LIMIT $3";
    /// Those objects as they were at revision $2, up to the name $3.
    pub const PAGE_OBJECTS_CHANGED: &str = "SELECT name, prev_object FROM gateway_events \
        WHERE revision IN (SELECT MIN(revision) FROM gateway_events \
        WHERE revision > $2 AND name > $1 AND name <= $3 GROUP BY name) \
        AND prev_object IS NOT NULL";
    pub const COMPACTED_REVISION: &str = "SELECT revision FROM store_compaction WHERE id = 1";
    pub const EVENT_SIZES: &str = "SELECT revision, CAST(LENGTH(object) AS BIGINT) \
        FROM gateway_events WHERE revision > $1 ORDER BY revision LIMIT $2";
    pub const EVENTS_BETWEEN: &str = "SELECT revision, event_type, name, object, prev_labels \
        FROM gateway_events WHERE revision > $1 AND revision <= $2 ORDER BY revision";
    pub const INSERT_PAGE_TOKEN_KEY: &str =
        "INSERT INTO store_keys (id, page_token_key) VALUES (1, $1) ON CONFLICT (id) DO NOTHING";
    pub const PAGE_TOKEN_KEY: &str = "SELECT page_token_key FROM store_keys WHERE id = 1";
    /// The revision to compact up to: every event older than the age
    /// cutoff ($2) or beyond the newest $3 events before the head ($1).
    pub const COMPACTION_TARGET: &str = "SELECT COALESCE(MAX(revision), 0) FROM gateway_events \
        WHERE created_at_ms < $2 OR revision <= $1 - $3";
    pub const DELETE_EVENTS: &str = "DELETE FROM gateway_events WHERE revision <= $1";
    pub const SET_COMPACTED: &str =
        "UPDATE store_compaction SET revision = $1 WHERE id = 1 AND revision < $1";
}
