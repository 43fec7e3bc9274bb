//! [`AsyncQueue`]: the [`Queue`] API as `async fn`s (feature `tokio`).

use crate::batch::{Batch, BatchId, NewBatch};
use crate::engine::types::{JobFilter, JobPage, Stats};
use crate::error::{Error, Result};
use crate::events::Subscription;
use crate::job::{Job, JobId, JobState, NewJob};
use crate::queue::Queue;
use crate::queue::{ActivityBucket, QueueBuilder, QueueCounts};
use crate::schedule::{NewSchedule, Schedule, Tick};
use crate::typed::JobArgs;
use chrono::{DateTime, Utc};
use std::path::Path;

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

impl QueueBuilder {
    /// [`QueueBuilder::open`] off the runtime's worker threads (feature
    /// `tokio`): opening creates or migrates the file, or connects to a
    /// server, and may wait for a lock.
    ///
    /// # Errors
    /// As [`QueueBuilder::open`]; [`Error::Aborted`] if the runtime shut
    /// down before the call started.
    pub async fn open_async(self) -> Result<AsyncQueue> {
        off_runtime(move || self.open())
            .await
            .map(|queue| queue.to_async())
    }
}

impl AsyncQueue {
    /// Opens the queue at `location` (a file's path, or a server's URL)
    /// with default settings, off the runtime's worker threads; see
    /// [`Queue::open`] and, for settings, [`QueueBuilder::open_async`].
    ///
    /// # Errors
    /// As [`Queue::open`]; [`Error::Aborted`] if the runtime shut down
    /// before the call started.
    pub async fn open(location: impl AsRef<Path>) -> Result<AsyncQueue> {
        Queue::builder(location).open_async().await
    }

    /// [`Queue::subscribe`]: read it with [`Subscription::recv`], which
    /// waits without blocking a thread.
    pub fn subscribe(&self, capacity: usize) -> Subscription {
        self.queue.subscribe(capacity)
    }

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

    /// [`Queue::open_batch`].
    ///
    /// # Errors
    /// As [`Queue::open_batch`] and [`AsyncQueue::enqueue`].
    pub async fn open_batch(&self, batch: NewBatch) -> Result<Batch> {
        blocking!(self, |queue| queue.open_batch(batch))
    }

    /// [`Queue::seal_batch`].
    ///
    /// # Errors
    /// As [`Queue::seal_batch`] and [`AsyncQueue::enqueue`].
    pub async fn seal_batch(&self, id: BatchId) -> Result<Batch> {
        blocking!(self, |queue| queue.seal_batch(id))
    }

    /// [`Queue::batch`]. An async handler reads its own batch so, with the
    /// id of its job's ([`Job::batch`]).
    ///
    /// # Errors
    /// As [`Queue::batch`] and [`AsyncQueue::enqueue`].
    pub async fn batch(&self, id: BatchId) -> Result<Batch> {
        blocking!(self, |queue| queue.batch(id))
    }

    /// [`Queue::batch_members`].
    ///
    /// # Errors
    /// As [`Queue::batch_members`] and [`AsyncQueue::enqueue`].
    pub async fn batch_members(
        &self,
        id: BatchId,
        after: Option<JobId>,
        limit: usize,
    ) -> Result<Vec<Job>> {
        blocking!(self, |queue| queue.batch_members(id, after, limit))
    }

