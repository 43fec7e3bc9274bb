//! [`Queue`]: the public API and its contract, engine-neutral. What each
//! method promises is documented here; how an engine keeps it lives behind
//! the seam, `crate::engine::Engine`, in the engine's own module.
//!
//! Where things happen, for a newcomer:
//! - validation of new jobs: [`Queue::enqueue_batch`] (`Queue::validate`);
//! - claiming: `Engine::record_and_claim`, on SQLite in `src/sqlite/jobs.rs`
//!   (`PROMOTE_SQL`, then one `UPDATE … RETURNING` built by `claim_sql` in
//!   `src/sqlite/sql.rs`);
//! - fencing by run_token: `record_in` and `complete_many` in
//!   `src/sqlite/sql.rs`, the heartbeat in `src/sqlite/jobs.rs`, every
//!   statement guarded by `id AND run_token AND status = 'running'`;
//! - the reaper's conditional update: `REAP_SQL` (`src/sqlite/sql.rs`) and
//!   `Store::reap_look` (`src/sqlite/jobs.rs`);
//! - reading "now": through the queue's [`Clock`] (`Queue::now_ms` for
//!   validation and schedules, `Store::now_ms` inside the engine);
//! - the write path: `Store::write_with` in `src/sqlite/mod.rs`, one
//!   mutex-guarded write connection per opened `Queue` (shared by its
//!   clones), `BEGIN IMMEDIATE`, bounded jittered retry on `SQLITE_BUSY`;
//!   group commit of concurrent enqueues (`Store::commit_grouped`), the
//!   bound on the WAL (`Store::bound_wal`), migrations (`Store::migrate`,
//!   `schema.sql`);
//! - wake-ups on commits: `src/sqlite/watch.rs` (`ChangeWatcher`);
//! - row decoding: `src/sqlite/rows.rs`;
//! - schedules: the tick arithmetic and the firing rules in
//!   `src/schedule.rs` (`Queue::fire`), their SQL in
//!   `src/sqlite/schedules.rs` (`ScheduleStore`, `ScheduleTx`).

mod claim;
mod reap;
mod schedules;

use crate::clock::{Clock, SystemClock};
use crate::engine::types::*;
// What the worker pool imports from here (it moves to engine::types).
pub(crate) use crate::engine::types::{ClaimRequest, Outcome, OutcomeSync};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::events::{Event, EventHub, JobEvent, JobEventKind, Subscription};
use crate::job::{Job, JobId, JobState, NewJob};
use crate::lease::Lease;
use crate::metrics::WriteLockWaits;
use crate::retry::RetryPolicy;

use crate::engine::OpenSettings;
pub use crate::watch::{ChangeWatcher, Waker};
use chrono::{DateTime, Utc};
use rusqlite::Connection;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Deepest nesting of arrays and objects a payload may have (`[[0]]` is 2).
/// serde_json reads at most 128 levels back, SQLite's `json_valid` accepts
/// 1,000: without a limit below both, a payload could be stored that no
/// one can read. Deeper payloads are refused with [`Error::PayloadTooDeep`].
pub const MAX_PAYLOAD_DEPTH: usize = 100;

