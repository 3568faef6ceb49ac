//! The tailer: feeds the watch cache from the events table (changes
//! committed by other replicas, or anything the writer could not publish).

use std::sync::Arc;
use std::time::Duration;

use gantry_runtime::Shutdown;

use super::hub::{WatchHub, WATCH_PAGE_BYTES};
use crate::storage::{Storage, StorageError};

/// Events read per query while catching up.
pub const TAIL_PAGE: usize = 1000;

/// Feeds `hub` from the events table whenever woken (LISTEN/NOTIFY, a gap
/// seen by the writer) and at least every `poll`, until `shutdown`.
pub async fn run(
    storage: Arc<dyn Storage>,
    hub: Arc<WatchHub>,
    poll: Duration,
    shutdown: Shutdown,
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
    let mut failures: u32 = 0;
    loop {
        tokio::select! {
            () = shutdown.wait() => break,
            () = wake.notified() => {}
            () = tokio::time::sleep(poll) => {}
        }
        if catch_up(storage.as_ref(), &hub).await {
            failures = 0;
        } else {
            // Do not hammer a failing database: back off before the next
            // attempt, however often the tailer is woken meanwhile.
            let delay = gantry_core::retry::Backoff::default().delay(failures, fastrand::f64());
            failures = failures.saturating_add(1);
            tokio::select! {
                () = shutdown.wait() => break,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
    listener.abort();
}

/// Publishes every event after the hub's head; `false` when the events
/// table could not be read.
async fn catch_up(storage: &dyn Storage, hub: &WatchHub) -> bool {
    loop {
        let head = hub.head();
        match storage.events_after(head, TAIL_PAGE, WATCH_PAGE_BYTES).await {
            Ok(events) => {
                let full = events.len() == TAIL_PAGE;
                hub.publish(events);
                if !full {
                    return true;
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
                return true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the events table");
                return false;
            }
        }
    }
}
