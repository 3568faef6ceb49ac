//! Two gateway-store processes on one PostgreSQL database: writes on
//! either, and a watcher on each sees the complete sequence.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gantry_api::v1::{CreateGatewayRequest, ListGatewaysRequest, WatchGatewaysRequest};
use gantry_client::ClientConfig;
use gantry_testkit::gateway::gateway;
use gantry_testkit::{temp_dir, StoreProcess, TestDatabase};
use tokio_stream::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_store_processes_share_one_history() {
    let Some(db) = TestDatabase::postgres().await else { return };
    let dir = temp_dir("replicas");
    let (a, b) = (StoreProcess::start(&db.url, &dir), StoreProcess::start(&db.url, &dir));
    let connect = |endpoint: String| async move {
        gantry_client::connect(&ClientConfig { endpoint, ..Default::default() }).await.unwrap()
    };
    let (mut ca, mut cb) = (connect(a.endpoint()).await, connect(b.endpoint()).await);
    let start = ca
        .list_gateways(ListGatewaysRequest::default())
        .await
        .unwrap()
        .into_inner()
        .resource_version;
    let watch = WatchGatewaysRequest { resource_version: start, ..Default::default() };
    let mut on_a = ca.watch_gateways(watch.clone()).await.unwrap().into_inner();
    let mut on_b = cb.watch_gateways(watch).await.unwrap().into_inner();

    // Writes on A only, then on both.
    let mut acked = Vec::new();
    for i in 0..60 {
        let client = if i < 30 || i % 2 == 0 { &mut ca } else { &mut cb };
        let g = client
            .create_gateway(CreateGatewayRequest {
                gateway: Some(gateway(&format!("gw-{i}")).build()),
                validate_only: false,
            })
            .await;
        acked.push(g.unwrap().into_inner().metadata.unwrap().resource_version);
    }
    let last = *acked.iter().max().unwrap();
    for (label, stream) in [("a", &mut on_a), ("b", &mut on_b)] {
        let mut revisions = Vec::new();
        while revisions.last().is_none_or(|r| *r < last) {
            let e = tokio::time::timeout(Duration::from_secs(30), stream.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            revisions.push(e.resource_version);
        }
        assert_eq!(revisions, (start + 1..=last).collect::<Vec<_>>(), "watcher on {label}");
    }
    acked.sort_unstable();
    assert_eq!(acked, (start + 1..=last).collect::<Vec<_>>());
    drop((a, b));
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(dir);
}
