//! gantry-client: the Rust client of gateway-store, used by the reconciler,
//! gatewayctl and the benchmarks.
//!
//! - [`connect`]: a channel to the store with a bearer token and optional
//!   TLS, wrapped in the generated client.
//! - [`watch::list_then_watch`]: the informer loop every subscriber needs:
//!   list, watch from the listed revision, resume after a disconnect from
//!   the last revision seen, relist when that revision was compacted, with
//!   jittered backoff in between.

#![forbid(unsafe_code)]

pub mod watch;

use std::time::Duration;

use gantry_api::v1::gateway_service_client::GatewayServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

/// The generated client with the bearer token attached to every call.
pub type GatewayClient = GatewayServiceClient<InterceptedService<Channel, BearerToken>>;

/// Adds `authorization: Bearer <token>` to every request. `Debug` hides
/// the token.
#[derive(Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "BearerToken(***)" } else { "BearerToken(none)" })
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Where and how to reach the store.
#[derive(Clone, Default)]
pub struct ClientConfig {
    /// `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// Bearer token; `None` for a store running `--allow-unauthenticated`.
    pub token: Option<String>,
    /// PEM CA certificate to trust for `https://` endpoints.
    pub ca_pem: Option<Vec<u8>>,
    /// Domain name to verify the server certificate against, when it
    /// differs from the endpoint's host.
    pub tls_domain: Option<String>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "..."))
            .field("tls_domain", &self.tls_domain)
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
            endpoint = endpoint.tls_config(tls).map_err(|e| invalid(e.to_string()))?;
        }
        Ok(endpoint)
    }

    fn bearer(&self) -> Result<BearerToken, ClientError> {
        self.token
            .as_ref()
            .map(|t| format!("Bearer {t}").parse().map_err(|_| ClientError::Token))
            .transpose()
            .map(BearerToken)
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
    GatewayServiceClient::with_interceptor(channel, token)
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}
