//! Watches per identity: one caller (a user, a service account, a
//! certificate's subject) holds at most `--max-watches-per-identity` open
//! watch streams; one more is refused RESOURCE_EXHAUSTED
//! (`TOO_MANY_WATCHES`, with a retry delay), so no one identity can hold
//! the store's watch memory. The pages its watches read from the database
//! share one budget of bytes per identity (`--max-watch-bytes-per-identity`,
//! [`crate::watch::budget`]); beyond that a stream holds its HTTP/2 send
//! buffer, bounded per stream by the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::watch::budget::Budget;

/// How long a refused caller is told to wait.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Open watches by identity.
#[derive(Debug)]
pub struct WatchQuota {
    max: usize,
    max_bytes: u64,
    held: Mutex<HashMap<String, Usage>>,
    /// Page bytes held by every identity's watches.
    page_bytes: Gauge,
}

/// One identity's watches and their budget of page bytes.
#[derive(Debug)]
struct Usage {
    watches: usize,
    budget: Arc<Budget>,
}

/// One open watch of one identity; released when dropped (with its
/// stream).
#[derive(Debug)]
pub struct WatchSlot {
    quota: Arc<WatchQuota>,
    subject: String,
    /// The page bytes its identity's watches share.
    pub budget: Arc<Budget>,
}

impl WatchQuota {
    /// At most `max` watches and `max_bytes` of database pages held by
    /// each identity's watches; `page_bytes` counts every identity's.
    pub fn new(max: usize, max_bytes: u64, page_bytes: Gauge) -> Arc<Self> {
        Arc::new(Self { max: max.max(1), max_bytes, held: Mutex::new(HashMap::new()), page_bytes })
    }

    /// A slot for one more watch of `subject`, or RESOURCE_EXHAUSTED.
    pub fn acquire(self: &Arc<Self>, subject: &str) -> Result<WatchSlot, Status> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let usage = held.entry(subject.to_string()).or_insert_with(|| Usage {
            watches: 0,
            budget: Budget::new(self.max_bytes, self.page_bytes.clone()),
        });
        let count = usage.watches;
        if count >= self.max {
            let mut details = ErrorDetails::with_error_info(
                gantry_api::reasons::TOO_MANY_WATCHES,
                gantry_api::reasons::ERROR_DOMAIN,
                HashMap::from([("limit".to_string(), self.max.to_string())]),
            );
            details.set_retry_info(Some(RETRY_AFTER));
            return Err(Status::with_error_details(
                Code::ResourceExhausted,
                format!(
                    "{subject} holds {count} watches, the most one identity may (--max-watches-per-identity); \
                     close one, or watch several gateways with one label selector"
                ),
                details,
            ));
        }
        usage.watches += 1;
        let budget = usage.budget.clone();
        Ok(WatchSlot { quota: self.clone(), subject: subject.to_string(), budget })
    }

    /// How many watches `subject` holds.
    pub fn held(&self, subject: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.get(subject).map_or(0, |u| u.watches)
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut held = self.quota.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(usage) = held.get_mut(&self.subject) {
            usage.watches = usage.watches.saturating_sub(1);
            if usage.watches == 0 {
                held.remove(&self.subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_identity_has_its_own_count_and_slots_come_back() {
        let quota = WatchQuota::new(2, 1 << 20, Gauge::default());
        let a1 = quota.acquire("alice").unwrap();
        let _a2 = quota.acquire("alice").unwrap();
        let refused = quota.acquire("alice").unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(refused.message().contains("alice holds 2 watches"), "{refused:?}");
        let details = refused.get_error_details();
        assert_eq!(details.retry_info().and_then(|r| r.retry_delay), Some(RETRY_AFTER));
        assert_eq!(
            details.error_info().map(|i| i.reason.as_str()),
            Some(gantry_api::reasons::TOO_MANY_WATCHES)
        );
        // Another identity is not affected; a closed watch frees a slot.
        let _b = quota.acquire("bob").unwrap();
        // An identity's watches share one budget of page bytes.
        assert!(Arc::ptr_eq(&a1.budget, &_a2.budget));
        assert!(!Arc::ptr_eq(&a1.budget, &_b.budget));
        drop(a1);
        assert_eq!(quota.held("alice"), 1);
        let _a3 = quota.acquire("alice").unwrap();
        assert_eq!(quota.held("nobody"), 0);
    }
}
