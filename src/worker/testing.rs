//! `tickler::testing::run_one`: one job run on the calling thread, for
//! tests of handlers.

use super::context::JobContext;
use super::execute::outcome_of;
use super::handler::{Handler, RunJob};
use crate::engine::types::Outcome;
use crate::job::JobId;
use crate::queue::Queue;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

// Named by doc links only.
#[cfg(doc)]
use crate::error::Error;

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
    handler: &impl Handler,
) -> crate::Result<Option<(JobId, Outcome)>> {
    let lease = queue
        .manual()
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
        progress: Arc::default(),
        pool: None,
    };
    let result = catch_unwind(AssertUnwindSafe(|| handler.run_job(&ctx)));
    let id = ctx.lease.job_id;
    if ctx.completion.committed() {
        return Ok(Some((id, Outcome::Complete)));
    }
    if let Some((fraction, message, _)) = ctx.progress.unstored() {
        if let Err(e) = queue
            .manual()
            .record_progress(&[(&ctx.lease, fraction, message.as_str())])
        {
            log::warn!("job {id}: storing its last progress failed: {e}");
        }
    }
    let outcome = outcome_of(result, None, ctx.lease.attempt);
    queue
        .manual()
        .record_outcomes(&[(&ctx.lease, outcome.clone())])?
        .remove(0)?;
    Ok(Some((id, outcome)))
}
