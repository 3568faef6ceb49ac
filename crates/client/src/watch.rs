//! List-then-watch with resume: the loop every subscriber of the store
//! runs. Every (re)list is delivered page by page, as kube-rs's watcher
//! delivers one: [`WatchUpdate::Init`], the pages
//! ([`WatchUpdate::InitPage`]), [`WatchUpdate::InitDone`]; then changes in
//! revision order. A subscriber never holds more than a page of decoded
//! gateways it did not ask to keep (a whole list of 100,000 decoded at
//! once was a quarter of a GiB). After a
//! disconnect it resumes from the last revision it saw; when that revision
//! was compacted (OUT_OF_RANGE) it relists. Between attempts it backs off
//! with jitter; it never spins.

use std::time::Duration;

use gantry_api::v1::{EventType, Gateway, ListGatewaysRequest, WatchGatewaysRequest};
use gantry_core::retry::Backoff;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Code, Status};

use crate::GatewayClient;

/// One step of the watched set.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchUpdate {
    /// A (re)list begins: the pages up to [`WatchUpdate::InitDone`] are
    /// the complete selected set at `revision`.
    Init { revision: i64 },
    /// One page of that list.
    InitPage { gateways: Vec<Gateway>, revision: i64 },
    /// The list is complete: a gateway cached before it and not in its
    /// pages is gone; changes after `revision` follow.
    InitDone { revision: i64 },
    /// A gateway was added or changed (or entered the selection).
    Applied { gateway: Gateway, revision: i64 },
    /// A gateway was removed (or left the selection); its last state.
    Deleted { gateway: Gateway, revision: i64 },
    /// Every change up to `revision` has been delivered.
    Bookmark { revision: i64 },
    /// The loop lost the store (it cannot be reached, is unavailable, or
    /// ended the watch) and tries again in `retry_in`; `revision` is that
    /// of the last update delivered (0: none yet). Nothing about the gateways
    /// changed; it is said so that the subscriber can report it (an
    /// operator sees why nothing happens) rather than wait in silence.
    Interrupted { code: Code, message: String, retry_in: Duration, revision: i64 },
}

impl WatchUpdate {
    /// The revision this update brings the subscriber to.
    pub fn revision(&self) -> i64 {
        match self {
            WatchUpdate::Init { revision }
            | WatchUpdate::InitPage { revision, .. }
            | WatchUpdate::InitDone { revision }
            | WatchUpdate::Applied { revision, .. }
            | WatchUpdate::Deleted { revision, .. }
            | WatchUpdate::Bookmark { revision }
            | WatchUpdate::Interrupted { revision, .. } => *revision,
        }
    }
}

/// What to watch and how patiently.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub label_selector: String,
    /// Only this gateway, when set.
    pub name: Option<String>,
    /// Backoff between failed attempts.
    pub backoff: Backoff,
    /// Updates buffered for a slow consumer before the loop stops reading
    /// (the store then ends the watch, and the loop resumes later).
    pub buffer: usize,
    /// Page size of the lists.
    pub page_size: i32,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            label_selector: String::new(),
            name: None,
            backoff: Backoff::default(),
            buffer: 256,
            page_size: 500,
        }
    }
}

/// Whether the store said the watched revision is outside its history:
/// older than what it keeps (OUT_OF_RANGE, reason REVISION_COMPACTED) or
/// newer than its head (reason REVISION_FUTURE, as after a restore from a
/// backup). Either way the subscriber relists. Other OUT_OF_RANGE errors are
/// not.
pub fn is_compacted(status: &Status) -> bool {
    use tonic_types::StatusExt as _;
    status.code() == Code::OutOfRange
        && status.get_details_error_info().is_some_and(|info| {
            use gantry_api::reasons::{REVISION_COMPACTED, REVISION_FUTURE};
            info.reason == REVISION_COMPACTED || info.reason == REVISION_FUTURE
        })
}

/// Errors that retrying cannot fix: the caller must change something.
fn is_permanent(code: Code) -> bool {
    matches!(
        code,
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::Unimplemented
    )
}

/// Starts the loop. The stream ends after a permanent error (yielded as
/// `Err`) or when dropped.
pub fn list_then_watch(
    client: GatewayClient,
    options: WatchOptions,
) -> ReceiverStream<Result<WatchUpdate, Status>> {
    let (tx, rx) = mpsc::channel(options.buffer.max(1));
    tokio::spawn(async move {
        let mut sink = Sink { tx, delivered: 0 };
        if let Err(status) = run(client, options, &mut sink).await {
            let _ = sink.tx.send(Err(status)).await;
        }
    });
    ReceiverStream::new(rx)
}

/// Why the loop stopped: the consumer left, or a permanent error.
enum Stop {
    Closed,
    Permanent(Status),
}

