//! What a handler is ([`Handler`]) and how it ends a job other than by
//! succeeding ([`JobError`]).

use super::context::JobContext;
use chrono::{DateTime, Utc};

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
/// `Fn(&JobContext) -> Result<(), JobError> + Send + Sync`.
pub trait Handler: Send + Sync + 'static {
    /// Runs one job. `Ok` completes it; see [`JobError`] for the rest. A
    /// panic counts as [`JobError::Retry`] with the panic message.
    fn run(&self, ctx: &JobContext) -> Result<(), JobError>;
}

impl<F> Handler for F
where
    F: Fn(&JobContext) -> Result<(), JobError> + Send + Sync + 'static,
{
    fn run(&self, ctx: &JobContext) -> Result<(), JobError> {
        self(ctx)
    }
}
