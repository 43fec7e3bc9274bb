//! [`WorkerPool`]: runs handlers on claimed jobs, with heartbeats, group
//! commit of outcomes, and graceful shutdown. Of [`Queue`] it uses public
//! calls (to claim and record, [`Queue::record_and_claim`],
//! [`Queue::record_outcomes`] and [`Queue::claim_kinds`]; to renew and
//! watch leases, [`Queue::heartbeat_many`] and [`Queue::leases_held`]; to
//! sleep until work is due, [`Queue::next_due`] and [`Queue::watcher`];
//! [`Queue::sync`], [`Queue::complete_with`], the clock and the retry
//! policy) and one crate-internal call, `Queue::events`: the queue's event
//! hub, so that the queue's subscribers also get the pool's job events.
//! Beyond `Queue` it uses the crate-internal `EventHub` (the pool's own
//! subscribers), `crate::observe` (the logs, spans and metrics of each
//! run) and `crate::clock::ms_to_datetime`.
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
//!
//! Where things are:
//!
//! - this file: [`WorkerPool`] and its lifecycle: [`WorkerPoolBuilder::start`]
//!   (which starts every thread), [`WorkerPool::stats`],
//!   [`WorkerPool::shutdown`] and the drop;
//! - `builder.rs`: [`WorkerPoolBuilder`], its settings and their defaults;
//! - `handler.rs`: [`Handler`] and [`JobError`];
//! - `context.rs`: [`JobContext`], the handler's view of its run (job,
//!   attempt, run token, clock, queue, `complete_with`), and its
//!   cancellation flag ([`CancelReason`]);
//! - `async_handlers.rs`: the async face (feature `tokio`): async handlers
//!   and `WorkerPool::shutdown_async`;
//! - `shared.rs`: the state all threads of a pool share;
//! - `in_flight.rs`: the in-flight registry, one entry per claimed run;
//! - `prefetch.rs`: how much to claim: the handlers' measured run time,
//!   jobs claimed ahead of free threads and their hand-back;
//! - `dispatch.rs`: the dispatcher thread, where claims are asked for;
//! - `outcomes.rs`: where outcomes are written (group commit, with the
//!   next claim), their events, and the deferred fsync;
//! - `execute.rs`: the worker threads: a handler's run, its panic, the
//!   outcome it makes;
//! - `heartbeat.rs`: the heartbeat thread: lease renewal, lost leases,
//!   timeouts, threads written off as stuck;
//! - `testing.rs`: `testing::run_one`, one job on the calling thread.

#[cfg(feature = "tokio")]
mod async_handlers;
mod builder;
mod context;
mod dispatch;
mod execute;
mod handler;
mod heartbeat;
mod in_flight;
mod outcomes;
mod prefetch;
mod shared;
mod testing;

#[cfg(feature = "tokio")]
pub use async_handlers::DEFAULT_ASYNC_CONCURRENCY;
pub use builder::{
    WorkerPoolBuilder, DEFAULT_PREFETCH, DEFAULT_PREFETCH_HOLD, DEFAULT_PRIORITY_AGING,
};
pub use context::{CancelReason, JobContext};
pub use handler::{Handler, JobError};
pub use testing::run_one;

use crate::engine::types::Outcome;
use crate::error::Error;
use crate::events::{EventHub, Subscription};
use crate::lease::Lease;
use crate::reaper::Reaper;
use crate::scheduler::Scheduler;
use crossbeam_channel::Receiver;
use dispatch::{dispatch_loop, DispatchConfig, Lane};
use execute::start_worker;
use heartbeat::heartbeat_loop;
use in_flight::remove_run;
use prefetch::RunTime;
use shared::{lock, spawn, Shared};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `shutdown` waits at least for a claim under way to end, so
/// that the jobs it claims are handed back rather than left to the reaper.
const CLAIM_SETTLE_WAIT: Duration = Duration::from_secs(2);

/// How long a pool dropped on a runtime thread waits for the outcomes of
/// handlers that already returned to be recorded.
#[cfg(feature = "tokio")]
const FLUSH_ON_DROP: Duration = Duration::from_secs(2);

