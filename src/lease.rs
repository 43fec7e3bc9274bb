//! What a claim hands out.

use crate::job::{JobId, RunToken};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// A claimed job: the right to run it until `lease_expires_at`, proven by
/// `run_token`. Heartbeats extend it; an outcome (complete, fail, snooze)
/// ends it. Once the lease is lost, every use of it returns `Error::LeaseLost`.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// The job.
    pub job_id: JobId,
    /// Its queue.
    pub queue: String,
    /// Which handler runs it.
    pub kind: String,
    /// Its data.
    pub payload: serde_json::Value,
    /// Higher runs first.
    pub priority: i32,
    /// When it was due, UTC.
    pub run_at: DateTime<Utc>,
    /// This claim's attempt number, starting at 1.
    pub attempt: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// The fencing token of this claim.
    pub run_token: RunToken,
    /// When the lease runs out unless renewed, UTC (as of the claim).
    pub lease_expires_at: DateTime<Utc>,
    /// The job's per-run time limit, if it has one.
    pub timeout: Option<Duration>,
    /// Earlier runs of this job given back without counting an attempt,
    /// because their holder was gone before they started (a crash of a
    /// process that had claimed it ahead). A worker pool records the
    /// start of a job with any before its handler runs.
    pub given_back: u32,
    /// The concurrency limit slot this run holds ([`crate::NewJob::limit`]);
    /// it is given up by the fenced statement that ends the lease.
    pub limit: Option<crate::LimitSlot>,
}

impl Lease {
    /// The payload deserialized into `T`.
    ///
    /// # Errors
    /// [`crate::Error::Json`] when the payload does not fit `T`.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> crate::Result<T> {
        Ok(serde_json::from_value(self.payload.clone())?)
    }
}
