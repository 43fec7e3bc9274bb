//! [`WorkerPool`]: runs handlers on claimed jobs, with heartbeats, group
//! commit of outcomes, and graceful shutdown. It uses only the public
//! [`Queue`] API.
//!
//! Threads of one pool:
//!
//! ```text
//!                 leases (≤ free slots)                 outcomes
//!  dispatcher ─────────────────────────► workers ──────────────────► dispatcher
//!     one transaction records the finished batch and claims the next;
//!     sleeps until the next run_at, woken by commits (PRAGMA data_version,
//!     in-process wake-ups) and by workers finishing.
//!  heartbeat: renews every in-flight lease in one transaction per tick;
//!             a lost lease sets the job's cancellation flag, its outcome is dropped.
//!  reaper:    Queue::reap() every interval.
//!  scheduler: Queue::run_due_ticks() at each schedule's next tick.
//! ```
//!
//! Group commit: outcomes from all workers are written in batches, one
//! `BEGIN IMMEDIATE` transaction (one fsync under `Durability::Full`) per
//! batch, each outcome still fenced by its run_token.

use crate::clock::Clock;
use crate::error::Error;
use crate::events::{Event, EventHub, JobEvent, JobEventKind, Subscription};
use crate::job::{JobId, RunToken};
use crate::lease::Lease;
use crate::queue::{ChangeWatcher, ClaimRequest, Outcome, OutcomeSync, Queue, Waker};
use crate::reaper::{Reaper, ReaperConfig};
use crate::retry::RetryPolicy;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::typed::JobArgs;
use chrono::{DateTime, Utc};
use crossbeam_channel::{Receiver, Sender};
use std::collections::VecDeque;
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

/// Default of [`WorkerPoolBuilder::priority_aging`]: one job in 10 that a
/// pool claims is the oldest due one, whatever its priority.
pub const DEFAULT_PRIORITY_AGING: usize = 10;

/// Default of [`WorkerPoolBuilder::prefetch`]: the most jobs a pool claims
/// beyond its free threads, however short they are.
pub const DEFAULT_PREFETCH: usize = 512;

/// Default of [`WorkerPoolBuilder::prefetch_hold`]: the longest a claimed
/// job waits in a pool for a thread before it is handed back.
pub const DEFAULT_PREFETCH_HOLD: Duration = Duration::from_millis(20);

/// Most outcomes written in one dispatcher transaction.
const MAX_OUTCOME_BATCH: usize = 512;

/// How often a stopping dispatcher looks whether the last worker ended.
const STOPPING_POLL: Duration = Duration::from_millis(10);

/// How a handler ends a job other than by succeeding.
#[derive(Debug, Clone, PartialEq)]
pub enum JobError {
    /// The attempt failed: retry after backoff while attempts are left,
    /// then dead.
    Retry(String),
    /// Failed for good: dead now.
    Permanent(String),
    /// Not now: run again at this time (UTC); the attempt is given back.
    Snooze(DateTime<Utc>),
}

impl JobError {
    /// [`JobError::Retry`] with this message.
    pub fn retry(message: impl std::fmt::Display) -> Self {
        JobError::Retry(message.to_string())
    }

    /// [`JobError::Permanent`] with this message.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        JobError::Permanent(message.to_string())
    }
}

/// Any error turns into a retryable failure, so handlers can use `?`.
impl<E: std::error::Error> From<E> for JobError {
    fn from(e: E) -> Self {
        JobError::Retry(e.to_string())
    }
}

/// Why a job's cancellation flag was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The lease could not be renewed: the reaper took the job, or it was
    /// cancelled. Whatever the handler returns will be dropped.
    LeaseLost,
    /// The job's timeout passed. The handler should stop; its result still
    /// counts if its lease is held.
    Timeout,
    /// The pool is shutting down and its grace period is over.
    Shutdown,
}

impl CancelReason {
    fn code(self) -> u8 {
        match self {
            CancelReason::LeaseLost => 1,
            CancelReason::Timeout => 2,
            CancelReason::Shutdown => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(CancelReason::LeaseLost),
            2 => Some(CancelReason::Timeout),
            3 => Some(CancelReason::Shutdown),
            _ => None,
        }
    }
}

/// A job's cancellation flag; the first reason set wins. Async handlers
/// wait on it through [`JobContext::cancelled`], whose wakers it keeps.
#[derive(Debug, Default)]
struct CancelFlag(AtomicU8, Mutex<Vec<std::task::Waker>>);

impl CancelFlag {
    /// A lost lease overrides any other reason (its outcome must be
    /// dropped); otherwise the first reason stays.
    fn set(&self, reason: CancelReason) {
        if reason == CancelReason::LeaseLost {
            self.0.store(reason.code(), Ordering::SeqCst);
        } else {
            let _ = self
                .0
                .compare_exchange(0, reason.code(), Ordering::SeqCst, Ordering::SeqCst);
        }
        for waker in std::mem::take(&mut *lock(&self.1)) {
            waker.wake();
        }
    }

    fn get(&self) -> Option<CancelReason> {
        CancelReason::from_code(self.0.load(Ordering::SeqCst))
    }
}

/// The future of [`JobContext::cancelled`].
#[derive(Debug)]
struct Cancelled(Arc<CancelFlag>);

impl std::future::Future for Cancelled {
    type Output = CancelReason;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<CancelReason> {
        if let Some(reason) = self.0.get() {
            return std::task::Poll::Ready(reason);
        }
        {
            let mut wakers = lock(&self.0 .1);
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
        }
        // Looked at again after registering: a `set` in between found no
        // waker to wake.
        match self.0.get() {
            Some(reason) => std::task::Poll::Ready(reason),
            None => std::task::Poll::Pending,
        }
    }
}

/// What a handler gets: the claimed job and its cancellation flag.
///
/// Execution is at-least-once: a job whose worker died after doing the work
/// runs again. Use [`JobContext::job_id`] or [`JobContext::run_token`] as an
/// idempotency key for side effects.
///
/// Cloning is cheap (shared handles) and every clone speaks for the same
/// run: an async handler owns one.
#[derive(Debug, Clone)]
pub struct JobContext {
    lease: Lease,
    cancel: Arc<CancelFlag>,
    clock: Arc<dyn Clock>,
    queue: Queue,
    /// Where `complete_with` is: once committed the pool records nothing
    /// and the heartbeat leaves the job alone.
    completion: Arc<SelfCompletion>,
}

/// Progress of a handler completing its own job with
/// [`JobContext::complete_with`], shared with the pool's heartbeat.
#[derive(Debug, Default)]
struct SelfCompletion(AtomicU8);

impl SelfCompletion {
    const NONE: u8 = 0;
    /// The completing transaction is under way or has just committed, and
    /// the handler has not yet learned which: a heartbeat that finds the
    /// job no longer running may be looking at this very commit.
    const UNDER_WAY: u8 = 1;
    const COMMITTED: u8 = 2;

    /// Marks a completion under way; returns a guard that takes the mark
    /// back unless [`Self::commit`] ran, also when `app_writes` panics. A
    /// job already completed stays completed, whatever later calls do.
    fn begin(&self) -> UnderWay<'_> {
        let _ = self.0.compare_exchange(
            Self::NONE,
            Self::UNDER_WAY,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        UnderWay(self)
    }

    fn commit(&self) {
        self.0.store(Self::COMMITTED, Ordering::SeqCst);
    }

    fn committed(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::COMMITTED
    }

    /// True from [`Self::begin`] on, unless the completion failed.
    fn started(&self) -> bool {
        self.0.load(Ordering::SeqCst) != Self::NONE
    }
}

/// See [`SelfCompletion::begin`].
struct UnderWay<'a>(&'a SelfCompletion);

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        let _ = self.0 .0.compare_exchange(
            SelfCompletion::UNDER_WAY,
            SelfCompletion::NONE,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
}

impl JobContext {
    /// The job's id.
    pub fn job_id(&self) -> JobId {
        self.lease.job_id
    }

    /// The job's kind.
    pub fn kind(&self) -> &str {
        &self.lease.kind
    }

    /// The job's payload.
    pub fn payload(&self) -> &serde_json::Value {
        &self.lease.payload
    }

    /// The payload deserialized into `T`.
    ///
    /// # Errors
    /// A [`JobError::Permanent`] when it does not fit: retrying would not help.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, JobError> {
        self.lease
            .payload_as()
            .map_err(|e| JobError::permanent(format!("payload does not fit: {e}")))
    }

    /// This run's attempt number, from 1.
    pub fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    /// Attempts allowed.
    pub fn max_attempts(&self) -> u32 {
        self.lease.max_attempts
    }

    /// The fencing token of this run.
    pub fn run_token(&self) -> &RunToken {
        &self.lease.run_token
    }

    /// The whole lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// True once the handler should stop; see [`JobContext::cancel_reason`].
    pub fn is_cancelled(&self) -> bool {
        self.cancel.get().is_some()
    }

    /// Why the handler should stop, if it should.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel.get()
    }

    /// A future that is ready, with the reason, once the handler should
    /// stop: the job's timeout passed, its lease was lost (cancelled or
    /// reaped; noticed within about 100 ms), or the pool's shutdown grace
    /// ran out. For async handlers, to `select!` on beside their work;
    /// needs no particular runtime (the pool's heartbeat thread wakes it).
    ///
    /// ```no_run
    /// # async fn fetch() {}
    /// # async fn handler(ctx: tickler::JobContext) -> Result<(), tickler::JobError> {
    /// tokio::select! {
    ///     () = fetch() => Ok(()),
    ///     reason = ctx.cancelled() => Err(tickler::JobError::retry(format!("stopped: {reason:?}"))),
    /// }
    /// # }
    /// ```
    pub fn cancelled(&self) -> impl std::future::Future<Output = CancelReason> + Send + 'static {
        Cancelled(Arc::clone(&self.cancel))
    }

    /// Now, from the queue's clock (UTC).
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// The queue the job came from (for the application's own reads, or
    /// [`Queue::open_connection`]).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Completes the job together with the handler's own writes, in one
    /// transaction: see [`Queue::complete_with`]. After `Ok`, whatever the
    /// handler returns is ignored (the job is already succeeded). On
    /// [`crate::Error::LeaseLost`] nothing was written; return the error
    /// (`?` turns it into a retry that the pool drops, as the lease is gone).
    ///
    /// # Errors
    /// As [`Queue::complete_with`].
    pub fn complete_with<T>(
        &self,
        app_writes: impl FnOnce(&rusqlite::Transaction<'_>) -> crate::Result<T>,
    ) -> crate::Result<T> {
        // Marked before the commit, not after: the heartbeat can renew the
        // lease between the commit and this thread's next instruction.
        let _under_way = self.completion.begin();
        let value = self.queue.complete_with(&self.lease, app_writes)?;
        self.completion.commit();
        Ok(value)
    }

    /// [`JobContext::complete_with`] on PostgreSQL: see
    /// [`Queue::complete_with_pg`].
    ///
    /// # Errors
    /// As [`Queue::complete_with_pg`].
    #[cfg(feature = "postgres")]
    pub fn complete_with_pg<T>(
        &self,
        app_writes: impl FnOnce(&mut postgres::Transaction<'_>) -> crate::Result<T>,
    ) -> crate::Result<T> {
        let _under_way = self.completion.begin();
        let value = self.queue.complete_with_pg(&self.lease, app_writes)?;
        self.completion.commit();
        Ok(value)
    }

    /// A [`JobError::Snooze`] until `delay` from now (at the latest
    /// 9999-12-31T23:59:59.999Z, the end of what tickler stores).
    pub fn snooze_for(&self, delay: Duration) -> JobError {
        let until = chrono::Duration::from_std(delay)
            .ok()
            .and_then(|delay| self.now().checked_add_signed(delay));
        // Longer than tickler can store means "until the end of its range".
        let latest = crate::clock::ms_to_datetime(crate::MAX_TIMESTAMP_MS);
        JobError::Snooze(until.map_or(latest, |until| until.min(latest)))
    }
}

/// Runs jobs of one kind. Implemented for every
/// `Fn(&JobContext) -> Result<(), JobError> + Send + Sync`.
pub trait Handler: Send + Sync + 'static {
    /// Runs one job. `Ok` completes it; see [`JobError`] for the rest. A
    /// panic counts as [`JobError::Retry`] with the panic message.
    fn run(&self, ctx: &JobContext) -> Result<(), JobError>;
}

