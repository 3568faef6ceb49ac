//! The `gantry.v1.GatewayService` implementation: authenticate, validate
//! the request shape, run the core rule inside a storage transaction, and
//! map the outcome to a gRPC answer.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gantry_api::v1::gateway_service_server::GatewayService;
use gantry_api::v1::{
    CreateGatewayRequest, DeleteGatewayRequest, Gateway, GetGatewayRequest, ListGatewaysRequest,
    ListGatewaysResponse, UpdateGatewayRequest, WatchEvent, WatchGatewaysRequest,
};
use gantry_core::{lifecycle, validation, RuleError, Selector};
use prost::Message as _;
use prost_types::Timestamp;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::auth::{Auth, Principal};
use crate::errors::{invalid, rule_status, storage_status};
use crate::metrics::Metrics;
use crate::storage::Page;
use crate::watch::WatchContext;
use crate::writer::Writer;

/// Default and maximum `page_size` of ListGateways.
pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const MAX_PAGE_SIZE: usize = 1000;
/// A page stops before it would exceed this many encoded bytes (it always
/// holds at least one gateway, itself at most 1 MiB), so a response stays
/// under the 4 MiB a default gRPC client accepts.
pub const PAGE_BYTE_BUDGET: usize = 2 * 1024 * 1024;

/// The gRPC service over a [`crate::storage::Storage`].
#[derive(Debug, Clone)]
pub struct GatewayApi {
    writer: Writer,
    watch: WatchContext,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
    /// Longest a call may take to answer (a watch: to start).
    request_timeout: Duration,
    refusals: Arc<RateLimit>,
}

/// Who made a call.
#[derive(Debug, Clone)]
struct Caller {
    peer: Option<std::net::SocketAddr>,
    /// The call's `authorization` metadata, authenticated again only when a
    /// refusal is logged (not on every call).
    authorization: tonic::metadata::MetadataMap,
    /// The caller's trace (W3C `traceparent`), parent of this call's span.
    parent: gantry_telemetry::Context,
}

/// At most `per_second` log lines a second; the rest are counted and the
/// count is reported with the next line let through.
#[derive(Debug)]
pub struct RateLimit {
    per_second: u32,
    state: std::sync::Mutex<(u64, u32, u64)>,
}

impl RateLimit {
    pub fn new(per_second: u32) -> Self {
        Self { per_second, state: std::sync::Mutex::new((0, 0, 0)) }
    }

    /// `Some(suppressed since the last line)` when a line may be written.
    pub fn admit(&self) -> Option<u64> {
        let second =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (window, used, suppressed) = &mut *state;
        if *window != second {
            *window = second;
            *used = 0;
        }
        if *used < self.per_second {
            *used += 1;
            Some(std::mem::take(suppressed))
        } else {
            *suppressed += 1;
            None
        }
    }
}

