//! Jobs under a concurrency limit, and what the limit tests read of them.

use std::time::Duration;
use tickler::{JobId, JobState, Lease, NewJob, Queue};

/// A job of kind `sync` under limit `sync` as a holder of `key`, with 5
/// attempts.
pub fn sync(key: &str) -> NewJob {
    NewJob::new("sync").limit("sync", key).max_attempts(5)
}

/// The job's state now.
pub fn state(queue: &Queue, id: JobId) -> JobState {
    queue.get(id).unwrap().state
}

/// Up to `n` jobs of queue `default`, claimed by hand with a 30 s lease.
pub fn claim(queue: &Queue, n: usize) -> Vec<Lease> {
    claim_in(queue, "default", n)
}

/// Up to `n` jobs of `queue_name`, claimed by hand with a 30 s lease.
pub fn claim_in(queue: &Queue, queue_name: &str, n: usize) -> Vec<Lease> {
    queue
        .manual()
        .claim(queue_name, "w", n, Duration::from_secs(30))
        .unwrap()
}

/// The leases' job ids, in order.
pub fn ids(leases: &[Lease]) -> Vec<JobId> {
    let mut ids: Vec<JobId> = leases.iter().map(|l| l.job_id).collect();
    ids.sort();
    ids
}

/// The weight held of `key` of limit `sync`, as `limit_usage` reads it.
pub fn held(queue: &Queue, key: &str) -> u64 {
    queue
        .limit_usage(Some("sync"))
        .unwrap()
        .iter()
        .find(|u| u.key == key)
        .map_or(0, |u| u.held)
}

/// The most of `at` (instants in ms, in order) in any span of
/// `period_ms`: a span holding the most can be moved to begin at one.
pub fn most_in_a_span(at: &[i64], period_ms: i64) -> usize {
    (0..at.len())
        .map(|i| {
            at[i..]
                .iter()
                .take_while(|t| **t < at[i] + period_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// A job of kind `api` under limit `api` as a start of `key`.
pub fn api(key: &str) -> NewJob {
    NewJob::new("api").limit("api", key).max_attempts(5)
}

/// Claims (up to 100) and completes every job due now; returns the ids
/// started, in claim order.
pub fn run_due(queue: &Queue) -> Vec<JobId> {
    let leases = claim(queue, 100);
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    leases.iter().map(|l| l.job_id).collect()
}
