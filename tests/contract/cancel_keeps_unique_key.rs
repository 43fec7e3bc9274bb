//! A cancelled running job keeps its unique key until its holder has really
//! stopped.
//!
//! The bug it guards: `cancel` on a running job freed its `unique_key` at
//! once, so a new job with the same key started while the old handler was
//! still running (0.7 s of overlap in a pool, 9.5 s through the CLI's shell
//! jobs), and a pool learned of the cancel only at its next heartbeat (a
//! third of the lease: 10 s by default). Now the new job may be enqueued at
//! once but does not start before the cancelled run has reported or its
//! lease has run out, and a pool notices a cancel within about 100 ms.

use crate::support::cli;
use crate::support::common;
use crate::support::pool;

use chrono::Duration as ChronoDuration;
use common::{manual_queue, secs, t0, temp_db};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{CancelReason, JobContext, JobError, JobState, NewJob, WorkerPool};

contract! {
fn the_next_job_with_the_key_waits_until_the_cancelled_holder_reports() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let first = queue
        .enqueue(NewJob::new("k").unique_key("report-42"))
        .unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.cancel(first).unwrap();

    let second = queue
        .enqueue(NewJob::new("k").unique_key("report-42"))
        .expect("a new job with the key may be enqueued at once");
    assert_ne!(second, first);
    assert!(
        queue.manual().claim("default", "w", 1, secs(30)).unwrap().is_empty(),
        "the next job started while the cancelled one may still run"
    );
    assert_eq!(
        queue.manual().next_due(&["default"], None).unwrap(),
        Some(t0() + ChronoDuration::seconds(30) + ChronoDuration::milliseconds(1)),
        "a sleeping fetcher wakes when the cancelled holder's lease runs out"
    );

    // The holder stops and reports; its outcome is refused, and the key is free.
    assert!(queue.manual().complete(&lease).unwrap_err().is_lease_lost());
    let next = queue.manual().claim("default", "w", 1, secs(30)).unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job_id, second);
    assert_eq!(queue.get(first).unwrap().state, JobState::Cancelled);
}
}

/// A job with key "sync" claimed with a 30 s lease (at t0) and cancelled;
/// its holder never reports. Returns the next job with the key.
fn cancelled_holder_vanished() -> (
    tempfile::TempDir,
    tickler::Queue,
    std::sync::Arc<tickler::ManualClock>,
    tickler::JobId,
) {
    let (dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let first = queue.enqueue(NewJob::new("k").unique_key("sync")).unwrap();
    let _vanished = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    queue.cancel(first).unwrap();
    let second = queue.enqueue(NewJob::new("k").unique_key("sync")).unwrap();
    (dir, queue, clock, second)
}

contract! {
fn a_holder_that_never_reports_blocks_the_key_only_until_its_lease_runs_out() {
    let (_dir, queue, clock, second) = cancelled_holder_vanished();
    clock.advance(secs(30));
    assert!(queue.manual().claim("default", "w", 1, secs(30)).unwrap().is_empty());
    clock.advance(Duration::from_millis(1));
    let next = queue.manual().claim("default", "w", 1, secs(30)).unwrap();
    assert_eq!(next[0].job_id, second);
}
}

contract! {
fn a_retried_cancelled_job_waits_for_its_old_holder_too() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let _old = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.cancel(id).unwrap();
    queue.retry(id).unwrap();
    assert!(queue.manual().claim("default", "w", 1, secs(30)).unwrap().is_empty());
    clock.advance(secs(31));
    assert_eq!(queue.manual().claim("default", "w", 1, secs(30)).unwrap().len(), 1);
}
}

/// When each run of a job started and ended, and when it saw its cancel.
#[derive(Default)]
struct Timeline {
    starts: Mutex<Vec<(String, Instant)>>,
    ends: Mutex<Vec<(String, Instant)>>,
    cancel_seen: Mutex<Option<(Instant, Option<CancelReason>)>>,
}

