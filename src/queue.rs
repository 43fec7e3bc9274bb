//! [`Queue`]: opening a tickler file, and every SQL statement on jobs.
//!
//! Where things happen, for a newcomer:
//! - claiming: [`Queue::claim_kinds`] (`PROMOTE_SQL`, then one `UPDATE … RETURNING`);
//! - fencing by run_token: [`Queue::heartbeat_many`] and
//!   [`Queue::record_outcomes`], every statement guarded by
//!   `id AND run_token AND status = 'running'`;
//! - the reaper's conditional update: [`Queue::reap`];
//! - reading "now": `self.now_ms()`, through the queue's [`Clock`];
//! - the write path: [`Queue::write`], one mutex-guarded connection per
//!   process, `BEGIN IMMEDIATE`, bounded jittered retry on `SQLITE_BUSY`.

use crate::clock::{ms_to_datetime, Clock, SystemClock};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState, NewJob};
use crate::lease::Lease;
use crate::metrics::WriteLockWaits;
use crate::retry::RetryPolicy;
use crate::sqlite::rows::*;
use crate::sqlite::sql::*;
use crate::sqlite::{open_error, Commit, Store, StoreSettings};
pub use crate::sqlite::{ChangeWatcher, Waker};
use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Latest timestamp tickler stores: 9999-12-31T23:59:59.999Z, in ms.
pub const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// Deepest nesting of arrays and objects a payload may have (`[[0]]` is 2).
/// serde_json reads at most 128 levels back, SQLite's `json_valid` accepts
/// 1,000: without a limit below both, a payload could be stored that no
/// one can read. Deeper payloads are refused with [`Error::PayloadTooDeep`].
pub const MAX_PAYLOAD_DEPTH: usize = 100;

/// Longest unique_key, in bytes of UTF-8 ([`Error::UniqueKeyTooLong`]).
pub const MAX_UNIQUE_KEY_BYTES: usize = 1024;

/// Largest [`QueueBuilder::max_payload_bytes`] accepted with SQLite's
/// default length limit (1,000,000,000 bytes per value and per row): the
/// limit less 1 MiB for the row's other columns. A connection whose
/// `SQLITE_LIMIT_LENGTH` was lowered (by an `on_connection` hook) lowers
/// it accordingly; [`QueueBuilder::open`] checks.
pub const MAX_PAYLOAD_BYTES_LIMIT: usize = 1_000_000_000 - ROW_HEADROOM;

/// Room kept in a row for everything but the payload: names, unique_key,
/// last_error and the error history are all capped well below this.
const ROW_HEADROOM: usize = 1024 * 1024;

/// Longest error text stored per attempt, in bytes. A longer one keeps its
/// first 6 KiB and last 2 KiB around a note of how much was cut: handler
/// errors can be whole HTTP bodies or logs, and one over SQLite's length
/// limit used to lose every outcome of its batch.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// Failed attempts whose errors a job keeps in [`Job::errors`]; older ones
/// are dropped as new ones come.
pub const ERROR_HISTORY_MAX: usize = 20;

/// Most scheduled jobs one claim transaction promotes to pending, so a
/// million jobs falling due at once cannot make one claim transaction long.
const PROMOTE_BATCH: i64 = 5_000;

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

/// A reaper look that got the write lock within this got it "without
/// waiting" (in-process writers are short; another connection's hold is
/// seen by the busy handler being called at all).
const REAP_CLEAN_WAIT: Duration = Duration::from_millis(2);

/// Most expired leases one reaper transaction takes back.
const REAP_BATCH: i64 = 1_000;

/// Most finished jobs one prune transaction deletes.
const PRUNE_BATCH: i64 = 5_000;

/// How a commit reaches the disk. Chosen per [`Queue`] (per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: every commit is fsynced before it returns, so an
    /// enqueue that returned `Ok` survives power loss. The default, because
    /// edge boxes lose power.
    #[default]
    Full,
    /// `synchronous=NORMAL`: commits survive a crash of the process but the
    /// last ones may be lost on power loss or an OS crash. Much faster on
    /// slow storage.
    Normal,
}

impl Durability {
    /// The value of `PRAGMA synchronous` for this level.
    pub(crate) fn pragma_value(self) -> i64 {
        match self {
            Durability::Full => 2,
            Durability::Normal => 1,
        }
    }
}

/// Extra set-up run on every connection tickler opens; see
/// [`QueueBuilder::on_connection`].
pub type ConnectionHook = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// Settings for opening a [`Queue`]; get one from [`Queue::builder`].
#[derive(Clone)]
pub struct QueueBuilder {
    path: PathBuf,
    durability: Durability,
    busy_timeout: Duration,
    busy_retry: Duration,
    max_payload_bytes: usize,
    retry_policy: RetryPolicy,
    clock: Arc<dyn Clock>,
    read_connections: u32,
    on_connection: Option<ConnectionHook>,
}

impl std::fmt::Debug for QueueBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueBuilder")
            .field("path", &self.path)
            .field("durability", &self.durability)
            .field("busy_timeout", &self.busy_timeout)
            .field("busy_retry", &self.busy_retry)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("retry_policy", &self.retry_policy)
            .field("clock", &self.clock)
            .field("read_connections", &self.read_connections)
            .field("on_connection", &self.on_connection.is_some())
            .finish()
    }
}

impl QueueBuilder {
    /// [`Durability::Full`] (default) or [`Durability::Normal`].
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long one attempt to get SQLite's write lock waits for another
    /// process, in short jittered sleeps (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// After the busy timeout, how long the whole transaction is retried
    /// with jittered backoff before [`Error::Busy`] (default 25 s).
    pub fn busy_retry(mut self, window: Duration) -> Self {
        self.busy_retry = window;
        self
    }

    /// Largest payload, as serialized JSON, in bytes (default 1 MiB).
    pub fn max_payload_bytes(mut self, limit: usize) -> Self {
        self.max_payload_bytes = limit;
        self
    }

