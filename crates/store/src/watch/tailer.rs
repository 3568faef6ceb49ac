//! The tailer: feeds the watch cache from the events table (changes
//! committed by other replicas, or anything the writer could not publish).

use std::sync::Arc;
use std::time::Duration;

use gantry_runtime::Shutdown;

use super::hub::{WatchHub, WATCH_PAGE_BYTES};
use crate::storage::{Storage, StorageError};

/// Events read per query while catching up.
pub const TAIL_PAGE: usize = 1000;

/// Feeds `hub` from the events table whenever woken (another replica's
/// commit notified, a gap seen by the writer, a commit of its own whose
/// outcome is unknown) and at least every `poll`, until `shutdown`.
pub async fn run(
    storage: Arc<dyn Storage>,
    hub: Arc<WatchHub>,
    poll: Duration,
    shutdown: Shutdown,
) {
    let wake = hub.wake_tailer.clone();
    let listener = {
        let (storage, hub) = (storage.clone(), hub.clone());
        tokio::spawn(async move {
            let committed = |revision| {
                if needs_reading(revision, hub.head()) {
                    hub.wake_tailer.notify_one();
                }
            };
            let mut attempt = 0;
            loop {
                if let Err(e) = storage.listen_for_commits(&committed).await {
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

/// Whether a commit of `revision` (`None`: unknown) must be read from the
/// events table into a hub whose head is `head`. The writer publishes this
/// process's own commits itself, so their notifications find them there
/// already; the hub's head has no gaps, so a revision at or below it is
/// held with everything before it.
fn needs_reading(revision: Option<i64>, head: i64) -> bool {
    revision.is_none_or(|revision| revision > head)
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

#[cfg(test)]
mod tests {
    use super::needs_reading;

    #[test]
    fn only_commits_the_hub_does_not_hold_are_read() {
        // This process's own commit, already published by the writer.
        assert!(!needs_reading(Some(7), 7));
        assert!(!needs_reading(Some(6), 7));
        // Another replica's commit, or one the writer has not published yet.
        assert!(needs_reading(Some(8), 7));
        // Unknown: read.
        assert!(needs_reading(None, 7));
    }
}
