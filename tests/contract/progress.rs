//! Progress (`JobContext::progress`, `Manual::record_progress`): a
//! handler's reports reach this process's subscribers at once, every one
//! of them; the pool stores the last one a few times a second and before
//! the outcome, fenced by the run_token, so `get` shows it while the job
//! runs and after it ends; a stale holder's report is refused like its
//! outcome; bad reports are refused before anything is written.

use crate::support::common;
use crate::support::pool;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use pool::{open_queue, wait_until, Gate};
use std::sync::{Arc, Mutex};
use tickler::{
    Error, Event, JobContext, JobError, JobEventKind, JobState, NewJob, Progress, WorkerPool,
};

fn progress(fraction: f64, message: &str) -> Option<Progress> {
    Some(Progress {
        fraction,
        message: message.to_owned(),
    })
}

contract! { poolers:
fn progress_is_stored_fenced_by_the_run_token_and_shown_by_get() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();
    assert_eq!(queue.get(id).unwrap().progress, None);
    let first = queue.manual().claim("default", "w1", 1, secs(30)).unwrap().remove(0);
    queue.manual().record_progress(&[(&first, 0.25, "reading")]).unwrap();
    assert_eq!(queue.get(id).unwrap().progress, progress(0.25, "reading"));

    // Refused before anything is written.
    for (fraction, message) in [(1.5, "x"), (-0.1, "x"), (f64::NAN, "x")] {
        let err = queue.manual().record_progress(&[(&first, fraction, message)]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{fraction}: {err:?}");
    }
    let long = "x".repeat(tickler::MAX_PROGRESS_MESSAGE_BYTES + 1);
    let err = queue.manual().record_progress(&[(&first, 0.5, long.as_str())]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(queue.get(id).unwrap().progress, progress(0.25, "reading"));

    // The first holder's lease runs out and the job is claimed again: the
    // stale holder's report is refused, the new one's stored.
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    clock.advance(secs(2));
    let second = queue.manual().claim("default", "w2", 1, secs(30)).unwrap().remove(0);
    queue.manual().record_progress(&[(&first, 0.9, "stale")]).unwrap();
    assert_eq!(queue.get(id).unwrap().progress, progress(0.25, "reading"));
    queue.manual().record_progress(&[(&second, 0.5, "again")]).unwrap();
    assert_eq!(queue.get(id).unwrap().progress, progress(0.5, "again"));

    // Kept once the job has finished; a report after the outcome is refused.
    queue.manual().complete(&second).unwrap();
    queue.manual().record_progress(&[(&second, 1.0, "late")]).unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.progress), (JobState::Succeeded, progress(0.5, "again")));
}
}

contract! { poolers:
/// A handler reports 100,000 times in a loop, then once more and waits:
/// the report shows in `get` while the job runs (stored by the pool within
/// its interval), the last one before success stays after it, and this
/// process's subscribers got every report of a short run, in order.
fn a_pools_handler_reports_progress_that_get_and_subscribers_see() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let gate = Arc::new(Gate::default());
    let mut pool = {
        let gate = Arc::clone(&gate);
        WorkerPool::builder(&queue)
            .handler("long", move |ctx: &JobContext| {
                for i in 0..100_000 {
                    ctx.progress(f64::from(i) / 200_000.0, "counting")?;
                }
                ctx.progress(0.5, "half way")?;
                gate.wait(secs(30));
                ctx.progress(1.0, "done")?;
                Ok::<(), JobError>(())
            })
            .handler("short", |ctx: &JobContext| {
                for i in 0..=10 {
                    ctx.progress(f64::from(i) / 10.0, format!("step {i}"))?;
                }
                Ok::<(), JobError>(())
            })
            .start()
            .unwrap()
    };
    let long = queue.enqueue(NewJob::new("long")).unwrap();
    wait_until("the half-way report is stored", secs(20), || {
        queue.get(long).unwrap().progress == progress(0.5, "half way")
    });
    gate.open();
    wait_until("the long job succeeded", secs(20), || {
        queue.get(long).unwrap().state == JobState::Succeeded
    });
    assert_eq!(queue.get(long).unwrap().progress, progress(1.0, "done"));

    // Subscribed after the long job's 100,000 reports, which would have
    // filled its buffer.
    let events = queue.subscribe(1_000);
    let short = queue.enqueue(NewJob::new("short")).unwrap();
    wait_until("the short job succeeded", secs(20), || {
        queue.get(short).unwrap().state == JobState::Succeeded
    });
    pool.shutdown(secs(5));
    assert_eq!(queue.get(short).unwrap().progress, progress(1.0, "step 10"));
    let reports: Vec<(f64, String)> = events
        .drain()
        .into_iter()
        .filter_map(|event| match event {
            Event::Job(job) if job.job_id == short => match job.what {
                JobEventKind::Progress { fraction, message } => Some((fraction, message)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let expected: Vec<(f64, String)> =
        (0..=10).map(|i| (f64::from(i) / 10.0, format!("step {i}"))).collect();
    assert_eq!(reports, expected);
}
}

contract! { poolers:
/// Once its run knows it lost its lease (the job was cancelled), a
/// handler's report is refused with `LeaseLost`, and nothing it reports
/// is stored.
fn a_handler_that_lost_its_lease_has_its_progress_refused() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let said: Arc<Mutex<Option<tickler::Result<()>>>> = Arc::default();
    let mut pool = {
        let said = Arc::clone(&said);
        WorkerPool::builder(&queue)
            .handler("k", move |ctx: &JobContext| {
                ctx.progress(0.1, "started")?;
                let deadline = std::time::Instant::now() + secs(20);
                while !ctx.is_cancelled() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                *said.lock().unwrap() = Some(ctx.progress(0.9, "after the cancel"));
                Ok::<(), JobError>(())
            })
            .start()
            .unwrap()
    };
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    wait_until("the first report is stored", secs(20), || {
        queue.get(id).unwrap().progress == progress(0.1, "started")
    });
    queue.cancel(id).unwrap();
    wait_until("the handler reported after the cancel", secs(20), || {
        said.lock().unwrap().is_some()
    });
    pool.shutdown(secs(5));
    let said = said.lock().unwrap().take().unwrap();
    assert!(matches!(said, Err(Error::LeaseLost { job_id }) if job_id == id), "{said:?}");
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.progress), (JobState::Cancelled, progress(0.1, "started")));
}
}

