//! The gRPC edge: `gantry.v1.GatewayService` over the writer, the watch
//! and storage. Each RPC has its own module (request checked, core rule run
//! through the writer or storage read, outcome mapped to an answer);
//! [`observe`] wraps every one of them (span, timeout, metrics, audit log).
//! Domain errors become `tonic::Status` here and nowhere below ([`errors`]).
//!
//! ```text
//! request ─► auth (token → role) ─► observe ─► create | get | list | update | delete | watch
//!                                                 │ writer.mutate   │ storage   │ watch::stream
//! ```
//!
//! Also here: connection limits ([`conn`]), page tokens, the refusal-log
//! rate limit.

pub mod auth;
pub mod conn;
mod create;
mod delete;
pub mod errors;
mod get;
pub mod list;
pub mod observe;
mod page_token;
pub mod rate_limit;
mod update;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gantry_api::v1::gateway_service_server::GatewayService;
use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GetGatewayRequest, ListGatewaysRequest,
    ListGatewaysResponse, UpdateGatewayRequest, WatchGatewaysRequest,
};
use prost_types::Timestamp;
use tonic::{Request, Response, Status};

use self::auth::{Auth, Principal};
use self::observe::{Caller, Observer, REFUSALS_LOGGED_PER_SECOND};
use self::rate_limit::RateLimit;
use self::watch::WatchStream;
use crate::metrics::Metrics;
use crate::storage::Storage;
use crate::watch::stream::WatchContext;
use crate::writer::Writer;

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct GatewayApi {
    writer: Writer,
    storage: Arc<dyn Storage>,
    watch: WatchContext,
    auth: Arc<Auth>,
    observer: Observer,
}

impl GatewayApi {
    pub fn new(
        writer: Writer,
        storage: Arc<dyn Storage>,
        watch: WatchContext,
        auth: Arc<Auth>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let observer = Observer {
            auth: auth.clone(),
            metrics,
            request_timeout: Duration::from_secs(30),
            refusals: Arc::new(RateLimit::new(REFUSALS_LOGGED_PER_SECOND)),
        };
        Self { writer, storage, watch, auth, observer }
    }

    /// Answers DEADLINE_EXCEEDED when a call takes longer than `timeout`.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.observer.request_timeout = timeout;
        self
    }

    fn authenticate<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        self.auth.authenticate(request.metadata())
    }
}

/// Now, as the timestamp written on a change.
fn now() -> Timestamp {
    Timestamp::from(SystemTime::now())
}

#[tonic::async_trait]
impl GatewayService for GatewayApi {
    async fn create_gateway(
        &self,
        request: Request<CreateGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = Caller::of(&request);
        let work = async {
            let principal = self.authenticate(&request)?;
            create::create(&self.writer, principal, request.into_inner()).await
        };
        self.observer.observed("CreateGateway", caller, work).await
    }

    async fn get_gateway(
        &self,
        request: Request<GetGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = Caller::of(&request);
        let work = async {
            self.authenticate(&request)?;
            get::get(self.storage.as_ref(), request.into_inner()).await
        };
        self.observer.observed("GetGateway", caller, work).await
    }

    async fn list_gateways(
        &self,
        request: Request<ListGatewaysRequest>,
    ) -> Result<Response<ListGatewaysResponse>, Status> {
        let caller = Caller::of(&request);
        let work = async {
            self.authenticate(&request)?;
            list::list(self.storage.as_ref(), request.into_inner()).await
        };
        self.observer.observed("ListGateways", caller, work).await
    }

    async fn update_gateway(
        &self,
        request: Request<UpdateGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = Caller::of(&request);
        let work = async {
            let principal = self.authenticate(&request)?;
            update::update(&self.writer, principal, request.into_inner()).await
        };
        self.observer.observed("UpdateGateway", caller, work).await
    }

    async fn delete_gateway(
        &self,
        request: Request<DeleteGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = Caller::of(&request);
        let work = async {
            let principal = self.authenticate(&request)?;
            delete::delete(&self.writer, principal, request.into_inner()).await
        };
        self.observer.observed("DeleteGateway", caller, work).await
    }

    type WatchGatewaysStream = WatchStream;

    async fn watch_gateways(
        &self,
        request: Request<WatchGatewaysRequest>,
    ) -> Result<Response<Self::WatchGatewaysStream>, Status> {
        let caller = Caller::of(&request);
        let work = async {
            let principal = self.authenticate(&request)?;
            let metadata = request.metadata().clone();
            let request = request.into_inner();
            tracing::debug!(subject = %principal.subject, from = request.resource_version, "watch started");
            let stream = watch::start(self.watch.clone(), &request).await?;
            Ok(watch::while_authenticated(stream, self.auth.clone(), metadata))
        };
        self.observer.observed("WatchGateways", caller, work).await
    }
}
