//! PostgreSQL backend. Each write locks its row (`SELECT ... FOR UPDATE`),
//! then the single `store_revision` row (`UPDATE ... RETURNING`), and holds
//! both until commit: revisions are therefore assigned in commit order, and
//! a snapshot at revision R holds exactly the changes up to R. Lists read in
//! one REPEATABLE READ transaction.

use std::time::Duration;

use gantry_api::v1::Gateway;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::{
    decode, sql, write_in_transaction, Committed, Mutation, Snapshot, Storage, StorageError,
};

const SELECT_FOR_UPDATE: &str = "SELECT object FROM gateways WHERE name = $1 FOR UPDATE";

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
        let row: Option<(Vec<u8>,)> = sqlx::query_as(sql::SELECT_OBJECT)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|(bytes,)| decode(name, &bytes)).transpose()
    }

    async fn list(&self, after: &str, limit: usize) -> Result<Snapshot, StorageError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await?;
        let (revision,): (i64,) = sqlx::query_as(sql::CURRENT_REVISION)
            .fetch_one(&mut *tx)
            .await?;
        let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(sql::LIST)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let gateways = rows
            .iter()
            .map(|(name, bytes)| decode(name, bytes))
            .collect::<Result<_, _>>()?;
        Ok(Snapshot { gateways, revision })
    }

    async fn mutate(&self, name: &str, mutation: Mutation) -> Result<Committed, StorageError> {
        let mut tx = self.pool.begin().await?;
        let committed = write_in_transaction!(tx, name, mutation, SELECT_FOR_UPDATE);
        tx.commit().await?;
        Ok(committed)
    }

    async fn ping(&self) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "postgres"
    }
}
