//! Types both sides of the seam share: what `Queue` hands an engine (a
//! validated job, an outcome, a claim request, a filter) and what an
//! engine hands back (counts, a checkpoint's result), with the limits and
//! time arithmetic every engine applies the same way. Nothing here reads
//! a database or names an engine.

use crate::clock::ms_to_datetime;
use crate::error::{Error, Result};
use crate::job::{JobId, JobState, NewJob};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use chrono::{DateTime, Utc};
use rusqlite::Connection;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// What a server engine's write transaction is told about its earlier
/// tries (SQLite's commit is never in doubt: it is always the default).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Attempt {
    /// An earlier try lost its connection during `COMMIT`: its writes may
    /// have landed. Fenced outcomes use this to tell "already recorded by
    /// me" from "lost".
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) after_unknown_commit: bool,
}

/// Latest timestamp tickler stores: 9999-12-31T23:59:59.999Z, in ms.
pub const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// Largest [`QueueBuilder::max_payload_bytes`](crate::QueueBuilder::max_payload_bytes) accepted with SQLite's
/// default length limit (1,000,000,000 bytes per value and per row): the
/// limit less 1 MiB for the row's other columns. A connection whose
/// `SQLITE_LIMIT_LENGTH` was lowered (by an `on_connection` hook) lowers
/// it accordingly; [`QueueBuilder::open`](crate::QueueBuilder::open) checks.
pub const MAX_PAYLOAD_BYTES_LIMIT: usize = 1_000_000_000 - ROW_HEADROOM;

/// Room kept in a row for everything but the payload: names, unique_key,
/// last_error and the error history are all capped well below this.
pub(crate) const ROW_HEADROOM: usize = 1024 * 1024;

/// Longest error text stored per attempt, in bytes. A longer one keeps its
/// first 6 KiB and last 2 KiB around a note of how much was cut: handler
/// errors can be whole HTTP bodies or logs, and one over SQLite's length
/// limit used to lose every outcome of its batch.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// When a pooled connection was last given back to its pool. One taken
/// again within [`Returned::UNCHECKED`] skips the round trip that checks
/// it (r2d2's `is_valid`), which would double the round trips of a single
/// enqueue: a connection that worked a moment ago is almost always still
/// there, and if it is not, its first statement fails as a lost
/// connection, which every transaction retries on another. One idle for
/// longer (a server's `wait_timeout`, a proxy's idle cut) is checked, as
/// is every connection handed to the application's own transaction.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Returned(std::time::Instant);

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Returned {
    const UNCHECKED: Duration = Duration::from_secs(1);

    /// Stamped now (at connect, and by `has_broken` at each return).
    pub(crate) fn now() -> Returned {
        Returned(std::time::Instant::now())
    }

    /// Whether the connection has been idle long enough to be checked.
    pub(crate) fn needs_check(self) -> bool {
        self.0.elapsed() >= Self::UNCHECKED
    }
}

