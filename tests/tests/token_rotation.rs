//! Tokens change while everything runs: the store reloads its tokens file
//! and ends watches whose token expired or was removed; the reconciler
//! reports not-ready while its watch is refused and resumes by itself once
//! its token file holds a valid token again. Real processes, real sockets.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant, SystemTime};

use gantry_api::v1::{
    CreateGatewayRequest, Gateway, GatewaySpec, ObjectMeta, Phase, WatchGatewaysRequest,
};
use gantry_client::shared_watch::SharedWatch;
use gantry_client::ClientConfig;
use gantry_testkit::{eventually_some, replace_file, temp_dir, ReconcilerProcess, StoreProcess};
use tokio_stream::StreamExt;

const ADMIN: &str = "admin-token-000000000001";
const OLD: &str = "reconciler-token-old-0001";
const NEW: &str = "reconciler-token-new-0002";
const PATIENCE: Duration = Duration::from_secs(30);

fn tokens(lines: &[String]) -> String {
    lines.join("\n") + "\n"
}

/// Polls the reconciler's /readyz until its answer satisfies `done`.
async fn wait_http(port: u16, what: &str, done: impl Fn(&str) -> bool) -> String {
    eventually_some(PATIENCE, what, || async {
        let answer = gantry_testkit::fetch(port, "/readyz").await.unwrap_or_default();
        done(&answer).then_some(answer)
    })
    .await
}

async fn ending(
    watch: &mut (impl tokio_stream::Stream<Item = Result<gantry_api::v1::WatchEvent, tonic::Status>>
              + Unpin),
    what: &str,
) -> tonic::Status {
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match watch.next().await {
                Some(Ok(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} stayed open"));
    ended.unwrap_or_else(|| panic!("{what} ended without a status")).unwrap_err()
}

fn rfc3339(t: SystemTime) -> String {
    prost_types::Timestamp::from(t).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_watch_ends_unauthenticated_when_its_token_expires_or_is_removed() {
    let dir = temp_dir("token-expiry");
    let file = dir.join("tokens.csv");
    let expiring = "viewer-token-expiring-01";
    let removed = "viewer-token-removed-002";
    replace_file(&file, &tokens(&[format!("{ADMIN},root,admin"), format!("{removed},bob,viewer")]));
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let store =
        StoreProcess::start_with(&database, &dir, &["--tokens-file", file.to_str().unwrap()]);
    let watch = |token: &str| {
        let mut client = store.client_with_token(token);
        async move {
            let request = WatchGatewaysRequest { allow_bookmarks: true, ..Default::default() };
            client.watch_gateways(request).await.map(tonic::Response::into_inner)
        }
    };
    // A token added to the running store's file, valid for a few seconds.
    let expires_at = SystemTime::now() + Duration::from_secs(4);
    let expires = rfc3339(expires_at);
    replace_file(
        &file,
        &tokens(&[
            format!("{ADMIN},root,admin"),
            format!("{expiring},alice,viewer,{expires}"),
            format!("{removed},bob,viewer"),
        ]),
    );
    let deadline = Instant::now() + PATIENCE;
    let mut expiring_watch = loop {
        match watch(expiring).await {
            Ok(stream) => break stream,
            Err(status) => {
                assert!(
                    Instant::now() < deadline,
                    "the added token was never accepted: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // The same watches on Watch streams (several watches on one stream).
    let shared = |token: &str| {
        let client = store.client_with_token(token);
        async move {
            let stream = SharedWatch::open(client).await.unwrap();
            stream.watch(WatchGatewaysRequest::default()).await.unwrap()
        }
    };
    let mut expiring_shared = shared(expiring).await;
    let mut removed_watch = watch(removed).await.unwrap();
    let mut removed_shared = shared(removed).await;

    // Bob's token leaves the file: his watch ends at once with UNAUTHENTICATED.
    replace_file(
        &file,
        &tokens(&[format!("{ADMIN},root,admin"), format!("{expiring},alice,viewer,{expires}")]),
    );
    let status = ending(&mut removed_watch, "the watch of a removed token").await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let status = ending(&mut removed_shared, "the shared watch of a removed token").await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // Alice's token expires: her watch ends when it does, not before.
    let status = ending(&mut expiring_watch, "the watch of an expired token").await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    assert!(SystemTime::now() >= expires_at, "ended before the token expired");
    let status = ending(&mut expiring_shared, "the shared watch of an expired token").await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_with_a_revoked_token_is_not_ready_and_resumes_with_a_new_one() {
    let dir = temp_dir("token-rotation");
    let store_file = dir.join("tokens.csv");
    let reconciler_file = dir.join("reconciler.token");
    replace_file(
        &store_file,
        &tokens(&[format!("{ADMIN},root,admin"), format!("{OLD},gateway-reconciler,reconciler")]),
    );
    replace_file(&reconciler_file, OLD);
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let store =
        StoreProcess::start_with(&database, &dir, &["--tokens-file", store_file.to_str().unwrap()]);
    let manifests = dir.join("manifests");
    let token_flags = ["--token-file", reconciler_file.to_str().unwrap()];
    let reconciler = ReconcilerProcess::to_directory(&store.endpoint(), &manifests, &token_flags);
    wait_http(reconciler.http, "ready at start", |a| a.starts_with("HTTP/1.1 200")).await;

    // The operator revokes the reconciler's token.
    replace_file(&store_file, &tokens(&[format!("{ADMIN},root,admin")]));
    let answer =
        wait_http(reconciler.http, "not ready once revoked", |a| a.starts_with("HTTP/1.1 503"))
            .await;
    assert!(answer.contains("Unauthenticated"), "{answer}");

    // A gateway created meanwhile waits; a new token in both files and the
    // reconciler resumes by itself, without a restart.
    let admin = ClientConfig {
        endpoint: store.endpoint(),
        token: Some(ADMIN.into()),
        ..Default::default()
    };
    let mut client = admin.connect_lazy().unwrap();
    let g = Gateway {
        metadata: Some(ObjectMeta { name: "edge".into(), ..Default::default() }),
        spec: Some(GatewaySpec { image: "ghcr.io/acme/gateway:1".into(), ..Default::default() }),
        status: None,
    };
    client
        .create_gateway(CreateGatewayRequest { gateway: Some(g), validate_only: false })
        .await
        .unwrap();
    replace_file(
        &store_file,
        &tokens(&[format!("{ADMIN},root,admin"), format!("{NEW},gateway-reconciler,reconciler")]),
    );
    replace_file(&reconciler_file, NEW);
    wait_http(reconciler.http, "ready again with the new token", |a| a.starts_with("HTTP/1.1 200"))
        .await;
    gantry_testkit::wait_for_gateway(
        &client,
        "edge",
        "WRITTEN (directory target)",
        PATIENCE,
        |g| g.status.as_ref().is_some_and(|s| s.phase() == Phase::Written),
        || reconciler.logs(),
    )
    .await;
    drop(reconciler);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
