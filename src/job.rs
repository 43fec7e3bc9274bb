//! Jobs: what is stored ([`Job`]), what is enqueued ([`NewJob`]) and their states.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The id of a job: assigned at enqueue, never reused in the same file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The fencing token of one claim of one job. A fresh random UUID (v4) per
/// claim; every heartbeat and outcome must present it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunToken(pub String);

impl fmt::Display for RunToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a job is in its life. See the state diagram in the crate docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for its `run_at`; becomes [`JobState::Pending`] when due. (The
    /// design's "pending with a future run_at", kept apart so claims never
    /// scan jobs that are not due.)
    Scheduled,
    /// Due and waiting for a worker.
    Pending,
    /// Waiting for the jobs it runs after ([`NewJob::after`]): out of the
    /// claim's way until its last parent's end resolves it, in the
    /// transaction of that end, to pending (or scheduled, if its `run_at`
    /// is still ahead), or to cancelled when a parent failed.
    Waiting,
    /// Due, but waiting for a slot of its concurrency limit
    /// ([`NewJob::limit`]): out of the claim's way until a holder of its
    /// key gives a slot up, which makes it pending in the same transaction.
    Blocked,
    /// Claimed by a worker that holds its lease.
    Running,
    /// Finished successfully (terminal).
    Succeeded,
    /// Failed permanently or used up its attempts (terminal; `retry` revives it).
    Dead,
    /// Cancelled (terminal; `retry` revives it).
    Cancelled,
}

impl JobState {
    /// Every state, in life order.
    pub const ALL: [JobState; 8] = [
        JobState::Waiting,
        JobState::Scheduled,
        JobState::Pending,
        JobState::Blocked,
        JobState::Running,
        JobState::Succeeded,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Waiting => "waiting",
            JobState::Scheduled => "scheduled",
            JobState::Pending => "pending",
            JobState::Blocked => "blocked",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// True for `succeeded`, `dead` and `cancelled`.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                crate::Error::InvalidArgument(format!(
                    "unknown job state {s:?}; expected one of waiting, scheduled, pending, blocked, running, succeeded, dead, cancelled"
                ))
            })
    }
}

/// The queue a job goes to when none is named.
pub const DEFAULT_QUEUE: &str = "default";

/// Attempts a job gets when none is set.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// A job to enqueue. Built with [`NewJob::new`] and the setters below.
///
/// ```
/// use std::time::Duration;
/// let job = tickler::NewJob::new("send_email")
///     .payload(serde_json::json!({"to": "ada@example.com"}))
///     .queue("mail")
///     .priority(10)
///     .delay(Duration::from_secs(60))
///     .max_attempts(5)
///     .unique_key("welcome-mail-42");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub(crate) kind: String,
    pub(crate) payload: serde_json::Value,
    pub(crate) queue: String,
    pub(crate) priority: i32,
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) delay: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) unique_key: Option<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) limit: Option<(String, String)>,
    pub(crate) limit_weight: u32,
    pub(crate) after: Vec<(JobId, IfParentFails)>,
    pub(crate) batch: Option<crate::BatchId>,
}

impl NewJob {
    /// A job of `kind` (the name of the handler that runs it) with a `null`
    /// payload, on queue `"default"`, priority 0, due now, 25 attempts.
    pub fn new(kind: impl Into<String>) -> Self {
        NewJob {
            kind: kind.into(),
            payload: serde_json::Value::Null,
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
            run_at: None,
            delay: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            unique_key: None,
            timeout: None,
            limit: None,
            limit_weight: 1,
            after: Vec::new(),
            batch: None,
        }
    }

    /// The job's data, any JSON value. Limited in size by
    /// `QueueBuilder::max_payload_bytes` (default 1 MiB, as serialized JSON).
    pub fn payload(mut self, payload: serde_json::Value) -> Self {
        self.payload = payload;
        self
    }