impl<F> Handler for F
where
    F: Fn(&JobContext) -> Result<(), JobError> + Send + Sync + 'static,
{
    fn run(&self, ctx: &JobContext) -> Result<(), JobError> {
        self(ctx)
    }
}

/// Settings for a [`WorkerPool`]; get one from [`WorkerPool::builder`].
pub struct WorkerPoolBuilder {
    queue: Queue,
    queues: Vec<String>,
    threads: usize,
    handlers: HashMap<String, Arc<dyn Handler>>,
    retry_policies: HashMap<String, RetryPolicy>,
    lease: Duration,
    heartbeat_interval: Option<Duration>,
    claim_batch: usize,
    prefetch: usize,
    prefetch_hold: Duration,
    reaper: Option<ReaperConfig>,
    scheduler: Option<SchedulerConfig>,
    max_idle: Duration,
    poll: Duration,
    shutdown_grace: Duration,
    worker_id: Option<String>,
    outcome_sync_interval: Duration,
    timeout_grace: Duration,
    replacement_threads: Option<usize>,
    priority_aging: usize,
    /// Where async handlers run (`WorkerPoolBuilder::runtime`).
    #[cfg(feature = "tokio")]
    runtime: Option<tokio::runtime::Handle>,
    /// An async handler registered with no runtime to run on: refused by
    /// `start`.
    #[cfg(feature = "tokio")]
    missing_runtime: Option<String>,
    #[cfg(feature = "metrics")]
    metrics_interval: Duration,
}

