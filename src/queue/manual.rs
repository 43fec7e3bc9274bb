//! The manual toolkit: claiming, leases and outcomes, the reaper's looks,
//! the change watcher and the scheduler's rounds, by hand. A
//! [`crate::WorkerPool`] (with its reaper and scheduler) does all of this
//! for an application, through these same calls; use them to run jobs
//! without a pool, or to build one of your own. Get one with
//! [`Queue::manual`].
//!
//! ```no_run
//! use std::time::Duration;
//! use tickler::{NewJob, Queue};
//!
//! # fn main() -> tickler::Result<()> {
//! let queue = Queue::open("jobs.db")?;
//! queue.enqueue(NewJob::new("send_email"))?;
//! let manual = queue.manual();
//! for lease in manual.claim("default", "worker-1", 10, Duration::from_secs(30))? {
//!     // ... do the work, outside any transaction ...
//!     manual.complete(&lease)?;
//! }
//! # Ok(())
//! # }
//! ```

use super::Queue;
use crate::engine::types::*;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::lease::Lease;
use crate::schedule::TickRun;
use crate::watch::ChangeWatcher;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// The manual toolkit on one [`Queue`]; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct Manual<'q> {
    queue: &'q Queue,
}

impl Queue {
    /// The manual toolkit: claim, renew, record and reap by hand, as the
    /// worker pool does; see [`Manual`].
    pub fn manual(&self) -> Manual<'_> {
        Manual { queue: self }
    }
}

