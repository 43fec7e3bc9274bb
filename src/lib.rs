//! # tickler
//!
//! An embedded, durable job queue and scheduler on one SQLite file (WAL
//! mode), for programs without a database server: desktop apps, Raspberry
//! Pi and other edge boxes, single-binary services. Any number of threads
//! and processes on one machine may share the file.
//!
//! ```no_run
//! use std::time::Duration;
//! use tickler::{NewJob, Queue};
//!
//! # fn main() -> tickler::Result<()> {
//! let queue = Queue::open("jobs.db")?;
//! queue.enqueue(NewJob::new("send_email").payload(serde_json::json!({"to": "ada@example.com"})))?;
//! for lease in queue.claim("default", "worker-1", 10, Duration::from_secs(30))? {
//!     // ... do the work, outside any transaction ...
//!     queue.complete(&lease)?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Guarantees
//!
//! 1. **Enqueue is durable.** When [`Queue::enqueue`] returns `Ok`, the job is
//!    committed. With [`Durability::Full`] (the default, fsync on commit) it
//!    survives power loss; with [`Durability::Normal`] a process crash.
//! 2. **One holder at a time.** A claim is one `BEGIN IMMEDIATE` transaction
//!    holding one conditional `UPDATE … RETURNING`; two claimers never get
//!    the same job.
//! 3. **Leases, fenced.** Each claim writes a fresh [`RunToken`] and a lease
//!    expiry. Heartbeats and outcomes only apply while the job is `running`
//!    with that token; otherwise they return [`Error::LeaseLost`] and change
//!    nothing.
//! 4. **The reaper only takes what is really stale** ([`Queue::reap`]): its
//!    update repeats the expiry condition, so a heartbeat that lands first
//!    wins. Reaped jobs wait for a backoff, or are `dead` once their attempts
//!    are used up.
//! 5. **At-least-once execution, exactly-once ownership.** A job whose holder
//!    crashed after doing the work runs again. Handlers get the job id,
//!    attempt number and run_token: use them to make side effects idempotent.
//! 6. **Short write transactions.** No transaction is open while a handler runs.
//! 7. **Bad input gets a typed [`Error`]** and nothing stored is lost.
//! 8. **One bad job fails alone.** A row that cannot be read, an error text
//!    too long to store, a handler that ignores its timeout: each costs that
//!    job (it fails or goes `dead` with an error that says why), never the
//!    other jobs of its batch, its queue or its pool. Error texts are cut to
//!    [`MAX_ERROR_BYTES`]; every attempt's error is kept in [`Job::errors`].
//!
//! ## Job states
//!
//! ```text
//!   enqueue ─► scheduled ──(due)──► pending ──claim──► running ──► succeeded
//!                  ▲                   ▲                │ │ │
//!                  ├── fail, backoff ──┼────────────────┘ │ ├──► dead
//!                  ├── snooze ─────────┘ (no attempt)     │ └──► cancelled
//!                  └── lease expired (reaper) ────────────┘
//! ```
//!
//! `scheduled` is the design's "pending with a future run_at": kept as its
//! own state so that a claim never scans jobs that are not due.
//!
//! ## Time
//!
//! Stored as INTEGER milliseconds since the Unix epoch, UTC; the API takes
//! and returns `chrono::DateTime<Utc>`. "Now" is always read through a
//! [`Clock`].
//!
//! ## Schedules
//!
//! A [`NewSchedule`] is a cron expression (5 fields, or 6 with seconds)
//! read in an IANA time zone, with a job template and a [`MisfirePolicy`],
//! stored with [`Queue::upsert_schedule`]. Each occurrence (tick) becomes
//! one job due at exactly the tick's instant, enqueued once however many
//! [`Scheduler`]s (every [`WorkerPool`] runs one) share the file. What
//! happens on DST nights, after the device was off and when the wall clock
//! is stepped is defined on [`NewSchedule`].
//!
//! ```no_run
//! # fn main() -> tickler::Result<()> {
//! let queue = tickler::Queue::open("jobs.db")?;
//! queue.upsert_schedule(
//!     tickler::NewSchedule::new("nightly-backup", "30 2 * * *", "backup")
//!         .time_zone("Europe/Berlin"),
//! )?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Worker pools
//!
//! A [`WorkerPool`] claims jobs of the kinds it has handlers for, runs each
//! handler outside any transaction, renews leases with one heartbeat
//! transaction per tick, and records outcomes by **group commit**: the
//! outcomes of every job that finished since the last commit and the claim
//! of the next jobs share one transaction.
//!
//! What a pool claims beyond its free threads is bounded by time: about as
//! many jobs as it expects to start within half of
//! [`WorkerPoolBuilder::prefetch_hold`] (20 ms), from the measured run time
//! of its handlers, at most [`WorkerPoolBuilder::prefetch`] (512). A flood
//! of short jobs is claimed hundreds at a time; long jobs one per free
//! thread; and a job claimed ahead that still waits for a thread after the
//! holding time is handed back for any process to run. Measured in
//! `BENCHMARKS.md` (`cargo bench --bench tickler_bench -- --only burn`): with
//! default settings a 4-thread pool drains no-op jobs at about the rate of a
//! hand-written loop that claims and completes 32 jobs per transaction.
//!
//! ## What each write promises (and which ones fsync)
//!
//! | write | fsync under [`Durability::Full`] | if power fails before it is on disk |
//! | --- | --- | --- |
//! | `enqueue`, `enqueue_batch` | yes, before `Ok` (concurrent callers share one) | cannot happen: `Ok` means on disk |
//! | `record_outcomes`, `complete`, `fail`, `snooze`, cancel, retry, prune | yes | — |
//! | worker pool outcomes | within `outcome_sync_interval` (50 ms), outside the write lock | the job runs again (at-least-once), never lost |
//! | claim, heartbeat, reap | no fsync of their own | the job is pending again / its lease is older; the reaper handles it |
//!
//! In WAL mode a synced commit also makes every earlier commit durable, as
//! the log is written in order; that is what lets claims and heartbeats
//! skip their own fsync. See [`Queue::sync`] and [`OutcomeSync`].
//!
//! ## Jobs in the application's own transactions
//!
//! When the application keeps its data in the same file,
//! [`Queue::enqueue_tx`] writes a job inside the application's transaction
//! (the job exists if and only if it commits) and
//! [`JobContext::complete_with`] commits a handler's writes and the job's
//! completion together (a lost lease rolls both back). Effects inside the
//! file are then exactly-once; effects outside it (HTTP, e-mail) stay
//! at-least-once and should use the job id or run_token as an idempotency
//! key. [`Queue::open_connection`] opens a connection with tickler's
//! pragmas; tickler's tables and indexes are all named `tickler_*`.
//! One thing in the file is not namespaced: tickler keeps its schema
//! version in `PRAGMA user_version`, so an application sharing the file must
//! keep its own schema version in a table of its own, not in
//! `user_version`.
//!
//! ## Processes and `fork`
//!
//! Open the [`Queue`] in each process (or after `fork`), never before a
//! `fork` that both sides keep using: SQLite connections, their locks and
//! the threads of a pool do not survive being copied into a child process.
//! A child that only calls `exec` is fine.

