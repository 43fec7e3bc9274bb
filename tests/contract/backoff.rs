//! Retries wait out an exponential backoff (capped, optionally jittered),
//! computed without overflow for any attempt number; a job that fails with
//! no attempts left is `dead` with the failure message kept.

use crate::support::common;

use chrono::{DateTime, Duration as ChronoDuration, TimeZone, Utc};
use common::{ms, secs};
use std::collections::HashSet;
use std::time::Duration;
use tickler::{Clock, JobState, Lease, NewJob, Queue, RetryPolicy, MAX_TIMESTAMP_MS};

fn claim_one(queue: &Queue) -> Lease {
    let mut leases = queue.manual().claim("default", "w", 1, secs(60)).unwrap();
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.remove(0)
}

fn chrono_of(d: Duration) -> ChronoDuration {
    ChronoDuration::from_std(d).unwrap()
}

contract! {
fn failed_job_waits_exactly_the_backoff_without_jitter() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue
        .enqueue(NewJob::new("flaky").max_attempts(10))
        .unwrap();

    let first = claim_one(&queue);
    assert_eq!(first.attempt, 1);
    clock.advance(secs(3));
    let t = clock.now();
    queue.manual().fail(&first, "boom 1").unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, t + ChronoDuration::seconds(1));
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error.as_deref(), Some("boom 1"));
    assert!(job.finished_at.is_none());

    clock.advance(ms(999));
    assert!(
        queue.manual().claim("default", "w", 1, secs(60)).unwrap().is_empty(),
        "claimed before the backoff ended"
    );
    clock.advance(ms(1));
    let second = claim_one(&queue);
    assert_eq!((second.job_id, second.attempt), (id, 2));

    // Doubling: 2 s after the second failure, then 4 s.
    clock.advance(secs(5));
    let t2 = clock.now();
    queue.manual().fail(&second, "boom 2").unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.run_at, t2 + ChronoDuration::seconds(2));
    assert_eq!(job.last_error.as_deref(), Some("boom 2"));

    clock.advance(ms(1_999));
    assert!(queue.manual().claim("default", "w", 1, secs(60)).unwrap().is_empty());
    clock.advance(ms(1));
    let third = claim_one(&queue);
    assert_eq!(third.attempt, 3);
    let t3 = clock.now();
    queue.manual().fail(&third, "boom 3").unwrap();
    assert_eq!(
        queue.get(id).unwrap().run_at,
        t3 + ChronoDuration::seconds(4)
    );
}
}

contract! {
fn backoff_stops_growing_at_the_cap() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue
        .enqueue(NewJob::new("flaky").max_attempts(20))
        .unwrap();
    let mut delays = Vec::new();
    for _ in 0..9 {
        let lease = claim_one(&queue);
        let t = clock.now();
        queue.manual().fail(&lease, "again").unwrap();
        let run_at = queue.get(id).unwrap().run_at;
        delays.push((run_at - t).num_seconds());
        clock.set(run_at);
    }
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
}
}

contract! {
fn jittered_backoff_stays_within_bounds_and_varies() {
    let policy = RetryPolicy {
        base: secs(1),
        cap: secs(60),
        jitter: true,
    };
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, policy);
    let jobs = (0..100)
        .map(|i| NewJob::new("flaky").payload(serde_json::json!(i)))
        .collect();
    queue.enqueue_batch(jobs).unwrap();

    for attempt in 1..=4u32 {
        let leases = queue.manual().claim("default", "w", 100, secs(60)).unwrap();
        assert_eq!(leases.len(), 100, "attempt {attempt}");
        clock.advance(secs(1));
        let t = clock.now();
        let max = chrono_of(policy.max_delay(attempt));
        let mut seen = HashSet::new();
        for lease in &leases {
            assert_eq!(lease.attempt, attempt);
            queue.manual().fail(lease, "jittery").unwrap();
            let job = queue.get(lease.job_id).unwrap();
            assert!(
                job.run_at >= t && job.run_at <= t + max,
                "attempt {attempt}: run_at {} outside [{t}, {}]",
                job.run_at,
                t + max
            );
            let expected = if job.run_at > t {
                JobState::Scheduled
            } else {
                JobState::Pending
            };
            assert_eq!(job.state, expected, "{job:?}");
            seen.insert(job.run_at);
        }
        assert!(
            seen.len() > 1,
            "attempt {attempt}: 100 jittered retries all got the same time"
        );
        clock.set(t + max);
    }
}
}

