//! Concurrency limits shared by every process of a queue: what an operator
//! sets ([`Limit`]) and what can be read about them ([`LimitInfo`],
//! [`LimitKeyUsage`]). The rules that keep them live in
//! `crate::queue::limits`.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Longest limit name, in bytes of UTF-8.
pub const MAX_LIMIT_NAME_BYTES: usize = 200;

/// Longest limit key, in bytes of UTF-8.
pub const MAX_LIMIT_KEY_BYTES: usize = 1024;

/// A concurrency limit, stored in the queue under a name
/// ([`Queue::set_limit`](crate::Queue::set_limit)) and named by jobs
/// ([`NewJob::limit`](crate::NewJob::limit)).
///
/// The guarantee: at every instant, for each key of the limit, the weights
/// of the jobs of that key that hold a lease (running, or stopping after a
/// cancel until their holder reports or their lease runs out) add up to at
/// most `max_per_key`, and over all its keys to at most `max_total`. The
/// count is read from the jobs' rows in the transaction that claims, so a
/// holder that lost its lease frees nothing twice and a killed process's
/// slots come back when its leases are taken back. What it cannot promise:
/// a handler that runs on after losing its lease (a frozen process, a
/// handler that ignores its timeout) still runs while another job holds
/// its slot.
///
/// ```
/// // One sync per account, at most eight at once over all accounts.
/// let limit = tickler::Limit::per_key(1).total(8);
/// assert_eq!(limit.max_total, Some(8));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// Most weight of lease holders per key, at least 1.
    pub max_per_key: u32,
    /// Most weight of lease holders over all keys, at least 1 if set.
    pub max_total: Option<u32>,
}

impl Limit {
    /// At most `n` slots taken per key, no total.
    pub fn per_key(n: u32) -> Limit {
        Limit {
            max_per_key: n,
            max_total: None,
        }
    }

    /// At most `n` slots taken over all keys.
    pub fn total(mut self, n: u32) -> Limit {
        self.max_total = Some(n);
        self
    }
}

/// A stored limit ([`Queue::limits`](crate::Queue::limits)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitInfo {
    /// Its name.
    pub name: String,
    /// Its values.
    pub limit: Limit,
    /// When it was last set, UTC.
    pub updated_at: DateTime<Utc>,
}

/// One key of a limit as it is now
/// ([`Queue::limit_usage`](crate::Queue::limit_usage)): keys with a job
/// that is not finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitKeyUsage {
    /// The limit's name.
    pub name: String,
    /// The key.
    pub key: String,
    /// Weight of the jobs holding a lease (running or stopping).
    pub held: u64,
    /// Jobs holding a lease.
    pub holders: u64,
    /// Jobs waiting for a slot ([`JobState::Blocked`](crate::JobState::Blocked)).
    pub blocked: u64,
    /// Jobs due and pending (released to claim the next free slot).
    pub pending: u64,
}