/// How a server engine waits out what a retry may cure (a deadlock, a
/// lock wait, a cut connection, a restart, a failover). Every transaction,
/// the open's steps after its first connection, and the first sample of
/// the server's clock go through [`Retries::run`], so the wait is the same
/// wherever the fault lands.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct Retries {
    /// The engine's name, for the log.
    pub engine: &'static str,
    /// The first pause; each next one doubles, up to 1 s, jittered.
    pub first_pause: Duration,
    /// Errors after which the same work may succeed on another try.
    pub retryable: fn(&Error) -> bool,
    /// Retried errors expected in normal work (a deadlock), logged at
    /// debug level; any other is a warning.
    pub quiet: fn(&Error) -> bool,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Retries {
    /// Runs `once` until it succeeds, fails with an error no retry may
    /// cure, or `window` has passed since the first try.
    pub(crate) fn run<T>(
        &self,
        window: Duration,
        mut once: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let started = std::time::Instant::now();
        let mut pause = self.first_pause;
        loop {
            match once() {
                Ok(value) => return Ok(value),
                Err(e) => {
                    if !(self.retryable)(&e) || started.elapsed() >= window {
                        return Err(e);
                    }
                    if (self.quiet)(&e) {
                        log::debug!("{} transaction failed ({e}); retrying", self.engine);
                    } else {
                        log::warn!(
                            "{} transaction failed ({e}); retrying for up to {:?}",
                            self.engine,
                            window.saturating_sub(started.elapsed())
                        );
                    }
                    let jitter = fastrand::u64(0..=pause.as_millis() as u64);
                    std::thread::sleep(Duration::from_millis(jitter) + pause / 2);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Retries {
    /// [`Retries::run`] for work that hands over, part way, to code that
    /// must run at most once (the application's writes in
    /// `complete_with`): `once` sets its flag as it hands over, and an
    /// error after that is returned, never tried again.
    pub(crate) fn run_until_handed<T>(
        &self,
        window: Duration,
        mut once: impl FnMut(&mut bool) -> Result<T>,
    ) -> Result<T> {
        let mut handed = false;
        self.run(window, || match once(&mut handed) {
            Err(e) if handed => Ok(Err(e)),
            tried => tried.map(Ok),
        })
        .and_then(|settled| settled)
    }
}

/// Tries of an insert whose unique_key's holder finished between the
/// insert and the read of its id (the key is free then, and the next try
/// stores the job or finds the next holder). SQLite's writer holds the
/// only write lock, so its holder cannot finish in between.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const UNIQUE_TRIES: u32 = 10;

/// A job with a unique_key on a server engine: `try_once` inserts it, or
/// reads the id of the unfinished job that holds its key, and gives
/// `None` when neither happened (the holder finished in between); tried
/// [`UNIQUE_TRIES`] times before the job's key is said to keep changing
/// hands.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn insert_unique(
    job: &NewJob,
    mut try_once: impl FnMut() -> Result<Option<JobId>>,
) -> Result<JobId> {
    for _ in 0..UNIQUE_TRIES {
        if let Some(id) = try_once()? {
            return Ok(id);
        }
    }
    Err(Error::Config(format!(
        "unique_key {:?} kept changing hands while a job with it was inserted",
        job.unique_key
    )))
}

impl ValidJob {
    /// The state it is stored in, due at `run_at` as of `now`: waiting
    /// if it runs after other jobs.
    pub(crate) fn state_at(&self, run_at: i64, now: i64) -> JobState {
        if !self.after.is_empty() || matches!(self.batch, Some((_, Some(_)))) {
            JobState::Waiting
        } else if run_at <= now {
            JobState::Pending
        } else {
            JobState::Scheduled
        }
    }
}

/// A job's place in its batch, as stored (`enqueue_seq`), by which a
/// server engine finds the batch's rows again.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn seq_of(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// The ids of a batch of `n` jobs, each in its place, from rows found by
/// the batch's mark as `(enqueue_seq, id)` pairs.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn ids_by_seq(
    n: usize,
    found: impl IntoIterator<Item = (i64, i64)>,
) -> Vec<Option<JobId>> {
    let mut ids = vec![None; n];
    for (seq, id) in found {
        if let Some(slot) = usize::try_from(seq).ok().and_then(|i| ids.get_mut(i)) {
            *slot = Some(JobId(id));
        }
    }
    ids
}

/// After a COMMIT whose answer was lost: the ids of the batch of `n` jobs
/// that earlier try stored (`found` by its mark, as for [`ids_by_seq`]),
/// a job it did not store (its unique_key held then) inserted again by
/// `insert_one(i)`; or `None` if nothing was found, so the try did not
/// commit and the batch is inserted anew.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn ids_after_lost_commit(
    n: usize,
    found: Vec<(i64, i64)>,
    mut insert_one: impl FnMut(usize) -> Result<JobId>,
) -> Result<Option<Vec<JobId>>> {
    if found.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(n);
    for (i, id) in ids_by_seq(n, found).into_iter().enumerate() {
        out.push(match id {
            Some(id) => id,
            None => insert_one(i)?,
        });
    }
    Ok(Some(out))
}

/// Failed attempts whose errors a job keeps in [`Job::errors`](crate::Job::errors); older ones
/// are dropped as new ones come.
pub const ERROR_HISTORY_MAX: usize = 20;

/// How a commit reaches the disk. Chosen per [`Queue`](crate::Queue) (per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: every commit is fsynced before it returns, so an
    /// enqueue that returned `Ok` survives power loss. The default, because
    /// edge boxes lose power. On macOS and iOS, where `fsync` leaves writes
    /// in the drive's cache, also `fullfsync` (SQLite flushes the drive
    /// with `F_FULLFSYNC`).
    #[default]
    Full,
    /// `synchronous=NORMAL`: commits survive a crash of the process but the
    /// last ones may be lost on power loss or an OS crash (those after the
    /// WAL's last sync, which a checkpoint makes). Much faster on slow
    /// storage. The file itself is never damaged by a power cut: a
    /// checkpoint syncs before it overwrites pages of the main file
    /// (flushing the drive on macOS and iOS: `checkpoint_fullfsync`, set
    /// under either level).
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
/// [`SqliteOptions::on_connection`].
pub type ConnectionHook = Arc<dyn Fn(&Connection) -> rusqlite::Result<()> + Send + Sync>;

/// What to record for a claimed job; see
/// [`Manual::record_outcomes`](crate::Manual::record_outcomes).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The job succeeded.
    Complete,
    /// The job succeeded with this output, stored in the same statement
    /// ([`crate::Job::output`]).
    CompleteWith(crate::job::Output),
    /// The attempt failed: retry after backoff if attempts are left,
    /// otherwise dead. The message is kept as `last_error`.
    Fail(String),
    /// The job failed for good: dead now, whatever attempts are left.
    FailPermanently(String),
    /// As [`Outcome::Fail`], but the retry waits this delay (counted from
    /// the engine's "now" when the outcome is recorded) instead of the
    /// queue's [`RetryPolicy`]: how a worker pool applies a kind's own
    /// policy ([`crate::JobArgs::retry_policy`],
    /// [`crate::WorkerPoolBuilder::retry_policy_for`]). Past the storable
    /// range, the retry is due at its end.
    FailRetryAfter(String, Duration),
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

/// When the outcomes of
/// [`Manual::record_and_claim`](crate::Manual::record_and_claim) reach the
/// disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeSync {
    /// With this commit (fsync under [`Durability::Full`]).
    Now,
    /// Later: the commit is not fsynced; the caller calls [`Queue::sync`](crate::Queue::sync)
    /// within a bounded time. A power loss in between undoes the outcomes,
    /// so those jobs run again (at-least-once), never lost. The worker pool
    /// uses this to keep claims from waiting behind outcome fsyncs.
    Deferred,
}

/// What to claim; see
/// [`Manual::record_and_claim`](crate::Manual::record_and_claim).
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

/// Which due jobs a claim takes first.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ClaimOrder {
    /// Highest priority, then longest due, then lowest id.
    Priority,
    /// Longest due, then lowest id, whatever the priority (priority aging).
    Oldest,
}

impl ClaimOrder {
    pub(crate) fn sql(self) -> &'static str {
        match self {
            ClaimOrder::Priority => "priority DESC, run_at, id",
            ClaimOrder::Oldest => "run_at, id",
        }
    }

    pub(crate) fn compare(self, a: &Lease, b: &Lease) -> std::cmp::Ordering {
        let by_age = a.run_at.cmp(&b.run_at).then(a.job_id.cmp(&b.job_id));
        match self {
            ClaimOrder::Priority => b.priority.cmp(&a.priority).then(by_age),
            ClaimOrder::Oldest => by_age,
        }
    }
}

/// Filter for [`Queue::list`](crate::Queue::list). `None` fields match everything.
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

