//! Hunt (issue 13 review): pool failures reported against other queues,
//! tried on tickler; these pass and stay as regression tests.

use crate::support::pool;

use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
use std::time::Instant;
use tickler::{JobContext, JobError, JobState, NewJob, WorkerPool};

contract! {
/// ruby-shoryuken/shoryuken#1020: a graceful stop blocked for ever on a
/// worker that never finished.
fn shutdown_returns_after_its_grace_with_a_handler_that_ignores_it() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let (mut pool, id) = pool::one_blocked_job(&queue, &rec, secs(5));
    let asked = Instant::now();
    let report = pool.shutdown(ms(200));
    let took = asked.elapsed();
    assert!(took < ms(1500), "shutdown took {took:?}");
    assert_eq!(report.still_running, 1, "{report:?}");
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);
    rec.gate.open();
    wait_until("the late outcome is recorded", secs(10), || {
        queue.get(id).unwrap().state == JobState::Succeeded
    });
}
}

contract! {
/// collectiveidea/delayed_job#1173 and verk#89: an error that could not be
/// turned into a message crashed the worker, which took the job again.
fn a_panic_with_a_non_string_payload_fails_its_job_and_the_thread_lives_on() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler("odd", |_ctx: &JobContext| -> Result<(), JobError> {
            std::panic::panic_any(42u8)
        })
        .handler("fine", |_ctx: &JobContext| -> Result<(), JobError> {
            Ok(())
        })
        .start()
        .unwrap();
    let odd = queue.enqueue(NewJob::new("odd").max_attempts(1)).unwrap();
    let fine = queue.enqueue(NewJob::new("fine")).unwrap();
    wait_until("both jobs finished", secs(10), || {
        queue.get(odd).unwrap().state == JobState::Dead
            && queue.get(fine).unwrap().state == JobState::Succeeded
    });
    let error = queue.get(odd).unwrap().last_error.unwrap();
    assert!(error.contains("panicked"), "{error}");
    pool.shutdown(secs(5));
}
}