// Named by doc links only.
#[cfg(doc)]
use crate::queue::Queue;

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
    /// One per lane: the worker threads', and each task lane's.
    dispatchers: Vec<JoinHandle<()>>,
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
    /// Worker threads asked for ([`WorkerPoolBuilder::threads`]); 0 for a
    /// pool with no sync handler, which starts none.
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

impl WorkerPoolBuilder {
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
        #[cfg(feature = "tokio")]
        if let Some(kind) = self
            .kind_concurrency
            .keys()
            .find(|kind| !self.async_handlers.contains_key(*kind))
        {
            return Err(Error::InvalidArgument(format!(
                "async_concurrency_for names kind {kind:?}, which has no async handler in this pool"
            )));
        }
        #[cfg(feature = "tokio")]
        let no_async = self.async_handlers.is_empty();
        #[cfg(not(feature = "tokio"))]
        let no_async = true;
        if self.handlers.is_empty() && no_async {
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
        let queues = self.served_queues();
        let worker_id = self
            .worker_id
            .clone()
            .unwrap_or_else(|| format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..)));
        // Unbounded: the dispatcher sends no more than it has slots for.
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<Lease>();
        let (outcome_tx, outcome_rx) = crossbeam_channel::unbounded::<(Lease, Outcome)>();
        // One dispatcher per lane, each with its watcher: the worker
        // threads' lane (sync handlers), and the task lanes (async ones).
        let thread_watcher = if self.handlers.is_empty() {
            None
        } else {
            Some(self.queue.manual().watcher()?)
        };
        #[cfg(feature = "tokio")]
        let task_lanes = async_handlers::task_lanes(
            self.async_handlers,
            &self.kind_concurrency,
            self.async_concurrency,
            || self.queue.manual().watcher(),
        )?;
        #[cfg_attr(not(feature = "tokio"), allow(unused_mut))]
        let mut wakers: Vec<crate::queue::Waker> =
            thread_watcher.iter().map(|w| w.waker()).collect();
        #[cfg(feature = "tokio")]
        wakers.extend(task_lanes.iter().map(|(lane, ..)| lane.waker.clone()));
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
            fetcher_waker: wakers[0].clone(),
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
            claimers: AtomicUsize::new(wakers.len()),
            wakers,
            #[cfg(feature = "tokio")]
            task_lanes: task_lanes
                .iter()
                .map(|(lane, ..)| Arc::clone(lane))
                .collect(),
            released_late: AtomicUsize::new(0),
            channel_taken: Mutex::new(false),
            events: EventHub::default(),
        });

        let config = |mut kinds: Vec<String>| {
            kinds.sort();
            DispatchConfig {
                outcome_sync_interval: self.outcome_sync_interval,
                queues: queues.clone(),
                kinds,
                worker_id: worker_id.clone(),
                threads: self.threads,
                prefetch: self.prefetch,
                prefetch_hold: self.prefetch_hold,
                claim_batch: self.claim_batch,
                max_idle: self.max_idle,
                poll: self.poll,
                aging_every: self.priority_aging,
            }
        };
        let mut dispatchers = Vec::new();
        if let Some(watcher) = thread_watcher {
            for i in 0..self.threads {
                start_worker(&shared, format!("tickler-worker-{i}"));
            }
            let shared = Arc::clone(&shared);
            let config = config(shared.handlers.keys().cloned().collect());
            let lane = Lane::Threads(Some(job_tx));
            dispatchers.push(spawn("tickler-dispatcher", move || {
                dispatch_loop(&shared, &config, watcher, lane, &outcome_rx)
            }));
        }
        #[cfg(feature = "tokio")]
        for (i, (lane, watcher, outcomes)) in task_lanes.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            let config = config(lane.handlers.keys().cloned().collect());
            let lane = Lane::Tasks(lane);
            dispatchers.push(spawn(&format!("tickler-tasks-{i}"), move || {
                dispatch_loop(&shared, &config, watcher, lane, &outcomes)
            }));
        }
        let heartbeat = {
            let shared = Arc::clone(&shared);
            let watcher = self.queue.manual().watcher()?;
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
                let mut known_limits = std::collections::BTreeSet::new();
                let mut next = Instant::now();
                while !shared.stop_background.load(Ordering::SeqCst) {
                    if Instant::now() >= next {
                        crate::observe::job_gauges(&shared.queue, &mut known);
                        crate::observe::limit_gauges(&shared.queue, &mut known_limits);
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
            // No worker thread without a sync handler.
            threads: if shared.handlers.is_empty() {
                0
            } else {
                self.threads
            },
            shared,
            worker_id,
            job_rx,
            dispatchers,
            heartbeat: Some(heartbeat),
            reaper,
            scheduler,
            shutdown_grace: self.shutdown_grace,
            shut_down: false,
        })
    }
}

