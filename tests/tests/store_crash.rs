//! Crash safety of gateway-store as a process: SIGKILL at random moments
//! during concurrent writes, restart on the same database, and check that
//! every acknowledged write is there, the revision history has no gaps, and
//! a subscriber using the client helper resumes and ends up complete.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_api::v1::CreateGatewayRequest;
use gantry_client::watch::{list_then_watch, WatchOptions, WatchUpdate};
use gantry_client::ClientConfig;
use gantry_testkit::eventually;
use gantry_testkit::gateway::gateway;
use gantry_testkit::{temp_dir, StoreProcess, TestDatabase};
use tokio_stream::StreamExt;
use tonic::Code;

const WRITERS: usize = 4;
const KILLS: usize = 10;
const TARGET_ACKS: usize = 1200;

async fn kill_and_restart_loses_nothing(database_url: &str, label: &str) {
    let dir = temp_dir(label);
    let mut store = StoreProcess::start(database_url, &dir);
    let config = ClientConfig { endpoint: store.endpoint(), ..Default::default() };

    // A subscriber through the client helper, applying updates to a cache
    // and checking the stream: revisions only go up, and no creation is
    // delivered twice (the writers only create, under unique names).
    let cache: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let broken: Arc<Mutex<Vec<String>>> = Arc::default();
    let subscriber = {
        let (cache, broken) = (cache.clone(), broken.clone());
        let mut updates = list_then_watch(config.connect_lazy().unwrap(), WatchOptions::default());
        tokio::spawn(async move {
            let (mut last, mut delivered) = (0i64, BTreeSet::new());
            while let Some(update) = updates.next().await {
                let update = update.unwrap();
                let mut cache = cache.lock().unwrap();
                let revision = update.revision();
                if revision < last {
                    broken.lock().unwrap().push(format!("revision {revision} after {last}"));
                }
                match update {
                    WatchUpdate::Init { .. } => cache.clear(),
                    WatchUpdate::InitPage { gateways, .. } => {
                        cache.extend(
                            gateways.iter().map(|g| g.metadata.as_ref().unwrap().name.clone()),
                        );
                    }
                    WatchUpdate::Applied { gateway, .. } => {
                        let name = gateway.metadata.unwrap().name;
                        if revision == last || !delivered.insert(name.clone()) {
                            broken
                                .lock()
                                .unwrap()
                                .push(format!("{name} delivered again at {revision}"));
                        }
                        cache.insert(name);
                    }
                    WatchUpdate::Deleted { gateway, .. } => {
                        cache.remove(&gateway.metadata.unwrap().name);
                    }
                    WatchUpdate::Bookmark { .. }
                    | WatchUpdate::InitDone { .. }
                    | WatchUpdate::Interrupted { .. } => {}
                }
                last = revision;
            }
        })
    };

    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (acked, mut client) = (acked.clone(), config.connect_lazy().unwrap());
        writers.push(tokio::spawn(async move {
            let mut failures = 0;
            for i in 0.. {
                if acked.lock().unwrap().len() >= TARGET_ACKS {
                    return failures;
                }
                let name = format!("w{w}-{i}");
                loop {
                    match client
                        .create_gateway(CreateGatewayRequest {
                            gateway: Some(gateway(&name).build()),
                            validate_only: false,
                        })
                        .await
                    {
                        // ALREADY_EXISTS on a retry: the unacknowledged
                        // attempt did commit.
                        Ok(_) => break acked.lock().unwrap().push(name.clone()),
                        Err(e) if e.code() == Code::AlreadyExists => {
                            break acked.lock().unwrap().push(name.clone())
                        }
                        Err(_) => {
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }
            failures
        }));
    }

    let mut rng = fastrand::Rng::new();
    for kill in 0..KILLS {
        let at = (kill + 1) * TARGET_ACKS / (KILLS + 1) + rng.usize(0..20);
        eventually(Duration::from_secs(120), "the writers acknowledged", || async {
            acked.lock().unwrap().len() >= at
        })
        .await;
        // A random moment within the next batch or two of commits.
        tokio::time::sleep(Duration::from_micros(rng.u64(0..15_000))).await;
        store.kill9();
        store.spawn();
    }
    let mut failures = 0;
    for w in writers {
        failures += w.await.unwrap();
    }
    let acked: Vec<String> = acked.lock().unwrap().clone();

    // Every acknowledged write is there.
    let mut client = gantry_client::connect(&config).await.unwrap();
    let mut stored = BTreeSet::new();
    let mut token = String::new();
    let listed_revision = loop {
        let page = client
            .list_gateways(gantry_api::v1::ListGatewaysRequest {
                page_size: 1000,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        stored.extend(page.gateways.iter().map(|g| g.metadata.as_ref().unwrap().name.clone()));
        if page.next_page_token.is_empty() {
            break page.resource_version;
        }
        token = page.next_page_token;
    };
    let missing: Vec<_> = acked.iter().filter(|n| !stored.contains(*n)).collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");

    // The history from the bootstrap revision is gap-free.
    let revisions = gantry_testkit::replay_creations(&mut client, listed_revision).await;
    assert_eq!(revisions, (2..=listed_revision).collect::<Vec<_>>(), "revisions are gap-free");
    assert_eq!(revisions.len(), stored.len());

    // The subscriber resumed across every restart and holds everything.
    eventually(Duration::from_secs(60), "the subscriber did not catch up", || async {
        cache.lock().unwrap().len() >= stored.len()
    })
    .await;
    assert_eq!(*cache.lock().unwrap(), stored);
    let broken = broken.lock().unwrap().clone();
    assert!(broken.is_empty(), "the resumed stream was not exactly once, in order: {broken:?}");
    subscriber.abort();
    eprintln!(
        "{label}: {KILLS} SIGKILLs, {} acknowledged writes, {failures} failed attempts retried",
        acked.len()
    );
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_survives_sigkill() {
    let dir = temp_dir("sqlite-db");
    let url = format!("sqlite://{}", dir.join("gantry.db").display());
    kill_and_restart_loses_nothing(&url, "sqlite").await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_survives_sigkill() {
    let Some(db) = TestDatabase::postgres().await else { return };
    kill_and_restart_loses_nothing(&db.url, "postgres").await;
    db.drop_database().await;
}
