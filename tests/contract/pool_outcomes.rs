//! What a handler's result does to its job, through the worker pool:
//!
//! - `Ok` → `succeeded`;
//! - `JobError::Retry` → waiting for its retry (`scheduled` after backoff),
//!   attempt used, message in `last_error`;
//! - `JobError::Permanent` → `dead` at once, with attempts left;
//! - `JobError::Snooze(t)` → `scheduled` at exactly `t`, attempt given back;
//! - `payload_as` with a payload of the wrong shape → `dead`;
//! - a kind the pool has no handler for is never claimed by it;
//! - a job's timeout sets its handler's cancellation flag to `Timeout`, and
//!   the result the handler then returns still counts.

use crate::support::pool;

use chrono::Utc;
use pool::{open_queue_slow_retry, secs, temp_db, wait_until, Recorder};
use std::time::Duration;
use tickler::{CancelReason, Job, JobId, JobState, NewJob, Queue, WorkerPool};

fn script(payload: serde_json::Value) -> NewJob {
    NewJob::new("script").payload(payload)
}

/// Waits until `id` was claimed (it has a run_token) and is no longer
/// running; returns it.
fn settled(queue: &Queue, id: JobId) -> Job {
    wait_until(&format!("job {id} ran and settled"), secs(10), || {
        let job = queue.get(id).unwrap();
        job.run_token.is_some() && job.state != JobState::Running
    });
    queue.get(id).unwrap()
}

fn start_pool(queue: &Queue, rec: &std::sync::Arc<Recorder>) -> WorkerPool {
    WorkerPool::builder(queue)
        .threads(2)
        .handler("script", rec.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap()
}

contract! { poolers:
fn ok_retry_and_permanent() {
    let (_dir, path) = temp_db();
    // One-hour backoff: a retried job waits, scheduled, for the rest of the test.
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    let ok = queue
        .enqueue(script(serde_json::json!({"action": "ok"})))
        .unwrap();
    let retry = queue
        .enqueue(script(
            serde_json::json!({"action": "error", "message": "upstream said 503"}),
        ))
        .unwrap();
    let permanent = queue
        .enqueue(script(
            serde_json::json!({"action": "permanent", "message": "no such customer"}),
        ))
        .unwrap();
    let mut pool = start_pool(&queue, &rec);
    let before = Utc::now();

    let job = settled(&queue, ok);
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error, None);
    assert!(job.finished_at.is_some());

    let job = settled(&queue, retry);
    assert_eq!(job.state, JobState::Scheduled, "{job:?}");
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error.as_deref(), Some("upstream said 503"));
    assert!(
        job.run_at >= before + chrono::Duration::minutes(59),
        "retry not after the backoff: {job:?}"
    );
    assert_eq!(job.finished_at, None);

    let job = settled(&queue, permanent);
    assert_eq!(job.state, JobState::Dead, "{job:?}");
    assert_eq!(job.attempts, 1, "dead with attempts left");
    assert!(job.max_attempts > 1);
    assert_eq!(job.last_error.as_deref(), Some("no such customer"));
    assert!(job.finished_at.is_some());

    pool.shutdown(secs(5));
    assert_eq!(rec.runs_of(ok).len(), 1);
    assert_eq!(rec.runs_of(retry).len(), 1);
    assert_eq!(rec.runs_of(permanent).len(), 1);
}
}

contract! { poolers:
fn snooze_reschedules_at_its_time_and_gives_the_attempt_back() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    // Runs once: handler start + 1 h.
    let id = queue
        .enqueue(script(serde_json::json!({"snooze_ms": 3_600_000})))
        .unwrap();
    let mut pool = start_pool(&queue, &rec);
    let job = settled(&queue, id);
    pool.shutdown(secs(5));

    assert_eq!(job.state, JobState::Scheduled, "{job:?}");
    assert_eq!(job.attempts, 0, "snooze used an attempt: {job:?}");
    assert_eq!(job.last_error, None);
    // `snooze_for` reads the queue's clock inside the handler: run_at is an
    // hour after a moment between the handler's start and now.
    let run = &rec.runs()[0];
    let lo = run.started_at + chrono::Duration::hours(1);
    let hi = queue.clock().now() + chrono::Duration::hours(1);
    assert!(
        job.run_at >= lo - chrono::Duration::milliseconds(1) && job.run_at <= hi,
        "snoozed to {}, expected between {lo} and {hi}",
        job.run_at
    );
    assert_eq!(rec.started(), 1);
}
}

