//! The promises off the happy path, judged by the real control plane
//! (tests/k8s): a store restored from a backup is converged on. Skips with
//! one line when the binaries are absent, and fails instead under
//! `CI=true`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gantry_api::v1::{EventType, GatewaySpec, ListGatewaysRequest, WatchGatewaysRequest};
use gantry_testkit::backup::{pg_dump, pg_restore, sqlite_backup, sqlite_restore, tool};
use gantry_testkit::cluster::{ClusterRig, PATIENCE};
use gantry_testkit::{eventually_blocking, temp_dir, TestDatabase};
use tokio_stream::StreamExt;

fn spec(tag: &str) -> GatewaySpec {
    GatewaySpec { image: format!("ghcr.io/acme/gateway:{tag}"), ..Default::default() }
}

/// The image of the Deployment `name` in the cluster.
fn deployed_image(rig: &ClusterRig, name: &str) -> String {
    let deployment = rig.json(&["get", "deployment", name]);
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// How a backend takes a backup and restores it (docs/operations.md).
enum Backup {
    Sqlite { db: PathBuf, file: PathBuf },
    Postgres { database: TestDatabase, file: PathBuf },
}

impl Backup {
    fn take(&self) {
        match self {
            Backup::Sqlite { db, file } => sqlite_backup(db, file),
            Backup::Postgres { database, file } => pg_dump(&database.url, file),
        }
    }

    /// With the store stopped: the backup in place of its database.
    async fn restore(&self) {
        match self {
            Backup::Sqlite { db, file } => sqlite_restore(file, db),
            Backup::Postgres { database, file } => {
                database.admin("DROP DATABASE {db} WITH (FORCE)").await;
                database.admin("CREATE DATABASE {db}").await;
                pg_restore(file, &database.url);
            }
        }
    }
}

/// Counts the store's writes per gateway from `revision` on.
fn count_writes(rig: &ClusterRig, revision: i64) -> Arc<Mutex<BTreeMap<String, u32>>> {
    let counts = Arc::new(Mutex::new(BTreeMap::new()));
    let (client, seen) = (rig.store.client(), counts.clone());
    tokio::spawn(async move {
        let request = WatchGatewaysRequest { resource_version: revision, ..Default::default() };
        let mut events = client.clone().watch_gateways(request).await.unwrap().into_inner();
        while let Some(Ok(event)) = events.next().await {
            if event.r#type() == EventType::Modified {
                let name = event.gateway.unwrap().metadata.unwrap().name;
                *seen.lock().unwrap().entry(name).or_insert(0) += 1;
            }
        }
    });
    counts
}

/// Reconciler running; a backup; an edit and a new gateway; the store
/// restored under the running reconciler. The cluster converges to the
/// restored specs, an edit made after the restore is applied, the status
/// writes per gateway stay few, and nothing is restarted.
async fn a_restore_is_converged_on(mut rig: ClusterRig, backup: Backup) {
    rig.reconciler(&[]);
    rig.create_spec("edge", spec("1")).await;
    rig.create_spec("keep", spec("1")).await;
    rig.wait_running("edge", 1).await;
    rig.wait_running("keep", 1).await;
    backup.take();

    rig.set_spec("edge", spec("2")).await;
    rig.create_spec("late", spec("1")).await;
    rig.wait_running("edge", 2).await;
    rig.wait_running("late", 1).await;
    assert_eq!(deployed_image(&rig, "edge"), "ghcr.io/acme/gateway:2");

    rig.base.store.kill9();
    backup.restore().await;
    rig.base.store.spawn();
    let listed = rig.store.client().list_gateways(ListGatewaysRequest::default()).await.unwrap();
    let writes = count_writes(&rig, listed.into_inner().resource_version);

    eventually_blocking(PATIENCE, "the cluster back on the restored spec", || {
        deployed_image(&rig, "edge") == "ghcr.io/acme/gateway:1"
    });
    let edited = rig.set_spec("edge", spec("3")).await;
    let generation = edited.metadata.unwrap().generation;
    assert_eq!(generation, 2, "the restored history continues from the backup");
    rig.wait_running("edge", generation).await;
    eventually_blocking(PATIENCE, "the edit after the restore applied", || {
        deployed_image(&rig, "edge") == "ghcr.io/acme/gateway:3"
    });

    let logs = rig.reconcilers[0].logs();
    assert_eq!(logs.matches("restored from a backup").count(), 1, "{logs}");
    let counts = writes.lock().unwrap().clone();
    // edge: the repair's rollout (two), the edit, its rollout (two); keep
    // was already what the restored status says.
    assert!(counts.get("edge").copied().unwrap_or(0) <= 8, "{counts:?}");
    assert_eq!(counts.get("keep"), None, "{counts:?}");
    // As docs/operations.md says: a gateway made after the backup is no
    // longer known, and its objects are left for the operator.
    assert_eq!(rig.objects("deployments").iter().filter(|d| d.ends_with("/late")).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_store_restored_under_a_running_reconciler_is_converged_on() {
    if !tool("sqlite3") {
        return;
    }
    let dir = temp_dir("restore-sqlite");
    let db = dir.join("gantry.db");
    let database = format!("sqlite://{}", db.display());
    let file = dir.join("backup.db");
    let Some(rig) = ClusterRig::start_on("restore-sqlite", &database, dir) else { return };
    a_restore_is_converged_on(rig, Backup::Sqlite { db, file }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_restored_under_a_running_reconciler_is_converged_on() {
    let Some(database) = TestDatabase::postgres().await else { return };
    if !tool("pg_dump") || !tool("pg_restore") {
        return;
    }
    let dir = temp_dir("restore-pg");
    let file = dir.join("gantry.dump");
    let Some(rig) = ClusterRig::start_on("restore-pg", &database.url, dir) else { return };
    a_restore_is_converged_on(rig, Backup::Postgres { database, file }).await;
}
