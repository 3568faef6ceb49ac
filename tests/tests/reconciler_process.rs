//! The gateway-reconciler binary with a gateway-store process: the
//! directory target's lifecycle on files, SIGKILL and restarts of either
//! process, and a watch that falls behind compaction.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use gantry_api::v1::{
    ConditionStatus, CreateGatewayRequest, DeleteGatewayRequest, Gateway, GatewaySpec,
    GetGatewayRequest, Phase, Route, UpdateGatewayRequest, WatchGatewaysRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_kube_fake::{KubeFake, Options};
use gantry_testkit::gateway::named;
use gantry_testkit::{eventually, eventually_blocking, eventually_some};
use gantry_testkit::{http_get, temp_dir, ReconcilerProcess, StoreProcess, TestDatabase};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use prost_types::FieldMask;

const PATIENCE: Duration = Duration::from_secs(60);

fn spec(image: &str) -> GatewaySpec {
    GatewaySpec { image: image.into(), ..Default::default() }
}

async fn client(store: &StoreProcess) -> GatewayClient {
    ClientConfig { endpoint: store.endpoint(), ..Default::default() }.connect_lazy().unwrap()
}

async fn create(client: &GatewayClient, name: &str, spec: GatewaySpec) {
    client
        .clone()
        .create_gateway(CreateGatewayRequest {
            gateway: Some(named(name).with_spec(spec).build()),
            validate_only: false,
        })
        .await
        .unwrap();
}

async fn set_spec(client: &GatewayClient, name: &str, spec: GatewaySpec) {
    let mask = Some(FieldMask { paths: vec!["spec".into()] });
    client
        .clone()
        .update_gateway(UpdateGatewayRequest {
            gateway: Some(named(name).with_spec(spec).build()),
            update_mask: mask,
            validate_only: false,
        })
        .await
        .unwrap();
}

