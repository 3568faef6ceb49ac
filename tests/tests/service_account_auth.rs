//! Kubernetes service-account tokens against a real API server: the store
//! verifies them against the keys that server publishes, gives them the
//! role their binding names and, with TokenReview, stops taking the token
//! of a deleted account or bound object before it expires; the reconciler
//! runs on a token file rotated under it without going unready.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_api::v1::{
    CreateGatewayRequest, GatewayStatus, ListGatewaysRequest, Phase, UpdateGatewayRequest,
};
use gantry_client::GatewayClient;
use gantry_testkit::jwt::{kid_of, now, Signer};
use gantry_testkit::k8s::ControlPlane;
use gantry_testkit::{eventually, replace_file, temp_dir, ReconcilerProcess, StoreProcess};
use tonic::Code;

const ADMIN: &str = "admin-token-000000000001";
const PATIENCE: Duration = Duration::from_secs(60);

/// A store taking the tokens file's admin and the plane's service-account
/// tokens (TokenReview on), with `bindings` as its role bindings.
fn store(plane: &ControlPlane, dir: &Path, bindings: &str) -> StoreProcess {
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, format!("{ADMIN},root,admin\n")).unwrap();
    let bindings_file = dir.join("bindings.yaml");
    std::fs::write(&bindings_file, bindings).unwrap();
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    StoreProcess::start_with_env(
        &database,
        dir,
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--service-account-tokens",
            "--service-account-token-review",
            "--role-bindings-file",
            bindings_file.to_str().unwrap(),
        ],
        &[("KUBECONFIG", plane.admin_kubeconfig.to_str().unwrap())],
    )
}

fn client(store: &StoreProcess, token: &str) -> GatewayClient {
    store.client_with_token(token)
}

fn create_token(plane: &ControlPlane, namespace: &str, account: &str, args: &[&str]) -> String {
    let out = plane.kubectl(&[&["-n", namespace, "create", "token", account], args].concat());
    out.trim().to_string()
}

async fn list(store: &StoreProcess, token: &str) -> Result<(), tonic::Status> {
    let request = ListGatewaysRequest { page_size: 1, ..Default::default() };
    client(store, token).list_gateways(request).await.map(drop)
}

async fn refused(store: &StoreProcess, token: &str, code: Code, reason: &str) {
    let status = list(store, token).await.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(reason), "wanted {reason:?}: {status:?}");
}

