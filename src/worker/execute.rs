//! The worker threads: each takes a claimed job, runs its handler (a panic
//! caught), and sends what to record for it to the dispatcher.

use super::context::{CancelReason, JobContext};
use super::handler::JobError;
use super::in_flight::{entry_of, remove_run, RunState};
use super::shared::{lock, spawn, Shared};
use crate::engine::types::Outcome;
use crate::events::JobEventKind;
use crate::retry::RetryPolicy;
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
fn record_start_now(shared: &Shared, lease: &crate::lease::Lease) {
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
                if lease.given_back > 0 {
                    record_start_now(shared, &lease);
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
