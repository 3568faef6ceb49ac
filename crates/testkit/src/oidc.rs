//! An OpenID Connect provider for tests: a real HTTPS server on loopback
//! (its own CA) that serves the discovery document and a key set the test
//! changes while it runs (a key rotation), and counts the fetches.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::jwt::Signer;

/// A running provider; stopped when dropped.
#[derive(Debug)]
pub struct OidcProvider {
    /// `https://localhost:PORT`, the `iss` of its tokens.
    pub issuer: String,
    /// The CA its certificate is signed by (PEM).
    pub ca_pem: String,
    keys: Arc<Mutex<Vec<serde_json::Value>>>,
    fetches: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl OidcProvider {
    /// Starts serving the public keys of `signers`.
    pub async fn start(signers: &[&Signer]) -> OidcProvider {
        let (ca_pem, cert, key) =
            crate::server_certificate("localhost", &["localhost"], &[[127, 0, 0, 1]]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("bound").port();
        let issuer = format!("https://localhost:{port}");
        let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate");
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let keys = Arc::new(Mutex::new(signers.iter().map(|s| s.jwk()).collect()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let task = {
            let (issuer, keys, fetches) = (issuer.clone(), keys.clone(), fetches.clone());
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, issuer, keys, fetches) =
                        (acceptor.clone(), issuer.clone(), keys.clone(), fetches.clone());
                    tokio::spawn(async move {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            serve(tls, &issuer, &keys, &fetches).await;
                        }
                    });
                }
            })
        };
        OidcProvider { issuer, ca_pem, keys, fetches, task }
    }

    /// Publishes the keys of `signers` instead (a rotation).
    pub fn publish(&self, signers: &[&Signer]) {
        *self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            signers.iter().map(|s| s.jwk()).collect();
    }

    /// How many times the key set was fetched.
    pub fn key_fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers one HTTP/1.1 request and closes.
async fn serve(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    issuer: &str,
    keys: &Mutex<Vec<serde_json::Value>>,
    fetches: &AtomicUsize,
) {
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        match tls.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buffer[..n]),
        }
    }
    let line = String::from_utf8_lossy(&request).lines().next().unwrap_or_default().to_string();
    let path = line.split_whitespace().nth(1).unwrap_or_default();
    let (status, body) = match path {
        "/.well-known/openid-configuration" => (
            "200 OK",
            serde_json::json!({
                "issuer": issuer,
                "jwks_uri": format!("{issuer}/keys"),
                "id_token_signing_alg_values_supported": ["ES256"],
            }),
        ),
        "/keys" => {
            fetches.fetch_add(1, Ordering::SeqCst);
            let keys = keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            ("200 OK", serde_json::json!({ "keys": keys }))
        }
        _ => ("404 Not Found", serde_json::json!({})),
    };
    let body = body.to_string();
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tls.write_all(response.as_bytes()).await;
    let _ = tls.shutdown().await;
}