impl WorkerPool {
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
    /// scheduler ([`crate::TickEvent`]) and what limits did to the runs it
    /// claimed (blocked, unblocked, deferred). Events are this process's only;
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
    /// started back to pending at once (attempt given back; a claim under
    /// way is waited for first, up to `grace` or 2 s, whichever is longer),
    /// waits up to `grace` for running handlers and records their outcomes, then sets
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
        shared.wake_dispatchers();
        let deadline = Instant::now() + grace;
        // A claim under way (waiting for the write lock, or a server's
        // answer on a loaded machine) may still commit: wait until the
        // dispatcher has sent its leases and claims no more, so that none
        // is left in the channel after we return. This wait is not the
        // handlers' grace: a short grace must not leave claimed jobs to the
        // reaper because one statement was slow.
        let claims_deadline = deadline.max(Instant::now() + CLAIM_SETTLE_WAIT);
        let claims_over = || shared.claimers.load(Ordering::SeqCst) == 0;
        while !claims_over() && Instant::now() < claims_deadline {
            shared.wake_dispatchers();
            std::thread::sleep(Duration::from_millis(1));
        }
        if !claims_over() {
            log::warn!(
                "shutdown: the dispatcher's last claim had not finished within the grace period; \
                 jobs it claims are handed back by the workers, or taken back by the reaper"
            );
        }
        // Unstarted jobs go back at once; a worker that picks one up during
        // this race hands it back the same way.
        let unstarted: Vec<Lease> = {
            let mut taken = lock(&shared.channel_taken);
            *taken = true;
            self.job_rx.try_iter().collect()
        };
        let released = unstarted.len();
        if !unstarted.is_empty() {
            let outcomes: Vec<(&Lease, Outcome)> =
                unstarted.iter().map(|l| (l, Outcome::Release)).collect();
            if let Err(e) = shared.queue.manual().record_outcomes(&outcomes) {
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
        while !shared.runs_over() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut still_running = 0;
        if shared.runs_over() {
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
            // Each records the last outcomes, then ends: every live run
            // is over.
            for dispatcher in self.dispatchers.drain(..) {
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
            released: released + shared.released_late.load(Ordering::SeqCst),
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
    /// returns once the outcomes of the handlers that already returned are
    /// recorded (up to 2 s: the process often exits right after, as at the
    /// end of `#[tokio::main]`, and a finished job whose outcome is lost
    /// would run again, its attempt counted). A process that exits before
    /// that thread ends leaves the jobs still running to the reaper, or to
    /// the runtime's shutdown, which hands async ones back; use
    /// `WorkerPool::shutdown_async` (feature `tokio`) to know when the pool
    /// has stopped.
    fn drop(&mut self) {
        #[cfg(feature = "tokio")]
        if !self.shut_down && tokio::runtime::Handle::try_current().is_ok() {
            let shared = &self.shared;
            shared.stopping.store(true, Ordering::SeqCst);
            shared.wake_dispatchers();
            // No write here (a server engine's client cannot block inside
            // the runtime): the dispatchers record, this thread waits.
            let until = Instant::now() + FLUSH_ON_DROP;
            while !shared.outcomes_recorded() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut pool = WorkerPool {
                shared: Arc::clone(&self.shared),
                worker_id: self.worker_id.clone(),
                job_rx: self.job_rx.clone(),
                threads: self.threads,
                dispatchers: std::mem::take(&mut self.dispatchers),
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