/// One page of a state's jobs for [`Ops::page`](crate::Ops::page): the
/// jobs of `state` in that state's own order (as
/// [`Ops::list_state`](crate::Ops::list_state): pending and blocked in
/// claim order, scheduled soonest due first, running soonest lease expiry
/// first, succeeded, dead and cancelled newest first), only of `queue` and
/// `kind` if given, after `after` if given, at most `limit` of them.
///
/// Paging is by key, not by offset: `after` is the
/// [`JobCursor`] of the last job of the previous page, and the next page
/// starts where that job stood in the index of the state, so a page deep
/// in a million jobs costs what the first one does. A job that changes
/// state between two pages leaves the list (or joins another state's);
/// no job is listed twice in one state's pages while it stays there.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    /// The state listed.
    pub state: JobState,
    /// Only jobs of this queue (all queues, merged in the state's order,
    /// when `None`).
    pub queue: Option<String>,
    /// Only jobs of this kind. The kind is tested on the rows the state's
    /// index gives for the queue, so a rare kind costs more rows read than
    /// a common one.
    pub kind: Option<String>,
    /// Only scheduled jobs waiting for a retry (`Some(true)`: they have
    /// had an attempt, and wait for their backoff) or only those delayed
    /// on purpose (`Some(false)`: no attempt yet). Tested like `kind`;
    /// for other states `Some(true)` keeps jobs that have had an attempt.
    pub retrying: Option<bool>,
    /// Start after this job (from the last job of the previous page).
    pub after: Option<JobCursor>,
    /// At most this many jobs (default 50).
    pub limit: usize,
}

impl JobPage {
    /// The first page of `state`'s jobs, all queues and kinds, 50 jobs.
    pub fn new(state: JobState) -> Self {
        JobPage {
            state,
            queue: None,
            kind: None,
            retrying: None,
            after: None,
            limit: 50,
        }
    }
}

/// Where a page of [`Ops::page`](crate::Ops::page) ended: a job's place
/// in the order of its state. Made from the last job of a page with
/// [`JobCursor::after`]; written as text (`state.id.priority.time`) by
/// `Display` and read back by `FromStr`, for links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobCursor {
    pub(crate) state: JobState,
    pub(crate) id: JobId,
    pub(crate) priority: i32,
    /// The time the state orders by, ms: due time (pending, blocked,
    /// scheduled), lease expiry (running), finish time (finished); 0 for
    /// waiting jobs, in id order.
    pub(crate) at_ms: i64,
}

impl JobCursor {
    /// The place of `job` in the order of its state.
    pub fn after(job: &crate::job::Job) -> JobCursor {
        let at = match job.state {
            JobState::Pending | JobState::Blocked | JobState::Scheduled => Some(job.run_at),
            JobState::Running => job.lease_expires_at,
            // Waiting jobs are in id order.
            JobState::Waiting => None,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled => job.finished_at,
        };
        JobCursor {
            state: job.state,
            id: job.id,
            priority: job.priority,
            at_ms: at.map_or(0, |t| t.timestamp_millis()),
        }
    }

    /// The job this cursor was made from.
    pub fn id(&self) -> JobId {
        self.id
    }
}

impl std::fmt::Display for JobCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}",
            self.state.as_str(),
            self.id.0,
            self.priority,
            self.at_ms
        )
    }
}

impl std::str::FromStr for JobCursor {
    type Err = Error;

    /// # Errors
    /// [`Error::InvalidArgument`] for text that `Display` did not write.
    fn from_str(s: &str) -> Result<JobCursor> {
        let bad =
            || Error::InvalidArgument(format!("{s:?} is not a page cursor (state.id.priority.ms)"));
        let mut parts = s.split('.');
        let state: JobState = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let mut number = || {
            parts
                .next()
                .and_then(|p| p.parse::<i64>().ok())
                .ok_or_else(bad)
        };
        let id = JobId(number()?);
        let priority = i32::try_from(number()?).map_err(|_| bad())?;
        let at_ms = number()?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(JobCursor {
            state,
            id,
            priority,
            at_ms,
        })
    }
}

/// The conditions, in SQL every engine reads, that take a page of
/// `state`'s jobs past `after`, each a range of the state's index in its
/// order: one, or two for the states ordered first by priority (the rest
/// of the cursor's priority, then the lower ones), which the caller runs
/// in turn until the page is full. Only integers go into them.
pub(crate) fn page_after(state: JobState, after: Option<&JobCursor>) -> Vec<String> {
    let Some(c) = after else {
        return vec!["1 = 1".to_owned()];
    };
    let (id, at, p) = (c.id.0, c.at_ms, c.priority);
    match state {
        JobState::Pending | JobState::Blocked => vec![
            format!("priority = {p} AND run_at >= {at} AND (run_at > {at} OR id > {id})"),
            format!("priority < {p}"),
        ],
        JobState::Scheduled => vec![format!("run_at >= {at} AND (run_at > {at} OR id > {id})")],
        JobState::Waiting => vec![format!("id > {id}")],
        JobState::Running => vec![format!(
            "lease_expires_at >= {at} AND (lease_expires_at > {at} OR id > {id})"
        )],
        JobState::Succeeded | JobState::Dead | JobState::Cancelled => vec![format!(
            "finished_at <= {at} AND (finished_at < {at} OR id < {id})"
        )],
    }
}

/// The tests of a page's `retrying` that each engine's SQL reads.
pub(crate) fn page_retrying(retrying: Option<bool>) -> &'static str {
    match retrying {
        None => "",
        Some(true) => " AND attempts > 0",
        Some(false) => " AND attempts = 0",
    }
}

/// What [`Ops::checkpoint`](crate::Ops::checkpoint) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Size of the `-wal` file before, in bytes.
    pub wal_bytes_before: u64,
    /// Size of the `-wal` file after, in bytes.
    pub wal_bytes_after: u64,
    /// False if a reader or writer kept the checkpoint from finishing.
    pub complete: bool,
}

/// Counts from [`Queue::stats`](crate::Queue::stats).
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

