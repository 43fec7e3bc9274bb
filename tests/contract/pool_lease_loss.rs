//! Worker pool and leases (guarantees 3 and 4 as seen through the pool):
//!
//! - a pool whose lease is taken away while its handler runs (reaped by a
//!   reaper whose clock is past the lease, or the job cancelled) sets the
//!   handler's cancellation flag to `LeaseLost` at its next heartbeat and
//!   drops the handler's late outcome: what the new holder (or the
//!   operator) wrote stays;
//! - with automatic heartbeats, a handler running three times its lease
//!   keeps the job although reapers run every few tens of milliseconds;
//! - a refused heartbeat of a job's earlier run never cancels its next run
//!   (a job failed and claimed again at once, in the same transaction).

use crate::support::pool;

use pool::{flavored_tests, Flavor, ScriptHandler};

use chrono::Utc;
use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
use std::time::Duration;
use tickler::{
    CancelReason, Durability, JobState, ManualClock, NewJob, Queue, Reaper, ReaperConfig,
    WorkerPool,
};

/// A second handle on the file whose clock stands `ahead` of the real one.
fn queue_from_the_future(path: &std::path::Path, ahead: Duration) -> Queue {
    let clock = ManualClock::new(Utc::now() + chrono::Duration::from_std(ahead).unwrap());
    Queue::builder(pool::engine::target(path))
        .clock(std::sync::Arc::new(clock))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .unwrap()
}

fn reaped_lease_cancels_the_handler_and_its_late_outcome_is_refused(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    // Heartbeats every second; no reaper in the pool (its clock is real, the
    // lease is kept alive anyway): the reaper that takes the job is the
    // future one below.
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .lease(secs(3))
        .heartbeat_interval(secs(1))
        .without_reaper()
        .script_handler(flavor, "work", rec.script())
        .shutdown_grace(secs(2))
        .start()
        .unwrap();

    let id = queue
        .enqueue(NewJob::new("work").payload(serde_json::json!({
            "block": true,
            "wait_cancel_ms": 15_000,
            "action": "permanent",
            "message": "stale worker's late outcome",
        })))
        .unwrap();
    wait_until("the handler started", secs(10), || rec.started() == 1);
    let first = rec.runs()[0].clone();
    assert_eq!(first.job_id, id);
    assert_eq!(first.attempt, 1);

    // The pool records the start about a second after it; from then on a
    // lost lease counts the attempt.
    wait_until("the pool recorded the start", secs(30), || {
        crate::support::engine::query_int(
            &path,
            "SELECT count(*) FROM tickler_jobs WHERE started_at IS NOT NULL",
            &[],
        ) == 1
    });
    // A reaper whose "now" is 100 days ahead finds the lease expired: its
    // update does not depend on any heartbeat timing.
    let day = secs(24 * 3600);
    let reaper = queue_from_the_future(&path, day * 100);
    assert_eq!(
        reaper.manual().reap().unwrap(),
        1,
        "the future reaper takes the job"
    );
    let reaped = queue.get(id).unwrap();
    assert!(
        matches!(reaped.state, JobState::Pending | JobState::Scheduled),
        "reaped job is {:?}",
        reaped.state
    );

    // Another holder claims it (its clock is past any backoff the reaper
    // set; the pool's real clock is not, so the pool cannot claim it).
    let thief = queue_from_the_future(&path, day * 100 + secs(3 * 3600));
    let leases = thief
        .manual()
        .claim("default", "thief", 1, secs(3600))
        .unwrap();
    assert_eq!(leases.len(), 1, "the new holder claims the reaped job");
    let lease = leases.into_iter().next().unwrap();
    assert_eq!(lease.job_id, id);
    assert_eq!(lease.attempt, 2);
    assert_ne!(lease.run_token, first.run_token, "a fresh run_token");

    // The stale handler goes on; its next heartbeat is refused.
    rec.gate.open();
    wait_until("the stale handler returned", secs(20), || rec.ended() == 1);
    let end = rec.ends()[0].clone();
    assert_eq!(
        end.seen_cancel,
        Some(CancelReason::LeaseLost),
        "the handler's cancellation flag after losing its lease"
    );
    assert_eq!(end.cancel_reason, Some(CancelReason::LeaseLost));
    wait_until("the pool let go of the job", secs(10), || {
        pool.in_flight() == 0
    });

    // The late outcome changed nothing: the job is the new holder's.
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Running, "{job:?}");
    assert_eq!(job.run_token.as_ref(), Some(&lease.run_token));
    assert_eq!(job.claimed_by.as_deref(), Some("thief"));
    assert_eq!(job.attempts, 2);
    assert_ne!(
        job.last_error.as_deref(),
        Some("stale worker's late outcome"),
        "the stale worker's outcome was written"
    );

    // The new holder finishes normally; the stale one never ran it again.
    thief.manual().complete(&lease).unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.run_token.as_ref(), Some(&lease.run_token));
    assert_ne!(
        job.last_error.as_deref(),
        Some("stale worker's late outcome")
    );
    assert_eq!(rec.started(), 1, "the pool ran the job again");
    let report = pool.shutdown(secs(2));
    assert_eq!(report.still_running, 0);
}

