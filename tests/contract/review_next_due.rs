//! Review: `Queue::next_due` looks only at the *first pending row in claim
//! order* (priority DESC, run_at, id) and takes its run_at. A pending row's
//! run_at can be later than now after the wall clock steps back (a pending
//! job stays pending). Then a due, lower-priority pending job is hidden:
//! next_due reports a future time, and the worker pool's dispatcher
//! (which trusts next_due before taking the write lock) sleeps instead of
//! claiming the due job, until the clock catches up with the other job.

use crate::support::common;

use chrono::{Duration as CDuration, Utc};
use std::sync::Arc;
use std::time::Duration;
use tickler::{
    Clock, Durability, JobContext, JobError, JobState, ManualClock, NewJob, Queue, WorkerPool,
};

fn setup() -> (
    tempfile::TempDir,
    Queue,
    Arc<ManualClock>,
    tickler::JobId,
    tickler::JobId,
) {
    let dir = tempfile::tempdir().unwrap();
    let start = Utc::now();
    let clock = Arc::new(ManualClock::new(start));
    let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
        .clock(clock.clone())
        .open()
        .unwrap();
    // Both due now, so both are inserted pending.
    let high = queue
        .enqueue(NewJob::new("k").priority(10).run_at(start))
        .unwrap();
    let low = queue
        .enqueue(
            NewJob::new("k")
                .priority(0)
                .run_at(start - CDuration::hours(2)),
        )
        .unwrap();
    // NTP steps the wall clock back one hour.
    clock.set(start - CDuration::hours(1));
    (dir, queue, clock, high, low)
}

contract! {
fn next_due_sees_a_due_lower_priority_pending_job() {
    let (_dir, queue, clock, _high, low) = setup();
    assert_eq!(queue.get(low).unwrap().state, JobState::Pending);
    // `low` is due (run_at two hours before the start, one hour before now):
    // a claim would take it right now.
    let next = queue.next_due(&["default"], None).unwrap().unwrap();
    eprintln!("now = {}, next_due = {next}", clock.now_ms());
    assert!(
        next.timestamp_millis() <= clock.now_ms(),
        "next_due says {next}, an hour ahead, although job {low:?} is due now"
    );
}
}

contract! {
fn pool_claims_a_due_lower_priority_job_after_a_backward_step() {
    let dir = tempfile::tempdir().unwrap();
    let start = Utc::now();
    let clock = Arc::new(ManualClock::new(start));
    let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
        .clock(clock.clone())
        .open()
        .unwrap();
    // A high-priority job, pending (due at enqueue).
    queue.enqueue(NewJob::new("k").priority(10)).unwrap();
    // NTP steps the wall clock back one hour.
    clock.set(start - CDuration::hours(1));
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler("k", |_: &JobContext| Ok::<(), JobError>(()))
        .without_reaper()
        .without_scheduler()
        .max_idle(Duration::from_millis(20))
        .start()
        .unwrap();
    // Let the dispatcher's first claim find nothing due.
    std::thread::sleep(Duration::from_millis(200));
    // A new job, due now.
    let low = queue.enqueue(NewJob::new("k")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let state = queue.get(low).unwrap().state;
    pool.shutdown(Duration::from_secs(1));
    assert_eq!(
        state,
        JobState::Succeeded,
        "the due job was not claimed in 1.5 s: the dispatcher trusted next_due"
    );
}
}
