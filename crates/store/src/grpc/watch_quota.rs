//! Watches per identity: one caller (a user, a service account, a
//! certificate's subject) holds at most `--max-watches-per-identity` open
//! watch streams; one more is refused RESOURCE_EXHAUSTED
//! (`TOO_MANY_WATCHES`, with a retry delay), so no one identity can hold
//! the store's watch memory. Each stream's own memory is bounded (one page
//! from the database while it catches up, and its HTTP/2 window), so the
//! bytes one identity holds are bounded by the count too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// How long a refused caller is told to wait.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Open watches by identity.
#[derive(Debug)]
pub struct WatchQuota {
    max: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// One open watch of one identity; released when dropped (with its
/// stream).
#[derive(Debug)]
pub struct WatchSlot {
    quota: Arc<WatchQuota>,
    subject: String,
}

impl WatchQuota {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { max: max.max(1), held: Mutex::new(HashMap::new()) })
    }

    /// A slot for one more watch of `subject`, or RESOURCE_EXHAUSTED.
    pub fn acquire(self: &Arc<Self>, subject: &str) -> Result<WatchSlot, Status> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = held.entry(subject.to_string()).or_insert(0);
        if *count >= self.max {
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
        *count += 1;
        Ok(WatchSlot { quota: self.clone(), subject: subject.to_string() })
    }

    /// How many watches `subject` holds.
    pub fn held(&self, subject: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.get(subject).copied().unwrap_or(0)
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut held = self.quota.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.subject) {
            *count = count.saturating_sub(1);
            if *count == 0 {
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
        let quota = WatchQuota::new(2);
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
        drop(a1);
        assert_eq!(quota.held("alice"), 1);
        let _a3 = quota.acquire("alice").unwrap();
        assert_eq!(quota.held("nobody"), 0);
    }
}
