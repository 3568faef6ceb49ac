//! A log rate limit: refusals are logged as an audit trail, but one client
//! hammering with a bad token must not fill the disk.

use std::time::SystemTime;

/// At most `per_second` log lines a second; the rest are counted and the
/// count is reported with the next line let through.
#[derive(Debug)]
pub struct RateLimit {
    per_second: u32,
    state: std::sync::Mutex<(u64, u32, u64)>,
}

impl RateLimit {
    pub fn new(per_second: u32) -> Self {
        Self { per_second, state: std::sync::Mutex::new((0, 0, 0)) }
    }

    /// `Some(suppressed since the last line)` when a line may be written.
    pub fn admit(&self) -> Option<u64> {
        let second =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (window, used, suppressed) = &mut *state;
        if *window != second {
            *window = second;
            *used = 0;
        }
        if *used < self.per_second {
            *used += 1;
            Some(std::mem::take(suppressed))
        } else {
            *suppressed += 1;
            None
        }
    }
}
