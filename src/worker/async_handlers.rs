//! The async face of the pool (feature `tokio`): async handlers, which run
//! as tasks on the application's runtime in slots of their own (a task
//! lane: no thread waits for a task), the end of a run whose runtime shut
//! down, and [`WorkerPool::shutdown_async`]. The builder's runtime fields,
//! their check in `start` and the drop of a pool on a runtime thread stay
//! with their types.

use super::context::{CancelReason, JobContext};
use super::execute::{finish, prepare, start, Finished, Prepared, Runner, Started};
use super::handler::{output_of, JobError};
use super::in_flight::entry_of;
use super::shared::Shared;
use super::{ShutdownReport, WorkerPool, WorkerPoolBuilder};
use crate::engine::types::Outcome;
use crate::job::Output;
use crate::lease::Lease;
use crate::queue::Waker;
use crate::typed::JobArgs;
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

// Named by doc links only.
#[cfg(doc)]
use crate::error::Error;

/// Default of [`WorkerPoolBuilder::async_concurrency`]: the most async
/// handlers a pool runs at once (kinds given their own concurrency
/// aside). A task waiting on a timer or a socket costs its lease and a
/// few hundred bytes, not a thread, so this is high: 10,000 jobs that
/// each await a 1 s timer finish in about a second. It still bounds
/// what one pool claims and renews. Set it lower when the handlers all
/// call one service that cannot take that many at once, or when a
/// backlog should be shared among several processes rather than claimed
/// by the first.
pub const DEFAULT_ASYNC_CONCURRENCY: usize = 10_000;

/// How long the runs dropped by a runtime's shutdown wait, together,
/// for their hand-backs to be recorded: the process often exits right
/// after its runtime, and a run whose start was recorded would otherwise
/// count its attempt when taken back.
const HAND_BACK_WAIT: Duration = Duration::from_secs(2);

type Run = Pin<Box<dyn Future<Output = Result<Option<Output>, JobError>> + Send>>;

/// An async handler as the pool keeps it: the runtime its tasks run on,
/// and how to start one run.
pub(super) struct TaskHandler {
    runtime: tokio::runtime::Handle,
    call: Box<dyn Fn(JobContext) -> Run + Send + Sync>,
    /// Set when a run of this handler was dropped unfinished by its
    /// runtime (it shut down): no more jobs of the kind are claimed.
    gone: AtomicBool,
}

/// The slots of async runs: the pool's shared lane, or one kind's own,
/// with its dispatcher's outcome channel.
pub(super) struct TaskLane {
    pub(super) handlers: HashMap<String, Arc<TaskHandler>>,
    pub(super) limit: usize,
    /// Runs claimed and not yet ended (or written off).
    pub(super) busy: AtomicUsize,
    /// Wakes this lane's dispatcher.
    pub(super) waker: Waker,
    /// To this lane's dispatcher, the only one that records its runs'
    /// outcomes.
    pub(super) outcomes: Sender<(Lease, Outcome)>,
    /// Until when the runs dropped by the runtime's shutdown under way
    /// wait for their hand-backs to be recorded.
    hand_back_until: Mutex<Option<Instant>>,
}

impl TaskLane {
    /// A lane, and the receiving end of its outcome channel.
    pub(super) fn new(
        handlers: HashMap<String, Arc<TaskHandler>>,
        limit: usize,
        waker: Waker,
    ) -> (TaskLane, Receiver<(Lease, Outcome)>) {
        let (outcomes, received) = crossbeam_channel::unbounded();
        let lane = TaskLane {
            handlers,
            limit,
            busy: AtomicUsize::new(0),
            waker,
            outcomes,
            hand_back_until: Mutex::new(None),
        };
        (lane, received)
    }

    pub(super) fn any_runtime_gone(&self) -> bool {
        self.handlers
            .values()
            .any(|h| h.gone.load(Ordering::Relaxed))
    }

