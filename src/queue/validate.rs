//! Checking a new job before anything is written: the limits and rules
//! of [`Queue::enqueue`]'s errors, the same on every engine.

use super::Queue;
use crate::engine::types::*;
use crate::error::{Error, Result};
use crate::job::NewJob;

/// Deepest nesting of arrays and objects a payload may have (`[[0]]` is 2).
/// serde_json reads at most 128 levels back, SQLite's `json_valid` accepts
/// 1,000: without a limit below both, a payload could be stored that no
/// one can read. Deeper payloads are refused with [`Error::PayloadTooDeep`].
pub const MAX_PAYLOAD_DEPTH: usize = 100;

/// Longest unique_key, in bytes of UTF-8 ([`Error::UniqueKeyTooLong`]).
pub const MAX_UNIQUE_KEY_BYTES: usize = 1024;

/// True if `value` nests arrays and objects more than `limit` levels deep.
/// Iterative, and stops at the first path past `limit`: the value may be
/// far deeper than a recursive walk could follow.
pub(crate) fn json_depth_exceeds(value: &serde_json::Value, limit: usize) -> bool {
    use serde_json::Value;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth + 1 > limit {
            return true;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    false
}
/// A limit's name: not empty, at most [`crate::MAX_LIMIT_NAME_BYTES`].
pub(crate) fn check_limit_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument(
            "limit name is empty: name the limit set with Queue::set_limit".into(),
        ));
    }
    if name.len() > crate::MAX_LIMIT_NAME_BYTES {
        return Err(Error::InvalidArgument(format!(
            "limit name is {} bytes; the longest is {} (MAX_LIMIT_NAME_BYTES)",
            name.len(),
            crate::MAX_LIMIT_NAME_BYTES
        )));
    }
    Ok(())
}

impl Queue {
    pub(crate) fn validate(&self, job: NewJob, now: i64) -> Result<ValidJob> {
        if job.kind.is_empty() {
            return Err(Error::EmptyKind);
        }
        if job.queue.is_empty() {
            return Err(Error::EmptyQueue);
        }
        if job.max_attempts == 0 {
            return Err(Error::InvalidMaxAttempts);
        }
        match job.unique_key.as_deref() {
            Some("") => {
                return Err(Error::InvalidArgument(
                    "unique_key is empty: leave it unset for no deduplication".into(),
                ))
            }
            Some(key) if key.len() > MAX_UNIQUE_KEY_BYTES => {
                return Err(Error::UniqueKeyTooLong {
                    size: key.len(),
                    limit: MAX_UNIQUE_KEY_BYTES,
                })
            }
            _ => {}
        }
        if let Some((name, key)) = &job.limit {
            check_limit_name(name)?;
            if key.len() > crate::MAX_LIMIT_KEY_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "limit key is {} bytes; the longest is {} (MAX_LIMIT_KEY_BYTES)",
                    key.len(),
                    crate::MAX_LIMIT_KEY_BYTES
                )));
            }
        }
        if job.limit_weight == 0 {
            return Err(Error::InvalidArgument(
                "limit_weight is 0: a job takes at least one slot of its limit".into(),
            ));
        }
        if json_depth_exceeds(&job.payload, MAX_PAYLOAD_DEPTH) {
            return Err(Error::PayloadTooDeep {
                limit: MAX_PAYLOAD_DEPTH,
            });
        }
        let payload = serde_json::to_string(&job.payload)?;
        let limit = self.inner.config.max_payload_bytes;
        if payload.len() > limit {
            return Err(Error::PayloadTooLarge {
                size: payload.len(),
                limit,
            });
        }
        let due = match (job.run_at, job.delay) {
            // Any past time means "due now", also one before 1970, which
            // the stored range (ms since 1970) cannot hold.
            (Some(at), _) if at.timestamp_millis() < 0 => Due::Now,
            (Some(at), _) => Due::At(at.timestamp_millis()),
            (None, Some(delay)) => Due::After(delay),
            (None, None) => Due::Now,
        };
        // Refused here, before anything is written; the engine resolves it
        // again against its own "now".
        due.resolve(now)?;
        let timeout_ms = match job.timeout {
            None => None,
            Some(t) => match i64::try_from(t.as_millis()) {
                Ok(ms) if ms > 0 => Some(ms),
                Ok(_) => {
                    return Err(Error::InvalidArgument(
                        "timeout is under 1 ms: leave it unset for no timeout".into(),
                    ))
                }
                Err(_) => return Err(Error::TimeOutOfRange { what: "timeout" }),
            },
        };
        let after = job
            .after
            .iter()
            .map(|&(id, if_fails)| (crate::graph::Parent::Job(id), if_fails))
            .collect();
        let batch = job.batch.map(|b| (b, None));
        Ok(ValidJob {
            job,
            after,
            batch,
            payload,
            due,
            timeout_ms,
        })
    }

    /// Checks `job` as [`Queue::enqueue`] would, without storing anything:
    /// lets a caller importing many jobs say which one is bad before a
    /// batch is written.
    ///
    /// # Errors
    /// The input errors of [`Queue::enqueue`].
    pub fn validate_job(&self, job: &NewJob) -> Result<()> {
        self.validate(job.clone(), self.now_ms()).map(|_| ())
    }
}