    /// The queue (default `"default"`).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Priority: among due jobs of a queue, **higher runs first** (default 0,
    /// any `i32`).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Due time (UTC). Replaces any delay. A time in the past means "due now".
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self.delay = None;
        self
    }

    /// Due `delay` after enqueue (read from the queue's clock). Replaces any run_at.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.run_at = None;
        self
    }

    /// How many claims the job may get before it is `dead` (default 25, at least 1).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Deduplication key: while a job with this key is scheduled, pending or
    /// running, enqueueing another job with the same key inserts nothing and
    /// returns the existing job's id. Keys are global across queues and kinds.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// How long one run may take (milliseconds precision); the worker pool
    /// sets the job's cancellation flag when it passes.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Runs under the concurrency limit `name` (set with
    /// [`Queue::set_limit`](crate::Queue::set_limit)), as one holder of
    /// `key`: at every instant the jobs of that key holding a lease weigh at
    /// most the limit's `max_per_key` together (and those of all its keys
    /// at most its `max_total`). A job that does not fit is
    /// [`JobState::Blocked`] until a slot is free. Weight 1 unless
    /// [`NewJob::limit_weight`] says otherwise. A limit that is not set
    /// (or was deleted) limits nothing.
    ///
    /// ```
    /// let job = tickler::NewJob::new("sync").limit("sync", "account-42");
    /// ```
    pub fn limit(mut self, name: impl Into<String>, key: impl Into<String>) -> Self {
        self.limit = Some((name.into(), key.into()));
        self
    }

    /// How many slots of its limit's key (and total) the job takes while it
    /// runs (default 1, at least 1): a 4K transcode may take both slots of
    /// a box that runs two small ones. Without [`NewJob::limit`] it means
    /// nothing. A weight over the limit can never run: the claim makes such
    /// a job dead, saying why.
    pub fn limit_weight(mut self, weight: u32) -> Self {
        self.limit_weight = weight;
        self
    }

    /// Runs after each of `parents` succeeded: the job is stored
    /// [`JobState::Waiting`] and becomes due in the transaction of its
    /// last parent's success. If a parent ends dead or cancelled, this job
    /// is cancelled, its error naming that parent
    /// ([`IfParentFails::Cancel`]; see [`NewJob::after_with`] for the
    /// others). A parent that already succeeded counts as done; one that
    /// already failed applies its rule at once.
    ///
    /// A parent must exist when this job is stored: an unknown id (also
    /// one not yet assigned) refuses the enqueue with
    /// [`crate::Error::ParentNotFound`] and stores nothing, so edges can
    /// only point back in time and never form a cycle. To store a job and
    /// the jobs that run after it at once, use a [`Graph`](crate::Graph).
    ///
    /// ```
    /// # fn main() -> tickler::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
    /// use tickler::{JobState, NewJob};
    /// let fetch = queue.enqueue(NewJob::new("fetch"))?;
    /// let upload = queue.enqueue(NewJob::new("upload").after(&[fetch]))?;
    /// assert_eq!(queue.get(upload)?.state, JobState::Waiting);
    /// # Ok(()) }
    /// ```
    pub fn after(mut self, parents: &[JobId]) -> Self {
        for parent in parents {
            self = self.after_with(*parent, IfParentFails::Cancel);
        }
        self
    }

    /// Runs after `parent` ends, doing `if_fails` when it ends dead or
    /// cancelled (see [`NewJob::after`]). A second edge to the same parent
    /// replaces the first.
    pub fn after_with(mut self, parent: JobId, if_fails: IfParentFails) -> Self {
        self.after.retain(|(p, _)| *p != parent);
        self.after.push((parent, if_fails));
        self
    }
}

impl NewJob {
    /// Makes the job a member of batch `batch` ([`crate::Queue::open_batch`]),
    /// counted in the transaction that stores it. The insert fails with
    /// [`crate::Error::BatchSealed`] if the batch is sealed, or
    /// [`crate::Error::BatchNotFound`], storing nothing, and with
    /// [`crate::Error::InvalidArgument`] if the job runs after
    /// ([`NewJob::after`]) a callback of the same batch (which waits for
    /// it: neither would ever run). A job whose unique_key is held joins
    /// nothing (the holder is not added); a unique_key given twice in one
    /// call stores one job, which joins the first batch named.
    pub fn batch(mut self, batch: crate::BatchId) -> Self {
        self.batch = Some(batch);
        self
    }
}

