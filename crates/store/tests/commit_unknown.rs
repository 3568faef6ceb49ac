//! A batch whose commit is unknown to the writer (the database committed,
//! its answer was lost) is published by no one else: the writer does not
//! publish what it does not know committed, and on PostgreSQL the listener
//! leaves a store's own commits to its writer. The writer wakes the tailer,
//! which reads what is new, so watchers still get the change, and at once:
//! polling here is an hour, far past the wait.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::hooked::{Hooked, Outcome};
use common::*;
use gantry_api::v1::{CreateGatewayRequest, EventType, GetGatewayRequest, WatchGatewaysRequest};
use gantry_store::storage::StorageError;
use gantry_store::WatchSettings;
use tokio_stream::StreamExt as _;
use tonic::Code;

const LOST: &str = "lost-answer";

async fn a_commit_whose_answer_was_lost_still_reaches_its_watchers(backend: Backend) {
    let lose = |role: &'static str, names: &[String], outcome: Outcome| match outcome {
        Ok(_) if role == "writer" && names.iter().any(|n| n == LOST) => {
            Err(StorageError::CommitUnknown("the answer was lost (test)".into()))
        }
        outcome => outcome,
    };
    let watch = WatchSettings { poll_interval: Duration::from_secs(3600), ..test_watch_settings() };
    let Some(store) = TestStore::start_wrapped(backend, watch, Hooked::wrap(Arc::new(lose))).await
    else {
        return;
    };
    let mut editor = store.client(EDITOR).await;
    let before = create(&mut editor, gateway("before", "img:1")).await;
    let request = WatchGatewaysRequest {
        resource_version: meta(&before).resource_version,
        name: LOST.into(),
        ..Default::default()
    };
    let mut events = editor.watch_gateways(request).await.unwrap().into_inner();

    let create =
        CreateGatewayRequest { gateway: Some(gateway(LOST, "img:1")), validate_only: false };
    let unknown = editor.create_gateway(create).await.unwrap_err();
    assert_eq!(unknown.code(), Code::Unavailable, "{unknown:?}");
    assert!(unknown.message().contains("may have committed"), "{unknown:?}");

    let event = tokio::time::timeout(Duration::from_secs(60), events.next())
        .await
        .expect("the commit never reached the watcher: nothing woke the tailer")
        .expect("the watch ended")
        .unwrap();
    assert_eq!(event.r#type(), EventType::Added);
    assert_eq!(meta(event.gateway.as_ref().unwrap()).name, LOST);
    // Read again, as the error says: it committed.
    let request = GetGatewayRequest { name: LOST.into() };
    assert!(editor.get_gateway(request).await.is_ok());
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    a_commit_whose_answer_was_lost_still_reaches_its_watchers(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    a_commit_whose_answer_was_lost_still_reaches_its_watchers(Backend::Postgres).await;
}