/// Longest unique_key, in bytes of UTF-8 ([`Error::UniqueKeyTooLong`]).
pub const MAX_UNIQUE_KEY_BYTES: usize = 1024;

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
    /// `clock` was set by the caller (on PostgreSQL it then replaces the
    /// server's clock).
    clock_set: bool,
    max_connections: u32,
    listen: bool,
    fallback_poll: Duration,
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
            .field("clock_set", &self.clock_set)
            .field("max_connections", &self.max_connections)
            .field("listen", &self.listen)
            .field("fallback_poll", &self.fallback_poll)
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

    /// Where "now" comes from (default [`SystemClock`]; on PostgreSQL,
    /// the database server's clock). A clock set here is used on either
    /// engine: tests move a [`crate::ManualClock`] by hand.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.clock_set = true;
        self
    }

    /// PostgreSQL: most connections this `Queue` (and its clones) keeps in
    /// its pool (default 10, at least 2). A worker pool uses about two
    /// (claims and outcomes, heartbeats) plus one per enqueueing thread at
    /// a time; the listening connection comes on top. Ignored on SQLite.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// PostgreSQL: whether watchers `LISTEN` for other processes' commits
    /// (default true). Turn it off behind a connection pooler in
    /// transaction mode (PgBouncer's `pool_mode = transaction`), where
    /// `LISTEN` does not work: watchers then look for work every
    /// [`QueueBuilder::fallback_poll`]. Ignored on SQLite.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// PostgreSQL: how often a watcher looks for other processes' work
    /// while it cannot listen (listening turned off, or its connection
    /// lost and not yet back); default 1 s. Ignored on SQLite.
    pub fn fallback_poll(mut self, every: Duration) -> Self {
        self.fallback_poll = every.max(Duration::from_millis(1));
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
        let engine = crate::engine::open(&OpenSettings {
            location: &self.path,
            durability: self.durability,
            busy_timeout: self.busy_timeout,
            busy_retry: self.busy_retry,
            max_payload_bytes: self.max_payload_bytes,
            retry_policy: self.retry_policy,
            clock: Arc::clone(&self.clock),
            clock_set: self.clock_set,
            read_connections: self.read_connections,
            on_connection: self.on_connection.as_ref(),
            max_connections: self.max_connections,
            listen: self.listen,
            fallback_poll: self.fallback_poll,
        })?;
        Ok(Queue {
            inner: Arc::new(Inner {
                clock: engine.clock(),
                config: self,
                engine,
                events: EventHub::default(),
            }),
        })
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
    /// Where "now" comes from: the builder's clock, or on PostgreSQL
    /// (unless one was set) the server's.
    clock: Arc<dyn Clock>,
    /// The engine: connections, write transactions, wake-ups.
    engine: Box<dyn Engine>,
    /// Subscribers to what this process does through this queue.
    events: EventHub,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("location", &self.engine.location())
            .field("durability", &self.config.durability)
            .finish()
    }
}

/// Counts from [`Queue::counts_by_queue`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueCounts {
    /// Number of jobs per (queue, state), at most the cap asked for; states
    /// with no jobs are absent.
    pub counts: BTreeMap<(String, JobState), u64>,
    /// The (queue, state) pairs whose count reached the cap: there are at
    /// least that many jobs.
    pub capped: std::collections::BTreeSet<(String, JobState)>,
}

/// One slice of time from [`Queue::activity`]: how many jobs finished in
/// it, and how late and how long a sample of them ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityBucket {
    /// Start of the slice (inclusive).
    pub start: DateTime<Utc>,
    /// End of the slice (exclusive); the next slice's start.
    pub end: DateTime<Utc>,
    /// Jobs that reached a finished state (succeeded, dead, cancelled) in
    /// the slice, counted up to the cap given to [`Queue::activity`].
    pub finished: u64,
    /// `finished` reached the cap: at least that many finished.
    pub capped: bool,
    /// How many of the slice's jobs the figures below are read from:
    /// the last [`ACTIVITY_SAMPLE`] to finish, or all of them.
    pub sampled: u64,
    /// Dead jobs among the sampled ones.
    pub sampled_dead: u64,
    /// Median lateness of the sampled jobs that ran (succeeded or dead):
    /// from the due time of the attempt that finished to its start.
    /// `None` when none of them ran.
    pub lateness_p50: Option<Duration>,
    /// Largest such lateness.
    pub lateness_max: Option<Duration>,
    /// Median run time (start to finish) of the sampled jobs that ran.
    pub run_time_p50: Option<Duration>,
}

