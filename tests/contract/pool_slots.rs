//! A pool's fetcher claims no more jobs than it has free worker slots
//! (prefetch 0, and by default while it has not yet seen a handler return):
//! a busy pool does not sit on due jobs that another pool could run. Pool A
//! (2 threads, handlers blocked) holds exactly 2 of 10 jobs; pool B, started
//! later on its own handle of the file, gets and runs the other 8 while A's
//! handlers are still blocked. (Jobs claimed ahead by a pool that expected
//! short jobs: `tests/contract/prefetch_by_time.rs`.)

use crate::support::pool;

use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
use std::collections::HashSet;
use tickler::{JobFilter, JobState, NewJob, WorkerPool};

contract! { poolers:
fn a_busy_pool_claims_no_more_than_its_free_slots() {
    a_busy_pool_holds_its_threads_worth(Some(0));
}
}

contract! { poolers:
fn a_busy_pool_with_default_settings_claims_no_more_than_its_free_slots() {
    a_busy_pool_holds_its_threads_worth(None);
}
}

/// `prefetch: None` leaves the pool's default.
fn a_busy_pool_holds_its_threads_worth(prefetch: Option<usize>) {
    let (_dir, path) = temp_db();
    let queue_a = open_queue(&path);
    let rec_a = Recorder::new();
    let mut builder = WorkerPool::builder(&queue_a);
    if let Some(n) = prefetch {
        builder = builder.prefetch(n);
    }
    let mut pool_a = builder
        .threads(2)
        .lease(secs(5))
        .heartbeat_interval(ms(40))
        .handler("block", rec_a.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap();

    let ids = queue_a
        .enqueue_batch(
            (0..10)
                .map(|_| NewJob::new("block").payload(serde_json::json!({"block": true})))
                .collect(),
        )
        .unwrap();
    wait_until("pool A runs 2 jobs", secs(10), || rec_a.started() == 2);

    // For a while, A holds 2 and leaves 8. Meanwhile its dispatcher is
    // woken: by heartbeats (every 40 ms) and, halfway, by an enqueue of a
    // kind nobody handles through A's own handle (an in-process wake-up).
    let pending_block = || {
        queue_a
            .list(&JobFilter {
                state: Some(JobState::Pending),
                kind: Some("block".into()),
                ..JobFilter::default()
            })
            .unwrap()
            .len()
    };
    for i in 0..8 {
        if i == 4 {
            queue_a.enqueue(NewJob::new("nobody")).unwrap();
        }
        assert_eq!(queue_a.count(JobState::Running).unwrap(), 2);
        assert_eq!(pending_block(), 8);
        assert_eq!(pool_a.in_flight(), 2);
        assert_eq!(rec_a.started(), 2);
        std::thread::sleep(ms(25));
    }

    // Pool B, on its own handle of the file, gets the other 8 and runs them
    // while A's two are still blocked.
    let queue_b = open_queue(&path);
    let rec_b = Recorder::new();
    rec_b.gate.open();
    let mut pool_b = WorkerPool::builder(&queue_b)
        .threads(8)
        .handler("block", rec_b.script())
        .shutdown_grace(secs(5))
        .start()
        .unwrap();
    wait_until("pool B ran the other 8", secs(10), || {
        queue_b.count(JobState::Succeeded).unwrap() == 8
    });
    assert_eq!(rec_b.started(), 8);
    assert_eq!(
        rec_a.ended(),
        0,
        "A's handlers are still blocked while B works"
    );
    assert_eq!(queue_b.count(JobState::Running).unwrap(), 2);
    assert_eq!(pending_block(), 0);

    let a_ids: HashSet<_> = rec_a.runs().iter().map(|r| r.job_id).collect();
    let b_ids: HashSet<_> = rec_b.runs().iter().map(|r| r.job_id).collect();
    assert_eq!(a_ids.len(), 2);
    assert_eq!(b_ids.len(), 8);
    assert!(a_ids.is_disjoint(&b_ids), "a job ran in both pools");
    let all: HashSet<_> = a_ids.union(&b_ids).copied().collect();
    assert_eq!(all, ids.iter().copied().collect());

    rec_a.gate.open();
    wait_until("all 10 succeeded", secs(10), || {
        queue_a.count(JobState::Succeeded).unwrap() == 10
    });
    assert_eq!(pool_a.shutdown(secs(5)).still_running, 0);
    assert_eq!(pool_b.shutdown(secs(5)).still_running, 0);
    assert_eq!(rec_a.started() + rec_b.started(), 10);
}
