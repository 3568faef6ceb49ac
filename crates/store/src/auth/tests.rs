//! The authenticators' rules on tokens made here: signed by a key of the
//! issuer's set or not, with the right audience, issuer and times or not,
//! and the JWT attacks a verifier must refuse.

use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gantry_testkit::jwt::{now, Signer};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use tonic::Code;

use super::jwt::{ClaimMapping, Issuer, KeySource};
use super::*;

const ISSUER: &str = "https://kubernetes.default.svc";
const RECONCILER: &str = "system:serviceaccount:gantry:gateway-reconciler";

/// The claims of a service-account token for the reconciler, valid now.
fn claims() -> serde_json::Value {
    serde_json::json!({
        "iss": ISSUER, "aud": ["gantry"], "sub": RECONCILER,
        "iat": now(), "nbf": now(), "exp": now() + 600,
        "kubernetes.io": {"namespace": "gantry", "serviceaccount": {"name": "gateway-reconciler"}},
    })
}

fn auth_with(keys: &[&Signer], bindings: &str) -> Auth {
    let set: JwkSet = serde_json::from_value(
        serde_json::json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}),
    )
    .unwrap();
    let source = KeySource::Fixed { issuer: ISSUER.into(), keys: set };
    let issuer =
        Issuer::new("service-account", source, vec!["gantry".into()], ClaimMapping::ServiceAccount);
    Auth::new(Authenticator::Tokens(Vec::new()))
        .with_issuer(issuer)
        .with_bindings(Bindings::parse(bindings).unwrap(), None)
}

const BINDINGS: &str = "bindings:\n  - role: reconciler\n    subjects:\n      - {kind: ServiceAccount, namespace: gantry, name: gateway-reconciler}\n";

fn metadata(value: &str) -> MetadataMap {
    let mut m = MetadataMap::new();
    m.insert("authorization", value.parse().unwrap());
    m
}

async fn call(auth: &Auth, token: &str) -> Result<Principal, Status> {
    auth.authenticate(&Credentials::metadata(&metadata(&format!("Bearer {token}")))).await
}

async fn refused(auth: &Auth, token: &str) -> String {
    let status = call(auth, token).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    status.message().to_string()
}

#[tokio::test]
async fn a_service_account_token_gets_the_role_its_binding_gives() {
    let signer = Signer::new("k1");
    let auth = auth_with(&[&signer], BINDINGS);
    let token = signer.sign(&claims());
    let principal = call(&auth, &token).await.unwrap();
    assert_eq!(principal, Principal { subject: RECONCILER.into(), role: Role::Reconciler });
    // Remembered: a refusal log can name it without verifying again.
    let described = auth.describe(&Credentials::metadata(&metadata(&format!("Bearer {token}"))));
    assert_eq!(described, Some((RECONCILER.to_string(), "service-account")));
    let expires =
        auth.expires(&Credentials::metadata(&metadata(&format!("Bearer {token}")))).unwrap();
    assert!(expires > SystemTime::now() + Duration::from_secs(500));
}

#[tokio::test]
async fn an_identity_no_binding_names_is_denied_not_made_a_viewer() {
    let signer = Signer::new("k1");
    let auth = auth_with(&[&signer], BINDINGS);
    let mut other = claims();
    other["sub"] = "system:serviceaccount:default:builder".into();
    let status = call(&auth, &signer.sign(&other)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.message().contains("system:serviceaccount:default:builder"), "{status:?}");
    assert!(status.message().contains("service-account"), "{status:?}");
}

#[tokio::test]
async fn audience_issuer_expiry_and_not_before_are_checked() {
    let signer = Signer::new("k1");
    let auth = auth_with(&[&signer], BINDINGS);
    let with = |key: &str, value: serde_json::Value| {
        let mut c = claims();
        c[key] = value;
        signer.sign(&c)
    };
    let cases = [
        (with("aud", serde_json::json!(["vault"])), "audience is not gantry"),
        (with("exp", (now() - 3600).into()), "expired"),
        (with("nbf", (now() + 3600).into()), "not valid yet"),
        // The type confusion of CVE-2026-25537: a claim of the wrong type
        // must not count as absent.
        (with("nbf", serde_json::json!((now() + 3600).to_string())), "nbf"),
        (with("exp", serde_json::json!("never")), "exp"),
        (with("sub", "alice".into()), "not a service account"),
    ];
    for (token, reason) in cases {
        let message = refused(&auth, &token).await;
        assert!(message.contains(reason), "wanted {reason:?}: {message}");
    }
    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    assert!(refused(&auth, &signer.sign(&no_exp)).await.contains("exp"));
    // Another issuer's token is routed nowhere.
    let mut foreign = claims();
    foreign["iss"] = "https://evil.example".into();
    assert!(refused(&auth, &signer.sign(&foreign)).await.contains("no authenticator"));
}

