//! The compactor: trims the event history to the retention, so the events
//! table stays bounded; watches older than it answer COMPACTED.

use std::sync::Arc;
use std::time::Duration;

use gantry_runtime::Shutdown;

use crate::storage::{Retention, Storage};

/// Compacts the event history every `interval` until `shutdown`.
pub async fn run(
    storage: Arc<dyn Storage>,
    retention: Retention,
    interval: Duration,
    shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            () = shutdown.wait() => break,
            () = tokio::time::sleep(interval) => {}
        }
        match storage.compact(retention).await {
            Ok(compacted) => tracing::debug!(compacted, "event history compacted"),
            Err(e) => tracing::warn!(error = %e, "compaction failed; retrying next interval"),
        }
    }
}