#![warn(missing_docs)]

#[cfg(feature = "tokio")]
mod async_queue;
mod clock;
mod engine;
mod error;
mod file_events;
mod job;
mod lease;
mod metrics;
mod queue;
mod reaper;
mod retry;
mod schedule;
mod scheduler;
mod sqlite;
mod typed;
mod worker;

/// The `rusqlite` this crate is built with: its types appear in the public
/// API ([`QueueBuilder::on_connection`], [`Queue::open_connection`],
/// [`Queue::enqueue_tx`], [`JobContext::complete_with`]). Use
/// `tickler::rusqlite` rather than a `rusqlite` dependency of your own, so
/// the versions always match.
pub use rusqlite;

#[cfg(feature = "tokio")]
pub use async_queue::AsyncQueue;
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, Result};
pub use job::{
    AttemptError, Job, JobId, JobState, NewJob, RunToken, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE,
};
pub use lease::Lease;
pub use metrics::WriteLockWaits;
pub use queue::{
    ChangeWatcher, Checkpoint, ClaimRequest, ConnectionHook, Durability, JobFilter, Outcome,
    OutcomeSync, Queue, QueueBuilder, Stats, Waker, ERROR_HISTORY_MAX, MAX_ERROR_BYTES,
    MAX_PAYLOAD_BYTES_LIMIT, MAX_PAYLOAD_DEPTH, MAX_TIMESTAMP_MS, MAX_UNIQUE_KEY_BYTES,
};
pub use reaper::{Reaper, ReaperConfig, BACKWARD_STEP_MARGIN};
pub use retry::RetryPolicy;
pub use schedule::{
    MisfirePolicy, NewSchedule, OverlapPolicy, Schedule, ScheduleRef, Tick, TickRun, UpcomingTicks,
    DEFAULT_MISFIRE_GRACE, MAX_CATCH_UP, MAX_MISFIRE_GRACE,
};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use typed::JobArgs;
pub use worker::{
    CancelReason, Handler, JobContext, JobError, PoolStats, ShutdownReport, WorkerPool,
    WorkerPoolBuilder, DEFAULT_PREFETCH, DEFAULT_PREFETCH_HOLD, DEFAULT_PRIORITY_AGING,
};

/// The README's code examples, compiled (and the runnable ones run) by
/// `cargo test` as doctests so that they cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
