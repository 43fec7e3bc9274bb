//! Guarantee 4, second half: a job whose worker dies on every attempt (its
//! lease always runs out) does not stay `running` or cycle forever: after
//! exactly `max_attempts` claims the reaper makes it `dead`, with
//! `finished_at` and `last_error` set, and it is never claimed again.

use crate::support::common;

use common::{ms, secs};
use std::time::Duration;
use tickler::{Clock, JobState, NewJob, Queue, RetryPolicy, DEFAULT_MAX_ATTEMPTS};

const LEASE: Duration = Duration::from_secs(30);

/// Claims the job, lets its lease run out and the longest possible backoff
/// pass, then reaps; until a claim comes back empty. Returns the number of
/// claims.
fn crash_every_time(queue: &Queue, clock: &tickler::ManualClock, limit: u32) -> u32 {
    let cap = queue.retry_policy().cap;
    let mut claims = 0;
    loop {
        let leases = queue
            .manual()
            .claim("default", "doomed", 10, LEASE)
            .unwrap();
        if leases.is_empty() {
            return claims;
        }
        assert_eq!(leases.len(), 1);
        claims += 1;
        assert_eq!(
            leases[0].attempt, claims,
            "attempt numbers must count claims"
        );
        assert!(claims <= limit, "claimed more than {limit} times");
        // The worker dies: no heartbeat, no outcome.
        clock.advance(LEASE + ms(1));
        assert_eq!(queue.manual().reap().unwrap(), 1);
        clock.advance(cap + ms(1));
    }
}

fn assert_dead_for_good(queue: &Queue, clock: &tickler::ManualClock, id: tickler::JobId) {
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead, "{job:?}");
    assert!(job.finished_at.is_some(), "dead without finished_at");
    assert!(job.lease_expires_at.is_none(), "dead job still has a lease");
    let error = job.last_error.as_deref().unwrap_or_default();
    assert!(error.contains("lease expired"), "last_error: {error:?}");

    // Much later: still dead, still not claimable, nothing to reap.
    clock.advance(Duration::from_secs(30 * 24 * 3600));
    assert_eq!(queue.manual().reap().unwrap(), 0);
    assert!(queue
        .manual()
        .claim("default", "w", 10, LEASE)
        .unwrap()
        .is_empty());
    assert_eq!(queue.get(id).unwrap(), job);
}

contract! {
fn lease_expiring_every_time_ends_dead_after_max_attempts() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    assert_eq!(queue.retry_policy(), RetryPolicy::default());
    let id = queue
        .enqueue(NewJob::new("crashes").max_attempts(3))
        .unwrap();

    let before_last = {
        // Two claims, each reaped back to waiting.
        for attempt in 1..=2u32 {
            let lease = queue.manual().claim("default", "doomed", 1, LEASE).unwrap();
            assert_eq!(lease.len(), 1);
            assert_eq!(lease[0].attempt, attempt);
            clock.advance(LEASE + ms(1));
            assert_eq!(queue.manual().reap().unwrap(), 1);
            let job = queue.get(id).unwrap();
            assert!(
                matches!(job.state, JobState::Scheduled | JobState::Pending),
                "after attempt {attempt} of 3: {job:?}"
            );
            assert!(job.finished_at.is_none());
            clock.advance(queue.retry_policy().cap + ms(1));
        }
        clock.now()
    };
    // The third and last claim.
    let last = queue.manual().claim("default", "doomed", 1, LEASE).unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].attempt, 3);
    clock.advance(LEASE + ms(1));
    let reaped_at = clock.now();
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let job = queue.get(id).unwrap();
    assert_eq!(job.attempts, 3);
    assert_eq!(job.finished_at, Some(reaped_at));
    assert!(job.run_at <= before_last, "dead job got a new due time");
    assert!(queue.manual().complete(&last[0]).unwrap_err().is_lease_lost());
    assert_dead_for_good(&queue, &clock, id);
}
}

contract! {
fn default_max_attempts_poison_job_dies_after_exactly_that_many_claims() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let id = queue.enqueue(NewJob::new("crashes")).unwrap();
    let claims = crash_every_time(&queue, &clock, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(claims, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(queue.get(id).unwrap().attempts, DEFAULT_MAX_ATTEMPTS);
    assert_dead_for_good(&queue, &clock, id);
}
}

contract! {
fn single_attempt_poison_job_dies_on_first_expiry() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let id = queue
        .enqueue(NewJob::new("crashes").max_attempts(1))
        .unwrap();
    assert_eq!(crash_every_time(&queue, &clock, 1), 1);
    assert_dead_for_good(&queue, &clock, id);
}
}

contract! {
fn poison_job_does_not_hold_up_healthy_jobs() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let poison = queue
        .enqueue(NewJob::new("crashes").max_attempts(3).priority(10))
        .unwrap();
    let mut healthy_done = 0;
    for round in 0..3 {
        queue
            .enqueue(NewJob::new("fine").payload(serde_json::json!(round)))
            .unwrap();
        let leases = queue.manual().claim("default", "w", 10, LEASE).unwrap();
        assert_eq!(leases.len(), 2, "round {round}: {leases:?}");
        assert_eq!(leases[0].job_id, poison, "higher priority first");
        queue.manual().complete(&leases[1]).unwrap();
        healthy_done += 1;
        clock.advance(LEASE + ms(1));
        assert_eq!(queue.manual().reap().unwrap(), 1);
        clock.advance(queue.retry_policy().cap + secs(1));
    }
    assert_eq!(healthy_done, 3);
    assert_dead_for_good(&queue, &clock, poison);
}
}
