//! Watch: many watches on one bidirectional stream, as etcd's Watch. The
//! client creates and cancels watches by ids it chooses; each watch is the
//! same event stream WatchGateways would give ([`super::watch::start`]),
//! so the two RPCs cannot differ in what they deliver.
//!
//! One connection then costs one HTTP/2 stream however many watches it
//! holds, and the events one write sends to its watches are encoded into
//! one buffer and leave in as few DATA frames as their size allows (tonic
//! writes every response that is ready before it yields the buffer).
//!
//! The watches are polled through a [`SelectAll`], which polls only those
//! that were woken: a write that concerns one watch of a thousand costs
//! one poll.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::stream::SelectAll;
use futures_util::{ready, StreamExt as _};
use gantry_api::v1::watch_request::Request as Ask;
use gantry_api::v1::{WatchCreate, WatchRequest, WatchResponse};
use tokio::sync::oneshot;
use tokio_stream::Stream;
use tonic::{Status, Streaming};

use super::fairness::Fairness;
use super::watch::{self, Caller};
use super::watch_quota::{WatchQuota, WatchSlot};
use crate::auth::{Auth, Principal};
use crate::watch::stream::WatchContext;

/// Responses of one Watch stream.
pub type SharedWatchStream =
    Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

/// What starting one watch needs: the store's side and the caller's.
#[derive(Clone)]
pub(super) struct Starter {
    pub watch: WatchContext,
    pub quota: Arc<WatchQuota>,
    pub fairness: Arc<Fairness>,
    pub principal: Principal,
}

/// Serves the Watch stream whose requests are `requests`, ended once the
/// caller's credentials are no longer valid (as a single watch is).
pub(super) fn serve(
    starter: Starter,
    requests: Streaming<WatchRequest>,
    auth: Arc<Auth>,
    caller: Caller,
) -> SharedWatchStream {
    let shared = Shared {
        stopping: Box::pin(starter.watch.shutdown.wait()),
        requests: Some(requests),
        watches: SelectAll::new(),
        open: HashMap::new(),
        answers: VecDeque::new(),
        starter,
    };
    watch::while_authenticated(Box::pin(shared), auth, caller)
}

/// The state of one Watch stream.
struct Shared {
    /// The store stops: no watch starts any more, and the stream ends once
    /// its watches have delivered what was committed and ended.
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// `None` once the client closed its side or the store stops.
    requests: Option<Streaming<WatchRequest>>,
    watches: SelectAll<Pin<Box<OneWatch>>>,
    /// Open watches by id; dropping the sender ends the watch.
    open: HashMap<i64, oneshot::Sender<()>>,
    /// Answers to requests, sent before further events.
    answers: VecDeque<WatchResponse>,
    starter: Starter,
}

impl Shared {
    fn handle(&mut self, request: WatchRequest) -> Result<(), Status> {
        match request.request {
            Some(Ask::Create(create)) => self.create(create),
            Some(Ask::Cancel(cancel)) => {
                let id = cancel.watch_id;
                let answer = if self.open.remove(&id).is_some() {
                    WatchResponse { watch_id: id, canceled: true, ..Default::default() }
                } else {
                    ended(id, &Status::not_found(format!("no open watch {id} on this stream")))
                };
                self.answers.push_back(answer);
            }
            None => {
                return Err(super::errors::invalid(
                    "request",
                    "a WatchRequest carries create or cancel",
                ))
            }
        }
        Ok(())
    }

