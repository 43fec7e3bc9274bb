//! A forward step of the wall clock (NTP at boot on a box without a
//! real-time clock) makes every live lease look expired. The reaper thread
//! notices the step (wall time moved further than monotonic time) and holds
//! off for `clock_step_hold`, so holders that are alive renew their leases
//! from the new time; a holder that is really gone is still taken back once
//! the hold is over.

use crate::support::common;

use chrono::Utc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{Durability, JobState, ManualClock, NewJob, Queue, Reaper, ReaperConfig};

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

contract! {
fn reaper_holds_off_after_a_forward_step_then_takes_only_the_silent_holder() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let queue = Queue::builder(common::engine::target(&dir.path().join("step.db")))
        .sqlite(|o| o.durability(Durability::Normal))
        .clock(clock.clone())
        .open()
        .unwrap();
    let alive = queue.enqueue(NewJob::new("k")).unwrap();
    let silent = queue.enqueue(NewJob::new("k")).unwrap();
    let leases = queue
        .manual().claim("default", "w", 2, Duration::from_secs(10))
        .unwrap();
    assert_eq!(leases.len(), 2);
    let alive_lease = leases.iter().find(|l| l.job_id == alive).unwrap();

    let hold = Duration::from_millis(800);
    let _reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: Duration::from_millis(10),
            clock_step_hold: hold,
            ..ReaperConfig::default()
        },
    );
    std::thread::sleep(Duration::from_millis(100));

    // The clock is stepped one hour forward: both leases now look expired.
    clock.advance(Duration::from_secs(3600));
    let stepped = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    assert!(stepped.elapsed() < hold, "the test itself ran too slowly");
    assert_eq!(queue.get(alive).unwrap().state, JobState::Running);
    assert_eq!(queue.get(silent).unwrap().state, JobState::Running);

    // The live holder renews from the new time during the hold.
    queue
        .manual().heartbeat(alive_lease, Duration::from_secs(10))
        .unwrap();

    // After the hold the silent holder's job is taken back, the live one kept.
    wait_until(
        "the silent holder's job is reaped",
        Duration::from_secs(10),
        || queue.get(silent).unwrap().state != JobState::Running,
    );
    assert!(stepped.elapsed() >= hold, "reaped during the hold");
    let kept = queue.get(alive).unwrap();
    assert_eq!(kept.state, JobState::Running);
    assert_eq!(kept.run_token.as_ref(), Some(&alive_lease.run_token));
    queue.manual().complete(alive_lease).unwrap();
}
}

contract! {
fn without_a_step_expired_leases_are_reaped_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder(common::engine::target(&dir.path().join("nostep.db")))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .unwrap();
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    queue
        .manual().claim("default", "w", 1, Duration::from_millis(50))
        .unwrap();
    let started = Instant::now();
    let _reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: Duration::from_millis(10),
            clock_step_hold: Duration::from_secs(30),
            ..ReaperConfig::default()
        },
    );
    wait_until(
        "the expired lease is reaped",
        Duration::from_secs(10),
        || queue.get(id).unwrap().state != JobState::Running,
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a normal expiry must not wait for the clock-step hold"
    );
}
}

/// A regression test from a hunt through other queues' reports: its doc says the bug it guards.
mod a_forward_step_and_a_pools_reaper {
    use crate::support::pool;

    use pool::{secs, temp_db, Recorder};
    use std::sync::Arc;
    use tickler::{Durability, JobState, ManualClock, Queue};

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// OptimalBits/bull "jobs stalled after the
    /// machine slept" / BullMQ stalled-job reports: after the wall clock jumps
    /// forward every live lease looks expired. tickler's reaper holds off for
    /// `clock_step_hold` (15 s by default), but a pool starts its own reaper
    /// with that default whatever its heartbeat interval (a third of its
    /// lease): with `lease(60 s)` the first heartbeat after the step comes up
    /// to 20 s later, after the hold.
    fn a_forward_step_does_not_cost_a_live_holder_its_job() {
        let (_dir, path) = temp_db();
        let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
        let queue = Queue::builder(pool::engine::target(&path))
            .clock(clock.clone())
            .sqlite(|o| o.durability(Durability::Normal))
            .open()
            .unwrap();
        let rec = Recorder::new();
        let (mut pool, id) = pool::one_blocked_job(&queue, &rec, secs(60));
        let token = queue.get(id).unwrap().run_token;
        // NTP steps the clock of a box without an RTC, or the box resumes
        // from suspend: 10 minutes forward.
        clock.advance(std::time::Duration::from_secs(600));
        std::thread::sleep(secs(19));
        let job = queue.get(id).unwrap();
        rec.gate.open();
        pool.shutdown(secs(5));
        assert!(
            job.state == JobState::Running && job.run_token == token,
            "the live holder lost its job: state {}, last_error {:?}",
            job.state,
            job.last_error
        );
    }
    }
}
