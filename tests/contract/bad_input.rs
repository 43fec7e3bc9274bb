//! Guarantee 7, bad input gets a clear error and loses nothing: every
//! refused input returns its typed error and stores nothing (a batch with one
//! bad job stores none of it); a unique_key deduplicates, also under a race.

use crate::support::common;

use chrono::{TimeZone, Utc};
use common::secs;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;
use tickler::{Durability, Error, JobState, NewJob, Queue};

const PAYLOAD_LIMIT: usize = 1024;

fn open(path: &Path) -> Queue {
    Queue::builder(common::engine::target(path))
        .sqlite(|o| o.durability(Durability::Normal))
        .max_payload_bytes(PAYLOAD_LIMIT)
        .open()
        .unwrap()
}

/// A string payload whose JSON form is exactly `len` bytes.
fn payload_of_len(len: usize) -> serde_json::Value {
    let value = serde_json::Value::String("x".repeat(len - 2));
    assert_eq!(serde_json::to_string(&value).unwrap().len(), len);
    value
}

/// `depth` arrays nested around `0`.
fn nested(depth: usize) -> serde_json::Value {
    (0..depth).fold(serde_json::json!(0), |v, _| {
        serde_json::Value::Array(vec![v])
    })
}

type Check = fn(&Error) -> bool;

fn bad_jobs() -> Vec<(&'static str, NewJob, Check)> {
    let after_9999 = Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap();
    vec![
        ("empty kind", NewJob::new(""), |e| {
            matches!(e, Error::EmptyKind)
        }),
        ("empty queue", NewJob::new("k").queue(""), |e| {
            matches!(e, Error::EmptyQueue)
        }),
        ("max_attempts 0", NewJob::new("k").max_attempts(0), |e| {
            matches!(e, Error::InvalidMaxAttempts)
        }),
        (
            "payload over the limit",
            NewJob::new("k").payload(payload_of_len(PAYLOAD_LIMIT + 1)),
            |e| {
                matches!(e, Error::PayloadTooLarge { size, limit }
                    if *size == PAYLOAD_LIMIT + 1 && *limit == PAYLOAD_LIMIT)
            },
        ),
        (
            "payload nested past MAX_PAYLOAD_DEPTH",
            NewJob::new("k").payload(nested(tickler::MAX_PAYLOAD_DEPTH + 1)),
            |e| matches!(e, Error::PayloadTooDeep { .. }),
        ),
        (
            "unique_key over MAX_UNIQUE_KEY_BYTES",
            NewJob::new("k").unique_key("u".repeat(tickler::MAX_UNIQUE_KEY_BYTES + 1)),
            |e| matches!(e, Error::UniqueKeyTooLong { .. }),
        ),
        (
            "run_at after 9999",
            NewJob::new("k").run_at(after_9999),
            |e| matches!(e, Error::TimeOutOfRange { .. }),
        ),
        (
            "delay of u64::MAX seconds",
            NewJob::new("k").delay(Duration::from_secs(u64::MAX)),
            |e| matches!(e, Error::TimeOutOfRange { .. }),
        ),
        (
            "delay landing after 9999",
            NewJob::new("k").delay(Duration::from_secs(9_000 * 366 * 24 * 3600)),
            |e| matches!(e, Error::TimeOutOfRange { .. }),
        ),
        ("empty unique_key", NewJob::new("k").unique_key(""), |e| {
            matches!(e, Error::InvalidArgument(_))
        }),
        (
            "zero timeout",
            NewJob::new("k").timeout(Duration::ZERO),
            |e| matches!(e, Error::InvalidArgument(_)),
        ),
        (
            "sub-millisecond timeout",
            NewJob::new("k").timeout(Duration::from_micros(500)),
            |e| matches!(e, Error::InvalidArgument(_)),
        ),
        (
            "timeout of u64::MAX seconds",
            NewJob::new("k").timeout(Duration::from_secs(u64::MAX)),
            |e| matches!(e, Error::TimeOutOfRange { .. }),
        ),
    ]
}

contract! {
fn each_bad_job_gets_its_typed_error_and_stores_nothing() {
    let (_dir, path) = common::temp_db();
    let queue = open(&path);
    queue.enqueue(NewJob::new("already-there")).unwrap();
    for (what, job, check) in bad_jobs() {
        let err = queue
            .enqueue(job)
            .expect_err(&format!("{what}: was accepted"));
        assert!(check(&err), "{what}: wrong error {err:?}");
        assert!(!err.to_string().is_empty());
        assert_eq!(common::row_count(&path), 1, "{what}: something was stored");
    }
}
}

contract! {
fn batch_with_one_bad_job_stores_none_of_it() {
    let (_dir, path) = common::temp_db();
    let queue = open(&path);
    queue.enqueue(NewJob::new("already-there")).unwrap();
    for (what, bad, check) in bad_jobs() {
        let batch = vec![
            NewJob::new("good").payload(serde_json::json!(1)),
            NewJob::new("good").unique_key(format!("good-{what}")),
            bad,
            NewJob::new("good").payload(serde_json::json!(3)),
        ];
        let err = queue
            .enqueue_batch(batch)
            .expect_err(&format!("{what}: batch was accepted"));
        assert!(check(&err), "{what}: wrong error {err:?}");
        assert_eq!(
            common::row_count(&path),
            1,
            "{what}: part of the batch was stored"
        );
    }
    // The unique keys of the refused batches were not taken either.
    let id = queue
        .enqueue(NewJob::new("good").unique_key("good-empty kind"))
        .unwrap();
    assert_eq!(common::row_count(&path), 2);
    assert_eq!(
        queue.get(id).unwrap().unique_key.as_deref(),
        Some("good-empty kind")
    );
}
}