    fn create(&mut self, create: WatchCreate) {
        let id = create.watch_id;
        if self.open.contains_key(&id) {
            let status = Status::already_exists(format!(
                "watch_id {id} is already open on this stream; cancel it or choose another id"
            ));
            self.answers.push_back(ended(id, &status));
            return;
        }
        let request = create.watch.unwrap_or_default();
        if let Err(status) = watch::params(&request) {
            self.answers.push_back(ended(id, &status));
            return;
        }
        let slot = match self.starter.quota.acquire(&self.starter.principal.subject) {
            Ok(slot) => slot,
            Err(status) => {
                self.answers.push_back(ended(id, &status));
                return;
            }
        };
        let (cancel, canceled) = oneshot::channel();
        self.open.insert(id, cancel);
        let starter = self.starter.clone();
        let budget = slot.budget.clone();
        let started = async move {
            let principal = &starter.principal;
            let seat = starter.fairness.admit(&principal.subject, principal.role, 1).await?;
            let events = watch::start(starter.watch, &request, budget).await?;
            drop(seat);
            Ok(events)
        };
        let phase = Phase::Starting(Box::pin(started));
        self.watches.push(Box::pin(OneWatch { id, phase, canceled, _slot: slot }));
    }
}

/// Encoded bytes of events past which a response takes no more: several
/// events of one watch that are ready at once go in one response.
const RESPONSE_EVENT_BYTES: usize = 64 * 1024;

/// One watch of the stream, as responses: `created`, its events (those
/// ready at once together), then the response that ends it. Ends silently
/// once cancelled.
struct OneWatch {
    id: i64,
    phase: Phase,
    /// Completes (with an error) when the stream drops the sender: cancelled.
    canceled: oneshot::Receiver<()>,
    /// Its identity's watch slot, given back when it is dropped.
    _slot: WatchSlot,
}

enum Phase {
    Starting(Pin<Box<dyn Future<Output = Result<watch::WatchStream, Status>> + Send>>),
    Running(watch::WatchStream),
    /// Events were sent in the same poll that read the status ending it.
    Ending(Status),
    Over,
}

impl Stream for OneWatch {
    type Item = WatchResponse;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchResponse>> {
        let this = &mut *self;
        if matches!(this.phase, Phase::Over) || Pin::new(&mut this.canceled).poll(cx).is_ready() {
            this.phase = Phase::Over;
            return Poll::Ready(None);
        }
        let id = this.id;
        match &mut this.phase {
            Phase::Starting(started) => {
                let started = ready!(started.as_mut().poll(cx));
                let (phase, response) = match started {
                    Ok(events) => (
                        Phase::Running(events),
                        WatchResponse { watch_id: id, created: true, ..Default::default() },
                    ),
                    Err(status) => (Phase::Over, ended(id, &status)),
                };
                this.phase = phase;
                Poll::Ready(Some(response))
            }
            Phase::Running(events) => {
                let (mut batch, mut bytes, mut end) = (Vec::new(), 0, None);
                while bytes < RESPONSE_EVENT_BYTES {
                    match events.as_mut().poll_next(cx) {
                        Poll::Ready(Some(Ok(event))) => {
                            bytes += prost::Message::encoded_len(&event);
                            batch.push(event);
                        }
                        Poll::Ready(Some(Err(status))) => {
                            end = Some(status);
                            break;
                        }
                        Poll::Ready(None) => {
                            end = Some(Status::unavailable("the watch ended; resume it"));
                            break;
                        }
                        Poll::Pending => break,
                    }
                }
                match (batch.is_empty(), end) {
                    (true, None) => Poll::Pending,
                    (true, Some(status)) => {
                        this.phase = Phase::Over;
                        Poll::Ready(Some(ended(id, &status)))
                    }
                    (false, end) => {
                        if let Some(status) = end {
                            this.phase = Phase::Ending(status);
                        }
                        Poll::Ready(Some(WatchResponse {
                            watch_id: id,
                            events: batch,
                            ..Default::default()
                        }))
                    }
                }
            }
            Phase::Ending(status) => {
                let response = ended(id, status);
                this.phase = Phase::Over;
                Poll::Ready(Some(response))
            }
            Phase::Over => Poll::Ready(None),
        }
    }
}

/// The last response of watch `id`, ended by `status`.
fn ended(id: i64, status: &Status) -> WatchResponse {
    WatchResponse {
        watch_id: id,
        canceled: true,
        code: status.code() as i32,
        message: status.message().to_string(),
        details: status.details().to_vec(),
        events: Vec::new(),
        created: false,
    }
}

