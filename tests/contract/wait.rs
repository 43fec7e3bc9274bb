//! Waiting for a job to end (`Queue::wait`): a definite answer within the
//! bound (succeeded, dead, cancelled, not found, timed out), never a hang,
//! whichever handle or process records the end, and never a missed end
//! that commits while the waiter starts.

use crate::support::pool;

use pool::{ms, open_queue, secs, temp_db, Recorder};
use serde_json::json;
use std::time::Instant;
use tickler::{JobId, JobState, NewJob, Waited, WorkerPool};

contract! {
fn a_wait_ends_with_how_the_job_ended() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("script", rec.script())
        .start()
        .unwrap();
    let job = |payload: serde_json::Value| NewJob::new("script").payload(payload).max_attempts(1);

    let ok = queue.enqueue(job(json!({"sleep_ms": 100}))).unwrap();
    match queue.wait(ok, secs(30)).unwrap() {
        Waited::Succeeded(job) => assert_eq!((job.id, job.state), (ok, JobState::Succeeded)),
        other => panic!("{other:?}"),
    }

    let failing = queue
        .enqueue(job(json!({"action": "permanent", "message": "no such file"})))
        .unwrap();
    match queue.wait(failing, secs(30)).unwrap() {
        Waited::Dead(job) => {
            assert!(job.last_error.as_deref().unwrap_or_default().contains("no such file"), "{job:?}");
        }
        other => panic!("{other:?}"),
    }

    // Cancelled by another thread while the wait is on.
    let later = queue
        .enqueue(job(json!({})).run_at(chrono::Utc::now() + chrono::Duration::hours(1)))
        .unwrap();
    let canceller = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            std::thread::sleep(ms(100));
            queue.cancel(later).unwrap();
        })
    };
    assert!(matches!(queue.wait(later, secs(30)).unwrap(), Waited::Cancelled(_)));
    canceller.join().unwrap();

    // Never enqueued; and ended then pruned: both answered at once.
    let started = Instant::now();
    assert_eq!(queue.wait(JobId(987_654_321), secs(30)).unwrap(), Waited::NotFound);
    queue.prune(chrono::Utc::now() + chrono::Duration::hours(1)).unwrap();
    assert_eq!(queue.wait(ok, secs(30)).unwrap(), Waited::NotFound);
    assert!(started.elapsed() < secs(10), "{:?}", started.elapsed());

    // Not ended in time: the job as it was then.
    let far = queue
        .enqueue(job(json!({})).run_at(chrono::Utc::now() + chrono::Duration::hours(1)))
        .unwrap();
    let started = Instant::now();
    match queue.wait(far, ms(200)).unwrap() {
        Waited::TimedOut(job) => assert_eq!(job.state, JobState::Scheduled),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= ms(200), "{:?}", started.elapsed());
    match queue.wait(far, ms(0)).unwrap() {
        Waited::TimedOut(job) => assert_eq!(job.id, far),
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
}
}

contract! {
fn a_wait_sees_ends_another_handle_records_even_one_racing_its_start() {
    let (_dir, path) = temp_db();
    let waiter = open_queue(&path);
    // A second handle on the same queue, as another process would open it:
    // its commits reach the waiter only through the engine's signals.
    let worker = open_queue(&path);
    for round in 0..100u64 {
        let id = waiter.enqueue(NewJob::new("k")).unwrap();
        let lease = worker
            .manual()
            .claim("default", "w", 1, secs(60))
            .unwrap()
            .remove(0);
        assert_eq!(lease.job_id, id);
        let finisher = {
            let worker = worker.clone();
            std::thread::spawn(move || {
                // Both orders: before the waiter reads, and after.
                if round % 2 == 1 {
                    std::thread::sleep(ms(round % 7));
                }
                worker.manual().complete(&lease).unwrap();
            })
        };
        match waiter.wait(id, secs(20)).unwrap() {
            Waited::Succeeded(job) => assert_eq!(job.id, id),
            other => panic!("round {round}: {other:?}"),
        }
        finisher.join().unwrap();
    }
}
}
