//! Operators' readings and upkeep: counts and lists for dashboards,
//! capped and read through indexes; activity over time; what is left to do;
//! what the store under the queue is (its file, WAL, checkpoints,
//! permissions, write-lock waits, schema versions). The `tickler` binary and
//! its dashboard use these. Get one with [`Queue::ops`].

use super::readings::{ActivityBucket, QueueCounts};
use super::Queue;
use crate::engine::types::*;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::job::{Job, JobState};
use crate::metrics::WriteLockWaits;
use chrono::{DateTime, Utc};
use std::path::Path;
use std::time::Duration;

/// Operators' readings and upkeep on one [`Queue`]; see the
/// module docs.
#[derive(Debug, Clone, Copy)]
pub struct Ops<'q> {
    queue: &'q Queue,
}

impl Queue {
    /// Operators' readings and upkeep; see [`Ops`].
    pub fn ops(&self) -> Ops<'_> {
        Ops { queue: self }
    }
}

impl Ops<'_> {
    /// Blocked jobs the limits' safety sweep of this process made pending
    /// since the queue was opened: each a slot some release failed to hand
    /// on. It should stay 0.
    pub fn limit_sweep_unblocked(&self) -> u64 {
        self.queue.limit_sweep_unblocked()
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
        self.queue.counts_by_queue(cap)
    }

    /// Jobs in `state` of `queue` and of `kind` (each if given), counted
    /// through that state's index up to `cap`: what a bulk action on them
    /// would touch, for a confirmation. A given queue leads the index; a
    /// kind alone is checked on each job of the state read, up to `cap`
    /// matches.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn count_matching(
        &self,
        state: JobState,
        queue: Option<&str>,
        kind: Option<&str>,
        cap: u64,
    ) -> Result<u64> {
        self.queue.engine().count_matching(state, queue, kind, cap)
    }

    /// How long the longest-waiting due job of `queue` has been due: the
    /// earliest due time (UTC) of its pending jobs and of its scheduled
    /// jobs already due, by this queue's clock (on a server engine, the
    /// server's). `None` when nothing of it is due. Two index steps,
    /// whatever the queue's depth.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn oldest_due(&self, queue: &str) -> Result<Option<DateTime<Utc>>> {
        Ok(self
            .queue
            .engine()
            .oldest_due_in_queue(queue)?
            .map(crate::clock::ms_to_datetime))
    }

    /// Up to `limit` jobs in `state`, through that state's index (at most
    /// `limit` jobs read per queue): pending in claim order (priority,
    /// due time, id), scheduled soonest due first, running soonest lease
    /// expiry first, succeeded, dead and cancelled newest first.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn list_state(&self, state: JobState, limit: usize) -> Result<Vec<Job>> {
        self.queue.list_state(state, limit)
    }

    /// One page of a state's jobs, filtered by queue, kind and retrying,
    /// in the state's order (see [`JobPage`]). Paged by key: pass
    /// [`JobCursor::after`] of the last job of a page as the next page's
    /// `after`; a page with fewer than `limit` jobs is the last. Each page
    /// reads at most `limit` index entries per queue (the queue's, or each
    /// queue that has jobs in the state), plus those a kind or retrying
    /// test passes over, and never counts or skips the jobs before it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a cursor made from a job of another
    /// state; [`Error::Sqlite`], [`Error::Pool`], `Error::Postgres`.
    ///
    /// # Example
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
    /// use tickler::{JobCursor, JobPage, JobState, NewJob};
    /// for _ in 0..5 {
    ///     queue.enqueue(NewJob::new("mail").queue("mail"))?;
    /// }
    /// let mut page = JobPage { queue: Some("mail".into()), limit: 2, ..JobPage::new(JobState::Pending) };
    /// let mut seen = 0;
    /// loop {
    ///     let jobs = queue.ops().page(&page)?;
    ///     seen += jobs.len();
    ///     match jobs.last() {
    ///         Some(last) if jobs.len() == page.limit => page.after = Some(JobCursor::after(last)),
    ///         _ => break,
    ///     }
    /// }
    /// assert_eq!(seen, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn page(&self, page: &JobPage) -> Result<Vec<Job>> {
        self.queue.page(page)
    }

    /// The unfinished job (scheduled, pending, blocked or running) that
    /// holds `unique_key`, if any: at most one does. Finished jobs keep
    /// their key but are not found here (nothing indexes them by key).
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`], `Error::Postgres`.
    pub fn holding_unique_key(&self, unique_key: &str) -> Result<Option<Job>> {
        self.queue.engine().holding_unique_key(unique_key)
    }

    /// Throughput and lateness over time, for a dashboard's plot: the
    /// last `slices` slices of time of `width` each, the last one ending at
    /// now (this queue's clock), oldest first. Each slice counts the jobs
    /// that finished in it through the index on the finish time, up to
    /// `cap`, and the dead among them through the index of finished jobs
    /// by state, queue by queue, up to `cap` too, and reads at most
    /// [`ACTIVITY_SAMPLE`](crate::ACTIVITY_SAMPLE) of them for lateness and
    /// run time, so the cost is bounded by `slices`, `cap`, the sample and
    /// the number of queues with dead jobs, not by the table. Pruned jobs
    /// are gone from these figures. Each slice is its own read: the slices
    /// are not one snapshot.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `width` under 1 ms, no slice, or
    /// more than [`ACTIVITY_MAX_BUCKETS`](crate::ACTIVITY_MAX_BUCKETS);
    /// [`Error::Sqlite`], [`Error::Pool`], `Error::Postgres`.
    ///
    /// # Example
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
    /// use std::time::Duration;
    /// // The last hour, a minute a slice.
    /// let minutes = queue.ops().activity(60, Duration::from_secs(60), 10_000)?;
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
        self.queue.activity(slices, width, cap)
    }

    /// Number of jobs that reached a finished state (succeeded, dead,
    /// cancelled) at or after `since`; uses the index on the finish time.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.queue.finished_since(since)
    }

    /// Number of unfinished (scheduled, pending or running) jobs of these
    /// queues, only of `kinds` if given, counted in one statement (one
    /// snapshot), so a caller waiting for a batch to drain never sees a job
    /// between two states.
    ///
    /// # Errors
    /// [`Error::Sqlite`], [`Error::Pool`].
    pub fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        self.queue.unfinished(queues, kinds)
    }

    /// How long this process's write transactions (through any clone of
    /// this `Queue`) waited for the write lock so far.
    pub fn write_lock_waits(&self) -> WriteLockWaits {
        self.queue.write_lock_waits()
    }

    /// Size of the file's `-wal` file in bytes (0 if there is none).
    pub fn wal_bytes(&self) -> u64 {
        self.queue.wal_bytes()
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
        self.queue.checkpoint()
    }

    /// [`Ops::file_is_private`] for this queue's file.
    ///
    /// # Errors
    /// As [`Ops::file_is_private`].
    pub fn is_private(&self) -> Result<bool> {
        self.queue.is_private()
    }

    /// The engine this queue lives in, for messages and reports:
    /// `"SQLite"` or `"PostgreSQL"`.
    pub fn engine(&self) -> &'static str {
        self.queue.engine().name()
    }

    /// The schema version this build writes (`PRAGMA user_version`).
    pub fn schema_version() -> i64 {
        Queue::schema_version()
    }

    /// The schema version (`PRAGMA user_version`) of the file at `path`,
    /// read without creating, migrating or otherwise changing it; `None` if
    /// there is no file. A new, empty file reads 0.
    ///
    /// # Errors
    /// [`Error::NotADatabase`] (not SQLite, or damaged), [`Error::ReadOnly`]
    /// (cannot be opened), [`Error::Sqlite`].
    pub fn file_schema_version(path: impl AsRef<Path>) -> Result<Option<i64>> {
        Queue::file_schema_version(path)
    }

    /// Whether the queue file at `path` and its `-wal` and `-shm` files
    /// (those that exist) are private to their owner: no read, write or
    /// execute permission for group or others. Jobs' payloads (a shell
    /// job's `env`, say) are readable by whoever can read these files.
    /// [`QueueBuilder::open`](crate::QueueBuilder::open) logs a warning when
    /// they are not; an application that keeps secrets in payloads can refuse
    /// to go on. Always true where files have no Unix permission bits.
    ///
    /// # Errors
    /// [`Error::Io`] if `path` cannot be examined (it does not exist, or a
    /// folder on the way is not searchable).
    pub fn file_is_private(path: impl AsRef<Path>) -> Result<bool> {
        Queue::file_is_private(path)
    }
}
