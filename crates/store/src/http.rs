//! What the store answers on its admin port (the runtime's router):
//! `/readyz` when the database answers, `/metrics` with the watch cache's
//! gauges refreshed.

use std::sync::Arc;
use std::time::Duration;

use gantry_runtime::admin::Admin;

use crate::metrics::Metrics;
use crate::storage::Storage;
use crate::watch::hub::WatchHub;

/// The store's side of the admin port.
#[derive(Debug)]
pub struct StoreAdmin {
    pub storage: Arc<dyn Storage>,
    pub metrics: Arc<Metrics>,
    pub hub: Arc<WatchHub>,
}

#[tonic::async_trait]
impl Admin for StoreAdmin {
    async fn readiness(&self) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(2), self.storage.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("database not ready: {e}")),
            Err(_) => Err("database not ready: no answer within 2s".to_string()),
        }
    }

    fn metrics(&self) -> String {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.watch_subscribers.set(gauge(self.hub.subscribers()));
        self.metrics.watch_cache_events.set(gauge(self.hub.retained()));
        let bytes = i64::try_from(self.hub.retained_bytes()).unwrap_or(i64::MAX);
        self.metrics.watch_cache_bytes.set(bytes);
        self.metrics.watch_revision.set(self.hub.head());
        self.metrics.encode()
    }
}
