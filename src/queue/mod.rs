//! [`Queue`]: the public API and its contract, engine-neutral. What each
//! method promises is documented on it; how an engine keeps it lives
//! behind the seam (`crate::engine`), in the engine's own folder.
//!
//! This folder: `mod.rs` the application's calls (enqueue, claim, leases
//! and outcomes, pauses, operator actions, reads, events); `builder.rs`
//! opening; `validate.rs` the checks of a new job; `claim.rs` the claim's
//! rules (paused queues, promotion, fair share, priority aging) and
//! `reap.rs` the reaper's (two clean looks), both run through the seam;
//! `schedules.rs` the schedules' calls and firing rules; `readings.rs`
//! operators' and dashboards' readings; `storage.rs` what the store under
//! the queue can do (sync, checkpoints, watcher, file); `app_tx.rs` jobs in
//! the application's own transactions.
//!
//! Where things happen, for a newcomer:
//! - choosing the engine: `engine::open` (`src/engine/mod.rs`), the one
//!   place a location names an engine;
//! - claiming: the rules in `claim.rs`, each engine's statements in its
//!   `ClaimTx` (each engine's `claim.rs`: on SQLite
//!   `BEGIN IMMEDIATE` and one `UPDATE … RETURNING` per queue and order,
//!   built by `claim_sql`; on PostgreSQL `FOR UPDATE SKIP LOCKED`);
//! - fencing by run_token: each dialect's `fence!` (`id AND run_token AND
//!   status = 'running'`), which every outcome and heartbeat statement
//!   ends in (each engine's `outcome.rs`);
//! - the reaper: the rule in `reap.rs`, the conditional update in each
//!   engine's `reap_look` and `REAP_SQL`;
//! - concurrency limits: the rules in `limits.rs` (a claim admits or
//!   pushes back, every lease end hands its slots on, the reaper's sweep),
//!   each engine's statements and lock in its `limits.rs` (`LimitTx`);
//! - reading "now": through the queue's [`Clock`] (`Queue::now_ms` for
//!   validation and schedules, the engine's `now_ms` inside its
//!   transactions; on PostgreSQL the server's clock unless one was set);
//! - the SQLite write path: `Store::write_with` in
//!   `src/engine/sqlite/connection.rs`, one mutex-guarded write connection per
//!   opened `Queue`, `BEGIN IMMEDIATE`, bounded jittered retry on
//!   `SQLITE_BUSY`, group commit of concurrent enqueues, the bound on the
//!   WAL; PostgreSQL's: `Store::write` in `src/engine/postgres/connection.rs`,
//!   retried through lost connections and restarts;
//! - wake-ups on commits: the seam's `Watch`, behind [`ChangeWatcher`];
//! - row decoding: each engine's `rows.rs`;
//! - schedules: the tick arithmetic in `src/schedule/`, the firing rules
//!   in `schedules.rs` here (`Queue::fire`), their SQL in each engine's
//!   `schedules.rs` (`ScheduleStore`, `ScheduleTx`).

mod app_tx;
pub(crate) mod batches;
mod builder;
mod claim;
pub(crate) mod deps;
mod explain;
pub(crate) mod limits;
mod manual;
pub(crate) use manual::check_progress;
mod ops;
pub(crate) mod outcome;
mod readings;
mod reap;
mod schedules;
mod storage;
mod validate;
mod wait;

pub use builder::QueueBuilder;
pub use explain::{Explanation, Holder, ParentWait, Reason};
pub use manual::Manual;
pub use ops::Ops;
pub use readings::{ActivityBucket, QueueCounts, ACTIVITY_MAX_BUCKETS, ACTIVITY_SAMPLE};
pub use validate::{MAX_PAYLOAD_DEPTH, MAX_UNIQUE_KEY_BYTES};
pub use wait::Waited;

use crate::clock::Clock;
use crate::engine::types::*;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::events::{Event, EventHub, JobEvent, JobEventKind, Subscription};
use crate::job::{Job, JobId, JobState, NewJob};
use crate::lease::Lease;
use crate::retry::RetryPolicy;

pub use crate::watch::{ChangeWatcher, Waker};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

/// A handle on one tickler file. Cheap to clone; clones share one write
/// connection and one pool of read connections. Any number of `Queue`s in
/// any number of processes may open the same file.
#[derive(Clone, Debug)]
pub struct Queue {
    inner: Arc<Inner>,
}

