//! Taking back expired leases: [`Queue::reap`] (one look) and
//! [`Queue::reap_at`] (the background reaper's rule: two clean looks). The
//! looks themselves (the conditional update, fenced by run_token and the
//! expiry) are each engine's `Leases::reap_look`.

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
    /// See [`Manual::reap`](crate::Manual::reap).
    pub(crate) fn reap(&self) -> Result<u64> {
        self.reap_expired_before(None)
    }

    /// See [`Manual::reap_at`](crate::Manual::reap_at).
    pub(crate) fn reap_at(&self, now: DateTime<Utc>) -> Result<u64> {
        let engine = self.engine();
        let cutoff = now.timestamp_millis();
        let mut total = self.take_back_from_gone_holders()?;
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
            synced_after_taking_back(self);
            engine.wake_watchers();
        }
        // And the limits' safety sweep: a bounded part of it per round;
        // and the rated keys that saw a later time than now (the clock
        // stepped back) move back with it, and those long unused go.
        self.sweep_limits_round()?;
        // Its failure (a busy file) leaves the round's other work be.
        if let Err(e) = engine.upkeep_rates() {
            log::warn!("the reaper's upkeep of rate limits failed: {e}");
        }
        // The background reaper's round is also the engine's upkeep.
        engine.upkeep();
        Ok(total)
    }

    /// Takes back at once the leases of this machine's holders that are
    /// gone (see [`crate::holder`]); returns how many running jobs.
    pub(crate) fn take_back_from_gone_holders(&self) -> Result<u64> {
        let me = &self.inner.config.holder;
        let gone: Vec<String> = self
            .engine()
            .lease_holders(&me.machine_prefix())?
            .into_iter()
            .filter(|(holder, renewed)| me.sees_gone(holder, *renewed))
            .map(|(holder, _)| holder)
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        let taken = self.engine().take_back_from(&gone)?;
        if taken > 0 {
            synced_after_taking_back(self);
            log::info!(
                "took back {taken} job(s) at once: their holder, a process of this machine, is gone"
            );
        }
        Ok(taken)
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
            synced_after_taking_back(self);
            self.engine().wake_watchers();
        }
        Ok(total)
    }
}

/// Leases taken back are committed without a sync of their own; rare as
/// they are, they are synced (under `Durability::Full`) at once: a job
/// whose last attempt made the machine go down is dead only once that is
/// on disk, and with no handler running nothing else may sync it before
/// the next power cut, which would bring it back to run once more.
fn synced_after_taking_back(queue: &Queue) {
    if let Err(e) = queue.sync() {
        log::warn!("syncing the leases taken back failed: {e}; the next commit retries");
    }
}
