//! Every RPC (and every field group of the README's role table) × every
//! role × every authenticator, against a gateway-store process: the tokens
//! file (valid, expired, unknown, missing), OIDC tokens whose users the
//! role bindings name (valid, expired), client certificates on the TLS
//! listener (valid, expired: refused at the handshake) and, on a real API
//! server, service-account tokens (the store's audience, another one).
//! The expected code for each, nothing stored by a refused call, and no
//! token in the logs.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GatewayStatus, GetGatewayRequest,
    ListGatewaysRequest, Phase, UpdateGatewayRequest, WatchGatewaysRequest,
};
use gantry_client::shared_watch::SharedWatch;
use gantry_client::{ClientConfig, GatewayClient};
use gantry_testkit::gateway::gateway;
use gantry_testkit::k8s::ControlPlane;
use gantry_testkit::{eventually, temp_dir, StoreProcess, TestCa};
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
    /// A client certificate whose group is bound to the role.
    Certificate(&'static str),
    CertificateExpired(&'static str),
    /// A token of the service account bound to the role.
    ServiceAccount(&'static str),
    ServiceAccountOtherAudience(&'static str),
    Unknown,
    Missing,
}

/// Where the credentials come from: the OIDC provider's key and name, the
/// CA of client certificates, the service accounts' tokens.
struct Callers {
    signer: gantry_testkit::jwt::Signer,
    /// Serves its discovery and keys while the test runs.
    provider: gantry_testkit::oidc::OidcProvider,
    client_ca: TestCa,
    /// The CA the store's serving certificate is signed by.
    server_ca: TestCa,
    /// By role: a token for the store's audience, and one for another.
    service_accounts: std::collections::HashMap<&'static str, (String, String)>,
}

impl Callers {
    async fn new() -> Self {
        let signer = gantry_testkit::jwt::Signer::new("matrix");
        let provider = gantry_testkit::oidc::OidcProvider::start(&[&signer]).await;
        let (client_ca, server_ca) = (TestCa::new("client-ca"), TestCa::new("server-ca"));
        Self { signer, provider, client_ca, server_ca, service_accounts: Default::default() }
    }

    fn oidc_token(&self, role: &str, expired: bool) -> String {
        use gantry_testkit::jwt::now;
        let (start, end) =
            if expired { (now() - 7200, now() - 3600) } else { (now(), now() + 600) };
        let email = format!("{role}@example.com");
        let claims =
            gantry_testkit::jwt::person(&self.provider.issuer, "gantry", &email, &[], start..end);
        self.signer.sign(&claims)
    }

    fn token(&self, credential: Credential) -> Option<String> {
        let account = |role| self.service_accounts.get(role).expect("a service account per role");
        match credential {
            Credential::Valid(role) => Some(valid_token(role)),
            Credential::Expired(role) => Some(expired_token(role)),
            Credential::Oidc(role) => Some(self.oidc_token(role, false)),
            Credential::OidcExpired(role) => Some(self.oidc_token(role, true)),
            Credential::ServiceAccount(role) => Some(account(role).0.clone()),
            Credential::ServiceAccountOtherAudience(role) => Some(account(role).1.clone()),
            Credential::Unknown => Some(UNKNOWN_TOKEN.into()),
            Credential::Missing
            | Credential::Certificate(_)
            | Credential::CertificateExpired(_) => None,
        }
    }

    /// A client of `store` (over TLS) calling with `credential`.
    fn client(&self, store: &StoreProcess, credential: Credential) -> GatewayClient {
        let identity = match credential {
            Credential::Certificate(role) => Some((3600, role)),
            Credential::CertificateExpired(role) => Some((-3600, role)),
            _ => None,
        };
        let client_identity = identity.map(|(not_after, role)| {
            let (cert, key) = self.client_ca.client(
                &format!("{role}-cert"),
                &[role],
                not_after - 3600,
                not_after,
            );
            (cert.into_bytes(), key.into_bytes())
        });
        ClientConfig {
            endpoint: format!("https://127.0.0.1:{}", store.grpc),
            token: self.token(credential),
            ca_pem: Some(self.server_ca.pem.clone().into_bytes()),
            tls_domain: Some("localhost".into()),
            client_identity,
            ..Default::default()
        }
        .connect_lazy()
        .unwrap()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Create,
    Get,
    List,
    Watch,
    /// A watch on a Watch stream (several watches on one stream).
    SharedWatch,
    UpdateSpec,
    UpdateLabels,
    UpdateAnnotations,
    UpdateStatus,
    UpdateFinalizers,
    Delete,
}

/// Every call, and every column of the README's role table.
const RPCS: [Rpc; 11] = [
    Rpc::Create,
    Rpc::Get,
    Rpc::List,
    Rpc::Watch,
    Rpc::SharedWatch,
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

/// The table: what each call must answer.
fn expected(rpc: Rpc, credential: Credential) -> Code {
    let role = match credential {
        Credential::Valid(role)
        | Credential::Oidc(role)
        | Credential::Certificate(role)
        | Credential::ServiceAccount(role) => role,
        // Refused at the TLS handshake: the transport fails, no call is
        // answered.
        Credential::CertificateExpired(_) => return Code::Unavailable,
        _ => return Code::Unauthenticated,
    };
    let allowed = match rpc {
        Rpc::Get | Rpc::List | Rpc::Watch | Rpc::SharedWatch => true,
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
        Rpc::SharedWatch => {
            let shared = SharedWatch::open(client.clone()).await;
            match shared {
                Ok(shared) => code(shared.watch(WatchGatewaysRequest::default()).await.map(drop)),
                Err(status) => status.code(),
            }
        }
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
    let writes = !matches!(rpc, Rpc::Get | Rpc::List | Rpc::Watch | Rpc::SharedWatch);
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

/// A store over TLS taking every authenticator: the tokens file (a valid
/// and an expired token per role), OIDC, client certificates and, with a
/// `plane`, its service-account tokens. Each role is bound to its OIDC
/// user, its certificate group and its service account in `namespace`.
async fn start(
    dir: &std::path::Path,
    plane: Option<(&ControlPlane, &str)>,
) -> (StoreProcess, Callers) {
    let tokens = dir.join("tokens.csv");
    let mut lines = String::from("# role tokens, one valid and one expired per role\n");
    for role in ROLES {
        lines.push_str(&format!("{},{role}-user,{role}\n", valid_token(role)));
        lines
            .push_str(&format!("{},{role}-old,{role},2020-01-01T00:00:00Z\n", expired_token(role)));
    }
    std::fs::write(&tokens, lines).unwrap();
    let callers = Callers::new().await;
    let provider = &callers.provider;
    let path = |name: &str, content: &str| {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path.to_str().unwrap().to_string()
    };
    let mut bindings = String::from("bindings:\n");
    for role in ROLES {
        bindings.push_str(&format!(
            "  - role: {role}\n    subjects:\n      - {{kind: User, name: {role}@example.com}}\n      - {{kind: Group, name: {role}}}\n"
        ));
        if let Some((_, namespace)) = plane {
            bindings.push_str(&format!(
                "      - {{kind: ServiceAccount, namespace: {namespace}, name: {role}-sa}}\n"
            ));
        }
    }
    let (cert, key) = callers.server_ca.server(&["localhost"]);
    let url = format!("sqlite://{}", dir.join("gantry.db").display());
    let mut flags = vec![
        "--tokens-file".to_string(),
        tokens.to_str().unwrap().into(),
        "--oidc-issuer-url".into(),
        provider.issuer.clone(),
        "--oidc-client-id".into(),
        "gantry".into(),
        "--oidc-ca-file".into(),
        path("idp-ca.pem", &provider.ca_pem),
        "--oidc-username-claim".into(),
        "email".into(),
        "--tls-cert".into(),
        path("tls.crt", &cert),
        "--tls-key".into(),
        path("tls.key", &key),
        "--client-ca".into(),
        path("client-ca.pem", &callers.client_ca.pem),
        "--role-bindings-file".into(),
        path("bindings.yaml", &bindings),
        "--log-level".into(),
        "debug".into(),
    ];
    let mut env = Vec::new();
    if let Some((plane, _)) = plane {
        flags.push("--service-account-tokens".into());
        env.push(("KUBECONFIG", plane.admin_kubeconfig.to_str().unwrap()));
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let store = StoreProcess::start_with_env(&url, dir, &flags, &env);
    (store, callers)
}

/// Every RPC with every credential, each against the table; the number of
/// cases.
async fn run(store: &StoreProcess, callers: &Callers, credentials: &[Credential]) -> usize {
    let mut admin = callers.client(store, Credential::Valid("admin"));
    let mut mismatches = Vec::new();
    let mut case = 0;
    for rpc in RPCS {
        for credential in credentials {
            case += 1;
            let mut c = callers.client(store, *credential);
            let answered = call(rpc, case, &mut c, &mut admin).await;
            let want = expected(rpc, *credential);
            // A handshake the server ends (TLS 1.3 checks the client's
            // certificate after the client thinks it is done) fails the
            // call as whichever transport error the client meets first.
            let transport = [Code::Unavailable, Code::Unknown, Code::Cancelled];
            let handshake_refused = want == Code::Unavailable && transport.contains(&answered);
            if answered != want && !handshake_refused {
                mismatches
                    .push(format!("{rpc:?} with {credential:?}: {answered:?}, want {want:?}"));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    case
}

/// Refusals are logged (an audit trail) with `subject`, tokens never are.
async fn logged_without(store: &StoreProcess, subject: &str, secrets: &[String]) {
    let logged = "a refusal and its subject logged";
    eventually(Duration::from_secs(10), logged, || async {
        let logs = store.logs();
        logs.contains("request refused") && logs.contains(subject)
    })
    .await;
    let logs = store.logs();
    for secret in secrets {
        assert!(!logs.contains(secret.as_str()), "a token appears in the store's logs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_role_and_credential_answers_as_the_table_says() {
    let dir = temp_dir("auth-matrix");
    let (store, callers) = start(&dir, None).await;
    let mut credentials = vec![Credential::Unknown, Credential::Missing];
    for role in ROLES {
        credentials.extend([
            Credential::Valid(role),
            Credential::Expired(role),
            Credential::Oidc(role),
            Credential::OidcExpired(role),
            Credential::Certificate(role),
            Credential::CertificateExpired(role),
        ]);
    }
    let cases = run(&store, &callers, &credentials).await;
    assert_eq!(cases, RPCS.len() * (2 + 6 * ROLES.len()));

    let mut secrets: Vec<String> = ROLES.iter().map(|r| valid_token(r)).collect();
    secrets.extend(ROLES.iter().map(|r| expired_token(r)));
    secrets.push(UNKNOWN_TOKEN.into());
    // An expired token's subject, and a certificate's user.
    logged_without(&store, "reconciler-old", &secrets).await;
    logged_without(&store, "viewer-cert", &secrets).await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_and_role_of_service_account_tokens_answers_as_the_table_says() {
    let Some(plane) = ControlPlane::shared() else { return };
    let namespace = plane.namespace("auth-matrix");
    let dir = temp_dir("auth-matrix-sa");
    let (store, mut callers) = start(&dir, Some((plane, &namespace))).await;
    let mut credentials = Vec::new();
    for role in ROLES {
        let account = format!("{role}-sa");
        plane.kubectl(&["-n", &namespace, "create", "serviceaccount", &account]);
        let token = |audience: &str| {
            let args = ["-n", &namespace, "create", "token", &account, "--audience", audience];
            plane.kubectl(&args).trim().to_string()
        };
        callers.service_accounts.insert(role, (token("gantry"), token("vault")));
        credentials.extend([
            Credential::ServiceAccount(role),
            Credential::ServiceAccountOtherAudience(role),
        ]);
    }
    let cases = run(&store, &callers, &credentials).await;
    assert_eq!(cases, RPCS.len() * 2 * ROLES.len());

    let secrets: Vec<String> =
        callers.service_accounts.values().flat_map(|(a, b)| [a.clone(), b.clone()]).collect();
    let subject = format!("system:serviceaccount:{namespace}:viewer-sa");
    logged_without(&store, &subject, &secrets).await;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
