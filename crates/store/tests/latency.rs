//! Responses of several KB leave at once: every accepted connection has
//! TCP_NODELAY, so a reply written in more than one segment is not held
//! back by Nagle's algorithm until the client's delayed ACK (about 40 ms).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use gantry_api::v1::GetGatewayRequest;

async fn median_get(client: &mut Client, name: &str) -> Duration {
    let mut times = Vec::new();
    for _ in 0..41 {
        let started = Instant::now();
        let request = GetGatewayRequest { name: name.into() };
        client.get_gateway(request).await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_of_several_kb_is_read_as_fast_as_a_small_one() {
    let store = TestStore::start(Backend::Sqlite).await.unwrap();
    let mut client = store.client(ADMIN).await;
    create(&mut client, gateway("small", "ghcr.io/acme/gw:1")).await;
    let mut big = gateway("big", "ghcr.io/acme/gw:1");
    let spec = big.spec.as_mut().unwrap();
    for i in 0..8 {
        spec.config.insert(format!("routes-{i}.yaml"), "x".repeat(600));
    }
    create(&mut client, big).await;
    let small = median_get(&mut client, "small").await;
    let big = median_get(&mut client, "big").await;
    eprintln!("GetGateway median: small {small:?}, 5 KB {big:?}");
    assert!(
        big < small + Duration::from_millis(10),
        "a 5 KB reply took {big:?} at the median against {small:?} for a small one: a Nagle-class delay"
    );
    store.stop().await;
}
