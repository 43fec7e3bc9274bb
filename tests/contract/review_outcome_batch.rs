//! Review: one handler's out-of-range snooze time poisons the whole outcome
//! batch of the worker pool.
//!
//! `Queue::record_and_claim` validates every Snooze time up front and
//! returns `Err(TimeOutOfRange)` for the whole call if any one is out of
//! range. The dispatcher's `record()` does not retry that error (not busy),
//! logs "outcome(s) not recorded", and removes every job of the batch from
//! the in-flight map. So:
//! - the *other* jobs of the batch that succeeded stay `running`, no longer
//!   heartbeated; the reaper later takes them back and they run again (or,
//!   with no attempts left, end `dead` although they succeeded);
//! - the bad job itself never gets a clear error: it sits `running` until its
//!   lease runs out.
//!
//! Contract 7: "Bad input gets a clear error and loses nothing."

use crate::support::common;

use chrono::{TimeZone, Utc};
use crossbeam_channel::{bounded, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{
    Clock, Durability, Error, JobContext, JobError, JobState, ManualClock, NewJob, Queue,
    WorkerPool,
};

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn far_future() -> chrono::DateTime<Utc> {
    // Past tickler's MAX_TIMESTAMP_MS (9999-12-31), inside chrono's range.
    Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap()
}

contract! {
fn a_bad_snooze_alone_leaves_its_job_running_without_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
        .open()
        .unwrap();
    let id = queue.enqueue(NewJob::new("bad")).unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .lease(Duration::from_secs(30))
        .handler("bad", |_: &JobContext| Err(JobError::Snooze(far_future())))
        .without_reaper()
        .without_scheduler()
        .start()
        .unwrap();
    wait_until(
        "the handler ran and the pool forgot the job",
        Duration::from_secs(5),
        || queue.get(id).unwrap().attempts == 1 && pool.in_flight() == 0,
    );
    std::thread::sleep(Duration::from_millis(300));
    let job = queue.get(id).unwrap();
    pool.shutdown(Duration::from_secs(1));
    eprintln!(
        "job after the bad snooze: state {:?}, last_error {:?}",
        job.state, job.last_error
    );
    assert_ne!(
        job.state,
        JobState::Running,
        "the job is still running, its outcome silently dropped and no longer heartbeated \
         (last_error {:?})",
        job.last_error
    );
}
}

contract! { sqlite_only:
/// SQLite only: The batch is made by holding SQLite's write lock with
/// complete_with; on PostgreSQL the bad snooze alone is the first test's
/// case.
fn a_bad_snooze_loses_the_outcome_of_a_job_that_succeeded_in_the_same_batch() {
    let dir = tempfile::tempdir().unwrap();
    let start = Utc::now();
    let clock = Arc::new(ManualClock::new(start));
    let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
        .clock(clock.clone())
        .open()
        .unwrap();

    // Gates the two handlers so they return while the dispatcher is blocked.
    let (go_tx, go_rx) = bounded::<()>(2);
    let go_rx: Arc<Mutex<Receiver<()>>> = Arc::new(Mutex::new(go_rx));
    let (started_tx, started_rx) = bounded::<()>(2);
    let handler = |result: Result<(), JobError>| {
        let go_rx = Arc::clone(&go_rx);
        let started_tx = started_tx.clone();
        move |_: &JobContext| {
            started_tx.send(()).unwrap();
            let rx = go_rx.lock().unwrap().clone();
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
            result.clone()
        }
    };

    let ok = queue.enqueue(NewJob::new("ok").max_attempts(1)).unwrap();
    queue.enqueue(NewJob::new("bad")).unwrap();
    // Falls due later; its claim makes the dispatcher block on the write lock.
    queue
        .enqueue(NewJob::new("later").run_at(start + chrono::Duration::seconds(10)))
        .unwrap();
    // A lease on another queue, so the test can hold the process's write
    // connection with complete_with.
    queue.enqueue(NewJob::new("x").queue("other")).unwrap();
    let other = queue
        .claim("other", "test", 1, Duration::from_secs(60))
        .unwrap()
        .remove(0);

    let mut pool = WorkerPool::builder(&queue)
        .threads(3)
        .lease(Duration::from_secs(30))
        .max_idle(Duration::from_millis(10))
        .handler("ok", handler(Ok(())))
        .handler("bad", handler(Err(JobError::Snooze(far_future()))))
        .handler("later", |_: &JobContext| Ok::<(), JobError>(()))
        .without_reaper()
        .without_scheduler()
        .start()
        .unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    started_rx.recv_timeout(Duration::from_secs(5)).unwrap();

    // Hold the write connection for 800 ms.
    let (holding_tx, holding_rx) = bounded::<()>(1);
    let holder = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let r: tickler::Result<()> = queue.complete_with(&other, |_tx| {
                holding_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(800));
                Err(Error::aborted("test only held the lock"))
            });
            assert!(r.is_err());
        })
    };
    holding_rx.recv().unwrap();
    // "later" falls due: the dispatcher wakes (max_idle 10 ms), sees it due
    // and blocks in its claim on the write connection.
    clock.advance(Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(200));
    // Both handlers return while the dispatcher is blocked; their outcomes
    // queue up and are recorded in one batch.
    go_tx.send(()).unwrap();
    go_tx.send(()).unwrap();
    holder.join().unwrap();

    wait_until(
        "both gated jobs left the pool",
        Duration::from_secs(5),
        || pool.in_flight() == 0,
    );
    std::thread::sleep(Duration::from_millis(300));
    let job = queue.get(ok).unwrap();
    let _ = clock.now();
    pool.shutdown(Duration::from_secs(1));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "job {ok:?} succeeded but its outcome was dropped with the bad snooze's batch"
    );
}
}
