//! Timeouts are enforced, not only requested.
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

/// The bugs these guard (from a hunt through other queues' reports):
/// handlers that hang, from other queues' reports.
///
/// - Oban Lifeline / sidekiq-unique-jobs style: a job given up on (timed
///   out) while its handler still runs frees its unique_key, so the next job
///   with that key runs beside it (the overlap `cancel` was fixed for).
/// - Oban "a hung job holds its slot forever and stops the queue"
///   (engram-app/Engram#1496): jobs a pool prefetched behind a hung handler
///   are held (heartbeated) for ever; no other pool can run them.
mod hung_handlers {
    use crate::support::pool;

    use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
    use serde_json::json;
    use std::time::{Duration, Instant};
    use tickler::{JobState, NewJob, WorkerPool};

    contract! {
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
    fn a_timed_out_job_keeps_its_unique_key_while_its_handler_still_runs() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let mut pool = WorkerPool::builder(&queue)
            .threads(1)
            .lease(secs(3))
            .timeout_grace(ms(100))
            .replacement_threads(1)
            .handler("script", rec.script())
            .start()
            .unwrap();
        let first = queue
            .enqueue(
                NewJob::new("script")
                    .payload(json!({"block": true}))
                    .unique_key("nightly-sync")
                    .timeout(ms(100))
                    .max_attempts(1),
            )
            .unwrap();
        wait_until("the first run started", secs(10), || rec.started() == 1);
        wait_until("the first job is failed as timed out", secs(10), || {
            queue.get(first).unwrap().state == JobState::Dead
        });
        let failed_at = Instant::now();
        let second = queue
            .enqueue(NewJob::new("script").unique_key("nightly-sync"))
            .unwrap();
        assert_ne!(first, second);
        // The first handler is still running (blocked on the gate). Its lease
        // is no longer renewed and would run out within 3 s; until then (as
        // for a cancelled running job) the key should wait for it.
        std::thread::sleep(ms(1000));
        let overlapped = !rec.runs_of(second).is_empty() && rec.ends_of(first).is_empty();
        rec.gate.open();
        pool.shutdown(secs(5));
        assert!(
            !overlapped,
            "job {second:?} (same unique_key) started {:?} after {first:?} was failed as timed out, \
             while {first:?}'s handler was still running",
            rec.runs_of(second)
                .first()
                .map(|r| r.started.saturating_duration_since(failed_at))
        );
    }
    }

    /// One pool with 1 thread and 1 prefetched job; its thread hangs in a
    /// handler. A second, idle pool on the same file should be able to run the
    /// job the first one prefetched. (The first pool is warmed up by jobs that
    /// return at once, so that it does claim ahead; its holding time is long
    /// enough for the test to see the prefetched job before it is handed back.)
    fn prefetched_job_behind_a_hung_handler(timeout: Option<Duration>) -> (bool, JobState) {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let mut a = WorkerPool::builder(&queue)
            .threads(1)
            .prefetch(1)
            .prefetch_hold(ms(300))
            .lease(secs(1))
            .timeout_grace(ms(100))
            .replacement_threads(0)
            .worker_id("pool-a")
            .handler("script", rec.script())
            .start()
            .unwrap();
        let mut hung = NewJob::new("script")
            .payload(json!({"block": true}))
            .max_attempts(1);
        if let Some(t) = timeout {
            hung = hung.timeout(t);
        }
        pool::warm_up(&queue, "script", 20);
        let _hung = queue.enqueue(hung).unwrap();
        wait_until("the hung handler started", secs(10), || rec.started() == 21);
        let behind = queue.enqueue(NewJob::new("script")).unwrap();
        wait_until("pool a prefetched the job behind", secs(10), || {
            queue.get(behind).unwrap().state == JobState::Running
        });
        let rec_b = Recorder::new();
        let mut b = WorkerPool::builder(&queue)
            .threads(1)
            .lease(secs(1))
            .worker_id("pool-b")
            .handler("script", rec_b.script())
            .start()
            .unwrap();
        // Several lease lengths: pool a keeps renewing the prefetched lease.
        let deadline = Instant::now() + secs(5);
        while Instant::now() < deadline && queue.get(behind).unwrap().state != JobState::Succeeded {
            std::thread::sleep(ms(20));
        }
        let state = queue.get(behind).unwrap().state;
        let ran = !rec_b.runs_of(behind).is_empty() || !rec.runs_of(behind).is_empty();
        rec.gate.open();
        b.shutdown(secs(5));
        a.shutdown(secs(5));
        (ran, state)
    }

    contract! {
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
    fn a_prefetched_job_is_not_held_hostage_by_a_hung_handler() {
        let (ran, state) = prefetched_job_behind_a_hung_handler(None);
        assert!(
            ran && state == JobState::Succeeded,
            "the prefetched job never ran in 5 s (state {state}) while an idle pool served the queue"
        );
    }
    }

    contract! {
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
    fn a_prefetched_job_is_not_held_hostage_by_a_written_off_thread() {
        let (ran, state) = prefetched_job_behind_a_hung_handler(Some(ms(100)));
        assert!(
            ran && state == JobState::Succeeded,
            "the prefetched job never ran in 5 s (state {state}) although the thread ahead of it was written off"
        );
    }
    }
}
