//! The handler's view of its run: [`JobContext`] (job, attempt, run token,
//! clock, queue, completing the job itself) and its cancellation flag
//! ([`CancelReason`]).

use super::handler::JobError;
use super::shared::lock;
use crate::clock::Clock;
use crate::job::{JobId, RunToken};
use crate::lease::Lease;
use crate::queue::Queue;
use crate::typed::JobArgs;
use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
pub(super) struct CancelFlag(AtomicU8, Mutex<Vec<std::task::Waker>>);

impl CancelFlag {
    /// A lost lease overrides any other reason (its outcome must be
    /// dropped); otherwise the first reason stays.
    pub(super) fn set(&self, reason: CancelReason) {
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

    pub(super) fn get(&self) -> Option<CancelReason> {
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
    pub(super) lease: Lease,
    pub(super) cancel: Arc<CancelFlag>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) queue: Queue,
    /// Where `complete_with` is: once committed the pool records nothing
    /// and the heartbeat leaves the job alone.
    pub(super) completion: Arc<SelfCompletion>,
    /// What the handler last reported, until the pool stores it.
    pub(super) progress: Arc<ProgressCell>,
    /// The pool, for the progress events of this run (none when the run
    /// is `testing::run_one`'s).
    pub(super) pool: Option<std::sync::Weak<super::shared::Shared>>,
}

/// A run's last progress report and which report is stored, shared by
/// its [`JobContext`] and the pool's in-flight entry. Reports are
/// numbered; one counts as stored only once its write committed, so a
/// write that failed is made again with the next.
#[derive(Debug, Default)]
pub(super) struct ProgressCell {
    last: Mutex<Option<(f64, String, u64)>>,
    stored: std::sync::atomic::AtomicU64,
}

impl ProgressCell {
    fn set(&self, fraction: f64, message: String) {
        let mut last = lock(&self.last);
        let number = last.as_ref().map_or(1, |(.., n)| n + 1);
        *last = Some((fraction, message, number));
    }

    /// The last report and its number, if it is not stored yet.
    pub(super) fn unstored(&self) -> Option<(f64, String, u64)> {
        let last = lock(&self.last);
        match last.as_ref() {
            Some((fraction, message, number)) if *number > self.stored.load(Ordering::SeqCst) => {
                Some((*fraction, message.clone(), *number))
            }
            _ => None,
        }
    }

    /// Report `number` (and those before it) is stored.
    pub(super) fn stored(&self, number: u64) {
        self.stored.fetch_max(number, Ordering::SeqCst);
    }
}

/// Progress of a handler completing its own job with
/// [`JobContext::complete_with`], shared with the pool's heartbeat.
#[derive(Debug, Default)]
pub(super) struct SelfCompletion(AtomicU8);

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

    pub(super) fn committed(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::COMMITTED
    }