/// What a job that runs after another ([`NewJob::after_with`]) does when
/// that parent ends dead or cancelled. A parent's success always counts as
/// done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IfParentFails {
    /// The child is cancelled, its error naming the parent and how it
    /// ended, and so are the jobs that wait on it in turn: nothing is left
    /// waiting silently.
    #[default]
    Cancel,
    /// The child keeps waiting: an operator's [`crate::Queue::retry`] of
    /// the parent that then succeeds releases it, and
    /// [`crate::Queue::cancel`] of the child gives up.
    Hold,
    /// The child runs anyway, once the parent has ended whatever the
    /// result (a cleanup step).
    Run,
}

impl IfParentFails {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            IfParentFails::Cancel => "cancel",
            IfParentFails::Hold => "hold",
            IfParentFails::Run => "run",
        }
    }

    /// The policy stored as `name`, if it is one.
    pub(crate) fn from_stored(name: &str) -> Option<Self> {
        [
            IfParentFails::Cancel,
            IfParentFails::Hold,
            IfParentFails::Run,
        ]
        .into_iter()
        .find(|p| p.as_str() == name)
    }
}

/// One edge of a job that runs after another, as [`crate::Queue::parents`]
/// reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dependency {
    /// The job it runs after.
    pub parent: JobId,
    /// What it does if that parent fails.
    pub if_fails: IfParentFails,
    /// True once the parent's end was taken into account (it succeeded,
    /// or it failed and the rule applied); false while the child waits
    /// on it.
    pub resolved: bool,
}

/// The slot of a concurrency limit a job takes while it holds a lease
/// ([`NewJob::limit`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LimitSlot {
    /// The limit's name.
    pub name: String,
    /// The key within the limit (an account, a device, a remote host).
    pub key: String,
    /// Slots taken, at least 1.
    pub weight: u32,
}

/// A stored job, as read by `Queue::get` and `Queue::list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// The name of the handler that runs it.
    pub kind: String,
    /// Its data.
    pub payload: serde_json::Value,
    /// Its state.
    pub state: JobState,
    /// Higher runs first.
    pub priority: i32,
    /// When it is (or was) due, UTC.
    pub run_at: DateTime<Utc>,
    /// Claims so far (snoozes and releases give theirs back).
    pub attempts: u32,
    /// Claims allowed before it is dead.
    pub max_attempts: u32,
    /// Its deduplication key.
    pub unique_key: Option<String>,
    /// Per-run time limit.
    pub timeout: Option<Duration>,
    /// The run_token of the latest claim.
    pub run_token: Option<RunToken>,
    /// The worker id of the latest claim.
    pub claimed_by: Option<String>,
    /// When the latest claim happened, UTC.
    pub claimed_at: Option<DateTime<Utc>>,
    /// When the current lease runs out (meaningful while running), UTC.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The error of the latest failed attempt (failures, panics, timeouts,
    /// expired leases), cut to [`crate::MAX_ERROR_BYTES`]; cleared when the
    /// job succeeds.
    pub last_error: Option<String>,
    /// Every failed attempt's error, oldest first: the last
    /// [`crate::ERROR_HISTORY_MAX`] of them (older ones are dropped).
    pub errors: Vec<AttemptError>,
    /// What could not be read from this job's row, if anything (a hand
    /// edit, damage, a newer build's data): those fields hold placeholders
    /// (`null`, empty, 0). A claim makes such a job `dead` instead of
    /// handing it out.
    pub unreadable: Option<String>,
    /// When it was enqueued, UTC.
    pub created_at: DateTime<Utc>,
    /// When it reached a terminal state, UTC.
    pub finished_at: Option<DateTime<Utc>>,
    /// What its handler last reported with
    /// [`JobContext::progress`](crate::JobContext::progress), as stored (a
    /// pool writes a running job's progress a few times a second at
    /// most); kept once the job has finished.
    pub progress: Option<Progress>,
    /// The concurrency limit slot it takes while it runs
    /// ([`NewJob::limit`]).
    pub limit: Option<LimitSlot>,
    /// How often a claim deferred it over its limit's rate
    /// ([`Rate`](crate::Rate)): its run_at is then the instant it may
    /// start.
    pub rate_deferrals: u32,
    /// What its handler returned when it succeeded ([`Output`]), stored in
    /// the statement that marked it succeeded: a succeeded job has the
    /// output its handler returned, or none if the handler returned `()`
    /// (JSON `null`). `None` for every other state. Read it as a type with
    /// [`Job::output_as`]; gone when the job is pruned.
    pub output: Option<serde_json::Value>,
    /// The batch it is a member or a callback of ([`NewJob::batch`],
    /// [`crate::Queue::open_batch`]).
    pub batch: Option<crate::BatchId>,
}

