//! GET of a small JSON document over HTTPS (an OIDC provider's discovery
//! document and key set), trusting the CA the operator names or, without
//! one, the system's roots; bounded in time and in bytes.

use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;

/// The largest document read.
const MAX_BYTES: usize = 1 << 20;
/// The longest a fetch may take.
const TIMEOUT: Duration = Duration::from_secs(10);

type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// An HTTPS client for one provider.
#[derive(Clone)]
pub struct HttpsGet {
    client: Client<Connector, Full<bytes::Bytes>>,
}

impl std::fmt::Debug for HttpsGet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpsGet")
    }
}

impl HttpsGet {
    /// A client that trusts the certificates in `ca_pem`, or the system's
    /// roots when `None`.
    pub fn new(ca_pem: Option<&[u8]>) -> Result<Self, String> {
        let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
        let config = match ca_pem {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| format!("the CA file does not parse: {e}"))?;
                    roots.add(cert).map_err(|e| format!("the CA file's certificate: {e}"))?;
                }
                if roots.is_empty() {
                    return Err("the CA file holds no certificate".into());
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            None => {
                use hyper_rustls::ConfigBuilderExt as _;
                builder
                    .with_native_roots()
                    .map_err(|e| format!("the system's CA certificates: {e}"))?
                    .with_no_client_auth()
            }
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .build();
        Ok(Self { client: Client::builder(TokioExecutor::new()).build(connector) })
    }

    /// The JSON document at `url` (https only).
    pub async fn json(&self, url: &str) -> Result<serde_json::Value, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("{url}: only https URLs are fetched"));
        }
        let request = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Full::default())
            .map_err(|e| e.to_string())?;
        let fetch = async {
            let response =
                self.client.request(request).await.map_err(|e| format!("GET {url}: {e}"))?;
            if !response.status().is_success() {
                return Err(format!("GET {url}: {}", response.status()));
            }
            let body = Limited::new(response.into_body(), MAX_BYTES)
                .collect()
                .await
                .map_err(|e| format!("GET {url}: {e}"))?
                .to_bytes();
            serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
        };
        tokio::time::timeout(TIMEOUT, fetch)
            .await
            .map_err(|_| format!("GET {url}: no answer within {TIMEOUT:?}"))?
    }
}
