//! The worker threads: each takes a claimed job, runs its handler (a panic
//! caught), and sends what to record for it to the dispatcher.

use super::context::{CancelReason, JobContext};
use super::handler::JobError;
use super::in_flight::{entry_of, remove_run, RunState};
use super::shared::{lock, spawn, Shared};
use crate::engine::types::Outcome;
use crate::events::JobEventKind;
use crate::job::Output;
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use crossbeam_channel::Sender;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// Records the start of a job that was given back uncounted before,
/// before its handler runs: had its holder died within the heartbeat's
/// delay again, a handler that kills its process at once would be given
/// back for ever. A job given back at all is rare (its holder crashed),
/// so this write is too.
fn record_start_now(shared: &Shared, lease: &Lease) {
    if let Some(job) = entry_of(&mut shared.lock_in_flight(), lease) {
        job.start_recorded = true;
    }
    if let Err(e) = shared.queue.manual().mark_started(&[lease]) {
        log::warn!(
            "job {}: recording its start failed: {e}; should this process die during the run, its attempt is given back",
            lease.job_id
        );
    }
}

/// Starts a worker thread and keeps its handle.
pub(super) fn start_worker(shared: &Arc<Shared>, name: String) {
    let for_thread = Arc::clone(shared);
    let handle = spawn(&name, move || work_loop(&for_thread));
    lock(&shared.workers).push(handle);
}

/// Who runs a job's handler, as its in-flight entry names it.
pub(super) enum Runner {
    Thread((ThreadId, Arc<str>)),
    /// A task on the application's runtime; its abort handle is set once
    /// it is spawned.
    #[cfg(feature = "tokio")]
    Task,
}

/// A run about to call its handler.
pub(super) struct Started {
    pub(super) ctx: JobContext,
    pub(super) run: Arc<RunState>,
    pub(super) began: Instant,
    /// Where its outcome goes (its lane's dispatcher).
    pub(super) outcomes: Sender<(Lease, Outcome)>,
}

/// A run handed to its runner, not started yet.
pub(super) struct Prepared {
    pub(super) ctx: JobContext,
    pub(super) run: Arc<RunState>,
    pub(super) outcomes: Sender<(Lease, Outcome)>,
}

/// Makes the context of `lease`'s run. `None` when the handler must not
/// be called: the run is no longer this pool's, or its lease was lost
/// while it waited (then its refused hand-back is sent, telling a
/// cancelled job's unique_key that the run has stopped). Either way the
/// caller frees the run's slot. May write (the start of a job given back
/// before): not on a runtime thread.
pub(super) fn prepare(shared: &Arc<Shared>, lease: Lease) -> Option<Prepared> {
    let (cancel, completion, run, outcomes, start_recorded, progress) = {
        let mut in_flight = shared.lock_in_flight();
        // No longer this pool's (defensive: the dispatcher takes the
        // leases it hands back out of the channel itself).
        let job = entry_of(&mut in_flight, &lease)?;
        (
            Arc::clone(&job.cancel),
            Arc::clone(&job.completion),
            Arc::clone(&job.run),
            job.outcomes.clone(),
            job.start_recorded,
            Arc::clone(&job.progress),
        )
    };
    if cancel.get() == Some(CancelReason::LeaseLost) {
        // Cancelled (or reaped) while waiting for a thread: not started;
        // the refused hand-back says it has stopped.
        let _ = outcomes.send((lease, Outcome::Release));
        return None;
    }
    if lease.given_back > 0 && !start_recorded {
        record_start_now(shared, &lease);
    }
    let ctx = JobContext {
        lease,
        cancel,
        clock: Arc::clone(shared.queue.clock()),
        queue: shared.queue.clone(),
        completion,
        progress,
        pool: Some(Arc::downgrade(shared)),
    };
    Some(Prepared { ctx, run, outcomes })
}

/// Marks a run as started by `runner` as its handler is called: its
/// timeout counts from now, and so does the delay after which its start
/// is recorded; announces it. A task is started at its first poll, not
/// when it is spawned: a busy runtime's queue of tasks spends none of
/// their timeouts.
pub(super) fn start(shared: &Shared, prepared: Prepared, runner: Runner) -> Started {
    let Prepared { ctx, run, outcomes } = prepared;
    if let Some(job) = entry_of(&mut shared.lock_in_flight(), &ctx.lease) {
        job.deadline = ctx.lease.timeout.map(|t| Instant::now() + t);
        match runner {
            Runner::Thread(thread) => job.thread = Some(thread),
            #[cfg(feature = "tokio")]
            Runner::Task => {}
        }
        job.started = Some(Instant::now());
    }
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
    Started {
        ctx,
        run,
        began: Instant::now(),
        outcomes,
    }
}

