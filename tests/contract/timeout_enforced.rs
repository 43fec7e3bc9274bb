//! Timeouts are enforced, not only requested (issue 13, point 5).
//!
//! The bug it guards: a handler that ignored its timeout's cancellation
//! flag kept its job `running` for ever: heartbeats went on renewing the
//! lease, nothing was logged, and on a 1-thread pool the jobs behind it
//! never ran. Now, once a job is past its timeout plus the pool's
//! `timeout_grace`, its heartbeats stop, it is failed with a "timed out"
//! error naming the stuck thread (attempt counted, retried per policy),
//! and the pool starts a replacement thread (up to a bound) and counts the
//! stuck thread in `stats`.

use crate::support::pool;

use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
use serde_json::json;
use tickler::{JobState, NewJob, Queue, WorkerPool};

/// A job whose handler ignores its cancellation and blocks until the
/// recorder's gate opens.
fn hung(queue: &Queue) -> tickler::JobId {
    queue
        .enqueue(
            NewJob::new("script")
                .payload(json!({"block": true}))
                .timeout(ms(200))
                .max_attempts(1),
        )
        .unwrap()
}

fn pool(queue: &Queue, rec: &std::sync::Arc<Recorder>, replacements: usize) -> WorkerPool {
    WorkerPool::builder(queue)
        .threads(1)
        .lease(secs(1))
        .timeout_grace(ms(300))
        .replacement_threads(replacements)
        .handler("script", rec.script())
        .start()
        .unwrap()
}

contract! {
fn a_handler_that_ignores_its_timeout_is_failed_and_its_thread_replaced() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec, 1);
    let stuck = hung(&queue);
    wait_until("the hung handler started", secs(10), || rec.started() == 1);
    let behind = queue.enqueue(NewJob::new("script")).unwrap();

    wait_until("the hung job is failed as timed out", secs(10), || {
        queue.get(stuck).unwrap().state == JobState::Dead
    });
    let job = queue.get(stuck).unwrap();
    let error = job.last_error.unwrap();
    assert!(
        error.contains("timed out") && error.contains("tickler-worker-0"),
        "{error}"
    );
    assert_eq!(job.attempts, 1);
    wait_until("the job behind it ran on the replacement", secs(10), || {
        queue.get(behind).unwrap().state == JobState::Succeeded
    });
    let stats = pool.stats();
    assert_eq!(stats.stuck_threads, 1, "{stats:?}");
    assert_eq!(stats.replacement_threads, 1, "{stats:?}");
    let behind_run = &rec.runs_of(behind)[0];
    assert_ne!(behind_run.thread, "tickler-worker-0");

    // The stuck handler comes back: what it returns is dropped.
    rec.gate.open();
    wait_until("the stuck thread returned", secs(10), || {
        pool.stats().stuck_threads == 0
    });
    assert_eq!(queue.get(stuck).unwrap().state, JobState::Dead);
    // The pool goes on with its replacement.
    let after = queue.enqueue(NewJob::new("script")).unwrap();
    wait_until("a later job runs", secs(10), || {
        queue.get(after).unwrap().state == JobState::Succeeded
    });
    let report = pool.shutdown(secs(5));
    assert_eq!(report.still_running, 0);
}
}

contract! {
fn past_the_replacement_bound_the_job_is_still_failed_and_the_slot_waits() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec, 0);
    let stuck = hung(&queue);
    wait_until("the hung handler started", secs(10), || rec.started() == 1);
    let behind = queue.enqueue(NewJob::new("script")).unwrap();
    wait_until("the hung job is failed as timed out", secs(10), || {
        queue.get(stuck).unwrap().state == JobState::Dead
    });
    assert_eq!(pool.stats().stuck_threads, 1);
    assert_eq!(pool.stats().replacement_threads, 0);
    std::thread::sleep(ms(300));
    assert_eq!(
        queue.get(behind).unwrap().state,
        JobState::Pending,
        "no thread was free for it"
    );
    rec.gate.open();
    wait_until(
        "the job behind runs once the thread is back",
        secs(10),
        || queue.get(behind).unwrap().state == JobState::Succeeded,
    );
    assert_eq!(pool.stats().stuck_threads, 0);
    pool.shutdown(secs(5));
}
}

contract! {
fn shutdown_does_not_wait_for_a_written_off_thread() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec, 1);
    let stuck = hung(&queue);
    wait_until("the hung job is failed as timed out", secs(10), || {
        queue.get(stuck).unwrap().state == JobState::Dead
    });
    let started = std::time::Instant::now();
    let report = pool.shutdown(secs(5));
    assert!(
        started.elapsed() < secs(4),
        "shutdown waited {:?} for a thread it had written off",
        started.elapsed()
    );
    assert_eq!(report.still_running, 0);
    rec.gate.open();
}
}
