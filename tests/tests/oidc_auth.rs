//! People's OIDC tokens against a real store process and a real HTTPS
//! provider (`gantry_testkit::oidc`, its own CA): users and groups get the
//! roles their bindings give, a key rotation is picked up without a
//! restart, and forged tokens are refused.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gantry_api::v1::{CreateGatewayRequest, ListGatewaysRequest};
use gantry_client::GatewayClient;
use gantry_testkit::jwt::{now, Signer};
use gantry_testkit::oidc::OidcProvider;
use gantry_testkit::{eventually, temp_dir, StoreProcess};
use tonic::Code;

const BINDINGS: &str = "bindings:\n  - role: editor\n    subjects:\n      - {kind: Group, name: 'idp:platform'}\n  - role: viewer\n    subjects:\n      - {kind: User, name: viewer@example.com}\n";

fn client(store: &StoreProcess, token: &str) -> GatewayClient {
    store.client_with_token(token)
}

fn person(issuer: &str, email: &str, groups: &[&str]) -> serde_json::Value {
    gantry_testkit::jwt::person(issuer, "gantry-cli", email, groups, now()..now() + 600)
}

async fn create(store: &StoreProcess, token: &str, name: &str) -> Result<(), tonic::Status> {
    let gateway = gantry_testkit::gateway::named(name).image("ghcr.io/acme/gw:1").build();
    let request = CreateGatewayRequest { gateway: Some(gateway), validate_only: false };
    client(store, token).create_gateway(request).await.map(drop)
}

async fn list(store: &StoreProcess, token: &str) -> Result<(), tonic::Status> {
    let request = ListGatewaysRequest { page_size: 1, ..Default::default() };
    client(store, token).list_gateways(request).await.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_people_get_their_roles_keys_rotate_and_forgeries_are_refused() {
    let first = Signer::new("idp-key-1");
    let provider = OidcProvider::start(&[&first]).await;
    let dir = temp_dir("oidc");
    let ca = dir.join("idp-ca.pem");
    std::fs::write(&ca, &provider.ca_pem).unwrap();
    let bindings = dir.join("bindings.yaml");
    std::fs::write(&bindings, BINDINGS).unwrap();
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, "admin-token-000000000001,root,admin\n").unwrap();
    let database = format!("sqlite://{}", dir.join("gantry.db").display());
    let store = StoreProcess::start_with(
        &database,
        &dir,
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--oidc-issuer-url",
            &provider.issuer,
            "--oidc-client-id",
            "gantry-cli",
            "--oidc-ca-file",
            ca.to_str().unwrap(),
            "--oidc-username-claim",
            "email",
            "--oidc-groups-claim",
            "groups",
            "--oidc-groups-prefix",
            "idp:",
            "--role-bindings-file",
            bindings.to_str().unwrap(),
        ],
    );
    let issuer = provider.issuer.clone();

    // A platform engineer (group) creates; a viewer (user) lists and may
    // not create; someone no binding names is denied.
    let alice = first.sign(&person(&issuer, "alice@example.com", &["platform"]));
    create(&store, &alice, "edge").await.unwrap();
    let viewer = first.sign(&person(&issuer, "viewer@example.com", &[]));
    list(&store, &viewer).await.unwrap();
    let denied = create(&store, &viewer, "other").await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let mallory = first.sign(&person(&issuer, "mallory@example.com", &["sales"]));
    let denied = list(&store, &mallory).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("mallory@example.com"), "{denied:?}");

    // Forgeries: `alg: none`, HS256 keyed with the public key, another
    // key under the provider's key id, a token for another client.
    let payload =
        URL_SAFE_NO_PAD.encode(person(&issuer, "alice@example.com", &["platform"]).to_string());
    let none = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","kid":"idp-key-1"}"#);
    let mut hs256 = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    hs256.kid = Some("idp-key-1".into());
    let public = serde_json::to_vec(&first.jwk()).unwrap();
    let confused = jsonwebtoken::encode(
        &hs256,
        &person(&issuer, "alice@example.com", &["platform"]),
        &jsonwebtoken::EncodingKey::from_secret(&public).unwrap(),
    )
    .unwrap();
    let impostor =
        Signer::new("idp-key-1").sign(&person(&issuer, "alice@example.com", &["platform"]));
    let mut other_client = person(&issuer, "alice@example.com", &["platform"]);
    other_client["aud"] = "kubernetes".into();
    for forged in [format!("{none}.{payload}."), confused, impostor, first.sign(&other_client)] {
        let status = create(&store, &forged, "forged").await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }

    // The provider rotates to a new key: tokens it signs are taken once the
    // store fetches the new set, with no restart; the old key's are not.
    let second = Signer::new("idp-key-2");
    provider.publish(&[&second]);
    let fetches = provider.key_fetches();
    let bob = second.sign(&person(&issuer, "bob@example.com", &["platform"]));
    eventually(Duration::from_secs(60), "the rotated key taken", || async {
        create(&store, &bob, "after-rotation").await.is_ok()
    })
    .await;
    assert!(provider.key_fetches() > fetches, "the key set was not fetched again");
    let old = first.sign(&person(&issuer, "carol@example.com", &["platform"]));
    let status = create(&store, &old, "old-key").await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("idp-key-1"), "{status:?}");

    // Refusals are logged with the identity and the authenticator.
    let logs = store.logs();
    assert!(
        logs.lines().any(|l| l.contains("request refused")
            && l.contains("mallory@example.com")
            && l.contains("oidc")),
        "{logs}"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