/// Sums up one slice's sample (see [`Queue::activity`]).
fn activity_bucket(
    start: i64,
    end: i64,
    finished: u64,
    capped: bool,
    sample: &[crate::engine::FinishedSample],
) -> ActivityBucket {
    let ran = |s: &&crate::engine::FinishedSample| {
        matches!(s.state, Some(JobState::Succeeded | JobState::Dead))
    };
    let ms = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let mut lateness: Vec<i64> = sample
        .iter()
        .filter(ran)
        .filter_map(|s| Some(s.claimed_at_ms? - s.run_at_ms))
        .collect();
    let mut run_time: Vec<i64> = sample
        .iter()
        .filter(ran)
        .filter_map(|s| Some(s.finished_at_ms - s.claimed_at_ms?))
        .collect();
    lateness.sort_unstable();
    run_time.sort_unstable();
    let median = |v: &[i64]| (!v.is_empty()).then(|| ms(v[v.len() / 2]));
    ActivityBucket {
        start: crate::clock::ms_to_datetime(start),
        end: crate::clock::ms_to_datetime(end),
        finished,
        capped,
        sampled: sample.len() as u64,
        sampled_dead: sample
            .iter()
            .filter(|s| s.state == Some(JobState::Dead))
            .count() as u64,
        lateness_p50: median(&lateness),
        lateness_max: lateness.last().map(|&l| ms(l)),
        run_time_p50: median(&run_time),
    }
}

/// Most finished jobs of one [`ActivityBucket`] read for its lateness and
/// run time.
pub const ACTIVITY_SAMPLE: usize = 200;