impl From<Status> for Stop {
    fn from(status: Status) -> Self {
        Stop::Permanent(status)
    }
}

async fn run(
    mut client: GatewayClient,
    options: WatchOptions,
    sink: &mut Sink,
) -> Result<(), Status> {
    let mut revision: Option<i64> = None;
    let mut failures: u32 = 0;
    loop {
        let attempt = async {
            let from = match revision {
                Some(r) => r,
                None => {
                    let listed = list(&mut client, &options, sink).await?;
                    revision = Some(listed);
                    listed
                }
            };
            watch(&mut client, &options, from, sink, &mut revision, &mut failures).await
        };
        let status = match attempt.await {
            Ok(()) => Status::unavailable("the watch stream ended"),
            Err(Stop::Closed) => return Ok(()),
            Err(Stop::Permanent(status)) if is_permanent(status.code()) => return Err(status),
            Err(Stop::Permanent(status)) => status,
        };
        if is_compacted(&status) {
            tracing::info!(revision, "watch revision compacted; relisting");
            revision = None;
            // A relist right away is normal; relisting again and again
            // (history shorter than the write rate) backs off like any
            // other failure.
            if failures == 0 {
                failures = 1;
                continue;
            }
        }
        let delay = options.backoff.delay(failures, fastrand::f64());
        failures = failures.saturating_add(1);
        tracing::debug!(code = ?status.code(), message = status.message(), retry_in = ?delay, "watch interrupted; resuming");
        let interrupted = WatchUpdate::Interrupted {
            code: status.code(),
            message: status.message().to_string(),
            retry_in: delay,
            revision: sink.delivered,
        };
        if sink.send(interrupted).await.is_err() {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = sink.tx.closed() => return Ok(()),
        }
    }
}

/// Where updates go, and the revision of the last one delivered.
struct Sink {
    tx: mpsc::Sender<Result<WatchUpdate, Status>>,
    delivered: i64,
}

impl Sink {
    async fn send(&mut self, update: WatchUpdate) -> Result<(), Stop> {
        let revision = update.revision();
        self.tx.send(Ok(update)).await.map_err(|_| Stop::Closed)?;
        self.delivered = revision;
        Ok(())
    }
}

/// Lists page by page, delivering each as it comes; the list's revision.
async fn list(
    client: &mut GatewayClient,
    options: &WatchOptions,
    sink: &mut Sink,
) -> Result<i64, Stop> {
    let (mut token, mut revision) = (String::new(), None);
    loop {
        let page = client
            .list_gateways(ListGatewaysRequest {
                page_size: options.page_size,
                page_token: token,
                label_selector: options.label_selector.clone(),
            })
            .await?
            .into_inner();
        // The list is the snapshot at the first page's revision.
        let revision = match revision {
            Some(r) => r,
            None => {
                sink.send(WatchUpdate::Init { revision: page.resource_version }).await?;
                *revision.insert(page.resource_version)
            }
        };
        let wanted = |g: &Gateway| {
            options.name.as_deref().is_none_or(|n| g.metadata.as_ref().is_some_and(|m| m.name == n))
        };
        let gateways: Vec<Gateway> = page.gateways.into_iter().filter(wanted).collect();
        if !gateways.is_empty() {
            sink.send(WatchUpdate::InitPage { gateways, revision }).await?;
        }
        if page.next_page_token.is_empty() {
            sink.send(WatchUpdate::InitDone { revision }).await?;
            return Ok(revision);
        }
        token = page.next_page_token;
    }
}

async fn watch(
    client: &mut GatewayClient,
    options: &WatchOptions,
    from: i64,
    sink: &mut Sink,
    revision: &mut Option<i64>,
    failures: &mut u32,
) -> Result<(), Stop> {
    let request = WatchGatewaysRequest {
        resource_version: from,
        send_initial_events: false,
        allow_bookmarks: true,
        label_selector: options.label_selector.clone(),
        name: options.name.clone().unwrap_or_default(),
    };
    let mut stream = client.watch_gateways(request).await?.into_inner();
    while let Some(event) = stream.next().await {
        let event = event?;
        *failures = 0;
        let at = event.resource_version;
        let update = match (event.r#type(), event.gateway) {
            (EventType::Added | EventType::Modified, Some(gateway)) => {
                WatchUpdate::Applied { gateway, revision: at }
            }
            (EventType::Deleted, Some(gateway)) => WatchUpdate::Deleted { gateway, revision: at },
            (EventType::Bookmark, _) => WatchUpdate::Bookmark { revision: at },
            (kind, _) => {
                tracing::warn!(?kind, revision = at, "skipping a malformed watch event");
                continue;
            }
        };
        sink.send(update).await?;
        *revision = Some(at);
    }
    Ok(())
}
