//! Batches: jobs collected from any number of calls and processes, then
//! sealed, with callback jobs released once when the last member ends.
//!
//! Not to be confused with [`crate::Queue::enqueue_batch`], which stores
//! many jobs in one transaction and makes no batch of them.

use crate::job::{JobId, NewJob};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The id of a batch ([`crate::Queue::open_batch`]), never reused in the
/// same database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchId(pub i64);

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A batch to open with [`crate::Queue::open_batch`]: an optional
/// description and up to three callback jobs.
///
/// Each callback is stored `waiting` when the batch opens (visible in
/// lists and the dashboard, cancellable), and is decided once, in the
/// transaction in which the sealed batch's last member ends (or the seal,
/// if none is left):
///
/// - `on_success` is released if every member succeeded, else cancelled;
/// - `on_failure` is released if any member ended dead or cancelled, else
///   cancelled;
/// - `on_finish` is released whatever the members did.
///
/// A callback may not have a unique_key nor run after other jobs
/// ([`crate::Error::InvalidArgument`]); other jobs may run after a
/// callback ([`NewJob::after`]), except members of the same batch. A
/// callback cancelled and then retried by hand before its batch finished
/// waits again for the batch's end.
///
/// ```
/// # fn main() -> tickler::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let queue = tickler::Queue::open(dir.path().join("q.db"))?;
/// use tickler::{NewBatch, NewJob};
/// let batch = queue.open_batch(
///     NewBatch::new()
///         .description("campaign 7")
///         .on_finish(NewJob::new("campaign_done")),
/// )?;
/// for to in ["a@example.com", "b@example.com"] {
///     queue.enqueue(NewJob::new("send_mail").payload(to.into()).batch(batch.id))?;
/// }
/// let batch = queue.seal_batch(batch.id)?;
/// assert_eq!((batch.members, batch.remaining), (2, 2));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewBatch {
    pub(crate) description: Option<String>,
    pub(crate) on_success: Option<NewJob>,
    pub(crate) on_failure: Option<NewJob>,
    pub(crate) on_finish: Option<NewJob>,
}

impl NewBatch {
    /// A batch with no description and no callback.
    pub fn new() -> Self {
        NewBatch::default()
    }

    /// Text shown with the batch (the dashboard, `tickler batch`), at most
    /// [`MAX_BATCH_DESCRIPTION_BYTES`].
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// Released when every member succeeded; cancelled otherwise.
    pub fn on_success(mut self, job: NewJob) -> Self {
        self.on_success = Some(job);
        self
    }

    /// Released when any member ended dead or cancelled; cancelled when all
    /// succeeded.
    pub fn on_failure(mut self, job: NewJob) -> Self {
        self.on_failure = Some(job);
        self
    }

    /// Released when the last member ended, however they ended.
    pub fn on_finish(mut self, job: NewJob) -> Self {
        self.on_finish = Some(job);
        self
    }
}

/// The longest [`NewBatch::description`], in bytes.
pub const MAX_BATCH_DESCRIPTION_BYTES: usize = 1024;

/// A batch as stored: its counters are kept in the transactions that add
/// and end its members, so they always add up:
/// `members = remaining + succeeded + dead + cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Its id.
    pub id: BatchId,
    /// Its description, if it was given one.
    pub description: Option<String>,
    /// When it was opened, UTC.
    pub created_at: DateTime<Utc>,
    /// When it was sealed (no member can join after), UTC.
    pub sealed_at: Option<DateTime<Utc>>,
    /// When its callbacks were decided: sealed, and no member left, UTC.
    pub finished_at: Option<DateTime<Utc>>,
    /// Jobs that joined it.
    pub members: u64,
    /// Members that have not ended (a member retried by hand after it
    /// ended counts here again until it ends again).
    pub remaining: u64,
    /// Members that succeeded.
    pub succeeded: u64,
    /// Members that ended dead.
    pub dead: u64,
    /// Members that ended cancelled.
    pub cancelled: u64,
    /// The id of its `on_success` callback, if it has one.
    pub on_success: Option<JobId>,
    /// The id of its `on_failure` callback, if it has one.
    pub on_failure: Option<JobId>,
    /// The id of its `on_finish` callback, if it has one.
    pub on_finish: Option<JobId>,
}

impl Batch {
    /// Its callbacks, in the order success, failure, finish.
    pub fn callbacks(&self) -> Vec<JobId> {
        [self.on_success, self.on_failure, self.on_finish]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Which of its callbacks job `id` is; `None` for a member or
    /// another job.
    pub fn which_callback(&self, id: JobId) -> Option<BatchCallback> {
        [
            (self.on_success, BatchCallback::OnSuccess),
            (self.on_failure, BatchCallback::OnFailure),
            (self.on_finish, BatchCallback::OnFinish),
        ]
        .into_iter()
        .find(|(job, _)| *job == Some(id))
        .map(|(_, role)| role)
    }
}

/// Which callback of its batch a job is ([`NewBatch::on_success`],
/// [`NewBatch::on_failure`], [`NewBatch::on_finish`]); it decides whether
/// the job is released or cancelled when the batch finishes. Shown and
/// serialized as `on_success`, `on_failure`, `on_finish`.
// Named as `NewBatch` names them (`on_success`, ...), which the stored
// text and the pages use too.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchCallback {
    /// Released if every member succeeded, else cancelled.
    OnSuccess,
    /// Released if any member ended dead or cancelled, else cancelled.
    OnFailure,
    /// Released however the members ended.
    OnFinish,
}

/// The name the rules and the engines use.
pub(crate) type Callback = BatchCallback;

impl fmt::Display for BatchCallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl BatchCallback {
    /// Its name as stored and shown: `on_success`, `on_failure`,
    /// `on_finish`.
    pub fn as_str(self) -> &'static str {
        match self {
            Callback::OnSuccess => "on_success",
            Callback::OnFailure => "on_failure",
            Callback::OnFinish => "on_finish",
        }
    }

    pub(crate) fn from_stored(text: &str) -> Option<Callback> {
        match text {
            "on_success" => Some(Callback::OnSuccess),
            "on_failure" => Some(Callback::OnFailure),
            "on_finish" => Some(Callback::OnFinish),
            _ => None,
        }
    }
}

/// A batch's row as the rules read and write it inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchRow {
    pub id: BatchId,
    pub sealed: bool,
    pub finished: bool,
    pub members: i64,
    pub remaining: i64,
    pub succeeded: i64,
    pub dead: i64,
    pub cancelled: i64,
}