fn cancelled_job_cancels_the_handler_and_its_late_outcome_is_refused(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = WorkerPool::builder(&queue)
        .threads(1)
        .lease(secs(3))
        .heartbeat_interval(ms(200))
        .script_handler(flavor, "work", rec.script())
        .shutdown_grace(secs(2))
        .start()
        .unwrap();
    // Succeeds if its outcome were recorded.
    let id = queue
        .enqueue(NewJob::new("work").payload(serde_json::json!({"wait_cancel_ms": 15_000})))
        .unwrap();
    wait_until("the handler started", secs(10), || rec.started() == 1);

    // The operator cancels it through another handle (as another process would).
    let operator = open_queue(&path);
    operator.cancel(id).unwrap();

    wait_until("the handler returned", secs(20), || rec.ended() == 1);
    let end = rec.ends()[0].clone();
    assert_eq!(end.seen_cancel, Some(CancelReason::LeaseLost));
    wait_until("the pool let go of the job", secs(10), || {
        pool.in_flight() == 0
    });
    let job = queue.get(id).unwrap();
    assert_eq!(
        job.state,
        JobState::Cancelled,
        "the late Ok overwrote the cancel"
    );
    assert_eq!(job.run_token.as_ref(), Some(&rec.runs()[0].run_token));
    assert_eq!(rec.started(), 1);
    pool.shutdown(secs(2));
}

fn heartbeats_keep_a_job_running_three_times_its_lease(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .lease(ms(300))
        .reaper(ReaperConfig {
            interval: ms(50),
            prune_finished_after: None,
            ..ReaperConfig::default()
        })
        .script_handler(flavor, "long", rec.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap();
    // Another reaper on its own handle, as another process would run.
    let _other_reaper = Reaper::spawn(
        open_queue(&path),
        ReaperConfig {
            interval: ms(20),
            prune_finished_after: None,
            ..ReaperConfig::default()
        },
    );

    let id = queue
        .enqueue(NewJob::new("long").payload(serde_json::json!({"sleep_ms": 1_000})))
        .unwrap();
    wait_until("the long job finished", secs(15), || {
        queue.get(id).unwrap().state.is_terminal()
    });
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.attempts, 1, "the job was claimed again: {job:?}");
    assert_eq!(job.last_error, None, "{job:?}");
    assert_eq!(rec.started(), 1, "the handler ran more than once");
    let end = rec.ends()[0].clone();
    assert_eq!(end.cancel_reason, None, "the handler was told to stop");
    assert!(
        end.ended - rec.runs()[0].started >= ms(900),
        "the handler really ran past its lease"
    );
    assert_eq!(job.run_token.as_ref(), Some(&end.run_token));
    pool.shutdown(secs(5));
}

contract! { poolers:
/// A job that fails and is claimed again at once (zero backoff, in the same
/// transaction that records the failure) must not be told it lost its lease
/// because a heartbeat of its *previous* run, already in flight, came back
/// refused. Nothing here takes leases (no reaper, no cancel), so any
/// `LeaseLost` a handler sees is wrong, and a run whose outcome is dropped
/// for it stays `running` forever.
fn a_stale_heartbeat_of_a_previous_run_does_not_cancel_the_next_run() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use tickler::{JobContext, JobError};

    const JOBS: usize = 2;
    const RUNS: u32 = 300;
    let (_dir, path) = temp_db();
    let queue = Queue::builder(pool::engine::target(&path))
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(pool::no_backoff())
        .open()
        .unwrap();
    let lost: Arc<Mutex<Vec<(tickler::JobId, u32, tickler::RunToken)>>> = Arc::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let (lost_h, runs_h) = (Arc::clone(&lost), Arc::clone(&runs));
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .lease(secs(5))
        .heartbeat_interval(ms(1))
        .without_reaper()
        .handler("flaky", move |ctx: &JobContext| {
            runs_h.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(ms(3));
            if ctx.cancel_reason() == Some(CancelReason::LeaseLost) {
                lost_h
                    .lock()
                    .unwrap()
                    .push((ctx.job_id(), ctx.attempt(), ctx.run_token().clone()));
            }
            if ctx.attempt() < RUNS {
                Err(JobError::retry("not yet"))
            } else {
                Ok(())
            }
        })
        .shutdown_grace(secs(2))
        .start()
        .unwrap();
    queue
        .enqueue_batch(
            (0..JOBS)
                .map(|_| NewJob::new("flaky").max_attempts(RUNS + 5))
                .collect(),
        )
        .unwrap();
    // Ends early at the first wrongly cancelled run.
    wait_until(
        "every job ran to success, or a run was told LeaseLost",
        secs(15),
        || {
            !lost.lock().unwrap().is_empty()
                || queue.count(JobState::Succeeded).unwrap() == JOBS as u64
        },
    );
    let lost = lost.lock().unwrap().clone();
    if !lost.is_empty() {
        // A run whose outcome was dropped leaves its job running (no reaper).
        std::thread::sleep(ms(300));
    }
    let stuck: Vec<_> = lost
        .iter()
        .filter(|(id, _, token)| {
            let job = queue.get(*id).unwrap();
            job.state == JobState::Running && job.run_token.as_ref() == Some(token)
        })
        .map(|(id, attempt, _)| (id.0, *attempt))
        .collect();
    pool.shutdown(secs(2));
    assert!(
        lost.is_empty(),
        "handlers were told LeaseLost although nothing took their lease: \
         (job, attempt) {:?} after {} runs; left running with that run's \
         token, outcome dropped: {stuck:?}",
        lost.iter().map(|(id, a, _)| (id.0, *a)).collect::<Vec<_>>(),
        runs.load(Ordering::SeqCst)
    );
    for job in queue.list(&tickler::JobFilter::default()).unwrap() {
        assert_eq!(job.attempts, RUNS, "{job:?}");
    }
}
}

flavored_tests!(poolers:
    reaped_lease_cancels_the_handler_and_its_late_outcome_is_refused,
    cancelled_job_cancels_the_handler_and_its_late_outcome_is_refused,
    heartbeats_keep_a_job_running_three_times_its_lease,
);
