//! What the controller needs of gateway-store, as a trait: read one
//! gateway, update it with a mask and a resource_version precondition, and
//! list-then-watch, with errors as [`StoreError`] (gRPC statuses stay in
//! [`GrpcStore`], the real one). `MemoryStore` (tests only) applies
//! gantry-core's rules in memory, so the controller's rules are tested in
//! process with paused time.

#[cfg(test)]
mod memory;
#[cfg(test)]
pub use memory::MemoryStore;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use gantry_api::v1::{Gateway, GetGatewayRequest, UpdateGatewayRequest};
use gantry_client::watch::{list_then_watch, WatchOptions, WatchUpdate};
use gantry_client::GatewayClient;
use prost_types::FieldMask;
use tonic::{Code, Status};

/// A store call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The gateway changed since it was read (a failed precondition):
    /// re-read it.
    #[error("Aborted: {0}")]
    Conflict(String),
    /// The gateway is gone.
    #[error("NotFound: {0}")]
    NotFound(String),
    /// Anything else: the status code's name and the message.
    #[error("{code}: {message}")]
    Other { code: String, message: String },
}

impl From<Status> for StoreError {
    fn from(status: Status) -> Self {
        let message = status.message().to_string();
        match status.code() {
            Code::Aborted => StoreError::Conflict(message),
            Code::NotFound => StoreError::NotFound(message),
            code => StoreError::Other { code: format!("{code:?}"), message },
        }
    }
}

/// gateway-store as the controller uses it.
#[tonic::async_trait]
pub trait GatewayStore: Send + Sync + std::fmt::Debug + 'static {
    async fn get(&self, name: &str) -> Result<Gateway, StoreError>;

    /// UpdateGateway of the fields in `paths`, conditional on
    /// `gateway.metadata.resource_version`.
    async fn update(&self, gateway: Gateway, paths: &[&str]) -> Result<Gateway, StoreError>;

    /// List-then-watch of every gateway: `Init`, pages and `InitDone`
    /// after each (re)list, then changes in revision order. Transient interruptions are resumed
    /// inside; the stream ends after a refusal retrying cannot fix (yielded
    /// as `Err`), and the caller starts a new one after a backoff.
    fn watch(&self) -> BoxStream<'static, Result<WatchUpdate, StoreError>>;
}

/// The store over gRPC.
#[derive(Debug, Clone)]
pub struct GrpcStore {
    client: GatewayClient,
}

impl GrpcStore {
    pub fn new(client: GatewayClient) -> Self {
        Self { client }
    }
}

#[tonic::async_trait]
impl GatewayStore for GrpcStore {
    async fn get(&self, name: &str) -> Result<Gateway, StoreError> {
        let request = GetGatewayRequest { name: name.to_string() };
        Ok(self.client.clone().get_gateway(request).await?.into_inner())
    }

    async fn update(&self, gateway: Gateway, paths: &[&str]) -> Result<Gateway, StoreError> {
        let request = UpdateGatewayRequest {
            gateway: Some(gateway),
            update_mask: Some(FieldMask { paths: paths.iter().map(|p| p.to_string()).collect() }),
            validate_only: false,
        };
        // Status writes are conditional: an unknown outcome is resolved by
        // reading back, never applied twice.
        Ok(gantry_client::write::update_gateway(&mut self.client.clone(), request).await?)
    }

    fn watch(&self) -> BoxStream<'static, Result<WatchUpdate, StoreError>> {
        list_then_watch(self.client.clone(), WatchOptions::default())
            .map(|item| item.map_err(StoreError::from))
            .boxed()
    }
}
