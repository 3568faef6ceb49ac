//! Retry policy: capped exponential backoff with jitter, so that many
//! clients retrying after the same failure spread out instead of arriving
//! together, and nothing retries in a tight loop.

use std::time::Duration;

/// Capped exponential backoff with proportional jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Fraction of the delay that is random, in `[0, 1]`: 0.5 means the
    /// delay is uniformly in `[0.5 d, d]`.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(100), max: Duration::from_secs(10), jitter: 0.5 }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based), given a uniform
    /// random number `random` in `[0, 1)`.
    pub fn delay(&self, attempt: u32, random: f64) -> Duration {
        let factor = 2f64.powi(i32::try_from(attempt.min(62)).unwrap_or(62));
        let full = (self.initial.as_secs_f64() * factor).min(self.max.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0);
        let random = random.clamp(0.0, 1.0);
        Duration::from_secs_f64(full * (1.0 - jitter * random))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            jitter: 0.0,
        };
        let delays: Vec<_> = (0..6).map(|a| b.delay(a, 0.7).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX, 0.0), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let b = Backoff::default();
        for r in [0.0, 0.25, 0.999] {
            let d = b.delay(3, r);
            assert!(d <= Duration::from_millis(800) && d >= Duration::from_millis(400), "{d:?}");
        }
        assert!(b.delay(3, 0.9) < b.delay(3, 0.1), "different randoms spread out");
    }
}