/// The limit slot stored in a job's row (`limit_name`, `limit_key`,
/// `limit_weight`), or `None` for a job without a limit. A key read as NULL
/// beside a name is the empty key.
pub(crate) fn limit_slot(
    name: Option<String>,
    key: Option<String>,
    weight: i64,
) -> Option<crate::job::LimitSlot> {
    name.map(|name| crate::job::LimitSlot {
        name,
        key: key.unwrap_or_default(),
        weight: u32::try_from(weight.max(1)).unwrap_or(u32::MAX),
    })
}

/// A job that passed validation, ready to insert.
#[derive(Clone)]
pub(crate) struct ValidJob {
    pub(crate) job: NewJob,
    pub(crate) payload: String,
    pub(crate) due: Due,
    pub(crate) timeout_ms: Option<i64>,
    /// What it runs after: stored jobs, or earlier rows of the same
    /// insert (a [`crate::Graph`]'s steps).
    pub(crate) after: Vec<(crate::graph::Parent, crate::IfParentFails)>,
    /// The batch it joins as a member (`None` role) or is a callback of.
    pub(crate) batch: Option<(crate::BatchId, Option<crate::batch::Callback>)>,
}

impl ValidJob {
    /// True if storing it takes more than its row (edges, a batch's
    /// counters): such a job is not grouped with other callers' jobs, and
    /// goes in a transaction. (The server engines group callers' jobs.)
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn is_linked(&self) -> bool {
        !self.after.is_empty() || self.batch.is_some()
    }
}

/// The rows of one insert that join a batch, given each row's id and
/// whether this insert stored it.
pub(crate) fn batch_joins(
    rows: &[ValidJob],
    ids: &[JobId],
    stored: impl Fn(usize) -> bool,
) -> Vec<crate::queue::batches::Joining> {
    rows.iter()
        .zip(ids)
        .enumerate()
        .filter_map(|(i, (row, id))| match row.batch {
            Some((batch, role)) if stored(i) => Some(crate::queue::batches::Joining {
                job: *id,
                batch,
                role,
                runs_after: !row.after.is_empty(),
                stored_parents: row
                    .after
                    .iter()
                    .filter_map(|(parent, _)| match parent {
                        crate::graph::Parent::Job(id) => Some(*id),
                        crate::graph::Parent::Row(_) => None,
                    })
                    .collect(),
            }),
            _ => None,
        })
        .collect()
}

/// The parents of `row` by id, given the ids of the rows of its insert
/// stored before it (a graph's steps come after their parents).
pub(crate) fn parents_of(row: &ValidJob, earlier: &[JobId]) -> Vec<(JobId, crate::IfParentFails)> {
    row.after
        .iter()
        .map(|&(parent, if_fails)| match parent {
            crate::graph::Parent::Job(id) => (id, if_fails),
            crate::graph::Parent::Row(i) => (earlier[i], if_fails),
        })
        .collect()
}

/// When a validated job is due. A delay counts from the engine's "now" in
/// the transaction that inserts the job ([`Due::resolve`]), not from the
/// caller's clock: on an engine with a server, the server's clock decides
/// (machines' clocks differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Now (also any time in the past).
    Now,
    /// At this instant, ms since the epoch.
    At(i64),
    /// This long after now.
    After(Duration),
}

impl Due {
    /// The due time (ms since the epoch) as of `now`.
    ///
    /// # Errors
    /// [`Error::TimeOutOfRange`] past the storable range.
    pub(crate) fn resolve(self, now: i64) -> Result<i64> {
        let at = match self {
            Due::Now => now,
            Due::At(at) => at,
            Due::After(delay) => add_ms(now, delay).ok_or(Error::TimeOutOfRange {
                what: "enqueue time plus delay",
            })?,
        };
        check_timestamp(at, "run_at")?;
        Ok(at)
    }
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

pub(crate) fn add_ms(now_ms: i64, delay: Duration) -> Option<i64> {
    now_ms.checked_add(i64::try_from(delay.as_millis()).ok()?)
}

pub(crate) fn duration_ms(d: Duration, what: &str) -> Result<i64> {
    match i64::try_from(d.as_millis()) {
        Ok(ms) if ms >= 1 => Ok(ms.min(MAX_TIMESTAMP_MS)),
        Ok(_) => Err(Error::InvalidArgument(format!(
            "{what} must be at least 1 ms"
        ))),
        Err(_) => Err(Error::InvalidArgument(format!("{what} is too long"))),
    }
}

pub(crate) fn check_timestamp(ms: i64, what: &'static str) -> Result<()> {
    if (0..=MAX_TIMESTAMP_MS).contains(&ms) {
        Ok(())
    } else {
        Err(Error::TimeOutOfRange { what })
    }
}

/// Refuses a payload limit above what a row can hold under SQLite's
/// `length_limit` (bytes per value and per row).
pub(crate) fn check_payload_limit(max_payload_bytes: usize, length_limit: usize) -> Result<()> {
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
/// A claimed row: its lease, or why it cannot be handed out. The id and
/// run_token are read strictly (the id is the rowid, the token was written
/// by this very claim); everything else leniently.
pub(crate) enum ClaimedRow {
    Readable(Lease),
    Unreadable {
        job_id: JobId,
        run_token: String,
        problems: String,
    },
}

/// One entry of the `errors` column, as stored (`at` in ms).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredAttemptError {
    attempt: u32,
    at: i64,
    error: String,
    worker: Option<String>,
}

impl From<StoredAttemptError> for crate::job::AttemptError {
    fn from(e: StoredAttemptError) -> Self {
        crate::job::AttemptError {
            attempt: e.attempt,
            at: ms_to_datetime(e.at),
            error: e.error,
            worker: e.worker,
        }
    }
}
/// Backward steps of the wall clock up to this are treated as noise by the
/// reaper's lease rule (see
/// [`ReaperConfig::clock_step_hold`](crate::ReaperConfig::clock_step_hold)):
/// a lease expiring more than its own length plus this margin from now is
/// set to expire one length from now.
pub const BACKWARD_STEP_MARGIN: Duration = Duration::from_secs(2);

/// Most expired leases one reaper look takes back.
pub(crate) const REAP_BATCH: i64 = 1_000;

/// Most finished jobs one prune transaction deletes, and most dead jobs
/// one `retry_dead` transaction looks at.
pub(crate) const PRUNE_BATCH: i64 = 5_000;

/// Most scheduled jobs one claim transaction promotes to pending, so a
/// million jobs falling due at once cannot make one claim transaction long.
pub(crate) const PROMOTE_BATCH: i64 = 5_000;

/// An expired lease as one reaper look saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ExpiredLease {
    pub id: i64,
    pub run_token: String,
    pub expires_at: i64,
}

