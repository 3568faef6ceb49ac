//! gantry-client: the Rust client of gateway-store, used by the reconciler,
//! gatewayctl and the benchmarks.
//!
//! - [`connect`]: a channel to the store with a bearer token and optional
//!   TLS, wrapped in the generated client.
//! - [`watch::list_then_watch`]: the informer loop every subscriber needs:
//!   list (delivered page by page), watch from the listed revision, resume
//!   after a disconnect from the last revision seen, relist when that
//!   revision was compacted, with jittered backoff in between.
//! - [`write::update_gateway`]: an update whose outcome is unknown (the
//!   store or the connection failed after the commit may have landed) is
//!   resolved by reading back, never applied twice.
//! - [`manifest`]: Gateway manifests as people write them (YAML or JSON)
//!   and their conversion to and from the wire messages.
//! - [`config`]: the config file of named contexts gatewayctl reads and
//!   gantry-local writes.

#![forbid(unsafe_code)]

pub mod config;
pub mod manifest;
pub mod shared_watch;
pub mod traced;
pub mod watch;
pub mod write;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gantry_api::v1::gateway_service_client::GatewayServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

pub use traced::Traced;

/// The generated client with the bearer token attached to every call.
pub type GatewayClient = GatewayServiceClient<Traced<InterceptedService<Channel, BearerToken>>>;

/// Adds `authorization: Bearer <token>` to every request. `Debug` hides
/// the token.
#[derive(Clone)]
pub enum BearerToken {
    Fixed(Option<MetadataValue<Ascii>>),
    /// Read from a file, again whenever the file changes (a rotated or
    /// renewed token is used without a restart, as Kubernetes' projected
    /// tokens are).
    File(Arc<TokenFile>),
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BearerToken::Fixed(Some(_)) => f.write_str("BearerToken(***)"),
            BearerToken::Fixed(None) => f.write_str("BearerToken(none)"),
            BearerToken::File(file) => write!(f, "BearerToken(file {})", file.path.display()),
        }
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let value = match self {
            BearerToken::Fixed(value) => value.clone(),
            BearerToken::File(file) => Some(file.current()?),
        };
        if let Some(value) = value {
            request.metadata_mut().insert("authorization", value);
        }
        // The caller's trace continues in the store (W3C traceparent).
        gantry_runtime::inject(request.metadata_mut());
        Ok(request)
    }
}

/// A token file, re-read when its modification time or size changes.
pub struct TokenFile {
    path: PathBuf,
    cached: Mutex<Option<(FileStamp, MetadataValue<Ascii>)>>,
}

type FileStamp = (Option<SystemTime>, u64);

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl TokenFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), cached: Mutex::new(None) }
    }

    /// The header value of the token now in the file. A file that cannot be
    /// read or holds no valid token fails the call with UNAUTHENTICATED
    /// naming the file (the store would refuse it anyway).
    pub fn current(&self) -> Result<MetadataValue<Ascii>, Status> {
        let unreadable = |reason: String| {
            Status::unauthenticated(format!("token file {}: {reason}", self.path.display()))
        };
        let meta = std::fs::metadata(&self.path).map_err(|e| unreadable(e.to_string()))?;
        let stamp = (meta.modified().ok(), meta.len());
        let mut cached = self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((seen, value)) = cached.as_ref() {
            if *seen == stamp {
                return Ok(value.clone());
            }
        }
        let text = std::fs::read_to_string(&self.path).map_err(|e| unreadable(e.to_string()))?;
        let value = bearer_value(text.trim())
            .map_err(|_| unreadable("not a valid token (empty or not ASCII)".into()))?;
        *cached = Some((stamp, value.clone()));
        Ok(value)
    }
}

fn bearer_value(token: &str) -> Result<MetadataValue<Ascii>, ClientError> {
    if token.is_empty() {
        return Err(ClientError::Token);
    }
    format!("Bearer {token}").parse().map_err(|_| ClientError::Token)
}

