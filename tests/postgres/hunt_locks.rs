//! Deadlocks between the queue's own transactions: heartbeats, outcomes,
//! the reaper and cancels on the same rows.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tickler::{Clock, Lease, ManualClock, NewJob, Outcome, Queue};

/// pg-boss #282, procrastinate #328: "deadlock detected" between the
/// queue's maintenance and its workers. Here a pool's outcomes (failures,
/// which are one statement per job, and of jobs cancelled meanwhile) and
/// heartbeats race the reaper over the same expired leases. PostgreSQL
/// breaks a deadlock after `deadlock_timeout` (1 s) and tickler retries,
/// so the sign of one is a call that took a second.
#[test]
fn outcomes_heartbeats_and_the_reaper_do_not_deadlock() {
    let Some(db) = test_database() else { return };
    let start_at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    let clock = Arc::new(ManualClock::new(start_at));
    let open = || {
        Queue::builder(db.url())
            .clock(clock.clone())
            .open()
            .expect("open")
    };
    let (worker, reaper, beater) = (open(), open(), open());
    let mut slowest = Duration::ZERO;
    for round in 0..15 {
        let jobs = (0..30)
            .map(|_| NewJob::new("work").max_attempts(100))
            .collect();
        worker.enqueue_batch(jobs).expect("enqueue");
        let leases: Vec<Lease> = worker
            .claim("default", "w", 30, Duration::from_secs(5))
            .expect("claim");
        assert_eq!(leases.len(), 30, "round {round}");
        for l in leases.iter().step_by(2) {
            worker.cancel(l.job_id).expect("cancel");
        }
        clock.advance(Duration::from_secs(6));
        let barrier = Arc::new(Barrier::new(3));
        let timed = |f: Box<dyn FnOnce() + Send>| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let began = Instant::now();
                f();
                began.elapsed()
            })
        };
        let outcomes_leases = leases.clone();
        let w = worker.clone();
        let t1 = timed(Box::new(move || {
            let outcomes: Vec<(&Lease, Outcome)> = outcomes_leases
                .iter()
                .map(|l| (l, Outcome::Fail("boom".into())))
                .collect();
            w.record_outcomes(&outcomes).expect("record_outcomes");
        }));
        let r = reaper.clone();
        let t2 = timed(Box::new(move || {
            r.reap().expect("reap");
        }));
        let beat_leases: Vec<Lease> = leases.iter().rev().cloned().collect();
        let b = beater.clone();
        let t3 = timed(Box::new(move || {
            let refs: Vec<&Lease> = beat_leases.iter().collect();
            b.heartbeat_many(&refs, Duration::from_secs(5))
                .expect("heartbeat_many");
        }));
        for t in [t1, t2, t3] {
            slowest = slowest.max(t.join().expect("thread"));
        }
        // Leave nothing running for the next round.
        clock.advance(Duration::from_secs(60));
        worker.reap().expect("reap");
        let _ = worker.prune(clock.now() + chrono::Duration::days(1));
        for l in worker
            .claim("default", "w", 100, Duration::from_secs(5))
            .expect("claim")
        {
            worker.complete(&l).expect("complete");
        }
    }
    assert!(
        slowest < Duration::from_millis(700),
        "a call took {slowest:?}: deadlocked and waited for deadlock_timeout"
    );
}