impl Stream for Shared {
    type Item = Result<WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(answer) = this.answers.pop_front() {
                return Poll::Ready(Some(Ok(answer)));
            }
            let Some(requests) = this.requests.as_mut() else { break };
            match requests.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(request))) => {
                    if let Err(status) = this.handle(request) {
                        this.requests = None;
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    this.requests = None;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => this.requests = None,
                Poll::Pending => break,
            }
        }
        match this.watches.poll_next_unpin(cx) {
            Poll::Ready(Some(response)) => {
                if response.canceled {
                    this.open.remove(&response.watch_id);
                }
                Poll::Ready(Some(Ok(response)))
            }
            // No watch open: the stream ends once the client can open none.
            Poll::Ready(None) if this.requests.is_none() => Poll::Ready(None),
            Poll::Ready(None) | Poll::Pending => {
                // Checked only before waiting (a busy stream is polled again
                // anyway, and its watches end when the store stops).
                if this.requests.is_some() && this.stopping.as_mut().poll(cx).is_ready() {
                    this.requests = None;
                    if this.watches.is_empty() {
                        return Poll::Ready(None);
                    }
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_api::v1::WatchEvent;
    use tonic::Code;

    #[test]
    fn an_ended_watch_carries_the_status_that_would_end_a_single_watch() {
        let status = Status::out_of_range("compacted");
        let response = ended(7, &status);
        assert!(response.canceled && !response.created);
        assert_eq!((response.watch_id, response.code), (7, Code::OutOfRange as i32));
        assert_eq!(response.message, "compacted");
    }

    fn running(events: Vec<Result<WatchEvent, Status>>) -> (OneWatch, oneshot::Sender<()>) {
        let quota = WatchQuota::new(1, u64::MAX, Default::default());
        let (cancel, canceled) = oneshot::channel();
        let phase = Phase::Running(Box::pin(tokio_stream::iter(events)));
        let slot = quota.acquire("someone").unwrap();
        (OneWatch { id: 3, phase, canceled, _slot: slot }, cancel)
    }

    fn event(revision: i64) -> Result<WatchEvent, Status> {
        Ok(WatchEvent { resource_version: revision, ..Default::default() })
    }

    /// The events ready at once go in one response; the end follows in a
    /// response of its own, as the status a single watch would end with
    /// (UNAVAILABLE when the watch's stream ended without one), then
    /// nothing.
    #[tokio::test]
    async fn a_watch_sends_its_ready_events_together_then_how_it_ended() {
        let revisions =
            |r: &WatchResponse| r.events.iter().map(|e| e.resource_version).collect::<Vec<_>>();
        let (watch, _cancel) = running(vec![event(1), event(2), event(3)]);
        let responses: Vec<WatchResponse> = watch.collect().await;
        assert_eq!(responses.len(), 2, "{responses:?}");
        assert_eq!(revisions(&responses[0]), [1, 2, 3]);
        assert!(!responses[0].canceled && responses[0].watch_id == 3);
        assert!(responses[1].canceled && responses[1].events.is_empty());
        assert_eq!(responses[1].code, Code::Unavailable as i32);

        let compacted = Status::out_of_range("compacted");
        let (watch, _cancel) = running(vec![event(4), Err(compacted)]);
        let responses: Vec<WatchResponse> = watch.collect().await;
        assert_eq!(revisions(&responses[0]), [4]);
        assert_eq!(
            (responses[1].code, responses[1].message.as_str()),
            (Code::OutOfRange as i32, "compacted")
        );
        assert_eq!(responses.len(), 2);
    }

    /// A cancelled watch ends silently: the stream answers the cancel.
    #[tokio::test]
    async fn a_cancelled_watch_sends_nothing_more() {
        let (watch, cancel) = running(vec![event(1), event(2)]);
        drop(cancel);
        assert!(watch.collect::<Vec<_>>().await.is_empty());
    }
}