impl std::fmt::Debug for WorkerPoolBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPoolBuilder")
            .field("queues", &self.queues)
            .field("threads", &self.threads)
            .field("kinds", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl WorkerPoolBuilder {
    /// Serve this queue too (default: only `"default"`; the first call
    /// replaces the default).
    ///
    /// A pool serving several queues gives each a fair share of every
    /// claim (its free slots divided by the number of queues, rounded up;
    /// what a queue leaves unused goes to the others), and the queue that
    /// is asked first changes from claim to claim: a flood in one queue
    /// cannot starve another.
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        if self.queues == [crate::job::DEFAULT_QUEUE] {
            self.queues.clear();
        }
        let name = name.into();
        if !self.queues.contains(&name) {
            self.queues.push(name);
        }
        self
    }

    /// Number of worker threads, each running one job at a time (default 4).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// Runs jobs of `kind` with `handler`. The pool claims only kinds it
    /// has handlers for; registering a kind twice keeps the last handler.
    pub fn handler(mut self, kind: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(kind.into(), Arc::new(handler));
        self
    }

    /// Runs typed jobs of kind `A::KIND` with `handler`, which gets the
    /// payload deserialized as `A` ([`JobArgs`]). A payload that does not
    /// fit `A` fails its job permanently (dead at once) with an error
    /// naming the job, its kind, the type and the serde error; the handler
    /// is not called. `A::retry_policy()`, if any, becomes the kind's
    /// policy ([`WorkerPoolBuilder::retry_policy_for`]).
    ///
    /// ```no_run
    /// # use serde::{Deserialize, Serialize};
    /// # use tickler::{JobArgs, JobContext, JobError, Queue, WorkerPool};
    /// #[derive(Serialize, Deserialize)]
    /// struct Resize { path: String, width: u32 }
    /// impl JobArgs for Resize { const KIND: &'static str = "resize"; }
    ///
    /// # fn main() -> tickler::Result<()> {
    /// let queue = Queue::open("jobs.db")?;
    /// let pool = WorkerPool::builder(&queue)
    ///     .handler_for(|_ctx: &JobContext, args: Resize| {
    ///         println!("resizing {} to {} px", args.path, args.width);
    ///         Ok::<(), JobError>(())
    ///     })
    ///     .start()?;
    /// queue.enqueue_args(&Resize { path: "a.png".into(), width: 640 })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn handler_for<A: JobArgs>(
        mut self,
        handler: impl Fn(&JobContext, A) -> Result<(), JobError> + Send + Sync + 'static,
    ) -> Self {
        if let Some(policy) = A::retry_policy() {
            self.retry_policies.insert(A::KIND.to_owned(), policy);
        }
        self.handler(A::KIND, move |ctx: &JobContext| {
            handler(ctx, ctx.args::<A>()?)
        })
    }

    /// Backoff after failed attempts of `kind` in this pool, instead of the
    /// queue's [`crate::QueueBuilder::retry_policy`]. It applies where the
    /// pool records the failure: a handler's [`JobError::Retry`] and a
    /// panic. Failures recorded elsewhere keep the queue's policy: a lease
    /// that expired (taken back by a reaper, which may run in another
    /// process that knows nothing of this pool's kinds) and a handler
    /// written off past its timeout. The policy is not stored with the
    /// job: a pool that runs the kind with another policy uses its own.
    pub fn retry_policy_for(mut self, kind: impl Into<String>, policy: RetryPolicy) -> Self {
        self.retry_policies.insert(kind.into(), policy);
        self
    }

    /// Priority aging: one job in `every` that the pool claims is the
    /// oldest due job whatever its priority (default
    /// [`DEFAULT_PRIORITY_AGING`], 10); every other job goes by priority,
    /// then due time. Within a queue, priority orders the work, but a
    /// low-priority job does not wait for as long as higher-priority ones
    /// keep coming: once it is the oldest due job, it is among the next
    /// `every` jobs the pool claims (a claim of 500 jobs takes its 50
    /// oldest first, in one statement). `0` turns aging off (strictly ordered priority; see
    /// also [`WorkerPoolBuilder::strict_priority`]).
    pub fn priority_aging(mut self, every: usize) -> Self {
        self.priority_aging = every;
        self
    }

    /// Strictly ordered priority: a due higher-priority job always goes
    /// first, even if a lower-priority one waits for ever. Same as
    /// `priority_aging(0)`.
    pub fn strict_priority(self) -> Self {
        self.priority_aging(0)
    }

    /// Lease per claim, renewed by heartbeats (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Time between heartbeats (default a third of the lease).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// Most jobs one claim transaction takes (default: as many as there are
    /// free slots).
    pub fn claim_batch(mut self, n: usize) -> Self {
        self.claim_batch = n.max(1);
        self
    }

    /// Most jobs claimed beyond free threads, waiting for one (default
    /// [`DEFAULT_PREFETCH`], 512; `0`: never more than the free threads).
    ///
    /// Within this cap, what a pool claims ahead is bounded by time, not by
    /// count: about as many jobs as it expects to start within half of
    /// [`WorkerPoolBuilder::prefetch_hold`], judged from the measured run
    /// time of its handlers (an average over recent jobs of every kind). A
    /// flood of short jobs is claimed in large batches (one commit records
    /// and claims hundreds); jobs that run for seconds are claimed one per
    /// free thread; a pool that has not yet seen a handler return claims
    /// none ahead.
    ///
    /// A claim uses an attempt, also for a job claimed ahead: if the process
    /// dies (SIGKILL, power loss) while jobs wait in its pool, the reaper
    /// takes them back with that attempt used although they never started
    /// (in a 10-minute kill -9 torture with 351 kills, about 0.15 % of the
    /// jobs lost one or more attempts this way, one of them 17; see
    /// `RELIABILITY.md`). Jobs with
    /// a `max_attempts` of 1 or 2 that must not be dead-lettered by a crash
    /// belong in a queue served by a pool with `prefetch(0)`.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// The holding time (default [`DEFAULT_PREFETCH_HOLD`], 20 ms): a job
    /// claimed ahead that has waited this long for a thread of this pool
    /// (the estimate was wrong: its threads are held by longer or hung
    /// handlers) is handed back, pending at once with its attempt given
    /// back, for any process to run; the pool then claims none ahead until
    /// one of its threads takes a job. So a busy process never sits on due
    /// jobs that an idle one could run for longer than this.
    pub fn prefetch_hold(mut self, hold: Duration) -> Self {
        self.prefetch_hold = hold.max(Duration::from_millis(1));
        self
    }

    /// Reaper settings; default [`ReaperConfig::default`] (every second).
    /// Its `clock_step_hold` is raised to at least two of this pool's
    /// heartbeat intervals, so that after a forward clock step the pool's
    /// own live leases are renewed before its reaper judges them.
    pub fn reaper(mut self, config: ReaperConfig) -> Self {
        self.reaper = Some(config);
        self
    }

    /// Run no reaper in this pool (another process runs one).
    pub fn without_reaper(mut self) -> Self {
        self.reaper = None;
        self
    }

    /// Scheduler settings; default [`SchedulerConfig::default`]. The pool's
    /// [`Scheduler`] fires the due ticks of every schedule in the file,
    /// whatever their queue; any number of pools and processes may run one.
    pub fn scheduler(mut self, config: SchedulerConfig) -> Self {
        self.scheduler = Some(config);
        self
    }

    /// Run no scheduler in this pool (schedules fire only where another
    /// pool or a [`Scheduler`] runs).
    pub fn without_scheduler(mut self) -> Self {
        self.scheduler = None;
        self
    }

    /// Longest the fetcher sleeps without looking at the file (default 1 s).
    pub fn max_idle(mut self, d: Duration) -> Self {
        self.max_idle = d;
        self
    }

    /// Where the operating system gives no file-change notifications, how
    /// often a sleeping fetcher checks `PRAGMA data_version` for commits by
    /// other processes (default 2 ms, doubling while nothing changes up to
    /// 50 ms). With notifications (Linux, macOS, the BSDs) an idle fetcher
    /// does not poll; see [`Queue::watcher`].
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll = d.max(Duration::from_micros(100));
        self
    }

    /// Grace period used when the pool is dropped without `shutdown` (default 10 s).
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// Under [`crate::Durability::Full`], the longest a recorded outcome
    /// waits for its fsync (default 50 ms). Outcomes are committed without
    /// an fsync of their own so that claims never queue behind one, and the
    /// log is fsynced at this interval (outside SQLite's write lock). A
    /// power loss can undo the outcomes of this window: those jobs run
    /// again (at-least-once), none is lost. `Duration::ZERO` syncs after
    /// every batch.
    pub fn outcome_sync_interval(mut self, interval: Duration) -> Self {
        self.outcome_sync_interval = interval;
        self
    }

    /// How long a handler may run on after its job's timeout (set with
    /// [`crate::NewJob::timeout`]) before the pool gives up on it (default
    /// 5 s). At the timeout the handler's cancellation flag is set
    /// ([`CancelReason::Timeout`]); a handler that ignores it and is still
    /// running `grace` later has its heartbeats stopped and its job failed
    /// with a "timed out" error (the attempt counts; retried per the retry
    /// policy), a warning names the job and its thread, and the thread is
    /// written off: a thread cannot be killed, so the pool starts a
    /// replacement (see [`WorkerPoolBuilder::replacement_threads`]) and
    /// drops whatever the stuck handler returns, if it ever does.
    pub fn timeout_grace(mut self, grace: Duration) -> Self {
        self.timeout_grace = grace;
        self
    }

    /// Most replacement threads the pool starts over its life for threads
    /// written off as stuck (default: as many as [`WorkerPoolBuilder::threads`]).
    /// Past it, a stuck thread keeps its slot until its handler returns,
    /// and the pool runs with fewer threads; [`WorkerPool::stats`] counts
    /// stuck threads either way. A replaced thread that comes back ends.
    pub fn replacement_threads(mut self, n: usize) -> Self {
        self.replacement_threads = Some(n);
        self
    }

    /// The worker id written into `claimed_by` (default `pid<pid>-<random>`).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// How often (default 15 s) the pool sets the `tickler_jobs` gauges
    /// (jobs per queue and state) from [`Queue::stats`] (feature
    /// `metrics`). Each time is one read of the counts of the whole
    /// file, a scan that takes about 0.1 s per million jobs on SQLite:
    /// with several pools on one file, raise it for all but one.
    #[cfg(feature = "metrics")]
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.metrics_interval = every.max(Duration::from_millis(100));
        self
    }

    /// Starts the threads.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] with no handlers, a lease under 1 ms or a
    /// heartbeat interval not shorter than the lease; [`Error::Sqlite`] if the
    /// fetcher's watcher connection cannot be opened.
    pub fn start(self) -> crate::Result<WorkerPool> {
        #[cfg(feature = "tokio")]
        if let Some(kind) = &self.missing_runtime {
            return Err(Error::InvalidArgument(format!(
                "the async handler of kind {kind:?} has no tokio runtime to run on: register it inside the runtime or name one with WorkerPoolBuilder::runtime first"
            )));
        }
        if self.handlers.is_empty() {
            return Err(Error::InvalidArgument(
                "a worker pool needs at least one handler".into(),
            ));
        }
        if self.lease < Duration::from_millis(1) {
            return Err(Error::InvalidArgument("lease must be at least 1 ms".into()));
        }
        let heartbeat_interval = self.heartbeat_interval.unwrap_or(self.lease / 3);
        if heartbeat_interval >= self.lease || heartbeat_interval.is_zero() {
            return Err(Error::InvalidArgument(format!(
                "heartbeat interval ({heartbeat_interval:?}) must be above zero and shorter than the lease ({:?})",
                self.lease
            )));
        }
        let worker_id = self
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..)));
        // Unbounded: the dispatcher sends no more than it has slots for.
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<Lease>();
        let (outcome_tx, outcome_rx) = crossbeam_channel::unbounded::<(Lease, Outcome)>();
        let watcher = self.queue.watcher()?;
        let scheduler = match self.scheduler {
            Some(config) => Some(Scheduler::spawn(self.queue.clone(), config)?),
            None => None,
        };
        let shared = Arc::new(Shared {
            queue: self.queue.clone(),
            handlers: self.handlers,
            retry_policies: self.retry_policies,
            in_flight: Mutex::new(HashMap::new()),
            busy_slots: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            stop_background: AtomicBool::new(false),
            fetcher_waker: watcher.waker(),
            lease: self.lease,
            heartbeat_idle: AtomicBool::new(false),
            heartbeat_thread: std::sync::OnceLock::new(),
            jobs: job_rx.clone(),
            outcomes: outcome_tx,
            workers: Mutex::new(Vec::new()),
            stuck: Mutex::new(HashSet::new()),
            replaced: AtomicUsize::new(0),
            max_replacements: self.replacement_threads.unwrap_or(self.threads),
            timeout_grace: self.timeout_grace,
            received: AtomicU64::new(0),
            run_time: RunTime::default(),
            handed_back: AtomicUsize::new(0),
            claims_over: AtomicBool::new(false),
            events: EventHub::default(),
        });

        let mut kinds: Vec<String> = shared.handlers.keys().cloned().collect();
        kinds.sort();
        for i in 0..self.threads {
            start_worker(&shared, format!("tickler-worker-{i}"));
        }
        let dispatcher = {
            let shared = Arc::clone(&shared);
            let config = DispatchConfig {
                outcome_sync_interval: self.outcome_sync_interval,
                queues: self.queues.clone(),
                kinds,
                worker_id: worker_id.clone(),
                threads: self.threads,
                prefetch: self.prefetch,
                prefetch_hold: self.prefetch_hold,
                claim_batch: self.claim_batch,
                max_idle: self.max_idle,
                poll: self.poll,
                aging_every: self.priority_aging,
            };
            spawn("tickler-dispatcher", move || {
                let _over = ClaimsOver(&shared);
                dispatch_loop(&shared, &config, watcher, job_tx, &outcome_rx)
            })
        };
        let heartbeat = {
            let shared = Arc::clone(&shared);
            let watcher = self.queue.watcher()?;
            spawn("tickler-heartbeat", move || {
                heartbeat_loop(&shared, heartbeat_interval, watcher)
            })
        };
        let _ = shared.heartbeat_thread.set(heartbeat.thread().clone());
        #[cfg(feature = "metrics")]
        {
            let shared = Arc::clone(&shared);
            let every = self.metrics_interval;
            // Detached: it notices the pool's end within 100 ms.
            spawn("tickler-metrics", move || {
                let mut known = std::collections::BTreeSet::new();
                let mut next = Instant::now();
                while !shared.stop_background.load(Ordering::SeqCst) {
                    if Instant::now() >= next {
                        crate::observe::job_gauges(&shared.queue, &mut known);
                        next = Instant::now() + every;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        // After a forward clock step this pool's own leases look expired
        // until its next heartbeat: its reaper holds off at least two
        // heartbeat intervals.
        let reaper = self.reaper.map(|mut config| {
            config.clock_step_hold = config.clock_step_hold.max(heartbeat_interval * 2);
            Reaper::spawn(self.queue.clone(), config)
        });
        Ok(WorkerPool {
            shared,
            worker_id,
            job_rx,
            threads: self.threads,
            dispatcher: Some(dispatcher),
            heartbeat: Some(heartbeat),
            reaper,
            scheduler,
            shutdown_grace: self.shutdown_grace,
            shut_down: false,
        })
    }
}

/// A pool of worker threads serving one or more queues of one file.
///
/// ```no_run
/// use std::time::Duration;
/// use tickler::{JobContext, JobError, NewJob, Queue, WorkerPool};
///
/// # fn main() -> tickler::Result<()> {
/// let queue = Queue::open("jobs.db")?;
/// let mut pool = WorkerPool::builder(&queue)
///     .threads(4)
///     .handler("greet", |ctx: &JobContext| {
///         println!("hello {}", ctx.payload());
///         Ok::<(), JobError>(())
///     })
///     .start()?;
/// queue.enqueue(NewJob::new("greet").payload(serde_json::json!("world")))?;
/// std::thread::sleep(Duration::from_secs(1));
/// pool.shutdown(Duration::from_secs(5));
/// # Ok(())
/// # }
/// ```
pub struct WorkerPool {
    shared: Arc<Shared>,
    worker_id: String,
    job_rx: Receiver<Lease>,
    threads: usize,
    dispatcher: Option<JoinHandle<()>>,
    heartbeat: Option<JoinHandle<()>>,
    reaper: Option<Reaper>,
    scheduler: Option<Scheduler>,
    shutdown_grace: Duration,
    shut_down: bool,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("worker_id", &self.worker_id)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

/// A [`WorkerPool`]'s threads, from [`WorkerPool::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PoolStats {
    /// Worker threads asked for ([`WorkerPoolBuilder::threads`]).
    pub threads: usize,
    /// Jobs claimed and not yet finished (running or waiting for a thread).
    pub in_flight: usize,
    /// Threads whose handler ran past its timeout plus
    /// [`WorkerPoolBuilder::timeout_grace`] and has not returned yet: written
    /// off, their jobs already failed as timed out.
    pub stuck_threads: usize,
    /// Replacement threads started for stuck ones, over the pool's life
    /// (at most [`WorkerPoolBuilder::replacement_threads`]).
    pub replacement_threads: usize,
    /// Jobs claimed ahead that waited longer than
    /// [`WorkerPoolBuilder::prefetch_hold`] for a thread and were handed
    /// back, over the pool's life.
    pub handed_back: usize,
}

/// What [`WorkerPool::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// Claimed jobs that had not started, handed back to pending with their
    /// attempt given back.
    pub released: usize,
    /// Handlers still running when the grace period ended; their
    /// cancellation flags were set and they keep their leases until they end
    /// or the reaper takes them.
    pub still_running: usize,
}

impl WorkerPool {
    /// Settings for a pool on `queue`.
    pub fn builder(queue: &Queue) -> WorkerPoolBuilder {
        WorkerPoolBuilder {
            queue: queue.clone(),
            queues: vec![crate::job::DEFAULT_QUEUE.to_owned()],
            threads: 4,
            handlers: HashMap::new(),
            retry_policies: HashMap::new(),
            lease: Duration::from_secs(30),
            heartbeat_interval: None,
            claim_batch: usize::MAX,
            prefetch: DEFAULT_PREFETCH,
            prefetch_hold: DEFAULT_PREFETCH_HOLD,
            reaper: Some(ReaperConfig::default()),
            scheduler: Some(SchedulerConfig::default()),
            max_idle: Duration::from_secs(1),
            poll: Duration::from_millis(2),
            shutdown_grace: Duration::from_secs(10),
            worker_id: None,
            outcome_sync_interval: Duration::from_millis(50),
            timeout_grace: Duration::from_secs(5),
            replacement_threads: None,
            priority_aging: DEFAULT_PRIORITY_AGING,
            #[cfg(feature = "tokio")]
            runtime: None,
            #[cfg(feature = "tokio")]
            missing_runtime: None,
            #[cfg(feature = "metrics")]
            metrics_interval: Duration::from_secs(15),
        }
    }

    /// The id this pool writes into `claimed_by`.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Jobs claimed by this pool and not yet finished (running or waiting
    /// for a thread).
    pub fn in_flight(&self) -> usize {
        self.shared.lock_in_flight().len()
    }

    /// A subscription to this pool's events: each job's start (attempt,
    /// run_token, time waited since due), outcome (succeeded, failed with
    /// its retry delay, dead, snoozed, timed out; with the run time) and
    /// lost lease, as this pool saw them. Up to `capacity` events wait
    /// (at least 1; [`crate::DEFAULT_EVENT_BUFFER`] is a fair choice);
    /// what does not fit is dropped and counted
    /// ([`Subscription::dropped`]): a reader that is slow or never reads
    /// does not slow the pool. The same events also go to
    /// [`Queue::subscribe`]rs of the pool's queue, which can subscribe
    /// before the pool starts, and which also get the ticks of the pool's
    /// scheduler ([`crate::TickEvent`]). Events are this process's only;
    /// see [`Queue::subscribe`].
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        self.shared.events.subscribe(capacity)
    }

    /// Threads and slots of this pool right now.
    pub fn stats(&self) -> PoolStats {
        let shared = &self.shared;
        PoolStats {
            threads: self.threads,
            in_flight: self.in_flight(),
            stuck_threads: lock(&shared.stuck).len(),
            replacement_threads: shared.replaced.load(Ordering::SeqCst),
            handed_back: shared.handed_back.load(Ordering::SeqCst),
        }
    }

    /// Stops the pool: stops claiming, hands claimed jobs that have not
    /// started back to pending at once (attempt given back), waits up to
    /// `grace` for running handlers and records their outcomes, then sets
    /// the cancellation flags of handlers still running and returns. Those
    /// keep their leases until they end (their outcome is still recorded if
    /// the lease holds; the heartbeat thread keeps renewing their leases
    /// until the last of them ends). Calling it again does nothing.
    pub fn shutdown(&mut self, grace: Duration) -> ShutdownReport {
        if self.shut_down {
            return ShutdownReport::default();
        }
        self.shut_down = true;
        let shared = &self.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        shared.fetcher_waker.wake();
        let deadline = Instant::now() + grace;
        // A claim under way (waiting for the write lock, say) may still
        // commit: wait until the dispatcher has sent its leases and claims
        // no more, so that none is left in the channel after we return.
        while !shared.claims_over.load(Ordering::SeqCst) && Instant::now() < deadline {
            shared.fetcher_waker.wake();
            std::thread::sleep(Duration::from_millis(1));
        }
        if !shared.claims_over.load(Ordering::SeqCst) {
            log::warn!(
                "shutdown: the dispatcher's last claim had not finished within the grace period; \
                 jobs it claims are handed back by the workers, or taken back by the reaper"
            );
        }
        // Unstarted jobs go back at once; a worker that picks one up during
        // this race hands it back the same way.
        let unstarted: Vec<Lease> = self.job_rx.try_iter().collect();
        let released = unstarted.len();
        if !unstarted.is_empty() {
            let outcomes: Vec<(&Lease, Outcome)> =
                unstarted.iter().map(|l| (l, Outcome::Release)).collect();
            if let Err(e) = shared.queue.record_outcomes(&outcomes) {
                log::error!(
                    "could not hand back {released} unstarted job(s): {e}; the reaper will"
                );
            }
            let mut in_flight = shared.lock_in_flight();
            for lease in &unstarted {
                remove_run(&mut in_flight, lease);
            }
            shared.busy_slots.fetch_sub(released, Ordering::SeqCst);
        }
        while !shared.live_workers_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut still_running = 0;
        if shared.live_workers_finished() {
            // Stuck threads (written off) are left to end on their own.
            let finished: Vec<JoinHandle<()>> = {
                let mut workers = lock(&shared.workers);
                let (done, stuck) = workers.drain(..).partition(|w| w.is_finished());
                *workers = stuck;
                done
            };
            for worker in finished {
                let _ = worker.join();
            }
            // Records the last outcomes, then ends: every live worker is gone.
            if let Some(dispatcher) = self.dispatcher.take() {
                let _ = dispatcher.join();
            }
        } else {
            for job in shared.lock_in_flight().values() {
                if !job.finishing {
                    job.cancel.set(CancelReason::Shutdown);
                    still_running += 1;
                }
            }
            log::warn!("shutdown grace over with {still_running} handler(s) still running; their cancellation flags are set");
        }
        shared.stop_background.store(true, Ordering::SeqCst);
        if let Some(heartbeat) = self.heartbeat.take() {
            if still_running == 0 {
                heartbeat.thread().unpark();
                let _ = heartbeat.join();
            }
            // Otherwise it keeps renewing the leases of the handlers still
            // running and ends with the last of them.
        }
        if let Some(mut reaper) = self.reaper.take() {
            reaper.stop();
        }
        if let Some(mut scheduler) = self.scheduler.take() {
            scheduler.stop();
        }
        ShutdownReport {
            released,
            still_running,
        }
    }
}

impl Drop for WorkerPool {
    /// Shuts the pool down with [`WorkerPoolBuilder::shutdown_grace`]
    /// (default 10 s), waiting for its handlers. With the `tokio` feature,
    /// a pool dropped on a thread of a tokio runtime does not wait there
    /// (that would stall the runtime, and on a `current_thread` runtime
    /// also the async handlers the shutdown waits for): the same shutdown
    /// runs on a thread of its own (`tickler-shutdown`) and the drop
    /// returns at once. A process that exits before that thread ends
    /// leaves the jobs still running to the reaper; use
    /// `WorkerPool::shutdown_async` (feature `tokio`) to know when the pool has stopped.
    fn drop(&mut self) {
        #[cfg(feature = "tokio")]
        if !self.shut_down && tokio::runtime::Handle::try_current().is_ok() {
            let mut pool = WorkerPool {
                shared: Arc::clone(&self.shared),
                worker_id: self.worker_id.clone(),
                job_rx: self.job_rx.clone(),
                threads: self.threads,
                dispatcher: self.dispatcher.take(),
                heartbeat: self.heartbeat.take(),
                reaper: self.reaper.take(),
                scheduler: self.scheduler.take(),
                shutdown_grace: self.shutdown_grace,
                shut_down: false,
            };
            self.shut_down = true;
            let grace = self.shutdown_grace;
            spawn("tickler-shutdown", move || {
                pool.shutdown(grace);
            });
            return;
        }
        self.shutdown(self.shutdown_grace);
    }
}

/// Async handlers and shutdown (feature `tokio`).
#[cfg(feature = "tokio")]
impl WorkerPoolBuilder {
    /// The tokio runtime that async handlers registered after this call
    /// run on (default: the runtime [`WorkerPoolBuilder::async_handler`]
    /// is called in).
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Runs jobs of `kind` with an async handler: for each job, `handler`
    /// is called with an owned [`JobContext`] and the future it returns is
    /// spawned as a task on the application's runtime (see
    /// [`WorkerPoolBuilder::runtime`]). Everything else is the pool's, as
    /// for sync handlers: claims, heartbeats, fencing by run_token, group
    /// commit, timeouts, the hand-back rules of shutdown.
    ///
    /// Concurrency: one of the pool's [`WorkerPoolBuilder::threads`] waits
    /// (parked, off the runtime) for each running task, so a pool runs at
    /// most `threads` async handlers at a time: that is the per-pool
    /// limit, and it keeps a slow handler from taking more jobs than the
    /// pool can renew and record. Raise `threads` for more concurrency.
    ///
    /// Results: the future's `Ok` and [`JobError`] mean what they mean for
    /// sync handlers; a panic in the task fails the job with the panic
    /// message; a task dropped because the runtime shut down fails the
    /// attempt (retried per the retry policy). Cancellation (timeout, a
    /// lost lease, the end of the shutdown grace) reaches the handler as
    /// [`JobContext::cancelled`]. A handler that ignores it past its
    /// timeout plus [`WorkerPoolBuilder::timeout_grace`] is written off as
    /// a sync one is (the task is not aborted: it may be inside a write).
    ///
    /// The handler must not block its runtime thread: call
    /// [`JobContext::complete_with`] (a write transaction) through
    /// `tokio::task::spawn_blocking`, and use [`crate::AsyncQueue`] for
    /// other `Queue` calls.
    ///
    /// With no runtime named and none current, [`WorkerPoolBuilder::start`]
    /// returns [`Error::InvalidArgument`].
    pub fn async_handler<F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let kind = kind.into();
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(runtime) => self.handler(kind, AsyncHandler { runtime, handler }),
            None => {
                self.missing_runtime = Some(kind);
                self
            }
        }
    }

    /// [`WorkerPoolBuilder::handler_for`] for an async handler: runs typed
    /// jobs of kind `A::KIND` as tasks, as
    /// [`WorkerPoolBuilder::async_handler`] does. A payload that does not
    /// fit `A` fails permanently without calling `handler`.
    pub fn async_handler_for<A, F, Fut>(mut self, handler: F) -> Self
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
    {
        if let Some(policy) = A::retry_policy() {
            self.retry_policies.insert(A::KIND.to_owned(), policy);
        }
        let handler = Arc::new(handler);
        self.async_handler(A::KIND, move |ctx: JobContext| {
            let handler = Arc::clone(&handler);
            async move {
                let args = ctx.args::<A>()?;
                handler(ctx, args).await
            }
        })
    }
}