    /// `kinds` but those whose runtime is gone.
    pub(super) fn open_kinds<'a>(&self, kinds: &[&'a str]) -> Vec<&'a str> {
        kinds
            .iter()
            .copied()
            .filter(|kind| {
                self.handlers
                    .get(*kind)
                    .is_some_and(|h| !h.gone.load(Ordering::Relaxed))
            })
            .collect()
    }

    pub(super) fn free(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
        self.waker.wake();
    }

    /// When the hand-backs of the runtime shutdown under way stop being
    /// waited for: a new bound once the last one has passed.
    fn hand_back_deadline(&self) -> Instant {
        let now = Instant::now();
        let mut until = super::shared::lock(&self.hand_back_until);
        match *until {
            Some(at) if at > now => at,
            _ => *until.insert(now + HAND_BACK_WAIT),
        }
    }
}

/// Starts the run of a claimed job as a task on its handler's runtime
/// (the dispatcher calls this; the run's slot is taken and its in-flight
/// entry made). The run starts (its timeout counts, its `Started` event
/// goes out) at the task's first poll, and its handler is called there,
/// on the runtime, never on this thread.
pub(super) fn spawn_run(shared: &Arc<Shared>, lane: &Arc<TaskLane>, lease: Lease) {
    let stopping = shared.stopping.load(Ordering::SeqCst);
    let handler = match lane.handlers.get(&lease.kind) {
        Some(h) if !h.gone.load(Ordering::SeqCst) && !stopping => Arc::clone(h),
        // Unstarted at shutdown, or its runtime is gone: handed back
        // without using the attempt.
        _ => {
            if stopping {
                shared.released_late.fetch_add(1, Ordering::SeqCst);
            }
            let _ = lane.outcomes.send((lease, Outcome::Release));
            lane.free();
            return;
        }
    };
    let Some(prepared) = prepare(shared, lease) else {
        lane.free();
        return;
    };
    let lease = prepared.ctx.lease.clone();
    let mut run = TaskRun {
        shared: Arc::clone(shared),
        lane: Arc::clone(lane),
        handler: Arc::clone(&handler),
        prepared: Some(prepared),
        started: None,
    };
    let call = Arc::clone(&handler);
    let span_lease = lease.clone();
    SPAWNING.with(|spawning| spawning.set(true));
    let task = handler.runtime.spawn(async move {
        let ctx = run.start();
        // The handler's synchronous part runs here too, on the runtime,
        // and a panic there is the run's like any other.
        let result = CatchUnwind(Box::pin(crate::observe::in_run_span(
            &span_lease,
            async move { (call.call)(ctx).await },
        )))
        .await;
        run.finish(result);
    });
    SPAWNING.with(|spawning| spawning.set(false));
    if let Some(job) = entry_of(&mut shared.lock_in_flight(), &lease) {
        if let Some(slot) = &mut job.task {
            slot.abort = Some(task.abort_handle());
        }
    }
}

