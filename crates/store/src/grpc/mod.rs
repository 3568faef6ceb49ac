//! The gRPC edge: `gantry.v1.GatewayService` over the writer, the watch
//! and storage. Each RPC has its own module (request checked, core rule run
//! through the writer or storage read, outcome mapped to an answer);
//! [`observe`]'s tower layer wraps the service (span, timeout, metrics,
//! audit log).
//! Domain errors become `tonic::Status` here and nowhere below ([`errors`]).
//!
//! ```text
//! request ─► observe ─► auth (token → identity → role) ─► create | get | list | update | delete | watch | shared_watch
//!                                                 │ writer.mutate   │ storage   │ watch::stream
//! ```
//!
//! Also here: connection limits ([`conn`]), page tokens, the refusal-log
//! rate limit.

pub mod conn;
mod create;
mod delete;
pub mod errors;
pub mod fairness;
mod get;
mod holding;
pub mod list;
pub mod observe;
mod page_token;
pub mod rate_limit;
mod shared_watch;
mod update;
pub mod watch;
pub mod watch_quota;

use std::sync::Arc;
use std::time::SystemTime;

use gantry_api::v1::gateway_service_server::GatewayService;
use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GetGatewayRequest, ListGatewaysRequest,
    ListGatewaysResponse, UpdateGatewayRequest, WatchGatewaysRequest, WatchRequest,
};
use gantry_core::Role;
use prost_types::Timestamp;
use tonic::{Request, Response, Status};

use self::fairness::{AnswerSeat, Fairness, Seat};
use self::shared_watch::SharedWatchStream;
use self::watch::WatchStream;
use self::watch_quota::WatchQuota;
use crate::auth::{Auth, Credentials, Principal};
use crate::background::Background;
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
    watch_quota: Arc<WatchQuota>,
    fairness: Arc<Fairness>,
    /// Where the viewers' lists run (at a lower CPU priority).
    background: Arc<Background>,
}

impl GatewayApi {
    pub fn new(
        writer: Writer,
        storage: Arc<dyn Storage>,
        watch: WatchContext,
        auth: Arc<Auth>,
        watch_quota: Arc<WatchQuota>,
        fairness: Arc<Fairness>,
        background: Arc<Background>,
    ) -> Self {
        Self { writer, storage, watch, auth, watch_quota, fairness, background }
    }

    async fn authenticate<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        let certificates = request.peer_certs();
        let call = Credentials {
            metadata: request.metadata(),
            certificates: certificates.as_deref().map(Vec::as_slice),
        };
        self.auth.authenticate(&call).await
    }

    /// The caller, and a seat of its priority level (held until the call
    /// ends; a watch's until its stream starts).
    async fn admit<T>(
        &self,
        request: &Request<T>,
        width: usize,
    ) -> Result<(Principal, Seat), Status> {
        let principal = self.authenticate(request).await?;
        let seat = self.fairness.admit(&principal.subject, principal.role, width).await?;
        Ok((principal, seat))
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
        let (principal, seat) = self.admit(&request, 1).await?;
        let created = create::create(&self.writer, principal, request.into_inner()).await?;
        Ok(AnswerSeat::respond(seat, created))
    }

    async fn get_gateway(
        &self,
        request: Request<GetGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let (_, seat) = self.admit(&request, 1).await?;
        let gateway = get::get(self.storage.as_ref(), request.into_inner()).await?;
        Ok(AnswerSeat::respond(seat, gateway))
    }

    async fn list_gateways(
        &self,
        request: Request<ListGatewaysRequest>,
    ) -> Result<Response<ListGatewaysResponse>, Status> {
        let page = list::effective_page_size(request.get_ref().page_size);
        let (principal, seat) = self.admit(&request, fairness::width(Some(page))).await?;
        let request = request.into_inner();
        let page = if principal.role == Role::Viewer {
            let work = |storage: Arc<dyn Storage>| async move {
                list::list(storage.as_ref(), request).await
            };
            let stopping = || Status::unavailable("gateway-store is stopping; retry");
            self.background.run(work).await.ok_or_else(stopping)??
        } else {
            list::list(self.storage.as_ref(), request).await?
        };
        Ok(AnswerSeat::respond(seat, page))
    }

    async fn update_gateway(
        &self,
        request: Request<UpdateGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let (principal, seat) = self.admit(&request, 1).await?;
        let updated = update::update(&self.writer, principal, request.into_inner()).await?;
        Ok(AnswerSeat::respond(seat, updated))
    }

    async fn delete_gateway(
        &self,
        request: Request<DeleteGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let (principal, seat) = self.admit(&request, 1).await?;
        let deleted = delete::delete(&self.writer, principal, request.into_inner()).await?;
        Ok(AnswerSeat::respond(seat, deleted))
    }

    type WatchGatewaysStream = WatchStream;

    async fn watch_gateways(
        &self,
        request: Request<WatchGatewaysRequest>,
    ) -> Result<Response<Self::WatchGatewaysStream>, Status> {
        let (principal, seat) = self.admit(&request, 1).await?;
        let slot = self.watch_quota.acquire(&principal.subject)?;
        let (metadata, certificates) = (request.metadata().clone(), request.peer_certs());
        let request = request.into_inner();
        tracing::debug!(subject = %principal.subject, from = request.resource_version, "watch started");
        let stream = watch::start(self.watch.clone(), &request, slot.budget.clone()).await?;
        // Streaming, the watch no longer holds a seat.
        drop(seat);
        let caller = watch::Caller { metadata, certificates, _slot: Some(slot) };
        Ok(Response::new(watch::while_authenticated(stream, self.auth.clone(), caller)))
    }

    type WatchStream = SharedWatchStream;

    async fn watch(
        &self,
        request: Request<tonic::Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // Each watch of the stream takes a seat while it starts.
        let principal = self.authenticate(&request).await?;
        let (metadata, certificates) = (request.metadata().clone(), request.peer_certs());
        tracing::debug!(subject = %principal.subject, "shared watch stream opened");
        let starter = shared_watch::Starter {
            watch: self.watch.clone(),
            quota: self.watch_quota.clone(),
            fairness: self.fairness.clone(),
            principal,
        };
        let caller = watch::Caller { metadata, certificates, _slot: None };
        Ok(Response::new(shared_watch::serve(
            starter,
            request.into_inner(),
            self.auth.clone(),
            caller,
        )))
    }
}
