//! Hunt (issue 13 review): handlers that hang, from other queues' reports.
//!
//! - Oban Lifeline / sidekiq-unique-jobs style: a job given up on (timed
//!   out) while its handler still runs frees its unique_key, so the next job
//!   with that key runs beside it (the overlap `cancel` was fixed for).
//! - Oban "a hung job holds its slot forever and stops the queue"
//!   (engram-app/Engram#1496): jobs a pool prefetched behind a hung handler
//!   are held (heartbeated) for ever; no other pool can run them.

use crate::support::pool;

use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
use serde_json::json;
use std::time::{Duration, Instant};
use tickler::{JobState, NewJob, WorkerPool};

contract! {
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
fn a_prefetched_job_is_not_held_hostage_by_a_hung_handler() {
    let (ran, state) = prefetched_job_behind_a_hung_handler(None);
    assert!(
        ran && state == JobState::Succeeded,
        "the prefetched job never ran in 5 s (state {state}) while an idle pool served the queue"
    );
}
}

contract! {
fn a_prefetched_job_is_not_held_hostage_by_a_written_off_thread() {
    let (ran, state) = prefetched_job_behind_a_hung_handler(Some(ms(100)));
    assert!(
        ran && state == JobState::Succeeded,
        "the prefetched job never ran in 5 s (state {state}) although the thread ahead of it was written off"
    );
}
}