    /// [`Queue::wait`], on a thread of tokio's blocking pool, which it
    /// holds while it waits. Dropped before it answers (a `select!` that
    /// took another branch, a `tokio::time::timeout`), it gives that
    /// thread back within 50 ms rather than at `timeout`.
    ///
    /// # Errors
    /// As [`Queue::wait`] and [`AsyncQueue::enqueue`].
    pub async fn wait(&self, id: JobId, timeout: std::time::Duration) -> Result<crate::Waited> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        /// Sets its flag when the future holding it is dropped, answered or
        /// not: a blocking call cannot be cancelled, only asked to stop.
        struct GiveUpOnDrop(Arc<AtomicBool>);
        impl Drop for GiveUpOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let given_up = Arc::new(AtomicBool::new(false));
        let _on_drop = GiveUpOnDrop(Arc::clone(&given_up));
        blocking!(self, |queue| queue.wait_unless(id, timeout, &given_up))
    }

    /// [`Queue::list`].
    ///
    /// # Errors
    /// As [`Queue::list`] and [`AsyncQueue::enqueue`].
    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let filter = filter.clone();
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

    /// [`Queue::pause_queue`].
    ///
    /// # Errors
    /// As [`Queue::pause_queue`] and [`AsyncQueue::enqueue`].
    pub async fn pause_queue(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.pause_queue(&name))
    }

    /// [`Queue::resume_queue`].
    ///
    /// # Errors
    /// As [`Queue::resume_queue`] and [`AsyncQueue::enqueue`].
    pub async fn resume_queue(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.resume_queue(&name))
    }

    /// [`Queue::paused_queues`].
    ///
    /// # Errors
    /// As [`Queue::paused_queues`] and [`AsyncQueue::enqueue`].
    pub async fn paused_queues(&self) -> Result<Vec<String>> {
        blocking!(self, |queue| queue.paused_queues())
    }

    /// [`Queue::retry_dead`].
    ///
    /// # Errors
    /// As [`Queue::retry_dead`] and [`AsyncQueue::enqueue`].
    pub async fn retry_dead(&self, name: Option<&str>) -> Result<(u64, u64)> {
        let name = name.map(str::to_owned);
        blocking!(self, |queue| queue.retry_dead(name.as_deref()))
    }

    /// [`Queue::prune_state`].
    ///
    /// # Errors
    /// As [`Queue::prune_state`] and [`AsyncQueue::enqueue`].
    pub async fn prune_state(
        &self,
        finished_before: DateTime<Utc>,
        state: JobState,
    ) -> Result<u64> {
        blocking!(self, |queue| queue.prune_state(finished_before, state))
    }

    /// [`Queue::pause_schedule`].
    ///
    /// # Errors
    /// As [`Queue::pause_schedule`] and [`AsyncQueue::enqueue`].
    pub async fn pause_schedule(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.pause_schedule(&name))
    }

    /// [`Queue::resume_schedule`].
    ///
    /// # Errors
    /// As [`Queue::resume_schedule`] and [`AsyncQueue::enqueue`].
    pub async fn resume_schedule(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.resume_schedule(&name))
    }

    /// [`Queue::delete_schedule`].
    ///
    /// # Errors
    /// As [`Queue::delete_schedule`] and [`AsyncQueue::enqueue`].
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.delete_schedule(&name))
    }

    /// [`Queue::get_schedule`].
    ///
    /// # Errors
    /// As [`Queue::get_schedule`] and [`AsyncQueue::enqueue`].
    pub async fn get_schedule(&self, name: &str) -> Result<Schedule> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.get_schedule(&name))
    }

    /// [`Queue::list_schedules`].
    ///
    /// # Errors
    /// As [`Queue::list_schedules`] and [`AsyncQueue::enqueue`].
    pub async fn list_schedules(&self) -> Result<Vec<Schedule>> {
        blocking!(self, |queue| queue.list_schedules())
    }

    /// [`Queue::next_ticks`] of the stored schedule `name`.
    ///
    /// # Errors
    /// As [`Queue::next_ticks`] and [`AsyncQueue::enqueue`].
    pub async fn next_ticks(&self, name: &str, n: usize) -> Result<Vec<Tick>> {
        let name = name.to_owned();
        blocking!(self, |queue| queue.next_ticks(name.as_str(), n))
    }

    /// [`Ops::counts_by_queue`](crate::Ops::counts_by_queue).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn counts_by_queue(&self, cap: u64) -> Result<QueueCounts> {
        blocking!(self, |queue| queue.ops().counts_by_queue(cap))
    }

    /// [`Ops::list_state`](crate::Ops::list_state).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn list_state(&self, state: JobState, limit: usize) -> Result<Vec<Job>> {
        blocking!(self, |queue| queue.ops().list_state(state, limit))
    }

    /// [`Ops::page`](crate::Ops::page).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn page(&self, page: JobPage) -> Result<Vec<Job>> {
        blocking!(self, |queue| queue.ops().page(&page))
    }

    /// [`Ops::holding_unique_key`](crate::Ops::holding_unique_key).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn holding_unique_key(&self, unique_key: String) -> Result<Option<Job>> {
        blocking!(self, |queue| queue.ops().holding_unique_key(&unique_key))
    }

    /// [`Ops::activity`](crate::Ops::activity).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn activity(
        &self,
        slices: usize,
        width: std::time::Duration,
        cap: u64,
    ) -> Result<Vec<ActivityBucket>> {
        blocking!(self, |queue| queue.ops().activity(slices, width, cap))
    }

    /// [`Ops::finished_since`](crate::Ops::finished_since).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        blocking!(self, |queue| queue.ops().finished_since(since))
    }

    /// [`Ops::unfinished`](crate::Ops::unfinished).
    ///
    /// # Errors
    /// As that method and [`AsyncQueue::enqueue`].
    pub async fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
        let kinds: Option<Vec<String>> = kinds.map(|k| k.iter().map(|k| (*k).to_owned()).collect());
        blocking!(self, |queue| {
            let queues: Vec<&str> = queues.iter().map(String::as_str).collect();
            let kinds: Option<Vec<&str>> = kinds
                .as_ref()
                .map(|k| k.iter().map(String::as_str).collect());
            queue.ops().unfinished(&queues, kinds.as_deref())
        })
    }
}
