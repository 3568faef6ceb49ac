//! Several watches on one stream (`gantry.v1` Watch), for a subscriber
//! that holds many: each [`SharedWatch::watch`] yields what a WatchGateways
//! stream with the same request would, ending with the same status, while
//! the connection carries one HTTP/2 stream for all of them.
//!
//! A task routes the responses to the watches. A watch whose reader falls
//! behind holds the others back once its buffer is full (as every watch of
//! an HTTP/2 stream shares its flow control); the store then ends the
//! watches that fell too far behind, each with the revision to resume from.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use gantry_api::v1::gateway_service_client::GatewayServiceClient;
use gantry_api::v1::watch_request::Request as Ask;
use gantry_api::v1::{
    WatchCancel, WatchCreate, WatchEvent, WatchGatewaysRequest, WatchRequest, WatchResponse,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Code, Status};

/// Events a watch buffers for its reader before it holds the others back.
const BUFFER: usize = 64;

/// One Watch stream and the watches it carries.
#[derive(Debug)]
pub struct SharedWatch {
    requests: mpsc::UnboundedSender<WatchRequest>,
    routes: Arc<Mutex<Routes>>,
    next_id: AtomicI64,
}

#[derive(Debug, Default)]
struct Routes {
    watches: HashMap<i64, Route>,
    /// Why the stream ended, once it did.
    ended: Option<Status>,
}

#[derive(Debug)]
struct Route {
    /// Answered when the store says whether the watch started.
    created: Option<oneshot::Sender<Result<(), Status>>>,
    events: mpsc::Sender<Result<WatchEvent, Status>>,
}

impl SharedWatch {
    /// Opens a Watch stream on `client`'s connection.
    pub async fn open<T>(mut client: GatewayServiceClient<T>) -> Result<Self, Status>
    where
        T: tonic::client::GrpcService<tonic::body::Body>,
        T::Error: Into<tonic::codegen::StdError>,
        T::ResponseBody: http_body::Body<Data = tonic::codegen::Bytes> + Send + 'static,
        <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
    {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let responses = client.watch(UnboundedReceiverStream::new(outgoing)).await?.into_inner();
        let routes = Arc::new(Mutex::new(Routes::default()));
        tokio::spawn(route(responses, routes.clone()));
        Ok(Self { requests, routes, next_id: AtomicI64::new(1) })
    }

    /// Starts one watch on the stream: its events once the store has
    /// started it, or the status it was refused with.
    pub async fn watch(&self, request: WatchGatewaysRequest) -> Result<SharedEvents, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (created, started) = oneshot::channel();
        let (events, received) = mpsc::channel(BUFFER);
        {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(status) = &routes.ended {
                return Err(status.clone());
            }
            routes.watches.insert(id, Route { created: Some(created), events });
        }
        let create = WatchCreate { watch_id: id, watch: Some(request) };
        if self.requests.send(WatchRequest { request: Some(Ask::Create(create)) }).is_err() {
            return Err(stream_gone());
        }
        started.await.unwrap_or_else(|_| Err(stream_gone()))?;
        Ok(SharedEvents {
            id,
            events: ReceiverStream::new(received),
            requests: self.requests.clone(),
            over: false,
        })
    }
}

fn stream_gone() -> Status {
    Status::unavailable("the shared watch stream ended; open another")
}

/// The status a response that ends a watch carries: `None` when the client
/// cancelled it.
fn end_status(response: &WatchResponse) -> Option<Status> {
    (response.code != 0).then(|| {
        Status::with_details(
            Code::from(response.code),
            response.message.clone(),
            response.details.clone().into(),
        )
    })
}

/// Delivers each response to its watch until the stream ends, then ends
/// every watch still open with the stream's status.
async fn route(mut responses: tonic::Streaming<WatchResponse>, routes: Arc<Mutex<Routes>>) {
    let ended = loop {
        let response = match responses.next().await {
            Some(Ok(response)) => response,
            Some(Err(status)) => break status,
            None => break stream_gone(),
        };
        let id = response.watch_id;
        let events = {
            let mut routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(route) = routes.watches.get_mut(&id) else { continue };
            if response.created {
                if let Some(created) = route.created.take() {
                    let _ = created.send(Ok(()));
                }
            }
            if response.canceled {
                let mut route = routes.watches.remove(&id).expect("present");
                let status =
                    end_status(&response).unwrap_or_else(|| Status::cancelled("cancelled"));
                match route.created.take() {
                    Some(created) => {
                        let _ = created.send(Err(status));
                        continue;
                    }
                    None => (route.events, Some(status)),
                }
            } else {
                (route.events.clone(), None)
            }
        };
        let (sender, end) = events;
        for event in response.events {
            // A reader that went away has cancelled its watch.
            let _ = sender.send(Ok(event)).await;
        }
        if let Some(status) = end {
            let _ = sender.send(Err(status)).await;
        }
    };
    let open = {
        let mut routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
        routes.ended = Some(ended.clone());
        std::mem::take(&mut routes.watches)
    };
    for (_, mut route) in open {
        match route.created.take() {
            Some(created) => drop(created.send(Err(ended.clone()))),
            None => drop(route.events.send(Err(ended.clone())).await),
        }
    }
}

/// The events of one watch of a [`SharedWatch`]; cancelled when dropped.
/// Ends after an `Err`, as a WatchGateways stream does.
#[derive(Debug)]
pub struct SharedEvents {
    id: i64,
    events: ReceiverStream<Result<WatchEvent, Status>>,
    requests: mpsc::UnboundedSender<WatchRequest>,
    over: bool,
}

impl Stream for SharedEvents {
    type Item = Result<WatchEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.over {
            return Poll::Ready(None);
        }
        let next = Pin::new(&mut self.events).poll_next(cx);
        if matches!(next, Poll::Ready(Some(Err(_)) | None)) {
            self.over = true;
        }
        next
    }
}

impl Drop for SharedEvents {
    fn drop(&mut self) {
        if !self.over {
            let cancel = WatchCancel { watch_id: self.id };
            let _ = self.requests.send(WatchRequest { request: Some(Ask::Cancel(cancel)) });
        }
    }
}
