//! The storage seam: what the engine-neutral [`crate::Queue`] asks of an
//! engine, and the one place where engines are named ([`open`]).
//!
//! - `types.rs`: the types both sides share (validated jobs, outcomes,
//!   claim requests, counts, limits and time arithmetic);
//! - this file: the traits an engine implements and [`open`], which
//!   builds the engine a location names. [`Engine`] is made of one trait
//!   per responsibility ([`Capabilities`], [`ScheduleStore`], [`Enqueue`],
//!   [`Claims`], [`Leases`], [`Admin`], [`Reads`]), besides the
//!   transactions the queue's rules run in ([`ClaimTx`], [`OutcomeTx`],
//!   [`ScheduleTx`])
//!   and the change watcher ([`Watch`]);
//! - `sqlite/`, `postgres/`, `mysql/`: one folder per engine, each with its own SQL
//!   and schema, and the same files in each, one per responsibility:
//!   `connection.rs` (connections, transactions and their retries, and the
//!   [`Capabilities`]), `migrate.rs` (with `schema.sql`), `enqueue.rs`,
//!   `claim.rs` (with the [`ClaimTx`]), `outcome.rs`, `lease.rs`,
//!   `admin.rs`, `read.rs`, `schedules.rs` (with the [`ScheduleTx`]),
//!   `limits.rs` (with the [`LimitTx`]), `rows.rs` and `watch.rs`. An
//!   engine's own extras are files of their own, named in its `mod.rs`;
//!   `server_clock.rs` is the server engines' clock (the database
//!   server's, sampled), and `server_tx.rs` what they do alike around
//!   their write transactions.
//!
//! What differs between engines is one of the [`Capabilities`] (durability
//! and sync, checkpoints, write-lock waits, the file, the change watcher,
//! the application's own transactions), never a match on the engine
//! elsewhere. Every write runs in short transactions of the engine's own
//! (one, or a few for the bulk operator actions); what a method promises
//! (fencing by run_token, the reaper's conditions, unique keys) is
//! documented on the `Queue` method of the same name. Nothing here assumes
//! `UPDATE … RETURNING`: an engine may claim with a locking read followed
//! by an update.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod server_clock;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod server_tx;

pub(crate) mod group_commit;
pub(crate) mod sqlite;

pub(crate) mod types;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use crate::lease::Lease;
use crate::metrics::WriteLockWaits;
use crate::retry::RetryPolicy;
use crate::schedule::{Fired, Handled, NewSchedule, Schedule, Ticks};
use chrono::{DateTime, Utc};
use crossbeam_channel::Sender;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use types::{
    Attempt, Checkpoint, ClaimOrder, ClaimRequest, ClaimedRow, ConnectionHook, Durability,
    ExpiredLease, JobFilter, JobPage, Outcome, OutcomeSync, ReapLook, RetryDeadBatch, Stats,
    ValidJob,
};

/// A claim as the queue hands it to an engine: what to claim, and the
/// rules that decide it (`crate::queue::claim`: paused queues, promoting
/// due jobs, the fair share per queue and priority aging), which the
/// engine runs inside its own transaction through a [`ClaimTx`].
pub(crate) struct Claim<'a> {
    pub request: &'a ClaimRequest<'a>,
    pub rules: ClaimRules,
    /// The claim starts the runs it hands out (a caller that runs what it
    /// claims at once). A worker pool claims ahead of its free threads and
    /// records each start later ([`Leases::mark_started`]), so that a run
    /// that never started gives its attempt back when taken back.
    pub starts: bool,
}