/// An async handler as the pool's threads see it: the task runs on the
/// application's runtime while this thread waits for it, off the runtime.
#[cfg(feature = "tokio")]
struct AsyncHandler<F> {
    runtime: tokio::runtime::Handle,
    handler: F,
}

#[cfg(feature = "tokio")]
impl<F, Fut> Handler for AsyncHandler<F>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
{
    fn run(&self, ctx: &JobContext) -> Result<(), JobError> {
        let task = self.runtime.spawn((self.handler)(ctx.clone()));
        // Waiting for a JoinHandle needs no driver of the runtime, so this
        // works for a `current_thread` runtime driven by another thread.
        match self.runtime.block_on(task) {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(JobError::retry(format!(
                "the async handler's task did not finish: {e} (the tokio runtime shut down?)"
            ))),
        }
    }
}

#[cfg(feature = "tokio")]
impl WorkerPool {
    /// [`WorkerPool::shutdown`] for async code: the same steps and
    /// hand-back rules, on a blocking thread of the runtime
    /// (`spawn_blocking`), so the runtime's threads go on running (also
    /// the async handlers the shutdown waits for). Consumes the pool.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn shutdown_async(mut self, grace: Duration) -> ShutdownReport {
        match tokio::task::spawn_blocking(move || self.shutdown(grace)).await {
            Ok(report) => report,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down; the pool, dropped with the
            // closure, stopped (or stops) by itself.
            Err(_) => ShutdownReport::default(),
        }
    }
}

