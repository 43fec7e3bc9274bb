//! Typed jobs: a payload type tied to its kind and its defaults
//! ([`JobArgs`]), enqueued with [`Queue::enqueue_args`] and run by a
//! handler registered with [`crate::WorkerPoolBuilder::handler_for`].
//!
//! Everything here goes through the public [`Queue`] API, so it works the
//! same on every engine.

use crate::engine::types::AppTx;
use crate::error::Result;
use crate::job::{JobId, NewJob, DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE};
use crate::queue::Queue;
use crate::retry::RetryPolicy;
use crate::schedule::NewSchedule;

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// A job's payload type, tied to its kind and its defaults.
///
/// The payload is the type serialized as JSON; the handler registered
/// with [`crate::WorkerPoolBuilder::handler_for`] gets it back
/// deserialized. Every setting but [`JobArgs::KIND`] has a default, and
/// each can be computed from the args (a unique key from an id in them,
/// say). [`NewJob::from_args`] gives a [`NewJob`] to adjust further (a
/// delay, a due time) before [`Queue::enqueue`].
///
/// ```
/// use std::time::Duration;
/// use serde::{Deserialize, Serialize};
/// use tickler::{JobArgs, RetryPolicy};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail {
///     user_id: u64,
///     template: String,
/// }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
///
///     fn queue(&self) -> String {
///         "mail".into()
///     }
///
///     fn max_attempts(&self) -> u32 {
///         5
///     }
///
///     // One welcome mail per user while one is waiting or running.
///     fn unique_key(&self) -> Option<String> {
///         Some(format!("email:{}:{}", self.template, self.user_id))
///     }
///
///     // At most as many mails at once per template as the limit
///     // "mail-template" allows (see `Queue::set_limit`).
///     fn limit(&self) -> Option<(String, String)> {
///         Some(("mail-template".into(), self.template.clone()))
///     }
///
///     fn retry_policy() -> Option<RetryPolicy> {
///         Some(RetryPolicy { base: Duration::from_secs(30), ..RetryPolicy::default() })
///     }
/// }
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + 'static {
    /// The kind: which handler runs these jobs. Not empty.
    const KIND: &'static str;

    /// The queue (default [`DEFAULT_QUEUE`], `"default"`).
    fn queue(&self) -> String {
        DEFAULT_QUEUE.to_owned()
    }

    /// Priority, higher runs first (default 0).
    fn priority(&self) -> i32 {
        0
    }

    /// Claims allowed before the job is dead (default
    /// [`DEFAULT_MAX_ATTEMPTS`], 25; at least 1).
    fn max_attempts(&self) -> u32 {
        DEFAULT_MAX_ATTEMPTS
    }

    /// Per-run time limit (default none); see [`NewJob::timeout`].
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Deduplication key computed from the args (default none); see
    /// [`NewJob::unique_key`].
    fn unique_key(&self) -> Option<String> {
        None
    }

    /// The concurrency limit and key the job runs under (default none),
    /// computed from the args: one sync per account is
    /// `Some(("sync".into(), self.account_id.to_string()))`; see
    /// [`NewJob::limit`].
    fn limit(&self) -> Option<(String, String)> {
        None
    }

    /// The slots of its limit the job takes (default 1); see
    /// [`NewJob::limit_weight`].
    fn limit_weight(&self) -> u32 {
        1
    }

    /// Backoff after a failed attempt of this kind (default `None`: the
    /// queue's [`crate::QueueBuilder::retry_policy`]). Applied by the
    /// worker pool that runs the kind's handler (see
    /// [`crate::WorkerPoolBuilder::retry_policy_for`] for where it does and
    /// does not reach).
    fn retry_policy() -> Option<RetryPolicy> {
        None
    }
}

impl NewJob {
    /// A job of kind `A::KIND` whose payload is `args` as JSON, with the
    /// settings `args` gives ([`JobArgs`]); the setters still apply after.
    ///
    /// # Errors
    /// [`crate::Error::Json`] if `args` cannot be serialized (a map with
    /// non-string keys, a failing `Serialize` impl).
    pub fn from_args<A: JobArgs>(args: &A) -> Result<NewJob> {
        let mut job = NewJob::new(A::KIND)
            .payload(serde_json::to_value(args)?)
            .queue(args.queue())
            .priority(args.priority())
            .max_attempts(args.max_attempts());
        if let Some(timeout) = args.timeout() {
            job = job.timeout(timeout);
        }
        if let Some(key) = args.unique_key() {
            job = job.unique_key(key);
        }
        if let Some((name, key)) = args.limit() {
            job = job.limit(name, key).limit_weight(args.limit_weight());
        }
        Ok(job)
    }
}

