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
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());

    let db = common::TestDatabase::create(common::Backend::Sqlite).await.unwrap();
    let settings = Settings {
        storage: gantry_store::open_storage(&db.url).await.unwrap(),
        auth: Arc::new(Auth::new(Authenticator::parse_tokens_file(common::TOKENS_FILE).unwrap())),
        tls: Some((cert_pem.clone().into_bytes(), key_pem.into_bytes())),
        watch: gantry_store::WatchSettings::default(),
        limits: gantry_store::Limits::default(),
    };
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = grpc.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gantry_store::serve(settings, grpc, http, async {
        let _ = stopped.await;
    }));

    let trusted = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cert_pem))
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