async fn create(store: &StoreProcess, name: &str) {
    let gateway = gantry_testkit::gateway::named(name).image("ghcr.io/acme/gw:1").build();
    let request = CreateGatewayRequest { gateway: Some(gateway), validate_only: false };
    client(store, ADMIN).create_gateway(request).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_verified_against_the_api_server_and_reviewed() {
    let Some(plane) = ControlPlane::shared() else { return };
    let ns = plane.namespace("sa-auth");
    for account in ["gateway-reconciler", "doomed", "unbound"] {
        plane.kubectl(&["-n", &ns, "create", "serviceaccount", account]);
    }
    let dir = temp_dir("sa-auth");
    let bindings = format!(
        "bindings:\n  - role: reconciler\n    subjects:\n      - {{kind: ServiceAccount, namespace: {ns}, name: gateway-reconciler}}\n\
         \x20 - role: viewer\n    subjects:\n      - {{kind: ServiceAccount, namespace: {ns}, name: doomed}}\n"
    );
    let store = store(plane, &dir, &bindings);
    create(&store, "edge").await;

    // `kubectl create token gateway-reconciler --audience gantry`: the
    // reconciler role, which writes status and may not create.
    let token = create_token(plane, &ns, "gateway-reconciler", &["--audience", "gantry"]);
    list(&store, &token).await.unwrap();
    let status = GatewayStatus {
        phase: Phase::Written.into(),
        observed_generation: 1,
        ..Default::default()
    };
    let mut gateway = gantry_testkit::gateway::named("edge").image("ghcr.io/acme/gw:1").build();
    gateway.status = Some(status);
    let request = UpdateGatewayRequest {
        gateway: Some(gateway),
        update_mask: Some(prost_types::FieldMask { paths: vec!["status".into()] }),
        ..Default::default()
    };
    client(&store, &token).update_gateway(request).await.unwrap();
    let gateway = gantry_testkit::gateway::named("other").image("ghcr.io/acme/gw:1").build();
    let request = CreateGatewayRequest { gateway: Some(gateway), validate_only: false };
    let denied = client(&store, &token).create_gateway(request).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");

    // Another audience.
    let vault = create_token(plane, &ns, "gateway-reconciler", &["--audience", "vault"]);
    refused(&store, &vault, Code::Unauthenticated, "audience is not gantry").await;
    // Expired: signed with the issuer's own key and key id (the API server
    // will not issue a token shorter than ten minutes).
    let claims: serde_json::Value =
        jsonwebtoken::dangerous::insecure_decode_claims(&token).unwrap();
    let at = |claims: &serde_json::Value, start: u64, end: u64| {
        let mut c = claims.clone();
        (c["iat"], c["nbf"], c["exp"]) = (start.into(), start.into(), end.into());
        c
    };
    let issuer = Signer::from_pem(&plane.service_account_key(), &kid_of(&token).unwrap());
    let expired = issuer.sign(&at(&claims, now() - 7200, now() - 3600));
    refused(&store, &expired, Code::Unauthenticated, "expired").await;
    // The same key with current times is taken: the refusal above was the time.
    list(&store, &issuer.sign(&at(&claims, now(), now() + 600))).await.unwrap();
    // Signed by another key under the issuer's key id, and by another issuer.
    let impostor = Signer::new(&issuer.kid).sign(&at(&claims, now(), now() + 600));
    refused(&store, &impostor, Code::Unauthenticated, "signature").await;
    let mut foreign = at(&claims, now(), now() + 600);
    foreign["iss"] = "https://issuer.example".into();
    refused(&store, &Signer::new("x").sign(&foreign), Code::Unauthenticated, "issuer").await;
    // Authenticated, but no binding names it.
    let unbound = create_token(plane, &ns, "unbound", &["--audience", "gantry"]);
    refused(
        &store,
        &unbound,
        Code::PermissionDenied,
        &format!("system:serviceaccount:{ns}:unbound"),
    )
    .await;

    // A deleted account's token stops working before it expires (TokenReview).
    let doomed = create_token(plane, &ns, "doomed", &["--audience", "gantry"]);
    list(&store, &doomed).await.unwrap();
    plane.kubectl(&["-n", &ns, "delete", "serviceaccount", "doomed"]);
    eventually(PATIENCE, "the deleted account's token refused", || async {
        list(&store, &doomed).await.is_err_and(|s| s.code() == Code::Unauthenticated)
    })
    .await;
    refused(&store, &doomed, Code::Unauthenticated, "no longer accepts").await;

    // Every refusal is in the log with its reason; no token is.
    let logs = store.logs();
    for reason in ["audience is not gantry", "expired", "signature", "no longer accepts", "unbound"]
    {
        assert!(logs.contains(reason), "no refusal logged for {reason:?}:\n{logs}");
    }
    for secret in [&token, &vault, &doomed] {
        assert!(!logs.contains(secret.as_str()), "a token was logged");
    }
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_runs_on_a_rotated_service_account_token_and_stays_ready() {
    let Some(plane) = ControlPlane::shared() else { return };
    let ns = plane.namespace("sa-rotation");
    plane.kubectl(&["-n", &ns, "create", "serviceaccount", "gateway-reconciler"]);
    // Each token is bound to a Secret: deleting the Secret revokes it.
    for secret in ["first", "second"] {
        plane.kubectl(&["-n", &ns, "create", "secret", "generic", secret]);
    }
    let bound_to = |secret: &str| {
        let bound = [
            "--audience",
            "gantry",
            "--bound-object-kind",
            "Secret",
            "--bound-object-name",
            secret,
        ];
        create_token(plane, &ns, "gateway-reconciler", &bound)
    };
    let dir = temp_dir("sa-rotation");
    let bindings = format!(
        "bindings:\n  - role: reconciler\n    subjects:\n      - {{kind: ServiceAccount, namespace: {ns}, name: gateway-reconciler}}\n"
    );
    let store = store(plane, &dir, &bindings);
    let token_file = dir.join("token");
    let first = bound_to("first");
    replace_file(&token_file, &first);
    let manifests = dir.join("manifests");
    let token_flags = ["--token-file", token_file.to_str().unwrap()];
    let reconciler = ReconcilerProcess::to_directory(&store.endpoint(), &manifests, &token_flags);
    create(&store, "edge").await;
    let admin = client(&store, ADMIN);
    reconciler.wait_observed(&admin, "edge", 1).await;

    // /readyz sampled from here to the end.
    let stop = Arc::new(AtomicBool::new(false));
    let unready = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (stop, unready, port) = (stop.clone(), unready.clone(), reconciler.http);
        tokio::spawn(async move {
            let (mut samples, mut every) = (0, tokio::time::interval(Duration::from_millis(100)));
            while !stop.load(Ordering::SeqCst) {
                every.tick().await;
                let answer = gantry_testkit::fetch(port, "/readyz").await.unwrap_or_default();
                if !answer.starts_with("HTTP/1.1 200") {
                    unready.lock().unwrap().push(answer);
                }
                samples += 1;
            }
            samples
        })
    };

    // The kubelet's rotation: a new token in the file, then the old one
    // revoked (its Secret deleted) and refused by the store.
    replace_file(&token_file, &bound_to("second"));
    plane.kubectl(&["-n", &ns, "delete", "secret", "first"]);
    eventually(PATIENCE, "the first token refused", || async {
        list(&store, &first).await.is_err_and(|s| s.code() == Code::Unauthenticated)
    })
    .await;
    // A change made now converges: the reconciler writes with the new token.
    let mut changed = gantry_testkit::gateway::named("edge").image("ghcr.io/acme/gw:2").build();
    changed.status = None;
    let request = UpdateGatewayRequest {
        gateway: Some(changed),
        update_mask: Some(prost_types::FieldMask { paths: vec!["spec".into()] }),
        ..Default::default()
    };
    let updated = admin.clone().update_gateway(request).await.unwrap().into_inner();
    let generation = updated.metadata.unwrap().generation;
    reconciler.wait_observed(&admin, "edge", generation).await;

    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    let unready = unready.lock().unwrap().clone();
    assert!(
        unready.is_empty(),
        "not ready during the rotation: {unready:?}\n{}",
        reconciler.logs()
    );
    assert!(samples >= 5, "too few readiness samples to tell: {samples}");
    drop(reconciler);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