impl Manual<'_> {
    /// When the next tick of an active schedule is due (UTC); `None` with
    /// no active schedule. Now, if the wall clock stepped back since an
    /// active schedule was last written ([`Manual::run_due_ticks`] then moves
    /// it to its next tick after the new now). Two indexed reads; for
    /// schedulers that sleep until then.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn next_schedule_tick(&self) -> Result<Option<DateTime<Utc>>> {
        self.queue.next_schedule_tick()
    }

    /// Fires every due tick of every active schedule: each becomes one job
    /// (the schedule's template, run_at = the tick's instant, unique_key
    /// `tickler:schedule:<name>:<tick ms>`), missed ticks per the schedule's
    /// [`MisfirePolicy`](crate::MisfirePolicy), and the schedule's
    /// `next_tick_at` moves to its first tick after now, in the same
    /// `BEGIN IMMEDIATE` transaction (batches of 100 schedules per
    /// transaction). Safe to call from any number of threads and processes:
    /// a tick is enqueued once.
    ///
    /// The rules for DST nights, misfires and clock steps are on
    /// [`NewSchedule`](crate::NewSchedule).
    ///
    /// A schedule whose stored expression or template no longer validates
    /// with this build (a time zone dropped from the database, a payload
    /// over this queue's limit) is paused with an error in the log.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; ticks of
    /// earlier transactions stay fired.
    pub fn run_due_ticks(&self) -> Result<TickRun> {
        self.queue.run_due_ticks()
    }

    /// A whole pass of the limits' safety sweep, at once: every key of
    /// every limit that has blocked jobs is released if it has room.
    /// Returns how many jobs it made pending, which is 0 unless a release
    /// was missed (the background [`crate::Reaper`] sweeps a part of the
    /// keys each round).
    ///
    /// # Errors
    /// The engine's write errors.
    pub fn sweep_limits(&self) -> Result<u64> {
        self.queue.sweep_limits()
    }

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
    /// (the [`crate::Reaper`], `tickler reap`) uses [`Manual::reap_at`],
    /// which waits for such heartbeats.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn reap(&self) -> Result<u64> {
        self.queue.reap()
    }

    /// [`Manual::reap`] as background reaping should do it: leases are
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
    /// As [`Manual::reap`].
    pub fn reap_at(&self, now: DateTime<Utc>) -> Result<u64> {
        self.queue.reap_at(now)
    }

    /// A watcher that wakes when this file may hold new claimable work: at
    /// once for commits through any clone of this `Queue`, and for commits
    /// by other processes when the operating system reports a write to the
    /// file's `-wal` file (inotify, FSEvents or kqueue), after which
    /// [`ChangeWatcher::wait`] checks `PRAGMA data_version` on its own
    /// connection (a read of shared memory, no query of the jobs table).
    /// Where no such notification is available, `wait` polls
    /// `data_version` instead.
    ///
    /// # Errors
    /// [`Error::Sqlite`] if its connection cannot be opened.
    pub fn watcher(&self) -> Result<ChangeWatcher> {
        self.queue.watcher()
    }

    /// Claims up to `max` due jobs of `queue`, of any kind; see [`Manual::claim_kinds`].
    pub fn claim(
        &self,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Lease>> {
        self.queue.claim(queue, worker_id, max, lease)
    }

    /// Claims up to `max` due jobs of `queue` (only of `kinds`, if given) for
    /// `worker_id`, each with a fresh run_token and a lease of `lease` from now.
    ///
    /// One `BEGIN IMMEDIATE` transaction: scheduled jobs that fell due are
    /// promoted to pending, then one `UPDATE … WHERE id IN (SELECT … ORDER BY
    /// priority DESC, run_at, id LIMIT max) RETURNING …` takes them. Holding
    /// the write lock from the start, no other claimer can read the same
    /// pending rows. Each claim consumes an attempt (`attempts + 1`).
    /// Returns leases in claim order (priority, then due time, then id).
    /// A paused queue ([`Queue::pause_queue`]) gives nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease under 1 ms, [`Error::Busy`],
    /// [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn claim_kinds(
        &self,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease: Duration,
        kinds: Option<&[&str]>,
    ) -> Result<Vec<Lease>> {
        self.queue.claim_kinds(queue, worker_id, max, lease, kinds)
    }

    /// When the next job of these queues (only of `kinds`, if given) is
    /// due: now if one is already due, `None` if nothing is waiting. For
    /// fetchers that sleep until work is due.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn next_due(
        &self,
        queues: &[&str],
        kinds: Option<&[&str]>,
    ) -> Result<Option<DateTime<Utc>>> {
        self.queue.next_due(queues, kinds)
    }

    /// Extends the lease to `extend_by` from now.
    /// Returns the new expiry (UTC).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn heartbeat(&self, lease: &Lease, extend_by: Duration) -> Result<DateTime<Utc>> {
        self.queue.heartbeat(lease, extend_by)
    }

    /// Extends many leases in one transaction, each to `extend_by` from now
    /// and each fenced by its run_token. The outer `Result` is the
    /// transaction; the inner ones say per lease whether it was still held
    /// (new expiry) or lost ([`Error::LeaseLost`]).
    ///
    /// # Errors
    /// Outer: [`Error::InvalidArgument`] (extension under 1 ms), [`Error::Busy`],
    /// [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        self.queue.heartbeat_many(leases, extend_by)
    }

    /// Whether each lease is still held (the job is `running` under its
    /// run_token), without writing: a cheap read that lets a worker pool
    /// notice a cancelled or reaped job between heartbeats.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        self.queue.leases_held(leases)
    }

    /// Marks the job succeeded.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn complete(&self, lease: &Lease) -> Result<()> {
        self.queue.complete(lease)
    }

    /// Records a failed attempt: back to waiting for `now + backoff(attempt)`
    /// if attempts are left, otherwise `dead`. `error` is kept as `last_error`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn fail(&self, lease: &Lease, error: &str) -> Result<()> {
        self.queue.fail(lease, error)
    }

    /// Marks the job dead at once, keeping `error` as `last_error`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn fail_permanently(&self, lease: &Lease, error: &str) -> Result<()> {
        self.queue.fail_permanently(lease, error)
    }

    /// Puts the job back to wait until `until` without consuming the attempt.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed);
    /// [`Error::TimeOutOfRange`].
    pub fn snooze(&self, lease: &Lease, until: DateTime<Utc>) -> Result<()> {
        self.queue.snooze(lease, until)
    }

    /// Hands an unstarted job back: pending at once, attempt not consumed.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn release(&self, lease: &Lease) -> Result<()> {
        self.queue.release(lease)
    }

    /// Records many outcomes in one `BEGIN IMMEDIATE` transaction (group
    /// commit: one fsync for the batch). Each is one statement fenced by
    /// `id AND run_token AND status = 'running'`; a lost lease makes that
    /// outcome `Err(LeaseLost)`, a snooze time past the storable range
    /// `Err(TimeOutOfRange)`, and a statement SQLite refuses (a trigger or
    /// constraint) `Err(ConstraintViolated)`, changing nothing for it,
    /// without rolling back the others. Error texts are cut to
    /// [`MAX_ERROR_BYTES`] (the first 6 KiB and the end, with a note of
    /// how much was cut); a failure whose error text SQLite still refuses is
    /// recorded with a short note in its place. Each failure also appends
    /// to the job's error history ([`Job::errors`](crate::Job::errors), the
    /// last [`ERROR_HISTORY_MAX`]).
    ///
    /// # Errors
    /// Outer: the transaction failed and nothing was recorded
    /// ([`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]).
    pub fn record_outcomes(&self, outcomes: &[(&Lease, Outcome)]) -> Result<Vec<Result<()>>> {
        self.queue.record_outcomes(outcomes)
    }

    /// Records `outcomes` (as [`Manual::record_outcomes`]) and then claims
    /// (as [`Manual::claim_kinds`], over `claim.queues` in order until
    /// `claim.max` jobs) in one `BEGIN IMMEDIATE` transaction: a worker pool
    /// finishes one batch and takes the next with one commit, one fsync.
    ///
    /// With [`OutcomeSync::Now`] the commit is durable per the queue's
    /// [`Durability`] when there are outcomes; with [`OutcomeSync::Deferred`]
    /// it is not fsynced and the caller promises to call [`Queue::sync`]
    /// soon. A claim alone never waits for an fsync of its own
    /// (`synchronous=NORMAL`): if power fails before a later synced commit,
    /// the claim is undone and the job is simply pending again.
    ///
    /// # Errors
    /// As both; on error nothing was recorded and nothing claimed.
    pub fn record_and_claim(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&ClaimRequest<'_>>,
        sync: OutcomeSync,
    ) -> Result<(Vec<Result<()>>, Vec<Lease>)> {
        self.queue.record_and_claim(outcomes, claim, sync, false)
    }

    /// [`Manual::record_and_claim`] for a caller that claims ahead of its
    /// free threads, as a worker pool does: the runs it claims have not
    /// started, and the caller records each start with
    /// [`Manual::mark_started`] (soon after it, in batches). A run whose
    /// lease is taken back (expired, or its holder gone) before its start
    /// was recorded gives its attempt back: a crash costs no attempt of a
    /// job that never ran. The caller must record the start of a job whose
    /// [`Lease::given_back`] is above 0 before its handler runs, so that a
    /// handler that kills its process at once is given back at most once.
    ///
    /// # Errors
    /// As [`Manual::record_and_claim`].
    pub fn record_and_claim_ahead(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&ClaimRequest<'_>>,
        sync: OutcomeSync,
    ) -> Result<(Vec<Result<()>>, Vec<Lease>)> {
        self.queue.record_and_claim(outcomes, claim, sync, true)
    }

    /// Records that the runs of `leases` (claimed with
    /// [`Manual::record_and_claim_ahead`]) started: from now on, taking
    /// their leases back counts their attempts. One write transaction; a
    /// lease no longer held is passed over. Not synced on its own: a power
    /// cut may undo it (the run is then given back uncounted).
    ///
    /// # Errors
    /// The engine's write errors ([`Error::Busy`], [`Error::Sqlite`], …).
    pub fn mark_started(&self, leases: &[&Lease]) -> Result<()> {
        if leases.is_empty() {
            return Ok(());
        }
        self.queue.engine().mark_started(leases)
    }

    /// Stores the progress of running jobs, each `(lease, fraction,
    /// message)`, in one write transaction, each fenced by its run_token:
    /// a lease no longer held is passed over (a stale holder's progress is
    /// refused like its outcome), and on a server so is a job whose row
    /// another transaction holds (its holder's `complete_with`). Not
    /// synced. A worker pool calls this with what its handlers reported
    /// through [`JobContext::progress`](crate::JobContext::progress), a
    /// few times a second at most.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a fraction outside 0..=1 (or NaN) or
    /// a message over [`MAX_PROGRESS_MESSAGE_BYTES`](crate::MAX_PROGRESS_MESSAGE_BYTES),
    /// before anything is written; the engine's write errors.
    pub fn record_progress(&self, updates: &[(&Lease, f64, &str)]) -> Result<()> {
        if updates.is_empty() {
            return Ok(());
        }
        for (lease, fraction, message) in updates {
            check_progress(*fraction, message)
                .map_err(|e| crate::Error::InvalidArgument(format!("job {}: {e}", lease.job_id)))?;
        }
        self.queue.engine().record_progress(updates)
    }
}

/// Why a progress report is refused, if it is: a fraction outside 0..=1
/// (or not a number) or a message too long.
pub(crate) fn check_progress(fraction: f64, message: &str) -> std::result::Result<(), String> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(format!("progress {fraction} is outside 0..=1"));
    }
    if message.len() > crate::MAX_PROGRESS_MESSAGE_BYTES {
        return Err(format!(
            "a progress message of {} bytes is over the {} allowed",
            message.len(),
            crate::MAX_PROGRESS_MESSAGE_BYTES
        ));
    }
    Ok(())
}
