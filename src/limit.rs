//! Concurrency and rate limits shared by every process of a queue: what an
//! operator sets ([`Limit`], [`Rate`]) and what can be read about them ([`LimitInfo`],
//! [`LimitKeyUsage`]). The rules that keep them live in
//! `crate::queue::limits`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::time::Duration;

/// Longest limit name, in bytes of UTF-8.
pub const MAX_LIMIT_NAME_BYTES: usize = 200;

/// Longest limit key, in bytes of UTF-8.
pub const MAX_LIMIT_KEY_BYTES: usize = 1024;

/// A concurrency limit, a rate limit ([`Rate`]) or both, stored in the
/// queue under a name ([`Queue::set_limit`](crate::Queue::set_limit)) and
/// named by jobs ([`NewJob::limit`](crate::NewJob::limit)).
///
/// The concurrency guarantee: at every instant, for each key of the limit, the weights
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
    /// Most weight of lease holders per key, at least 1; `None`: no
    /// concurrency limit per key (a limit of rate alone).
    pub max_per_key: Option<u32>,
    /// Most weight of lease holders over all keys, at least 1 if set.
    pub max_total: Option<u32>,
    /// Most starts per period per key, if set ([`Rate`]).
    pub rate: Option<Rate>,
}

impl Limit {
    /// At most `n` slots taken per key, no total, no rate.
    pub fn per_key(n: u32) -> Limit {
        Limit {
            max_per_key: Some(n),
            max_total: None,
            rate: None,
        }
    }

    /// At most `count` starts per `period` per key and no concurrency
    /// limit: see [`Rate`]. Add a burst with [`Limit::burst`].
    ///
    /// ```
    /// use std::time::Duration;
    /// // At most 100 calls a minute per API key, never more than 10 at once.
    /// let limit = tickler::Limit::rate(100, Duration::from_secs(60)).burst(10);
    /// assert_eq!(limit.rate.unwrap().burst, 10);
    /// assert_eq!(limit.max_per_key, None);
    /// ```
    pub fn rate(count: u32, period: Duration) -> Limit {
        Limit {
            max_per_key: None,
            max_total: None,
            rate: Some(Rate {
                count,
                period,
                burst: 0,
            }),
        }
    }

    /// At most `n` slots taken over all keys.
    pub fn total(mut self, n: u32) -> Limit {
        self.max_total = Some(n);
        self
    }

    /// Adds a rate to this limit: at most `count` starts per `period` per
    /// key, besides its concurrency limit.
    pub fn with_rate(mut self, count: u32, period: Duration) -> Limit {
        let burst = self.rate.map_or(0, |r| r.burst);
        self.rate = Some(Rate {
            count,
            period,
            burst,
        });
        self
    }

    /// Starts a key may make at once beyond its steady rate, after a quiet
    /// spell (see [`Rate::burst`]); nothing without a rate.
    pub fn burst(mut self, burst: u32) -> Limit {
        if let Some(rate) = &mut self.rate {
            rate.burst = burst;
        }
        self
    }
}