    /// Backoff after failed attempts and expired leases (default:
    /// [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = policy;
        self
    }

    /// Where "now" comes from (default [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Size of the pool of read connections (default 4, at least 1).
    pub fn read_connections(mut self, n: u32) -> Self {
        self.read_connections = n.max(1);
        self
    }

    /// Runs `hook` on every connection tickler opens on the file (the
    /// writer, readers and [`Queue::open_connection`]), after
    /// tickler's own pragmas: for settings such as `cache_size` or
    /// `mmap_size`. Must not change `journal_mode` or `synchronous`.
    pub fn on_connection(
        mut self,
        hook: impl Fn(&Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.on_connection = Some(Arc::new(hook));
        self
    }

    /// Opens (creating if needed) the file and migrates its schema.
    ///
    /// A new file is created readable and writable by its owner only (0600).
    /// Sets `journal_mode=WAL`, `synchronous` per [`Durability`],
    /// `foreign_keys=ON`, and reads each back.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] (the file is not SQLite or is damaged; it is
    /// not modified), [`Error::ReadOnly`], [`Error::SchemaTooNew`],
    /// [`Error::NotWal`], [`Error::PragmaMismatch`], [`Error::Io`],
    /// [`Error::Busy`].
    pub fn open(self) -> Result<Queue> {
        let path = self.path.clone();
        check_payload_limit(
            self.max_payload_bytes,
            MAX_PAYLOAD_BYTES_LIMIT + ROW_HEADROOM,
        )?;
        let (store, length_limit) = Store::open(&StoreSettings {
            path: &path,
            durability: self.durability,
            busy_timeout: self.busy_timeout,
            busy_retry: self.busy_retry,
            read_connections: self.read_connections,
            on_connection: self.on_connection.as_ref(),
        })?;
        check_payload_limit(self.max_payload_bytes, length_limit)?;
        let queue = Queue {
            inner: Arc::new(Inner {
                config: self,
                store,
            }),
        };
        if let Ok(false) = Queue::file_is_private(&path) {
            log::warn!(
                "{}: other users can read (or write) this queue file or its -wal/-shm file, and so every job's payload; `chmod 600` them unless they are meant to be shared",
                path.display()
            );
        }
        Ok(queue)
    }
}

/// A handle on one tickler file. Cheap to clone; clones share one write
/// connection and one pool of read connections. Any number of `Queue`s in
/// any number of processes may open the same file.
#[derive(Clone, Debug)]
pub struct Queue {
    inner: Arc<Inner>,
}

struct Inner {
    config: QueueBuilder,
    /// The engine: connections, write transactions, wake-ups.
    store: Store,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("path", &self.config.path)
            .field("durability", &self.config.durability)
            .finish()
    }
}

/// What to record for a claimed job; see [`Queue::record_outcomes`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The job succeeded.
    Complete,
    /// The attempt failed: retry after backoff if attempts are left,
    /// otherwise dead. The message is kept as `last_error`.
    Fail(String),
    /// The job failed for good: dead now, whatever attempts are left.
    FailPermanently(String),
    /// Not now: back to waiting until the given time, the attempt given back.
    Snooze(DateTime<Utc>),
    /// Hand the job back unstarted: pending at once, the attempt given back
    /// (used by the worker pool on shutdown).
    Release,
    /// The handler ran past the job's timeout and is still running (a
    /// worker pool gave up on it): the attempt fails as with
    /// [`Outcome::Fail`], but the run may still have effects, so until its
    /// lease runs out (no one renews it any more) the job's retry waits and,
    /// if it is dead, its unique_key stays held. A refused outcome from that
    /// run, when its handler finally returns, frees the key at once.
    TimedOut(String),
}

/// When the outcomes of [`Queue::record_and_claim`] reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeSync {
    /// With this commit (fsync under [`Durability::Full`]).
    Now,
    /// Later: the commit is not fsynced; the caller calls [`Queue::sync`]
    /// within a bounded time. A power loss in between undoes the outcomes,
    /// so those jobs run again (at-least-once), never lost. The worker pool
    /// uses this to keep claims from waiting behind outcome fsyncs.
    Deferred,
}

/// What to claim; see [`Queue::record_and_claim`].
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// Queues to claim from. Each first gets a fair share of `max`
    /// (`max / queues`, rounded up); what is left is filled from the queues
    /// in this order. A fetcher serving several queues should rotate the
    /// order from claim to claim.
    pub queues: &'a [&'a str],
    /// Written into `claimed_by`.
    pub worker_id: &'a str,
    /// Most jobs to claim.
    pub max: usize,
    /// Lease length from now (at least 1 ms).
    pub lease: Duration,
    /// Only these kinds, if given.
    pub kinds: Option<&'a [&'a str]>,
    /// How many of the jobs (spread over the queues' shares) to take by
    /// due time, oldest first, whatever their priority, before the rest in
    /// priority order: priority aging, so that a flood of high-priority
    /// jobs cannot starve a low-priority one. 0 for strict priority order.
    pub oldest_first: usize,
}

/// Filter for [`Queue::list`]. `None` fields match everything.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFilter {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs of this queue.
    pub queue: Option<String>,
    /// Only jobs of this kind.
    pub kind: Option<String>,
    /// At most this many jobs, oldest id first (default 100).
    pub limit: usize,
}

impl Default for JobFilter {
    fn default() -> Self {
        JobFilter {
            state: None,
            queue: None,
            kind: None,
            limit: 100,
        }
    }
}

/// What [`Queue::checkpoint`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Size of the `-wal` file before, in bytes.
    pub wal_bytes_before: u64,
    /// Size of the `-wal` file after, in bytes.
    pub wal_bytes_after: u64,
    /// False if a reader or writer kept the checkpoint from finishing.
    pub complete: bool,
}

/// Counts from [`Queue::stats`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    /// Number of jobs per (queue, state); states with no jobs are absent.
    pub counts: BTreeMap<(String, JobState), u64>,
    /// Due time of the longest-waiting due job (pending, or scheduled and
    /// already due), UTC.
    pub oldest_due: Option<DateTime<Utc>>,
    /// The same per (queue, priority): how long the oldest due job of each
    /// priority has waited shows whether a level is starved.
    pub oldest_due_by_priority: BTreeMap<(String, i32), DateTime<Utc>>,
}

impl Stats {
    /// Number of jobs in `state`, across queues.
    pub fn total(&self, state: JobState) -> u64 {
        self.counts
            .iter()
            .filter(|((_, s), _)| *s == state)
            .map(|(_, n)| n)
            .sum()
    }
}