contract! { poolers:
/// One batch that names a job twice: the last report given for the run
/// that holds the lease is stored, never the stale holder's.
fn a_batch_naming_a_job_twice_stores_its_holders_last_report() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();
    let first = queue.manual().claim("default", "w1", 1, secs(30)).unwrap().remove(0);
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    clock.advance(secs(2));
    let second = queue.manual().claim("default", "w2", 1, secs(30)).unwrap().remove(0);
    queue
        .manual()
        .record_progress(&[(&second, 0.5, "current"), (&first, 0.9, "stale")])
        .unwrap();
    assert_eq!(queue.get(id).unwrap().progress, progress(0.5, "current"));
    queue
        .manual()
        .record_progress(&[(&second, 0.6, "a"), (&second, 0.7, "b \u{e9}\u{4e2d}")])
        .unwrap();
    assert_eq!(queue.get(id).unwrap().progress, progress(0.7, "b \u{e9}\u{4e2d}"));
}
}

contract! { poolers:
/// 400 short runs whose handlers report just before they return: every
/// one of them keeps that last report once it has succeeded (the
/// heartbeat's store and the one before the outcome race; 6 to 53 of
/// 3,000 lost it when a report counted as stored before its write).
fn each_runs_last_report_before_success_is_kept() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let ids = queue
        .enqueue_batch((0..400).map(|_| NewJob::new("k")).collect())
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("k", |ctx: &JobContext| {
            ctx.progress(1.0, "done")?;
            let until = std::time::Instant::now() + std::time::Duration::from_micros(300);
            while std::time::Instant::now() < until {}
            Ok::<(), JobError>(())
        })
        .start()
        .unwrap();
    wait_until("all succeeded", secs(120), || {
        queue.count(JobState::Succeeded).unwrap() == 400
    });
    pool.shutdown(secs(5));
    let lost: Vec<_> = ids
        .iter()
        .filter(|id| queue.get(**id).unwrap().progress != progress(1.0, "done"))
        .collect();
    assert!(lost.is_empty(), "{} lack their last report: {lost:?}", lost.len());
}
}

contract! { sqlite_only:
/// SQLite only: `complete_with`'s closure names the engine's own
/// transaction type; the store of the last report before it is
/// `JobContext`'s, the same on every engine. A handler that reports and
/// then completes its job itself keeps its last report.
fn a_handler_completing_its_job_itself_keeps_its_last_report() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let handler = |ctx: &JobContext| {
        ctx.progress(1.0, "done")?;
        ctx.complete_with(|_tx: &tickler::rusqlite::Transaction| Ok(()))?;
        Ok::<(), JobError>(())
    };
    tickler::testing::run_one(&queue, "default", "k", &handler).unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.progress), (JobState::Succeeded, progress(1.0, "done")));
}
}

contract! { sqlite_only:
/// SQLite only: there a test can hold the one write lock past the busy
/// timeout and retry window. A store that failed is made again: the
/// report counts as stored only once its write committed.
fn a_report_whose_store_failed_is_stored_later() {
    let (_dir, path) = temp_db();
    let queue = tickler::Queue::builder(crate::support::engine::target(&path))
        .busy_timeout(std::time::Duration::from_millis(100))
        .busy_retry(std::time::Duration::from_millis(100))
        .open()
        .unwrap();
    let (reported, finish) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
    let mut pool = {
        let (reported, finish) = (Arc::clone(&reported), Arc::clone(&finish));
        WorkerPool::builder(&queue)
            .handler("k", move |ctx: &JobContext| {
                ctx.progress(1.0, "done")?;
                reported.open();
                finish.wait(secs(30));
                Ok::<(), JobError>(())
            })
            .start()
            .unwrap()
    };
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    assert!(reported.wait(secs(20)));
    // The write lock held across the next progress stores.
    crate::support::engine::hold_job_row(&path, id.0, std::time::Duration::from_millis(1500))
        .join()
        .unwrap();
    finish.open();
    wait_until("succeeded", secs(20), || {
        queue.get(id).unwrap().state == JobState::Succeeded
    });
    pool.shutdown(secs(5));
    assert_eq!(queue.get(id).unwrap().progress, progress(1.0, "done"));
}
}
