//! PostgreSQL faults under a running gateway-store process: every
//! connection terminated mid-traffic, then connections refused for a
//! while. Readiness follows the database, writes fail UNAVAILABLE without
//! partial effects, and the store recovers by itself (no restart).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_api::v1::{CreateGatewayRequest, ListGatewaysRequest};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_testkit::eventually;
use gantry_testkit::gateway::gateway;
use gantry_testkit::{http_get, temp_dir, StoreProcess, TestDatabase};
use tonic::Code;

const TERMINATE: &str =
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid()";

fn ready(store: &StoreProcess) -> bool {
    http_get(store.http, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"))
}

async fn wait(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    eventually(limit, &format!("{what} within {limit:?}"), || std::future::ready(done())).await;
}

/// Outcome of every create attempt: (name, phase when it started, Ok or
/// the failure code).
type Outcomes = Arc<Mutex<Vec<(String, u8, Result<(), Code>)>>>;

/// Phases of the test, as seen by the writers.
const NORMAL: u8 = 0;
const REFUSING: u8 = 1;

async fn create(client: &mut GatewayClient, name: &str) -> Result<(), Code> {
    client
        .create_gateway(CreateGatewayRequest {
            gateway: Some(gateway(name).build()),
            validate_only: false,
        })
        .await
        .map(drop)
        .map_err(|s| s.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_faults_fail_writes_cleanly_and_the_store_recovers() {
    let Some(db) = TestDatabase::postgres().await else { return };
    let dir = temp_dir("db-faults");
    let store = StoreProcess::start(&db.url, &dir);
    let config = ClientConfig { endpoint: store.endpoint(), ..Default::default() };

    // Background traffic: 4 writers creating gateways back to back.
    let outcomes: Outcomes = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let phase = Arc::new(std::sync::atomic::AtomicU8::new(NORMAL));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (outcomes, stop, phase, mut client) =
            (outcomes.clone(), stop.clone(), phase.clone(), config.connect_lazy().unwrap());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let name = format!("w{w}-{i}");
                let started_in = phase.load(std::sync::atomic::Ordering::SeqCst);
                let result = create(&mut client, &name).await;
                outcomes.lock().unwrap().push((name, started_in, result));
                if result.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    let acked = |o: &Outcomes| o.lock().unwrap().iter().filter(|(_, _, r)| r.is_ok()).count();
    wait("first writes", Duration::from_secs(30), || acked(&outcomes) >= 50).await;

    // 1. Every connection terminated mid-traffic: in-flight writes may fail
    //    (UNAVAILABLE), and the store reconnects by itself.
    db.admin(TERMINATE).await;
    let after_terminate = acked(&outcomes);
    wait(
        "writes succeed again after the connections were terminated",
        Duration::from_secs(30),
        || acked(&outcomes) >= after_terminate + 50,
    )
    .await;

    // 2. The database refuses connections for a while.
    db.admin("ALTER DATABASE {db} ALLOW_CONNECTIONS false").await;
    db.admin(TERMINATE).await;
    phase.store(REFUSING, std::sync::atomic::Ordering::SeqCst);
    wait("readiness goes false while the database refuses", Duration::from_secs(30), || {
        !ready(&store)
    })
    .await;
    let mut probe = config.connect_lazy().unwrap();
    let refused = create(&mut probe, "during-outage").await;
    assert_eq!(refused, Err(Code::Unavailable), "a write while the database refuses");
    wait("several writers' attempts failed", Duration::from_secs(60), || {
        outcomes.lock().unwrap().iter().filter(|(_, p, r)| *p == REFUSING && r.is_err()).count()
            >= 4
    })
    .await;
    phase.store(NORMAL, std::sync::atomic::Ordering::SeqCst);
    db.admin("ALTER DATABASE {db} ALLOW_CONNECTIONS true").await;
    wait("readiness comes back without a restart", Duration::from_secs(60), || ready(&store)).await;
    let after_outage = acked(&outcomes);
    wait("writes succeed again after the outage", Duration::from_secs(60), || {
        acked(&outcomes) >= after_outage + 50
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }

    // What is stored: every acknowledged create, and none of the creates
    // refused while no connection could exist.
    let mut client = config.connect_lazy().unwrap();
    let mut stored = BTreeSet::new();
    let mut token = String::new();
    let listed_revision = loop {
        let page = client
            .list_gateways(ListGatewaysRequest {
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
    let outcomes = outcomes.lock().unwrap().clone();
    for (name, _, result) in &outcomes {
        if result.is_ok() {
            assert!(stored.contains(name), "acknowledged {name} is missing");
        }
    }
    // Writes that started while no connection could exist and failed left
    // nothing behind. (One cut off mid-commit by the terminations may
    // have committed: that outcome is unknown to its client, as in etcd.)
    let refused: Vec<&String> = outcomes
        .iter()
        .filter(|(_, p, r)| *p == REFUSING && r.is_err())
        .map(|(n, _, r)| {
            assert_eq!(*r, Err(Code::Unavailable), "{n} failed with the wrong code");
            n
        })
        .collect();
    for name in &refused {
        assert!(!stored.contains(*name), "{name} failed UNAVAILABLE but was stored");
    }
    assert!(!stored.contains("during-outage"), "the refused probe write was stored");

    // The history is gap-free and matches the table.
    let revisions = gantry_testkit::replay_creations(&mut client, listed_revision).await;
    assert_eq!(revisions, (2..=listed_revision).collect::<Vec<_>>(), "revisions are gap-free");
    assert_eq!(revisions.len(), stored.len());
    let failed = outcomes.iter().filter(|(_, _, r)| r.is_err()).count();
    eprintln!(
        "postgres faults: {} creates acknowledged, {failed} failed UNAVAILABLE and were retried as new names, {} checked absent",
        stored.len(),
        refused.len()
    );
    drop(store);
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}
