//! How much to claim beyond the free threads: the handlers' measured run
//! time, and the account of jobs claimed ahead, handed back when they wait
//! past the holding time.

use super::dispatch::DispatchConfig;
use super::shared::Shared;
use crate::lease::Lease;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The average time a handler of this pool runs: an exponentially weighted
/// mean over the jobs that returned (each new run weighs 1/8), so that one
/// long run among short ones pulls it up at once and a few dozen short ones
/// bring it back down. Unknown until the first handler returns.
#[derive(Debug)]
pub(super) struct RunTime(AtomicU64);

impl Default for RunTime {
    fn default() -> Self {
        RunTime(AtomicU64::new(Self::UNKNOWN))
    }
}

impl RunTime {
    const UNKNOWN: u64 = u64::MAX;

    pub(super) fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(Self::UNKNOWN - 1);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                Some(if mean == Self::UNKNOWN {
                    ns
                } else {
                    mean - mean / 8 + ns / 8
                })
            });
    }

    /// The mean, or `None` before any handler returned.
    fn mean(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            Self::UNKNOWN => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }
}

/// The dispatcher's account of jobs claimed ahead of free threads: which
/// claim each lease in the job channel came from and when, so that those
/// that wait past the holding time are handed back.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    /// Per claim: when it committed, and the count of leases sent into the
    /// job channel up to and including it.
    claims: VecDeque<(Instant, u64)>,
    sent: u64,
    /// After a hand-back, nothing is claimed ahead until a thread takes a
    /// lease again (`Shared::received` moves past this).
    paused_at: Option<u64>,
}

impl Ahead {
    pub(super) fn sent(&mut self, n: usize, at: Instant) {
        if n > 0 {
            self.sent += n as u64;
            self.claims.push_back((at, self.sent));
        }
    }

    /// How many jobs to claim beyond the free threads now.
    pub(super) fn budget(&mut self, shared: &Shared, config: &DispatchConfig) -> usize {
        let received = shared.received.load(Ordering::SeqCst);
        if self.paused_at.is_some_and(|at| at == received) {
            return 0;
        }
        self.paused_at = None;
        let Some(mean) = shared.run_time.mean() else {
            return 0;
        };
        let window = config.prefetch_hold / 2;
        let per_thread = window.as_nanos() / mean.as_nanos().max(1);
        let expected = per_thread.saturating_mul(config.threads as u128);
        usize::try_from(expected)
            .unwrap_or(usize::MAX)
            .min(config.prefetch)
    }

    /// When the oldest lease still waiting in the channel has waited the
    /// holding time.
    pub(super) fn next_deadline(&mut self, shared: &Shared, hold: Duration) -> Option<Instant> {
        let received = shared.received.load(Ordering::SeqCst);
        while self.claims.front().is_some_and(|&(_, end)| end <= received) {
            self.claims.pop_front();
        }
        self.claims.front().map(|&(at, _)| at + hold)
    }

    /// Takes out of the job channel every lease that has waited the holding
    /// time (the oldest are at its front), for the caller to hand back.
    pub(super) fn take_expired(
        &mut self,
        shared: &Shared,
        hold: Duration,
        now: Instant,
    ) -> Vec<Lease> {
        let mut expired = Vec::new();
        if self.next_deadline(shared, hold).is_none_or(|d| d > now) {
            return expired;
        }
        let target = self
            .claims
            .iter()
            .take_while(|&&(at, _)| at + hold <= now)
            .map(|&(_, end)| end)
            .last()
            .unwrap_or(0);
        while shared.received.load(Ordering::SeqCst) < target {
            let Ok(lease) = shared.jobs.try_recv() else {
                break;
            };
            shared.received.fetch_add(1, Ordering::SeqCst);
            expired.push(lease);
        }
        if !expired.is_empty() {
            self.paused_at = Some(shared.received.load(Ordering::SeqCst));
        }
        expired
    }
}