impl Queue {
    /// Opens the file at `path` with default settings; see [`QueueBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Queue> {
        Queue::builder(path).open()
    }

    /// Settings for opening the file at `path`.
    pub fn builder(path: impl AsRef<Path>) -> QueueBuilder {
        QueueBuilder {
            path: path.as_ref().to_path_buf(),
            durability: Durability::default(),
            busy_timeout: Duration::from_secs(5),
            busy_retry: Duration::from_secs(25),
            max_payload_bytes: 1024 * 1024,
            retry_policy: RetryPolicy::default(),
            clock: Arc::new(SystemClock),
            read_connections: 4,
            on_connection: None,
        }
    }

    /// The file this queue works on.
    pub fn path(&self) -> &Path {
        self.inner.store.path()
    }

    /// The clock this queue reads "now" from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.config.clock
    }

    /// The backoff used after failures and expired leases.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.config.retry_policy
    }

    /// The schema version this build writes (`PRAGMA user_version`).
    pub fn schema_version() -> i64 {
        crate::sqlite::schema_version()
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.inner.config.clock.now_ms()
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
        let ids = self.inner.store.commit_grouped(rows, |tx, group| {
            let now = self.now_ms();
            group
                .iter()
                .map(|rows| insert_valid(tx, rows, now))
                .collect::<Result<Vec<_>>>()
        })?;
        self.notify_watchers();
        Ok(ids)
    }

    /// Opens a new connection to this queue's file with the settings tickler
    /// uses (WAL, `synchronous` per [`Durability`], tickler's busy handler,
    /// `foreign_keys`, and any [`QueueBuilder::on_connection`] hook), for
    /// the application's own tables and for [`Queue::enqueue_tx`]. Using it
    /// keeps the application and tickler from disagreeing about the journal
    /// mode or durability of the shared file.
    ///
    /// Open write transactions on it with
    /// `transaction_with_behavior(TransactionBehavior::Immediate)`: a
    /// deferred transaction that reads and then writes can fail at once with
    /// `SQLITE_BUSY` when another connection wrote in between.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::NotWal`], [`Error::PragmaMismatch`].
    pub fn open_connection(&self) -> Result<Connection> {
        self.inner.store.open_connection()
    }

    /// Writes `job` inside the caller's own transaction `tx`, opened on a
    /// connection to this queue's file (see [`Queue::open_connection`]): the
    /// job exists if and only if the caller commits. Closes the gap where an
    /// application commits its data and crashes before enqueueing.
    ///
    /// Same validation, errors and unique_key behaviour as
    /// [`Queue::enqueue`]. Durability is the caller's commit's. Worker pools
    /// in any process see the job once the caller commits (their watchers
    /// notice commits from every connection).
    ///
    /// Call it only through `tx`: a plain [`Queue::enqueue`] from the thread
    /// that holds an open write transaction on another connection waits for
    /// that transaction (and ends in [`Error::Busy`]).
    ///
    /// # Errors
    /// As [`Queue::enqueue`]. On a validation error nothing was written and
    /// the caller's transaction is open and usable. On [`Error::DiskFull`]
    /// SQLite has already rolled back the caller's whole transaction
    /// (nothing of it lands; its commit fails with "no transaction is
    /// active").
    pub fn enqueue_tx(&self, tx: &rusqlite::Transaction<'_>, job: NewJob) -> Result<JobId> {
        Ok(self.enqueue_batch_tx(tx, vec![job])?.remove(0))
    }

    /// [`Queue::enqueue_tx`] for several jobs: all or none, in the caller's
    /// transaction. Returns ids in input order.
    ///
    /// # Errors
    /// As [`Queue::enqueue_batch`].
    pub fn enqueue_batch_tx(
        &self,
        tx: &rusqlite::Transaction<'_>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<JobId>> {
        let now = self.now_ms();
        let rows = jobs
            .into_iter()
            .map(|job| self.validate(job, now))
            .collect::<Result<Vec<_>>>()?;
        let ids = insert_valid(tx, &rows, now)?;
        // Wakes this process's fetchers; they find the job once the caller
        // commits (the commit also changes data_version for every watcher).
        self.notify_watchers();
        Ok(ids)
    }

    /// Runs `app_writes` and marks the job succeeded in one `BEGIN
    /// IMMEDIATE` transaction on tickler's write connection: the handler's
    /// own writes to tables in this file and the job's completion commit
    /// together or not at all. If the lease was lost (reaped, cancelled),
    /// the fenced completion matches no row, the whole transaction rolls
    /// back, the application's writes too, and the caller gets
    /// [`Error::LeaseLost`].
    ///
    /// This gives exactly-once effects for effects inside this file. Effects
    /// outside it (HTTP calls, e-mail) stay at-least-once: key them by the
    /// job id or run_token.
    ///
    /// Committed with the queue's [`Durability`]. `app_writes` runs inside
    /// the write transaction, holding SQLite's write lock for the whole
    /// file: keep it short (a few statements), and do no other work in it.
    /// It must not open its own transaction nor call other `Queue` writes
    /// (they return [`Error::InvalidArgument`]; write through `tx`, e.g.
    /// [`Queue::enqueue_tx`]). It may return [`Error::Aborted`] (or any
    /// error) to roll everything back; a busy error it returns comes back
    /// as [`Error::Aborted`], not retried.
    ///
    /// # Errors
    /// [`Error::LeaseLost`]; the error `app_writes` returned; [`Error::Busy`],
    /// [`Error::DiskFull`], [`Error::Sqlite`]. On any error nothing was
    /// written.
    pub fn complete_with<T>(
        &self,
        lease: &Lease,
        app_writes: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut app_writes = Some(app_writes);
        let value = self.write(|tx| {
            // Only a busy BEGIN is retried, before app_writes ran. A busy
            // error after it ran is the application's (or, not expected
            // under BEGIN IMMEDIATE, the commit's): it rolls back and is
            // returned as it is, never retried.
            let writes = app_writes.take().ok_or_else(|| {
                Error::aborted(
                    "the commit after app_writes was refused as busy; nothing was written",
                )
            })?;
            let value = writes(tx).map_err(|e| if e.is_busy() { Error::aborted(e) } else { e })?;
            let changed = tx.prepare_cached(COMPLETE_SQL)?.execute(params![
                self.now_ms(),
                lease.job_id.0,
                lease.run_token.0
            ])?;
            fenced(changed, lease)?;
            Ok(value)
        })?;
        Ok(value)
    }

    pub(crate) fn validate(&self, job: NewJob, now: i64) -> Result<ValidJob> {
        if job.kind.is_empty() {
            return Err(Error::EmptyKind);
        }
        if job.queue.is_empty() {
            return Err(Error::EmptyQueue);
        }
        if job.max_attempts == 0 {
            return Err(Error::InvalidMaxAttempts);
        }
        match job.unique_key.as_deref() {
            Some("") => {
                return Err(Error::InvalidArgument(
                    "unique_key is empty: leave it unset for no deduplication".into(),
                ))
            }
            Some(key) if key.len() > MAX_UNIQUE_KEY_BYTES => {
                return Err(Error::UniqueKeyTooLong {
                    size: key.len(),
                    limit: MAX_UNIQUE_KEY_BYTES,
                })
            }
            _ => {}
        }
        if json_depth_exceeds(&job.payload, MAX_PAYLOAD_DEPTH) {
            return Err(Error::PayloadTooDeep {
                limit: MAX_PAYLOAD_DEPTH,
            });
        }
        let payload = serde_json::to_string(&job.payload)?;
        let limit = self.inner.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit,
            });
        }
        let run_at = match (job.run_at, job.delay) {
            // Any past time means "due now", also one before 1970, which
            // the stored range (ms since 1970) cannot hold.
            (Some(at), _) if at.timestamp_millis() < 0 => now,
            (Some(at), _) => at.timestamp_millis(),
            (None, Some(delay)) => add_ms(now, delay).ok_or(Error::TimeOutOfRange {
                what: "enqueue time plus delay",
            })?,
            (None, None) => now,
        };
        check_timestamp(run_at, "run_at")?;
        let timeout_ms = match job.timeout {
            None => None,
            Some(t) => match i64::try_from(t.as_millis()) {
                Ok(ms) if ms > 0 => Some(ms),
                Ok(_) => {
                    return Err(Error::InvalidArgument(
                        "timeout is under 1 ms: leave it unset for no timeout".into(),
                    ))
                }
                Err(_) => return Err(Error::TimeOutOfRange { what: "timeout" }),
            },
        };
        Ok(ValidJob {
            job,
            payload,
            run_at,
            timeout_ms,
        })
    }

    // ------------------------------------------------------------------ claim

    /// Claims up to `max` due jobs of `queue`, of any kind; see [`Queue::claim_kinds`].
    pub fn claim(
        &self,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<Lease>> {
        self.claim_kinds(queue, worker_id, max, lease, None)
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
            .record_and_claim(&[], Some(&request), OutcomeSync::Now)?
            .1)
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
        let kind_filter = kind_filter(kinds, 2);
        let now = self.now_ms();
        let now_mark = format!("?{}", kinds.map_or(0, <[&str]>::len) + 2);
        let earliest = self.read(|conn| {
            let mut earliest: Option<i64> = None;
            for queue in queues {
                let mut values: Vec<&dyn rusqlite::ToSql> = vec![queue];
                if let Some(kinds) = kinds {
                    values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
                }
                values.push(&now);
                let unblocked = unblocked(&now_mark);
                // A pending job is due whatever its run_at: it was due when
                // it became pending, and a run_at ahead of now only means
                // the wall clock was stepped back since (waiting for it to
                // catch up could take hours). Pending jobs whose unique_key
                // waits for a cancelled holder to stop are left out: they
                // are due when it stops (a commit, which wakes fetchers) or
                // its lease runs out (below).
                let pending: bool = conn
                    .prepare_cached(&format!(
                        "SELECT EXISTS (SELECT 1 FROM tickler_jobs AS job
                         WHERE status = 'pending' AND queue = ?1 {kind_filter} AND {unblocked})"
                    ))?
                    .query_row(values.as_slice(), |r| r.get(0))?;
                if pending {
                    return Ok(Some(now));
                }
                let scheduled: Option<i64> = conn
                    .prepare_cached(&format!(
                        "SELECT run_at FROM tickler_jobs WHERE status = 'scheduled' AND queue = ?1
                         {kind_filter} ORDER BY run_at LIMIT 1"
                    ))?
                    .query_row(&values[..values.len() - 1], |r| r.get(0))
                    .optional()?;
                if let Some(at) = scheduled {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            // When the first cancelled holder's lease runs out, a job
            // waiting for its unique_key may start (an over-estimate at
            // worst: one claim that finds nothing).
            let stopping: Option<i64> = conn
                .prepare_cached(
                    "SELECT min(lease_expires_at) + 1 FROM tickler_jobs
                     WHERE status IN ('cancelled', 'dead') AND lease_expires_at >= ?1
                       AND unique_key IS NOT NULL",
                )?
                .query_row([now], |r| r.get(0))?;
            if let Some(at) = stopping {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
            Ok(earliest)
        })?;
        Ok(earliest.map(ms_to_datetime))
    }

    // ------------------------------------------------------- leases, fenced

    /// Extends the lease to `extend_by` from now.
    /// Returns the new expiry (UTC).
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn heartbeat(&self, lease: &Lease, extend_by: Duration) -> Result<DateTime<Utc>> {
        self.heartbeat_many(&[lease], extend_by)?.remove(0)
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
        let extend_ms = duration_ms(extend_by, "lease extension")?;
        self.write_with(Commit::Lazy, |tx| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            // lease_ms: the length granted, for the reaper's backward-step rule.
            let mut stmt = tx.prepare_cached(
                "UPDATE tickler_jobs SET lease_expires_at = ?1, lease_ms = ?1 - ?4
                 WHERE id = ?2 AND run_token = ?3 AND status = 'running'",
            )?;
            leases
                .iter()
                .map(|lease| {
                    let renewed = isolated(tx, || {
                        Ok(stmt.execute(params![
                            expires,
                            lease.job_id.0,
                            lease.run_token.0,
                            now
                        ])?)
                    })?;
                    Ok(renewed.and_then(|changed| {
                        fenced(changed, lease).map(|()| ms_to_datetime(expires))
                    }))
                })
                .collect()
        })
    }

    /// Whether each lease is still held (the job is `running` under its
    /// run_token), without writing: a cheap read that lets a worker pool
    /// notice a cancelled or reaped job between heartbeats.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        let ids = serde_json::to_string(&leases.iter().map(|l| l.job_id.0).collect::<Vec<_>>())?;
        // One statement, so one read transaction, for all of them: a pool
        // asks this ten times a second while it works.
        let running: HashMap<i64, String> = self.read(|conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT id, run_token FROM tickler_jobs
                     WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'running'",
                )?
                .query_map([ids], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })?;
        Ok(leases
            .iter()
            .map(|l| running.get(&l.job_id.0) == Some(&l.run_token.0))
            .collect())
    }

    /// Marks the job succeeded.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn complete(&self, lease: &Lease) -> Result<()> {
        self.record_one(lease, Outcome::Complete)
    }

    /// Records a failed attempt: back to waiting for `now + backoff(attempt)`
    /// if attempts are left, otherwise `dead`. `error` is kept as `last_error`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn fail(&self, lease: &Lease, error: &str) -> Result<()> {
        self.record_one(lease, Outcome::Fail(error.to_owned()))
    }

    /// Marks the job dead at once, keeping `error` as `last_error`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn fail_permanently(&self, lease: &Lease, error: &str) -> Result<()> {
        self.record_one(lease, Outcome::FailPermanently(error.to_owned()))
    }

    /// Puts the job back to wait until `until` without consuming the attempt.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed);
    /// [`Error::TimeOutOfRange`].
    pub fn snooze(&self, lease: &Lease, until: DateTime<Utc>) -> Result<()> {
        self.record_one(lease, Outcome::Snooze(until))
    }

    /// Hands an unstarted job back: pending at once, attempt not consumed.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the lease is no longer held (nothing changed).
    pub fn release(&self, lease: &Lease) -> Result<()> {
        self.record_one(lease, Outcome::Release)
    }

    fn record_one(&self, lease: &Lease, outcome: Outcome) -> Result<()> {
        self.record_outcomes(&[(lease, outcome)])?.remove(0)
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
    /// to the job's error history ([`Job::errors`], the last
    /// [`ERROR_HISTORY_MAX`]).
    ///
    /// # Errors
    /// Outer: the transaction failed and nothing was recorded
    /// ([`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]).
    pub fn record_outcomes(&self, outcomes: &[(&Lease, Outcome)]) -> Result<Vec<Result<()>>> {
        Ok(self.record_and_claim(outcomes, None, OutcomeSync::Now)?.0)
    }

    /// Records `outcomes` (as [`Queue::record_outcomes`]) and then claims
    /// (as [`Queue::claim_kinds`], over `claim.queues` in order until
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
        let claim = match claim {
            Some(c) if c.max > 0 && !c.kinds.is_some_and(|k| k.is_empty()) => {
                let sql = (
                    claim_sql(c.kinds, ClaimOrder::Priority),
                    claim_sql(c.kinds, ClaimOrder::Oldest),
                );
                Some((c, duration_ms(c.lease, "lease")?, sql))
            }
            _ => None,
        };
        if outcomes.is_empty() && claim.is_none() {
            return Ok((Vec::new(), Vec::new()));
        }
        let policy = self.inner.config.retry_policy;
        let commit = if outcomes.is_empty() || sync == OutcomeSync::Deferred {
            Commit::Lazy
        } else {
            Commit::Durable
        };
        let mut pending_outcomes = outcomes;
        let mut commit = commit;
        let mut results = Vec::with_capacity(outcomes.len());
        let leases = loop {
            let (recorded, claimed) = self.write_with(commit, |tx| {
                let now = self.now_ms();
                let mut recorded = Vec::with_capacity(pending_outcomes.len());
                let mut rest = pending_outcomes;
                while let Some(((lease, outcome), after)) = rest.split_first() {
                    // A run of successes is one statement (see complete_many).
                    let run = rest
                        .iter()
                        .take_while(|(_, o)| *o == Outcome::Complete)
                        .count();
                    if run > 1 {
                        complete_many(tx, &rest[..run], now, &policy, &mut recorded)?;
                        rest = &rest[run..];
                    } else {
                        recorded.push(record_in(tx, lease, outcome, now, &policy)?);
                        rest = after;
                    }
                }
                let Some((request, lease_ms, sql)) = &claim else {
                    return Ok((recorded, Some(Vec::new())));
                };
                // Claim order (priority first) only holds if every due job
                // is pending. A backlog larger than one promotion batch
                // (a box that was off) is promoted over several short
                // transactions before anything is claimed.
                let mut backlog = false;
                for queue in request.queues {
                    let promoted = tx.prepare_cached(PROMOTE_SQL)?.execute(params![
                        queue,
                        now,
                        PROMOTE_BATCH
                    ])?;
                    backlog |= promoted as i64 >= PROMOTE_BATCH;
                }
                if backlog {
                    return Ok((recorded, None));
                }
                let expires = now.saturating_add(*lease_ms).min(MAX_TIMESTAMP_MS);
                let mut leases = Vec::new();
                let mut claim_from =
                    |queue: &str, want: usize, order: ClaimOrder| -> Result<usize> {
                        if want == 0 {
                            return Ok(0);
                        }
                        let want = i64::try_from(want).unwrap_or(i64::MAX);
                        let mut values: Vec<&dyn rusqlite::ToSql> =
                            vec![&request.worker_id, &now, &expires, &queue, &want];
                        if let Some(kinds) = request.kinds {
                            values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
                        }
                        let sql = match order {
                            ClaimOrder::Priority => &sql.0,
                            ClaimOrder::Oldest => &sql.1,
                        };
                        let mut claimed = claim_rows(tx, sql, &values, now)?;
                        // RETURNING gives rows in no promised order.
                        claimed.sort_by(|a, b| order.compare(a, b));
                        let n = claimed.len();
                        leases.extend(claimed);
                        Ok(n)
                    };
                // A fair share of the claim per queue first (so one busy
                // queue cannot starve the others a pool serves), the
                // oldest due jobs first within it when asked (priority
                // aging); then whatever is left, queue by queue.
                let share = request.max.div_ceil(request.queues.len().max(1));
                let mut aged_left = request.oldest_first.min(request.max);
                let mut taken = 0;
                // Queues that gave all they were asked for may have more.
                let mut may_have_more = Vec::new();
                for queue in request.queues {
                    let room = share.min(request.max - taken);
                    let aged = claim_from(queue, aged_left.min(room), ClaimOrder::Oldest)?;
                    aged_left -= aged;
                    let rest = claim_from(queue, room - aged, ClaimOrder::Priority)?;
                    taken += aged + rest;
                    if aged + rest == room {
                        may_have_more.push(*queue);
                    }
                }
                for queue in may_have_more {
                    taken += claim_from(queue, request.max - taken, ClaimOrder::Priority)?;
                }
                Ok((recorded, Some(leases)))
            })?;
            results.extend(recorded);
            pending_outcomes = &[];
            commit = Commit::Lazy;
            if let Some(claimed) = claimed {
                break claimed;
            }
        };
        if outcomes
            .iter()
            .any(|(_, o)| !matches!(o, Outcome::Complete | Outcome::FailPermanently(_)))
        {
            self.notify_watchers();
        }
        Ok((results, leases))
    }

    // ----------------------------------------------------------------- reaper

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
        self.reap_settled(now.timestamp_millis())
    }

    fn reap_expired_before(&self, cutoff: Option<i64>) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let look = self.reap_look(cutoff, |_, _| true)?;
            total += look.taken;
            if !look.batch_full {
                break;
            }
        }
        if total > 0 {
            self.notify_watchers();
        }
        Ok(total)
    }

    /// [`Queue::reap_at`]: a lease is taken back only once two looks, at
    /// least `REAP_SETTLE` apart, each of which got the write lock without
    /// waiting for another connection, saw it expired with the same expiry.
    fn reap_settled(&self, cutoff: i64) -> Result<u64> {
        let mut total = 0u64;
        // The previous look: what it saw expired and left, and whether it
        // got the write lock without waiting.
        let mut previous: Option<(HashSet<ExpiredLease>, bool)> = None;
        for look in 1..=REAP_MAX_LOOKS {
            let last = look == REAP_MAX_LOOKS;
            let before = previous.take();
            let result = self.reap_look(Some(cutoff), |lease, waited| {
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
            previous = Some((result.left.into_iter().collect(), !result.waited));
            if !last {
                std::thread::sleep(REAP_SETTLE);
            }
        }
        if total > 0 {
            self.notify_watchers();
        }
        Ok(total)
    }

    /// One look of the reaper in one write transaction: finds leases that
    /// expired before `cutoff` (or now, if earlier), at most `REAP_BATCH`,
    /// and takes back those `take` accepts. `take` is also told whether
    /// getting the write lock had to wait for another connection (or more
    /// than `REAP_CLEAN_WAIT` for this process's own writers).
    fn reap_look(
        &self,
        cutoff: Option<i64>,
        take: impl Fn(&ExpiredLease, bool) -> bool,
    ) -> Result<ReapLook> {
        let policy = self.inner.config.retry_policy;
        let asked = Instant::now();
        let busy_before = crate::sqlite::busy_waits();
        self.write_with(Commit::Lazy, |tx| {
            let waited = crate::sqlite::busy_waits() != busy_before
                || asked.elapsed() > REAP_CLEAN_WAIT;
            // A backward step of the wall clock leaves leases that were
            // granted "in the future": one whose expiry lies further ahead
            // than its length (lease_ms, plus a margin for noise) is set to
            // expire one length from now, so an abandoned job is taken back
            // on time while a live holder's next heartbeat renews it as
            // usual. Judged against the time inside this transaction: every
            // lease committed before it was granted at or before then.
            let stepped_now = self.now_ms();
            let margin = crate::reaper::BACKWARD_STEP_MARGIN.as_millis() as i64;
            tx.prepare_cached(LEASE_STEP_SQL)?
                .execute(params![stepped_now, margin])?;
            // The same for a cancelled job's kept lease, which holds its
            // unique_key (a separate statement: each uses its own index).
            tx.prepare_cached(CANCELLED_LEASE_STEP_SQL)?
                .execute(params![stepped_now, margin])?;
            let now = cutoff.map_or(stepped_now, |c| c.min(stepped_now));
            let expired: Vec<(ExpiredLease, u32, String)> = tx
                .prepare_cached(
                    "SELECT id, run_token, lease_expires_at, attempts, coalesce(claimed_by, '?')
                     FROM tickler_jobs
                     WHERE status = 'running' AND lease_expires_at < ?1
                     ORDER BY lease_expires_at LIMIT +?2",
                )?
                .query_map(params![now, REAP_BATCH], |r| {
                    Ok((
                        ExpiredLease {
                            id: r.get(0)?,
                            run_token: r.get(1)?,
                            expires_at: r.get(2)?,
                        },
                        r.get(3)?,
                        r.get(4)?,
                    ))
                })?
                .collect::<rusqlite::Result<_>>()?;
            // A cancelled job's holder that never reported is gone once its
            // lease ran out: its unique_key no longer waits for it.
            tx.prepare_cached(
                "UPDATE tickler_jobs SET lease_expires_at = NULL
                 WHERE status IN ('cancelled', 'dead') AND lease_expires_at < ?1",
            )?
            .execute([now])?;
            let batch_full = expired.len() as i64 >= REAP_BATCH;
            let mut taken = 0u64;
            let mut left = Vec::new();
            let mut reap = tx.prepare_cached(REAP_SQL)?;
            for (lease, attempts, worker) in expired {
                if !take(&lease, waited) {
                    left.push(lease);
                    continue;
                }
                let retry_at = retry_time(now, &policy, attempts);
                let error = format!(
                    "lease expired: worker {worker} neither renewed nor finished attempt {attempts} in time"
                );
                // One row SQLite refuses (a trigger, damage) must not keep
                // every other expired lease from being taken back.
                match isolated(tx, || {
                    Ok(reap.execute(params![
                        now,
                        retry_at,
                        cut_error(&error),
                        lease.id,
                        lease.run_token,
                        now
                    ])?)
                })? {
                    Ok(n) => taken += n as u64,
                    Err(e) => log::error!("reaper could not take back job {}: {e}", lease.id),
                }
            }
            Ok(ReapLook {
                taken,
                left,
                batch_full,
                waited,
            })
        })
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
        self.write(|tx| {
            let state = state_of(tx, id)?;
            if state.is_terminal() {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "cancel",
                });
            }
            // A running job keeps its run_token and lease: until its holder
            // has stopped (its outcome, refused, clears the lease) or the
            // lease runs out, no other job with its unique_key starts.
            tx.prepare_cached(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?1,
                     lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at END
                 WHERE id = ?2",
            )?
            .execute(params![self.now_ms(), id.0])?;
            Ok(())
        })
    }

    /// Makes a dead or cancelled job pending again, due now, with fresh
    /// attempts (`attempts = 0`); `last_error` and the error history are
    /// kept. A job cancelled while running whose holder has not reported
    /// yet is due when that holder's lease runs out instead.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::InvalidState`] unless dead or cancelled;
    /// [`Error::UniqueKeyHeld`] if its unique_key now belongs to another
    /// unfinished job.
    pub fn retry(&self, id: JobId) -> Result<()> {
        self.write(|tx| {
            let state = state_of(tx, id)?;
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "retry",
                });
            }
            let holder: Option<(String, i64)> = tx
                .prepare_cached(
                    "SELECT held.unique_key, held.id FROM tickler_jobs AS job
                     JOIN tickler_jobs AS held ON held.unique_key = job.unique_key
                     WHERE job.id = ?1 AND held.status IN ('scheduled', 'pending', 'running')",
                )?
                .query_row([id.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((unique_key, held_by)) = holder {
                return Err(Error::UniqueKeyHeld {
                    job_id: id,
                    unique_key,
                    held_by: JobId(held_by),
                });
            }
            // A cancelled job whose holder may still be running waits for
            // its lease to run out, so the retry never runs beside it.
            tx.prepare_cached(
                "UPDATE tickler_jobs
                 SET status = CASE WHEN lease_expires_at >= ?1 THEN 'scheduled' ELSE 'pending' END,
                     run_at = CASE WHEN lease_expires_at >= ?1 THEN lease_expires_at + 1 ELSE ?1 END,
                     attempts = 0, finished_at = NULL, lease_expires_at = NULL
                 WHERE id = ?2",
            )?
            .execute(params![self.now_ms(), id.0])?;
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    /// Deletes finished jobs (succeeded, dead, cancelled) that finished
    /// before `finished_before`, in short transactions. Returns how many.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`].
    pub fn prune(&self, finished_before: DateTime<Utc>) -> Result<u64> {
        let before = finished_before.timestamp_millis();
        let mut total = 0u64;
        loop {
            let deleted = self.write(|tx| {
                Ok(tx
                    .prepare_cached(
                        "DELETE FROM tickler_jobs WHERE id IN (
                             SELECT id FROM tickler_jobs WHERE finished_at IS NOT NULL AND finished_at < ?1
                             LIMIT +?2)",
                    )?
                    .execute(params![before, PRUNE_BATCH])?)
            })?;
            total += deleted as u64;
            if (deleted as i64) < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    // ------------------------------------------------------------------ reads

    /// The job with this id.
    ///
    /// # Errors
    /// [`Error::NotFound`], [`Error::Sqlite`], [`Error::Pool`].
    pub fn get(&self, id: JobId) -> Result<Job> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE id = ?1"
            ))?
            .query_row([id.0], job_from_row)
            .optional()?
            .ok_or(Error::NotFound(id))
        })
    }

    /// Jobs matching `filter`, oldest id first.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs
                     WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR queue = ?2)
                       AND (?3 IS NULL OR kind = ?3)
                     ORDER BY id LIMIT +?4"
                ))?
                .query_map(
                    params![
                        filter.state.map(JobState::as_str),
                        filter.queue,
                        filter.kind,
                        limit
                    ],
                    job_from_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// Number of jobs in `state`, across queues. Uses an index (cost grows
    /// with the count, not the table) for scheduled, pending and running;
    /// scans the table for finished states.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn count(&self, state: JobState) -> Result<u64> {
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM tickler_jobs WHERE status = '{}'",
                    state.as_str()
                ))?
                .query_row([], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Job counts per queue and state, and the oldest due job.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn stats(&self) -> Result<Stats> {
        let now = self.now_ms();
        self.read(|conn| {
            let mut stats = Stats::default();
            let mut stmt = conn.prepare_cached(
                "SELECT queue, status, count(*) FROM tickler_jobs GROUP BY queue, status",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (queue, status, count) = row?;
                stats
                    .counts
                    .insert((queue, status.parse()?), u64::try_from(count).unwrap_or(0));
            }
            let mut stmt = conn.prepare_cached(
                "SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'pending' OR (status = 'scheduled' AND run_at <= ?1)
                 GROUP BY queue, priority",
            )?;
            let rows = stmt.query_map([now], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i32>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (queue, priority, at) = row?;
                stats
                    .oldest_due_by_priority
                    .insert((queue, priority), ms_to_datetime(at));
            }
            stats.oldest_due = stats.oldest_due_by_priority.values().min().copied();
            Ok(stats)
        })
    }

    /// Makes every commit so far durable by fsyncing the `-wal` file
    /// (without taking SQLite's write lock, so writers in other threads and
    /// processes go on meanwhile). In WAL mode a commit is the frames it
    /// appended to the log; once those are on disk, recovery after a power
    /// loss replays them. Used after [`OutcomeSync::Deferred`] commits. Does
    /// nothing under [`Durability::Normal`], whose promise stops at crashes
    /// of the process.
    ///
    /// # Errors
    /// [`Error::Io`] if the log cannot be opened or synced.
    pub fn sync(&self) -> Result<()> {
        self.inner.store.sync()
    }

    /// The durability this queue was opened with.
    pub fn durability(&self) -> Durability {
        self.inner.config.durability
    }

    /// Copies the WAL into the database file and truncates the WAL: up to
    /// four PASSIVE checkpoints, then `PRAGMA wal_checkpoint(TRUNCATE)`,
    /// each step waiting up to the busy timeout for other connections'
    /// writers, readers and checkpoints. SQLite checkpoints on its own
    /// every ~1000 pages and tickler's write path truncates a WAL past
    /// 16 MiB, so this is for operators and tests. This process's writers
    /// wait for the whole call (it runs on the write connection); while the
    /// TRUNCATE step waits it holds SQLite's write lock, so every writer of
    /// the file waits with it. A reader
    /// holding an old snapshot keeps part of the WAL from being copied; this
    /// then returns at once with `complete` false (rather than holding the
    /// writers up for the whole busy timeout), and can be called again later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if called inside
    /// [`Queue::complete_with`]; [`Error::DiskFull`] if the database file
    /// cannot grow to take the copied pages; [`Error::Sqlite`] for other
    /// SQLite failures.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.inner.store.checkpoint()
    }

    /// How long this process's write transactions (through any clone of
    /// this `Queue`) waited for the write lock so far.
    pub fn write_lock_waits(&self) -> WriteLockWaits {
        self.inner.store.write_lock_waits()
    }

    // ------------------------------------------------------- change watching

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
        self.inner.store.watcher()
    }

    /// Whether the queue file at `path` and its `-wal` and `-shm` files
    /// (those that exist) are private to their owner: no read, write or
    /// execute permission for group or others. Jobs' payloads (a shell
    /// job's `env`, say) are readable by whoever can read these files.
    /// [`QueueBuilder::open`] logs a warning when they are not; an
    /// application that keeps secrets in payloads can refuse to go on.
    /// Always true where files have no Unix permission bits.
    ///
    /// # Errors
    /// [`Error::Io`] if `path` cannot be examined (it does not exist, or a
    /// folder on the way is not searchable).
    pub fn file_is_private(path: impl AsRef<Path>) -> Result<bool> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let shared = |m: &std::fs::Metadata| m.permissions().mode() & 0o077 != 0;
            if shared(&meta) {
                return Ok(false);
            }
            for suffix in ["-wal", "-shm"] {
                let mut name = path.as_os_str().to_owned();
                name.push(suffix);
                if std::fs::metadata(PathBuf::from(name)).is_ok_and(|m| shared(&m)) {
                    return Ok(false);
                }
            }
        }
        #[cfg(not(unix))]
        let _ = meta;
        Ok(true)
    }

    /// [`Queue::file_is_private`] for this queue's file.
    ///
    /// # Errors
    /// As [`Queue::file_is_private`].
    pub fn is_private(&self) -> Result<bool> {
        Queue::file_is_private(self.path())
    }

    // ------------------------------------------------------------ plumbing
}

