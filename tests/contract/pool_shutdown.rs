//! Graceful shutdown of a worker pool:
//!
//! - jobs claimed but not started (prefetched) go back to `pending` at once
//!   with their attempt given back, the running one finishes and is
//!   recorded;
//! - when the grace period ends first, the still-running handler is counted,
//!   its cancellation flag says `Shutdown`, and its outcome is still
//!   recorded when it ends (its lease still holds);
//! - a handler that polls `is_cancelled` ends early on shutdown.

use crate::support::pool;

use pool::{flavored_tests, Flavor, ScriptHandler};

use pool::{open_queue, open_queue_slow_retry, secs, temp_db, wait_until, Recorder};
use std::time::Instant;
use tickler::{CancelReason, JobState, NewJob, WorkerPool};

const WARM_UP: usize = 10;

contract! { poolers:
/// Sync handlers only: jobs wait unstarted in a pool only when it claimed
/// them ahead of its threads. Async handlers' task lanes claim no more
/// than their free slots and start each job as it is claimed
/// (`async_task_lanes` tests their hand-back at shutdown).
fn unstarted_jobs_go_back_to_pending_with_their_attempt() {
    let flavor = &Flavor::sync();
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();

    // Warmed up by jobs that return at once, the pool claims ahead (up to
    // 5, held for up to a minute); then one batch, so that its next claim
    // takes the slow job (highest priority) and five more.
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .prefetch(5)
        .prefetch_hold(secs(60))
        .script_handler(flavor, "script", rec.script())
        .handler("warm-up", |_: &tickler::JobContext| {
            Ok::<(), tickler::JobError>(())
        })
        .shutdown_grace(secs(10))
        .start()
        .unwrap();
    pool::warm_up(&queue, "warm-up", WARM_UP);
    let mut batch = vec![NewJob::new("script")
        .priority(10)
        .payload(serde_json::json!({"block": true}))];
    batch
        .extend((0..7).map(|_| NewJob::new("script").payload(serde_json::json!({"action": "ok"}))));
    let mut ids = queue.enqueue_batch(batch).unwrap();
    let others = ids.split_off(1);
    let slow = ids[0];
    let worker_id = pool.worker_id().to_owned();
    wait_until("the slow job started", secs(10), || rec.started() == 1);
    assert_eq!(rec.runs()[0].job_id, slow);
    wait_until("the pool prefetched", secs(10), || pool.in_flight() > 1);

    // The slow job ends only once shutdown has handed the unstarted jobs
    // back (all 7 others pending again), or after 10 s if it never does.
    let opener = {
        let (rec, queue) = (rec.clone(), queue.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + secs(10);
            while queue.count(JobState::Pending).unwrap() < 7 && Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            rec.gate.open();
        })
    };
    let report = pool.shutdown(secs(15));
    opener.join().unwrap();
    eprintln!("{report:?}");
    assert!(report.released >= 1, "nothing handed back: {report:?}");
    assert_eq!(report.still_running, 0, "{report:?}");

    // The running job finished within the grace period and was recorded.
    let job = queue.get(slow).unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.attempts, 1);
    assert_eq!(rec.started(), 1, "a job started after shutdown began");

    // Everything else is pending again, with no attempt used; the prefetched
    // ones (claimed by this pool) are at least those reported released.
    let mut claimed = 0;
    for id in &others {
        let job = queue.get(*id).unwrap();
        assert_eq!(job.state, JobState::Pending, "{job:?}");
        assert_eq!(job.attempts, 0, "attempt not given back: {job:?}");
        assert_eq!(job.lease_expires_at, None, "{job:?}");
        if job.claimed_by.as_deref() == Some(worker_id.as_str()) {
            claimed += 1;
        }
    }
    assert!(
        claimed >= report.released,
        "{claimed} jobs were claimed, {} reported released",
        report.released
    );

    // A new pool runs them, each as its first attempt.
    let rec2 = Recorder::new();
    let mut pool2 = WorkerPool::builder(&queue)
        .threads(2)
        .script_handler(flavor, "script", rec2.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap();
    wait_until("the released jobs ran", secs(10), || {
        queue.count(JobState::Succeeded).unwrap() == (WARM_UP + 8) as u64
    });
    pool2.shutdown(secs(5));
    for run in rec2.runs() {
        assert_eq!(run.attempt, 1, "{run:?}");
    }
    assert_eq!(rec2.started(), 7);
}
}