/// Most slices one [`Queue::activity`] call reads.
pub const ACTIVITY_MAX_BUCKETS: usize = 10_000;

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
            clock_set: false,
            max_connections: 10,
            listen: true,
            fallback_poll: Duration::from_secs(1),
        }
    }

    /// The file this queue works on; on PostgreSQL, an empty path (see
    /// [`Queue::location`]).
    pub fn path(&self) -> &Path {
        self.inner.engine.file().unwrap_or(Path::new(""))
    }

    /// Where this queue lives, for messages: the file's path, or the
    /// PostgreSQL URL with its password replaced by `***`.
    pub fn location(&self) -> String {
        self.inner.engine.location()
    }

    /// Whether this queue lives in PostgreSQL (rather than a SQLite file).
    pub fn is_postgres(&self) -> bool {
        self.inner.engine.file().is_none()
    }

    /// The clock this queue reads "now" from: the builder's, or on
    /// PostgreSQL (unless one was set) the database server's.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The backoff used after failures and expired leases.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.config.retry_policy
    }

    /// The schema version this build writes (`PRAGMA user_version`).
    pub fn schema_version() -> i64 {
        crate::engine::file_schema_version_written()
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
        let described: Option<Vec<(String, String)>> = self.inner.events.active().then(|| {
            rows.iter()
                .map(|r| (r.job.kind.clone(), r.job.queue.clone()))
                .collect()
        });
        let ids = self.engine().enqueue(rows)?;
        for (id, (kind, queue)) in ids.iter().zip(described.into_iter().flatten()) {
            self.emit_job(JobEventKind::Enqueued, *id, kind, queue);
        }
        Ok(ids)
    }

    // ----------------------------------------------------------------- events

    /// A subscription to what this process does through this queue (and
    /// its clones): jobs enqueued, cancelled and retried here, and every
    /// event of the [`crate::WorkerPool`]s and schedulers started on it.
    /// Up to `capacity` events wait for the reader (at least 1;
    /// [`crate::DEFAULT_EVENT_BUFFER`] is a fair choice); what does not fit
    /// is dropped and counted ([`Subscription::dropped`]), so a slow reader
    /// never slows the queue or its pools.
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

    fn emit_job(&self, what: JobEventKind, job_id: JobId, kind: String, queue: String) {
        if !self.inner.events.offer() {
            return;
        }
        self.inner.events.emit(Event::Job(JobEvent {
            what,
            job_id,
            kind,
            queue,
            attempt: None,
            queue_time: None,
            run_time: None,
            at: self.inner.clock.now(),
        }));
    }

    /// Emits `what` for job `id` with its kind and queue read back, if
    /// anyone listens (operator actions are rare: one read is cheap).
    fn emit_read_back(&self, what: JobEventKind, id: JobId) {
        if !self.inner.events.active() {
            return;
        }
        if let Ok(job) = self.engine().get(id) {
            self.emit_job(what, id, job.kind, job.queue);
        }
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
        self.engine().open_connection()
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
        self.engine().enqueue_in_sqlite_tx(tx, &rows, now)
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
        let mut value = None;
        self.engine().complete_with_sqlite(lease, &mut |tx| {
            let writes = app_writes.take().ok_or_else(|| {
                Error::aborted(
                    "the commit after app_writes was refused as busy; nothing was written",
                )
            })?;
            value = Some(writes(tx)?);
            Ok(())
        })?;
        value.ok_or_else(|| Error::aborted("app_writes did not run; nothing was written"))
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
        let due = match (job.run_at, job.delay) {
            // Any past time means "due now", also one before 1970, which
            // the stored range (ms since 1970) cannot hold.
            (Some(at), _) if at.timestamp_millis() < 0 => Due::Now,
            (Some(at), _) => Due::At(at.timestamp_millis()),
            (None, Some(delay)) => Due::After(delay),
            (None, None) => Due::Now,
        };
        // Refused here, before anything is written; the engine resolves it
        // again against its own "now".
        due.resolve(now)?;
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
            due,
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
        self.engine().next_due(queues, kinds)
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
        self.engine().heartbeat_many(leases, extend_by)
    }

    /// Whether each lease is still held (the job is `running` under its
    /// run_token), without writing: a cheap read that lets a worker pool
    /// notice a cancelled or reaped job between heartbeats.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        self.engine().leases_held(leases)
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
        let claim = claim.map(|request| crate::engine::Claim {
            request,
            rules: claim::claim_in,
        });
        self.engine()
            .record_and_claim(outcomes, claim.as_ref(), sync)
    }

    // ---------------------------------------------------------- paused queues

    /// Pauses a queue: from the moment this returns, no claim of any
    /// process or machine sharing the queue takes a job of it, and
    /// [`Queue::next_due`] treats it as having nothing due (so idle worker
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
        self.engine().set_queue_paused(queue, false)
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
        self.engine().cancel(id)?;
        self.emit_read_back(JobEventKind::Cancelled, id);
        Ok(())
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
        self.engine().retry(id)?;
        self.emit_read_back(JobEventKind::Retried, id);
        Ok(())
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

    /// Jobs per queue and state for a dashboard, each counted through an
    /// index of its state up to `cap`: the cost grows with the queues and
    /// `cap`, not with the table. A count that reached `cap` is in
    /// [`QueueCounts::capped`] (there are at least that many). Unlike
    /// [`Queue::stats`], not one snapshot: each (queue, state) is read on
    /// its own.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn counts_by_queue(&self, cap: u64) -> Result<QueueCounts> {
        let engine = self.engine();
        let mut out = QueueCounts::default();
        for state in JobState::ALL {
            for queue in self.queues_in_state(state)? {
                let n = engine.count_in_queue(state, &queue, cap)?;
                if n == 0 {
                    continue;
                }
                if n >= cap {
                    out.capped.insert((queue.clone(), state));
                }
                out.counts.insert((queue, state), n);
            }
        }
        Ok(out)
    }

    /// Up to `limit` jobs in `state`, through that state's index (at most
    /// `limit` jobs read per queue): pending in claim order (priority,
    /// due time, id), scheduled soonest due first, running soonest lease
    /// expiry first, succeeded, dead and cancelled newest first.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn list_state(&self, state: JobState, limit: usize) -> Result<Vec<Job>> {
        let engine = self.engine();
        let mut jobs = Vec::new();
        for queue in self.queues_in_state(state)? {
            jobs.extend(engine.list_in_queue(state, &queue, limit)?);
        }
        match state {
            JobState::Pending => {
                jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.run_at, j.id))
            }
            JobState::Scheduled => jobs.sort_by_key(|j| (j.run_at, j.id)),
            JobState::Running => jobs.sort_by_key(|j| (j.lease_expires_at, j.id)),
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => {
                jobs.sort_by_key(|j| std::cmp::Reverse((j.finished_at, j.id)))
            }
        }
        jobs.truncate(limit);
        Ok(jobs)
    }

    /// Throughput and lateness over time, for a dashboard's plot: the
    /// last `slices` slices of time of `width` each, the last one ending at
    /// now (this queue's clock), oldest first. Each slice counts the jobs
    /// that finished in it through the index on the finish time, up to
    /// `cap`, and reads at most [`ACTIVITY_SAMPLE`] of them for lateness
    /// and run time, so the cost is bounded by `slices`, `cap` and the
    /// sample, not by the table. Pruned jobs are gone from these figures.
    /// Each slice is its own read: the slices are not one snapshot.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `width` under 1 ms, no slice, or
    /// more than [`ACTIVITY_MAX_BUCKETS`]; [`Error::Sqlite`],
    /// [`Error::Pool`], [`Error::Postgres`].
    ///
    /// # Example
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
    /// use std::time::Duration;
    /// // The last hour, a minute a slice.
    /// let minutes = queue.activity(60, Duration::from_secs(60), 10_000)?;
    /// assert_eq!(minutes.len(), 60);
    /// assert!(minutes.iter().all(|m| m.finished == 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn activity(
        &self,
        slices: usize,
        width: Duration,
        cap: u64,
    ) -> Result<Vec<ActivityBucket>> {
        let now = self.now_ms();
        let width_ms = i64::try_from(width.as_millis()).unwrap_or(i64::MAX);
        if width_ms == 0 {
            return Err(Error::InvalidArgument(
                "activity: the slice width must be at least 1 ms".into(),
            ));
        }
        if slices == 0 || slices > ACTIVITY_MAX_BUCKETS {
            return Err(Error::InvalidArgument(format!(
                "activity: {slices} slices asked for, want 1 to {ACTIVITY_MAX_BUCKETS}"
            )));
        }
        let slices = slices as i64;
        let engine = self.engine();
        let mut out = Vec::with_capacity(slices as usize);
        for i in (0..slices).rev() {
            // Saturating: a manual clock may stand before 1970, and a
            // width may be near Duration::MAX.
            let end = now.saturating_sub(i.saturating_mul(width_ms));
            let start = end.saturating_sub(width_ms);
            let (finished, sample) = engine.finished_between(start, end, cap, ACTIVITY_SAMPLE)?;
            out.push(activity_bucket(
                start,
                end,
                finished,
                finished >= cap,
                &sample,
            ));
        }
        Ok(out)
    }

    /// The queues with jobs in `state`, in byte order, one index step each.
    fn queues_in_state(&self, state: JobState) -> Result<Vec<String>> {
        let mut queues: Vec<String> = Vec::new();
        while let Some(q) = self
            .engine()
            .next_queue_in_state(state, queues.last().map_or("", String::as_str))?
        {
            queues.push(q);
        }
        Ok(queues)
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
        self.engine().sync()
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
        self.engine().checkpoint()
    }

    /// How long this process's write transactions (through any clone of
    /// this `Queue`) waited for the write lock so far.
    pub fn write_lock_waits(&self) -> WriteLockWaits {
        self.engine().write_lock_waits()
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
        Ok(ChangeWatcher::new(self.engine().watcher()?))
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
        crate::engine::file_is_private(path.as_ref())
    }

    /// [`Queue::file_is_private`] for this queue's file.
    ///
    /// # Errors
    /// As [`Queue::file_is_private`].
    pub fn is_private(&self) -> Result<bool> {
        match self.inner.engine.file() {
            Some(file) => Queue::file_is_private(file),
            None => Ok(true),
        }
    }
}