thread_local! {
    /// Set while a dispatcher spawns a run.
    static SPAWNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One run on the runtime. Dropped unfinished, it was aborted (written
/// off by the heartbeat) or dropped by its runtime shutting down.
struct TaskRun {
    shared: Arc<Shared>,
    lane: Arc<TaskLane>,
    handler: Arc<TaskHandler>,
    /// Until the task's first poll.
    prepared: Option<Prepared>,
    /// From the task's first poll.
    started: Option<Started>,
}

impl TaskRun {
    /// The run starts: see [`start`].
    fn start(&mut self) -> JobContext {
        let prepared = self.prepared.take().expect("a run starts once");
        let started = start(&self.shared, prepared, Runner::Task);
        let ctx = started.ctx.clone();
        self.started = Some(started);
        ctx
    }

    fn finish(mut self, result: std::thread::Result<Result<Option<Output>, JobError>>) {
        if let Some(started) = self.started.take() {
            match finish(&self.shared, started, result, "its task") {
                Finished::Recorded => self.lane.free(),
                // The heartbeat freed its slot as it wrote it off.
                Finished::WrittenOff(_) => {}
            }
        }
    }
}

impl Drop for TaskRun {
    fn drop(&mut self) {
        let (ctx, run, outcomes) = match (self.started.take(), self.prepared.take()) {
            (Some(s), _) => (s.ctx, s.run, s.outcomes),
            (None, Some(p)) => (p.ctx, p.run, p.outcomes),
            (None, None) => return,
        };
        let shared = &self.shared;
        if run.end().is_err() {
            // Aborted by the heartbeat, which freed its slot and recorded
            // what there was to record: its refused hand-back frees the
            // job's unique_key. Sent under the in-flight lock, after the
            // timeout the heartbeat sent under it.
            let _in_flight = shared.lock_in_flight();
            let _ = outcomes.send((ctx.lease, Outcome::Release));
            return;
        }
        // Dropped by its runtime's shutdown under the live pool.
        if !self.handler.gone.swap(true, Ordering::SeqCst) {
            log::warn!(
                "the tokio runtime of the async handler of kind {:?} shut down while its worker pool lives on: its running jobs are handed back with their attempts given back, and the pool claims no more jobs of the kind",
                ctx.lease.kind,
            );
        }
        ctx.cancel.set(CancelReason::Shutdown);
        let start_recorded = {
            let mut in_flight = shared.lock_in_flight();
            let _ = outcomes.send((ctx.lease.clone(), Outcome::Release));
            entry_of(&mut in_flight, &ctx.lease).is_some_and(|job| job.start_recorded)
        };
        self.lane.waker.wake();
        // Not on the dispatcher's thread, which records the hand-back: a
        // runtime already shut down drops the task as it is spawned.
        if start_recorded && !SPAWNING.with(std::cell::Cell::get) {
            let until = self.lane.hand_back_deadline();
            while Instant::now() < until
                && entry_of(&mut shared.lock_in_flight(), &ctx.lease).is_some()
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.lane.free();
    }
}

/// A future's panic as its output, as `catch_unwind` gives a closure's.
struct CatchUnwind(Run);

impl Future for CatchUnwind {
    type Output = std::thread::Result<Result<Option<Output>, JobError>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let run = &mut self.0;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// Async handlers and shutdown (feature `tokio`).
impl WorkerPoolBuilder {
    /// The tokio runtime that async handlers registered after this call
    /// run on (default: the runtime [`WorkerPoolBuilder::async_handler`]
    /// is called in).
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// The most async handlers of this pool running at once (default
    /// [`DEFAULT_ASYNC_CONCURRENCY`], at least 1), apart from
    /// [`WorkerPool::builder`]'s [`WorkerPoolBuilder::threads`], which
    /// run sync handlers only. Kinds given their own
    /// ([`WorkerPoolBuilder::async_concurrency_for`]) are not counted
    /// here.
    pub fn async_concurrency(mut self, n: usize) -> Self {
        self.async_concurrency = n.max(1);
        self
    }

    /// The most async handlers of `kind` running at once in this pool (at
    /// least 1), in slots of the kind's own: a slow kind neither waits
    /// for nor holds back the pool's other async kinds. Each kind given
    /// its own concurrency has a dispatcher thread of its own (and, on a
    /// server, a connection to watch for work).
    pub fn async_concurrency_for(mut self, kind: impl Into<String>, n: usize) -> Self {
        self.kind_concurrency.insert(kind.into(), n.max(1));
        self
    }

    /// Runs jobs of `kind` with an async handler: for each job, `handler`
    /// is called on the application's runtime (see
    /// [`WorkerPoolBuilder::runtime`]) with an owned [`JobContext`], and
    /// the future it returns runs there as a task. No thread of the pool
    /// waits for it: a task waiting on a timer or a socket holds a slot
    /// ([`WorkerPoolBuilder::async_concurrency`], default
    /// [`DEFAULT_ASYNC_CONCURRENCY`], 10,000), not a thread. Everything else is
    /// the pool's, as for sync handlers: claims, heartbeats, fencing by
    /// run_token, group commit, timeouts, the hand-back rules of shutdown.
    ///
    /// Results: the future's `Ok` and [`JobError`] mean what they mean for
    /// sync handlers, and a panic fails the job with the panic message.
    /// Cancellation (timeout, a lost lease, the end of the shutdown grace)
    /// reaches the handler as [`JobContext::cancelled`]. A task that
    /// ignores it past its timeout plus
    /// [`WorkerPoolBuilder::timeout_grace`] is aborted at its next `.await`
    /// and its job failed as timed out (the attempt counts); one that
    /// ignores a lost lease (its job cancelled or taken back) for the grace
    /// is aborted too. Either way its slot is free at once. A run's
    /// timeout counts from its task's first poll, so a busy runtime's
    /// backlog of tasks spends none of theirs.
    ///
    /// Should the runtime shut down under the pool (the end of
    /// `#[tokio::main]`, a runtime dropped or shut down with
    /// `shutdown_timeout` while the pool lives on), its running tasks are
    /// dropped by tokio: each one's job is handed back with its attempt
    /// given back (its cancellation flag set first, for what the handler
    /// handed to other threads), the pool claims no more jobs of the kinds
    /// on that runtime, and says so once in the log (a warning).
    ///
    /// The handler must not block its runtime thread: call
    /// [`JobContext::complete_with`] (a write transaction) through
    /// `tokio::task::spawn_blocking`, and use [`crate::AsyncQueue`] for
    /// other `Queue` calls.
    ///
    /// With no runtime named and none current, [`WorkerPoolBuilder::start`]
    /// returns [`Error::InvalidArgument`]. Registering a kind again, sync
    /// or async, keeps the last handler.
    pub fn async_handler<F, Fut, O>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, JobError>> + Send + 'static,
        O: serde::Serialize,
    {
        let kind = kind.into();
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        self.handlers.remove(&kind);
        match runtime {
            Some(runtime) => {
                let handler = TaskHandler {
                    runtime,
                    call: Box::new(move |ctx| {
                        let run = handler(ctx);
                        Box::pin(async move { output_of(&run.await?) })
                    }),
                    gone: AtomicBool::new(false),
                };
                self.async_handlers.insert(kind, Arc::new(handler));
            }
            None => {
                self.async_handlers.remove(&kind);
                self.missing_runtime = Some(kind);
            }
        }
        self
    }

    /// [`WorkerPoolBuilder::handler_for`] for an async handler: runs typed
    /// jobs of kind `A::KIND` as tasks, as
    /// [`WorkerPoolBuilder::async_handler`] does. A payload that does not
    /// fit `A` fails permanently without calling `handler`.
    pub fn async_handler_for<A, F, Fut, O>(mut self, handler: F) -> Self
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, JobError>> + Send + 'static,
        O: serde::Serialize,
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

/// A task lane, its dispatcher's watcher and the receiving end of its
/// outcome channel.
pub(super) type LaneParts = (
    Arc<TaskLane>,
    crate::queue::ChangeWatcher,
    Receiver<(Lease, Outcome)>,
);

/// The task lanes of a pool's async handlers: the pool's shared one (first)
/// and one per kind given its own concurrency, each with the watcher of
/// its dispatcher.
pub(super) fn task_lanes(
    handlers: HashMap<String, Arc<TaskHandler>>,
    kind_concurrency: &HashMap<String, usize>,
    concurrency: usize,
    mut watcher: impl FnMut() -> crate::Result<crate::queue::ChangeWatcher>,
) -> crate::Result<Vec<LaneParts>> {
    let mut shared_lane = HashMap::new();
    let mut lanes = Vec::new();
    for (kind, handler) in handlers {
        match kind_concurrency.get(&kind) {
            Some(&limit) => {
                let w = watcher()?;
                let (lane, outcomes) =
                    TaskLane::new(HashMap::from([(kind, handler)]), limit, w.waker());
                lanes.push((Arc::new(lane), w, outcomes));
            }
            None => {
                shared_lane.insert(kind, handler);
            }
        }
    }
    if !shared_lane.is_empty() {
        let w = watcher()?;
        let (lane, outcomes) = TaskLane::new(shared_lane, concurrency, w.waker());
        lanes.insert(0, (Arc::new(lane), w, outcomes));
    }
    Ok(lanes)
}

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