fn grace_expiry_leaves_a_stubborn_handler_cancelled_with_shutdown(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .script_handler(flavor, "script", rec.script())
        .shutdown_grace(secs(2))
        .start()
        .unwrap();
    // Ignores cancellation until the gate opens, then looks once.
    let id = queue
        .enqueue(
            NewJob::new("script").payload(serde_json::json!({"block": true, "wait_cancel_ms": 1})),
        )
        .unwrap();
    wait_until("the handler started", secs(10), || rec.started() == 1);

    let report = pool.shutdown(std::time::Duration::from_millis(200));
    assert_eq!(report.still_running, 1, "{report:?}");
    assert_eq!(report.released, 0, "{report:?}");
    assert_eq!(rec.ended(), 0, "the handler cannot have ended yet");

    rec.gate.open();
    wait_until("the handler ended", secs(10), || rec.ended() == 1);
    let end = rec.ends()[0].clone();
    assert_eq!(end.seen_cancel, Some(CancelReason::Shutdown));

    // Its lease still holds, so its outcome is recorded after all.
    wait_until("the late outcome recorded", secs(10), || {
        queue.get(id).unwrap().state != JobState::Running
    });
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.attempts, 1);
}

fn handler_polling_is_cancelled_stops_early_on_shutdown(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .script_handler(flavor, "script", rec.script())
        .shutdown_grace(secs(2))
        .start()
        .unwrap();
    // Would run 20 s unless cancelled; fails (retry) when it stops.
    let id = queue
        .enqueue(NewJob::new("script").payload(serde_json::json!({
            "wait_cancel_ms": 20_000,
            "action": "error",
            "message": "interrupted",
        })))
        .unwrap();
    wait_until("the handler started", secs(10), || rec.started() == 1);

    let asked = Instant::now();
    let report = pool.shutdown(std::time::Duration::from_millis(200));
    assert_eq!(report.still_running, 1, "{report:?}");
    wait_until("the handler stopped", secs(10), || rec.ended() == 1);
    let stopped_after = rec.ends()[0].ended - asked;
    assert!(
        stopped_after < secs(10),
        "the handler ran on for {stopped_after:?}"
    );
    assert_eq!(rec.ends()[0].seen_cancel, Some(CancelReason::Shutdown));

    wait_until("its outcome recorded", secs(10), || {
        queue.get(id).unwrap().state != JobState::Running
    });
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled, "{job:?}");
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error.as_deref(), Some("interrupted"));
}

flavored_tests!(poolers:
    grace_expiry_leaves_a_stubborn_handler_cancelled_with_shutdown,
    handler_polling_is_cancelled_stops_early_on_shutdown,
);

/// A regression test from a review: its doc says the bug it guards.
mod leases_of_handlers_running_after_shutdown {
    use crate::support::common;

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use tickler::{Durability, JobContext, JobError, JobState, NewJob, Queue, WorkerPool};

    contract! { poolers:
    /// The bug it guards (from a review):
    /// `WorkerPool::shutdown` says handlers still running after the
    /// grace period "keep their leases until they end (their outcome is still
    /// recorded if the lease holds) or the reaper takes them". But shutdown
    /// stops the heartbeat thread right away, so nobody renews those leases:
    /// one lease period later any reaper takes the job and another worker runs
    /// it while the first handler, in a live process, is still running (and
    /// its cancellation reason still says Shutdown, not LeaseLost). Its result
    /// is then dropped as LeaseLost.
    fn a_handler_still_running_after_shutdown_keeps_its_lease() {
        let dir = tempfile::tempdir().unwrap();
        let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .open()
            .unwrap();
        let id = queue.enqueue(NewJob::new("slow")).unwrap();
        let running = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let mut pool = {
            let running = Arc::clone(&running);
            let done = Arc::clone(&done);
            WorkerPool::builder(&queue)
                .threads(1)
                .lease(Duration::from_millis(300))
                .handler("slow", move |_: &JobContext| {
                    running.store(true, Ordering::SeqCst);
                    // A handler that finishes its unit of work before looking at
                    // the cancellation flag (e.g. one blocking call).
                    std::thread::sleep(Duration::from_millis(2500));
                    done.store(true, Ordering::SeqCst);
                    Ok::<(), JobError>(())
                })
                .without_reaper()
                .without_scheduler()
                .start()
                .unwrap()
        };
        let t = Instant::now();
        while !running.load(Ordering::SeqCst) {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
        let report = pool.shutdown(Duration::from_millis(50));
        assert_eq!(report.still_running, 1);

        // Some reaper (another pool, another process) passes a second later.
        std::thread::sleep(Duration::from_millis(1000));
        let reaped = queue.manual().reap().unwrap();
        let job = queue.get(id).unwrap();
        let handler_still_running = !done.load(Ordering::SeqCst);
        eprintln!(
            "handler still running: {handler_still_running}; reaped {reaped}; job {:?} last_error {:?}",
            job.state, job.last_error
        );
        assert!(handler_still_running);
        assert_eq!(
            job.state,
            JobState::Running,
            "the job was taken from a handler that is still running in a live process"
        );
        std::thread::sleep(Duration::from_millis(1700));
    }
    }
}
