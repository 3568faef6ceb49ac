//! Every RPC (and every field group of the README's role table) × every
//! role × valid / missing / invalid / expired credential of two
//! authenticators (the tokens file, and OIDC tokens whose users the role
//! bindings name), against a gateway-store process: the expected code for
//! each, nothing stored by a refused call, and no token in the logs.
//! (Service-account tokens and client certificates map to roles through
//! the same bindings: `service_account_auth.rs`, `crates/store/tests/tls.rs`.)
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GatewayStatus, GetGatewayRequest,
    ListGatewaysRequest, Phase, UpdateGatewayRequest, WatchGatewaysRequest,
};
use gantry_client::{ClientConfig, GatewayClient};
use gantry_testkit::gateway::gateway;
use gantry_testkit::{eventually, temp_dir, StoreProcess};
use prost_types::FieldMask;
use tonic::Code;

const ROLES: [&str; 4] = ["viewer", "editor", "reconciler", "admin"];

#[derive(Debug, Clone, Copy)]
enum Credential {
    Valid(&'static str),
    Expired(&'static str),
    /// An OIDC token of the user bound to the role.
    Oidc(&'static str),
    OidcExpired(&'static str),
    Unknown,
    Missing,
}

/// The OIDC provider's key and name.
struct Idp {
    signer: gantry_testkit::jwt::Signer,
    issuer: String,
}

impl Idp {
    fn token(&self, role: &str, expired: bool) -> String {
        use gantry_testkit::jwt::now;
        let (start, end) =
            if expired { (now() - 7200, now() - 3600) } else { (now(), now() + 600) };
        self.signer.sign(&serde_json::json!({
            "iss": self.issuer, "aud": "gantry", "sub": format!("u-{role}"),
            "email": format!("{role}@example.com"), "email_verified": true,
            "iat": start, "exp": end,
        }))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Create,
    Get,
    List,
    Watch,
    UpdateSpec,
    UpdateLabels,
    UpdateAnnotations,
    UpdateStatus,
    UpdateFinalizers,
    Delete,
}

/// Every call, and every column of the README's role table.
const RPCS: [Rpc; 10] = [
    Rpc::Create,
    Rpc::Get,
    Rpc::List,
    Rpc::Watch,
    Rpc::UpdateSpec,
    Rpc::UpdateLabels,
    Rpc::UpdateAnnotations,
    Rpc::UpdateStatus,
    Rpc::UpdateFinalizers,
    Rpc::Delete,
];

fn valid_token(role: &str) -> String {
    format!("{role}-valid-token-0123456789")
}

fn expired_token(role: &str) -> String {
    format!("{role}-expired-token-0123456789")
}

const UNKNOWN_TOKEN: &str = "unknown-token-0123456789abcdef";

fn token(idp: &Idp, credential: Credential) -> Option<String> {
    match credential {
        Credential::Valid(role) => Some(valid_token(role)),
        Credential::Expired(role) => Some(expired_token(role)),
        Credential::Oidc(role) => Some(idp.token(role, false)),
        Credential::OidcExpired(role) => Some(idp.token(role, true)),
        Credential::Unknown => Some(UNKNOWN_TOKEN.into()),
        Credential::Missing => None,
    }
}

/// The table: what each call must answer.
fn expected(rpc: Rpc, credential: Credential) -> Code {
    let (Credential::Valid(role) | Credential::Oidc(role)) = credential else {
        return Code::Unauthenticated;
    };
    let allowed = match rpc {
        Rpc::Get | Rpc::List | Rpc::Watch => true,
        Rpc::Create
        | Rpc::Delete
        | Rpc::UpdateSpec
        | Rpc::UpdateLabels
        | Rpc::UpdateAnnotations => matches!(role, "editor" | "admin"),
        Rpc::UpdateStatus | Rpc::UpdateFinalizers => matches!(role, "reconciler" | "admin"),
    };
    if allowed {
        Code::Ok
    } else {
        Code::PermissionDenied
    }
}

fn client(store: &StoreProcess, idp: &Idp, credential: Credential) -> GatewayClient {
    ClientConfig { endpoint: store.endpoint(), token: token(idp, credential), ..Default::default() }
        .connect_lazy()
        .unwrap()
}

async fn get(admin: &mut GatewayClient, name: &str) -> Result<Gateway, tonic::Status> {
    admin.get_gateway(GetGatewayRequest { name: name.into() }).await.map(|r| r.into_inner())
}

/// Makes the call; checks that a refused write changed nothing and an
/// accepted one took effect. The code it answered.
async fn call(
    rpc: Rpc,
    case: usize,
    client: &mut GatewayClient,
    admin: &mut GatewayClient,
) -> Code {
    let name = format!("g{case}");
    if rpc != Rpc::Create {
        admin
            .create_gateway(CreateGatewayRequest {
                gateway: Some(gateway(&name).image("gw:1").build()),
                validate_only: false,
            })
            .await
            .unwrap();
    }
    let before = get(admin, &name).await.ok();
    let code = |r: Result<(), tonic::Status>| r.map_or_else(|s| s.code(), |()| Code::Ok);
    let answered = match rpc {
        Rpc::Create => code(
            client
                .create_gateway(CreateGatewayRequest {
                    gateway: Some(gateway(&name).image("gw:1").build()),
                    validate_only: false,
                })
                .await
                .map(drop),
        ),
        Rpc::Get => code(client.get_gateway(GetGatewayRequest { name }).await.map(drop)),
        Rpc::List => code(client.list_gateways(ListGatewaysRequest::default()).await.map(drop)),
        Rpc::Watch => code(client.watch_gateways(WatchGatewaysRequest::default()).await.map(drop)),
        Rpc::UpdateSpec => code(
            client
                .update_gateway(UpdateGatewayRequest {
                    gateway: Some(gateway(&format!("g{case}")).image("gw:2").build()),
                    update_mask: Some(FieldMask { paths: vec!["spec".into()] }),
                    validate_only: false,
                })
                .await
                .map(drop),
        ),
        Rpc::UpdateLabels | Rpc::UpdateAnnotations | Rpc::UpdateFinalizers => {
            let mut g = gateway(&format!("g{case}")).image("gw:1").build();
            let meta = g.metadata.as_mut().unwrap();
            let path = match rpc {
                Rpc::UpdateLabels => {
                    meta.labels.insert("team".into(), "edge".into());
                    "metadata.labels"
                }
                Rpc::UpdateAnnotations => {
                    meta.annotations.insert("example.com/note".into(), "hello".into());
                    "metadata.annotations"
                }
                _ => {
                    meta.finalizers.push("example.com/cleanup".into());
                    "metadata.finalizers"
                }
            };
            code(
                client
                    .update_gateway(UpdateGatewayRequest {
                        gateway: Some(g),
                        update_mask: Some(FieldMask { paths: vec![path.into()] }),
                        validate_only: false,
                    })
                    .await
                    .map(drop),
            )
        }
        Rpc::UpdateStatus => {
            let mut g = gateway(&format!("g{case}")).image("gw:1").build();
            g.status = Some(GatewayStatus {
                observed_generation: 1,
                phase: Phase::Provisioning as i32,
                ..Default::default()
            });
            code(
                client
                    .update_gateway(UpdateGatewayRequest {
                        gateway: Some(g),
                        update_mask: Some(FieldMask { paths: vec!["status".into()] }),
                        validate_only: false,
                    })
                    .await
                    .map(drop),
            )
        }
        Rpc::Delete => code(
            client
                .delete_gateway(DeleteGatewayRequest {
                    name: format!("g{case}"),
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
    };
    let after = get(admin, &format!("g{case}")).await.ok();
    let rv = |g: &Option<Gateway>| {
        g.as_ref().and_then(|g| g.metadata.as_ref()).map(|m| m.resource_version)
    };
    let writes = !matches!(rpc, Rpc::Get | Rpc::List | Rpc::Watch);
    if writes && answered != Code::Ok {
        assert_eq!(
            rv(&before),
            rv(&after),
            "{rpc:?} was refused ({answered:?}) but changed the gateway"
        );
    }
    if writes && answered == Code::Ok {
        assert_ne!(rv(&before), rv(&after), "{rpc:?} was accepted but changed nothing");
    }
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_role_and_token_state_answers_as_the_table_says() {
    let dir = temp_dir("auth-matrix");
    let tokens = dir.join("tokens.csv");
    let mut lines = String::from("# role tokens, one valid and one expired per role\n");
    for role in ROLES {
        lines.push_str(&format!("{},{role}-user,{role}\n", valid_token(role)));
        lines
            .push_str(&format!("{},{role}-old,{role},2020-01-01T00:00:00Z\n", expired_token(role)));
    }
    std::fs::write(&tokens, lines).unwrap();
    // OIDC: one user per role, bound in the role bindings.
    let signer = gantry_testkit::jwt::Signer::new("matrix");
    let provider = gantry_testkit::oidc::OidcProvider::start(&[&signer]).await;
    let idp = Idp { signer, issuer: provider.issuer.clone() };
    let ca = dir.join("idp-ca.pem");
    std::fs::write(&ca, &provider.ca_pem).unwrap();
    let mut bindings = String::from("bindings:\n");
    for role in ROLES {
        bindings.push_str(&format!(
            "  - role: {role}\n    subjects:\n      - {{kind: User, name: {role}@example.com}}\n"
        ));
    }
    let bindings_file = dir.join("bindings.yaml");
    std::fs::write(&bindings_file, bindings).unwrap();
    let url = format!("sqlite://{}", dir.join("gantry.db").display());
    let store = StoreProcess::start_with(
        &url,
        &dir,
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--oidc-issuer-url",
            &provider.issuer,
            "--oidc-client-id",
            "gantry",
            "--oidc-ca-file",
            ca.to_str().unwrap(),
            "--oidc-username-claim",
            "email",
            "--role-bindings-file",
            bindings_file.to_str().unwrap(),
            "--log-level",
            "debug",
        ],
    );
    let mut admin = client(&store, &idp, Credential::Valid("admin"));

    let mut credentials = vec![Credential::Unknown, Credential::Missing];
    for role in ROLES {
        credentials.push(Credential::Valid(role));
        credentials.push(Credential::Expired(role));
        credentials.push(Credential::Oidc(role));
        credentials.push(Credential::OidcExpired(role));
    }
    let mut mismatches = Vec::new();
    let mut case = 0;
    for rpc in RPCS {
        for credential in &credentials {
            case += 1;
            let mut c = client(&store, &idp, *credential);
            let answered = call(rpc, case, &mut c, &mut admin).await;
            let want = expected(rpc, *credential);
            if answered != want {
                mismatches
                    .push(format!("{rpc:?} with {credential:?}: {answered:?}, want {want:?}"));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert_eq!(case, RPCS.len() * (2 + 4 * ROLES.len()));

    // Refusals are logged (an audit trail), tokens never are.
    let logged = "a refusal and an expired token's subject logged";
    eventually(Duration::from_secs(10), logged, || async {
        let logs = store.logs();
        logs.contains("request refused") && logs.contains("reconciler-old")
    })
    .await;
    let logs = store.logs();
    let mut secrets: Vec<String> = ROLES.iter().map(|r| valid_token(r)).collect();
    secrets.extend(ROLES.iter().map(|r| expired_token(r)));
    secrets.push(UNKNOWN_TOKEN.into());
    for secret in secrets {
        assert!(!logs.contains(&secret), "a token appears in the store's logs");
    }
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