contract! {
fn huge_attempt_numbers_never_overflow() {
    let default = RetryPolicy::default();
    for attempt in [64, 10_000, u32::MAX] {
        assert_eq!(default.max_delay(attempt), default.cap, "attempt {attempt}");
        for _ in 0..100 {
            assert!(default.backoff(attempt) <= default.cap, "attempt {attempt}");
        }
    }
    assert_eq!(default.max_delay(0), default.base);
    assert_eq!(default.max_delay(1), default.base);

    let huge = RetryPolicy {
        base: Duration::MAX,
        cap: Duration::MAX,
        jitter: true,
    };
    assert_eq!(huge.max_delay(u32::MAX), Duration::MAX);
    let _ = huge.backoff(u32::MAX);
}
}

contract! {
fn failing_attempt_ten_thousand_waits_the_cap() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue
        .enqueue(NewJob::new("flaky").max_attempts(20_000))
        .unwrap();
    common::engine::execute(
        &path,
        "UPDATE tickler_jobs SET attempts = 9999 WHERE id = ?1",
        &[id.0.into()],
    );
    let lease = claim_one(&queue);
    assert_eq!(lease.attempt, 10_000);
    let t = clock.now();
    queue.manual().fail(&lease, "still failing").unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, t + ChronoDuration::seconds(60));
}
}

contract! {
fn backoff_past_year_9999_is_clamped_not_an_error() {
    let policy = RetryPolicy {
        base: Duration::MAX,
        cap: Duration::MAX,
        jitter: false,
    };
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue_with_policy(&path, policy);
    let id = queue.enqueue(NewJob::new("flaky")).unwrap();
    let lease = claim_one(&queue);
    queue.manual().fail(&lease, "see you in 9999").unwrap();
    let job = queue.get(id).unwrap();
    let last: DateTime<Utc> = Utc.timestamp_millis_opt(MAX_TIMESTAMP_MS).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, last);
}
}

contract! {
fn last_allowed_failure_makes_the_job_dead() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("flaky").max_attempts(2)).unwrap();

    let first = claim_one(&queue);
    queue.manual().fail(&first, "first failure").unwrap();
    assert_eq!(queue.get(id).unwrap().state, JobState::Scheduled);
    clock.advance(secs(1));

    let second = claim_one(&queue);
    assert_eq!(second.attempt, 2);
    let t = clock.now();
    queue.manual().fail(&second, "second failure: disk on fire").unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(
        job.last_error.as_deref(),
        Some("second failure: disk on fire")
    );
    assert_eq!(job.finished_at, Some(t));
    assert_eq!(job.attempts, 2);

    clock.advance(secs(3600));
    assert!(queue
        .manual().claim("default", "w", 10, secs(60))
        .unwrap()
        .is_empty());
    assert_eq!(queue.get(id).unwrap(), job);
}
}

contract! {
fn permanent_failure_is_dead_at_once_whatever_attempts_are_left() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let id = queue.enqueue(NewJob::new("bad").max_attempts(25)).unwrap();
    let lease = claim_one(&queue);
    let t = clock.now();
    queue
        .manual().fail_permanently(&lease, "payload is garbage")
        .unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(job.last_error.as_deref(), Some("payload is garbage"));
    assert_eq!(job.finished_at, Some(t));
    assert_eq!(job.attempts, 1);
    clock.advance(secs(3600 * 24));
    assert!(queue
        .manual().claim("default", "w", 10, secs(60))
        .unwrap()
        .is_empty());
}
}

contract! {
fn snooze_and_release_give_the_attempt_back() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let id = queue.enqueue(NewJob::new("later").max_attempts(1)).unwrap();
    for _ in 0..5 {
        let lease = claim_one(&queue);
        assert_eq!(lease.attempt, 1, "a snooze consumed the attempt");
        let until = clock.now() + ChronoDuration::seconds(30);
        queue.manual().snooze(&lease, until).unwrap();
        let job = queue.get(id).unwrap();
        assert_eq!(
            (job.state, job.run_at, job.attempts),
            (JobState::Scheduled, until, 0)
        );
        clock.advance(ms(29_999));
        assert!(queue.manual().claim("default", "w", 1, secs(60)).unwrap().is_empty());
        clock.advance(ms(1));
    }
    let lease = claim_one(&queue);
    queue.manual().release(&lease).unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
    let lease = claim_one(&queue);
    assert_eq!(lease.attempt, 1);
    queue.manual().fail(&lease, "only try").unwrap();
    assert_eq!(queue.get(id).unwrap().state, JobState::Dead);
}
}