/// Jobs written and completed inside the application's own PostgreSQL
/// transactions (feature `postgres`; the `postgres` crate, version 0.19):
/// the PostgreSQL forms of [`Queue::enqueue_tx`] and
/// [`Queue::complete_with`].
#[cfg(feature = "postgres")]
impl Queue {
    /// Writes `job` inside the caller's own transaction `tx`, on a
    /// connection to this queue's database: the job exists if and only if
    /// the caller commits. Same validation, errors and unique_key behaviour
    /// as [`Queue::enqueue`]; a refused job (a validation error, or a
    /// statement the server refused) leaves `tx` usable (the insert runs in
    /// a savepoint). The transaction also gets a `NOTIFY`, which PostgreSQL
    /// delivers at commit: worker pools on every machine wake then.
    ///
    /// # Errors
    /// As [`Queue::enqueue`]; [`Error::Unsupported`] on a SQLite queue;
    /// [`Error::Postgres`] for the server's errors (not retried: the
    /// transaction is the caller's).
    pub fn enqueue_pg_tx(&self, tx: &mut postgres::Transaction<'_>, job: NewJob) -> Result<JobId> {
        Ok(self.enqueue_batch_pg_tx(tx, vec![job])?.remove(0))
    }

    /// [`Queue::enqueue_pg_tx`] for several jobs: all or none, in the
    /// caller's transaction. Returns ids in input order.
    ///
    /// # Errors
    /// As [`Queue::enqueue_pg_tx`].
    pub fn enqueue_batch_pg_tx(
        &self,
        tx: &mut postgres::Transaction<'_>,
        jobs: Vec<NewJob>,
    ) -> Result<Vec<JobId>> {
        let now = self.now_ms();
        let rows = jobs
            .into_iter()
            .map(|job| self.validate(job, now))
            .collect::<Result<Vec<_>>>()?;
        self.engine().enqueue_in_pg_tx(tx, &rows)
    }