contract! { poolers:
fn snooze_to_an_exact_time() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let until = chrono::DateTime::from_timestamp_millis(
        (Utc::now() + chrono::Duration::hours(2)).timestamp_millis(),
    )
    .unwrap();
    let until_for_handler = until;
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler("exact", move |_ctx: &tickler::JobContext| {
            Err::<(), _>(tickler::JobError::Snooze(until_for_handler))
        })
        .shutdown_grace(secs(5))
        .start()
        .unwrap();
    let id = queue.enqueue(NewJob::new("exact")).unwrap();
    let job = settled(&queue, id);
    pool.shutdown(secs(5));
    assert_eq!(job.state, JobState::Scheduled, "{job:?}");
    assert_eq!(job.run_at, until);
    assert_eq!(job.attempts, 0);
}
}

contract! { poolers:
fn payload_of_the_wrong_shape_is_dead() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    let id = queue
        .enqueue(script(
            serde_json::json!({"action": "shape", "not_it": "x"}),
        ))
        .unwrap();
    let mut pool = start_pool(&queue, &rec);
    let job = settled(&queue, id);
    pool.shutdown(secs(5));
    assert_eq!(job.state, JobState::Dead, "{job:?}");
    assert_eq!(job.attempts, 1);
    let error = job.last_error.unwrap_or_default();
    assert!(error.contains("must_have_this"), "last_error: {error:?}");
    assert_eq!(rec.started(), 1);
}
}

contract! { poolers:
fn a_pool_never_claims_a_kind_it_has_no_handler_for() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    // Enqueued first and at a higher priority: it would be claimed first if
    // the pool claimed any kind.
    let other = queue.enqueue(NewJob::new("other").priority(100)).unwrap();
    let known = queue
        .enqueue_batch((0..20).map(|_| script(serde_json::json!({}))).collect())
        .unwrap();
    let mut pool = start_pool(&queue, &rec);
    for id in &known {
        assert_eq!(settled(&queue, *id).state, JobState::Succeeded);
    }
    // And some arriving while it runs.
    for _ in 0..10 {
        queue.enqueue(script(serde_json::json!({}))).unwrap();
    }
    wait_until("30 known jobs done", secs(10), || {
        queue.count(JobState::Succeeded).unwrap() == 30
    });
    pool.shutdown(secs(5));

    let job = queue.get(other).unwrap();
    assert_eq!(job.state, JobState::Pending, "{job:?}");
    assert_eq!(job.attempts, 0, "{job:?}");
    assert_eq!(job.run_token, None, "{job:?}");
    assert_eq!(job.claimed_by, None, "{job:?}");
    assert!(rec.runs().iter().all(|r| r.kind == "script"));
}
}

contract! { poolers:
fn timeout_sets_the_cancellation_flag_and_the_result_still_counts() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    let id = queue
        .enqueue(
            script(serde_json::json!({"wait_cancel_ms": 10_000}))
                .timeout(Duration::from_millis(100)),
        )
        .unwrap();
    let mut pool = start_pool(&queue, &rec);
    wait_until("the handler ended", secs(15), || rec.ended() == 1);
    let end = rec.ends()[0].clone();
    let ran = end.ended - rec.runs()[0].started;
    assert_eq!(
        end.seen_cancel,
        Some(CancelReason::Timeout),
        "after {ran:?}"
    );
    assert!(
        ran >= Duration::from_millis(90),
        "cancelled before its timeout: {ran:?}"
    );
    assert!(ran < secs(8), "cancellation came only after {ran:?}");

    let job = settled(&queue, id);
    pool.shutdown(secs(5));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.timeout, Some(Duration::from_millis(100)));
}
}

/// A regression test from a review: its doc says the bug it guards.
mod snooze_for_a_huge_delay {
    use crate::support::common;

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tickler::{Durability, JobContext, JobError, NewJob, Queue, WorkerPool};

    contract! { poolers:
    /// The bug it guards (from a review):
    /// `JobContext::snooze_for(delay)` is
    /// `now + chrono::Duration::from_std(delay).unwrap_or_default()`:
    /// a delay too large for TimeDelta (e.g. `Duration::MAX`, "not for a long
    /// while") silently becomes zero, so the job is snoozed to *now* and runs
    /// again at once, in a hot loop, attempts given back each time.
    fn snooze_for_a_huge_delay_does_not_rerun_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .open()
            .unwrap();
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut pool = {
            let runs = Arc::clone(&runs);
            WorkerPool::builder(&queue)
                .threads(1)
                .handler("k", move |ctx: &JobContext| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<(), JobError>(ctx.snooze_for(Duration::MAX))
                })
                .without_reaper()
                .without_scheduler()
                .start()
                .unwrap()
        };
        std::thread::sleep(Duration::from_millis(500));
        pool.shutdown(Duration::from_secs(1));
        let n = runs.load(Ordering::SeqCst);
        let job = queue.get(id).unwrap();
        eprintln!(
            "runs in 0.5 s: {n}; job {:?} run_at {}",
            job.state, job.run_at
        );
        assert_eq!(
            n, 1,
            "snoozed 'for ever' but ran {n} times in half a second"
        );
    }
    }
}
