//! Review: `JobContext::snooze_for(delay)` is
//! `now + chrono::Duration::from_std(delay).unwrap_or_default()`:
//! a delay too large for TimeDelta (e.g. `Duration::MAX`, "not for a long
//! while") silently becomes zero, so the job is snoozed to *now* and runs
//! again at once, in a hot loop, attempts given back each time.

use crate::support::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tickler::{Durability, JobContext, JobError, NewJob, Queue, WorkerPool};

contract! {
fn snooze_for_a_huge_delay_does_not_rerun_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
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
