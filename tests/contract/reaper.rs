//! Guarantee 4, the reaper only takes what is really stale: a heartbeat that
//! lands first wins; only leases with `lease_expires_at < now` are taken (a
//! lease expiring exactly now is still held); a reaped job waits out its
//! backoff with its attempt counted and a `last_error` that says why.

use crate::support::common;

use chrono::Duration as ChronoDuration;
use common::{ms, secs, t0};
use tickler::{JobId, JobState, NewJob, Queue};

fn claim_one(queue: &Queue, lease: std::time::Duration) -> tickler::Lease {
    let mut leases = queue.manual().claim("default", "w", 1, lease).unwrap();
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.remove(0)
}

contract! { poolers:
fn heartbeat_that_lands_first_wins() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("long")).unwrap();
    let lease = claim_one(&queue, secs(10));
    assert_eq!(lease.lease_expires_at, t0() + ChronoDuration::seconds(10));

    clock.advance(secs(9));
    let renewed = queue.manual().heartbeat(&lease, secs(10)).unwrap();
    assert_eq!(renewed, t0() + ChronoDuration::seconds(19));

    // Past the first expiry, before the renewed one: nothing to reap.
    clock.advance(secs(5));
    assert_eq!(queue.manual().reap().unwrap(), 0, "reaper took a renewed lease");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.run_token.as_ref(), Some(&lease.run_token));
    assert_eq!(job.lease_expires_at, Some(renewed));

    // At the renewed expiry the lease is still held; one millisecond later not.
    clock.set(renewed);
    assert_eq!(
        queue.manual().reap().unwrap(),
        0,
        "lease expiring exactly now was reaped"
    );
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);
    clock.advance(ms(1));
    assert_eq!(queue.manual().reap().unwrap(), 1, "expired lease was not reaped");
    let job = queue.get(id).unwrap();
    assert_ne!(job.state, JobState::Running);
    assert!(queue.manual().complete(&lease).unwrap_err().is_lease_lost());
}
}

contract! { poolers:
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
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_eq!(running(&queue), vec![10, 15, 20, 30]);

    // One millisecond later the 10 s lease is expired too.
    clock.advance(ms(1));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_eq!(running(&queue), vec![15, 20, 30]);

    // Nothing new at the same instant: reaping is idempotent.
    assert_eq!(queue.manual().reap().unwrap(), 0);

    // At t0 + 25 s: the 15 and 20 s leases together.
    clock.set(t0() + ChronoDuration::seconds(25));
    assert_eq!(queue.manual().reap().unwrap(), 2);
    assert_eq!(running(&queue), vec![30]);

    clock.set(t0() + ChronoDuration::seconds(30));
    assert_eq!(
        queue.manual().reap().unwrap(),
        0,
        "lease expiring exactly now was reaped"
    );
    clock.advance(ms(1));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert!(running(&queue).is_empty());
}
}

contract! { poolers:
fn reaped_job_waits_out_backoff_and_keeps_its_attempt() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("flaky").max_attempts(5)).unwrap();
    let first = claim_one(&queue, secs(10));
    assert_eq!(first.attempt, 1);

    clock.advance(secs(11));
    let reaped_at = clock_now(&queue);
    assert_eq!(queue.manual().reap().unwrap(), 1);
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
    assert!(queue.manual().claim("default", "w", 1, secs(10)).unwrap().is_empty());
    clock.advance(ms(1));
    let second = claim_one(&queue, secs(10));
    assert_eq!(second.job_id, id);
    assert_eq!(second.attempt, 2);

    // A second expiry doubles the backoff.
    clock.advance(secs(11));
    let reaped_at = clock_now(&queue);
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, reaped_at + ChronoDuration::seconds(2));
    assert_eq!(job.attempts, 2);
}
}