/// The claim's rules: given the engine's transaction, the request, now and
/// the lease expiry (ms), the leases claimed, or `None` if a backlog of due
/// jobs was promoted and the claim must come in a later transaction.
pub(crate) type ClaimRules =
    fn(&mut dyn ClaimTx, &ClaimRequest<'_>, i64, i64) -> Result<Option<Vec<Lease>>>;

/// The statements of a claim, in the engine's own transaction, that the
/// claim's rules are made of.
pub(crate) trait ClaimTx {
    /// The paused queues, read in this transaction (a pause committed
    /// before it holds for this claim).
    fn paused_queues(&mut self) -> Result<BTreeSet<String>>;

    /// Makes up to `limit` scheduled jobs of `queue` that are due at `now`
    /// pending, soonest due first; returns how many.
    fn promote_due(&mut self, queue: &str, now: i64, limit: i64) -> Result<u64>;

    /// Claims up to `want` pending jobs of `queue` (only of the request's
    /// kinds) whose unique_key no stopping holder keeps, in `order`: each
    /// gets a fresh run_token, an attempt and a lease until `expires`,
    /// claimed by the request's worker. The rows come back in no promised
    /// order; one that cannot be read comes back as
    /// [`types::ClaimedRow::Unreadable`], still running.
    fn claim_batch(
        &mut self,
        request: &ClaimRequest<'_>,
        queue: &str,
        want: i64,
        order: ClaimOrder,
        now: i64,
        expires: i64,
    ) -> Result<Vec<ClaimedRow>>;

    /// Makes a claimed job whose row cannot be read dead with `error`,
    /// fenced by its run_token.
    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()>;
}

/// The statements of recording an outcome, in the engine's own
/// transaction, that the outcome rules (`crate::queue::outcome`: a snooze
/// past the storable range, a refused error text stored as a note, a
/// holder that reports after its lease was lost) are made of.
pub(crate) trait OutcomeTx {
    /// The fenced statement of one outcome (`WHERE id = ? AND run_token =
    /// ? AND status = 'running'`): the rows it changed, 1, or 0 when the
    /// lease is no longer held. `note`, if given, is stored instead of a
    /// failure's error text.
    fn apply_outcome(
        &mut self,
        lease: &Lease,
        outcome: &Outcome,
        now: i64,
        policy: &RetryPolicy,
        note: Option<&str>,
    ) -> Result<u64>;

    /// After the fenced statement changed nothing: `Ok(())` if an earlier
    /// try of this transaction (`attempt`) committed this lease's outcome
    /// already, else `LeaseLost`, with the holder of a cancelled job marked
    /// as stopped (its unique_key is free for the next job).
    fn after_refused(&mut self, lease: &Lease, attempt: Attempt) -> Result<Result<()>>;

    /// `f` in a savepoint: `Ok(Err(refused))` when the server refused one
    /// of its statements for this outcome alone (bad data, a trigger, a
    /// constraint), with its writes undone and the transaction usable.
    #[allow(clippy::type_complexity)]
    fn isolated(
        &mut self,
        f: &mut dyn FnMut(&mut dyn OutcomeTx) -> Result<Result<()>>,
    ) -> Result<Result<Result<()>>>;
}

/// The statements batches are kept with, in the engine's write
/// transaction (the same one as its [`DepTx`]); the rules that use them
/// are `crate::queue::batches`. In the lock order `LimitTx` documents,
/// batch rows come after job rows and before limit rows; a batch's
/// callbacks (job rows) are written after its row is locked, and are
/// never members of their own batch.
pub(crate) trait BatchTx {
    /// Makes the jobs `ids` (stored by this transaction) members of
    /// `batch` (`role` `None`) or its callback.
    fn join_batch(
        &mut self,
        batch: crate::BatchId,
        role: Option<crate::batch::Callback>,
        ids: &[JobId],
    ) -> Result<()>;
    /// The rows of those of `ids` (sorted) that exist, each locked until
    /// the transaction ends (a server engine's `FOR UPDATE`).
    fn lock_batches(&mut self, ids: &[crate::BatchId]) -> Result<Vec<crate::batch::BatchRow>>;
    /// Writes a row `lock_batches` read: its counters, and the time it was
    /// sealed and finished (`now`) when it newly is.
    fn write_batch(&mut self, row: &crate::batch::BatchRow, now: i64) -> Result<()>;
    /// Marks those of `ids` that ended as a member not yet counted,
    /// counted as the state they ended in; returns them with their batch.
    /// The caller holds their rows (it ended them, or read them locked).
    fn count_members(&mut self, ids: &[JobId]) -> Result<Vec<(JobId, crate::BatchId, JobState)>>;
    /// Clears the mark of those of `ids` counted as ended (a retry by hand
    /// made them run again, their rows locked by the caller); returns each
    /// one's batch and the state it had been counted as.
    fn uncount_members(&mut self, ids: &[JobId]) -> Result<Vec<(crate::BatchId, JobState)>>;
    /// Makes job `id` waiting again if it is pending or scheduled and is a
    /// callback of a batch that has not finished (a retry by hand of a
    /// callback cancelled while it waited); true if it did.
    fn wait_for_batch(&mut self, id: JobId) -> Result<bool>;
    /// The callbacks of `batch`.
    fn batch_callbacks(
        &mut self,
        batch: crate::BatchId,
    ) -> Result<Vec<(JobId, crate::batch::Callback)>>;
}

/// The statements of jobs that run after others, for the rules in
/// `crate::queue::deps`, inside an engine's write transaction.
pub(crate) trait DepTx: BatchTx {
    /// The states of those of `ids` (in id order) that exist, each row
    /// locked against a change of state until the transaction ends (a
    /// server engine's `FOR SHARE`), so that a parent's end and a child's
    /// insert see each other.
    fn lock_parents(&mut self, ids: &[JobId])
        -> Result<std::collections::HashMap<JobId, JobState>>;
    /// Stores `(parent, child, if_fails)` edges, unresolved.
    fn insert_edges(&mut self, edges: &[(JobId, JobId, crate::IfParentFails)]) -> Result<()>;
    /// The unresolved edges whose parent is among `parents` (sorted) and
    /// has ended, with the parent's state. A server engine reads them with
    /// a lock (a current read, not a snapshot's), so an edge another
    /// transaction committed before this one's change of the parent is
    /// seen.
    ///
    /// Beside them, in the same read: those of `parents` that ended as a
    /// batch member not yet counted (see [`BatchTx::count_members`]), so a
    /// job in neither costs this one statement.
    fn ended_edges(&mut self, parents: &[JobId]) -> Result<crate::queue::deps::Ended>;
    /// Locks the rows of `children` (sorted) until the transaction ends:
    /// two parents of one child ending at once take turns, so the second
    /// sees the first's resolution and releases the child. SQLite's single
    /// writer needs nothing.
    fn lock_children(&mut self, children: &[JobId]) -> Result<()>;
    /// Marks `(parent, child)` edges resolved.
    fn mark_resolved(&mut self, edges: &[(JobId, JobId)]) -> Result<()>;
    /// Cancels those of `children` that are still waiting, each with its
    /// error text; returns those cancelled.
    fn cancel_waiting(
        &mut self,
        children: &[(JobId, String)],
        now: i64,
    ) -> Result<Vec<crate::queue::deps::ChildChange>>;
    /// Makes pending (scheduled if their run_at is ahead of `now`; one due
    /// at its insert is due, though that insert's clock read later than
    /// this transaction's) those
    /// of `children` that are waiting with no unresolved edge left;
    /// returns those released.
    fn release_waiting(
        &mut self,
        children: &[JobId],
        now: i64,
    ) -> Result<Vec<crate::queue::deps::ChildChange>>;
    /// Makes job `id` waiting again if it is pending or scheduled and has
    /// an edge left unresolved to a parent that still exists (one pruned
    /// can never resolve it), or is a callback of a batch not finished
    /// (its end decides it); true if it did. Its row is locked by the
    /// caller first, so the edges it reads are those of the last
    /// resolution that committed.
    fn wait_again(&mut self, id: JobId) -> Result<bool>;
}

/// The statements concurrency limits are kept with, in the engine's own
/// write transaction; the rules that use them are
/// `crate::queue::limits` (see there for why each lock is taken).
///
/// **Lock order.** On a server engine, every transaction that touches a
/// limit takes its row locks in this order, so that no two ever wait for
/// each other in a cycle (a deadlock: the server fails one, which is
/// retried, but only after the wait, a second on PostgreSQL):
///
/// 1. job rows: the jobs it claims or promotes (`SKIP LOCKED`), the
///    leases it ends, the run a handler holds back ([`LimitTx::lock_run`]);
/// 2. limit rows, in name order, in one statement
///    ([`LimitTx::lock_limits`]);
/// 3. rate rows, only of limits whose row it holds.
///
/// This is the claim's order, the hot path's, which takes nothing more
/// for it. Once it holds a limit row, a transaction waits for no job row:
/// it writes the rows it locked first, and others only as `SKIP LOCKED`
/// finds them free ([`LimitTx::blocked`], [`LimitTx::reline_deferred`],
/// [`LimitTx::shift_deferred`]). Any job row may be held by a transaction
/// that waits for a limit row: a claim's locking read that met a row just
/// changed by another keeps its lock on PostgreSQL, though it does not
/// take the row. MariaDB's `SKIP LOCKED` was seen to wait now and then for
/// a row another transaction had just written, which no order can rule
/// out there. SQLite's single writer has no row locks.
pub(crate) trait LimitTx {
    /// The stored limits among `names` (in byte order, each once), locked
    /// until the transaction ends, in that order: a server engine takes
    /// each limit's row for update, so the transactions that claim or
    /// release slots of one limit take turns. A name with no stored limit
    /// is absent.
    fn lock_limits(
        &mut self,
        names: &[String],
    ) -> Result<std::collections::HashMap<String, crate::Limit>>;

    /// The weight of the lease holders of `key` of limit `name` (of all
    /// its keys for `None`): running jobs, and cancelled or dead ones
    /// whose lease runs to `now` or later (a holder not yet stopped). Read
    /// in this transaction, so it counts this transaction's claims.
    fn held(&mut self, name: &str, key: Option<&str>, now: i64) -> Result<i64>;

    /// Pushes claimed runs back, fenced by their run_tokens: `blocked`,
    /// with the claim's attempt given back and its lease cleared.
    fn block(&mut self, leases: &[&Lease]) -> Result<()>;

    /// Makes a claimed job dead with `error`, fenced by its run_token.
    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()>;

    /// The weight of the pending jobs of `key` of limit `name` (of all its
    /// keys for `None`) in queues that are not paused: runs about to be
    /// claimed.
    fn pending(&mut self, name: &str, key: Option<&str>) -> Result<i64>;

    /// Makes a blocked job [`LimitTx::blocked`] returned dead with `error`
    /// (it can never fit its limit).
    fn doom(&mut self, job_id: JobId, error: &str, now: i64) -> Result<()>;

    /// Up to `n` blocked jobs of `key` of limit `name` in queues that are
    /// not paused, in claim order (priority, due time, id). A server
    /// engine locks them, passing over those another transaction holds
    /// (see the lock order): the next ones get the slots.
    fn blocked(
        &mut self,
        name: &str,
        key: &str,
        n: i64,
    ) -> Result<Vec<crate::queue::limits::Blocked>>;

    /// Makes these blocked jobs, which [`LimitTx::blocked`] returned,
    /// pending (those still blocked).
    fn unblock(&mut self, ids: &[JobId]) -> Result<()>;

    /// The stored rate state of `key` of limit `name`, if it has one.
    fn rate_state(
        &mut self,
        name: &str,
        key: &str,
    ) -> Result<Option<crate::queue::limits::RateState>>;

    /// Stores the rate state of `key` of limit `name` (inserted or replaced).
    fn store_rate_state(
        &mut self,
        name: &str,
        key: &str,
        state: &crate::queue::limits::RateState,
    ) -> Result<()>;

    /// Which of these claimed jobs were deferred over a rate to the instant
    /// they are running at (their `rate_slot` is their `run_at`).
    fn deferred_runs(&mut self, ids: &[JobId]) -> Result<std::collections::HashSet<JobId>>;

    /// Defers claimed runs over a rate, fenced by their run_tokens: each
    /// `scheduled` at its instant (ms), marked deferred there, with the
    /// claim's attempt given back and its lease cleared.
    fn defer(&mut self, runs: &[(&Lease, i64)]) -> Result<()>;

    /// Moves the run_at of the jobs deferred on `key` of limit `name` (and
    /// their marks) by `by` ms. A server engine passes over those another
    /// transaction holds (see the lock order): nearly always it is taking
    /// them out of the line (claiming one that came due, cancelling it); one
    /// it leaves keeps its instant.
    fn shift_deferred(&mut self, name: &str, key: &str, by: i64) -> Result<()>;

    /// Up to `n` rated keys (limit, key) that saw a time later than `at`.
    fn rates_seen_after(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>>;

    /// The instant (ms) of the last job deferred on `key` of limit `name`
    /// that still waits, if any.
    fn last_deferred(&mut self, name: &str, key: &str) -> Result<Option<i64>>;

    /// Makes every job deferred on limit `name` due at `at` (ms): after
    /// its rate changed, as deferred runs (their turn, in claim order) that
    /// are lined up again; after it went (`rated` false), as plain due jobs
    /// that no rate defers any more. A server engine passes over those
    /// another transaction holds (see the lock order): nearly always a
    /// claim, which reads the limit after this transaction and lines them
    /// up itself, or a cancel; one it leaves keeps its instant.
    fn reline_deferred(&mut self, name: &str, at: i64, rated: bool) -> Result<()>;

    /// The rate states of limit `name` after its rate changed: with
    /// `Some(shift)`, each key's next start moves by `shift` µs (the new
    /// interval less the old) and its line is forgotten (its deferred jobs
    /// are lined up again); with `None` (no rate any more), forgotten.
    fn reset_rates(&mut self, name: &str, shift: Option<i64>) -> Result<()>;

    /// Locks the row of a running job, fenced by its run_token, before any
    /// limit row (see the lock order): the run [`LimitTx::mark_deferred`]
    /// marks. SQLite's write lock holds it already.
    fn lock_run(&mut self, job_id: JobId, run_token: &str) -> Result<()>;

    /// Marks a running job, fenced by its run_token, as a run deferred to
    /// `at` (ms): the snooze its handler is about to return
    /// (`JobContext::rate_limited`) is then its turn.
    fn mark_deferred(&mut self, job_id: JobId, run_token: &str, at: i64) -> Result<()>;

    /// Up to `n` rated keys (limit, key) last seen before `at` (ms).
    fn rates_seen_before(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>>;

    /// Forgets the rate state of `key` of limit `name`.
    fn forget_rate(&mut self, name: &str, key: &str) -> Result<()>;

    /// Up to `n` (limit, key) pairs with blocked jobs, in byte order, after
    /// `after`, of limit `only` if given.
    fn blocked_keys(
        &mut self,
        after: Option<&(String, String)>,
        only: Option<&str>,
        n: i64,
    ) -> Result<Vec<(String, String)>>;
}

/// An engine's stored concurrency limits (each engine's `limits.rs`).
pub(crate) trait LimitStore {
    /// Stores `limit` under `name` or replaces it, and makes pending the
    /// blocked jobs a raise lets run, in one transaction; see
    /// [`crate::Queue::set_limit`].
    fn set_limit(&self, name: &str, limit: &crate::Limit) -> Result<()>;

    /// See [`crate::Queue::delete_limit`].
    fn delete_limit(&self, name: &str) -> Result<bool>;

    /// See [`crate::Queue::limits`].
    fn limits(&self) -> Result<Vec<crate::LimitInfo>>;

    /// See [`crate::Queue::limit_usage`].
    fn limit_usage(&self, name: Option<&str>) -> Result<Vec<crate::LimitKeyUsage>>;

    /// Releases the blocked jobs of `keys` (limit, key) that fit, in one
    /// write transaction (after a pending job of the key was cancelled, or
    /// its queue resumed); returns how many it made pending.
    fn release_limit_keys(&self, keys: Vec<(String, String)>) -> Result<u64>;

    /// Holds back `key` of limit `name` until `until` (ms), in one write
    /// transaction (`crate::queue::limits::hold_rate`); false if the limit
    /// has no rate.
    fn hold_rate(
        &self,
        name: &str,
        key: &str,
        until: i64,
        run: Option<(JobId, &str)>,
    ) -> Result<bool>;

    /// The weight held on each key of limit `name` that holds any (key,
    /// weight), by key: what [`LimitStore::limit_usage`] gives as `held`,
    /// read from the holders' rows alone, not the key's blocked or
    /// pending ones, so that `explain` of one blocked job does not count a
    /// whole backlog.
    fn limit_held(&self, name: &str) -> Result<Vec<(String, u64)>>;

    /// Up to `n` jobs of `key` of limit `name` that hold a lease (running,
    /// or keeping the lease of a holder not yet stopped), by lease end.
    fn limit_holders(&self, name: &str, key: &str, n: i64) -> Result<Vec<crate::Job>>;

    /// Job `id`'s place (from 1) in the line of jobs deferred over its
    /// limit's rate on its key, if it is one of them.
    fn deferred_place(&self, id: JobId) -> Result<Option<u64>>;

    /// Ends the line of `key` of limit `name` at its last deferred job
    /// that still waits (`crate::queue::limits::reline_key`), in a write
    /// transaction: after one was cancelled.
    fn reline_rate_key(&self, name: &str, key: &str) -> Result<()>;

    /// One round of the reaper's upkeep of rate states
    /// (`crate::queue::limits::upkeep_rates`: a clock stepped back, keys
    /// long unused) in a write transaction, if a read finds one to do.
    fn upkeep_rates(&self) -> Result<u64>;

    /// One round of the reaper's safety sweep (`crate::queue::limits::sweep`)
    /// in a write transaction: jobs made pending, and where to go on from.
    fn sweep_limits(
        &self,
        after: Option<&(String, String)>,
    ) -> Result<(u64, Option<(String, String)>)>;
}

/// One round of firing due schedules, run by the engine in its write
/// transaction with its "now" (ms): what was fired, whether the batch was
/// full (more may be due), and the next tick of any active schedule. See
/// `Queue::run_due_ticks`. May run again if the transaction is retried.
pub(crate) type FireRound<'a> =
    dyn FnMut(&dyn ScheduleTx, i64) -> Result<(Fired, bool, Option<DateTime<Utc>>)> + 'a;

/// An engine's schedules: where they are stored, and the transaction in
/// which due ticks fire. What to fire is decided by the queue
/// (`Queue::fire`), engine-neutral, through a [`ScheduleTx`].
pub(crate) trait ScheduleStore {
    /// Stores `schedule` (validated, its `ticks` parsed, its payload
    /// serialized) or replaces the one of that name; see
    /// [`crate::Queue::upsert_schedule`].
    fn upsert_schedule(
        &self,
        schedule: &NewSchedule,
        ticks: &Ticks,
        payload: &str,
        timeout_ms: Option<i64>,
    ) -> Result<Schedule>;

    /// See [`crate::Queue::pause_schedule`].
    fn pause_schedule(&self, name: &str) -> Result<()>;

    /// See [`crate::Queue::resume_schedule`].
    fn resume_schedule(&self, name: &str) -> Result<()>;

    /// See [`crate::Queue::delete_schedule`].
    fn delete_schedule(&self, name: &str) -> Result<bool>;

    /// See [`crate::Queue::get_schedule`].
    fn get_schedule(&self, name: &str) -> Result<Schedule>;

    /// See [`crate::Queue::list_schedules`].
    fn list_schedules(&self) -> Result<Vec<Schedule>>;

    /// A stored schedule and its record of handled ticks, for previews.
    fn schedule_and_handled(&self, name: &str) -> Result<(Schedule, Handled)>;

    /// See [`crate::Queue::next_schedule_tick`].
    fn next_schedule_tick(&self) -> Result<Option<DateTime<Utc>>>;

    /// Runs `round` in one write transaction of the engine's, through its
    /// [`ScheduleTx`], with the engine's "now" (ms); see
    /// [`crate::Queue::run_due_ticks`].
    fn fire_due_schedules(
        &self,
        round: &mut FireRound<'_>,
    ) -> Result<(Fired, bool, Option<DateTime<Utc>>)>;
}

/// The fence every write of a lease's holder ends in: the row is still
/// that lease's (`id`, its `run_token`, still `running`). A lost lease
/// matches no row and changes nothing. Written once for every dialect;
/// each passes its own placeholders (`?2`, `$2`).
macro_rules! fence {
    ($id:literal, $run_token:literal) => {
        concat!(
            "WHERE id = ",
            $id,
            " AND run_token = ",
            $run_token,
            " AND status = 'running'"
        )
    };
}
pub(crate) use fence;

/// The retry-or-dead rule of a failed attempt: dead (finished at `$now`)
/// once the attempts are used up, else waiting until `$retry_at`, pending
/// at once if that is already due.
macro_rules! retry_or_dead {
    ($now:literal, $retry_at:literal) => {
        concat!(
            "status = CASE WHEN attempts >= max_attempts THEN 'dead' WHEN ",
            $retry_at,
            " <= ",
            $now,
            " THEN 'pending' ELSE 'scheduled' END, run_at = CASE WHEN attempts >= max_attempts \
             THEN run_at ELSE ",
            $retry_at,
            " END, finished_at = CASE WHEN attempts >= max_attempts THEN ",
            $now,
            " END"
        )
    };
}
pub(crate) use retry_or_dead;

/// The SET list that makes a dead or cancelled job pending again with
/// fresh attempts, due at `$now`: one whose holder may still be running
/// (its lease is kept: a cancelled run, or a last attempt past its
/// timeout) is scheduled for when that lease runs out and keeps the lease
/// until then, so the retry never runs beside the old run and the old
/// run's limit slot stays taken. Written once for every dialect.
macro_rules! revive {
    ($now:literal) => {
        concat!(
            "status = CASE WHEN lease_expires_at >= ",
            $now,
            " THEN 'scheduled' ELSE 'pending' END, run_at = CASE WHEN lease_expires_at >= ",
            $now,
            " THEN lease_expires_at + 1 ELSE ",
            $now,
            " END, attempts = 0, finished_at = NULL, lease_expires_at = CASE WHEN \
             lease_expires_at >= ",
            $now,
            " THEN lease_expires_at END"
        )
    };
}
pub(crate) use revive;

/// What opening a queue's engine takes: the builder's settings (see
/// [`crate::QueueBuilder`]). Each engine reads those it has a use for.
pub(crate) struct OpenSettings<'a> {
    /// A file's path, or a server's URL.
    pub location: &'a Path,
    pub durability: Durability,
    pub busy_timeout: Duration,
    pub busy_retry: Duration,
    pub max_payload_bytes: usize,
    pub retry_policy: RetryPolicy,
    pub clock: Arc<dyn Clock>,
    /// `clock` was set by the caller: a server engine uses it instead of
    /// the server's clock.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub clock_set: bool,
    pub read_connections: u32,
    pub on_connection: Option<&'a ConnectionHook>,
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub max_connections: u32,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub listen: bool,
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub fallback_poll: Duration,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub postgres_tls: &'a types::PostgresTls,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub pooler: Option<types::Pooler>,
    /// This process, as each lease it claims records it.
    pub holder: &'a str,
}

/// The engine that `settings.location` names: PostgreSQL for a
/// `postgres://` URL, MySQL/MariaDB for a `mysql://` or `mariadb://` URL,
/// else the SQLite file at that path. The only place that chooses an
/// engine.
///
/// # Errors
/// The engine's errors on opening; [`Error::Config`] for a URL of an
/// engine this build lacks the feature of.
pub(crate) fn open(settings: &OpenSettings<'_>) -> Result<Box<dyn Engine>> {
    if let Some(url) = settings.location.to_str().filter(|l| is_postgres_url(l)) {
        #[cfg(feature = "postgres")]
        return Ok(Box::new(postgres::Store::open(url, settings)?));
        #[cfg(not(feature = "postgres"))]
        return Err(Error::Config(format!(
            "{} is a PostgreSQL URL, but tickler was built without its `postgres` feature",
            redacted_location(url)
        )));
    }
    if let Some(url) = settings.location.to_str().filter(|l| is_mysql_url(l)) {
        #[cfg(feature = "mysql")]
        return Ok(Box::new(mysql::Store::open(url, settings)?));
        #[cfg(not(feature = "mysql"))]
        return Err(Error::Config(format!(
            "{} is a MySQL/MariaDB URL, but tickler was built without its `mysql` feature",
            redacted_location(url)
        )));
    }
    Ok(Box::new(sqlite::Store::open(settings)?))
}

/// The schema version this build writes in a SQLite file (`PRAGMA
/// user_version`).
pub(crate) fn file_schema_version_written() -> i64 {
    sqlite::schema_version()
}

/// The schema version of the SQLite file at `path`, read without changing
/// it; `None` if there is no file.
pub(crate) fn file_schema_version(path: &Path) -> Result<Option<i64>> {
    sqlite::file_schema_version(path)
}

/// See [`crate::Queue::file_is_private`].
pub(crate) fn file_is_private(path: &Path) -> Result<bool> {
    sqlite::file_is_private(path)
}

/// The size of the `-wal` file of the SQLite file at `path` (0 if none).
pub(crate) fn file_wal_bytes(path: &Path) -> u64 {
    std::fs::metadata(sqlite::wal_path(path)).map_or(0, |m| m.len())
}

/// An engine's wake-ups when the queue may hold new work: the engine side
/// of a [`crate::ChangeWatcher`] (SQLite: file notifications of the `-wal`
/// file and `PRAGMA data_version`; PostgreSQL: `LISTEN`).
pub(crate) trait Watch: Send + std::fmt::Debug {
    /// See [`crate::ChangeWatcher::wait`].
    fn wait(&mut self, timeout: Duration, poll: Duration) -> Result<bool>;
    /// See [`crate::ChangeWatcher::changed`].
    fn changed(&mut self) -> Result<bool>;
    /// Wakes this watcher's `wait` from any thread.
    fn wake_sender(&self) -> Sender<()>;
}

/// The error for an application transaction `tx` of another engine than
/// the queue's (`engine`).
pub(crate) fn wrong_app_tx(tx: &types::AppTxKind<'_, '_>, engine: &'static str) -> Error {
    Error::Unsupported {
        what: match tx.engine() {
            "SQLite" => "a rusqlite transaction (enqueue_tx)",
            "MySQL" => "a mysql transaction (enqueue_tx)",
            _ => "a postgres transaction (enqueue_tx)",
        },
        engine,
    }
}

/// The error of an engine that lacks the capability `what`.
fn unsupported(what: &'static str, engine: &'static str) -> Error {
    Error::Unsupported { what, engine }
}

/// What an engine is and can do beyond the contract: its name, clock and
/// location, durability and checkpoints, its change watcher, and the
/// application's own transactions. A capability an engine lacks answers
/// [`Error::Unsupported`] (or, where that is the truth, does nothing).
pub(crate) trait Capabilities: Send + Sync {
    /// The engine's name for messages ("SQLite", "PostgreSQL", "MySQL").
    fn name(&self) -> &'static str;

    /// Where "now" comes from: the builder's clock, or a server engine's
    /// own clock unless one was set.
    fn clock(&self) -> Arc<dyn Clock>;

    /// Where the queue lives, for messages: a file's path, or a URL
    /// without its password.
    fn location(&self) -> String;

    /// The file, for an engine that keeps the queue in one.
    fn file(&self) -> Option<&Path> {
        None
    }

    /// See [`crate::Queue::durability`].
    fn durability(&self) -> Durability {
        Durability::Full
    }

    /// See [`crate::Queue::sync`]: nothing to do where every commit is
    /// durable as the engine's settings make it.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// See [`crate::Queue::checkpoint`].
    fn checkpoint(&self) -> Result<Checkpoint> {
        Err(unsupported("checkpoint", self.name()))
    }

    /// See [`crate::Queue::write_lock_waits`]: none where writers take no
    /// lock on the whole queue.
    fn write_lock_waits(&self) -> WriteLockWaits {
        WriteLockWaits::default()
    }

    /// See [`crate::Queue::watcher`].
    fn watcher(&self) -> Result<Box<dyn Watch>>;

    /// See [`crate::Queue::open_connection`].
    fn open_connection(&self) -> Result<rusqlite::Connection> {
        Err(unsupported("open_connection", self.name()))
    }

    /// See [`crate::Queue::enqueue_batch_tx`]: `rows` inserted in the
    /// application's transaction `tx`, if it is this engine's; a
    /// transaction of another engine is refused with
    /// [`Error::Unsupported`].
    fn enqueue_in_app_tx(
        &self,
        tx: types::AppTxKind<'_, '_>,
        _rows: &[ValidJob],
        _now: i64,
    ) -> Result<Vec<JobId>> {
        Err(wrong_app_tx(&tx, self.name()))
    }

    /// See [`crate::Queue::complete_with`]: `app_writes` runs inside the
    /// transaction that completes the job fenced by `lease`, given this
    /// engine's transaction. It may be called again if the engine retries
    /// the transaction after it ran (the caller's closure refuses then).
    fn complete_with(
        &self,
        _lease: &Lease,
        _app_writes: &mut dyn FnMut(types::AppTxKind<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        Err(unsupported("complete_with", self.name()))
    }
}

/// Storing new jobs (each engine's `enqueue.rs`; jobs in the
/// application's own transactions are [`Capabilities`]).
pub(crate) trait Enqueue {
    /// Stores validated jobs in one transaction (all or none) and wakes
    /// this process's fetchers; see [`crate::Queue::enqueue_batch`].
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>>;
}

/// Claiming jobs: when work is next due, and the transaction that records
/// outcomes and claims the next jobs (each engine's `claim.rs`; the
/// outcomes' statements are in its `outcome.rs`).
pub(crate) trait Claims {
    /// See [`crate::Queue::next_due`].
    fn next_due(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<Option<DateTime<Utc>>>;

    /// See [`crate::Queue::record_and_claim`]: records the outcomes, then,
    /// in the same transaction, runs `claim.rules` through the engine's
    /// [`ClaimTx`] (again in a later transaction while they say a backlog
    /// was promoted).
    fn record_and_claim(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&Claim<'_>>,
        sync: OutcomeSync,
    ) -> Result<Recorded>;
}

/// What [`Claims::record_and_claim`] did, once committed: each outcome's
/// result (in the order given), the claimed leases, and the limited jobs
/// its limit rules pushed back, deferred or made pending (for this
/// process's events).
pub(crate) struct Recorded {
    pub results: Vec<Result<()>>,
    pub leases: Vec<Lease>,
    pub limit_changes: Vec<crate::queue::limits::LimitChange>,
}

/// Claimed jobs' leases: heartbeats, whether they are still held, the
/// reaper's look that takes expired ones back, and what the background
/// rounds call besides (each engine's `lease.rs`).
pub(crate) trait Leases {
    /// See [`crate::Queue::heartbeat_many`].
    fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>>;

    /// See [`crate::Queue::leases_held`].
    fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>>;

    /// One look of the reaper, in one write transaction: first moves
    /// leases granted "in the future" by a backward step of the wall clock
    /// to expire one lease length from now (their `lease_ms`, plus
    /// `BACKWARD_STEP_MARGIN`), then finds up to `REAP_BATCH` leases
    /// expired before `cutoff` (ms; or now, if earlier) and takes back
    /// those `take` accepts, with the retry-or-dead rule and a
    /// lease-expired error. `take` is also told whether getting the write
    /// transaction had to wait for another connection (an engine without a
    /// lock on the whole queue never waits). One row the engine refuses
    /// costs that row alone.
    fn reap_look(
        &self,
        cutoff: Option<i64>,
        take: &mut dyn FnMut(&ExpiredLease, bool) -> bool,
    ) -> Result<ReapLook>;

    /// Wakes this process's watchers (other processes' watchers see the
    /// commit) after jobs became claimable outside a claim or an outcome.
    fn wake_watchers(&self);

    /// The holders (`crate::holder::Holder` texts) starting with
    /// `machine_prefix` of running jobs and of stopping ones (cancelled,
    /// or dead past their timeout, that keep their lease), each with when
    /// any of its leases was last granted or renewed (ms).
    fn lease_holders(&self, machine_prefix: &str) -> Result<Vec<(String, i64)>>;

    /// In one write transaction, takes back every lease held by one of
    /// `holders` (known to be gone): a running job by the reaper's rule
    /// (`types::reap_statement`, fenced by its run_token, whatever its
    /// expiry), a stopping one loses the lease that kept its unique_key.
    /// Returns how many running jobs were taken back; wakes watchers.
    fn take_back_from(&self, holders: &[String]) -> Result<u64>;

    /// Records that the runs of `leases` started (`started_at`, fenced by
    /// run_token; a lease no longer held is passed over).
    fn mark_started(&self, leases: &[&Lease]) -> Result<()>;

    /// Stores each run's progress (a fraction in 0..=1, already checked,
    /// and a message), fenced by run_token: a lease no longer held is
    /// passed over, and on a server a row locked by another transaction
    /// too (its next report carries the progress on). Not synced.
    fn record_progress(&self, updates: &[(&Lease, f64, &str)]) -> Result<()>;

    /// The engine's upkeep, once per background reaper round (PostgreSQL:
    /// a vacuum of the jobs table when it needs one).
    fn upkeep(&self) {}
}

/// Operators' writes: cancelling and retrying jobs, pruning and reviving
/// them in batches, pausing queues (each engine's `admin.rs`).
pub(crate) trait Admin {
    /// See [`crate::Queue::cancel`].
    fn cancel(&self, id: JobId) -> Result<()>;

    /// See [`crate::Queue::retry`].
    fn retry(&self, id: JobId) -> Result<()>;

    /// One transaction of [`crate::Queue::prune`] and
    /// [`crate::Queue::prune_state`]: deletes up to `limit` finished jobs
    /// (only of `state`, if given) that finished before `before` (ms).
    /// Returns how many.
    fn prune_batch(&self, before: i64, state: Option<JobState>, limit: i64) -> Result<u64>;

    /// One transaction of [`crate::Queue::retry_dead_matching`]: up to
    /// `limit` dead jobs (of `queue` and of `kind`, each if given) with ids
    /// above `after_id`, in id order, each made pending (due now, attempts
    /// 0) unless its unique_key is held by an unfinished job.
    fn retry_dead_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        after_id: i64,
        limit: i64,
    ) -> Result<RetryDeadBatch>;

    /// One transaction of [`crate::Queue::delete_dead`]: deletes up to
    /// `limit` dead jobs (of `queue` and of `kind`, each if given) in one
    /// statement, passing over those whose lease still holds (as
    /// `prune_batch` does). Returns how many.
    fn delete_dead_batch(&self, queue: Option<&str>, kind: Option<&str>, limit: i64)
        -> Result<u64>;

    /// One transaction of [`crate::Queue::cancel_pending`]: cancels up to
    /// `limit` pending jobs (of `queue` and of `kind`, each if given) in
    /// one statement, as [`crate::Queue::cancel`] does each (their leases,
    /// if any, kept). Returns how many, and the (limit, key) of each
    /// cancelled job that named a limit, once each, whose blocked jobs may
    /// now fit.
    fn cancel_pending_batch(
        &self,
        queue: Option<&str>,
        kind: Option<&str>,
        limit: i64,
    ) -> Result<(u64, Vec<(String, String)>)>;

    /// See [`crate::Queue::pause_queue`] and [`crate::Queue::resume_queue`];
    /// resuming wakes the watchers of every process.
    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()>;

    /// See [`crate::Queue::paused_queues`].
    fn paused_queues(&self) -> Result<Vec<String>>;
}

/// Reads of jobs and counts for operators, dashboards and pools; they
/// write nothing (each engine's `read.rs`).
pub(crate) trait Reads {
    /// See [`crate::Queue::get`].
    fn get(&self, id: JobId) -> Result<Job>;
    /// See [`crate::Queue::parents`].
    fn dependencies(&self, id: JobId) -> Result<Vec<crate::Dependency>>;

    /// See [`crate::Queue::list`].
    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>>;

    /// See [`crate::Queue::count`].
    fn count(&self, state: JobState) -> Result<u64>;

    /// See [`crate::Queue::stats`].
    fn stats(&self) -> Result<Stats>;

    /// See [`crate::Queue::finished_since`].
    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64>;

    /// See [`crate::Queue::unfinished`].
    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64>;

    /// The first queue after `after` (byte order) with jobs in `state`: one
    /// step through an index of that state (for `counts_by_queue` and
    /// `list_state`).
    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>>;

    /// Jobs of `queue` in `state`, counted through an index, up to `cap`.
    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64>;

    /// Up to `page.limit` jobs of `queue` in `page.state` that pass the
    /// page's kind and retrying tests, past its cursor, in the order of
    /// that state's index: pending in claim order (priority, due time,
    /// id), scheduled soonest due first, running soonest lease expiry
    /// first, finished newest first. `page.queue` is not read: the caller
    /// names each queue. Each condition of [`types::page_after`] is one
    /// statement, run in turn until the page is full.
    fn page_in_queue(&self, page: &JobPage, queue: &str) -> Result<Vec<Job>>;

    /// The unfinished job that holds `key` (at most one does), through
    /// the unique index of unfinished keys.
    fn holding_unique_key(&self, key: &str) -> Result<Option<Job>>;
    /// Jobs in `state` (of `queue` and of `kind`, each if given), counted
    /// through that state's index, up to `cap` (see
    /// [`crate::Ops::count_matching`]).
    fn count_matching(
        &self,
        state: JobState,
        queue: Option<&str>,
        kind: Option<&str>,
        cap: u64,
    ) -> Result<u64>;

    /// Due time (ms) of the longest-waiting due job of `queue`: the
    /// earliest run_at of its pending jobs and of its scheduled jobs due by
    /// the engine's clock, each one step of its index.
    fn oldest_due_in_queue(&self, queue: &str) -> Result<Option<i64>>;

    /// The jobs that finished at or after `from_ms` and before `to_ms`:
    /// their number, counted through the finish-time index up to `cap`;
    /// the dead among them, counted queue by queue of `dead_queues`
    /// through the index of finished jobs by state, up to `cap` in all;
    /// and up to `sample` of them, the last to finish first (for
    /// `Queue::activity`). The dead are not counted over the finished
    /// count's rows: that index holds no status, so it would read up to
    /// `cap` table rows per slice where these counts read index entries
    /// only.
    fn finished_between(
        &self,
        from_ms: i64,
        to_ms: i64,
        cap: u64,
        sample: usize,
        dead_queues: &[String],
    ) -> Result<(u64, u64, Vec<FinishedSample>)>;
}

/// Batches (each engine's `batches.rs`; the rules are
/// `crate::queue::batches`).
pub(crate) trait Batches {
    /// Stores an open batch and its `callbacks` (validated, each with its
    /// role) in one transaction; returns its id.
    fn open_batch(
        &self,
        description: Option<&str>,
        callbacks: Vec<(crate::batch::Callback, ValidJob)>,
    ) -> Result<crate::BatchId>;
    /// See [`crate::Queue::seal_batch`].
    fn seal_batch(&self, id: crate::BatchId) -> Result<()>;
    /// See [`crate::Queue::batch`].
    fn batch(&self, id: crate::BatchId) -> Result<crate::Batch>;
    /// See [`crate::Queue::batch_members`].
    fn batch_members(
        &self,
        id: crate::BatchId,
        after: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<Job>>;
}

/// An engine: where jobs are stored, claimed and fenced, and schedules
/// fire. Its parts are the traits above, one file of the engine's folder
/// each, since a type has one impl block per trait; every type with all of
/// them is an engine.
pub(crate) trait Engine:
    Capabilities
    + ScheduleStore
    + LimitStore
    + Enqueue
    + Claims
    + Leases
    + Admin
    + Reads
    + Batches
    + Send
    + Sync
{
}

impl<T> Engine for T where
    T: Capabilities
        + ScheduleStore
        + LimitStore
        + Enqueue
        + Claims
        + Leases
        + Admin
        + Reads
        + Batches
        + Send
        + Sync
{
}

/// One finished job as `Queue::activity` reads it: what lateness and run
/// time are computed from, without the payload.
#[derive(Debug, Clone)]
pub(crate) struct FinishedSample {
    /// `None` for a status this build does not know (a newer writer).
    pub state: Option<JobState>,
    pub run_at_ms: i64,
    /// Start of the attempt that finished; absent for a job cancelled
    /// before it ever ran.
    pub claimed_at_ms: Option<i64>,
    pub finished_at_ms: i64,
}

/// Jobs per (queue, state) for `Queue::stats`, in one statement (one
/// snapshot) on either engine: one part per state, each in the words of
/// that state's partial index (see [`state_index`]), so that no part reads
/// the table itself except for running jobs, which are few. A plain
/// `GROUP BY queue, status` reads every row, payloads included.
pub(crate) const STATS_COUNTS_SQL: &str =
    "SELECT queue, 'pending', count(*) FROM tickler_jobs WHERE status = 'pending' GROUP BY queue
     UNION ALL
     SELECT queue, 'waiting', count(*) FROM tickler_jobs WHERE status = 'waiting' GROUP BY queue
     UNION ALL
     SELECT queue, 'scheduled', count(*) FROM tickler_jobs WHERE status = 'scheduled' GROUP BY queue
     UNION ALL
     SELECT queue, 'blocked', count(*) FROM tickler_jobs
     WHERE limit_name IS NOT NULL AND status = 'blocked' GROUP BY queue
     UNION ALL
     SELECT queue, 'running', count(*) FROM tickler_jobs WHERE status = 'running' GROUP BY queue
     UNION ALL
     SELECT queue, status, count(*) FROM tickler_jobs
     WHERE status IN ('succeeded', 'dead', 'cancelled') AND finished_at IS NOT NULL
     GROUP BY status, queue";

/// The condition that selects `state` in words an index of that state
/// matches (its partial index's WHERE clause), and the order of that index
/// within one queue. Shared by the engines' dashboard reads.
pub(crate) fn state_index(state: JobState) -> (&'static str, &'static str) {
    match state {
        JobState::Waiting => ("status = 'waiting'", "id"),
        JobState::Pending => ("status = 'pending'", "priority DESC, run_at, id"),
        JobState::Blocked => (
            "limit_name IS NOT NULL AND status = 'blocked'",
            "priority DESC, run_at, id",
        ),
        JobState::Scheduled => ("status = 'scheduled'", "run_at, id"),
        JobState::Running => ("status = 'running'", "lease_expires_at, id"),
        JobState::Succeeded => (
            "status = 'succeeded' AND finished_at IS NOT NULL",
            "finished_at DESC, id DESC",
        ),
        JobState::Dead => (
            "status = 'dead' AND finished_at IS NOT NULL",
            "finished_at DESC, id DESC",
        ),
        JobState::Cancelled => (
            "status = 'cancelled' AND finished_at IS NOT NULL",
            "finished_at DESC, id DESC",
        ),
    }
}

/// Whether `location` names a PostgreSQL database (`postgres://…` or
/// `postgresql://…`).
pub(crate) fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// Whether `location` names a MySQL or MariaDB database (`mysql://…` or
/// `mariadb://…`).
pub(crate) fn is_mysql_url(location: &str) -> bool {
    location.starts_with("mysql://") || location.starts_with("mariadb://")
}

/// Whether [`crate::Queue::open`] reads `location` as a file (SQLite)
/// rather than the URL of a database server: for callers that check a
/// file's path and permissions before opening it, as the `tickler` binary
/// does.
pub fn is_file_location(location: &str) -> bool {
    !is_postgres_url(location) && !is_mysql_url(location)
}

/// `location` (a path or URL) as it may be shown in messages and logs: a
/// password in a URL is replaced by `***`.
pub fn redacted_location(location: &str) -> String {
    let Some(scheme_end) = location.find("://").map(|i| i + 3) else {
        return location.to_owned();
    };
    let rest = &location[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &location[..scheme_end],
            &authority[..colon],
            &rest[at..]
        ),
        _ => location.to_owned(),
    }
}

/// What firing a schedule asks of the engine, inside the transaction in
/// which the engine holds the due schedules (SQLite: `BEGIN IMMEDIATE`).
pub(crate) trait ScheduleTx {
    /// The unfinished runs (tick jobs scheduled, pending or running) of
    /// schedule `name`, oldest first.
    fn unfinished_runs(&self, name: &str) -> Result<Vec<(JobId, JobState)>>;
    /// A cancelled or dead run of schedule `name` whose lease, kept for
    /// its handler, has not run out at `now`.
    fn stopping_run(&self, name: &str, now: i64) -> Result<Option<(JobId, JobState)>>;
    /// Pauses a schedule that cannot fire with this build, with `error` in
    /// the log.
    fn pause_broken(&self, schedule: &Schedule, now: i64, error: &Error) -> Result<()>;
    /// Moves schedule `name` on to `after`, adding `skipped` skipped ticks,
    /// if it is still active and still due at `first_due`; false if another
    /// scheduler handled these ticks first.
    fn advance(
        &self,
        name: &str,
        first_due: i64,
        after: &Handled,
        skipped: u64,
        now: i64,
    ) -> Result<bool>;
    /// Inserts the tick jobs (validated by the queue).
    fn insert_jobs(&self, rows: &[ValidJob], now: i64) -> Result<Vec<JobId>>;
    /// Moves active schedules written "after" `now` (the wall clock was
    /// stepped back since) to their next unhandled tick after `now`.
    fn rebase_stepped(&self, now: i64) -> Result<()>;
    /// Up to `batch` active schedules due at `now` with their record of
    /// handled ticks, soonest due first; rows another transaction is
    /// firing are left to it where the engine can tell.
    fn due_schedules(&self, now: i64, batch: i64) -> Result<Vec<(Schedule, Handled)>>;
    /// The next tick of any active schedule (now, if one was written
    /// "after" `now`).
    fn next_tick(&self, now: i64) -> Result<Option<DateTime<Utc>>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_in_urls() {
        assert_eq!(
            redacted_location("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redacted_location("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redacted_location("./jobs.db"), "./jobs.db");
        assert_eq!(
            redacted_location("mysql://u:p%40ss@h:3306/db"),
            "mysql://u:***@h:3306/db"
        );
        assert!(!is_file_location("mariadb://u@h/db"));
    }
}