    /// True from [`Self::begin`] on, unless the completion failed.
    pub(super) fn started(&self) -> bool {
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

    /// Reports how far the job is: `fraction` from 0 to 1 and a short
    /// `message` for a person ("exporting video"). Cheap enough to call in
    /// a tight loop: it is kept in memory, sent at once to the pool's and
    /// the queue's subscribers in this process (a
    /// [`JobEventKind::Progress`](crate::JobEventKind::Progress) event),
    /// and stored by the pool a few times a second at most (and before
    /// the job's outcome), fenced by the run_token like the outcome (never
    /// a write on the caller's thread, so an async handler calls it as it
    /// is): what
    /// [`Queue::get`] shows in [`Job::progress`](crate::Job::progress) and
    /// other processes read.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for a fraction outside 0..=1 (or
    /// NaN) or a message over
    /// [`MAX_PROGRESS_MESSAGE_BYTES`](crate::MAX_PROGRESS_MESSAGE_BYTES);
    /// [`crate::Error::LeaseLost`] once this run is known to have lost its
    /// lease (its reports would be refused).
    pub fn progress(&self, fraction: f64, message: impl Into<String>) -> crate::Result<()> {
        let message = message.into();
        crate::queue::check_progress(fraction, &message).map_err(crate::Error::InvalidArgument)?;
        if self.cancel.get() == Some(CancelReason::LeaseLost) {
            return Err(crate::Error::LeaseLost {
                job_id: self.lease.job_id,
            });
        }
        if let Some(pool) = self.pool.as_ref().and_then(std::sync::Weak::upgrade) {
            pool.emit(
                &self.lease,
                || crate::events::JobEventKind::Progress {
                    fraction,
                    message: message.clone(),
                },
                None,
                None,
            );
        }
        self.progress.set(fraction, message);
        Ok(())
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

    /// The jobs this one runs after ([`crate::NewJob::after`]), in id
    /// order, as stored now: their state and their
    /// [`Job::output`](crate::Job::output). The pruner keeps them while
    /// this job has not finished.
    ///
    /// # Errors
    /// The engine's read errors.
    pub fn parents(&self) -> crate::Result<Vec<crate::Job>> {
        self.queue
            .parents(self.job_id())?
            .into_iter()
            .map(|dep| self.queue.get(dep.parent))
            .collect()
    }

    /// The batch this job is a member or a callback of
    /// ([`crate::NewJob::batch`], [`crate::NewBatch`]), as stored now: its
    /// counters, whether it is sealed and finished, and its callbacks
    /// ([`crate::Batch::which_callback`] says which this job is); `None`
    /// for a job of no batch. A callback reads its members, with their
    /// outputs, page by page with [`Queue::batch_members`]; the pruner
    /// keeps them while a callback has not ended. It reads on the
    /// caller's thread: an async handler reads with
    /// [`crate::AsyncQueue::batch`] instead (feature `tokio`).
    ///
    /// # Errors
    /// [`crate::Error::NotFound`] or [`crate::Error::BatchNotFound`] if
    /// the job or its batch is no longer stored; the engine's read errors.
    pub fn batch(&self) -> crate::Result<Option<crate::Batch>> {
        match self.queue.get(self.job_id())?.batch {
            Some(id) => self.queue.batch(id).map(Some),
            None => Ok(None),
        }
    }

    /// Completes the job together with the handler's own writes, in one
    /// transaction: see [`Queue::complete_with`] (the closure names the
    /// engine's transaction type, `|tx: &rusqlite::Transaction|` or
    /// `|tx: &mut postgres::Transaction|`). After `Ok`, whatever the handler
    /// returns is ignored (the job is already succeeded, without output:
    /// an output it returns is not stored, and the log says so). On
    /// [`crate::Error::LeaseLost`] nothing was written; return the error
    /// (`?` turns it into a retry that the pool drops, as the lease is gone).
    ///
    /// While it runs, the pool's heartbeat leaves this job's lease as it is
    /// (the transaction keeps the job's row locked, and a heartbeat waiting
    /// for it would renew none of the pool's other leases): keep the
    /// closure's writes well within the lease. Should the completion fail,
    /// the lease is renewed again from the next heartbeat.
    ///
    /// # Errors
    /// As [`Queue::complete_with`].
    pub fn complete_with<T, M>(&self, app_writes: impl crate::AppWrites<T, M>) -> crate::Result<T> {
        // Its last report first: once the job has succeeded, the fence
        // refuses it. A failed store fails nothing else.
        if let Some((fraction, message, number)) = self.progress.unstored() {
            match self
                .queue
                .manual()
                .record_progress(&[(&self.lease, fraction, message.as_str())])
            {
                Ok(()) => self.progress.stored(number),
                Err(e) => log::warn!(
                    "job {}: storing its last progress failed: {e}",
                    self.lease.job_id
                ),
            }
        }
        // Marked before the commit, not after: the heartbeat can renew the
        // lease between the commit and this thread's next instruction.
        let _under_way = self.completion.begin();
        let value = self.queue.complete_with(&self.lease, app_writes)?;
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

    /// The remote side said "too many requests, try again after
    /// `retry_after`": returns a [`JobError::Snooze`] for this job until
    /// then (no attempt used), and first holds back this job's limit key
    /// until then in every process, if its limit has a rate
    /// ([`Rate`](crate::Rate)): the key's next start is due then, and its
    /// jobs claimed meanwhile are deferred to then and after, in order.
    /// The hold is one write, made now; if it fails (logged), the job is
    /// still snoozed. A job without a limit, or under one without a rate,
    /// is only snoozed.
    ///
    /// ```no_run
    /// # fn call_api() -> Result<(), std::time::Duration> { Ok(()) }
    /// use tickler::{JobContext, JobError};
    /// fn handler(ctx: &JobContext) -> Result<(), JobError> {
    ///     match call_api() {
    ///         Ok(()) => Ok(()),
    ///         Err(retry_after) => Err(ctx.rate_limited(retry_after)),
    ///     }
    /// }
    /// ```
    pub fn rate_limited(&self, retry_after: Duration) -> JobError {
        let snooze = self.snooze_for(retry_after);
        if let (Some(slot), JobError::Snooze(until)) = (&self.lease.limit, &snooze) {
            if let Err(e) = self.queue.hold_rate(&self.lease, *until) {
                log::warn!(
                    "job {}: holding back key {:?} of limit {:?} failed: {e}",
                    self.lease.job_id,
                    slot.key,
                    slot.name
                );
            }
        }
        snooze
    }
}

/// Typed payloads ([`JobArgs`]): the handler's view of its args.
impl JobContext {
    /// The payload read as `A`, the args of a typed job. A `null` payload
    /// (a job enqueued by kind alone) is read as `{}` when `A` does not
    /// take `null` itself, so that a type with no fields runs from it.
    ///
    /// # Errors
    /// A [`JobError::Permanent`] naming the job's kind, the type and the
    /// serde error when the payload does not fit `A` (retrying would not
    /// help).
    pub fn args<A: JobArgs>(&self) -> std::result::Result<A, JobError> {
        let payload = self.payload();
        // A job enqueued by kind alone (a schedule made with
        // `NewSchedule::new`, `tickler enqueue KIND`) has a `null` payload:
        // a type with no fields (`struct Heartbeat {}`) is read from `{}`.
        let decoded = serde_json::from_value(payload.clone()).or_else(|e| {
            if payload.is_null() {
                serde_json::from_value(serde_json::json!({})).map_err(|_| e)
            } else {
                Err(e)
            }
        });
        decoded.map_err(|e| {
            JobError::permanent(format!(
                "payload of job {} (kind {:?}) does not fit {}: {e}",
                self.job_id(),
                self.kind(),
                std::any::type_name::<A>()
            ))
        })
    }
}