/// The engine's write and read paths, for this crate's own statements.
impl Queue {
    /// Runs `f` in a write transaction with the queue's durability; see
    /// `Store::write_with`.
    pub(crate) fn write<T>(
        &self,
        f: impl FnMut(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.inner.store.write(f)
    }

    fn write_with<T>(
        &self,
        commit: Commit,
        f: impl FnMut(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.inner.store.write_with(commit, f)
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.inner.store.read(f)
    }

    pub(crate) fn notify_watchers(&self) {
        self.inner.store.notify_watchers();
    }
}

/// Operator helpers used by the `tickler` binary (and open to any caller):
/// bulk retry, pruning by state, and the few extra readings `stats` shows.
impl Queue {
    /// The schema version (`PRAGMA user_version`) of the file at `path`,
    /// read without creating, migrating or otherwise changing it; `None` if
    /// there is no file. A new, empty file reads 0.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] (not SQLite, or damaged), [`Error::ReadOnly`]
    /// (cannot be opened), [`Error::Sqlite`].
    pub fn file_schema_version(path: impl AsRef<Path>) -> Result<Option<i64>> {
        let path = path.as_ref();
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| open_error(path, e))?;
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .map(Some)
            .map_err(|e| open_error(path, e))
    }

    /// Checks `job` as [`Queue::enqueue`] would, without storing anything:
    /// lets a caller importing many jobs say which one is bad before a
    /// batch is written.
    ///
    /// # Errors
    /// The input errors of [`Queue::enqueue`].
    pub fn validate_job(&self, job: &NewJob) -> Result<()> {
        self.validate(job.clone(), self.now_ms()).map(|_| ())
    }

    /// Makes every dead job (of `queue`, if given) pending again, due now,
    /// with fresh attempts, as [`Queue::retry`] does one by one, in short
    /// transactions. A dead job whose unique_key is now held by an
    /// unfinished job stays dead. Returns `(retried, left_dead)`.
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; jobs retried
    /// by earlier transactions stay retried.
    pub fn retry_dead(&self, queue: Option<&str>) -> Result<(u64, u64)> {
        let (mut retried, mut left_dead) = (0u64, 0u64);
        let mut after_id = 0i64;
        loop {
            let (done, kept, last, seen) = self.write(|tx| {
                let dead: Vec<(i64, Option<String>)> = tx
                    .prepare_cached(
                        "SELECT id, unique_key FROM tickler_jobs
                         WHERE status = 'dead' AND (?1 IS NULL OR queue = ?1) AND id > ?2
                         ORDER BY id LIMIT +?3",
                    )?
                    .query_map(params![queue, after_id, PRUNE_BATCH], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                let mut held = tx.prepare_cached(
                    "SELECT 1 FROM tickler_jobs WHERE unique_key = ?1
                       AND status IN ('scheduled', 'pending', 'running')",
                )?;
                let mut revive = tx.prepare_cached(
                    "UPDATE tickler_jobs SET status = 'pending', attempts = 0, run_at = ?1,
                         finished_at = NULL, lease_expires_at = NULL
                     WHERE id = ?2 AND status = 'dead'",
                )?;
                let now = self.now_ms();
                let (mut done, mut kept) = (0u64, 0u64);
                for (id, key) in &dead {
                    if let Some(key) = key {
                        if held.exists([key])? {
                            kept += 1;
                            continue;
                        }
                    }
                    done += revive.execute(params![now, id])? as u64;
                }
                Ok((done, kept, dead.last().map(|(id, _)| *id), dead.len()))
            })?;
            retried += done;
            left_dead += kept;
            match last {
                Some(id) if (seen as i64) >= PRUNE_BATCH => after_id = id,
                _ => break,
            }
        }
        if retried > 0 {
            self.notify_watchers();
        }
        Ok((retried, left_dead))
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
        let before = finished_before.timestamp_millis();
        let mut total = 0u64;
        loop {
            let deleted = self.write(|tx| {
                Ok(tx
                    .prepare_cached(
                        "DELETE FROM tickler_jobs WHERE id IN (
                             SELECT id FROM tickler_jobs
                             WHERE finished_at IS NOT NULL AND finished_at < ?1 AND status = ?2
                             LIMIT +?3)",
                    )?
                    .execute(params![before, state.as_str(), PRUNE_BATCH])?)
            })?;
            total += deleted as u64;
            if (deleted as i64) < PRUNE_BATCH {
                return Ok(total);
            }
        }
    }

    /// Number of jobs that reached a finished state (succeeded, dead,
    /// cancelled) at or after `since`; uses the index on the finish time.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached("SELECT count(*) FROM tickler_jobs WHERE finished_at >= ?1")?
                .query_row([since.timestamp_millis()], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Number of unfinished (scheduled, pending or running) jobs of these
    /// queues, only of `kinds` if given, counted in one statement (one
    /// snapshot), so a caller waiting for a batch to drain never sees a job
    /// between two states.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        if queues.is_empty() || kinds.is_some_and(|k| k.is_empty()) {
            return Ok(0);
        }
        let queue_marks: Vec<String> = (1..=queues.len()).map(|i| format!("?{i}")).collect();
        let kind_filter = kind_filter(kinds, queues.len() + 1);
        // One subquery per state, so each can use that state's partial index.
        let count = |status: &str| {
            format!(
                "(SELECT count(*) FROM tickler_jobs WHERE status = '{status}'
                  AND queue IN ({}) {kind_filter})",
                queue_marks.join(", ")
            )
        };
        let sql = format!(
            "SELECT {} + {} + {}",
            count("scheduled"),
            count("pending"),
            count("running")
        );
        self.read(|conn| {
            let mut values: Vec<&dyn rusqlite::ToSql> =
                queues.iter().map(|q| q as &dyn rusqlite::ToSql).collect();
            if let Some(kinds) = kinds {
                values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
            }
            let n: i64 = conn
                .prepare_cached(&sql)?
                .query_row(values.as_slice(), |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// Size of the file's `-wal` file in bytes (0 if there is none).
    pub fn wal_bytes(&self) -> u64 {
        std::fs::metadata(crate::sqlite::wal_path(self.path())).map_or(0, |m| m.len())
    }
}

/// A job that passed validation, ready to insert.
pub(crate) struct ValidJob {
    pub(crate) job: NewJob,
    pub(crate) payload: String,
    pub(crate) run_at: i64,
    pub(crate) timeout_ms: Option<i64>,
}

/// `error` cut to [`MAX_ERROR_BYTES`]: its first 6 KiB and its end around
/// a note saying how many bytes were cut, on character boundaries.
pub(crate) fn cut_error(error: &str) -> std::borrow::Cow<'_, str> {
    if error.len() <= MAX_ERROR_BYTES {
        return std::borrow::Cow::Borrowed(error);
    }
    const HEAD: usize = 6 * 1024;
    const TAIL: usize = 2 * 1024 - 128;
    let mut head_end = HEAD;
    while !error.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = error.len() - TAIL;
    while !error.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head_end;
    std::borrow::Cow::Owned(format!(
        "{}\n[... {cut} of {} bytes cut by tickler ...]\n{}",
        &error[..head_end],
        error.len(),
        &error[tail_start..]
    ))
}

/// When a job that failed `attempt` may run again, in ms (clamped to the
/// storable range).
pub(crate) fn retry_time(now: i64, policy: &RetryPolicy, attempt: u32) -> i64 {
    add_ms(now, policy.backoff(attempt)).map_or(MAX_TIMESTAMP_MS, |t| t.min(MAX_TIMESTAMP_MS))
}

/// An expired lease as one reaper look saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ExpiredLease {
    id: i64,
    run_token: String,
    expires_at: i64,
}

/// What one reaper look did.
struct ReapLook {
    taken: u64,
    /// Expired and not taken back (not yet confirmed).
    left: Vec<ExpiredLease>,
    /// The look saw `REAP_BATCH` expired leases: there may be more.
    batch_full: bool,
    /// Getting the write lock waited for another connection.
    waited: bool,
}

fn add_ms(now_ms: i64, delay: Duration) -> Option<i64> {
    now_ms.checked_add(i64::try_from(delay.as_millis()).ok()?)
}

fn duration_ms(d: Duration, what: &str) -> Result<i64> {
    match i64::try_from(d.as_millis()) {
        Ok(ms) if ms >= 1 => Ok(ms.min(MAX_TIMESTAMP_MS)),
        Ok(_) => Err(Error::InvalidArgument(format!(
            "{what} must be at least 1 ms"
        ))),
        Err(_) => Err(Error::InvalidArgument(format!("{what} is too long"))),
    }
}

fn check_timestamp(ms: i64, what: &'static str) -> Result<()> {
    if (0..=MAX_TIMESTAMP_MS).contains(&ms) {
        Ok(())
    } else {
        Err(Error::TimeOutOfRange { what })
    }
}

/// Refuses a payload limit above what a row can hold under SQLite's
/// `length_limit` (bytes per value and per row).
fn check_payload_limit(max_payload_bytes: usize, length_limit: usize) -> Result<()> {
    let most = length_limit.saturating_sub(ROW_HEADROOM);
    if max_payload_bytes > most {
        return Err(Error::Config(format!(
            "max_payload_bytes is {max_payload_bytes}, but SQLite stores at most {length_limit} \
             bytes per row here, so the largest payload limit is {most} bytes \
             (MAX_PAYLOAD_BYTES_LIMIT with SQLite's default limits)"
        )));
    }
    Ok(())
}

/// True if `value` nests arrays and objects more than `limit` levels deep.
/// Iterative, and stops at the first path past `limit`: the value may be
/// far deeper than a recursive walk could follow.
fn json_depth_exceeds(value: &serde_json::Value, limit: usize) -> bool {
    use serde_json::Value;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth + 1 > limit {
            return true;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    false
}