struct Shared {
    queue: Queue,
    handlers: HashMap<String, Arc<dyn Handler>>,
    /// Per-kind backoff (`WorkerPoolBuilder::retry_policy_for`).
    retry_policies: HashMap<String, RetryPolicy>,
    /// Jobs claimed and not yet finished; the heartbeat renews these.
    in_flight: Mutex<HashMap<JobId, InFlight>>,
    /// Worker slots taken: jobs claimed whose handler has not returned.
    busy_slots: AtomicUsize,
    stopping: AtomicBool,
    stop_background: AtomicBool,
    fetcher_waker: Waker,
    lease: Duration,
    /// The heartbeat thread sleeps a whole heartbeat interval (not
    /// `LOST_LEASE_CHECK`) while nothing is in flight; whoever adds a job
    /// to `in_flight` then unparks it (`Shared::wake_heartbeat`).
    heartbeat_idle: AtomicBool,
    heartbeat_thread: std::sync::OnceLock<std::thread::Thread>,
    /// For worker threads started later (replacements).
    jobs: Receiver<Lease>,
    outcomes: Sender<(Lease, Outcome)>,
    /// Every worker thread started, replacements too.
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Threads written off: their handler ran past its timeout plus the
    /// grace and has not returned.
    stuck: Mutex<HashSet<ThreadId>>,
    /// Replacement threads started so far.
    replaced: AtomicUsize,
    max_replacements: usize,
    timeout_grace: Duration,
    /// Leases taken off the job channel so far: by workers, and by the
    /// dispatcher handing back those that waited past the holding time.
    received: AtomicU64,
    /// How long handlers run, for what to claim ahead.
    run_time: RunTime,
    /// Jobs handed back for waiting past the holding time.
    handed_back: AtomicUsize,
    /// Set by the dispatcher once it has seen `stopping` and will claim no
    /// more: every lease it claimed is in the job channel or with a worker
    /// by then (also set if the dispatcher thread ends).
    claims_over: AtomicBool,
    /// This pool's subscribers (`WorkerPool::subscribe`); the queue's get
    /// the same events.
    events: EventHub,
}

impl Shared {
    /// Sends a job's event to this pool's and its queue's subscribers;
    /// builds nothing when no one listens or every buffer is full.
    fn emit(
        &self,
        lease: &Lease,
        what: impl FnOnce() -> JobEventKind,
        queue_time: Option<Duration>,
        run_time: Option<Duration>,
    ) {
        let (pool, queue) = (self.events.offer(), self.queue.events().offer());
        if !pool && !queue {
            return;
        }
        let event = Event::Job(JobEvent {
            what: what(),
            job_id: lease.job_id,
            kind: lease.kind.clone(),
            queue: lease.queue.clone(),
            attempt: Some(lease.attempt),
            queue_time,
            run_time,
            at: self.queue.clock().now(),
        });
        if pool && queue {
            self.events.emit(event.clone());
        }
        if pool && !queue {
            self.events.emit(event);
        } else {
            self.queue.events().emit(event);
        }
    }