/// What one reaper look did.
pub(crate) struct ReapLook {
    pub taken: u64,
    /// Expired and not taken back (not yet confirmed).
    pub left: Vec<ExpiredLease>,
    /// The look saw `REAP_BATCH` expired leases: there may be more.
    pub batch_full: bool,
}

/// What one `retry_dead` transaction did.
pub(crate) struct RetryDeadBatch {
    pub retried: u64,
    /// Dead jobs left dead: their unique_key is held by an unfinished job.
    pub left_dead: u64,
    /// The highest id looked at, and how many were looked at.
    pub last_id: Option<i64>,
    pub seen: usize,
}

/// The error a job taken back by the reaper keeps.
pub(crate) fn lease_expired_error(worker: &str, attempts: impl std::fmt::Display) -> String {
    format!(
        "lease expired: worker {worker} neither renewed nor finished attempt {attempts} in time"
    )
}

/// A running job whose lease the reaper takes back (it ran out, or its
/// holder is gone), as its look read it.
pub(crate) struct HeldRun {
    pub lease: ExpiredLease,
    pub attempts: u32,
    /// Its `claimed_by`.
    pub worker: String,
    /// Whether the run's start was recorded (`started_at`).
    pub started: bool,
    /// The limit slot it holds, given up when it is taken back.
    pub limit: Option<crate::job::LimitSlot>,
}

/// How a lease taken back ends its run.
pub(crate) enum ReapStatement {
    /// The run never started: back to pending with its attempt given
    /// back and `note` in its error history (the engine's
    /// `GIVE_BACK_SQL`).
    GiveBack { note: String },
    /// The attempt counts: retry at `retry_at` or dead, with `error` (the
    /// engine's `REAP_SQL`).
    Fail { retry_at: i64, error: String },
}

/// The reaper's rule for a run whose lease it takes back, the same on
/// every engine: an attempt counts when its handler starts, so a run
/// whose start was never recorded (claimed ahead of a free thread, and
/// its holder died) gives its attempt back. A pool records a start within
/// `START_RECORD_DELAY` (src/worker/heartbeat.rs) of it, and before the handler runs for a job
/// that was given back once already, so a handler that kills its process
/// at once is given back uncounted at most once.
/// `holder_gone`: taken back because its holder is known to be gone
/// (else its lease ran out).
pub(crate) fn reap_statement(
    run: &HeldRun,
    now: i64,
    policy: &RetryPolicy,
    holder_gone: bool,
) -> ReapStatement {
    if run.started {
        ReapStatement::Fail {
            retry_at: retry_time(now, policy, run.attempts),
            error: if holder_gone {
                format!(
                    "worker gone: the process of worker {} ended during attempt {}",
                    run.worker, run.attempts
                )
            } else {
                lease_expired_error(&run.worker, run.attempts)
            },
        }
    } else {
        ReapStatement::GiveBack {
            note: format!(
                "not started: worker {} was gone before attempt {} started; \
                 the attempt was given back",
                run.worker, run.attempts
            ),
        }
    }
}

/// A transaction of the application's own, on a connection to the queue's
/// database, in which [`Queue::enqueue_tx`](crate::Queue::enqueue_tx) and
/// its forms write jobs: the job exists if and only if the caller commits.
/// Implemented for each engine's transaction type, and only for those:
///
/// | engine | pass | open it on |
/// | --- | --- | --- |
/// | SQLite | `&rusqlite::Transaction` | [`Queue::open_connection`](crate::Queue::open_connection) (or any connection to the file) |
/// | PostgreSQL (feature `postgres`) | `&mut postgres::Transaction` | any connection to the queue's database |
/// | MySQL/MariaDB (feature `mysql`) | `&mut mysql::Transaction` | any connection to the queue's database (`tickler::mysql::Conn::start_transaction`) |
///
/// A transaction of another engine than the queue's is refused with
/// [`Error::Unsupported`], and nothing is written.
pub trait AppTx<'a, 'b: 'a>: sealed::Sealed {
    /// The engine's view of the transaction.
    #[doc(hidden)]
    fn into_app_tx(self) -> AppTxRef<'a, 'b>;
}

/// An application transaction as an engine receives it; see [`AppTx`].
#[doc(hidden)]
pub struct AppTxRef<'a, 'b: 'a>(pub(crate) AppTxKind<'a, 'b>);

/// Which engine's transaction an [`AppTx`] is.
pub(crate) enum AppTxKind<'a, 'b: 'a> {
    Sqlite(&'a rusqlite::Transaction<'b>),
    #[cfg(feature = "postgres")]
    Postgres(&'a mut ::postgres::Transaction<'b>),
    #[cfg(feature = "mysql")]
    Mysql(&'a mut ::mysql::Transaction<'b>),
}

impl AppTxKind<'_, '_> {
    /// The engine the transaction belongs to, for messages.
    pub(crate) fn engine(&self) -> &'static str {
        match self {
            AppTxKind::Sqlite(_) => "SQLite",
            #[cfg(feature = "postgres")]
            AppTxKind::Postgres(_) => "PostgreSQL",
            #[cfg(feature = "mysql")]
            AppTxKind::Mysql(_) => "MySQL",
        }
    }
}