impl NewSchedule {
    /// A schedule `name` firing on `cron` whose ticks enqueue jobs of kind
    /// `A::KIND` with `args` as their payload, on the queue and with the
    /// priority, attempts and timeout `args` gives ([`JobArgs`]), so that
    /// the kind and the payload cannot disagree. The other settings are
    /// [`NewSchedule::new`]'s, and its setters still apply. `args`'s
    /// limit and weight are the schedule's ([`NewSchedule::limit`]), so a
    /// tick's job waits for the slot its kind's other jobs share. `args`'s
    /// unique key is not used: each tick's job has the schedule's own.
    ///
    /// ```
    /// use serde::{Deserialize, Serialize};
    /// use tickler::{JobArgs, NewSchedule};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Backup {}
    ///
    /// impl JobArgs for Backup {
    ///     const KIND: &'static str = "backup";
    /// }
    ///
    /// let nightly = NewSchedule::for_args("nightly", "0 3 * * *", &Backup {})?
    ///     .time_zone("Europe/Berlin");
    /// # Ok::<(), tickler::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::Json`] if `args` cannot be serialized. The cron
    /// expression and the time zone are checked when the schedule is
    /// stored ([`Queue::upsert_schedule`]).
    pub fn for_args<A: JobArgs>(
        name: impl Into<String>,
        cron: impl Into<String>,
        args: &A,
    ) -> Result<NewSchedule> {
        let mut schedule = NewSchedule::new(name, cron, A::KIND)
            .payload(serde_json::to_value(args)?)
            .queue(args.queue())
            .priority(args.priority())
            .max_attempts(args.max_attempts());
        if let Some(timeout) = args.timeout() {
            schedule = schedule.timeout(timeout);
        }
        if let Some((name, key)) = args.limit() {
            schedule = schedule.limit(name, key).limit_weight(args.limit_weight());
        }
        Ok(schedule)
    }
}

/// Typed enqueue: the same contract as the untyped calls they wrap.
impl Queue {
    /// Stores one job of kind `A::KIND` with `args` as its payload
    /// ([`NewJob::from_args`]) and returns its id; as [`Queue::enqueue`].
    ///
    /// # Errors
    /// [`crate::Error::Json`] if `args` cannot be serialized; otherwise as
    /// [`Queue::enqueue`] (nothing is stored on error).
    pub fn enqueue_args<A: JobArgs>(&self, args: &A) -> Result<JobId> {
        self.enqueue(NewJob::from_args(args)?)
    }

    /// Stores one job per element of `args` in one transaction, all or
    /// none; ids in input order. As [`Queue::enqueue_batch`].
    ///
    /// # Errors
    /// As [`Queue::enqueue_args`]; any bad element refuses the whole batch.
    pub fn enqueue_args_batch<A: JobArgs>(&self, args: &[A]) -> Result<Vec<JobId>> {
        let jobs = args.iter().map(NewJob::from_args).collect::<Result<_>>()?;
        self.enqueue_batch(jobs)
    }

    /// Writes one job of kind `A::KIND` inside the caller's transaction
    /// `tx`; as [`Queue::enqueue_tx`] (the job exists if and only if the
    /// caller commits).
    ///
    /// # Errors
    /// As [`Queue::enqueue_tx`], and [`crate::Error::Json`] if `args`
    /// cannot be serialized (nothing written, the transaction usable).
    pub fn enqueue_args_tx<'a, 'b: 'a, A: JobArgs>(
        &self,
        tx: impl AppTx<'a, 'b>,
        args: &A,
    ) -> Result<JobId> {
        self.enqueue_tx(tx, NewJob::from_args(args)?)
    }

    /// [`Queue::enqueue_args_tx`] for several args: all or none, in the
    /// caller's transaction; ids in input order.
    ///
    /// # Errors
    /// As [`Queue::enqueue_args_tx`].
    pub fn enqueue_args_batch_tx<'a, 'b: 'a, A: JobArgs>(
        &self,
        tx: impl AppTx<'a, 'b>,
        args: &[A],
    ) -> Result<Vec<JobId>> {
        let jobs = args.iter().map(NewJob::from_args).collect::<Result<_>>()?;
        self.enqueue_batch_tx(tx, jobs)
    }
}