    /// Ends an idle heartbeat thread's long sleep: a job is in flight now,
    /// and its cancellation and timeout are watched every 100 ms.
    fn wake_heartbeat(&self) {
        if self.heartbeat_idle.load(Ordering::SeqCst) {
            if let Some(thread) = self.heartbeat_thread.get() {
                thread.unpark();
            }
        }
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, InFlight>> {
        lock(&self.in_flight)
    }

    /// Every worker thread has ended, but those written off as stuck.
    fn live_workers_finished(&self) -> bool {
        let stuck = lock(&self.stuck);
        lock(&self.workers)
            .iter()
            .all(|w| w.is_finished() || stuck.contains(&w.thread().id()))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts a worker thread and keeps its handle.
fn start_worker(shared: &Arc<Shared>, name: String) {
    let for_thread = Arc::clone(shared);
    let handle = spawn(&name, move || work_loop(&for_thread));
    lock(&shared.workers).push(handle);
}

/// Where one run of a handler is: running, ended, or written off by the
/// heartbeat thread as stuck past its timeout. Whoever moves it out of
/// `RUNNING` first decides what happens to the job.
#[derive(Debug, Default)]
struct RunState(AtomicU8);

impl RunState {
    const RUNNING: u8 = 0;
    const ENDED: u8 = 1;
    /// Written off, and a replacement thread took its slot.
    const REPLACED: u8 = 2;
    /// Written off, no replacement (the bound was reached): the thread
    /// keeps its slot until the handler returns.
    const KEPT: u8 = 3;

    fn end(&self) -> std::result::Result<(), u8> {
        self.0
            .compare_exchange(
                Self::RUNNING,
                Self::ENDED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .map(|_| ())
    }

    fn write_off(&self, to: u8) -> bool {
        self.0
            .compare_exchange(Self::RUNNING, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// The in-flight entry of this very run of the job (same run_token), never
/// that of a later run: a job can fail and be claimed again while a
/// heartbeat or outcome of its earlier run is still on its way.
fn entry_of<'a>(
    in_flight: &'a mut HashMap<JobId, InFlight>,
    lease: &Lease,
) -> Option<&'a mut InFlight> {
    in_flight
        .get_mut(&lease.job_id)
        .filter(|job| job.lease.run_token == lease.run_token)
}

fn remove_run(in_flight: &mut HashMap<JobId, InFlight>, lease: &Lease) {
    if entry_of(in_flight, lease).is_some() {
        in_flight.remove(&lease.job_id);
    }
}

struct InFlight {
    lease: Lease,
    cancel: Arc<CancelFlag>,
    /// Set by the worker when the handler starts and the job has a timeout.
    deadline: Option<Instant>,
    /// The handler returned; the dispatcher is writing the outcome, so the
    /// heartbeat leaves this job alone.
    finishing: bool,
    /// Whether the handler completed the job itself
    /// (`JobContext::complete_with`); the heartbeat leaves it alone then.
    completion: Arc<SelfCompletion>,
    run: Arc<RunState>,
    /// The worker thread running the handler (set when it starts).
    thread: Option<(ThreadId, Arc<str>)>,
    /// When the handler started.
    started: Option<Instant>,
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .expect("spawning a worker pool thread")
}

/// The average time a handler of this pool runs: an exponentially weighted
/// mean over the jobs that returned (each new run weighs 1/8), so that one
/// long run among short ones pulls it up at once and a few dozen short ones
/// bring it back down. Unknown until the first handler returns.
#[derive(Debug)]
struct RunTime(AtomicU64);

impl Default for RunTime {
    fn default() -> Self {
        RunTime(AtomicU64::new(Self::UNKNOWN))
    }
}

impl RunTime {
    const UNKNOWN: u64 = u64::MAX;

    fn record(&self, took: Duration) {
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
struct Ahead {
    /// Per claim: when it committed, and the count of leases sent into the
    /// job channel up to and including it.
    claims: VecDeque<(Instant, u64)>,
    sent: u64,
    /// After a hand-back, nothing is claimed ahead until a thread takes a
    /// lease again (`Shared::received` moves past this).
    paused_at: Option<u64>,
}

impl Ahead {
    fn sent(&mut self, n: usize, at: Instant) {
        if n > 0 {
            self.sent += n as u64;
            self.claims.push_back((at, self.sent));
        }
    }

    /// How many jobs to claim beyond the free threads now.
    fn budget(&mut self, shared: &Shared, config: &DispatchConfig) -> usize {
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
    fn next_deadline(&mut self, shared: &Shared, hold: Duration) -> Option<Instant> {
        let received = shared.received.load(Ordering::SeqCst);
        while self.claims.front().is_some_and(|&(_, end)| end <= received) {
            self.claims.pop_front();
        }
        self.claims.front().map(|&(at, _)| at + hold)
    }

    /// Takes out of the job channel every lease that has waited the holding
    /// time (the oldest are at its front), for the caller to hand back.
    fn take_expired(&mut self, shared: &Shared, hold: Duration, now: Instant) -> Vec<Lease> {
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

/// Sets `Shared::claims_over` when the dispatcher thread ends, however it
/// ends, so that `shutdown` never waits for a dispatcher that is gone.
struct ClaimsOver<'a>(&'a Shared);

impl Drop for ClaimsOver<'_> {
    fn drop(&mut self) {
        self.0.claims_over.store(true, Ordering::SeqCst);
    }
}

struct DispatchConfig {
    outcome_sync_interval: Duration,
    queues: Vec<String>,
    kinds: Vec<String>,
    worker_id: String,
    threads: usize,
    prefetch: usize,
    prefetch_hold: Duration,
    claim_batch: usize,
    max_idle: Duration,
    poll: Duration,
    aging_every: usize,
}

/// The dispatcher: records finished jobs' outcomes and claims new jobs for
/// free slots, both in one transaction when there is work for both, so a
/// busy pool pays one commit per batch rather than two per job. When there
/// is nothing to record and nothing due it sleeps until the next due time,
/// woken early by commits (its watcher) and by workers finishing.
fn dispatch_loop(
    shared: &Shared,
    config: &DispatchConfig,
    mut watcher: ChangeWatcher,
    jobs: Sender<Lease>,
    outcomes: &Receiver<(Lease, Outcome)>,
) {
    let mut queues: Vec<&str> = config.queues.iter().map(String::as_str).collect();
    let kinds: Vec<&str> = config.kinds.iter().map(String::as_str).collect();
    // Jobs claimed so far, for priority aging.
    let mut claimed = 0usize;
    let mut jobs = Some(jobs);
    // After a claim that got all it asked for, more may be due; otherwise
    // ask the (cheap, lock-free) read path before taking the write lock.
    let mut more_may_be_due = true;
    let mut error_pause = Duration::from_millis(50);
    let mut unsynced = UnsyncedOutcomes::new(config.outcome_sync_interval);
    let mut ahead = Ahead::default();
    let hold = config.prefetch_hold;
    // Claimed by a claim that committed after shutdown began: handed back
    // with the next commit, never sent to a worker.
    let mut claimed_too_late: Vec<(Lease, Outcome)> = Vec::new();
    loop {
        unsynced.sync_if_due(&shared.queue, false);
        let stopping = shared.stopping.load(Ordering::SeqCst);
        if stopping && jobs.is_some() {
            // Workers end once the job channel is closed and empty. A claim
            // that committed while shutdown began has been sent by now, so
            // shutdown can hand back all that is in the channel.
            jobs = None;
            shared.claims_over.store(true, Ordering::SeqCst);
        }
        let mut finished = take_outcomes(shared, outcomes);
        finished.append(&mut claimed_too_late);
        if jobs.is_some() {
            let expired = ahead.take_expired(shared, hold, Instant::now());
            if !expired.is_empty() {
                log::info!(
                    "handing back {} job(s) that waited over {hold:?} for a thread of this pool",
                    expired.len()
                );
                shared
                    .handed_back
                    .fetch_add(expired.len(), Ordering::SeqCst);
                let mut in_flight = shared.lock_in_flight();
                for lease in &expired {
                    remove_run(&mut in_flight, lease);
                }
                drop(in_flight);
                shared.busy_slots.fetch_sub(expired.len(), Ordering::SeqCst);
                finished.extend(expired.into_iter().map(|lease| (lease, Outcome::Release)));
            }
        }
        // Sleeps end when a lease claimed ahead has waited the holding time.
        let wake_by = |wait: Duration, ahead: &mut Ahead, unsynced: &UnsyncedOutcomes| {
            let wait = unsynced.cap(wait);
            match ahead.next_deadline(shared, hold) {
                Some(deadline) => wait.min(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ),
                None => wait,
            }
        };
        let slots = config.threads + ahead.budget(shared, config);
        let free = slots.saturating_sub(shared.busy_slots.load(Ordering::SeqCst));
        let mut want = if jobs.is_some() && free > 0 {
            free.min(config.claim_batch)
        } else {
            0
        };
        if want > 0 && !more_may_be_due {
            match shared.queue.next_due(&queues, Some(&kinds)) {
                Ok(Some(due)) if due <= shared.queue.clock().now() => more_may_be_due = true,
                Ok(next) => {
                    want = 0;
                    if finished.is_empty() {
                        let sleep = wake_by(
                            next.map_or(config.max_idle, |due| {
                                (due - shared.queue.clock().now())
                                    .to_std()
                                    .unwrap_or(Duration::ZERO)
                                    .clamp(Duration::from_millis(1), config.max_idle)
                            }),
                            &mut ahead,
                            &unsynced,
                        );
                        if let Err(e) = watcher.wait(sleep, config.poll) {
                            log::error!("watching for new jobs failed: {e}");
                            std::thread::sleep(config.poll);
                        }
                        continue;
                    }
                }
                Err(e) => {
                    log::error!("reading the next due time failed: {e}");
                    want = 0;
                }
            }
        }
        if finished.is_empty() && want == 0 {
            if stopping || jobs.is_none() {
                // Short waits: shutdown is waiting for the last outcomes.
                match outcomes.recv_timeout(unsynced.cap(STOPPING_POLL)) {
                    Ok(first) => {
                        let batch = take_outcomes_from(shared, Some(first), outcomes);
                        record(shared, &batch, None, &config.worker_id, &mut unsynced);
                    }
                    Err(_) if outcomes.is_empty() && shared.live_workers_finished() => {
                        unsynced.sync_if_due(&shared.queue, true);
                        return;
                    }
                    Err(_) => {}
                }
            } else {
                // All slots busy: a worker finishing wakes the watcher.
                let wait = wake_by(config.max_idle, &mut ahead, &unsynced);
                let _ = watcher.wait(wait, wait);
            }
            continue;
        }
        // Each queue leads in turn (see the builder).
        queues.rotate_left(1);
        // One job in `every` is the oldest due one: as many as this claim
        // crosses multiples of `every`, taken in one statement.
        let oldest_first = match config.aging_every {
            0 => 0,
            every => (claimed.wrapping_add(want) / every).saturating_sub(claimed / every),
        };
        let request = ClaimRequest {
            queues: &queues,
            worker_id: &config.worker_id,
            max: want,
            lease: shared.lease,
            kinds: Some(&kinds),
            oldest_first,
        };
        let claim = (want > 0).then_some(&request);
        match record(shared, &finished, claim, &config.worker_id, &mut unsynced) {
            Some(leases) => {
                claimed = claimed.wrapping_add(leases.len());
                error_pause = Duration::from_millis(50);
                if shared.stopping.load(Ordering::SeqCst) {
                    // The claim waited (for the write lock, say) while
                    // shutdown began, which may already have returned.
                    claimed_too_late.extend(leases.into_iter().map(|l| (l, Outcome::Release)));
                    continue;
                }
                more_may_be_due = want > 0 && leases.len() == want;
                ahead.sent(leases.len(), Instant::now());
                for lease in leases {
                    shared.busy_slots.fetch_add(1, Ordering::SeqCst);
                    shared.lock_in_flight().insert(
                        lease.job_id,
                        InFlight {
                            lease: lease.clone(),
                            cancel: Arc::new(CancelFlag::default()),
                            deadline: None,
                            finishing: false,
                            completion: Arc::default(),
                            run: Arc::default(),
                            thread: None,
                            started: None,
                        },
                    );
                    if let Some(jobs) = &jobs {
                        let _ = jobs.send(lease);
                    }
                }
                // Issue 15: the heartbeat sleeps long while idle.
                shared.wake_heartbeat();
            }
            None => {
                std::thread::sleep(error_pause);
                error_pause = (error_pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Outcomes committed without an fsync ([`OutcomeSync::Deferred`]), so
/// that claims never wait behind one; they are synced within
/// `outcome_sync_interval` by [`Queue::sync`], which fsyncs the log outside
/// SQLite's write lock.
struct UnsyncedOutcomes {
    interval: Duration,
    since: Option<Instant>,
}

impl UnsyncedOutcomes {
    fn new(interval: Duration) -> Self {
        UnsyncedOutcomes {
            interval,
            since: None,
        }
    }

    fn recorded(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// `wait`, shortened so the sleeper wakes when a sync is due.
    fn cap(&self, wait: Duration) -> Duration {
        match self.since {
            Some(since) => {
                wait.min((since + self.interval).saturating_duration_since(Instant::now()))
            }
            None => wait,
        }
    }

    fn sync_if_due(&mut self, queue: &Queue, force: bool) {
        if let Some(since) = self.since {
            if force || since.elapsed() >= self.interval {
                if let Err(e) = queue.sync() {
                    log::error!("syncing recorded outcomes failed: {e}; the next commit retries");
                    return;
                }
                self.since = None;
            }
        }
    }
}

/// Finished jobs waiting to be recorded, without blocking.
fn take_outcomes(shared: &Shared, outcomes: &Receiver<(Lease, Outcome)>) -> Vec<(Lease, Outcome)> {
    take_outcomes_from(shared, None, outcomes)
}

/// Marks each finished job as finishing (the heartbeat leaves it alone) and
/// drops, with a warning, the outcome of any job whose lease was lost.
fn take_outcomes_from(
    shared: &Shared,
    first: Option<(Lease, Outcome)>,
    outcomes: &Receiver<(Lease, Outcome)>,
) -> Vec<(Lease, Outcome)> {
    let batch: Vec<(Lease, Outcome)> = first
        .into_iter()
        .chain(outcomes.try_iter())
        .take(MAX_OUTCOME_BATCH)
        .collect();
    if batch.is_empty() {
        return batch;
    }
    let mut in_flight = shared.lock_in_flight();
    for (lease, outcome) in &batch {
        let lost = entry_of(&mut in_flight, lease).is_some_and(|job| {
            job.finishing = true;
            job.cancel.get() == Some(CancelReason::LeaseLost)
        });
        if lost {
            // Still sent to the queue: refused there (fenced), it tells a
            // cancelled job's unique_key that its holder has stopped.
            log::warn!(
                "job {} lost its lease while running (reaped or cancelled); its outcome {outcome:?} is refused",
                lease.job_id
            );
        }
    }
    batch
}

/// Writes outcomes (and claims, if asked) in one transaction, retrying
/// transient failures a few times: a lost outcome means the job runs again.
/// Returns the claimed leases, or `None` if the transaction failed.
fn record(
    shared: &Shared,
    finished: &[(Lease, Outcome)],
    claim: Option<&ClaimRequest<'_>>,
    worker_id: &str,
    unsynced: &mut UnsyncedOutcomes,
) -> Option<Vec<Lease>> {
    let outcomes: Vec<(&Lease, Outcome)> = finished.iter().map(|(l, o)| (l, o.clone())).collect();
    // Runs already known to have lost their lease were reported when taken.
    let (known_lost, run_times): (HashSet<JobId>, Vec<Option<Duration>>) = {
        let mut in_flight = shared.lock_in_flight();
        let known_lost = finished
            .iter()
            .filter(|(lease, _)| {
                entry_of(&mut in_flight, lease)
                    .is_some_and(|job| job.cancel.get() == Some(CancelReason::LeaseLost))
            })
            .map(|(lease, _)| lease.job_id)
            .collect();
        let run_times = finished
            .iter()
            .map(|(lease, _)| {
                entry_of(&mut in_flight, lease)
                    .and_then(|job| job.started)
                    .map(|at| at.elapsed())
            })
            .collect();
        (known_lost, run_times)
    };
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    let result = loop {
        match shared
            .queue
            .record_and_claim(&outcomes, claim, OutcomeSync::Deferred)
        {
            Err(e) if tries < 5 && (e.is_busy() || matches!(e, Error::DiskFull)) => {
                log::warn!("worker {worker_id}: write failed: {e}; retrying");
                std::thread::sleep(pause);
                pause *= 2;
                tries += 1;
            }
            other => break other,
        }
    };
    let mut in_flight = shared.lock_in_flight();
    for (lease, _) in finished {
        remove_run(&mut in_flight, lease);
    }
    drop(in_flight);
    match result {
        Ok((results, leases)) => {
            if !finished.is_empty() {
                unsynced.recorded();
            }
            for (((lease, outcome), result), run_time) in
                finished.iter().zip(results).zip(run_times)
            {
                match result {
                    Err(e) if e.is_lease_lost() && known_lost.contains(&lease.job_id) => {
                        crate::observe::finished(lease, "lease_lost", run_time);
                    }
                    // A hand-back of a run that already lost its lease:
                    // nothing was lost (said when the run was let go).
                    Err(e) if e.is_lease_lost() && *outcome == Outcome::Release => {}
                    Err(e) => {
                        log::warn!("outcome {outcome:?} of job {} refused: {e}", lease.job_id);
                        if e.is_lease_lost() {
                            crate::observe::finished(lease, "lease_lost", run_time);
                            shared.emit(lease, || JobEventKind::LeaseLost, None, run_time);
                        }
                    }
                    Ok(()) => recorded(shared, lease, outcome, run_time),
                }
            }
            Some(leases)
        }
        Err(e) => {
            log::error!(
                "worker {worker_id}: {} outcome(s) not recorded: {e}; the reaper will take those jobs back and they will run again",
                finished.len()
            );
            None
        }
    }
}

/// What a recorded outcome tells this pool's observers: its event, its
/// log line.
fn recorded(shared: &Shared, lease: &Lease, outcome: &Outcome, run_time: Option<Duration>) {
    let last = lease.attempt >= lease.max_attempts;
    let failure = match outcome {
        Outcome::FailPermanently(error) => Some((error, None)),
        Outcome::Fail(error) => Some((
            error,
            Some(shared.queue.retry_policy().backoff(lease.attempt)),
        )),
        Outcome::FailRetryAfter(error, delay) => Some((error, Some(*delay))),
        _ => None,
    };
    let what = match outcome {
        Outcome::Complete => JobEventKind::Succeeded,
        Outcome::Fail(_) | Outcome::FailRetryAfter(..) | Outcome::FailPermanently(_) => {
            let Some((error, retry_in)) = failure else {
                return;
            };
            match retry_in.filter(|_| !last) {
                None => {
                    log::warn!(
                        "job {} ({}, queue {}) is dead after attempt {} of {}: {error}",
                        lease.job_id,
                        lease.kind,
                        lease.queue,
                        lease.attempt,
                        lease.max_attempts
                    );
                    JobEventKind::Dead {
                        error: error.clone(),
                    }
                }
                Some(retry_in) => {
                    log::info!(
                        "job {} ({}, queue {}) failed attempt {} of {}, retry in {retry_in:?}: {error}",
                        lease.job_id,
                        lease.kind,
                        lease.queue,
                        lease.attempt,
                        lease.max_attempts
                    );
                    JobEventKind::Failed {
                        error: error.clone(),
                        retry_in,
                    }
                }
            }
        }
        Outcome::Snooze(until) => JobEventKind::Snoozed { until: *until },
        Outcome::TimedOut(error) => {
            if last {
                log::warn!(
                    "job {} ({}, queue {}) is dead after attempt {} of {} timed out: {error}",
                    lease.job_id,
                    lease.kind,
                    lease.queue,
                    lease.attempt,
                    lease.max_attempts
                );
            }
            JobEventKind::TimedOut { dead: last }
        }
        // Handed back unstarted: no transition of the job's own.
        Outcome::Release => return,
    };
    let label = match &what {
        JobEventKind::Succeeded => "succeeded",
        JobEventKind::Failed { .. } => "failed",
        JobEventKind::Dead { .. } => "dead",
        JobEventKind::Snoozed { .. } => "snoozed",
        _ => "timed_out",
    };
    crate::observe::finished(lease, label, run_time);
    shared.emit(lease, || what, None, run_time);
}

fn work_loop(shared: &Shared) {
    let outcomes = &shared.outcomes;
    let me = std::thread::current();
    let thread: (ThreadId, Arc<str>) = (me.id(), Arc::from(me.name().unwrap_or("(unnamed)")));
    while let Ok(lease) = shared.jobs.recv() {
        shared.received.fetch_add(1, Ordering::SeqCst);
        let handler = shared.handlers.get(&lease.kind);
        let outcome = match handler {
            // Unstarted at shutdown (or, impossibly, a kind without handler):
            // hand back without using the attempt.
            Some(handler) if !shared.stopping.load(Ordering::SeqCst) => {
                let started = {
                    let mut in_flight = shared.lock_in_flight();
                    entry_of(&mut in_flight, &lease).map(|job| {
                        job.deadline = lease.timeout.map(|t| Instant::now() + t);
                        job.thread = Some(thread.clone());
                        job.started = Some(Instant::now());
                        (
                            Arc::clone(&job.cancel),
                            Arc::clone(&job.completion),
                            Arc::clone(&job.run),
                        )
                    })
                };
                let Some((cancel, completion, run)) = started else {
                    // No longer this pool's (defensive: the dispatcher takes
                    // the leases it hands back out of the channel itself).
                    shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
                    shared.fetcher_waker.wake();
                    continue;
                };
                if cancel.get() == Some(CancelReason::LeaseLost) {
                    // Cancelled (or reaped) while waiting for a thread: not
                    // started; the refused hand-back says it has stopped.
                    let _ = outcomes.send((lease, Outcome::Release));
                    shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
                    shared.fetcher_waker.wake();
                    continue;
                }
                let ctx = JobContext {
                    lease,
                    cancel,
                    clock: Arc::clone(shared.queue.clock()),
                    queue: shared.queue.clone(),
                    completion,
                };
                let queue_time = (ctx.now() - ctx.lease.run_at)
                    .to_std()
                    .unwrap_or(Duration::ZERO);
                shared.emit(
                    &ctx.lease,
                    || JobEventKind::Started {
                        run_token: ctx.lease.run_token.clone(),
                    },
                    Some(queue_time),
                    None,
                );
                crate::observe::started(&ctx.lease, queue_time);
                let began = Instant::now();
                let result = {
                    let _span = crate::observe::run_span(&ctx.lease);
                    catch_unwind(AssertUnwindSafe(|| handler.run(&ctx)))
                };
                shared.run_time.record(began.elapsed());
                if let Err(state) = run.end() {
                    // Written off by the heartbeat thread while it ran: the
                    // job was failed as timed out and may run elsewhere now.
                    log::warn!(
                        "job {}: handler on thread {} returned after its job was failed as timed out; what it returned is dropped",
                        ctx.lease.job_id,
                        thread.1
                    );
                    lock(&shared.stuck).remove(&thread.0);
                    // Refused (the lease is gone), it tells the job's
                    // unique_key that this run has stopped.
                    let _ = outcomes.send((ctx.lease.clone(), Outcome::Release));
                    if state == RunState::REPLACED {
                        // A replacement thread has this one's slot.
                        return;
                    }
                    shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
                    shared.fetcher_waker.wake();
                    continue;
                }
                if ctx.completion.committed() {
                    // Completed inside the handler's own transaction.
                    remove_run(&mut shared.lock_in_flight(), &ctx.lease);
                    shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
                    shared.fetcher_waker.wake();
                    continue;
                }
                // The queue's policy is applied here too (not left to the
                // engine), so that a failure's event knows its retry delay.
                let policy = shared
                    .retry_policies
                    .get(&ctx.lease.kind)
                    .copied()
                    .unwrap_or_else(|| shared.queue.retry_policy());
                let outcome = outcome_of(result, Some(&policy), ctx.lease.attempt);
                (ctx.lease, outcome)
            }
            _ => (lease, Outcome::Release),
        };
        let _ = outcomes.send(outcome);
        shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
        shared.fetcher_waker.wake();
    }
}

/// Runs one due job of `kind` from queue `queue_name` with `handler`, on
/// the calling thread, as a worker pool would, and records its outcome:
/// for tests of handlers (see "Testing handlers" in the crate docs). With
/// a [`crate::ManualClock`] behind the queue, due times, backoff and
/// snoozes are all under the test's control; no thread is started.
///
/// Claims at most one job (lease 5 minutes, worker id `run_one`), runs
/// the handler outside any transaction (a panic becomes a failure with the
/// panic message, as in a pool), records the outcome fenced by the run's
/// token and returns the job's id and that outcome; `None` if no job of
/// `kind` is due. Failures wait per the queue's retry policy. No
/// cancellation flag is ever set.
///
/// ```
/// use std::sync::Arc;
/// use tickler::{JobContext, JobError, JobState, ManualClock, NewJob, Outcome, Queue};
///
/// # fn main() -> tickler::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
/// let queue = Queue::builder(dir.path().join("jobs.db")).clock(clock.clone()).open()?;
/// let id = queue.enqueue(NewJob::new("greet").payload(serde_json::json!("ada")))?;
/// let greet = |ctx: &JobContext| match ctx.payload().as_str() {
///     Some(_) => Ok(()),
///     None => Err(JobError::permanent("no name")),
/// };
/// let ran = tickler::testing::run_one(&queue, "default", "greet", &greet)?;
/// assert_eq!(ran, Some((id, Outcome::Complete)));
/// assert_eq!(queue.get(id)?.state, JobState::Succeeded);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// What the claim or the recording of the outcome returned (both
/// [`crate::Queue`] errors); [`Error::LeaseLost`] if the job was taken
/// from the test while its handler ran.
pub fn run_one(
    queue: &Queue,
    queue_name: &str,
    kind: &str,
    handler: &dyn Handler,
) -> crate::Result<Option<(JobId, Outcome)>> {
    let lease = queue
        .claim_kinds(
            queue_name,
            "run_one",
            1,
            Duration::from_secs(300),
            Some(&[kind]),
        )?
        .pop();
    let Some(lease) = lease else {
        return Ok(None);
    };
    let ctx = JobContext {
        lease,
        cancel: Arc::default(),
        clock: Arc::clone(queue.clock()),
        queue: queue.clone(),
        completion: Arc::default(),
    };
    let result = catch_unwind(AssertUnwindSafe(|| handler.run(&ctx)));
    let id = ctx.lease.job_id;
    if ctx.completion.committed() {
        return Ok(Some((id, Outcome::Complete)));
    }
    let outcome = outcome_of(result, None, ctx.lease.attempt);
    queue
        .record_outcomes(&[(&ctx.lease, outcome.clone())])?
        .remove(0)?;
    Ok(Some((id, outcome)))
}

/// What to record for a handler's result (or its panic), with the kind's
/// own backoff if it has one.
pub(crate) fn outcome_of(
    result: std::thread::Result<Result<(), JobError>>,
    policy: Option<&RetryPolicy>,
    attempt: u32,
) -> Outcome {
    let fail = |message: String| match policy {
        Some(policy) => Outcome::FailRetryAfter(message, policy.backoff(attempt)),
        None => Outcome::Fail(message),
    };
    match result {
        Ok(Ok(())) => Outcome::Complete,
        Ok(Err(JobError::Retry(message))) => fail(message),
        Ok(Err(JobError::Permanent(message))) => Outcome::FailPermanently(message),
        Ok(Err(JobError::Snooze(until))) if until.timestamp_millis() <= crate::MAX_TIMESTAMP_MS => {
            Outcome::Snooze(until)
        }
        Ok(Err(JobError::Snooze(until))) => fail(format!(
            "handler snoozed until {until}, after the end of the storable range (9999-12-31 UTC)"
        )),
        Err(panic) => fail(format!("handler panicked: {}", panic_message(&*panic))),
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

/// Fails, as timed out, every job whose handler is still running its
/// timeout plus the pool's grace after it started, and writes its thread
/// off: no more heartbeats for it, its slot goes to a replacement thread
/// (up to the pool's bound), and whatever the handler returns later is
/// dropped. A handler completing its job itself (`complete_with` under
/// way) is left to finish.
fn write_off_stuck(shared: &Arc<Shared>, now: Instant) {
    let grace = shared.timeout_grace;
    let mut stuck = Vec::new();
    {
        let mut in_flight = shared.lock_in_flight();
        for job in in_flight.values_mut() {
            let overdue = job.deadline.is_some_and(|d| now >= d + grace);
            if !overdue || job.finishing || job.completion.started() || job.thread.is_none() {
                continue;
            }
            let replace = shared
                .replaced
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < shared.max_replacements).then_some(n + 1)
                })
                .is_ok();
            let to = if replace {
                RunState::REPLACED
            } else {
                RunState::KEPT
            };
            if !job.run.write_off(to) {
                // The handler returned just now.
                if replace {
                    shared.replaced.fetch_sub(1, Ordering::SeqCst);
                }
                continue;
            }
            job.finishing = true;
            job.cancel.set(CancelReason::Timeout);
            let (thread_id, name) = job.thread.clone().expect("checked above");
            // Before the in-flight lock is let go: the handler may return
            // at once, and it takes its thread back out of the set.
            lock(&shared.stuck).insert(thread_id);
            stuck.push((job.lease.clone(), name, replace));
        }
    }
    for (lease, name, replace) in stuck {
        let timeout = lease.timeout.unwrap_or_default();
        log::warn!(
            "job {} ({}) is still running on thread {name} {grace:?} after its timeout of {timeout:?}; \
             failing it as timed out and writing the thread off ({})",
            lease.job_id,
            lease.kind,
            if replace {
                "a replacement thread starts"
            } else {
                "replacement bound reached: the pool runs one thread short until it returns"
            }
        );
        let error = format!(
            "timed out after {timeout:?}: the handler did not stop within {grace:?} of its cancellation (thread {name} written off)"
        );
        let _ = shared.outcomes.send((lease, Outcome::TimedOut(error)));
        if replace {
            let n = shared.replaced.load(Ordering::SeqCst);
            start_worker(shared, format!("tickler-worker-r{n}"));
            shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
        }
        shared.fetcher_waker.wake();
    }
}

/// How often the heartbeat thread looks for leases lost between heartbeats
/// (a cancel, a reap), when any commit happened since the last look: how
/// soon a handler learns that its job was cancelled.
const LOST_LEASE_CHECK: Duration = Duration::from_millis(100);

fn heartbeat_loop(shared: &Arc<Shared>, interval: Duration, mut watcher: ChangeWatcher) {
    let tick = interval.min(LOST_LEASE_CHECK);
    let mut next_beat = Instant::now() + interval;
    loop {
        if shared.stop_background.load(Ordering::SeqCst) && shared.lock_in_flight().is_empty() {
            return;
        }
        // Issue 15 (idle means idle): with nothing in flight, sleep a whole
        // interval instead of ticking every 100 ms; the flag is set before
        // looking, so a claim in between unparks us (`wake_heartbeat`).
        shared.heartbeat_idle.store(true, Ordering::SeqCst);
        let idle = shared.lock_in_flight().is_empty();
        if !idle {
            // Busy: claims must not wake it (a busy pool claims hundreds of
            // times a second, and each wake-up reads every in-flight lease).
            shared.heartbeat_idle.store(false, Ordering::SeqCst);
        }
        std::thread::park_timeout(if idle { interval } else { tick });
        shared.heartbeat_idle.store(false, Ordering::SeqCst);
        notice_lost_leases(shared, &mut watcher);
        let now = Instant::now();
        write_off_stuck(shared, now);
        let leases: Vec<Lease> = {
            let in_flight = shared.lock_in_flight();
            for job in in_flight.values() {
                if job.deadline.is_some_and(|d| now >= d) {
                    job.cancel.set(CancelReason::Timeout);
                }
            }
            if now < next_beat {
                continue;
            }
            in_flight
                .values()
                .filter(|job| {
                    !job.finishing
                        && !job.completion.committed()
                        && job.cancel.get() != Some(CancelReason::LeaseLost)
                })
                .map(|job| job.lease.clone())
                .collect()
        };
        next_beat = now + interval;
        if leases.is_empty() {
            continue;
        }
        let refs: Vec<&Lease> = leases.iter().collect();
        match shared.queue.heartbeat_many(&refs, shared.lease) {
            Ok(results) => {
                let mut in_flight = shared.lock_in_flight();
                for (lease, result) in leases.iter().zip(results) {
                    if let Err(e) = result {
                        if let Some(job) = entry_of(&mut in_flight, lease) {
                            // A failed renewal of a job whose handler is
                            // completing it is that completion's commit;
                            // if the completion fails instead, the next
                            // heartbeat fails again and reports it.
                            if !job.finishing && !job.completion.started() {
                                log::warn!("job {}: {e}; cancelling its handler", lease.job_id);
                                job.cancel.set(CancelReason::LeaseLost);
                                shared.emit(lease, || JobEventKind::LeaseLost, None, None);
                            }
                        }
                    }
                }
            }
            Err(e) => log::error!("heartbeat of {} lease(s) failed: {e}", leases.len()),
        }
    }
}

/// Sets the cancellation flag ([`CancelReason::LeaseLost`]) of every
/// in-flight job whose lease is no longer held (cancelled, or reaped), as
/// soon as a commit is seen rather than at the next heartbeat, which may be
/// seconds away. One indexed read per in-flight job, and only after a
/// commit.
fn notice_lost_leases(shared: &Shared, watcher: &mut ChangeWatcher) {
    let watched = |job: &InFlight| {
        !job.finishing
            && !job.completion.started()
            && job.cancel.get() != Some(CancelReason::LeaseLost)
    };
    if !shared.lock_in_flight().values().any(watched) {
        return;
    }
    match watcher.changed() {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            log::error!("watching for cancelled jobs failed: {e}");
            return;
        }
    }
    let leases: Vec<Lease> = shared
        .lock_in_flight()
        .values()
        .filter(|job| watched(job))
        .map(|job| job.lease.clone())
        .collect();
    let refs: Vec<&Lease> = leases.iter().collect();
    match shared.queue.leases_held(&refs) {
        Ok(held) => {
            let mut in_flight = shared.lock_in_flight();
            for (lease, held) in leases.iter().zip(held) {
                if held {
                    continue;
                }
                if let Some(job) = entry_of(&mut in_flight, lease) {
                    if watched(job) {
                        log::info!(
                            "job {} is no longer held by this pool (cancelled or reaped); cancelling its handler",
                            lease.job_id
                        );
                        job.cancel.set(CancelReason::LeaseLost);
                        shared.emit(lease, || JobEventKind::LeaseLost, None, None);
                    }
                }
            }
        }
        Err(e) => log::error!("checking {} lease(s) failed: {e}", leases.len()),
    }
}