mod sealed {
    /// Only tickler implements [`super::AppTx`].
    pub trait Sealed {}
    impl Sealed for &rusqlite::Transaction<'_> {}
    #[cfg(feature = "postgres")]
    impl Sealed for &mut ::postgres::Transaction<'_> {}
    #[cfg(feature = "mysql")]
    impl Sealed for &mut ::mysql::Transaction<'_> {}

    /// Only tickler implements [`super::AppWrites`].
    pub trait SealedWrites<M> {}
}

/// The application's writes that [`Queue::complete_with`](crate::Queue::complete_with)
/// runs inside the transaction that completes a job: a closure over the
/// queue's engine's transaction type, written with the type named, so
/// that one method serves every engine:
///
/// | engine | closure |
/// | --- | --- |
/// | SQLite | `\|tx: &rusqlite::Transaction\| -> tickler::Result<T>` |
/// | PostgreSQL (feature `postgres`) | `\|tx: &mut postgres::Transaction\| -> tickler::Result<T>` |
/// | MySQL/MariaDB (feature `mysql`) | `\|tx: &mut mysql::Transaction\| -> tickler::Result<T>` |
///
/// A closure over another engine's transaction than the queue's is not
/// run: the call answers [`Error::Unsupported`] and nothing is written.
/// `M` tells the two closure shapes apart; it is inferred, never named.
#[diagnostic::on_unimplemented(
    message = "`complete_with` takes a closure over the engine's transaction, with its type named, returning `tickler::Result<T>`",
    label = "not a closure tickler can run in the completing transaction",
    note = "on SQLite: `|tx: &tickler::rusqlite::Transaction| {{ tx.execute(..)?; Ok(()) }}`",
    note = "on PostgreSQL (feature `postgres`): `|tx: &mut tickler::postgres::Transaction| {{ tx.execute(..)?; Ok(()) }}`",
    note = "on MySQL/MariaDB (feature `mysql`): `|tx: &mut tickler::mysql::Transaction| {{ tx.exec_drop(..)?; Ok(()) }}`",
    note = "the closure returns `tickler::Result<T>`, not the driver's own `Result`: end it with `Ok(..)` and use `?` on the driver's errors"
)]
pub trait AppWrites<T, M>: sealed::SealedWrites<M> {
    /// Runs the writes in the engine's transaction.
    #[doc(hidden)]
    fn write(self, tx: AppTxRef<'_, '_>) -> Result<T>;
}

/// The [`AppWrites`] shape of a closure over a rusqlite transaction.
#[doc(hidden)]
#[derive(Debug)]
pub enum SqliteWrites {}

/// The [`AppWrites`] shape of a closure over a postgres transaction.
#[doc(hidden)]
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub enum PostgresWrites {}

impl<F, T> sealed::SealedWrites<SqliteWrites> for F where
    F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T>
{
}

impl<F, T> AppWrites<T, SqliteWrites> for F
where
    F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
{
    fn write(self, tx: AppTxRef<'_, '_>) -> Result<T> {
        match tx.0 {
            AppTxKind::Sqlite(tx) => self(tx),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            other => Err(Error::Unsupported {
                what: "a closure over a rusqlite transaction (complete_with)",
                engine: other.engine(),
            }),
        }
    }
}

#[cfg(feature = "postgres")]
impl<F, T> sealed::SealedWrites<PostgresWrites> for F where
    F: FnOnce(&mut ::postgres::Transaction<'_>) -> Result<T>
{
}

#[cfg(feature = "postgres")]
impl<F, T> AppWrites<T, PostgresWrites> for F
where
    F: FnOnce(&mut ::postgres::Transaction<'_>) -> Result<T>,
{
    fn write(self, tx: AppTxRef<'_, '_>) -> Result<T> {
        match tx.0 {
            AppTxKind::Postgres(tx) => self(tx),
            other => Err(Error::Unsupported {
                what: "a closure over a postgres transaction (complete_with)",
                engine: other.engine(),
            }),
        }
    }
}

impl<'a, 'b> AppTx<'a, 'b> for &'a rusqlite::Transaction<'b> {
    fn into_app_tx(self) -> AppTxRef<'a, 'b> {
        AppTxRef(AppTxKind::Sqlite(self))
    }
}

#[cfg(feature = "postgres")]
impl<'a, 'b> AppTx<'a, 'b> for &'a mut ::postgres::Transaction<'b> {
    fn into_app_tx(self) -> AppTxRef<'a, 'b> {
        AppTxRef(AppTxKind::Postgres(self))
    }
}

#[cfg(feature = "mysql")]
impl<'a, 'b> AppTx<'a, 'b> for &'a mut ::mysql::Transaction<'b> {
    fn into_app_tx(self) -> AppTxRef<'a, 'b> {
        AppTxRef(AppTxKind::Mysql(self))
    }
}

/// The [`AppWrites`] shape of a closure over a mysql transaction.
#[doc(hidden)]
#[cfg(feature = "mysql")]
#[derive(Debug)]
pub enum MysqlWrites {}

#[cfg(feature = "mysql")]
impl<F, T> sealed::SealedWrites<MysqlWrites> for F where
    F: FnOnce(&mut ::mysql::Transaction<'_>) -> Result<T>
{
}

#[cfg(feature = "mysql")]
impl<F, T> AppWrites<T, MysqlWrites> for F
where
    F: FnOnce(&mut ::mysql::Transaction<'_>) -> Result<T>,
{
    fn write(self, tx: AppTxRef<'_, '_>) -> Result<T> {
        match tx.0 {
            AppTxKind::Mysql(tx) => self(tx),
            other => Err(Error::Unsupported {
                what: "a closure over a mysql transaction (complete_with)",
                engine: other.engine(),
            }),
        }
    }
}

/// Settings only the SQLite engine has, given with
/// [`QueueBuilder::sqlite`](crate::QueueBuilder::sqlite). A builder may
/// carry these and [`PostgresOptions`] both: the options of the engine the
/// location names apply, the others are for the other engine (the same
/// code can open either).
#[derive(Clone)]
pub struct SqliteOptions {
    pub(crate) durability: Durability,
    pub(crate) read_connections: u32,
    pub(crate) on_connection: Option<ConnectionHook>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            durability: Durability::default(),
            read_connections: 4,
            on_connection: None,
        }
    }
}

impl std::fmt::Debug for SqliteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOptions")
            .field("durability", &self.durability)
            .field("read_connections", &self.read_connections)
            .field("on_connection", &self.on_connection.is_some())
            .finish()
    }
}