/// What became of a run whose handler returned.
pub(super) enum Finished {
    /// Its outcome is sent to the dispatcher.
    Recorded,
    /// Written off as stuck while it ran (its job failed as timed out);
    /// the state says whether a replacement took its slot.
    WrittenOff(u8),
}

/// Sends what to record for a handler's `result` (or panic): its
/// outcome, nothing when the handler completed the job itself, a refused
/// hand-back when the run was written off meanwhile.
pub(super) fn finish(
    shared: &Shared,
    started: Started,
    result: std::thread::Result<Result<Option<Output>, JobError>>,
    runner: &str,
) -> Finished {
    let Started {
        ctx, run, outcomes, ..
    } = started;
    if let Err(state) = run.end() {
        // Written off by the heartbeat thread while it ran: the job was
        // failed as timed out and may run elsewhere now.
        log::warn!(
            "job {}: handler on {runner} returned after its job was failed as timed out; what it returned is dropped",
            ctx.lease.job_id,
        );
        // Refused (the lease is gone), it tells the job's unique_key that
        // this run has stopped; sent under the in-flight lock, after the
        // timeout the heartbeat sent under it.
        let _in_flight = shared.lock_in_flight();
        let _ = outcomes.send((ctx.lease, Outcome::Release));
        return Finished::WrittenOff(state);
    }
    if ctx.completion.committed() {
        // Completed inside the handler's own transaction, whose success
        // statement had no output to store.
        if matches!(result, Ok(Ok(Some(_)))) {
            log::warn!(
                "job {}: its handler completed it with JobContext::complete_with and then returned an output, which is not stored",
                ctx.lease.job_id,
            );
        }
        remove_run(&mut shared.lock_in_flight(), &ctx.lease);
        return Finished::Recorded;
    }
    // The queue's policy is applied here too (not left to the engine), so
    // that a failure's event knows its retry delay.
    let policy = shared
        .retry_policies
        .get(&ctx.lease.kind)
        .copied()
        .unwrap_or_else(|| shared.queue.retry_policy());
    let outcome = outcome_of(result, Some(&policy), ctx.lease.attempt);
    let _ = outcomes.send((ctx.lease, outcome));
    Finished::Recorded
}

fn work_loop(shared: &Arc<Shared>) {
    let me = std::thread::current();
    let thread: (ThreadId, Arc<str>) = (me.id(), Arc::from(me.name().unwrap_or("(unnamed)")));
    let free_slot = || {
        shared.busy_slots.fetch_sub(1, Ordering::SeqCst);
        shared.fetcher_waker.wake();
    };
    while let Ok(lease) = shared.jobs.recv() {
        shared.received.fetch_add(1, Ordering::SeqCst);
        let handler = match shared.handlers.get(&lease.kind) {
            Some(handler) if !shared.stopping.load(Ordering::SeqCst) => handler,
            // Unstarted at shutdown (or, impossibly, a kind without
            // handler): hand back without using the attempt.
            _ => {
                let _ = shared.outcomes.send((lease, Outcome::Release));
                free_slot();
                continue;
            }
        };
        let Some(prepared) = prepare(shared, lease) else {
            free_slot();
            continue;
        };
        let started = start(shared, prepared, Runner::Thread(thread.clone()));
        let result = {
            let _span = crate::observe::run_span(&started.ctx.lease);
            catch_unwind(AssertUnwindSafe(|| handler.run_job(&started.ctx)))
        };
        // Threads' run times only: they decide what to claim ahead of
        // the threads.
        shared.run_time.record(started.began.elapsed());
        match finish(shared, started, result, &format!("thread {}", thread.1)) {
            Finished::Recorded => {}
            Finished::WrittenOff(state) => {
                lock(&shared.stuck).remove(&thread.0);
                if state == RunState::REPLACED {
                    // A replacement thread has this one's slot.
                    return;
                }
            }
        }
        free_slot();
    }
}

/// What to record for a handler's result (or its panic), with the kind's
/// own backoff if it has one.
pub(crate) fn outcome_of(
    result: std::thread::Result<Result<Option<Output>, JobError>>,
    policy: Option<&RetryPolicy>,
    attempt: u32,
) -> Outcome {
    let fail = |message: String| match policy {
        Some(policy) => Outcome::FailRetryAfter(message, policy.backoff(attempt)),
        None => Outcome::Fail(message),
    };
    match result {
        Ok(Ok(None)) => Outcome::Complete,
        Ok(Ok(Some(output))) => Outcome::CompleteWith(output),
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