contract! {
fn boundaries_that_are_allowed() {
    let (_dir, path) = common::temp_db();
    let queue = open(&path);
    let at_limit = queue
        .enqueue(NewJob::new("k").payload(payload_of_len(PAYLOAD_LIMIT)))
        .expect("payload exactly at the limit");
    assert_eq!(
        queue.get(at_limit).unwrap().payload,
        payload_of_len(PAYLOAD_LIMIT)
    );
    let epoch = Utc.timestamp_millis_opt(0).unwrap();
    let first = queue.enqueue(NewJob::new("k").run_at(epoch)).unwrap();
    assert_eq!(queue.get(first).unwrap().run_at, epoch);
    let last = Utc.timestamp_millis_opt(tickler::MAX_TIMESTAMP_MS).unwrap();
    let late = queue.enqueue(NewJob::new("k").run_at(last)).unwrap();
    assert_eq!(queue.get(late).unwrap().run_at, last);
    let timed = queue
        .enqueue(NewJob::new("k").timeout(Duration::from_millis(1)))
        .unwrap();
    assert_eq!(
        queue.get(timed).unwrap().timeout,
        Some(Duration::from_millis(1))
    );
    assert_eq!(common::row_count(&path), 4);
}
}

contract! {
fn bad_lease_arguments_are_refused_and_change_nothing() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();

    let err = queue.manual().claim("default", "w", 1, Duration::ZERO).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(
        queue.get(id).unwrap().state,
        JobState::Pending,
        "zero lease claimed the job"
    );

    let lease = queue.manual().claim("default", "w", 1, secs(10)).unwrap().remove(0);
    let held = queue.get(id).unwrap();

    let err = queue.manual().heartbeat(&lease, Duration::ZERO).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    // (A snooze before 1970 is "due now", as a run_at is: tests/contract/limits_at_the_edges.rs.)
    let too_late = Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap();
    let err = queue.manual().snooze(&lease, too_late).unwrap_err();
    assert!(matches!(err, Error::TimeOutOfRange { .. }), "{err:?}");
    assert_eq!(
        queue.get(id).unwrap(),
        held,
        "a refused call changed the job"
    );
    queue
        .manual().complete(&lease)
        .expect("lease still held after refused calls");
}
}

contract! {
fn unique_key_deduplicates_until_the_job_finishes() {
    let (_dir, path) = common::temp_db();
    let queue = open(&path);
    let first = queue
        .enqueue(NewJob::new("mail").unique_key("welcome-42"))
        .unwrap();
    let second = queue
        .enqueue(
            NewJob::new("mail")
                .unique_key("welcome-42")
                .payload(serde_json::json!("other")),
        )
        .unwrap();
    assert_eq!(first, second);
    // Keys are global across queues and kinds.
    let third = queue
        .enqueue(NewJob::new("sms").queue("texts").unique_key("welcome-42"))
        .unwrap();
    assert_eq!(first, third);
    assert_eq!(common::row_count(&path), 1);
    assert_eq!(
        queue.get(first).unwrap().payload,
        serde_json::Value::Null,
        "first job was overwritten"
    );

    // Duplicates within one batch.
    let ids = queue
        .enqueue_batch(vec![
            NewJob::new("mail").unique_key("welcome-42"),
            NewJob::new("mail").unique_key("batch-key"),
            NewJob::new("mail").unique_key("batch-key"),
        ])
        .unwrap();
    assert_eq!(ids[0], first);
    assert_eq!(ids[1], ids[2]);
    assert_eq!(common::row_count(&path), 2);

    // Held while running too.
    let lease = queue.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
    assert_eq!(lease.job_id, first);
    assert_eq!(
        queue
            .enqueue(NewJob::new("mail").unique_key("welcome-42"))
            .unwrap(),
        first
    );
    assert_eq!(common::row_count(&path), 2);

    // Once it finished, the key is free again.
    queue.manual().complete(&lease).unwrap();
    let fresh = queue
        .enqueue(NewJob::new("mail").unique_key("welcome-42"))
        .unwrap();
    assert_ne!(fresh, first);
    assert_eq!(common::row_count(&path), 3);
    assert_eq!(queue.get(fresh).unwrap().state, JobState::Pending);
    assert_eq!(queue.get(first).unwrap().state, JobState::Succeeded);
}
}

contract! {
fn racing_enqueues_of_one_unique_key_store_one_job() {
    const THREADS: usize = 8;
    const KEYS: usize = 100;
    let (_dir, path) = common::temp_db();
    drop(open(&path));
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            // Own handle per thread: the race goes through the database,
            // not a mutex.
            let queue = open(&path);
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                (0..KEYS)
                    .map(|k| {
                        queue
                            .enqueue(
                                NewJob::new("race")
                                    .unique_key(format!("key-{k}"))
                                    .payload(serde_json::json!(t)),
                            )
                            .unwrap_or_else(|e| panic!("thread {t}, key {k}: {e}"))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<Vec<tickler::JobId>> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    for k in 0..KEYS {
        let ids: std::collections::HashSet<_> = results.iter().map(|r| r[k]).collect();
        assert_eq!(ids.len(), 1, "key-{k}: threads got different ids {ids:?}");
    }
    assert_eq!(common::row_count(&path), KEYS as i64);
    let per_key = common::engine::query_int(
        &path,
        "SELECT max(n) FROM (SELECT count(*) AS n FROM tickler_jobs GROUP BY unique_key) AS k",
        &[],
    );
    assert_eq!(per_key, 1);
}
}
