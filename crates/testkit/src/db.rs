//! Databases made for one test (or one benchmark run) and removed after
//! it: a SQLite file in a fresh directory, or a fresh PostgreSQL database
//! on the server `GANTRY_TEST_POSTGRES_URL` names.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::Connection;

use crate::env::{in_ci, skipped};

/// The store's two backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Where the PostgreSQL tests connect to create their databases.
pub fn postgres_admin_url() -> String {
    std::env::var("GANTRY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A database made for one test, removed when dropped.
#[derive(Debug)]
pub struct TestDatabase {
    /// What `gateway-store --database-url` takes.
    pub url: String,
    pub backend: Backend,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    Directory(PathBuf),
    Postgres { admin_url: String, name: String },
    Done,
}

impl TestDatabase {
    /// A fresh database on `backend`; `None` when PostgreSQL is unreachable
    /// outside CI (the test says it skipped), a panic under `CI=true`.
    pub async fn create(backend: Backend) -> Option<TestDatabase> {
        match backend {
            Backend::Sqlite => Some(Self::sqlite()),
            Backend::Postgres => Self::postgres().await,
        }
    }

    /// A SQLite file in a fresh directory.
    pub fn sqlite() -> TestDatabase {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("gantry-test-{id}"));
        std::fs::create_dir_all(&dir).expect("create the database's directory");
        let url = format!("sqlite://{}", dir.join("gantry.db").display());
        TestDatabase { url, backend: Backend::Sqlite, cleanup: Cleanup::Directory(dir) }
    }

    /// A fresh PostgreSQL database (see [`TestDatabase::create`]).
    pub async fn postgres() -> Option<TestDatabase> {
        let admin_url = postgres_admin_url();
        match Self::postgres_on(&admin_url).await {
            Ok(db) => Some(db),
            Err(e) if !in_ci() => {
                skipped(&format!(
                    "PostgreSQL at {admin_url} unreachable ({e}); set GANTRY_TEST_POSTGRES_URL"
                ));
                None
            }
            Err(e) => panic!("CI=true and PostgreSQL at {admin_url} is unreachable: {e}"),
        }
    }

    /// A fresh database on the server `admin_url` connects to.
    pub async fn postgres_on(admin_url: &str) -> Result<TestDatabase, sqlx::Error> {
        let mut admin = admin_connection(admin_url).await?;
        let name = format!("gantry_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await?;
        let base = admin_url.rsplit_once('/').map_or(admin_url, |(b, _)| b);
        let url = format!("{base}/{name}");
        let cleanup = Cleanup::Postgres { admin_url: admin_url.to_string(), name };
        Ok(TestDatabase { url, backend: Backend::Postgres, cleanup })
    }

    /// Runs `sql` on the PostgreSQL server's admin connection; `{db}` in it
    /// stands for this database's name (to refuse or drop its connections).
    pub async fn admin(&self, sql: &str) {
        let Cleanup::Postgres { admin_url, name } = &self.cleanup else {
            panic!("admin statements need a PostgreSQL database");
        };
        let mut admin = admin_connection(admin_url).await.expect("admin connection");
        sqlx::query(&sql.replace("{db}", name))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Removes the database now (stop the processes using it first).
    pub async fn drop_database(mut self) {
        if let Cleanup::Postgres { admin_url, name } = &self.cleanup {
            drop_postgres(admin_url, name).await;
            self.cleanup = Cleanup::Done;
        }
    }
}

async fn admin_connection(admin_url: &str) -> Result<sqlx::PgConnection, sqlx::Error> {
    tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(admin_url))
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut))
}

async fn drop_postgres(admin_url: &str, name: &str) {
    if let Ok(mut admin) = admin_connection(admin_url).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await;
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.cleanup, Cleanup::Done) {
            Cleanup::Directory(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::Postgres { admin_url, name } => {
                // Drop runs outside async context (and during panics): a
                // short-lived runtime on its own thread.
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build()
                    else {
                        return;
                    };
                    rt.block_on(drop_postgres(&admin_url, &name));
                })
                .join();
            }
            Cleanup::Done => {}
        }
    }
}