impl SqliteOptions {
    /// [`Durability::Full`] (default: every commit fsynced) or
    /// [`Durability::Normal`] (survives a crash of the process, not a power
    /// loss). On PostgreSQL durability is the server's
    /// (`synchronous_commit`).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Size of the pool of read connections (default 4, at least 1).
    pub fn read_connections(mut self, n: u32) -> Self {
        self.read_connections = n.max(1);
        self
    }

    /// Runs `hook` on every connection tickler opens on the file (the
    /// writer, readers and [`Queue::open_connection`](crate::Queue::open_connection)),
    /// after tickler's own pragmas: for settings such as `cache_size` or
    /// `mmap_size`. Must not change `journal_mode` or `synchronous` (they are
    /// read back, and a change is [`Error::PragmaMismatch`]).
    pub fn on_connection(
        mut self,
        hook: impl Fn(&Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.on_connection = Some(Arc::new(hook));
        self
    }
}

/// Settings only the PostgreSQL engine (feature `postgres`) has, given
/// with [`QueueBuilder::postgres`](crate::QueueBuilder::postgres); see
/// [`SqliteOptions`] for a builder that carries both.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub(crate) max_connections: u32,
    pub(crate) listen: bool,
    pub(crate) fallback_poll: Duration,
    pub(crate) tls: PostgresTls,
    pub(crate) pooler: Option<Pooler>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            max_connections: 10,
            listen: true,
            fallback_poll: Duration::from_secs(1),
            tls: PostgresTls::default(),
            pooler: None,
        }
    }
}

/// What stands between tickler and the PostgreSQL server: given as
/// `pooler=…` in the URL (`detect`, `session` or its other name `none`,
/// `transaction`) or with
/// [`PostgresOptions::pooler`], which wins; the default is
/// [`Pooler::Detect`].
///
/// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`,
/// and most hosted "transaction" or "serverless" poolers) gives each
/// transaction whichever server connection is free: a statement prepared
/// by name in one transaction is not there in the next, a session's
/// settings land on someone else's, and `LISTEN` hears nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooler {
    /// Find out at open (the default): tickler sets a session setting on
    /// one connection and reads it from a second; if the second sees it,
    /// the two share a server connection, so a pooler in transaction mode
    /// is in between and tickler runs as with [`Pooler::Transaction`],
    /// saying so once in the log (INFO). A busy pooler may hand the second
    /// connection another server connection, so this can miss one; a
    /// server's answer that only such a pooler causes (a prepared
    /// statement of tickler's that is not there, or one of that name that
    /// already is) then switches the queue over too, with a warning, and
    /// the transaction is retried. Until then a statement that another
    /// process prepared under the same name (the client library numbers
    /// them `s0`, `s1`, … in each process) can run in place of tickler's
    /// without any error: name the pooler to rely on neither. A pooler
    /// named [`Pooler::Session`] that answers so fails the transaction
    /// at once with [`Error::Config`] saying to name it `transaction`.
    Detect,
    /// No pooler, or one that keeps each client's server connection for
    /// its whole session (PgBouncer's `pool_mode = session`): statements
    /// prepared once per connection, session settings (`jit = off`) and
    /// `LISTEN` for wake-ups. Nothing is probed.
    Session,
    /// A pooler in transaction mode: no statement outlives its transaction
    /// (each is sent unnamed, with its parameters' types, in the round
    /// trip that runs it, and planned each time), no session setting is
    /// made (set `jit = off` on the role or database, `ALTER ROLE … SET
    /// jit = off`, where JIT is on), and there is no `LISTEN`: other
    /// processes' work is seen every [`PostgresOptions::fallback_poll`],
    /// as with `listen(false)` (the `NOTIFY`s still go out, for processes
    /// connected without the pooler). An application's own statements in
    /// [`crate::Queue::complete_with`] and [`crate::Queue::enqueue_tx`]
    /// must keep to the transaction too (`SET LOCAL`, not `SET`). A
    /// pooler in statement mode cannot be used: tickler needs
    /// transactions.
    Transaction,
}

impl Pooler {
    /// The value's name in a URL (`transaction`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::Detect => "detect",
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        }
    }
}

impl std::str::FromStr for Pooler {
    type Err = Error;

    fn from_str(s: &str) -> Result<Pooler> {
        match s {
            "detect" => Ok(Pooler::Detect),
            "session" | "none" => Ok(Pooler::Session),
            "transaction" => Ok(Pooler::Transaction),
            other => Err(Error::Config(format!(
                "pooler={other:?} in the URL: expected detect, session (or none) or transaction"
            ))),
        }
    }
}

