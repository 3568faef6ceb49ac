//! TLS from PEM files: a client that trusts the CA gets answers; a
//! plaintext client and a client without the CA are refused.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{Bearer, EDITOR};
use gantry_api::v1::gateway_service_client::GatewayServiceClient;
use gantry_api::v1::ListGatewaysRequest;
use gantry_store::auth::{Auth, Authenticator};
use gantry_store::Settings;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

#[tokio::test]
async fn tls_serves_clients_that_trust_the_ca_only() {
    let server_ca = gantry_testkit::TestCa::new("server-ca");
    let (port, stop, server, _db) = serve(&server_ca, None).await;

    let trusted = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&server_ca.pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(trusted)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = GatewayServiceClient::with_interceptor(channel, Bearer(EDITOR.into()));
    let page = client.list_gateways(ListGatewaysRequest::default()).await.unwrap().into_inner();
    assert!(page.resource_version >= 1);

    let plaintext =
        Channel::from_shared(format!("http://127.0.0.1:{port}")).unwrap().connect().await;
    if let Ok(channel) = plaintext {
        let mut c = GatewayServiceClient::with_interceptor(channel, Bearer(EDITOR.into()));
        assert!(
            c.list_gateways(ListGatewaysRequest::default()).await.is_err(),
            "plaintext must not be served"
        );
    }

    let untrusted = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(ClientTlsConfig::new().domain_name("localhost"))
        .unwrap()
        .connect()
        .await;
    assert!(untrusted.is_err(), "a client without the CA is refused");

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// A store with TLS (a certificate for `localhost` from `server`) and,
/// with `client_ca`, client certificates verified against its CA (PEM),
/// whose subjects its bindings (YAML) give roles.
async fn serve(
    server: &gantry_testkit::TestCa,
    client_ca: Option<(&str, &str)>,
) -> (
    u16,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), gantry_store::ServeError>>,
    common::TestDatabase,
) {
    let (cert, key) = server.server(&["localhost"]);
    let db = common::TestDatabase::create(common::Backend::Sqlite).await.unwrap();
    let mut auth = Auth::new(Authenticator::parse_tokens_file(common::TOKENS_FILE).unwrap());
    if let Some((_, bindings)) = client_ca {
        auth = auth
            .with_client_certificates()
            .with_bindings(gantry_store::auth::Bindings::parse(bindings).unwrap(), None);
    }
    let settings = Settings {
        storage: gantry_store::open_storage(&db.url).await.unwrap(),
        auth: Arc::new(auth),
        tls: Some(gantry_store::Tls {
            cert: cert.into_bytes(),
            key: key.into_bytes(),
            client_ca: client_ca.map(|(ca, _)| ca.as_bytes().to_vec()),
        }),
        watch: gantry_store::WatchSettings::default(),
        limits: gantry_store::Limits::default(),
        commit_spin: std::time::Duration::ZERO,
    };
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = grpc.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gantry_store::serve(settings, grpc, http, async {
        let _ = stopped.await;
    }));
    (port, stop, server, db)
}

/// A client presenting `identity` (certificate and key, PEM), if any.
async fn connect(
    port: u16,
    server_ca: &str,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

#[tokio::test]
async fn client_certificates_name_the_caller_and_bad_ones_fail_the_handshake() {
    use gantry_api::v1::CreateGatewayRequest;
    let server_ca = gantry_testkit::TestCa::new("server-ca");
    let client_ca = gantry_testkit::TestCa::new("client-ca");
    let bindings = "bindings:\n  - role: editor\n    subjects:\n      - {kind: Group, name: platform}\n  - role: viewer\n    subjects:\n      - {kind: User, name: victor}\n";
    let (port, stop, server, _db) = serve(&server_ca, Some((&client_ca.pem, bindings))).await;
    let create = |channel: Channel, name: &str| {
        let gateway = gantry_testkit::gateway::named(name).image("ghcr.io/acme/gw:1").build();
        async move {
            GatewayServiceClient::new(channel)
                .create_gateway(CreateGatewayRequest {
                    gateway: Some(gateway),
                    validate_only: false,
                })
                .await
        }
    };

    // CN alice, O platform: an editor by her group, with no token.
    let alice = client_ca.client("alice", &["platform"], -60, 3600);
    let channel = connect(port, &server_ca.pem, Some(&alice)).await.unwrap();
    let created = create(channel, "by-alice").await.unwrap().into_inner();
    assert_eq!(created.metadata.unwrap().name, "by-alice");
    // CN victor: a viewer, who may list and not create.
    let victor = client_ca.client("victor", &[], -60, 3600);
    let channel = connect(port, &server_ca.pem, Some(&victor)).await.unwrap();
    GatewayServiceClient::new(channel.clone())
        .list_gateways(ListGatewaysRequest::default())
        .await
        .unwrap();
    let denied = create(channel, "by-victor").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    // A subject no binding names.
    let nobody = client_ca.client("nobody", &["sales"], -60, 3600);
    let channel = connect(port, &server_ca.pem, Some(&nobody)).await.unwrap();
    let denied = create(channel, "by-nobody").await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    // No certificate: tokens still work.
    let channel = connect(port, &server_ca.pem, None).await.unwrap();
    GatewayServiceClient::with_interceptor(channel, Bearer(EDITOR.into()))
        .list_gateways(ListGatewaysRequest::default())
        .await
        .unwrap();

    // Expired, not yet valid, signed by another CA (the server's), and
    // self-signed: refused at the handshake, before any call.
    let other_ca = gantry_testkit::TestCa::new("other-ca");
    let refused = [
        ("expired", client_ca.client("alice", &["platform"], -7200, -3600)),
        ("not yet valid", client_ca.client("alice", &["platform"], 3600, 7200)),
        ("another CA", other_ca.client("alice", &["platform"], -60, 3600)),
    ];
    for (what, identity) in refused {
        let outcome = match connect(port, &server_ca.pem, Some(&identity)).await {
            Err(e) => Err(format!("connect: {e}")),
            Ok(channel) => {
                match GatewayServiceClient::new(channel)
                    .list_gateways(ListGatewaysRequest::default())
                    .await
                {
                    Ok(_) => Ok(()),
                    // The transport failed: the handshake, not the service.
                    Err(s)
                        if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown) =>
                    {
                        Err(format!("{s:?}"))
                    }
                    Err(s) => panic!("{what}: the service itself answered {s:?}"),
                }
            }
        };
        assert!(outcome.is_err(), "{what}: a call was answered");
    }

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