    /// Runs `app_writes` and marks the job succeeded in one transaction on
    /// one of tickler's connections: the handler's writes to the database
    /// and the job's completion commit together or not at all. If the
    /// lease was lost, the fenced completion matches no row, everything
    /// rolls back and the caller gets [`Error::LeaseLost`]. `app_writes`
    /// runs once: this is not retried through a lost connection (an error
    /// during the commit leaves it unknown whether it committed; the
    /// job's next outcome then says so with [`Error::LeaseLost`]).
    ///
    /// # Errors
    /// [`Error::LeaseLost`]; the error `app_writes` returned;
    /// [`Error::Postgres`]; [`Error::Unsupported`] on a SQLite queue. On
    /// any error but one during the commit itself, nothing was written.
    pub fn complete_with_pg<T>(
        &self,
        lease: &Lease,
        app_writes: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut app_writes = Some(app_writes);
        let mut value = None;
        self.engine().complete_with_pg(lease, &mut |tx| {
            let writes = app_writes
                .take()
                .ok_or_else(|| Error::aborted("app_writes runs once; nothing more was written"))?;
            value = Some(writes(tx)?);
            Ok(())
        })?;
        value.ok_or_else(|| Error::aborted("app_writes did not run; nothing was written"))
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
        crate::engine::file_schema_version(path.as_ref())
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
    /// unfinished job stays dead. Returns `(retried, left_dead)`. Unlike
    /// [`Queue::retry`], it emits no [`JobEventKind::Retried`] events (it
    /// may touch any number of jobs).
    ///
    /// # Errors
    /// [`Error::Busy`], [`Error::DiskFull`], [`Error::Sqlite`]; jobs retried
    /// by earlier transactions stay retried.
    pub fn retry_dead(&self, queue: Option<&str>) -> Result<(u64, u64)> {
        let (mut retried, mut left_dead) = (0u64, 0u64);
        let mut after_id = 0i64;
        loop {
            let batch = self
                .engine()
                .retry_dead_batch(queue, after_id, PRUNE_BATCH)?;
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

    /// Number of jobs that reached a finished state (succeeded, dead,
    /// cancelled) at or after `since`; uses the index on the finish time.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.engine().finished_since(since)
    }

    /// Number of unfinished (scheduled, pending or running) jobs of these
    /// queues, only of `kinds` if given, counted in one statement (one
    /// snapshot), so a caller waiting for a batch to drain never sees a job
    /// between two states.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        self.engine().unfinished(queues, kinds)
    }

    /// Size of the file's `-wal` file in bytes (0 if there is none).
    pub fn wal_bytes(&self) -> u64 {
        self.inner
            .engine
            .file()
            .map_or(0, crate::engine::file_wal_bytes)
    }
}

/// True if `value` nests arrays and objects more than `limit` levels deep.
/// Iterative, and stops at the first path past `limit`: the value may be
/// far deeper than a recursive walk could follow.
pub(crate) fn json_depth_exceeds(value: &serde_json::Value, limit: usize) -> bool {
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
