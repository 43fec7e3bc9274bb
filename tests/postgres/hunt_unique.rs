//! Unique jobs inserted concurrently, as several machines do.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tickler::{JobFilter, NewJob, Queue};

fn keyed_jobs(queue: &Queue, key: &str) -> usize {
    queue
        .list(&JobFilter {
            limit: 10_000,
            ..Default::default()
        })
        .expect("list")
        .into_iter()
        .filter(|j| j.unique_key.as_deref() == Some(key))
        .count()
}

/// Oban #1087: the same unique job inserted from several nodes at once
/// was stored more than once. Six "processes" (each its own `Queue`)
/// insert one key at the same moment: one job, one id for all.
#[test]
fn one_key_from_many_processes_at_once_is_one_job() {
    let Some(db) = test_database() else { return };
    let queues: Vec<Queue> = (0..6)
        .map(|_| Queue::open(db.url()).expect("open"))
        .collect();
    for round in 0..15 {
        let key = format!("k{round}");
        let start = Arc::new(Barrier::new(queues.len()));
        let handles: Vec<_> = queues
            .iter()
            .map(|q| {
                let (q, key, start) = (q.clone(), key.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    q.enqueue(NewJob::new("work").unique_key(key))
                })
            })
            .collect();
        let ids: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("enqueue"))
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "round {round}: {ids:?}");
        assert_eq!(keyed_jobs(&queues[0], &key), 1, "round {round}");
    }
}

/// pg-boss #282 ("deadlock detected" between two of the queue's own
/// statements): here two batches hold the same unique keys in opposite
/// orders. Each insert
/// of a key waits for the other batch's uncommitted insert of it, so two
/// batches meeting in the middle deadlock; PostgreSQL breaks it after
/// `deadlock_timeout` (1 s) and the retry succeeds, so the only sign is a
/// second lost per collision. Batches must take keys in one order.
#[test]
fn batches_with_keys_in_opposite_orders_do_not_deadlock() {
    let Some(db) = test_database() else { return };
    let a = Queue::open(db.url()).expect("open");
    let b = Queue::open(db.url()).expect("open");
    let mut slowest = Duration::ZERO;
    for round in 0..10 {
        let keys: Vec<String> = (0..20).map(|i| format!("r{round}-k{i}")).collect();
        let start = Arc::new(Barrier::new(2));
        let run = |q: &Queue, keys: Vec<String>| {
            let (q, start) = (q.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let jobs = keys
                    .into_iter()
                    .map(|k| NewJob::new("work").unique_key(k))
                    .collect();
                start.wait();
                let began = Instant::now();
                let ids = q.enqueue_batch(jobs).expect("enqueue_batch");
                (ids, began.elapsed())
            })
        };
        let forward = run(&a, keys.clone());
        let backward = run(&b, keys.iter().rev().cloned().collect());
        let (ids_f, took_f) = forward.join().expect("thread");
        let (mut ids_b, took_b) = backward.join().expect("thread");
        ids_b.reverse();
        assert_eq!(ids_f, ids_b, "round {round}: one job per key");
        slowest = slowest.max(took_f).max(took_b);
    }
    assert!(
        slowest < Duration::from_millis(700),
        "a batch took {slowest:?}: deadlocked and waited for deadlock_timeout"
    );
}

/// Oban #1093: an insert that found a key held by another transaction's
/// uncommitted job assumed that job would commit; when it rolled back, no
/// job was left. The waiting insert must store its own job then.
#[test]
fn a_key_whose_holder_rolls_back_is_inserted_by_the_waiter() {
    let Some(db) = test_database() else { return };
    let queue = Queue::open(db.url()).expect("open");
    let mut app = db.connect();
    let mut tx = app.transaction().expect("begin");
    let held = queue
        .enqueue_pg_tx(&mut tx, NewJob::new("work").unique_key("k"))
        .expect("enqueue in the app's transaction");
    let other = queue.clone();
    let waiter = std::thread::spawn(move || other.enqueue(NewJob::new("work").unique_key("k")));
    std::thread::sleep(Duration::from_millis(300));
    tx.rollback().expect("rollback");
    let id = waiter.join().expect("thread").expect("enqueue");
    assert_ne!(id, held, "the rolled-back job does not exist");
    assert_eq!(
        queue
            .get(id)
            .expect("the waiter's job")
            .unique_key
            .as_deref(),
        Some("k")
    );
    assert_eq!(keyed_jobs(&queue, "k"), 1);
}

/// Oban #1087 again, with a DBA's `lock_timeout`: a key held by an
/// application's transaction that stays open a little longer than the
/// timeout. The insert waiting on it is cancelled ("canceling statement
/// due to lock timeout"); that is a moment's contention, not an error
/// of the job, and is retried like the other transient failures.
#[test]
fn a_key_held_past_a_dba_lock_timeout_is_waited_out() {
    let Some(db) = test_database() else { return };
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET lock_timeout = '50ms'",
            db.name()
        ))
        .expect("ALTER DATABASE");
    let queue = Queue::open(db.url()).expect("open");
    let mut app = db.connect();
    let mut tx = app.transaction().expect("begin");
    let held = queue
        .enqueue_pg_tx(&mut tx, NewJob::new("work").unique_key("k"))
        .expect("enqueue in the app's transaction");
    let other = queue.clone();
    let waiter = std::thread::spawn(move || other.enqueue(NewJob::new("work").unique_key("k")));
    std::thread::sleep(Duration::from_millis(400));
    tx.commit().expect("commit");
    let id = waiter
        .join()
        .expect("thread")
        .expect("enqueue behind the app's transaction");
    assert_eq!(id, held);
}
