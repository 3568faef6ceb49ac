//! Background tasks of the store: the tailer that feeds the watch cache
//! from the events table (changes committed by other replicas, or anything
//! the writer could not publish), and the compactor of the event history.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::hub::WatchHub;
use crate::storage::{Retention, Storage, StorageError};

/// Events read per query while catching up.
pub const TAIL_PAGE: usize = 1000;

/// Completes when `stop` turns true.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Feeds `hub` from the events table whenever woken (LISTEN/NOTIFY, a gap
/// seen by the writer) and at least every `poll`, until `stop`.
pub async fn run_tailer(
    storage: Arc<dyn Storage>,
    hub: Arc<WatchHub>,
    poll: Duration,
    stop: watch::Receiver<bool>,
) {
    let wake = hub.wake_tailer.clone();
    let listener = {
        let (storage, wake) = (storage.clone(), wake.clone());
        tokio::spawn(async move {
            let mut attempt = 0;
            loop {
                if let Err(e) = storage.listen_for_commits(wake.clone()).await {
                    let delay =
                        gantry_core::retry::Backoff::default().delay(attempt, fastrand::f64());
                    tracing::warn!(error = %e, retry_in = ?delay, "commit notifications lost; polling meanwhile");
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(delay).await;
                }
            }
        })
    };
    loop {
        tokio::select! {
            () = stopped(stop.clone()) => break,
            () = wake.notified() => {}
            () = tokio::time::sleep(poll) => {}
        }
        catch_up(storage.as_ref(), &hub).await;
    }
    listener.abort();
}

async fn catch_up(storage: &dyn Storage, hub: &WatchHub) {
    loop {
        let head = hub.head();
        match storage.events_after(head, TAIL_PAGE).await {
            Ok(events) => {
                let full = events.len() == TAIL_PAGE;
                hub.publish(events);
                if !full {
                    return;
                }
            }
            Err(StorageError::Compacted { compacted, .. }) => {
                // This process missed events that are gone: its cache can no
                // longer be complete. Start over; subscribers resume (and
                // relist if their revision is gone too).
                tracing::error!(
                    head,
                    compacted,
                    "watch cache fell behind compaction; resetting it"
                );
                match storage.current_revision().await {
                    Ok(current) => hub.reset(current),
                    Err(e) => tracing::warn!(error = %e, "cannot read the current revision"),
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the events table");
                return;
            }
        }
    }
}

/// Compacts the event history every `interval` until `stop`.
pub async fn run_compactor(
    storage: Arc<dyn Storage>,
    retention: Retention,
    interval: Duration,
    stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = stopped(stop.clone()) => break,
            () = tokio::time::sleep(interval) => {}
        }
        match storage.compact(retention).await {
            Ok(compacted) => tracing::debug!(compacted, "event history compacted"),
            Err(e) => tracing::warn!(error = %e, "compaction failed; retrying next interval"),
        }
    }
}