impl Job {
    /// [`Job::output`] as a `T` (the handler's return type), or `None`
    /// when there is none.
    ///
    /// # Errors
    /// [`crate::Error::Json`] if the stored output does not fit `T`.
    pub fn output_as<T: serde::de::DeserializeOwned>(&self) -> crate::Result<Option<T>> {
        self.output
            .as_ref()
            .map(|value| T::deserialize(value).map_err(crate::Error::from))
            .transpose()
    }
}

/// The longest output a job's handler may return, as JSON, in bytes
/// (64 KiB): a result a caller awaits (a path, a count, a short report).
/// Store anything bigger elsewhere and return where it is. A handler of a
/// worker pool that returns more fails its job for good (dead) with an
/// error that gives both sizes, as [`Output::new`] refuses it.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// What a handler returned for a job that succeeded, as the JSON text that
/// is stored with the success ([`Job::output`]): checked once, when it is
/// made. A worker pool makes it from its handler's `Ok` value; a
/// [`Manual`](crate::Manual) worker records it with
/// [`Outcome::CompleteWith`](crate::Outcome::CompleteWith).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output(String);

impl Output {
    /// `value` as JSON, or `None` for JSON `null` (a handler returning
    /// `()`: nothing to store).
    ///
    /// ```
    /// let out = tickler::Output::new(&serde_json::json!({"path": "a.mp4"}))?;
    /// assert_eq!(out.unwrap().as_str(), r#"{"path":"a.mp4"}"#);
    /// assert_eq!(tickler::Output::new(&())?, None);
    /// # Ok::<(), tickler::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::OutputTooLarge`] past [`MAX_OUTPUT_BYTES`];
    /// [`crate::Error::Json`] if `value` cannot be serialized (a map with
    /// non-string keys, a failing `Serialize` impl) or its JSON could not
    /// be read back (nested more than 128 levels deep).
    pub fn new<T: Serialize + ?Sized>(value: &T) -> crate::Result<Option<Output>> {
        let text = serde_json::to_string(value)?;
        if text.len() > MAX_OUTPUT_BYTES {
            return Err(crate::Error::OutputTooLarge {
                size: text.len(),
                limit: MAX_OUTPUT_BYTES,
            });
        }
        // Read back as every read of the job will: serde_json writes any
        // nesting but reads at most 128 levels, and a job succeeded with
        // an output no one can read has lost it. Refused now, the job is
        // dead with the reason instead.
        serde_json::from_str::<serde_json::Value>(&text)?;
        Ok((text != "null").then_some(Output(text)))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How far a running job is, as its handler reported it with
/// [`JobContext::progress`](crate::JobContext::progress).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// From 0 (nothing done) to 1 (all done).
    pub fraction: f64,
    /// What it is doing, for a person to read ("exporting video"); at most
    /// [`MAX_PROGRESS_MESSAGE_BYTES`].
    pub message: String,
}

/// The longest progress message [`JobContext::progress`](crate::JobContext::progress) takes, in bytes.
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

/// One failed attempt of a job, as kept in [`Job::errors`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    /// Which attempt failed (from 1; a manual `retry` starts again at 1).
    pub attempt: u32,
    /// When the failure was recorded, UTC.
    pub at: DateTime<Utc>,
    /// The error, cut to [`crate::MAX_ERROR_BYTES`].
    pub error: String,
    /// The worker id that held the job (`claimed_by`), if known.
    pub worker: Option<String>,
}
