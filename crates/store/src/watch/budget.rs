//! The bytes one identity's watches hold of their own: the page each reads
//! from the database (initial objects, or events older than the watch
//! cache) while its subscriber drains it. Live events are shared with the
//! watch cache and are not charged.
//!
//! A watch reserves a page's worth before it reads one and keeps the
//! page's real size until the page is drained. When its identity's
//! watches already hold `--max-watch-bytes-per-identity`, the watch waits
//! (nothing is skipped) until another of them drains a page: an identity
//! that opens many watches and reads none holds at most its budget, not a
//! page per watch. An identity holding nothing may always take one page.
//! A watch waits at most [`BUDGET_WAIT`]: a client that reads one of its
//! watches while leaving the pages of others unread is then told so
//! (the stream ends, saying where to resume) instead of stalling.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

/// The longest a watch waits for its identity's budget.
pub const BUDGET_WAIT: Duration = Duration::from_secs(30);

/// One identity's budget of watch page bytes.
#[derive(Debug)]
pub struct Budget {
    max: u64,
    held: Mutex<u64>,
    freed: Notify,
    /// Page bytes every identity's watches hold.
    total: Gauge,
}

/// Bytes held of a [`Budget`]; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub fn new(max: u64, total: Gauge) -> Arc<Self> {
        Arc::new(Self { max, held: Mutex::new(0), freed: Notify::new(), total })
    }

    /// `bytes` of the budget, once the identity's other watches hold
    /// little enough (or nothing).
    pub async fn charge(self: &Arc<Self>, bytes: u64) -> Charge {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a release between the check
            // and the wait still wakes it.
            freed.as_mut().enable();
            if let Some(charge) = self.try_charge(bytes) {
                return charge;
            }
            freed.await;
        }
    }

    /// As [`Budget::charge`], waiting at most `limit`; `None` past it.
    pub async fn charge_within(self: &Arc<Self>, bytes: u64, limit: Duration) -> Option<Charge> {
        tokio::time::timeout(limit, self.charge(bytes)).await.ok()
    }

    fn try_charge(self: &Arc<Self>, bytes: u64) -> Option<Charge> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *held != 0 && *held + bytes > self.max {
            return None;
        }
        *held += bytes;
        self.total.inc_by(bytes as i64);
        Some(Charge { budget: self.clone(), bytes })
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        *self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn release(&self, bytes: u64) {
        {
            let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *held = held.saturating_sub(bytes);
        }
        self.total.dec_by(bytes as i64);
        self.freed.notify_waiters();
    }
}

impl Charge {
    /// Holds `bytes` instead (a page's real size once read), without
    /// waiting: a page read is already in memory.
    pub fn resize(&mut self, bytes: u64) {
        let budget = &self.budget;
        if bytes >= self.bytes {
            let more = bytes - self.bytes;
            *budget.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += more;
            budget.total.inc_by(more as i64);
        } else {
            budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_watch_waits_for_its_identitys_pages_to_drain_and_one_page_always_fits() {
        let total = Gauge::default();
        let budget = Budget::new(100, total.clone());
        let mut first = budget.charge(60).await;
        let second = budget.charge(40).await;
        assert_eq!((budget.held(), total.get()), (100, 100));

        // Full: the third waits until a page drains.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.charge(50).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "charged past the budget");
        // A page read smaller than reserved gives the rest back at once.
        first.resize(20);
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "60 held, 50 more would pass 100");
        drop(second);
        let third = waiting.await.unwrap();
        assert_eq!((budget.held(), total.get()), (70, 70));
        drop((first, third));
        assert_eq!((budget.held(), total.get()), (0, 0));

        // With nothing held, a page larger than the whole budget passes.
        let large = budget.charge(500).await;
        assert_eq!(budget.held(), 500);
        // A wait is bounded.
        let started = tokio::time::Instant::now();
        assert!(budget.charge_within(10, BUDGET_WAIT).await.is_none());
        assert_eq!(started.elapsed(), BUDGET_WAIT);
        drop(large);
        assert!(budget.charge_within(10, BUDGET_WAIT).await.is_some());
    }
}
