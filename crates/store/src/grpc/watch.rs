//! WatchGateways at the edge: the request checked and turned into watch
//! parameters, the watch's end turned into a status that says where to
//! resume, and the stream ended once its token is no longer valid.

use std::pin::Pin;
use std::sync::Arc;

use gantry_api::v1::{WatchEvent, WatchGatewaysRequest};
use gantry_core::{validation, Selector};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Code, Status};

use super::errors::{invalid, rule_status, storage_status, with_reason};
use crate::auth::{Auth, Credentials};
use crate::watch::budget::Budget;
use crate::watch::filter::Filter;
use crate::watch::stream::{self, Params, WatchContext, WatchEnd};

pub use gantry_api::reasons::{
    STORE_SHUTTING_DOWN as REASON_SHUTTING_DOWN, WATCHER_TOO_SLOW as REASON_TOO_SLOW,
};

/// Stream of WatchGateways.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send + 'static>>;

/// The watch `request` asks for, or INVALID_ARGUMENT naming the field.
pub(super) fn params(request: &WatchGatewaysRequest) -> Result<Params, Status> {
    let selector = Selector::parse(&request.label_selector)
        .map_err(|e| invalid("label_selector", e.to_string()))?;
    let name = if request.name.is_empty() {
        None
    } else {
        validation::validate_name("name", &request.name).map_err(|e| rule_status(&e))?;
        Some(request.name.clone())
    };
    if request.resource_version < 0 {
        return Err(invalid("resource_version", "must be 0 (from now) or a revision"));
    }
    Ok(Params {
        filter: Filter::new(selector, name),
        resource_version: request.resource_version,
        send_initial_events: request.send_initial_events,
        allow_bookmarks: request.allow_bookmarks,
    })
}

/// Starts the watch `request` asks for, its pages charged to `budget`.
pub(super) async fn start(
    ctx: WatchContext,
    request: &WatchGatewaysRequest,
    budget: Arc<Budget>,
) -> Result<WatchStream, Status> {
    let params = params(request)?;
    let events = stream::start(ctx, params, budget).await.map_err(storage_status)?;
    Ok(Box::pin(events.map(|item| item.map_err(end_status))))
}

/// The status a watch ends with: why, and where to resume.
fn end_status(end: WatchEnd) -> Status {
    let (code, why, reason, last) = match end {
        WatchEnd::Storage(e) => return storage_status(e),
        WatchEnd::ShuttingDown { last } => (
            Code::Unavailable,
            "gateway-store is shutting down".to_string(),
            REASON_SHUTTING_DOWN,
            last,
        ),
        WatchEnd::TooSlow { last, events, bytes } => (
            Code::ResourceExhausted,
            format!("watcher fell {events} events ({bytes} bytes) behind and was ended"),
            REASON_TOO_SLOW,
            last,
        ),
        WatchEnd::OverBudget { resume } => {
            let why = "this identity's other watches hold their budget of unread pages \
                       (--max-watch-bytes-per-identity): read or close them";
            let Some(last) = resume else {
                return with_reason(
                    Code::ResourceExhausted,
                    format!("{why}; start again with send_initial_events"),
                    gantry_api::reasons::TOO_MANY_WATCHES,
                    &[],
                );
            };
            (Code::ResourceExhausted, why.to_string(), gantry_api::reasons::TOO_MANY_WATCHES, last)
        }
        WatchEnd::Reset { last } => {
            (Code::Unavailable, "the watch cache was reset".to_string(), REASON_SHUTTING_DOWN, last)
        }
    };
    with_reason(
        code,
        format!("{why}; resume the watch from revision {last}"),
        reason,
        &[("resource_version", last.to_string())],
    )
}

/// What the call that opened a watch presented, kept to check it again.
pub(super) struct Caller {
    pub metadata: tonic::metadata::MetadataMap,
    pub certificates: Option<Arc<Vec<rustls::pki_types::CertificateDer<'static>>>>,
    /// Its identity's watch slot, given back when the stream ends (a Watch
    /// stream's watches hold one each).
    pub _slot: Option<super::watch_quota::WatchSlot>,
}

impl Caller {
    fn credentials(&self) -> Credentials<'_> {
        Credentials {
            metadata: &self.metadata,
            certificates: self.certificates.as_deref().map(Vec::as_slice),
        }
    }
}

/// Ends `stream` with UNAUTHENTICATED once the token that opened it
/// expires or is removed from the tokens file (or PERMISSION_DENIED once
/// its binding is).
///
/// The check is one standing future, woken by a reload or at the expiry,
/// and polled when `stream` has nothing ready or every
/// [`CHECK_EVERY_ITEMS`] items (a stream that never waits is still ended).
pub(super) fn while_authenticated<T: Send + 'static>(
    stream: Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>,
    auth: Arc<Auth>,
    caller: Caller,
) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>> {
    let revoked = Some(Box::pin(revoked(auth, caller)) as _);
    Box::pin(WhileAuthenticated { stream, revoked, items: 0 })
}

/// Items a stream that is always ready delivers between two checks.
const CHECK_EVERY_ITEMS: u32 = 64;