/// Whether and how a PostgreSQL connection uses TLS: libpq's `sslmode`,
/// with libpq's meanings. Given as `sslmode=…` in the URL or with
/// [`PostgresOptions::ssl_mode`]; the default is [`SslMode::Prefer`], as
/// in libpq ([`SslMode::VerifyFull`] with `sslrootcert=system`).
///
/// Only [`SslMode::VerifyFull`] protects against a server that is not the
/// one named (a man in the middle); [`SslMode::Require`] protects against
/// eavesdropping only, and [`SslMode::Prefer`] sends everything in clear
/// when the server offers no TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, else in clear; the certificate is not
    /// checked (unless root certificates are given: then its authority is,
    /// as in [`SslMode::VerifyCa`], while a server without TLS is still
    /// reached in clear). A TLS handshake that fails fails the connection
    /// (libpq would go on in clear).
    Prefer,
    /// TLS or no connection; the certificate is not checked (unless root
    /// certificates are given: then as [`SslMode::VerifyCa`]). Nothing,
    /// the password included, is sent before TLS is up.
    Require,
    /// TLS, with a certificate signed by one of the root certificates
    /// (`sslrootcert`); the host name is not checked.
    VerifyCa,
    /// TLS, with a certificate signed by one of the root certificates and
    /// made out to the host name connected to (or its IP address).
    VerifyFull,
}

impl SslMode {
    /// The mode's name in a URL (`verify-full`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl std::str::FromStr for SslMode {
    type Err = Error;

    /// libpq's names. `allow` (in clear first, TLS if the server insists)
    /// is refused: the client library tries TLS first or not at all.
    fn from_str(s: &str) -> Result<SslMode> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(Error::Config(
                    "sslmode=allow is not supported (tickler offers TLS first or not at all): \
                     use prefer, or disable"
                        .into(),
                ))
            }
            other => {
                return Err(Error::Config(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, \
                     verify-full"
                )))
            }
        })
    }
}

/// Where a PostgreSQL connection finds the certificates it checks the
/// server's against (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// A PEM file of one or more CA certificates.
    File(std::path::PathBuf),
    /// The operating system's trusted roots (`sslrootcert=system`, as in
    /// libpq 16): for a server whose certificate a public CA signed. Only
    /// with [`SslMode::VerifyFull`], its default.
    System,
}

/// The TLS settings of [`PostgresOptions`]; each one set here wins over
/// the URL's.
#[derive(Debug, Clone, Default)]
pub(crate) struct PostgresTls {
    pub(crate) mode: Option<SslMode>,
    pub(crate) root_certs: Option<RootCerts>,
    /// Certificate chain and private key, PEM files.
    pub(crate) client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl PostgresOptions {
    /// Most connections this `Queue` (and its clones) keeps in its pool
    /// (default 10, at least 2). A worker pool uses about two (claims and
    /// outcomes, heartbeats) plus one per enqueueing thread at a time; the
    /// listening connection comes on top.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// Whether watchers `LISTEN` for other processes' commits (default
    /// true): without it, watchers look for other processes' work every
    /// [`PostgresOptions::fallback_poll`]. Behind a pooler in transaction
    /// mode ([`Pooler::Transaction`]) there is no `LISTEN` whatever this
    /// says.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// How often a watcher looks for other processes' work while it cannot
    /// listen (listening turned off, or its connection lost and not yet
    /// back); default 1 s, at least 1 ms.
    pub fn fallback_poll(mut self, every: Duration) -> Self {
        self.fallback_poll = every.max(Duration::from_millis(1));
        self
    }

    /// What stands between tickler and the server (default
    /// [`Pooler::Detect`]); wins over the URL's `pooler`.
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = Some(pooler);
        self
    }

    /// Whether and how connections use TLS (default [`SslMode::Prefer`]);
    /// wins over the URL's `sslmode`. Every connection uses it: the pool's
    /// and the listening one.
    pub fn ssl_mode(mut self, mode: SslMode) -> Self {
        self.tls.mode = Some(mode);
        self
    }

    /// The certificates the server's is checked against; wins over the
    /// URL's `sslrootcert` (a path, or `system`). A PEM file that cannot
    /// be read or holds no certificate fails the open with
    /// [`Error::Config`] naming it.
    pub fn ssl_root_certs(mut self, roots: RootCerts) -> Self {
        self.tls.root_certs = Some(roots);
        self
    }

    /// A client certificate for servers that ask for one (`cert`
    /// authentication in `pg_hba.conf`, or `clientcert=verify-full`): the
    /// certificate (chain) and its private key (PKCS#8, PKCS#1 or SEC1),
    /// PEM files; wins over the URL's `sslcert` and `sslkey`.
    pub fn ssl_client_cert(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.client_cert = Some((cert.into(), key.into()));
        self
    }
}

/// A job's stored progress: none until its handler first reported one.
pub(crate) fn progress(
    fraction: Option<f64>,
    message: Option<String>,
) -> Option<crate::job::Progress> {
    fraction.map(|fraction| crate::job::Progress {
        fraction,
        message: message.unwrap_or_default(),
    })
}

/// A [`crate::Batch`] from its row's columns (`counts`: members,
/// remaining, succeeded, dead, cancelled) and its callbacks, as every
/// engine reads them.
pub(crate) fn batch_from_parts(
    id: crate::BatchId,
    description: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    sealed_at: Option<chrono::DateTime<chrono::Utc>>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    counts: [i64; 5],
    callbacks: &[(JobId, crate::batch::Callback)],
) -> crate::Batch {
    use crate::batch::Callback;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let role = |r: Callback| callbacks.iter().find(|c| c.1 == r).map(|c| c.0);
    crate::Batch {
        id,
        description,
        created_at,
        sealed_at,
        finished_at,
        members: n(counts[0]),
        remaining: n(counts[1]),
        succeeded: n(counts[2]),
        dead: n(counts[3]),
        cancelled: n(counts[4]),
        on_success: role(Callback::OnSuccess),
        on_failure: role(Callback::OnFailure),
        on_finish: role(Callback::OnFinish),
    }
}

/// The callback rows of a batch just stored as `batch`: each validated job
/// marked with its role, so that the insert stores it `waiting` and joins
/// it to the batch.
pub(crate) fn callback_rows(
    batch: crate::BatchId,
    callbacks: &[(crate::batch::Callback, ValidJob)],
) -> Vec<ValidJob> {
    callbacks
        .iter()
        .map(|(role, row)| {
            let mut row = row.clone();
            row.batch = Some((batch, Some(*role)));
            row
        })
        .collect()
}
