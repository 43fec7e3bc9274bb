//! What a handler is ([`Handler`]), what it returns when its job succeeds
//! (an output, stored with the success), and how it ends a job other than
//! by succeeding ([`JobError`]).

use super::context::JobContext;
use crate::job::Output;
use chrono::{DateTime, Utc};
use serde::Serialize;

/// How a handler ends a job other than by succeeding.
#[derive(Debug, Clone, PartialEq)]
pub enum JobError {
    /// The attempt failed: retry after backoff while attempts are left,
    /// then dead.
    Retry(String),
    /// Failed for good: dead now.
    Permanent(String),
    /// Not now: run again at this time (UTC); the attempt is given back.
    Snooze(DateTime<Utc>),
}

impl JobError {
    /// [`JobError::Retry`] with this message.
    pub fn retry(message: impl std::fmt::Display) -> Self {
        JobError::Retry(message.to_string())
    }

    /// [`JobError::Permanent`] with this message.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        JobError::Permanent(message.to_string())
    }
}

/// Any error turns into a retryable failure, so handlers can use `?`.
impl<E: std::error::Error> From<E> for JobError {
    fn from(e: E) -> Self {
        JobError::Retry(e.to_string())
    }
}

/// Runs jobs of one kind. Implemented for every
/// `Fn(&JobContext) -> Result<O, JobError> + Send + Sync` whose `O` is
/// [`Serialize`]: `()` for a job with nothing to return, or what the job
/// produced (a path, a count, a struct), stored as its
/// [`Job::output`](crate::Job::output) in the statement that marks it
/// succeeded and read by [`Queue::wait`](crate::Queue::wait).
///
/// ```
/// use tickler::{JobContext, JobError};
///
/// // A closure is a handler; this one returns where it wrote the file.
/// let export = |ctx: &JobContext| -> Result<String, JobError> {
///     let name = ctx.payload()["name"].as_str().unwrap_or("out");
///     Ok(format!("exports/{name}.mp4"))
/// };
/// # fn is_handler(_: &impl tickler::Handler) {}
/// # is_handler(&export);
/// ```
pub trait Handler: Send + Sync + 'static {
    /// What a run returns when its job succeeds: `()` stores nothing;
    /// anything else is stored as JSON, at most
    /// [`MAX_OUTPUT_BYTES`](crate::MAX_OUTPUT_BYTES). One that cannot be
    /// stored (too large, or its `Serialize` fails) makes the job dead
    /// with an error that says so: it would most likely be the same again.
    type Output: Serialize;

    /// Runs one job. `Ok` completes it with its output; see [`JobError`]
    /// for the rest. A panic counts as [`JobError::Retry`] with the panic
    /// message.
    fn run(&self, ctx: &JobContext) -> Result<Self::Output, JobError>;
}

impl<F, O> Handler for F
where
    F: Fn(&JobContext) -> Result<O, JobError> + Send + Sync + 'static,
    O: Serialize,
{
    type Output = O;

    fn run(&self, ctx: &JobContext) -> Result<O, JobError> {
        self(ctx)
    }
}

/// A handler as a pool keeps it, whatever its output type.
pub(crate) trait RunJob: Send + Sync + 'static {
    /// Runs one job; `Ok` with the output to store, if any.
    fn run_job(&self, ctx: &JobContext) -> Result<Option<Output>, JobError>;
}

impl<H: Handler> RunJob for H {
    fn run_job(&self, ctx: &JobContext) -> Result<Option<Output>, JobError> {
        output_of(&self.run(ctx)?)
    }
}

/// A successful run's output as it is stored: `None` for `()`; one that
/// cannot be stored fails the job for good, with the reason.
pub(crate) fn output_of<O: Serialize + ?Sized>(output: &O) -> Result<Option<Output>, JobError> {
    Output::new(output).map_err(|e| {
        JobError::Permanent(match e {
            // Error::Json's own text speaks of a payload; this is the output.
            crate::Error::Json(e) => {
                format!("the job succeeded, but its output is not storable as JSON: {e}")
            }
            e => format!("the job succeeded, but {e}"),
        })
    })
}