impl GatewayApi {
    pub fn new(
        writer: Writer,
        watch: WatchContext,
        auth: Arc<Auth>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            writer,
            watch,
            auth,
            metrics,
            request_timeout: Duration::from_secs(30),
            refusals: Arc::new(RateLimit::new(REFUSALS_LOGGED_PER_SECOND)),
        }
    }

    /// Answers DEADLINE_EXCEEDED when a call takes longer than `timeout`.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    fn authenticate<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        self.auth.authenticate(request.metadata())
    }

    /// Who is calling, for the log of refusals: the peer address and the
    /// credentials (the subject of a valid token is looked up when logged).
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        let mut authorization = tonic::metadata::MetadataMap::new();
        if let Some(value) = request.metadata().get("authorization") {
            authorization.insert("authorization", value.clone());
        }
        let parent = gantry_telemetry::extract(request.metadata());
        Caller { peer: request.remote_addr(), authorization, parent }
    }

    async fn observed<T>(
        &self,
        method: &str,
        caller: Caller,
        work: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let span = tracing::info_span!(
            "gantry.store.rpc",
            otel.name = method,
            rpc.system = "grpc",
            rpc.method = method
        );
        gantry_telemetry::set_parent(&span, caller.parent.clone());
        let work =
            tracing::Instrument::instrument(tokio::time::timeout(self.request_timeout, work), span);
        let result = match work.await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{method} did not finish within {:?} (--request-timeout); a write may still commit: read the gateway again before retrying",
                self.request_timeout
            ))),
        };
        let code = result.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
        self.metrics.observe(method, started, code);
        if let Err(status) = &result {
            match status.code() {
                tonic::Code::Internal | tonic::Code::Unavailable => {
                    tracing::warn!(method, code = ?status.code(), error = status.message(), "request failed");
                }
                // An audit trail of refusals, bounded: one client hammering
                // with a bad token must not fill the disk. Messages never
                // hold a token.
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                    if let Some(suppressed) = self.refusals.admit() {
                        let peer = caller.peer.map(|p| p.to_string()).unwrap_or_default();
                        let principal = self.auth.authenticate(&caller.authorization).ok();
                        let subject = principal.as_ref().map_or("", |p| p.subject.as_str());
                        tracing::info!(method, code = ?status.code(), error = status.message(), peer, subject, suppressed, "request refused");
                    }
                }
                _ => {}
            }
        }
        // Every answer says which version of the store gave it.
        let version = tonic::metadata::MetadataValue::from_static(env!("CARGO_PKG_VERSION"));
        match result {
            Ok(answer) => {
                let mut response = Response::new(answer);
                response.metadata_mut().insert(gantry_api::VERSION_HEADER, version);
                Ok(response)
            }
            Err(mut status) => {
                status.metadata_mut().insert(gantry_api::VERSION_HEADER, version);
                Err(status)
            }
        }
    }

    async fn create(&self, request: Request<CreateGatewayRequest>) -> Result<Gateway, Status> {
        let principal = self.authenticate(&request)?;
        let request = request.into_inner();
        let dry_run = request.validate_only;
        let gateway = request.gateway.ok_or_else(|| invalid("gateway", "required"))?;
        let name = gateway.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        validation::validate_new_name("gateway.metadata.name", &name)
            .map_err(|e| rule_status(&e))?;
        let uid = uuid::Uuid::new_v4().to_string();
        let (role, now) = (principal.role, now());
        // The new generation carries this request's trace to the reconciler.
        let trace = gantry_telemetry::traceparent();
        let committed = self
            .writer
            .mutate(
                &name,
                Box::new(move |existing| {
                    lifecycle::create(existing, gateway, role, uid, now)
                        .map(|w| lifecycle::record_trace(w, 0, trace.as_deref()))
                }),
                dry_run,
            )
            .await
            .map_err(storage_status)?;
        if !dry_run {
            tracing::info!(gateway = %name, subject = %principal.subject, "created");
        }
        Ok(committed.gateway)
    }

    async fn get(&self, request: Request<GetGatewayRequest>) -> Result<Gateway, Status> {
        self.authenticate(&request)?;
        let name = request.into_inner().name;
        validation::validate_name("name", &name).map_err(|e| rule_status(&e))?;
        self.watch
            .storage
            .get(&name)
            .await
            .map_err(storage_status)?
            .ok_or_else(|| rule_status(&RuleError::NotFound(name)))
    }

    async fn list(
        &self,
        request: Request<ListGatewaysRequest>,
    ) -> Result<ListGatewaysResponse, Status> {
        self.authenticate(&request)?;
        let request = request.into_inner();
        let page_size = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n < 0 => return Err(invalid("page_size", "must be 0 (default 100) or more")),
            n => usize::try_from(n).unwrap_or(MAX_PAGE_SIZE).min(MAX_PAGE_SIZE),
        };
        let selector = Selector::parse(&request.label_selector)
            .map_err(|e| invalid("label_selector", e.to_string()))?;
        let key = self.watch.storage.page_token_key();
        let (mut after, mut revision) = match request.page_token.as_str() {
            "" => (String::new(), None),
            token => {
                let (revision, after) = PageToken::decode(key, token, &request.label_selector)?;
                (after, Some(revision))
            }
        };
        let batch = if selector.is_empty() { page_size + 1 } else { (page_size + 1).max(500) };
        let mut gateways = Vec::new();
        let mut bytes = 0;
        let mut more = false;
        'scan: loop {
            let page =
                Page { after: &after, limit: batch, max_bytes: PAGE_BYTE_BUDGET, at: revision };
            let snapshot = self.watch.storage.list(page).await.map_err(storage_status)?;
            revision.get_or_insert(snapshot.revision);
            let exhausted = !snapshot.more;
            for gateway in snapshot.gateways {
                let labels = gateway.metadata.as_ref().map(|m| &m.labels);
                if !labels.is_some_and(|l| selector.matches(l)) {
                    after = gateway_name(&gateway);
                    continue;
                }
                let size = gateway.encoded_len();
                if gateways.len() == page_size
                    || (bytes + size > PAGE_BYTE_BUDGET && !gateways.is_empty())
                {
                    more = true;
                    break 'scan;
                }
                bytes += size;
                after = gateway_name(&gateway);
                gateways.push(gateway);
            }
            if exhausted {
                break;
            }
        }
        let revision = revision.unwrap_or_default();
        let next_page_token = if more {
            PageToken::encode(key, revision, &after, &request.label_selector)
        } else {
            String::new()
        };
        Ok(ListGatewaysResponse { gateways, next_page_token, resource_version: revision })
    }

    async fn update(&self, request: Request<UpdateGatewayRequest>) -> Result<Gateway, Status> {
        let principal = self.authenticate(&request)?;
        let request = request.into_inner();
        let gateway = request.gateway.ok_or_else(|| invalid("gateway", "required"))?;
        let name = gateway.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        validation::validate_name("gateway.metadata.name", &name).map_err(|e| rule_status(&e))?;
        let paths = request.update_mask.map(|m| m.paths).unwrap_or_default();
        let (role, now, target, dry_run) =
            (principal.role, now(), name.clone(), request.validate_only);
        let trace = gantry_telemetry::traceparent();
        let committed = self
            .writer
            .mutate(
                &name,
                Box::new(move |current| match current {
                    None => Err(RuleError::NotFound(target)),
                    Some(current) => {
                        let generation = current.metadata.as_ref().map_or(0, |m| m.generation);
                        lifecycle::update(current, &gateway, &paths, role, now)
                            .map(|w| lifecycle::record_trace(w, generation, trace.as_deref()))
                    }
                }),
                dry_run,
            )
            .await
            .map_err(storage_status)?;
        if committed.event.is_some() {
            tracing::debug!(gateway = %name, subject = %principal.subject, "updated");
        }
        Ok(committed.gateway)
    }

    async fn delete(&self, request: Request<DeleteGatewayRequest>) -> Result<Gateway, Status> {
        let principal = self.authenticate(&request)?;
        let request = request.into_inner();
        validation::validate_name("name", &request.name).map_err(|e| rule_status(&e))?;
        let (role, now, target, rv) =
            (principal.role, now(), request.name.clone(), request.resource_version);
        let committed = self
            .writer
            .mutate(
                &request.name,
                Box::new(move |current| match current {
                    None => Err(RuleError::NotFound(target)),
                    Some(current) => lifecycle::delete(current, rv, role, now),
                }),
                request.validate_only,
            )
            .await
            .map_err(storage_status)?;
        if !request.validate_only {
            tracing::info!(gateway = %request.name, subject = %principal.subject, "delete requested");
        }
        Ok(committed.gateway)
    }
}