#[tokio::test]
async fn forged_tokens_are_refused() {
    let signer = Signer::new("k1");
    let auth = auth_with(&[&signer], BINDINGS);
    let valid = signer.sign(&claims());
    let (header, rest) = valid.split_once('.').unwrap();
    let (payload, _) = rest.split_once('.').unwrap();
    let encode = |v: serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    // Signed by another key under the same key id.
    let impostor = Signer::new("k1").sign(&claims());
    assert!(refused(&auth, &impostor).await.contains("signature"));
    // `alg: none`, without and with an empty signature.
    let none = encode(serde_json::json!({"alg": "none", "kid": "k1"}));
    for token in [format!("{none}.{payload}."), format!("{none}.{payload}")] {
        refused(&auth, &token).await;
    }
    // HS256 with the public key as the HMAC secret (key confusion).
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("k1".into());
    let public = serde_json::to_vec(&signer.jwk()).unwrap();
    for secret in [public, signer.key.public_key_raw().to_vec()] {
        let forged =
            jsonwebtoken::encode(&hs, &claims(), &EncodingKey::from_secret(&secret).unwrap())
                .unwrap();
        assert!(refused(&auth, &forged).await.contains("algorithm"));
    }
    // The payload changed under a valid signature.
    let mut elevated = claims();
    elevated["sub"] = "system:serviceaccount:gantry:admin".into();
    let tampered = format!("{header}.{}.{}", encode(elevated), valid.rsplit('.').next().unwrap());
    assert!(refused(&auth, &tampered).await.contains("signature"));
    // A key id the set lacks, and junk.
    let unknown = Signer::new("k2").sign(&claims());
    assert!(refused(&auth, &unknown).await.contains("no key \"k2\""));
    for junk in ["a.b.c", "....", "eyJhbGciOiJFUzI1NiJ9.e30.", &"x".repeat(10_000)] {
        let status = call(&auth, junk).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{junk:.20}");
    }
}

#[tokio::test]
async fn static_tokens_still_work_and_header_mistakes_are_unauthenticated() {
    let auth = Auth::new(
        Authenticator::parse_tokens_file("viewer-token-0123456789,alice,viewer\n").unwrap(),
    );
    let alice = call(&auth, "viewer-token-0123456789").await.unwrap();
    assert_eq!(alice, Principal { subject: "alice".into(), role: Role::Viewer });
    for bad in ["Bearer nope-nope-nope-nope", "Basic abc", "viewer-token-0123456789"] {
        let status = auth.authenticate(&Credentials::metadata(&metadata(bad))).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{bad}");
    }
    let missing = auth.authenticate(&Credentials::metadata(&MetadataMap::new())).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);
    // Without issuers a JWT is just an unknown token.
    let jwt = Signer::new("k1").sign(&claims());
    assert!(refused(&auth, &jwt).await.contains("unknown bearer token"));
}

fn oidc_auth(keys: &[&Signer], bindings: &str) -> Auth {
    let set: JwkSet = serde_json::from_value(
        serde_json::json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}),
    )
    .unwrap();
    let source = KeySource::Fixed { issuer: "https://idp.example".into(), keys: set };
    let claims = ClaimMapping::Oidc {
        username_claim: "email".into(),
        username_prefix: String::new(),
        groups_claim: Some("groups".into()),
        groups_prefix: "idp:".into(),
    };
    let issuer = Issuer::new("oidc", source, vec!["gantry-cli".into()], claims);
    Auth::new(Authenticator::Tokens(Vec::new()))
        .with_issuer(issuer)
        .with_bindings(Bindings::parse(bindings).unwrap(), None)
}

fn person(email: &str, groups: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "iss": "https://idp.example", "aud": "gantry-cli", "sub": "u-1", "email": email,
        "email_verified": true, "groups": groups, "iat": now(), "exp": now() + 600,
    })
}

#[tokio::test]
async fn oidc_users_and_groups_get_their_bindings_roles() {
    let signer = Signer::new("idp-1");
    let bindings = "bindings:\n  - role: editor\n    subjects:\n      - {kind: Group, name: 'idp:platform'}\n  - role: admin\n    subjects:\n      - {kind: User, name: root@example.com}\n";
    let auth = oidc_auth(&[&signer], bindings);
    let alice = person("alice@example.com", serde_json::json!(["platform", "dev"]));
    let principal = call(&auth, &signer.sign(&alice)).await.unwrap();
    assert_eq!(principal, Principal { subject: "alice@example.com".into(), role: Role::Editor });
    // A single group as a string.
    let bob = person("bob@example.com", serde_json::json!("platform"));
    assert_eq!(call(&auth, &signer.sign(&bob)).await.unwrap().role, Role::Editor);
    let root = person("root@example.com", serde_json::json!([]));
    assert_eq!(call(&auth, &signer.sign(&root)).await.unwrap().role, Role::Admin);
    // No binding: denied. A group without the prefix does not match.
    let carol = person("carol@example.com", serde_json::json!(["idp:platform-x"]));
    let denied = call(&auth, &signer.sign(&carol)).await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
}

#[tokio::test]
async fn oidc_tokens_cannot_claim_cluster_names_or_unverified_emails() {
    let signer = Signer::new("idp-1");
    let bindings = "bindings:\n  - role: admin\n    subjects:\n      - {kind: Group, name: 'system:masters'}\n";
    let auth = oidc_auth(&[&signer], bindings);
    let mut unverified = person("eve@example.com", serde_json::json!([]));
    unverified["email_verified"] = false.into();
    assert!(refused(&auth, &signer.sign(&unverified)).await.contains("not verified"));
    let posing = person("system:serviceaccount:gantry:gateway-reconciler", serde_json::json!([]));
    assert!(refused(&auth, &signer.sign(&posing)).await.contains("reserved"));
    let mut no_email = person("x", serde_json::json!([]));
    no_email.as_object_mut().unwrap().remove("email");
    assert!(refused(&auth, &signer.sign(&no_email)).await.contains("no email claim"));
    let mut wrong_audience = person("eve@example.com", serde_json::json!([]));
    wrong_audience["aud"] = "gantry".into();
    assert!(refused(&auth, &signer.sign(&wrong_audience)).await.contains("audience"));
    let mut bad_groups = person("eve@example.com", serde_json::json!([1, 2]));
    bad_groups["email"] = "eve@example.com".into();
    assert!(refused(&auth, &signer.sign(&bad_groups)).await.contains("groups"));
}
