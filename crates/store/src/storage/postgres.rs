//! PostgreSQL backend.
//!
//! Revisions in commit order: each write locks its row
//! (`SELECT ... FOR UPDATE`), then the single `store_revision` row
//! (`UPDATE ... RETURNING`), and holds both until commit. A second writer
//! blocks on the revision row until the first commits, so revision N+1 is
//! never committed before N, and a reader that sees N sees everything
//! before it. (A sequence would not give this: sequence values are handed
//! out at call time and transactions may commit in another order.)
//!
//! Several store replicas: each commit sends `NOTIFY gantry_events` inside
//! its transaction (delivered at commit); every replica LISTENs and then
//! reads the events table, which stays the source of truth.

use std::sync::Arc;
use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use super::{
    compact_in, decode, events_after_in, last_revision, list_in, sql, write_batch, Committed,
    Event, PendingWrite, Retention, Snapshot, Storage, StorageError,
};

const SELECT_FOR_UPDATE: &str = "SELECT object FROM gateways WHERE name = $1 FOR UPDATE";
const CHANNEL: &str = "gantry_events";

/// Gateways in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PostgresStorage {
    pool: PgPool,
}

impl PostgresStorage {
    /// Connects to `url` (`postgres://...`) and applies the migrations.
    pub async fn open(url: &str) -> Result<Self, StorageError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(Self { pool })
    }
}

#[tonic::async_trait]
impl Storage for PostgresStorage {
    async fn get(&self, name: &str) -> Result<Option<Gateway>, StorageError> {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as(sql::SELECT_OBJECT).bind(name).fetch_optional(&self.pool).await?;
        row.map(|(bytes,)| decode(name, &bytes)).transpose()
    }

    async fn list(&self, after: &str, limit: usize) -> Result<Snapshot, StorageError> {
        let mut tx =
            self.pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
        let snapshot = list_in!(tx, after, limit);
        tx.commit().await?;
        Ok(snapshot)
    }

    async fn write_batch(
        &self,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<Result<Committed, StorageError>>, StorageError> {
        let mut tx = self.pool.begin().await?;
        let results = write_batch!(tx, writes, SELECT_FOR_UPDATE);
        if let Some(revision) = last_revision(&results) {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(revision.to_string())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Ok(results)
    }

    async fn events_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Arc<Event>>, StorageError> {
        let mut tx =
            self.pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
        let events = events_after_in!(tx, after, limit);
        tx.commit().await?;
        Ok(events)
    }

    async fn current_revision(&self) -> Result<i64, StorageError> {
        let (revision,): (i64,) =
            sqlx::query_as(sql::CURRENT_REVISION).fetch_one(&self.pool).await?;
        Ok(revision)
    }

    async fn compact(&self, retention: Retention) -> Result<i64, StorageError> {
        let mut tx = self.pool.begin().await?;
        // Serialise with writers: the compaction mark and the deleted rows
        // change together, and no event commits in between.
        sqlx::query("SELECT revision FROM store_revision WHERE id = 1 FOR UPDATE")
            .execute(&mut *tx)
            .await?;
        let compacted = compact_in!(tx, retention);
        tx.commit().await?;
        Ok(compacted)
    }

    async fn listen_for_commits(&self, wake: Arc<tokio::sync::Notify>) -> Result<(), StorageError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        // Anything committed before LISTEN took effect is picked up by the
        // reader this wakes.
        wake.notify_one();
        loop {
            listener.recv().await?;
            wake.notify_one();
        }
    }

    async fn ping(&self) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}