fn gateway_name(g: &Gateway) -> String {
    g.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default()
}

fn now() -> Timestamp {
    Timestamp::from(SystemTime::now())
}

/// The opaque `page_token` of ListGateways: the listing's revision and the
/// last name returned (keyset pagination: every later page is read as of
/// that revision), authenticated with the store's key together with the
/// label selector it was issued for, so that a forged, altered or reused
/// token is refused rather than served.
struct PageToken;

impl PageToken {
    fn mac(key: &[u8], revision: i64, after: &str, selector: &str) -> Vec<u8> {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        for part in [
            b"gantry.dev/page-token/v1".as_slice(),
            &revision.to_be_bytes(),
            after.as_bytes(),
            selector.as_bytes(),
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes()[..16].to_vec()
    }

    fn encode(key: &[u8], revision: i64, after: &str, selector: &str) -> String {
        let body = URL_SAFE_NO_PAD.encode(format!("{revision}:{after}"));
        let mac = URL_SAFE_NO_PAD.encode(Self::mac(key, revision, after, selector));
        format!("{body}.{mac}")
    }

    fn decode(key: &[u8], token: &str, selector: &str) -> Result<(i64, String), Status> {
        let bad = || {
            invalid(
                "page_token",
                "not a token this store issued for this label_selector; list again without a page_token",
            )
        };
        let (body, mac) = token.split_once('.').ok_or_else(bad)?;
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(body).map_err(|_| bad())?)
            .map_err(|_| bad())?;
        let (revision, after) = text.split_once(':').ok_or_else(bad)?;
        let revision: i64 = revision.parse().map_err(|_| bad())?;
        let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| bad())?;
        let expected = Self::mac(key, revision, after, selector);
        // Constant time: the comparison must not tell a forger how much of
        // a guess was right.
        let same = mac.len() == expected.len()
            && mac.iter().zip(&expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if !same {
            return Err(bad());
        }
        Ok((revision, after.to_string()))
    }
}

