//! Backoff between attempts.

use std::time::Duration;

/// Exponential backoff with full jitter and a cap.
///
/// The delay before attempt `n + 1`, after attempt `n` failed (n ≥ 1), is a
/// uniformly random duration in `[0, min(cap, base × 2^(n−1))]` ("full
/// jitter", from Marc Brooker, *Exponential Backoff And Jitter*, AWS
/// Architecture Blog, 2015): retries of many jobs that failed together spread
/// out instead of hitting a sick dependency in waves. Computed with saturating
/// arithmetic, so any attempt number (even `u32::MAX`) gives at most `cap`.
///
/// With the defaults (base 1 s, cap 1 h) the upper bounds run 1 s, 2 s, 4 s,
/// … and reach the cap at attempt 13.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Upper bound of the first delay (default 1 s).
    pub base: Duration,
    /// Largest delay (default 1 hour).
    pub cap: Duration,
    /// Full jitter (default) or, when false, always the upper bound.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(3600),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// The upper bound of the delay after failed attempt `attempt` (1-based;
    /// 0 is treated as 1), before jitter.
    pub fn max_delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1);
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay after failed attempt `attempt`: [`RetryPolicy::max_delay`]
    /// with full jitter applied if enabled.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let max = self.max_delay(attempt);
        if !self.jitter {
            return max;
        }
        let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(fastrand::u64(0..=max_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_without_overflow() {
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(3600),
            jitter: false,
        };
        assert_eq!(p.max_delay(0), Duration::from_secs(1));
        assert_eq!(p.max_delay(1), Duration::from_secs(1));
        assert_eq!(p.max_delay(2), Duration::from_secs(2));
        assert_eq!(p.max_delay(5), Duration::from_secs(16));
        assert_eq!(p.max_delay(13), Duration::from_secs(3600));
        for attempt in [32, 33, 64, 10_000, u32::MAX] {
            assert_eq!(p.backoff(attempt), Duration::from_secs(3600));
        }
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let p = RetryPolicy::default();
        for attempt in [1, 3, 10_000] {
            for _ in 0..200 {
                assert!(p.backoff(attempt) <= p.max_delay(attempt));
            }
        }
    }
}
