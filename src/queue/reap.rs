//! Taking back expired leases: [`Queue::reap`] (one look) and
//! [`Queue::reap_at`] (the background reaper's rule: two clean looks). The
//! looks themselves (the conditional update, fenced by run_token and the
//! expiry) are each engine's `Engine::reap_look`.

use super::Queue;
use crate::engine::types::ExpiredLease;
use crate::error::Result;
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::time::Duration;

/// Time between the two looks of [`Queue::reap_at`] at an expired lease:
/// longer than the longest sleep of tickler's busy handler (10 ms), so that
/// a heartbeat that waited behind a write lock held by another connection
/// lands in between.
const REAP_SETTLE: Duration = Duration::from_millis(100);

/// Most looks of one [`Queue::reap_at`] call; the last one takes what the
/// one before saw, even if getting the lock waited. Bounds how late a gone
/// holder's job is taken back while the lock is busy: about
/// `REAP_MAX_LOOKS` times `REAP_SETTLE` plus the lock waits.
const REAP_MAX_LOOKS: u32 = 10;

impl Queue {
    /// Takes back jobs whose lease ran out (`lease_expires_at < now`): to
    /// waiting with backoff if attempts are left, else `dead`, with
    /// `last_error` saying the lease expired. Each update repeats the
    /// condition (`status = 'running' AND run_token = ? AND lease_expires_at
    /// < now`), so a heartbeat that landed first wins. Safe to run from any
    /// number of processes. Returns how many jobs were taken back.
    ///
    /// A job whose worker dies on every attempt therefore ends `dead` after
    /// `max_attempts` claims.
    ///
    /// This is one look, at once: for tests and one-off use. A holder whose
    /// heartbeat is queued behind a write lock that another connection
    /// held past its lease can lose its job to it. Background reaping
    /// (the [`crate::Reaper`], `tickler reap`) uses [`Queue::reap_at`],
    /// which waits for such heartbeats.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn reap(&self) -> Result<u64> {
        self.reap_expired_before(None)
    }

    /// [`Queue::reap`] as background reaping should do it: leases are
    /// judged against `now` as read before waiting for the write lock (the
    /// reaper thread passes the time its clock-step check saw, so a clock
    /// step during the wait cannot make it take live leases), and a lease is
    /// taken back only after two looks, 100 ms apart, each of which got the
    /// write lock without waiting for another connection, saw it expired
    /// with the same expiry. A holder whose heartbeat was stuck behind the
    /// same lock (another process's long transaction, a slow disk) renews
    /// in between and keeps its job. A holder that is really gone is taken
    /// back in the second look; while the lock stays busy, at the latest in
    /// the tenth (about 1 s plus the lock waits). Returns how many jobs
    /// were taken back; takes at least 100 ms when any lease is expired.
    ///
    /// # Errors
    /// As [`Queue::reap`].
    pub fn reap_at(&self, now: DateTime<Utc>) -> Result<u64> {
        let engine = self.engine();
        let cutoff = now.timestamp_millis();
        let mut total = 0u64;
        // The previous look: what it saw expired and left, and whether it
        // got the write transaction without waiting.
        let mut previous: Option<(HashSet<ExpiredLease>, bool)> = None;
        for look in 1..=REAP_MAX_LOOKS {
            let last = look == REAP_MAX_LOOKS;
            let before = previous.take();
            let mut waited_now = false;
            let result = engine.reap_look(Some(cutoff), &mut |lease, waited| {
                waited_now = waited;
                let Some((seen, seen_clean)) = &before else {
                    return false;
                };
                // The last look confirms whatever it saw twice, so that a
                // lock that is never free long still lets a gone holder's
                // job be reaped within a bound.
                let clean = (!waited && *seen_clean) || last;
                clean && seen.contains(lease)
            })?;
            total += result.taken;
            if result.left.is_empty() && !result.batch_full {
                break;
            }
            previous = Some((result.left.into_iter().collect(), !waited_now));
            if !last {
                std::thread::sleep(REAP_SETTLE);
            }
        }
        if total > 0 {
            engine.wake_watchers();
        }
        // The background reaper's round is also the engine's upkeep.
        engine.upkeep();
        Ok(total)
    }

    fn reap_expired_before(&self, cutoff: Option<i64>) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let look = self.engine().reap_look(cutoff, &mut |_, _| true)?;
            total += look.taken;
            if !look.batch_full {
                break;
            }
        }
        if total > 0 {
            self.engine().wake_watchers();
        }
        Ok(total)
    }
}