/// Stream of WatchGateways.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl GatewayService for GatewayApi {
    async fn create_gateway(
        &self,
        request: Request<CreateGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = self.caller(&request);
        self.observed("CreateGateway", caller, self.create(request)).await
    }

    async fn get_gateway(
        &self,
        request: Request<GetGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = self.caller(&request);
        self.observed("GetGateway", caller, self.get(request)).await
    }

    async fn list_gateways(
        &self,
        request: Request<ListGatewaysRequest>,
    ) -> Result<Response<ListGatewaysResponse>, Status> {
        let caller = self.caller(&request);
        self.observed("ListGateways", caller, self.list(request)).await
    }

    async fn update_gateway(
        &self,
        request: Request<UpdateGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = self.caller(&request);
        self.observed("UpdateGateway", caller, self.update(request)).await
    }

    async fn delete_gateway(
        &self,
        request: Request<DeleteGatewayRequest>,
    ) -> Result<Response<Gateway>, Status> {
        let caller = self.caller(&request);
        self.observed("DeleteGateway", caller, self.delete(request)).await
    }

    type WatchGatewaysStream = WatchStream;

    async fn watch_gateways(
        &self,
        request: Request<WatchGatewaysRequest>,
    ) -> Result<Response<Self::WatchGatewaysStream>, Status> {
        let caller = self.caller(&request);
        let work = async {
            let principal = self.authenticate(&request)?;
            let metadata = request.metadata().clone();
            let request = request.into_inner();
            tracing::debug!(subject = %principal.subject, from = request.resource_version, "watch started");
            let stream = crate::watch::start(self.watch.clone(), request).await?;
            Ok(while_authenticated(stream, self.auth.clone(), metadata))
        };
        self.observed("WatchGateways", caller, work).await
    }
}

/// Refusal log lines written per second at most.
pub const REFUSALS_LOGGED_PER_SECOND: u32 = 10;

/// Ends `stream` with UNAUTHENTICATED once the token that opened it
/// expires or is removed from the tokens file.
fn while_authenticated(
    stream: WatchStream,
    auth: Arc<Auth>,
    metadata: tonic::metadata::MetadataMap,
) -> WatchStream {
    let reloads = auth.reloads();
    let state = Some((stream, reloads, auth, metadata));
    Box::pin(futures_util::stream::unfold(state, |state| async move {
        let (mut stream, mut reloads, auth, metadata) = state?;
        loop {
            let expires = auth
                .expires(&metadata)
                .map(|at| at.duration_since(std::time::SystemTime::now()).unwrap_or_default());
            let expiry = async {
                match expires {
                    Some(left) => tokio::time::sleep(left).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                item = tokio_stream::StreamExt::next(&mut stream) => {
                    return item.map(|item| (item, Some((stream, reloads, auth, metadata))));
                }
                _ = reloads.changed() => {}
                () = expiry => {}
            }
            if let Err(status) = auth.authenticate(&metadata) {
                tracing::info!(
                    message = status.message(),
                    "watch ended: its token is no longer valid"
                );
                return Some((Err(status), None));
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_refuse_forged_altered_and_reused_ones() {
        let key = b"store key".as_slice();
        let token = PageToken::encode(key, 42, "edge-7", "env=prod");
        assert_eq!(PageToken::decode(key, &token, "env=prod").unwrap(), (42, "edge-7".to_string()));
        let (body, mac) = token.split_once('.').unwrap();
        let forged_body = URL_SAFE_NO_PAD.encode("999999999:edge-7");
        let refused = [
            ("%%%".to_string(), "env=prod"),
            (body.to_string(), "env=prod"),
            (format!("{forged_body}.{mac}"), "env=prod"),
            (format!("{}.{mac}", URL_SAFE_NO_PAD.encode("-5:edge-7")), "env=prod"),
            (token.clone(), "env=dev"),
            (token.clone(), ""),
            (String::new(), "env=prod"),
        ];
        for (bad, selector) in refused {
            let status = PageToken::decode(key, &bad, selector).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad} {selector}");
        }
        let other_store = PageToken::decode(b"another key", &token, "env=prod").unwrap_err();
        assert_eq!(other_store.code(), tonic::Code::InvalidArgument);
    }
}
