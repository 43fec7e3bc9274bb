//! How long write transactions waited for the write lock.
//!
//! Every write goes through one path (`Store::write_locked`, in
//! `src/engine/sqlite/connection.rs`); it records
//! the time from asking SQLite for the write lock (`BEGIN IMMEDIATE`, after
//! the process's own write mutex) to holding it: the wait for other
//! processes, including busy-handler sleeps. Kept as a log-scale histogram (four buckets per doubling, so a
//! percentile is exact to within 19 %), cheap enough to stay always on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const BUCKETS: usize = 4 * 40;

/// Always-on histogram of write-lock waits; see [`WriteLockWaits`].
#[derive(Debug)]
pub(crate) struct WaitHistogram {
    counts: [AtomicU64; BUCKETS],
    max_us: AtomicU64,
}

impl Default for WaitHistogram {
    fn default() -> Self {
        WaitHistogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            max_us: AtomicU64::new(0),
        }
    }
}

impl WaitHistogram {
    pub(crate) fn record(&self, wait: Duration) {
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WriteLockWaits {
        WriteLockWaits {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

/// Bucket `b` holds waits below `2^((b + 1) / 4)` µs.
fn bucket_of(us: u64) -> usize {
    if us == 0 {
        return 0;
    }
    let log2x4 = ((us as f64).log2() * 4.0).floor() as usize;
    log2x4.min(BUCKETS - 1)
}

fn bucket_upper_us(bucket: usize) -> f64 {
    2f64.powf((bucket + 1) as f64 / 4.0)
}

/// A snapshot of how long this process's write transactions waited for the
/// write lock, from [`crate::Ops::write_lock_waits`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WriteLockWaits {
    counts: Vec<u64>,
    max_us: u64,
}

impl WriteLockWaits {
    /// Number of write transactions recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The longest wait.
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }

    /// The wait that `q` (0.0 to 1.0) of transactions stayed under, to
    /// within 19 % (the upper edge of its bucket, at most the maximum).
    pub fn percentile(&self, q: f64) -> Duration {
        let total = self.count();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let us = bucket_upper_us(bucket).min(self.max_us as f64);
                return Duration::from_secs_f64(us / 1e6);
            }
        }
        self.max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_land_in_the_right_bucket() {
        let h = WaitHistogram::default();
        for _ in 0..99 {
            h.record(Duration::from_micros(100));
        }
        h.record(Duration::from_millis(50));
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        let p50 = s.percentile(0.5).as_micros();
        assert!((100..=120).contains(&p50), "p50 {p50}");
        assert_eq!(s.percentile(1.0), Duration::from_millis(50));
        assert_eq!(s.max(), Duration::from_millis(50));
    }
}