/// Where and how to reach the store.
#[derive(Clone, Default)]
pub struct ClientConfig {
    /// `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// Bearer token; `None` for a store running `--allow-unauthenticated`.
    pub token: Option<String>,
    /// File holding the bearer token, re-read when it changes; takes the
    /// place of `token`.
    pub token_file: Option<PathBuf>,
    /// PEM CA certificate to trust for `https://` endpoints.
    pub ca_pem: Option<Vec<u8>>,
    /// Domain name to verify the server certificate against, when it
    /// differs from the endpoint's host.
    pub tls_domain: Option<String>,
    /// PEM client certificate and key to present (a store with
    /// `--client-ca` takes its subject as the caller).
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("token_file", &self.token_file)
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "..."))
            .field("tls_domain", &self.tls_domain)
            .field("client_identity", &self.client_identity.as_ref().map(|_| "..."))
            .finish()
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid store endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("the token contains characters not allowed in gRPC metadata")]
    Token,
    #[error("cannot connect to the store at {endpoint}: {source}")]
    Connect { endpoint: String, source: tonic::transport::Error },
}

impl ClientConfig {
    /// The endpoint with timeouts, keepalive and TLS applied.
    pub fn endpoint(&self) -> Result<Endpoint, ClientError> {
        let invalid =
            |reason: String| ClientError::Endpoint { endpoint: self.endpoint.clone(), reason };
        if !self.endpoint.starts_with("http://") && !self.endpoint.starts_with("https://") {
            // Without a scheme the URI parser takes `HOST:PORT` for a scheme
            // and every call fails later as an unreachable store.
            let bare = self.endpoint.split_once("://").map_or(self.endpoint.as_str(), |(_, r)| r);
            return Err(invalid(format!(
                "no http:// or https:// scheme: write http://{bare} for a plain-text store \
                 or https://{bare} for one serving TLS"
            )));
        }
        let mut endpoint = Endpoint::from_shared(self.endpoint.clone())
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        if self.endpoint.starts_with("https://") {
            let mut tls = ClientTlsConfig::new();
            if let Some(ca) = &self.ca_pem {
                tls = tls.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some(domain) = &self.tls_domain {
                tls = tls.domain_name(domain.clone());
            }
            if let Some((cert, key)) = &self.client_identity {
                tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| invalid(e.to_string()))?;
        }
        Ok(endpoint)
    }

    fn bearer(&self) -> Result<BearerToken, ClientError> {
        if let Some(path) = &self.token_file {
            return Ok(BearerToken::File(Arc::new(TokenFile::new(path))));
        }
        self.token.as_deref().map(bearer_value).transpose().map(BearerToken::Fixed)
    }

    /// A client that connects on first use and reconnects by itself.
    pub fn connect_lazy(&self) -> Result<GatewayClient, ClientError> {
        let channel = self.endpoint()?.connect_lazy();
        Ok(wrap(channel, self.bearer()?))
    }
}

/// Connects to the store now, failing if it cannot be reached.
pub async fn connect(config: &ClientConfig) -> Result<GatewayClient, ClientError> {
    let channel = config
        .endpoint()?
        .connect()
        .await
        .map_err(|source| ClientError::Connect { endpoint: config.endpoint.clone(), source })?;
    Ok(wrap(channel, config.bearer()?))
}

/// Largest message the client accepts: the store bounds its pages well
/// below this, and a single gateway is at most 1 MiB.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

fn wrap(channel: Channel, token: BearerToken) -> GatewayClient {
    GatewayServiceClient::new(Traced(InterceptedService::new(channel, token)))
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_needs_its_scheme() {
        for bare in ["127.0.0.1:50051", "gateway-store:50051", "tcp://127.0.0.1:50051"] {
            let config = ClientConfig { endpoint: bare.into(), ..Default::default() };
            let refused = config.endpoint().unwrap_err().to_string();
            assert!(
                refused.contains("no http:// or https:// scheme") && refused.contains("http://"),
                "{bare}: {refused}"
            );
        }
        let refused = ClientConfig { endpoint: "127.0.0.1:50051".into(), ..Default::default() }
            .endpoint()
            .unwrap_err()
            .to_string();
        assert!(refused.contains("write http://127.0.0.1:50051"), "{refused}");
        for good in ["http://127.0.0.1:50051", "https://gateway-store:50051"] {
            let config = ClientConfig { endpoint: good.into(), ..Default::default() };
            assert!(config.endpoint().is_ok(), "{good}");
        }
    }
}
