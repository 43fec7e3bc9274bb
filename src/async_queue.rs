//! [`AsyncQueue`]: the [`Queue`] API as `async fn`s (feature `tokio`).

use crate::engine::types::{JobFilter, Stats};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState, NewJob};
use crate::queue::Queue;
use crate::schedule::{NewSchedule, Schedule};
use crate::typed::JobArgs;
use chrono::{DateTime, Utc};

/// The [`Queue`] API for async code. Each call runs the blocking call of
/// the same name on tokio's blocking thread pool (`spawn_blocking`), so a
/// runtime worker thread never waits for SQLite's write lock or an fsync.
/// Same contract, same errors as the `Queue` method it names. Cheap to
/// clone; get one with [`Queue::to_async`].
///
/// Dropping a returned future does not stop the call once it has started:
/// an `enqueue` whose future was dropped (by a `select!` or a timeout) may
/// still commit. Every method panics if called outside a tokio runtime.
///
/// ```no_run
/// # async fn app() -> tickler::Result<()> {
/// let queue = tickler::Queue::open("jobs.db")?.to_async();
/// let id = queue.enqueue(tickler::NewJob::new("greet")).await?;
/// println!("{:?}", queue.get(id).await?.state);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct AsyncQueue {
    queue: Queue,
}

/// Runs a blocking queue call off the runtime's worker threads.
async fn off_runtime<T: Send + 'static>(
    call: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::Aborted(Box::new(e))),
    }
}

macro_rules! blocking {
    ($self:ident, |$queue:ident| $call:expr) => {{
        let $queue = $self.queue.clone();
        off_runtime(move || $call).await
    }};
}

impl Queue {
    /// An [`AsyncQueue`] on this queue (feature `tokio`).
    pub fn to_async(&self) -> AsyncQueue {
        AsyncQueue {
            queue: self.clone(),
        }
    }
}

impl AsyncQueue {
    /// The blocking queue underneath.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// [`Queue::enqueue`].
    ///
    /// # Errors
    /// As [`Queue::enqueue`]; [`Error::Aborted`] if the runtime shut down
    /// before the call started.
    pub async fn enqueue(&self, job: NewJob) -> Result<JobId> {
        blocking!(self, |queue| queue.enqueue(job))
    }

    /// [`Queue::enqueue_batch`].
    ///
    /// # Errors
    /// As [`Queue::enqueue_batch`] and [`AsyncQueue::enqueue`].
    pub async fn enqueue_batch(&self, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
        blocking!(self, |queue| queue.enqueue_batch(jobs))
    }

    /// [`Queue::enqueue_args`]. `args` is serialized before the call is
    /// handed to the blocking pool.
    ///
    /// # Errors
    /// As [`Queue::enqueue_args`] and [`AsyncQueue::enqueue`].
    pub async fn enqueue_args<A: JobArgs>(&self, args: &A) -> Result<JobId> {
        let job = NewJob::from_args(args)?;
        self.enqueue(job).await
    }

    /// [`Queue::enqueue_args_batch`].
    ///
    /// # Errors
    /// As [`Queue::enqueue_args_batch`] and [`AsyncQueue::enqueue`].
    pub async fn enqueue_args_batch<A: JobArgs>(&self, args: &[A]) -> Result<Vec<JobId>> {
        let jobs = args.iter().map(NewJob::from_args).collect::<Result<_>>()?;
        self.enqueue_batch(jobs).await
    }

    /// [`Queue::get`].
    ///
    /// # Errors
    /// As [`Queue::get`] and [`AsyncQueue::enqueue`].
    pub async fn get(&self, id: JobId) -> Result<Job> {
        blocking!(self, |queue| queue.get(id))
    }

    /// [`Queue::list`].
    ///
    /// # Errors
    /// As [`Queue::list`] and [`AsyncQueue::enqueue`].
    pub async fn list(&self, filter: JobFilter) -> Result<Vec<Job>> {
        blocking!(self, |queue| queue.list(&filter))
    }

    /// [`Queue::count`].
    ///
    /// # Errors
    /// As [`Queue::count`] and [`AsyncQueue::enqueue`].
    pub async fn count(&self, state: JobState) -> Result<u64> {
        blocking!(self, |queue| queue.count(state))
    }

    /// [`Queue::stats`].
    ///
    /// # Errors
    /// As [`Queue::stats`] and [`AsyncQueue::enqueue`].
    pub async fn stats(&self) -> Result<Stats> {
        blocking!(self, |queue| queue.stats())
    }

    /// [`Queue::cancel`].
    ///
    /// # Errors
    /// As [`Queue::cancel`] and [`AsyncQueue::enqueue`].
    pub async fn cancel(&self, id: JobId) -> Result<()> {
        blocking!(self, |queue| queue.cancel(id))
    }

    /// [`Queue::retry`].
    ///
    /// # Errors
    /// As [`Queue::retry`] and [`AsyncQueue::enqueue`].
    pub async fn retry(&self, id: JobId) -> Result<()> {
        blocking!(self, |queue| queue.retry(id))
    }

    /// [`Queue::prune`].
    ///
    /// # Errors
    /// As [`Queue::prune`] and [`AsyncQueue::enqueue`].
    pub async fn prune(&self, finished_before: DateTime<Utc>) -> Result<u64> {
        blocking!(self, |queue| queue.prune(finished_before))
    }

    /// [`Queue::upsert_schedule`].
    ///
    /// # Errors
    /// As [`Queue::upsert_schedule`] and [`AsyncQueue::enqueue`].
    pub async fn upsert_schedule(&self, schedule: NewSchedule) -> Result<Schedule> {
        blocking!(self, |queue| queue.upsert_schedule(schedule))
    }

    /// [`Queue::sync`].
    ///
    /// # Errors
    /// As [`Queue::sync`] and [`AsyncQueue::enqueue`].
    pub async fn sync(&self) -> Result<()> {
        blocking!(self, |queue| queue.sync())
    }
}
