//! Watch (many watches on one stream) over real sockets: what it adds to
//! WatchGateways, whose scenarios it also passes (tests/watch.rs, shape
//! `Shared`): watches sharing one stream each get exactly their events,
//! and creates and cancels by id are answered as documented.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use gantry_api::v1::watch_request::Request as Ask;
use gantry_api::v1::{
    EventType, ListGatewaysRequest, UpdateGatewayRequest, WatchCancel, WatchCreate,
    WatchGatewaysRequest, WatchRequest, WatchResponse,
};
use gantry_client::shared_watch::SharedWatch;
use prost_types::FieldMask;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};
use tonic_types::StatusExt;

const PATIENCE: Duration = Duration::from_secs(60);

async fn set_image(c: &mut Client, name: &str, image: &str) -> i64 {
    let request = UpdateGatewayRequest {
        gateway: Some(gateway(name, image)),
        update_mask: Some(FieldMask { paths: vec!["spec".into()] }),
        validate_only: false,
    };
    meta(&c.update_gateway(request).await.unwrap().into_inner()).resource_version
}

/// One line of the store's metrics, as a number.
async fn metric(store: &TestStore, line: &str) -> i64 {
    let text = http_get(store.http, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(line).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{line} missing from {text}"))
}

/// Twenty watches on one stream, five per gateway by name and the rest on
/// every gateway, while four writers change their gateways: each watch gets
/// every change it selects exactly once, in revision order, and the store
/// served them all on one Watch call.
async fn watches_sharing_a_stream_each_get_exactly_their_events(store: &TestStore) {
    const NAMES: [&str; 4] = ["a", "b", "c", "d"];
    const CHANGES: usize = 50;
    let mut c = store.client(ADMIN).await;
    for name in NAMES {
        create(&mut c, gateway(name, "gw:0")).await;
    }
    let start = c
        .list_gateways(ListGatewaysRequest::default())
        .await
        .unwrap()
        .into_inner()
        .resource_version;
    let shared = SharedWatch::open(store.client(VIEWER).await).await.unwrap();
    let mut watches = Vec::new();
    for w in 0..20 {
        let name = if w < 16 { NAMES[w % 4].to_string() } else { String::new() };
        let request = WatchGatewaysRequest {
            resource_version: start,
            name: name.clone(),
            ..Default::default()
        };
        watches.push((name, shared.watch(request).await.unwrap()));
    }
    let mut writers = Vec::new();
    for name in NAMES {
        let mut c = store.client(EDITOR).await;
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 1..=CHANGES {
                acked.push((set_image(&mut c, name, &format!("gw:{i}")).await, name));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    acked.sort_unstable();
    // Read all at once: a watch left unread holds the others back.
    let mut readers = Vec::new();
    for (name, mut events) in watches {
        let expected: Vec<i64> = acked
            .iter()
            .filter(|(_, n)| name.is_empty() || *n == name)
            .map(|(revision, _)| *revision)
            .collect();
        readers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while seen.len() < expected.len() {
                let event = tokio::time::timeout(PATIENCE, events.next())
                    .await
                    .expect("an event within the patience")
                    .expect("the watch stays open")
                    .unwrap();
                assert_eq!(event.r#type(), EventType::Modified);
                let got = event.gateway.as_ref().and_then(|g| g.metadata.as_ref()).unwrap();
                assert!(name.is_empty() || got.name == name, "watch of {name:?} got {}", got.name);
                seen.push(event.resource_version);
            }
            assert_eq!(seen, expected, "watch of {name:?}: every change once, in order");
        }));
    }
    for reader in readers {
        reader.await.unwrap();
    }
    let calls = r#"gantry_store_grpc_requests_total{method="Watch",code="OK"}"#;
    assert_eq!(metric(store, calls).await, 1, "the twenty watches shared one call");
}

/// A Watch stream driven by hand: its requests and its responses.
struct Raw {
    requests: mpsc::UnboundedSender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

impl Raw {
    async fn open(c: &mut Client) -> Raw {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let responses = c.watch(UnboundedReceiverStream::new(outgoing)).await.unwrap().into_inner();
        Raw { requests, responses }
    }

    fn create(&self, id: i64, watch: WatchGatewaysRequest) {
        let create = WatchCreate { watch_id: id, watch: Some(watch) };
        self.requests.send(WatchRequest { request: Some(Ask::Create(create)) }).unwrap();
    }

    fn cancel(&self, id: i64) {
        let cancel = WatchCancel { watch_id: id };
        self.requests.send(WatchRequest { request: Some(Ask::Cancel(cancel)) }).unwrap();
    }

    async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(PATIENCE, self.responses.next())
            .await
            .expect("a response within the patience")
            .expect("the stream stays open")
            .unwrap()
    }
}

fn named(name: &str) -> WatchGatewaysRequest {
    WatchGatewaysRequest { name: name.into(), ..Default::default() }
}

/// Creates and cancels by id: a cancelled watch says so and gets nothing
/// more, its id can be used again, an id in use or a bad request is
/// refused for that watch alone with its code and field, a cancel of no
/// open watch is NOT_FOUND, and the stream ends once the client closed its
/// side and no watch is open.
async fn creates_and_cancels_are_answered_by_watch_id(store: &TestStore) {
    let mut c = store.client(ADMIN).await;
    create(&mut c, gateway("edge", "gw:0")).await;
    let mut raw = Raw::open(&mut store.client(VIEWER).await).await;
    let mut answers = BTreeMap::new();
    raw.create(1, named("edge"));
    raw.create(2, named("edge"));
    for _ in 0..2 {
        let r = raw.next().await;
        assert!(r.created, "{r:?}");
        answers.insert(r.watch_id, r);
    }
    assert_eq!(answers.keys().copied().collect::<Vec<_>>(), [1, 2]);

    raw.cancel(1);
    let cancelled = raw.next().await;
    assert_eq!((cancelled.watch_id, cancelled.canceled, cancelled.code), (1, true, 0));
    let revision = set_image(&mut c, "edge", "gw:1").await;
    let event = raw.next().await;
    assert_eq!(event.watch_id, 2, "the cancelled watch gets nothing: {event:?}");
    assert_eq!(event.events[0].resource_version, revision);

    raw.create(1, named("edge"));
    assert!(raw.next().await.created, "an ended watch's id can be used again");
    raw.create(2, named("edge"));
    let in_use = raw.next().await;
    assert_eq!((in_use.watch_id, in_use.canceled), (2, true));
    assert_eq!(in_use.code, Code::AlreadyExists as i32, "{in_use:?}");
    raw.create(3, WatchGatewaysRequest { label_selector: "a in (".into(), ..Default::default() });
    let bad = raw.next().await;
    assert_eq!((bad.watch_id, bad.code), (3, Code::InvalidArgument as i32));
    let status = tonic::Status::with_details(Code::from(bad.code), bad.message, bad.details.into());
    let field = status.get_details_bad_request().unwrap().field_violations[0].field.clone();
    assert_eq!(field, "label_selector");
    raw.cancel(9);
    let unknown = raw.next().await;
    assert_eq!((unknown.watch_id, unknown.code), (9, Code::NotFound as i32));

    // Watch 2 (and 1) were not disturbed by the refusals.
    let revision = set_image(&mut c, "edge", "gw:2").await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let r = raw.next().await;
        assert_eq!(r.events[0].resource_version, revision);
        got.push(r.watch_id);
    }
    got.sort_unstable();
    assert_eq!(got, [1, 2]);

    raw.cancel(1);
    raw.cancel(2);
    drop(raw.requests);
    let mut ended = Vec::new();
    while let Some(r) = tokio::time::timeout(PATIENCE, raw.responses.next()).await.unwrap() {
        let r = r.unwrap();
        assert!(r.canceled && r.code == 0, "{r:?}");
        ended.push(r.watch_id);
    }
    ended.sort_unstable();
    assert_eq!(ended, [1, 2], "the stream ended after its last watch");
}

/// A request that carries neither create nor cancel ends the stream with
/// INVALID_ARGUMENT naming the field; so does one that does not decode.
async fn a_request_with_nothing_in_it_ends_the_stream(store: &TestStore) {
    let mut raw = Raw::open(&mut store.client(VIEWER).await).await;
    raw.requests.send(WatchRequest { request: None }).unwrap();
    let status = tokio::time::timeout(PATIENCE, raw.responses.next())
        .await
        .unwrap()
        .expect("an answer")
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.get_details_bad_request().unwrap().field_violations[0].field, "request");
}

on_both_backends!(
    watches_sharing_a_stream_each_get_exactly_their_events,
    creates_and_cancels_are_answered_by_watch_id,
    a_request_with_nothing_in_it_ends_the_stream,
);
