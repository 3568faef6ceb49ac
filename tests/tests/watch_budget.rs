//! One identity's watches share a budget of page bytes
//! (`--max-watch-bytes-per-identity`): an identity that opens many
//! watches of the initial objects and reads none holds at most its budget
//! of database pages in the store (not a page per watch), another
//! identity's watch is served meanwhile, and once the first reads, each of
//! its watches gets every object exactly once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use gantry_api::v1::{CreateGatewayRequest, EventType, WatchGatewaysRequest};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_testkit::gateway::gateway;
use gantry_testkit::{eventually, http_get, temp_dir, StoreProcess};
use tokio_stream::StreamExt as _;

const ALICE: &str = "alice-token-000000000001";
const BOB: &str = "bob-token-00000000000001";
const EDITOR: &str = "editor-token-00000000001";
const BUDGET: u64 = 512 * 1024;
const PAGE: u64 = 256 * 1024;
const GATEWAYS: usize = 60;
const PATIENCE: Duration = Duration::from_secs(60);

fn page_bytes(store: &StoreProcess) -> u64 {
    let text = http_get(store.http, "/metrics").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("gantry_store_watch_page_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("gantry_store_watch_page_bytes on /metrics")
}

async fn connect(store: &StoreProcess, token: &str) -> GatewayClient {
    let config = ClientConfig {
        endpoint: store.endpoint(),
        token: Some(token.into()),
        ..Default::default()
    };
    gantry_client::connect(&config).await.unwrap()
}

/// Reads a watch of the initial objects to their end: the names, in order.
async fn initial_names(stream: &mut tonic::Streaming<gantry_api::v1::WatchEvent>) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        let event = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("the watch stalled")
            .expect("the watch ended")
            .expect("the watch failed");
        if event.initial_events_end {
            return names;
        }
        assert_eq!(event.r#type, EventType::Added as i32, "{event:?}");
        names.push(event.gateway.unwrap().metadata.unwrap().name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identitys_unread_watches_hold_at_most_its_budget_and_lose_nothing() {
    let dir = temp_dir("watch-budget");
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    unread_watches_within_the_budget(&database, &dir).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identitys_unread_watches_hold_at_most_its_budget_on_postgres() {
    let Some(db) = gantry_testkit::TestDatabase::postgres().await else { return };
    let dir = temp_dir("watch-budget-pg");
    unread_watches_within_the_budget(&db.url, &dir).await;
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn unread_watches_within_the_budget(database: &str, dir: &std::path::Path) {
    let tokens = format!("{ALICE},alice,viewer\n{BOB},bob,viewer\n{EDITOR},eddie,editor\n");
    let budget = BUDGET.to_string();
    let flags = ["--max-watch-bytes-per-identity", budget.as_str()];
    let store = StoreProcess::with_tokens(database, dir, &tokens, &flags);
    // 60 gateways of about 100 KiB: a page holds two or three.
    let mut editor = connect(&store, EDITOR).await;
    for i in 0..GATEWAYS {
        let mut g = gateway(&format!("g{i:02}")).build();
        g.spec.as_mut().unwrap().config.insert("blob".into(), "x".repeat(100 * 1024));
        let request = CreateGatewayRequest { gateway: Some(g), validate_only: false };
        editor.create_gateway(request).await.unwrap();
    }
    let all: Vec<String> = (0..GATEWAYS).map(|i| format!("g{i:02}")).collect();

    // Alice opens 12 watches of the initial objects on one connection and
    // reads none: the connection's window fills, and the watches stall
    // holding their pages.
    let mut alice = connect(&store, ALICE).await;
    let mut streams = Vec::new();
    for _ in 0..12 {
        let request = WatchGatewaysRequest { send_initial_events: true, ..Default::default() };
        streams.push(alice.watch_gateways(request).await.unwrap().into_inner());
    }
    eventually(PATIENCE, "alice's watches hold pages", || async { page_bytes(&store) >= PAGE })
        .await;
    // Bob is served meanwhile. While he reads, the pages held are sampled:
    // at most Alice's budget, and an object more per page (a page holds at
    // least one object), besides Bob's own page.
    let mut bob = connect(&store, BOB).await;
    let request = WatchGatewaysRequest { send_initial_events: true, ..Default::default() };
    let mut stream = bob.watch_gateways(request).await.unwrap().into_inner();
    let mut bob = tokio::spawn(async move { initial_names(&mut stream).await });
    let bound = BUDGET + 2 * 128 * 1024 + PAGE + 128 * 1024;
    let mut peak = page_bytes(&store);
    let names = loop {
        match tokio::time::timeout(Duration::from_millis(50), &mut bob).await {
            Ok(names) => break names.unwrap(),
            Err(_) => peak = peak.max(page_bytes(&store)),
        }
    };
    assert_eq!(names, all, "bob's initial objects");
    peak = peak.max(page_bytes(&store));
    let backend = database.split(':').next().unwrap_or_default();
    eprintln!(
        "{backend}: 12 unread watches of one identity hold {peak} bytes of pages (budget {BUDGET})"
    );
    assert!(peak <= bound, "alice's unread watches hold {peak} bytes, past her budget");

    // Alice reads all of them at once: each gets every object exactly once,
    // in order.
    let readers: Vec<_> = streams
        .into_iter()
        .map(|mut stream| tokio::spawn(async move { initial_names(&mut stream).await }))
        .collect();
    for reader in readers {
        let names = reader.await.unwrap();
        assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), names.len(), "a duplicate");
        assert_eq!(names, all, "alice's initial objects");
    }
    // Drained: the pages are given back.
    eventually(PATIENCE, "every page given back", || async { page_bytes(&store) == 0 }).await;
    drop(store);
}
