//! Worker pool, exactly-once ownership within one process: a pool of four
//! threads fed 2,000 jobs (half enqueued before it starts, half while it
//! runs) runs each job exactly once, records each as succeeded with the
//! run_token its handler saw, and leaves nothing waiting or running.

use crate::support::pool;

use pool::{flavored_tests, Flavor, ScriptHandler};

use pool::{open_queue, secs, temp_db, wait_until, Recorder};
use std::collections::HashMap;
use tickler::{JobFilter, JobId, JobState, NewJob, WorkerPool};

const JOBS: usize = 2_000;

fn every_job_runs_exactly_once_and_succeeds(flavor: &Flavor) {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();

    let job = || NewJob::new("count").payload(serde_json::json!({"action": "ok"}));
    let mut ids: Vec<JobId> = queue
        .enqueue_batch((0..JOBS / 2).map(|_| job()).collect())
        .unwrap();

    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .script_handler(flavor, "count", rec.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap();

    // The rest arrives while the pool is busy, in small batches and single
    // enqueues, so claims race with enqueues and with outcome commits.
    for chunk in 0..10 {
        ids.extend(
            queue
                .enqueue_batch((0..90).map(|_| job()).collect())
                .unwrap(),
        );
        for _ in 0..10 {
            ids.push(queue.enqueue(job()).unwrap());
        }
        if chunk % 3 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    assert_eq!(ids.len(), JOBS);

    wait_until("all 2,000 jobs succeeded", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() == JOBS as u64
    });
    let report = pool.shutdown(secs(5));
    assert_eq!(report.still_running, 0, "{report:?}");

    // Each job ran exactly once.
    let per_id = rec.runs_per_id();
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "jobs not run exactly once: {twice:?}");
    for id in &ids {
        assert_eq!(per_id.get(id), Some(&1), "job {id} never ran");
    }
    assert_eq!(rec.started(), JOBS, "handler starts");
    assert_eq!(rec.ended(), JOBS, "handler ends");

    // Nothing left behind, nothing else happened.
    for state in [
        JobState::Scheduled,
        JobState::Pending,
        JobState::Running,
        JobState::Dead,
        JobState::Cancelled,
    ] {
        assert_eq!(queue.count(state).unwrap(), 0, "jobs left in {state}");
    }
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), JOBS as u64);

    // The stored outcome belongs to the run that did the work: one claim
    // (attempts == 1), and the row's run_token is the one the handler saw.
    let tokens: HashMap<JobId, _> = rec
        .runs()
        .into_iter()
        .map(|r| (r.job_id, r.run_token))
        .collect();
    let rows = queue
        .list(&JobFilter {
            limit: JOBS + 10,
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(rows.len(), JOBS);
    for row in rows {
        assert_eq!(row.state, JobState::Succeeded, "job {}", row.id);
        assert_eq!(row.attempts, 1, "job {} claimed more than once", row.id);
        assert_eq!(
            row.run_token.as_ref(),
            tokens.get(&row.id),
            "job {}",
            row.id
        );
        assert!(
            row.finished_at.is_some(),
            "job {} has no finished_at",
            row.id
        );
        assert_eq!(row.claimed_by.as_deref(), Some(pool.worker_id()));
    }
}

flavored_tests!(poolers: every_job_runs_exactly_once_and_succeeds,);