/// Waits until the gateway is in `phase` (RUNNING on a cluster, WRITTEN on
/// the directory target) at its generation (retrying through store
/// restarts).
async fn wait_settled(client: &GatewayClient, name: &str, phase: Phase) -> Gateway {
    eventually_some(PATIENCE, &format!("{name} converged"), || async {
        let g = client.clone().get_gateway(GetGatewayRequest { name: name.into() }).await.ok()?;
        let g = g.into_inner();
        let s = g.status.clone().unwrap_or_default();
        (s.phase() == phase && s.observed_generation == g.metadata.as_ref()?.generation)
            .then_some(g)
    })
    .await
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_target_writes_whole_files_and_cleans_up() {
    let dir = temp_dir("directory-target");
    let manifests = dir.join("manifests");
    // With authentication: the reconciler role is all the reconciler needs.
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, "editor-token-000000000001,eddie,editor\nreconciler-token-0000001,gateway-reconciler,reconciler\n").unwrap();
    let token_file = dir.join("reconciler.token");
    std::fs::write(&token_file, "reconciler-token-0000001\n").unwrap();
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let store =
        StoreProcess::start_with(&database, &dir, &["--tokens-file", tokens.to_str().unwrap()]);
    let token = ["--token-file", token_file.to_str().unwrap()];
    let _reconciler = ReconcilerProcess::to_directory(&store.endpoint(), &manifests, &token);
    let editor = Some("editor-token-000000000001".to_string());
    let c = ClientConfig { endpoint: store.endpoint(), token: editor, ..Default::default() }
        .connect_lazy()
        .unwrap();
    create(&c, "edge", spec("ghcr.io/acme/gw:1")).await;
    let written = wait_settled(&c, "edge", Phase::Written).await;
    let ready = written
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .unwrap()
        .clone();
    // Nothing runs the files: nothing is claimed about them.
    assert_eq!(
        (ready.status(), ready.reason.as_str()),
        (ConditionStatus::Unknown, "NotObserved"),
        "{ready:?}"
    );
    let gateway_dir = manifests.join("edge");
    assert_eq!(
        files(&gateway_dir),
        [
            ".gantry-gateway",
            "configmap.yaml",
            "deployment.yaml",
            "service.yaml",
            "serviceaccount.yaml"
        ],
        "the manifests and the marker holding the gateway's uid"
    );
    let deployment = std::fs::read_to_string(gateway_dir.join("deployment.yaml")).unwrap();
    assert!(
        deployment.contains("kind: Deployment") && deployment.contains("image: ghcr.io/acme/gw:1"),
        "{deployment}"
    );

    let mut routed = spec("ghcr.io/acme/gw:2");
    routed.route = Some(Route { host: "edge.example.com".into(), tls_secret_name: String::new() });
    set_spec(&c, "edge", routed).await;
    let g = wait_settled(&c, "edge", Phase::Written).await;
    assert_eq!(g.status.unwrap().observed_generation, 2);
    assert!(files(&gateway_dir).contains(&"ingress.yaml".to_string()));
    assert!(std::fs::read_to_string(gateway_dir.join("deployment.yaml"))
        .unwrap()
        .contains("image: ghcr.io/acme/gw:2"));

    set_spec(&c, "edge", spec("ghcr.io/acme/gw:2")).await;
    wait_settled(&c, "edge", Phase::Written).await;
    let now = files(&gateway_dir);
    assert!(!now.contains(&"ingress.yaml".to_string()), "the Ingress file was pruned");
    assert!(
        now.iter().all(|f| f.ends_with(".yaml") || f == ".gantry-gateway"),
        "no temporary files left: {now:?}"
    );

    c.clone()
        .delete_gateway(DeleteGatewayRequest {
            name: "edge".into(),
            resource_version: 0,
            validate_only: false,
        })
        .await
        .unwrap();
    eventually(PATIENCE, "the gateway was never removed", || async {
        c.clone().get_gateway(GetGatewayRequest { name: "edge".into() }).await.is_err()
    })
    .await;
    assert!(!gateway_dir.exists(), "the gateway's directory was removed");
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `scenario(database_url, dir)` on a SQLite file and on a fresh
/// PostgreSQL database (skipped outside CI when PostgreSQL is unreachable).
async fn on_both_backends<F, Fut>(label: &str, scenario: F)
where
    F: Fn(String, PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = temp_dir(&format!("{label}-sqlite"));
    scenario(format!("sqlite://{}", dir.join("gantry.db").display()), dir.clone()).await;
    let _ = std::fs::remove_dir_all(dir);
    if let Some(db) = TestDatabase::postgres().await {
        let dir = temp_dir(&format!("{label}-postgres"));
        scenario(db.url.clone(), dir.clone()).await;
        db.drop_database().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_and_restarts_of_either_process_converge_without_duplicates() {
    on_both_backends("reconciler-restarts", kills_and_restarts).await;
}

async fn kills_and_restarts(database: String, dir: PathBuf) {
    let kube = KubeFake::start_with(Options {
        rollout_delay: Duration::from_millis(10),
        ..Options::default()
    })
    .await
    .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let mut store = StoreProcess::start(&database, &dir);
    let args = [
        "--target",
        "kube",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        "default",
        "--poll-interval",
        "100ms",
    ];
    let mut reconciler = ReconcilerProcess::start(&store.endpoint(), &args);
    let c = client(&store).await;

    for i in 0..10 {
        create(&c, &format!("gw-{i}"), spec("ghcr.io/acme/gw:1")).await;
    }
    // Kill the reconciler while it is applying, and start it again.
    eventually(PATIENCE, "nothing was applied", || async {
        kube.requests().iter().any(|r| r.verb == "apply" && r.resource == "apps/deployments")
    })
    .await;
    reconciler.kill9();
    reconciler.spawn();
    for i in 0..10 {
        wait_settled(&c, &format!("gw-{i}"), Phase::Running).await;
    }

    // The store dies under the reconciler and comes back: it resumes.
    store.kill9();
    store.spawn();
    create(&c, "after-restart", spec("ghcr.io/acme/gw:1")).await;
    wait_settled(&c, "after-restart", Phase::Running).await;

    let client = kube::Client::try_from(kube::Config::new(kube.url().parse().unwrap())).unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let listed = deployments
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=gantry"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 11, "one Deployment per gateway, no duplicates");
    assert_eq!(reconciler.terminate().map(|s| s.success()), Some(true), "clean exit on SIGTERM");
    drop(store);
    kube.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether a watch from `revision` is refused OUT_OF_RANGE: the history
/// after it is compacted. (Otherwise the watch delivers the events after
/// it at once.)
async fn compacted_past(client: &GatewayClient, revision: i64) -> bool {
    use tokio_stream::StreamExt as _;
    let request = WatchGatewaysRequest { resource_version: revision, ..Default::default() };
    let first = match client.clone().watch_gateways(request).await {
        Ok(watch) => tokio::time::timeout(Duration::from_secs(5), watch.into_inner().next()).await,
        Err(status) => return status.code() == tonic::Code::OutOfRange,
    };
    matches!(first, Ok(Some(Err(status))) if status.code() == tonic::Code::OutOfRange)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_behind_compaction_relists_and_misses_nothing() {
    on_both_backends("reconciler-relist", behind_compaction).await;
}

async fn behind_compaction(database: String, dir: PathBuf) {
    let manifests = dir.join("manifests");
    let store = StoreProcess::start_with(
        &database,
        &dir,
        &[
            "--watch-buffer",
            "2",
            "--watch-cache-events",
            "4",
            "--history-max-events",
            "3",
            "--compaction-interval",
            "100ms",
        ],
    );
    let reconciler = ReconcilerProcess::to_directory(&store.endpoint(), &manifests, &[]);
    let c = client(&store).await;
    create(&c, "first", spec("ghcr.io/acme/gw:1")).await;
    let settled = wait_settled(&c, "first", Phase::Written).await;
    let seen = settled.metadata.map(|m| m.resource_version).unwrap_or_default();

    // Frozen, the reconciler falls behind the watch buffer and the history.
    // Large gateways (200 KiB of config each) overflow the socket and
    // HTTP/2 buffers that would otherwise absorb the stall.
    reconciler.signal("-STOP");
    for i in 0..30 {
        let mut big = spec("ghcr.io/acme/gw:1");
        big.config.insert("blob".into(), "x".repeat(200 * 1024));
        create(&c, &format!("while-stopped-{i}"), big).await;
    }
    // Compaction (every 100 ms) has dropped the history after the last
    // event the reconciler saw: a watch from there is refused.
    eventually(PATIENCE, "the history compacted past the reconciler's position", || async {
        compacted_past(&c, seen).await
    })
    .await;
    reconciler.signal("-CONT");
    for i in 0..30 {
        wait_settled(&c, &format!("while-stopped-{i}"), Phase::Written).await;
    }
    assert_eq!(files(&manifests).len(), 31);
    let logs = reconciler.logs();
    assert!(logs.contains("relisting"), "the watch fell behind compaction and relisted:\n{logs}");
    drop(reconciler);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn while_the_store_is_unreachable_the_reconciler_says_so_and_is_not_ready() {
    let dir = temp_dir("reconciler-no-store");
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let mut store = StoreProcess::start(&database, &dir);
    store.kill9();
    let directory = dir.join("manifests");
    let reconciler = ReconcilerProcess::launch(
        &store.endpoint(),
        &["--target", "directory", "--directory", directory.to_str().unwrap()],
    );
    let readyz = || http_get(reconciler.http, "/readyz").unwrap_or_default();
    eventually_blocking(PATIENCE, "readyz says the store's watch is down", || {
        let answer = readyz();
        answer.starts_with("HTTP/1.1 503") && answer.contains("the watch of gateway-store is down")
    });
    eventually_blocking(PATIENCE, "the reconciler logs that it cannot watch the store", || {
        reconciler.logs().contains("cannot watch gateway-store; retrying")
    });
    assert!(readyz().contains("Unavailable"), "the reason: {}", readyz());
    let metrics = || http_get(reconciler.http, "/metrics").unwrap_or_default();
    assert!(metrics().contains("gantry_reconciler_store_watch_up 0"), "{}", metrics());
    assert!(metrics().contains("gantry_reconciler_leader 1"), "no election: it leads");

    store.spawn();
    eventually_blocking(PATIENCE, "ready once the store is back", || {
        readyz().starts_with("HTTP/1.1 200")
    });
    assert!(reconciler.logs().contains("the watch of gateway-store is back"));
    assert!(metrics().contains("gantry_reconciler_store_watch_up 1"), "{}", metrics());
    // The store logs in its human format to a file: no colour codes there.
    let logs = store.logs();
    assert!(logs.contains("INFO") && !logs.contains('\u{1b}'), "{logs}");
    drop(reconciler);
    let _ = std::fs::remove_dir_all(dir);
}
