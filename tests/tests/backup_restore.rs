//! docs/operations.md's backup and restore, as written there, on both
//! backends: a SQLite backup taken with `sqlite3 .backup` while the store
//! runs, and a `pg_dump` restored with `pg_restore` into a new database,
//! both taken while a writer creates gateways of several KB, each give a
//! working store holding one consistent moment of the original; a watcher
//! ahead of the restored revision is told to relist.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use gantry_api::v1::{
    CreateGatewayRequest, ListGatewaysRequest, UpdateGatewayRequest, WatchGatewaysRequest,
};
use gantry_client::GatewayClient;
use gantry_testkit::backup::{pg_dump, pg_restore, sqlite_backup, sqlite_restore, tool};
use gantry_testkit::eventually;
use gantry_testkit::gateway::gateway;
use gantry_testkit::{temp_dir, StoreProcess, TestDatabase};
use tokio_stream::StreamExt;

async fn create(c: &GatewayClient, name: &str, image: &str) -> i64 {
    let request = CreateGatewayRequest {
        gateway: Some(gateway(name).image(image).build()),
        validate_only: false,
    };
    let g = c.clone().create_gateway(request).await.unwrap().into_inner();
    g.metadata.unwrap().resource_version
}

async fn update(c: &GatewayClient, name: &str, image: &str) -> i64 {
    let mask = prost_types::FieldMask { paths: vec!["spec".into()] };
    let request = UpdateGatewayRequest {
        gateway: Some(gateway(name).image(image).build()),
        update_mask: Some(mask),
        validate_only: false,
    };
    let g = c.clone().update_gateway(request).await.unwrap().into_inner();
    g.metadata.unwrap().resource_version
}

/// Every gateway with its image and resource_version, and the store
/// revision.
async fn contents(c: &GatewayClient) -> (Vec<(String, String, i64)>, i64) {
    let request = ListGatewaysRequest { page_size: 1000, ..Default::default() };
    let page = c.clone().list_gateways(request).await.unwrap().into_inner();
    let gateways = page
        .gateways
        .into_iter()
        .map(|g| {
            let meta = g.metadata.unwrap();
            (meta.name, g.spec.unwrap().image, meta.resource_version)
        })
        .collect();
    (gateways, page.resource_version)
}

/// What the store held before the backup, what a writer had acknowledged
/// when the backup ended, and the newest revision a watcher could see.
struct Written {
    before: Vec<(String, String, i64)>,
    streamed: Vec<String>,
    newest: i64,
}

/// Writes before the backup; during it, a writer creates gateways of
/// several KB one after another (the backup must be one consistent
/// snapshot of them); after it, more changes the backup must not hold.
async fn before_during_and_after_the_backup(c: &GatewayClient, backup: impl FnOnce()) -> Written {
    create(c, "edge", "ghcr.io/acme/gw:1").await;
    create(c, "tail", "ghcr.io/acme/gw:1").await;
    update(c, "edge", "ghcr.io/acme/gw:2").await;
    let (before, _) = contents(c).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = {
        let (c, stop, acked) = (c.clone(), stop.clone(), acked.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("stream-{i:04}");
                let mut g = gateway(&name).image("ghcr.io/acme/gw:1").build();
                let config = (0..64).map(|k| (format!("key-{k:02}"), "x".repeat(64))).collect();
                g.spec.as_mut().unwrap().config = config;
                let request = CreateGatewayRequest { gateway: Some(g), validate_only: false };
                c.clone().create_gateway(request).await.unwrap();
                acked.lock().unwrap().push(name);
                i += 1;
            }
        })
    };
    // The backup starts with the writer under way.
    let within = std::time::Duration::from_secs(60);
    eventually(within, "the writer under way", || async { acked.lock().unwrap().len() >= 5 }).await;
    tokio::task::block_in_place(backup);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    create(c, "late", "ghcr.io/acme/gw:1").await;
    let newest = update(c, "edge", "ghcr.io/acme/gw:3").await;
    let streamed = acked.lock().unwrap().clone();
    Written { before, streamed, newest }
}

/// The restored store is one consistent moment of the original: what was
/// there before the backup, a prefix of the writer's gateways (no later
/// one without every earlier one), nothing written after; its revision is
/// that of its newest row. It takes writes from the next revision and
/// tells a watcher from a revision it never had to relist.
async fn check_restored(c: &GatewayClient, written: &Written) {
    let (restored, revision) = contents(c).await;
    for kept in &written.before {
        assert!(restored.contains(kept), "{kept:?} before the backup is restored");
    }
    let streamed: Vec<&String> =
        restored.iter().map(|(n, _, _)| n).filter(|n| n.starts_with("stream-")).collect();
    let prefix: Vec<&String> = written.streamed.iter().take(streamed.len()).collect();
    assert_eq!(streamed, prefix, "the writer's gateways are a prefix: a consistent snapshot");
    assert!(streamed.len() >= 5, "the backup holds what was written before it started");
    assert_eq!(restored.len(), written.before.len() + streamed.len(), "nothing after the backup");
    let newest_row = restored.iter().map(|(_, _, rv)| *rv).max().unwrap();
    assert_eq!(revision, newest_row, "the restored revision is that of its newest row");
    let watch = WatchGatewaysRequest { resource_version: written.newest, ..Default::default() };
    let refused = match c.clone().watch_gateways(watch).await {
        Err(status) => status,
        Ok(stream) => stream.into_inner().next().await.unwrap().unwrap_err(),
    };
    assert!(gantry_client::watch::is_compacted(&refused), "relist: {refused:?}");
    assert_eq!(create(c, "after", "ghcr.io/acme/gw:1").await, revision + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_backup_restores_into_a_working_store() {
    if !tool("sqlite3") {
        return;
    }
    let dir = temp_dir("backup-sqlite");
    let db = dir.join("gantry.db");
    let backup = dir.join("backup.db");
    let mut store = StoreProcess::start(&format!("sqlite://{}", db.display()), &dir);
    let c = store.client();
    // Online: the store keeps running (and writing) during the backup.
    let written = before_during_and_after_the_backup(&c, || sqlite_backup(&db, &backup)).await;

    // Restore: stop the store, put the backup in place (without the old
    // WAL), start it again.
    store.kill9();
    sqlite_restore(&backup, &db);
    store.spawn();
    check_restored(&store.client(), &written).await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg_dump_restores_into_a_new_database() {
    let Some(source) = TestDatabase::postgres().await else { return };
    if !tool("pg_dump") || !tool("pg_restore") {
        return;
    }
    let target = TestDatabase::postgres().await.unwrap();
    let dir = temp_dir("backup-postgres");
    let dump = dir.join("gantry.dump");
    let store = StoreProcess::start(&source.url, &dir);
    let c = store.client();
    let written = before_during_and_after_the_backup(&c, || pg_dump(&source.url, &dump)).await;
    drop(store);

    pg_restore(&dump, &target.url);
    let restored_dir = dir.join("restored");
    std::fs::create_dir_all(&restored_dir).unwrap();
    let restored = StoreProcess::start(&target.url, &restored_dir);
    check_restored(&restored.client(), &written).await;
    drop(restored);
    source.drop_database().await;
    target.drop_database().await;
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}
