//! Where tickler reads "now".
//!
//! Every decision that depends on the time of day (is a job due, has a lease
//! run out, when does a backoff end) reads the time through a [`Clock`], so
//! tests can move time by hand with [`ManualClock`] instead of sleeping.
//! Waiting itself (how long a fetcher sleeps) uses the monotonic clock of
//! the operating system.

use chrono::{DateTime, TimeZone, Utc};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A source of the current time, in UTC.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time, UTC.
    fn now(&self) -> DateTime<Utc>;

    /// The current time in milliseconds since the Unix epoch, UTC.
    fn now_ms(&self) -> i64 {
        self.now().timestamp_millis()
    }
}

/// The operating system's wall clock ([`Utc::now`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to; for tests.
///
/// Millisecond resolution, like everything tickler stores.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `start` (truncated to milliseconds).
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now_ms: AtomicI64::new(start.timestamp_millis()),
        }
    }

    /// Moves the clock to `to`; backwards is allowed (a stepped clock).
    pub fn set(&self, to: DateTime<Utc>) {
        self.now_ms.store(to.timestamp_millis(), Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now_ms.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        ms_to_datetime(self.now_ms.load(Ordering::SeqCst))
    }

    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// Milliseconds since the epoch to a UTC time. Values outside chrono's range
/// (never written by tickler) clamp to its ends rather than panic.
pub(crate) fn ms_to_datetime(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or(if ms < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}