/// A rate limit: at most `count` starts per `period` per key, plus `burst`.
/// Every start of a run counts once, retries included (a job's
/// `limit_weight` weighs against the concurrency limit only).
///
/// **The guarantee:** in every span of time `period` long, the claims of
/// one key's runs (the instants a claim hands them out, in the engine's
/// time) number at most `count + burst`. It is kept by GCRA, the exact
/// form of a token bucket: each key stores one instant (when its next
/// start is due at the steady rate), read and moved in the transaction
/// that claims, under the limit's lock, on the engine's clock (the
/// server's on PostgreSQL and MySQL). There are no windows: no doubling at
/// a window's edge, and no calendar arithmetic to go wrong at midnight, a
/// change of daylight saving time or a year's end.
///
/// **Deferred jobs.** A job over the rate goes back to `scheduled`, due
/// at exactly the instant it may start, with its attempt given back and
/// no error written ([`Job::rate_deferrals`](crate::Job::rate_deferrals)
/// counts it). The deferred jobs of a key get instants one
/// `period / count` apart in claim order, first in, first out, so no herd
/// wakes at one instant, and a job claimed while others of its key wait is
/// placed after them. A deferred job that comes due along with more of its
/// key than the burst lets start at once (the pools claimed late) goes to
/// the end of the key's line.
///
/// **Reaching the rate.** Starts are handed out by claims, and what a key
/// does not start within its burst of time is not saved up. A key with a
/// backlog runs at its full rate if its runs are claimed at least once
/// per `burst + 1` intervals: at 10 a second any burst will do; for
/// hundreds a second or more, give it a burst of about 50 ms of starts
/// (`rate × 0.05 s`), more on a loaded server.
///
/// **Clock steps.** A step forward admits at most `burst + 1` starts at
/// once, then the steady rate (the deferred jobs that all came due are
/// deferred again, in order). A step back of more than a minute is
/// noticed (each key stores the latest instant it saw) and the key's
/// instants and its deferred jobs move back by the step, at the key's
/// next claim or the reaper's next pass (about a second): a key is held
/// back by that, not by the step. A smaller step holds a key back by at
/// most itself: below a minute, a step is not told from processes whose
/// clocks disagree (each server process reads the server's clock through
/// an offset it samples), and taking such a difference for a step would
/// move the key back at every claim of the process behind. The processes
/// sharing a SQLite file share the machine's clock.
///
/// **Changes.** Setting a limit's rate to another value, or removing it
/// (with [`Queue::set_limit`](crate::Queue::set_limit) or
/// [`Queue::delete_limit`](crate::Queue::delete_limit)), lines its
/// deferred jobs up again at once under the new rate (or lets them run),
/// each key's next start counted from its last start; setting the same
/// rate again changes nothing. A deferred job cancelled gives its instant
/// back if it was the last of its key's line. A key's line is first in,
/// first out whatever the jobs' priorities; a key's deferred jobs in a
/// paused queue keep their places.
///
/// **What it cannot promise:** a run handed out and then reaped still
/// counted as a start (as it should: it may have called out), and a
/// handler's own start may come later than its claim (a pool's threads
/// busy), so starts as a remote side sees them may bunch a little where
/// claims did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rate {
    /// Starts per period, at least 1.
    pub count: u32,
    /// The period, at least 1 ms, stored in whole milliseconds; `count`
    /// per period is at most one start per microsecond.
    #[serde(serialize_with = "period_ms")]
    pub period: Duration,
    /// Starts beyond `count` that one period may hold after a quiet
    /// spell (0: none, the steady rate only).
    pub burst: u32,
}

impl Rate {
    /// The steady spacing of starts, in microseconds, rounded up (so that
    /// `count` starts never take less than `period`).
    pub(crate) fn interval_us(&self) -> i64 {
        let period_us = i64::try_from(self.period.as_micros()).unwrap_or(i64::MAX);
        let count = i64::from(self.count.max(1));
        period_us.saturating_add(count - 1) / count
    }

    /// How far ahead of the steady rate a key may start, in microseconds:
    /// `burst` intervals, and 999 µs more. Starts are claimed at whole
    /// milliseconds, so a span of `period` holds instants `period - 1 ms`
    /// apart at most, and GCRA starts at most `(span + tolerance) /
    /// interval + 1` runs in such a span: with the 999 µs that is still
    /// at most `count + burst`, and a rate of over one start a millisecond
    /// can start more than one run at each.
    pub(crate) fn tolerance_us(&self) -> i64 {
        self.interval_us()
            .saturating_mul(i64::from(self.burst))
            .saturating_add(999)
    }
}

fn period_ms<S: serde::Serializer>(period: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(period.as_millis()).unwrap_or(u64::MAX))
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
    /// Jobs deferred over the limit's rate, waiting for their instant.
    pub deferred: u64,
}
