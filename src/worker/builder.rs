//! [`WorkerPoolBuilder`]: a pool's settings and their defaults. Starting
//! the pool from them is in the parent module.

use super::context::JobContext;
use super::handler::{Handler, JobError, RunJob};
use super::WorkerPool;
use crate::queue::Queue;
use crate::reaper::ReaperConfig;
use crate::retry::RetryPolicy;
use crate::scheduler::SchedulerConfig;
use crate::typed::JobArgs;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

// Named by doc links only.
#[cfg(doc)]
use super::context::CancelReason;
#[cfg(doc)]
use crate::scheduler::Scheduler;

/// Default of [`WorkerPoolBuilder::priority_aging`]: one job in 10 that a
/// pool claims is the oldest due one, whatever its priority.
pub const DEFAULT_PRIORITY_AGING: usize = 10;

/// Default of [`WorkerPoolBuilder::prefetch`]: the most jobs a pool claims
/// beyond its free threads, however short they are.
pub const DEFAULT_PREFETCH: usize = 512;

/// Default of [`WorkerPoolBuilder::prefetch_hold`]: the longest a claimed
/// job waits in a pool for a thread before it is handed back.
pub const DEFAULT_PREFETCH_HOLD: Duration = Duration::from_millis(20);

/// Settings for a [`WorkerPool`]; get one from [`WorkerPool::builder`].
pub struct WorkerPoolBuilder {
    pub(super) queue: Queue,
    pub(super) queues: Vec<String>,
    pub(super) threads: usize,
    pub(super) handlers: HashMap<String, Arc<dyn RunJob>>,
    pub(super) retry_policies: HashMap<String, RetryPolicy>,
    pub(super) lease: Duration,
    pub(super) heartbeat_interval: Option<Duration>,
    pub(super) claim_batch: usize,
    pub(super) prefetch: usize,
    pub(super) prefetch_hold: Duration,
    pub(super) reaper: Option<ReaperConfig>,
    pub(super) scheduler: Option<SchedulerConfig>,
    pub(super) max_idle: Duration,
    pub(super) poll: Duration,
    pub(super) shutdown_grace: Duration,
    pub(super) worker_id: Option<String>,
    pub(super) outcome_sync_interval: Duration,
    pub(super) timeout_grace: Duration,
    pub(super) replacement_threads: Option<usize>,
    pub(super) priority_aging: usize,
    /// Where async handlers run (`WorkerPoolBuilder::runtime`).
    #[cfg(feature = "tokio")]
    pub(super) runtime: Option<tokio::runtime::Handle>,
    /// An async handler registered with no runtime to run on: refused by
    /// `start`.
    #[cfg(feature = "tokio")]
    pub(super) missing_runtime: Option<String>,
    #[cfg(feature = "tokio")]
    pub(super) async_handlers: HashMap<String, Arc<super::async_handlers::TaskHandler>>,
    #[cfg(feature = "tokio")]
    pub(super) async_concurrency: usize,
    #[cfg(feature = "tokio")]
    pub(super) kind_concurrency: HashMap<String, usize>,
    #[cfg(feature = "metrics")]
    pub(super) metrics_interval: Duration,
}

impl std::fmt::Debug for WorkerPoolBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPoolBuilder")
            .field("queues", &self.served_queues())
            .field("threads", &self.threads)
            .field("kinds", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl WorkerPoolBuilder {
    /// The queues the pool serves: those named, or `"default"` alone.
    pub(super) fn served_queues(&self) -> Vec<String> {
        if self.queues.is_empty() {
            vec![crate::job::DEFAULT_QUEUE.to_owned()]
        } else {
            self.queues.clone()
        }
    }

    /// Serves this queue. A pool that names no queue serves `"default"`
    /// alone; one that names queues serves exactly those, in any order
    /// (name `"default"` among them to keep serving it).
    ///
    /// A pool serving several queues gives each a fair share of every
    /// claim (its free slots divided by the number of queues, rounded up;
    /// what a queue leaves unused goes to the others), and the queue that
    /// is asked first changes from claim to claim: a flood in one queue
    /// cannot starve another.
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if !self.queues.contains(&name) {
            self.queues.push(name);
        }
        self
    }

    /// Number of worker threads, each running one job of a sync handler at
    /// a time (default 4). Async handlers run as tasks in slots of their
    /// own (see `WorkerPoolBuilder::async_concurrency`, feature `tokio`); a
    /// pool with no sync handler starts no worker thread.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// Runs jobs of `kind` with `handler`. The pool claims only kinds it
    /// has handlers for; registering a kind twice keeps the last handler.
    pub fn handler(mut self, kind: impl Into<String>, handler: impl Handler) -> Self {
        let kind = kind.into();
        #[cfg(feature = "tokio")]
        {
            self.async_handlers.remove(&kind);
            if self.missing_runtime.as_ref() == Some(&kind) {
                self.missing_runtime = None;
            }
        }
        self.handlers.insert(kind, Arc::new(handler));
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
    pub fn handler_for<A: JobArgs, O: serde::Serialize>(
        mut self,
        handler: impl Fn(&JobContext, A) -> Result<O, JobError> + Send + Sync + 'static,
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
    /// does not poll; see [`Manual::watcher`](crate::Manual::watcher).
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
}

impl WorkerPool {
    /// Settings for a pool on `queue`.
    pub fn builder(queue: &Queue) -> WorkerPoolBuilder {
        WorkerPoolBuilder {
            queue: queue.clone(),
            queues: Vec::new(),
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
            #[cfg(feature = "tokio")]
            async_handlers: HashMap::new(),
            #[cfg(feature = "tokio")]
            async_concurrency: super::async_handlers::DEFAULT_ASYNC_CONCURRENCY,
            #[cfg(feature = "tokio")]
            kind_concurrency: HashMap::new(),
            #[cfg(feature = "metrics")]
            metrics_interval: Duration::from_secs(15),
        }
    }
}