/// Completes with the status that ends the caller's streams once its
/// credentials are no longer valid; pending while they are.
async fn revoked(auth: Arc<Auth>, caller: Caller) -> Status {
    let mut reloads = auth.reloads();
    loop {
        let expires = auth
            .expires(&caller.credentials())
            .map(|at| at.duration_since(std::time::SystemTime::now()).unwrap_or_default());
        let expiry = async {
            match expires {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = reloads.changed() => {}
            () = expiry => {}
        }
        if let Err(status) = auth.authenticate(&caller.credentials()).await {
            tracing::info!(message = status.message(), "watch ended: its token is no longer valid");
            return status;
        }
    }
}

/// See [`while_authenticated`].
struct WhileAuthenticated<T> {
    stream: Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>,
    /// `None` once it ended the stream.
    revoked: Option<Pin<Box<dyn std::future::Future<Output = Status> + Send + 'static>>>,
    /// Items since the last check.
    items: u32,
}

impl<T> Stream for WhileAuthenticated<T> {
    type Item = Result<T, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        let Some(revoked) = this.revoked.as_mut() else { return Poll::Ready(None) };
        if this.items >= CHECK_EVERY_ITEMS {
            this.items = 0;
            if let Poll::Ready(status) = revoked.as_mut().poll(cx) {
                this.revoked = None;
                return Poll::Ready(Some(Err(status)));
            }
        }
        match this.stream.as_mut().poll_next(cx) {
            Poll::Pending => {
                this.items = 0;
                if let Poll::Ready(status) = revoked.as_mut().poll(cx) {
                    this.revoked = None;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Pending
            }
            ready => {
                this.items += 1;
                ready
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending<T: Send + 'static>(
        stream: impl Stream<Item = Result<T, Status>> + Send + 'static,
        revoked: impl std::future::Future<Output = Status> + Send + 'static,
    ) -> WhileAuthenticated<T> {
        WhileAuthenticated { stream: Box::pin(stream), revoked: Some(Box::pin(revoked)), items: 0 }
    }

    /// A stream that always has an item ready (a watcher far behind, a
    /// busy store) is still ended once its credentials are revoked: within
    /// [`CHECK_EVERY_ITEMS`] items, then nothing more.
    #[tokio::test]
    async fn a_stream_that_never_waits_is_ended_within_the_check_interval() {
        // Not tokio_stream::iter: it returns Pending every 32 items to
        // yield to the scheduler, which would let the check run anyway.
        let always_ready = futures_util::stream::iter(0u32..).map(Ok);
        let revoked = async { Status::unauthenticated("the token was removed") };
        let items: Vec<Result<u32, Status>> =
            ending(always_ready, revoked).take(10 * CHECK_EVERY_ITEMS as usize).collect().await;
        let (last, delivered) = items.split_last().unwrap();
        assert_eq!(last.as_ref().unwrap_err().code(), Code::Unauthenticated, "never ended");
        assert!(delivered.len() <= CHECK_EVERY_ITEMS as usize, "{} items after", delivered.len());
        assert!(delivered.iter().enumerate().all(|(i, item)| *item.as_ref().unwrap() == i as u32));
    }

    /// A stream that waits is ended at its first wait once revoked, and a
    /// revocation that never comes lets every item through and the end.
    #[tokio::test]
    async fn a_waiting_stream_is_ended_when_it_waits_and_a_valid_one_runs_to_its_end() {
        let (revoke, revoked) = tokio::sync::oneshot::channel::<()>();
        let revoked = async move {
            let _ = revoked.await;
            Status::permission_denied("the binding was removed")
        };
        let (items, waiting) = tokio::sync::mpsc::channel::<Result<u32, Status>>(4);
        let mut stream = ending(tokio_stream::wrappers::ReceiverStream::new(waiting), revoked);
        items.send(Ok(1)).await.unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        revoke.send(()).unwrap();
        let end = stream.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), Code::PermissionDenied);
        assert!(stream.next().await.is_none(), "an item after the end");

        let valid = ending(tokio_stream::iter([Ok(1u32), Ok(2)]), std::future::pending());
        let all: Vec<u32> = valid.map(Result::unwrap).collect().await;
        assert_eq!(all, [1, 2]);
    }

    #[test]
    fn a_bad_name_selector_or_revision_is_refused_with_the_field() {
        let refused = |request: WatchGatewaysRequest| params(&request).unwrap_err();
        let bad_name = refused(WatchGatewaysRequest { name: "Bad!".into(), ..Default::default() });
        assert_eq!(bad_name.code(), Code::InvalidArgument);
        let bad_selector =
            refused(WatchGatewaysRequest { label_selector: "a in (".into(), ..Default::default() });
        assert_eq!(bad_selector.code(), Code::InvalidArgument);
        let negative = refused(WatchGatewaysRequest { resource_version: -1, ..Default::default() });
        assert!(negative.message().contains("resource_version"), "{negative:?}");
        assert!(params(&WatchGatewaysRequest { name: "edge".into(), ..Default::default() }).is_ok());
    }
}