struct Inner {
    config: QueueBuilder,
    /// Where "now" comes from: the builder's clock, or on PostgreSQL
    /// (unless one was set) the server's.
    clock: Arc<dyn Clock>,
    /// The engine: connections, write transactions, wake-ups.
    engine: Box<dyn Engine>,
    /// Subscribers to what this process does through this queue.
    events: EventHub,
    /// Where the reaper's safety sweep of blocked jobs goes on from, and
    /// what it found (`crate::queue::limits::sweep`).
    limit_sweep: limits::SweepState,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("location", &self.engine.location())
            .field("durability", &self.engine.durability())
            .finish()
    }
}

impl Queue {
    /// The clock this queue reads "now" from: the builder's, or on
    /// PostgreSQL (unless one was set) the database server's.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The backoff used after failures and expired leases.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.config.retry_policy
    }

    /// The engine behind this queue.
    pub(crate) fn engine(&self) -> &dyn Engine {
        &*self.inner.engine
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    // ---------------------------------------------------------------- enqueue

    /// Stores one job and returns its id. When this returns `Ok` the job is
    /// committed (fsynced under [`Durability::Full`]).
    ///
    /// If the job has a unique_key already held by a scheduled, pending or
    /// running job, nothing is inserted and that job's id is returned.
    ///
    /// # Errors
    /// [`Error::EmptyKind`], [`Error::EmptyQueue`], [`Error::InvalidMaxAttempts`],
    /// [`Error::PayloadTooLarge`], [`Error::TimeOutOfRange`],
    /// [`Error::InvalidArgument`] (empty unique_key, zero timeout): nothing
    /// is stored. [`Error::DiskFull`], [`Error::Busy`], [`Error::Sqlite`].
    pub fn enqueue(&self, job: NewJob) -> Result<JobId> {
        let mut ids = self.enqueue_batch(vec![job])?;
        Ok(ids.remove(0))
    }

    /// Stores several jobs in one transaction: all or none. Returns their
    /// ids in input order (an existing job's id for a held unique_key).
    ///
    /// # Errors
    /// As [`Queue::enqueue`]; any invalid job refuses the whole batch.
    pub fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        let now = self.now_ms();
        let rows = jobs
            .into_iter()
            .map(|job| self.validate(job, now))
            .collect::<Result<Vec<_>>>()?;
        self.enqueue_rows(rows)
    }

    /// Stores the steps of `graph` and their edges in one transaction, all
    /// or none, and returns each step's id by name. A step whose job has
    /// a unique_key held by an unfinished job stores nothing and names
    /// that job, whose own edges stay as they were; the steps after it
    /// wait on it.
    ///
    /// # Errors
    /// [`Error::DependencyCycle`] naming the steps of a cycle (a step
    /// after itself counts), [`Error::InvalidArgument`] for a step name
    /// used twice or an edge naming no step, [`Error::ParentNotFound`]
    /// for a stored parent that does not exist, and any error of
    /// [`Queue::enqueue`]: nothing is stored.
    pub fn enqueue_graph(
        &self,
        graph: crate::Graph,
    ) -> Result<std::collections::BTreeMap<String, JobId>> {
        let now = self.now_ms();
        let (names, steps) = graph.into_rows()?;
        let rows = steps
            .into_iter()
            .map(|(job, after)| {
                let mut row = self.validate(job, now)?;
                row.after = after;
                Ok(row)
            })
            .collect::<Result<Vec<_>>>()?;
        let ids = self.enqueue_rows(rows)?;
        Ok(names.into_iter().zip(ids).collect())
    }

    /// The edges of job `id` to the jobs it runs after, by parent id
    /// ([`NewJob::after`]): empty for a job that runs after none. Read the
    /// parents themselves (their state, their
    /// [`Job::output`](crate::Job::output)) with [`Queue::get`]: a parent
    /// is kept by [`Queue::prune`] while a child that has not finished
    /// waits on it or may read it.
    ///
    /// # Errors
    /// [`Error::NotFound`] if no job has this id.
    pub fn parents(&self, id: JobId) -> Result<Vec<crate::Dependency>> {
        self.engine().dependencies(id)
    }

    fn enqueue_rows(&self, rows: Vec<crate::engine::types::ValidJob>) -> Result<Vec<JobId>> {
        let described: Option<Vec<(String, String)>> = self.inner.events.active().then(|| {
            rows.iter()
                .map(|r| (r.job.kind.clone(), r.job.queue.clone()))
                .collect()
        });
        let announcing = described
            .as_ref()
            .and_then(|_| self.inner.events.announcing());
        let ids = self.engine().enqueue(rows)?;
        if let Some(announcing) = announcing {
            let at = self.inner.clock.now();
            announcing.publish(ids.iter().zip(described.into_iter().flatten()).map(
                |(id, (kind, queue))| job_event(JobEventKind::Enqueued, *id, kind, queue, at),
            ));
        }
        Ok(ids)
    }

    // ----------------------------------------------------------------- events

    /// A subscription to what this process does through this queue (and
    /// its clones): jobs enqueued, cancelled and retried here, every
    /// event of the [`crate::WorkerPool`]s and schedulers started on it,
    /// and what limits did to the runs claimed and recorded here
    /// ([`crate::JobEventKind::Blocked`], `Unblocked`, `Deferred`).
    /// Up to `capacity` events wait for the reader (at least 1;
    /// [`crate::DEFAULT_EVENT_BUFFER`] is a fair choice); what does not fit
    /// is dropped and counted ([`Subscription::dropped`]), so a slow reader
    /// never slows the queue or its pools.
    ///
    /// A job's events come in the order they happened in this process:
    /// its `Enqueued` before a pool's `Started`, a `Cancelled` before the
    /// pool's `LeaseLost`, although the enqueue or cancel publishes after
    /// its commit, when a pool thread may already have acted on it (such
    /// an event waits, a few milliseconds at most, for the enqueue or
    /// cancel that began before it).
    ///
    /// Events are this process's only: nothing is stored or sent between
    /// processes, and another process's enqueues, claims and outcomes
    /// (or changes made by hand in the file) are not seen. Read the queue
    /// ([`Queue::stats`], [`Queue::get`]) for the whole picture.
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        self.inner.events.subscribe(capacity)
    }

    pub(crate) fn events(&self) -> &EventHub {
        &self.inner.events
    }

    /// Runs `change` (an operator action on job `id`), then reports
    /// `what` for it with its kind and queue read back, if anyone listens
    /// (operator actions are rare: one read is cheap). Events of the job
    /// that the change causes elsewhere in this process (a pool's lost
    /// lease) come after.
    fn announced(
        &self,
        what: JobEventKind,
        id: JobId,
        change: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let announcing = self.inner.events.announcing();
        change()?;
        if let Some(announcing) = announcing {
            let job = self.engine().get(id).ok();
            let at = self.inner.clock.now();
            announcing.publish(job.map(|job| job_event(what, id, job.kind, job.queue, at)));
        }
        Ok(())
    }

    // ------------------------------------------------------------------ claim

    /// See [`Manual::claim`](crate::Manual::claim).
    pub(crate) fn claim(
        &self,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Lease>> {
        self.claim_kinds(queue, worker_id, max, lease, None)
    }

    /// See [`Manual::claim_kinds`](crate::Manual::claim_kinds).
    pub(crate) fn claim_kinds(
        &self,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease: Duration,
        kinds: Option<&[&str]>,
    ) -> Result<Vec<Lease>> {
        let queues = [queue];
        let request = ClaimRequest {
            queues: &queues,
            worker_id,
            max,
            lease,
            kinds,
            oldest_first: 0,
        };
        Ok(self
            .record_and_claim(&[], Some(&request), OutcomeSync::Now, false)?
            .1)
    }

    /// See [`Manual::next_due`](crate::Manual::next_due).
    pub(crate) fn next_due(
        &self,
        queues: &[&str],
        kinds: Option<&[&str]>,
    ) -> Result<Option<DateTime<Utc>>> {
        self.engine().next_due(queues, kinds)
    }

    // ------------------------------------------------------- leases, fenced

    /// See [`Manual::heartbeat`](crate::Manual::heartbeat).
    pub(crate) fn heartbeat(&self, lease: &Lease, extend_by: Duration) -> Result<DateTime<Utc>> {
        self.heartbeat_many(&[lease], extend_by)?.remove(0)
    }

    /// See [`Manual::heartbeat_many`](crate::Manual::heartbeat_many).
    pub(crate) fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        self.engine().heartbeat_many(leases, extend_by)
    }

    /// See [`Manual::leases_held`](crate::Manual::leases_held).
    pub(crate) fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        self.engine().leases_held(leases)
    }

    /// See [`Manual::complete`](crate::Manual::complete).
    pub(crate) fn complete(&self, lease: &Lease) -> Result<()> {
        self.record_one(lease, Outcome::Complete)
    }

    /// See [`Manual::fail`](crate::Manual::fail).
    pub(crate) fn fail(&self, lease: &Lease, error: &str) -> Result<()> {
        self.record_one(lease, Outcome::Fail(error.to_owned()))
    }

    /// See [`Manual::fail_permanently`](crate::Manual::fail_permanently).
    pub(crate) fn fail_permanently(&self, lease: &Lease, error: &str) -> Result<()> {
        self.record_one(lease, Outcome::FailPermanently(error.to_owned()))
    }

    /// See [`Manual::snooze`](crate::Manual::snooze).
    pub(crate) fn snooze(&self, lease: &Lease, until: DateTime<Utc>) -> Result<()> {
        self.record_one(lease, Outcome::Snooze(until))
    }

    /// See [`Manual::release`](crate::Manual::release).
    pub(crate) fn release(&self, lease: &Lease) -> Result<()> {
        self.record_one(lease, Outcome::Release)
    }

    fn record_one(&self, lease: &Lease, outcome: Outcome) -> Result<()> {
        self.record_outcomes(&[(lease, outcome)])?.remove(0)
    }

    /// See [`Manual::record_outcomes`](crate::Manual::record_outcomes).
    pub(crate) fn record_outcomes(
        &self,
        outcomes: &[(&Lease, Outcome)],
    ) -> Result<Vec<Result<()>>> {
        Ok(self
            .record_and_claim(outcomes, None, OutcomeSync::Now, false)?
            .0)
    }

    /// See [`Manual::record_and_claim`](crate::Manual::record_and_claim);
    /// `ahead`: see [`Manual::record_and_claim_ahead`](crate::Manual::record_and_claim_ahead).
    pub(crate) fn record_and_claim(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&ClaimRequest<'_>>,
        sync: OutcomeSync,
        ahead: bool,
    ) -> Result<(Vec<Result<()>>, Vec<Lease>)> {
        let claim = claim.map(|request| crate::engine::Claim {
            request,
            rules: claim::claim_in,
            starts: !ahead,
        });
        let recorded = self
            .engine()
            .record_and_claim(outcomes, claim.as_ref(), sync)?;
        let released_children = recorded
            .limit_changes
            .iter()
            .any(|c| matches!(c.what, JobEventKind::Released));
        if !recorded.limit_changes.is_empty() && self.events().active() {
            let at = self.clock().now();
            for change in recorded.limit_changes {
                if self.events().offer() {
                    self.events().emit(change.event(at));
                }
            }
        }
        // An outcome that makes a job claimable again (a retry, a snooze, a
        // release) or frees a unique_key wakes this process's fetchers;
        // other processes see the commit.
        // So does one that freed a limit's slot (a blocked job may be
        // pending now), and a success or failure that released jobs that
        // ran after it: they are due now, not at the fetchers' next look.
        if released_children
            || outcomes.iter().any(|(lease, o)| {
                lease.limit.is_some()
                    || !matches!(
                        o,
                        Outcome::Complete | Outcome::CompleteWith(_) | Outcome::FailPermanently(_)
                    )
            })
        {
            self.engine().wake_watchers();
        }
        Ok((recorded.results, recorded.leases))
    }

    // ---------------------------------------------------------- paused queues

    /// Pauses a queue: from the moment this returns, no claim of any
    /// process or machine sharing the queue takes a job of it, and
    /// [`Manual::next_due`] treats it as having nothing due (so idle worker
    /// pools sleep instead of polling it). Nothing else changes: jobs can
    /// still be enqueued into it, scheduled jobs still fall due, jobs
    /// already claimed run on and their outcomes are recorded, and the
    /// reaper still takes back their expired leases. The flag is stored
    /// (it survives restarts) and may name a queue that has no job yet.
    /// Pausing a paused queue does nothing.
    ///
    /// # Errors
    /// [`Error::EmptyQueue`]; [`Error::Busy`], [`Error::DiskFull`],
    /// [`Error::Sqlite`].
    pub fn pause_queue(&self, queue: &str) -> Result<()> {
        if queue.is_empty() {
            return Err(Error::EmptyQueue);
        }
        self.engine().set_queue_paused(queue, true)
    }

    /// Resumes a paused queue and wakes the worker pools of every process
    /// so that its due jobs are claimed at once. Resuming a queue that is
    /// not paused does nothing.
    ///
    /// # Errors
    /// As [`Queue::pause_queue`].
    pub fn resume_queue(&self, queue: &str) -> Result<()> {
        if queue.is_empty() {
            return Err(Error::EmptyQueue);
        }
        self.engine().set_queue_paused(queue, false)?;
        // Its blocked jobs were passed over while it was paused: the slots
        // free now are theirs as much as anyone's.
        self.release_all_limits()
    }

    /// The names of the paused queues, in byte order.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn paused_queues(&self) -> Result<Vec<String>> {
        self.engine().paused_queues()
    }

    // ------------------------------------------------------ operator actions

    /// Cancels a job that is not finished. A running job's holder then gets
    /// [`Error::LeaseLost`] on its next heartbeat or outcome; a
    /// [`crate::WorkerPool`] notices within about 100 ms and sets the
    /// handler's cancellation flag ([`crate::CancelReason::LeaseLost`]).
    ///
    /// A cancelled running job keeps its unique_key until its holder has
    /// stopped (its refused outcome says so) or its lease has run out: a new
    /// job with the same key can be enqueued at once, but it does not start
    /// before then, so two runs for one key never overlap.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::InvalidState`] if it already finished.
    pub fn cancel(&self, id: JobId) -> Result<()> {
        // A pending job of a limit may have been handed a freed slot: that
        // slot goes on to the next blocked job of its key.
        // A job deferred over its rate leaves the line of its key: the
        // line ends at the last one that still waits.
        let before = self.engine().get(id).ok();
        let slot = |state: crate::JobState| {
            before
                .as_ref()
                .filter(|job| job.state == state)
                .and_then(|job| job.limit.clone())
        };
        let pending = slot(crate::JobState::Pending);
        let deferred = slot(crate::JobState::Scheduled)
            .filter(|_| before.as_ref().is_some_and(|job| job.rate_deferrals > 0));
        self.announced(JobEventKind::Cancelled, id, || self.engine().cancel(id))?;
        if let Some(slot) = pending {
            self.engine()
                .release_limit_keys(vec![(slot.name, slot.key)])?;
        }
        if let Some(slot) = deferred {
            self.engine().reline_rate_key(&slot.name, &slot.key)?;
        }
        Ok(())
    }

    /// Makes a dead or cancelled job pending again, due now, with fresh
    /// attempts (`attempts = 0`); `last_error` and the error history are
    /// kept. A job cancelled while it waited for jobs it runs after
    /// ([`crate::NewJob::after`]) waits again for those that have not
    /// ended yet (or ended dead or cancelled, for an
    /// [`crate::IfParentFails::Hold`] edge) rather than run before them. A job cancelled while running whose holder has not reported
    /// yet is due when that holder's lease runs out instead.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::InvalidState`] unless dead or cancelled;
    /// [`Error::UniqueKeyHeld`] if its unique_key now belongs to another
    /// unfinished job.
    pub fn retry(&self, id: JobId) -> Result<()> {
        self.announced(JobEventKind::Retried, id, || self.engine().retry(id))
    }

    /// Deletes finished jobs (succeeded, dead, cancelled) that finished
    /// before `finished_before`, in short transactions. Returns how many.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn prune(&self, finished_before: DateTime<Utc>) -> Result<u64> {
        self.prune_where(finished_before, None)
    }

    /// Prunes in transactions of at most `PRUNE_BATCH` jobs, so that
    /// writers of other processes wait for none of them long.
    fn prune_where(&self, finished_before: DateTime<Utc>, state: Option<JobState>) -> Result<u64> {
        let before = finished_before.timestamp_millis();
        let mut total = 0u64;
        loop {
            let deleted = self.engine().prune_batch(before, state, PRUNE_BATCH)?;
            total += deleted;
            if (deleted as i64) < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// Makes every dead job (of `queue`, if given) pending again, due now,
    /// with fresh attempts, as [`Queue::retry`] does one by one, in short
    /// transactions. A dead job whose unique_key is now held by an
    /// unfinished job stays dead. Returns `(retried, left_dead)`. Unlike
    /// [`Queue::retry`], it emits no [`JobEventKind::Retried`] events (it
    /// may touch any number of jobs).
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; jobs retried
    /// by earlier transactions stay retried.
    pub fn retry_dead(&self, queue: Option<&str>) -> Result<(u64, u64)> {
        self.retry_dead_matching(queue, None)
    }

    /// As [`Queue::retry_dead`], only dead jobs of `queue` and of `kind`,
    /// each if given (both `None`: every dead job). Returns `(retried,
    /// left_dead)`, `left_dead` counting the matching jobs kept dead by a
    /// held unique_key.
    ///
    /// # Errors
    /// As [`Queue::retry_dead`].
    pub fn retry_dead_matching(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
    ) -> Result<(u64, u64)> {
        let (mut retried, mut left_dead) = (0u64, 0u64);
        let mut after_id = 0i64;
        loop {
            let batch = self
                .engine()
                .retry_dead_batch(queue, kind, after_id, PRUNE_BATCH)?;
            retried += batch.retried;
            left_dead += batch.left_dead;
            match batch.last_id {
                Some(id) if (batch.seen as i64) >= PRUNE_BATCH => after_id = id,
                _ => break,
            }
        }
        if retried > 0 {
            self.engine().wake_watchers();
        }
        Ok((retried, left_dead))
    }

    /// Cancels every pending job of `queue` and of `kind`, each if given
    /// (both `None`: every pending job), as [`Queue::cancel`] does one by
    /// one, in transactions of at most a few thousand jobs, each one
    /// statement; jobs scheduled for later, blocked or running are left
    /// alone. A limit's slot that a cancelled job was handed goes on to
    /// the next blocked job of its key. Unlike [`Queue::cancel`], it emits
    /// no [`JobEventKind::Cancelled`] events (it may touch any number of
    /// jobs). Returns how many were cancelled.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; jobs
    /// cancelled by earlier transactions stay cancelled.
    pub fn cancel_pending(&self, queue: Option<&str>, kind: Option<&str>) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let (cancelled, keys) = self
                .engine()
                .cancel_pending_batch(queue, kind, PRUNE_BATCH)?;
            total += cancelled;
            if !keys.is_empty() {
                self.engine().release_limit_keys(keys)?;
            }
            if (cancelled as i64) < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// Deletes the dead jobs of `queue` and of `kind`, each if given (both
    /// `None`: every dead job), whenever they died, in transactions of at
    /// most a few thousand jobs, each one statement. A dead job whose
    /// holder may still be running (a last attempt past its timeout) keeps
    /// its row until its lease ends, as with [`Queue::prune`]. Returns how
    /// many were deleted.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; jobs
    /// deleted by earlier transactions stay deleted.
    pub fn delete_dead(&self, queue: Option<&str>, kind: Option<&str>) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let deleted = self.engine().delete_dead_batch(queue, kind, PRUNE_BATCH)?;
            total += deleted;
            if (deleted as i64) < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// As [`Queue::prune`], but only jobs in `state` (succeeded, dead or
    /// cancelled) are deleted. Returns how many.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a state that is not finished;
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn prune_state(&self, finished_before: DateTime<Utc>, state: JobState) -> Result<u64> {
        if !state.is_terminal() {
            return Err(Error::InvalidArgument(format!(
                "only finished jobs can be pruned (succeeded, dead, cancelled), not {state}"
            )));
        }
        self.prune_where(finished_before, Some(state))
    }

    // ------------------------------------------------------------------ reads

    /// The job with this id.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Sqlite`], [`Error::Pool`].
    pub fn get(&self, id: JobId) -> Result<Job> {
        self.engine().get(id)
    }

    /// Jobs matching `filter`, oldest id first.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        self.engine().list(filter)
    }

    /// Number of jobs in `state`, across queues. Uses an index (cost grows
    /// with the count, not the table) for scheduled, pending and running;
    /// scans the table for finished states.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn count(&self, state: JobState) -> Result<u64> {
        self.engine().count(state)
    }

    /// Job counts per queue and state, and the oldest due job.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn stats(&self) -> Result<Stats> {
        self.engine().stats()
    }
}

/// A job event of the queue's own (no run: no attempt or times).
fn job_event(
    what: JobEventKind,
    job_id: JobId,
    kind: String,
    queue: String,
    at: chrono::DateTime<chrono::Utc>,
) -> Event {
    Event::Job(JobEvent {
        what,
        job_id,
        kind,
        queue,
        attempt: None,
        queue_time: None,
        run_time: None,
        at,
    })
}
