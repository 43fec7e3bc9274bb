//! Review: `WorkerPool::shutdown` says handlers still running after the
//! grace period "keep their leases until they end (their outcome is still
//! recorded if the lease holds) or the reaper takes them". But shutdown
//! stops the heartbeat thread right away, so nobody renews those leases:
//! one lease period later any reaper takes the job and another worker runs
//! it while the first handler, in a live process, is still running (and
//! its cancellation reason still says Shutdown, not LeaseLost). Its result
//! is then dropped as LeaseLost.

use crate::support::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{Durability, JobContext, JobError, JobState, NewJob, Queue, WorkerPool};

contract! {
fn a_handler_still_running_after_shutdown_keeps_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
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
    let reaped = queue.reap().unwrap();
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