contract! { poolers:
fn reaper_leaves_other_states_alone() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let done = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = claim_one(&queue, secs(1));
    queue.manual().complete(&lease).unwrap();
    let pending = queue.enqueue(NewJob::new("k")).unwrap();
    let scheduled = queue.enqueue(NewJob::new("k").delay(secs(3600))).unwrap();
    let before: Vec<_> = [done, pending, scheduled]
        .iter()
        .map(|id| queue.get(*id).unwrap())
        .collect();

    clock.advance(secs(600));
    assert_eq!(queue.manual().reap().unwrap(), 0);
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

/// The bugs these guard (from a review):
/// reaper.rs computes the prune cutoff as
/// `now - chrono::Duration::from_std(age).unwrap_or_default()`.
/// - An age too large for chrono's TimeDelta (e.g. `Duration::MAX`, "keep
///   for ever") becomes ZERO: every finished job is deleted at once.
/// - An age that fits TimeDelta but not the calendar (e.g. 10^13 s) makes
///   `DateTime - TimeDelta` panic inside the reaper thread: the thread dies
///   and nothing is reaped any more, so jobs of dead workers stay `running`
///   for ever.
mod prune_ages_past_the_calendar {
    use crate::support::common;

    use chrono::Utc;
    use std::sync::Arc;
    use std::time::Duration;
    use tickler::{Durability, JobState, ManualClock, NewJob, Queue, Reaper, ReaperConfig};

    fn queue(dir: &tempfile::TempDir, clock: Arc<ManualClock>) -> Queue {
        Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .clock(clock)
            .open()
            .unwrap()
    }

    contract! { poolers:
    /// The bug it guards: see this module's doc (from a review).
    fn keep_for_ever_does_not_prune_everything() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let queue = queue(&dir, clock.clone());
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue
            .manual().claim("default", "w", 1, Duration::from_secs(30))
            .unwrap()
            .remove(0);
        queue.manual().complete(&lease).unwrap();
        clock.advance(Duration::from_secs(60));

        let mut reaper = Reaper::spawn(
            queue.clone(),
            ReaperConfig {
                interval: Duration::from_millis(10),
                prune_finished_after: Some(Duration::MAX),
                ..ReaperConfig::default()
            },
        );
        std::thread::sleep(Duration::from_millis(200));
        reaper.stop();
        let found = queue.get(id);
        eprintln!("job finished a minute ago, prune_finished_after = Duration::MAX: {found:?}");
        assert!(
            found.is_ok(),
            "the job was pruned a minute after it finished"
        );
    }
    }

    contract! { poolers:
    /// The bug it guards: see this module's doc (from a review).
    fn a_very_long_prune_age_does_not_stop_reaping() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let queue = queue(&dir, clock.clone());
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        // The holder dies: its lease is never renewed.
        queue
            .manual().claim("default", "dead-worker", 1, Duration::from_secs(1))
            .unwrap();

        let _reaper = Reaper::spawn(
            queue.clone(),
            ReaperConfig {
                interval: Duration::from_millis(10),
                // ~317 000 years.
                prune_finished_after: Some(Duration::from_secs(10_000_000_000_000)),
                // The manual clock jumps 5 s below; that is not a step to wait out here.
                clock_step_hold: Duration::ZERO,
            },
        );
        std::thread::sleep(Duration::from_millis(100));
        clock.advance(Duration::from_secs(5));
        // A round every 10 ms: a live reaper takes the job within a few
        // rounds, a gone one never (10 s for a loaded machine's rounds).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let state = loop {
            let state = queue.get(id).unwrap().state;
            if state != JobState::Running || std::time::Instant::now() > deadline {
                break state;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        eprintln!("job of a dead worker, lease expired 4 s ago: {state:?}");
        assert_ne!(
            state,
            JobState::Running,
            "the reaper thread is gone; the job is stuck running"
        );
    }
    }
}

/// Failures reported against other job queues, tried on tickler: they pass
/// and stay as regression tests, each naming the report it follows.
mod other_queues_reports {
    use crate::support::common;
    use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
    use tickler::{JobState, NewJob};

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// riverqueue/river#1302 (PR #1373): the rescuer overwrote a job that its
    /// worker completed between the rescuer's fetch and its update.
    fn a_completion_between_the_reapers_two_looks_wins() {
        let (_dir, path) = temp_db();
        let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
        clock.advance(secs(31));
        let now = tickler::Clock::now(&*clock);
        let reaper = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.manual().reap_at(now))
        };
        // The reaper's first look only notes the expired lease; complete in between.
        std::thread::sleep(std::time::Duration::from_millis(30));
        queue.manual().complete(&lease).unwrap();
        assert_eq!(reaper.join().unwrap().unwrap(), 0);
        let job = queue.get(id).unwrap();
        assert_eq!(job.state, JobState::Succeeded);
        assert!(job.errors.is_empty(), "{:?}", job.errors);
    }
    }
}
