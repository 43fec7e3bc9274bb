//! First light of the PostgreSQL engine: a job's whole life.
#![cfg(feature = "postgres")]

use crate::support::pg;

use std::time::Duration;
use tickler::{JobState, NewJob, Queue, RetryPolicy};

#[test]
fn enqueue_claim_complete_fail_reap() {
    let Some(db) = pg::test_database() else {
        return;
    };
    // Without jitter: a full-jitter draw of 0 ms would make the failed job
    // pending at once instead of scheduled.
    let queue = Queue::builder(db.url())
        .retry_policy(RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            jitter: false,
        })
        .open()
        .expect("open");
    assert_eq!(queue.ops().engine(), "PostgreSQL");
    let a = queue.enqueue(NewJob::new("a")).unwrap();
    let b = queue.enqueue(NewJob::new("b").unique_key("k")).unwrap();
    assert_eq!(queue.enqueue(NewJob::new("b").unique_key("k")).unwrap(), b);
    let leases = queue
        .manual()
        .claim("default", "w", 10, Duration::from_secs(30))
        .unwrap();
    assert_eq!(leases.len(), 2);
    queue.manual().complete(&leases[0]).unwrap();
    queue.manual().fail(&leases[1], "boom").unwrap();
    assert!(queue
        .manual()
        .complete(&leases[0])
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(queue.get(a).unwrap().state, JobState::Succeeded);
    let failed = queue.get(b).unwrap();
    assert_eq!(failed.state, JobState::Scheduled);
    assert_eq!(failed.errors.len(), 1);
    assert_eq!(queue.manual().reap().unwrap(), 0);
    let stats = queue.stats().unwrap();
    assert_eq!(stats.total(JobState::Succeeded), 1);
}

/// A batch goes in with one statement; each id returned is its own job's,
/// in input order, also mixed with keyed jobs inserted one by one.
#[test]
fn batch_ids_come_back_in_input_order() {
    let Some(db) = pg::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let held = queue.enqueue(NewJob::new("k").unique_key("held")).unwrap();
    let jobs: Vec<NewJob> = (0..1000)
        .map(|i| {
            let job = NewJob::new("n").payload(serde_json::json!({ "i": i }));
            match i % 250 {
                7 => job.unique_key(format!("key-{i}")),
                9 => job.unique_key("held"),
                _ => job,
            }
        })
        .collect();
    let ids = queue.enqueue_batch(jobs).unwrap();
    for (i, id) in ids.iter().enumerate() {
        if i % 250 == 9 {
            assert_eq!(*id, held);
            continue;
        }
        assert_eq!(queue.get(*id).unwrap().payload["i"], i, "job {id}");
    }
}