contract! {
fn in_a_pool_the_next_run_never_overlaps_the_cancelled_one() {
    let (_dir, path) = temp_db();
    let queue = pool::open_queue(&path);
    let timeline = Arc::new(Timeline::default());
    let seen = Arc::clone(&timeline);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("export", move |ctx: &JobContext| {
            let name = ctx.payload()["name"].as_str().unwrap_or("?").to_owned();
            seen.starts
                .lock()
                .unwrap()
                .push((name.clone(), Instant::now()));
            if name == "first" {
                let until = Instant::now() + secs(20);
                while !ctx.is_cancelled() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(2));
                }
                *seen.cancel_seen.lock().unwrap() = Some((Instant::now(), ctx.cancel_reason()));
                // Cleaning up after the cancel takes a while.
                std::thread::sleep(Duration::from_millis(700));
            }
            seen.ends.lock().unwrap().push((name, Instant::now()));
            Ok::<(), JobError>(())
        })
        .start()
        .unwrap();
    let first = queue
        .enqueue(
            NewJob::new("export")
                .unique_key("export-7")
                .payload(serde_json::json!({"name": "first"})),
        )
        .unwrap();
    pool::wait_until("the first run started", secs(10), || {
        !timeline.starts.lock().unwrap().is_empty()
    });
    let cancelled_at = Instant::now();
    queue.cancel(first).unwrap();
    let second = queue
        .enqueue(
            NewJob::new("export")
                .unique_key("export-7")
                .payload(serde_json::json!({"name": "second"})),
        )
        .unwrap();
    pool::wait_until("the second job succeeded", secs(20), || {
        queue.get(second).unwrap().state == JobState::Succeeded
    });
    pool.shutdown(secs(5));

    let (noticed, reason) = timeline
        .cancel_seen
        .lock()
        .unwrap()
        .expect("first saw its cancel");
    assert_eq!(reason, Some(CancelReason::LeaseLost));
    let delay = noticed - cancelled_at;
    assert!(
        delay < secs(2),
        "the pool noticed the cancel only after {delay:?} (heartbeats come every 10 s)"
    );
    let ends = timeline.ends.lock().unwrap().clone();
    let starts = timeline.starts.lock().unwrap().clone();
    let first_end = ends
        .iter()
        .find(|(n, _)| n == "first")
        .expect("first ended")
        .1;
    let second_start = starts
        .iter()
        .find(|(n, _)| n == "second")
        .expect("second ran")
        .1;
    assert!(
        second_start >= first_end,
        "the second run started {:?} before the cancelled one ended",
        first_end - second_start
    );
    assert_eq!(queue.get(first).unwrap().state, JobState::Cancelled);
}
}

contract! {
fn through_the_cli_the_cancelled_command_is_stopped_before_the_next_starts() {
    use cli::{eventually, Env};
    let env = Env::new();
    let pidfile = env.dir.path().join("first.pid");
    let first = env.enqueue_shell(
        &[
            "sh",
            "-c",
            &format!("echo $$ > '{}'; exec sleep 30", pidfile.display()),
        ],
        &["--unique-key", "nightly"],
    );
    let mut worker = env.spawn(&["work", "--reap-interval", "100ms"]);
    eventually(secs(15), "the first command runs", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|p| p.ends_with('\n'))
    });
    env.run(&["cancel", &first.to_string()]).ok();
    let cancelled = Instant::now();
    // The second command records whether the first is still alive.
    let overlap = env.dir.path().join("overlap");
    let second = env.enqueue_shell(
        &[
            "sh",
            "-c",
            &format!(
                "if kill -0 \"$(cat '{p}')\" 2>/dev/null; then touch '{o}'; fi",
                p = pidfile.display(),
                o = overlap.display()
            ),
        ],
        &["--unique-key", "nightly"],
    );
    eventually(secs(20), "the second job ran", || {
        env.job(second).state == JobState::Succeeded
    });
    let took = cancelled.elapsed();
    cli::signal(&worker, libc::SIGTERM);
    let _ = worker.wait();
    assert!(
        !overlap.exists(),
        "the second command ran while the first still ran"
    );
    assert!(
        took < secs(10),
        "the cancelled command was stopped only after {took:?}"
    );
    assert_eq!(env.job(first).state, JobState::Cancelled);
}
}

contract! {
fn after_a_backward_clock_step_the_key_waits_one_lease_not_until_the_clock_catches_up() {
    let (_dir, queue, clock, second) = cancelled_holder_vanished();
    // The clock was two hours ahead; it is set right.
    clock.set(t0() - ChronoDuration::hours(2));
    queue.manual().reap().unwrap();
    clock.advance(secs(31));
    let next = queue.manual().claim("default", "w", 1, secs(30)).unwrap();
    assert_eq!(next.len(), 1, "the key waited for the clock to catch up");
    assert_eq!(next[0].job_id, second);
}
}
