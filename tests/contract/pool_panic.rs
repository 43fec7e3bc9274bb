//! Guarantee 7 in the pool: a panicking handler fails its job with the panic
//! message as `last_error` (dead when it had one attempt, waiting for a
//! retry otherwise), and the worker thread that caught the panic lives on
//! and runs the jobs after it.

use crate::support::pool;

use pool::{flavored_tests, Flavor, ScriptHandler};

use pool::{open_queue_slow_retry, secs, temp_db, wait_until, Recorder};
use tickler::{JobState, NewJob, WorkerPool};

fn panicking_handler_fails_its_job_and_the_worker_lives_on(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    // One-hour backoff: the retried job stays scheduled during the test.
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();

    // Highest priority first: the panics come before the ok jobs.
    let dies = queue
        .enqueue(
            NewJob::new("script")
                .priority(10)
                .max_attempts(1)
                .payload(serde_json::json!({"action": "panic", "message": "boom: out of widgets"})),
        )
        .unwrap();
    let retries = queue
        .enqueue(
            NewJob::new("script")
                .priority(9)
                .max_attempts(5)
                .payload(serde_json::json!({"action": "panic", "message": "kaboom #2"})),
        )
        .unwrap();
    let ok_ids = queue
        .enqueue_batch(
            (0..10)
                .map(|_| NewJob::new("script").payload(serde_json::json!({"action": "ok"})))
                .collect(),
        )
        .unwrap();

    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .script_handler(flavor, "script", rec.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap();

    wait_until("the 10 ok jobs succeeded", secs(15), || {
        queue.count(JobState::Succeeded).unwrap() == 10
    });
    wait_until("both panicking jobs recorded", secs(10), || {
        queue.get(dies).unwrap().state == JobState::Dead
            && queue.get(retries).unwrap().state != JobState::Running
    });
    let report = pool.shutdown(secs(5));
    assert_eq!(report.still_running, 0);

    // One attempt: dead, with the panic message.
    let dead = queue.get(dies).unwrap();
    assert_eq!(dead.state, JobState::Dead);
    assert_eq!(dead.attempts, 1);
    let error = dead.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("boom: out of widgets"),
        "last_error lacks the panic message: {error:?}"
    );
    assert!(dead.finished_at.is_some());

    // Attempts left: waiting for its retry, attempt used, panic message kept.
    let retry = queue.get(retries).unwrap();
    assert_eq!(retry.state, JobState::Scheduled, "{retry:?}");
    assert_eq!(retry.attempts, 1);
    let error = retry.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("kaboom #2"),
        "last_error lacks the panic message: {error:?}"
    );

    // The same (only) worker thread ran the panics and then all ok jobs.
    let runs = rec.runs();
    assert_eq!(runs.len(), 12, "{runs:?}");
    assert_eq!(runs[0].job_id, dies);
    assert_eq!(runs[1].job_id, retries);
    let thread = &runs[0].thread;
    assert!(
        runs.iter().all(|r| &r.thread == thread),
        "jobs ran on other threads than {thread}: {:?}",
        runs.iter().map(|r| &r.thread).collect::<Vec<_>>()
    );
    for id in ok_ids {
        let job = queue.get(id).unwrap();
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(rec.runs_of(id).len(), 1);
    }
}

flavored_tests!(poolers: panicking_handler_fails_its_job_and_the_worker_lives_on,);

/// The bugs these guard (from a hunt through other queues' reports):
/// pool failures reported against other queues,
/// tried on tickler; these pass and stay as regression tests.
mod other_queues_pool_reports {
    use crate::support::pool;

    use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
    use std::time::Instant;
    use tickler::{JobContext, JobError, JobState, NewJob, WorkerPool};

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
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

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
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
}
