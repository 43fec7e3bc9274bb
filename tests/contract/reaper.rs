//! Guarantee 4, the reaper only takes what is really stale: a heartbeat that
//! lands first wins; only leases with `lease_expires_at < now` are taken (a
//! lease expiring exactly now is still held); a reaped job waits out its
//! backoff with its attempt counted and a `last_error` that says why.

use crate::support::common;

use chrono::Duration as ChronoDuration;
use common::{ms, secs, t0};
use tickler::{JobId, JobState, NewJob, Queue};

fn claim_one(queue: &Queue, lease: std::time::Duration) -> tickler::Lease {
    let mut leases = queue.claim("default", "w", 1, lease).unwrap();
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.remove(0)
}

contract! {
fn heartbeat_that_lands_first_wins() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("long")).unwrap();
    let lease = claim_one(&queue, secs(10));
    assert_eq!(lease.lease_expires_at, t0() + ChronoDuration::seconds(10));

    clock.advance(secs(9));
    let renewed = queue.heartbeat(&lease, secs(10)).unwrap();
    assert_eq!(renewed, t0() + ChronoDuration::seconds(19));

    // Past the first expiry, before the renewed one: nothing to reap.
    clock.advance(secs(5));
    assert_eq!(queue.reap().unwrap(), 0, "reaper took a renewed lease");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.run_token.as_ref(), Some(&lease.run_token));
    assert_eq!(job.lease_expires_at, Some(renewed));

    // At the renewed expiry the lease is still held; one millisecond later not.
    clock.set(renewed);
    assert_eq!(
        queue.reap().unwrap(),
        0,
        "lease expiring exactly now was reaped"
    );
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);
    clock.advance(ms(1));
    assert_eq!(queue.reap().unwrap(), 1, "expired lease was not reaped");
    let job = queue.get(id).unwrap();
    assert_ne!(job.state, JobState::Running);
    assert!(queue.complete(&lease).unwrap_err().is_lease_lost());
}
}

contract! {
fn reaper_takes_exactly_the_expired_leases() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    // Lease lengths in seconds, one job each, all claimed at t0.
    let lengths = [5u64, 10, 15, 20, 30];
    let mut held: Vec<(u64, JobId)> = Vec::new();
    for len in lengths {
        queue.enqueue(NewJob::new("k")).unwrap();
        let lease = claim_one(&queue, secs(len));
        held.push((len, lease.job_id));
    }
    let running = |queue: &Queue| -> Vec<u64> {
        held.iter()
            .filter(|(_, id)| queue.get(*id).unwrap().state == JobState::Running)
            .map(|(len, _)| *len)
            .collect()
    };

    // At t0 + 10 s: the 5 s lease is expired; the 10 s lease expires exactly
    // now (lease_expires_at == now), which is not expired yet.
    clock.set(t0() + ChronoDuration::seconds(10));
    assert_eq!(queue.reap().unwrap(), 1);
    assert_eq!(running(&queue), vec![10, 15, 20, 30]);

    // One millisecond later the 10 s lease is expired too.
    clock.advance(ms(1));
    assert_eq!(queue.reap().unwrap(), 1);
    assert_eq!(running(&queue), vec![15, 20, 30]);

    // Nothing new at the same instant: reaping is idempotent.
    assert_eq!(queue.reap().unwrap(), 0);

    // At t0 + 25 s: the 15 and 20 s leases together.
    clock.set(t0() + ChronoDuration::seconds(25));
    assert_eq!(queue.reap().unwrap(), 2);
    assert_eq!(running(&queue), vec![30]);

    clock.set(t0() + ChronoDuration::seconds(30));
    assert_eq!(
        queue.reap().unwrap(),
        0,
        "lease expiring exactly now was reaped"
    );
    clock.advance(ms(1));
    assert_eq!(queue.reap().unwrap(), 1);
    assert!(running(&queue).is_empty());
}
}

contract! {
fn reaped_job_waits_out_backoff_and_keeps_its_attempt() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("flaky").max_attempts(5)).unwrap();
    let first = claim_one(&queue, secs(10));
    assert_eq!(first.attempt, 1);

    clock.advance(secs(11));
    let reaped_at = clock_now(&queue);
    assert_eq!(queue.reap().unwrap(), 1);
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled, "{job:?}");
    // Backoff after attempt 1 is base = 1 s (no jitter).
    assert_eq!(job.run_at, reaped_at + ChronoDuration::seconds(1));
    assert!(job.run_at > reaped_at);
    assert_eq!(job.attempts, 1, "reaping gave the attempt back");
    assert!(job.finished_at.is_none());
    assert!(job.lease_expires_at.is_none(), "{job:?}");
    let error = job.last_error.as_deref().unwrap_or_default();
    assert!(error.contains("lease expired"), "last_error: {error:?}");

    // Not claimable before the backoff ends, claimable right at its end.
    clock.advance(ms(999));
    assert!(queue.claim("default", "w", 1, secs(10)).unwrap().is_empty());
    clock.advance(ms(1));
    let second = claim_one(&queue, secs(10));
    assert_eq!(second.job_id, id);
    assert_eq!(second.attempt, 2);

    // A second expiry doubles the backoff.
    clock.advance(secs(11));
    let reaped_at = clock_now(&queue);
    assert_eq!(queue.reap().unwrap(), 1);
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, reaped_at + ChronoDuration::seconds(2));
    assert_eq!(job.attempts, 2);
}
}

contract! {
fn reaper_leaves_other_states_alone() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let done = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = claim_one(&queue, secs(1));
    queue.complete(&lease).unwrap();
    let pending = queue.enqueue(NewJob::new("k")).unwrap();
    let scheduled = queue.enqueue(NewJob::new("k").delay(secs(3600))).unwrap();
    let before: Vec<_> = [done, pending, scheduled]
        .iter()
        .map(|id| queue.get(*id).unwrap())
        .collect();

    clock.advance(secs(600));
    assert_eq!(queue.reap().unwrap(), 0);
    let after: Vec<_> = [done, pending, scheduled]
        .iter()
        .map(|id| queue.get(*id).unwrap())
        .collect();
    assert_eq!(before, after);
}
}

fn clock_now(queue: &Queue) -> chrono::DateTime<chrono::Utc> {
    queue.clock().now()
}
