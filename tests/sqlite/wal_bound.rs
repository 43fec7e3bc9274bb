//! The WAL stays bounded.
//!
//! A reader that keeps a read transaction open pins its snapshot: SQLite
//! cannot checkpoint past it nor start the `-wal` file over, so while
//! workers keep writing, the WAL grows. These tests show that this is the
//! reader's doing and ends with it: once the reader is gone, more writes do
//! not make the file grow further, the write path truncates it and
//! `Queue::checkpoint` empties it; that writers on several connections that
//! never pause do not make it grow either; and that a long-lived worker pool
//! process, even with a handler running, holds no statement or transaction
//! that would stop a checkpoint.

use crate::support::reliability;

use reliability::{child_output, expect_success, ms, secs, spawn_child, temp_db, wait_until};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tickler::{Durability, JobContext, JobError, JobState, NewJob, Queue, WorkerPool};

const MIB: u64 = 1024 * 1024;

fn open(path: &Path) -> Queue {
    Queue::builder(path)
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue")
}

/// A pool that completes `work` jobs at once.
fn pool(queue: &Queue) -> WorkerPool {
    WorkerPool::builder(queue)
        .threads(4)
        .handler("work", |_: &JobContext| Ok::<(), JobError>(()))
        .start()
        .expect("start pool")
}

/// Keeps the tests that write hundreds of MiB from running at the same
/// time as each other: on one disk, another test's writes and fsyncs slow
/// this test's checkpoints, which is not what these tests measure.
fn heavy_writes() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Enqueues `n` jobs one transaction each, with a 1 KiB payload.
fn write_jobs(queue: &Queue, n: usize) {
    let payload = serde_json::json!({ "filler": "x".repeat(1024) });
    for _ in 0..n {
        queue
            .enqueue(NewJob::new("work").payload(payload.clone()))
            .expect("enqueue");
    }
}

#[test]
fn a_long_reader_lets_the_wal_grow_and_once_it_is_gone_the_wal_is_bounded() {
    let _heavy = heavy_writes();
    let (_dir, path) = temp_db();
    let queue = open(&path);
    let mut pool = pool(&queue);

    // The slow reader: a read transaction with a statement stepped once,
    // as a `list` that iterates slowly would hold it.
    let reader = queue.open_connection().expect("reader connection");
    reader.execute_batch("BEGIN").unwrap();
    let seen: i64 = reader
        .query_row("SELECT count(*) FROM tickler_jobs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seen, 0);

    // Writers go on: enqueues, claims and completions, each a commit.
    let started = Instant::now();
    let mut rounds = 0;
    while queue.ops().wal_bytes() < 24 * MIB {
        write_jobs(&queue, 200);
        rounds += 1;
        assert!(
            started.elapsed() < secs(60),
            "the WAL did not reach 24 MiB in 60 s ({} bytes)",
            queue.ops().wal_bytes()
        );
    }
    wait_until("the pool finished every job", secs(60), || {
        queue.ops().unfinished(&["default"], None).unwrap() == 0
    });
    let pinned = queue
        .ops()
        .checkpoint()
        .expect("checkpoint under the reader");
    assert!(
        !pinned.complete,
        "a checkpoint cannot complete past an open reader: {pinned:?}"
    );
    let grown = queue.ops().wal_bytes();
    eprintln!(
        "reader open: {rounds} rounds of 200 jobs grew the WAL to {:.1} MiB",
        grown as f64 / MIB as f64
    );

    // The reader goes away; the same amount of writing again, watching the
    // WAL's size after every round.
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let mut largest = 0;
    for _ in 0..rounds {
        write_jobs(&queue, 200);
        largest = largest.max(queue.ops().wal_bytes());
    }
    wait_until("the pool finished every job", secs(60), || {
        queue.ops().unfinished(&["default"], None).unwrap() == 0
    });
    largest = largest.max(queue.ops().wal_bytes());
    eprintln!(
        "reader gone: as many writes again, the WAL stays at most {:.1} MiB",
        largest as f64 / MIB as f64
    );
    // The first commit after the reader left still appends (its snapshot
    // began before the WAL was fully copied back); the log starts over at
    // the next one. So at most a transaction's worth of growth.
    assert!(
        largest <= grown + MIB,
        "the WAL kept growing after the reader was gone: {grown} -> {largest} bytes"
    );
    // Nor does it stay large: the write path's own truncating checkpoint
    // (16 MiB threshold, retried with a backoff of at most 8 s while the
    // reader pinned it) empties it without anyone calling `checkpoint`.
    let mut extra_rounds = 0;
    wait_until("the write path truncated the WAL", secs(30), || {
        write_jobs(&queue, 20);
        extra_rounds += 1;
        queue.ops().wal_bytes() < 17 * MIB
    });
    wait_until("the pool finished every job", secs(60), || {
        queue.ops().unfinished(&["default"], None).unwrap() == 0
    });

    // And a checkpoint brings it back to nothing.
    let done = queue.ops().checkpoint().expect("checkpoint");
    assert!(done.complete, "{done:?}");
    assert!(done.wal_bytes_after < 64 * 1024, "{done:?}");
    pool.shutdown(secs(10));
    assert_eq!(
        queue.count(JobState::Succeeded).unwrap() as usize,
        rounds * 400 + extra_rounds * 20
    );
}

const ENV_DB: &str = "TICKLER_WAL_POOL_DB";
const CHILD: &str = "long_lived_pool_process";

#[test]
fn a_long_lived_pool_process_never_blocks_a_checkpoint() {
    let (dir, path) = temp_db();
    let queue = open(&path);
    let slow = queue
        .enqueue(NewJob::new("slow").payload(serde_json::json!({ "sleep_ms": 20_000 })))
        .unwrap();
    let mut child = spawn_child(
        &crate::support::engine::test_path(module_path!(), CHILD),
        dir.path(),
        "pool",
        &[(ENV_DB, path.to_str().unwrap())],
    );
    wait_until("the child pool runs the slow job", secs(30), || {
        queue.get(slow).unwrap().state == JobState::Running
    });

    // While the pool lives, with a handler running and heartbeats landing,
    // and while it works through a stream of jobs: every checkpoint
    // completes and leaves an empty WAL.
    for round in 0..10 {
        write_jobs(&queue, 100);
        std::thread::sleep(ms(100));
        let checkpoint = queue.ops().checkpoint().expect("checkpoint");
        eprintln!("round {round}: {checkpoint:?}");
        assert!(
            checkpoint.complete,
            "round {round}: a checkpoint was blocked by the pool process: {checkpoint:?}\n{}",
            child_output(dir.path(), "pool")
        );
        assert_eq!(
            checkpoint.wal_bytes_after, 0,
            "round {round}: {checkpoint:?}"
        );
    }
    wait_until("the child pool finished the stream", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() == 1_000
    });
    assert_eq!(queue.get(slow).unwrap().state, JobState::Running);
    let idle = queue.ops().checkpoint().expect("checkpoint");
    assert!(idle.complete && idle.wal_bytes_after == 0, "{idle:?}");

    std::fs::File::create(dir.path().join("stop")).unwrap();
    expect_success(&mut child, dir.path(), "pool", secs(60));
}

/// The child side: a pool serving `work` and `slow` until told to stop.
#[test]
fn long_lived_pool_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let db = PathBuf::from(db);
    let stop = db.with_file_name("stop");
    let queue = open(&db);
    let stop_slow = stop.clone();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .lease(secs(2))
        .handler("work", |_: &JobContext| Ok::<(), JobError>(()))
        .handler("slow", move |ctx: &JobContext| {
            let until = Instant::now() + ms(ctx.payload()["sleep_ms"].as_u64().unwrap_or(0));
            while Instant::now() < until && !ctx.is_cancelled() && !stop_slow.exists() {
                std::thread::sleep(ms(20));
            }
            Ok::<(), JobError>(())
        })
        .start()
        .expect("start pool");
    wait_until("the parent's stop", secs(120), || stop.exists());
    let report = pool.shutdown(secs(30));
    println!("child pool stopped: {report:?}");
}

/// Writers that never pause, each with its own `Queue` (its own write
/// connection, as separate processes would have). SQLite's automatic
/// checkpoints are PASSIVE: each copies back only what was committed before
/// it started, and the log starts over only when a writer begins right after
/// a checkpoint caught up, which under nonstop commits never happens. Left
/// to those, the WAL passed 1 GiB within seconds here while the database
/// held a few hundred MB. The write path's truncating checkpoint
/// (`bound_wal` in src/queue.rs) must keep it under the 64 MiB
/// `journal_size_limit`; it did not while it gave up on the first
/// SQLITE_BUSY from another connection's checkpoint lock.
#[test]
fn concurrent_writers_keep_the_wal_under_journal_size_limit() {
    let _heavy = heavy_writes();
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (_dir, path) = temp_db();
    let queue = open(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, path) = (Arc::clone(&stop), path.clone());
            std::thread::spawn(move || {
                let queue = open(&path);
                while !stop.load(Ordering::SeqCst) {
                    write_jobs(&queue, 1);
                }
            })
        })
        .collect();
    let started = Instant::now();
    let mut largest = 0;
    // Stops early once the WAL is four times the limit: no transient.
    while started.elapsed() < secs(10) && largest < 256 * MIB {
        largest = largest.max(queue.ops().wal_bytes());
        std::thread::sleep(ms(10));
    }
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.join().unwrap();
    }
    eprintln!(
        "4 writers for {:?}: the WAL peaked at {:.1} MiB",
        started.elapsed(),
        largest as f64 / MIB as f64
    );
    let db_bytes = std::fs::metadata(&path).unwrap().len();
    assert!(
        largest < 64 * MIB,
        "the WAL reached {:.1} MiB after {:?} of writes (database file: {:.1} MiB)",
        largest as f64 / MIB as f64,
        started.elapsed(),
        db_bytes as f64 / MIB as f64
    );
}

/// Four connections writing without pause while a reader pins the WAL for
/// 1.5 s: the log grows while the reader lives (nothing can copy past its
/// snapshot), no writer gets an error meanwhile (the write path's attempts
/// to truncate must not hold the write lock for the whole pin), and once
/// the reader is gone the write path brings the file back under 17 MiB
/// while the writers go on, without anyone calling `Queue::checkpoint`.
#[test]
fn after_a_pinning_reader_leaves_nonstop_writers_get_the_wal_truncated() {
    let _heavy = heavy_writes();
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let (_dir, path) = temp_db();
    let queue = open(&path);
    let reader = queue.open_connection().expect("reader connection");
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM tickler_jobs", [], |r| r.get(0))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let longest_wait = Arc::new(Mutex::new(std::time::Duration::ZERO));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, path) = (Arc::clone(&stop), path.clone());
            let longest_wait = Arc::clone(&longest_wait);
            std::thread::spawn(move || {
                let queue = open(&path);
                while !stop.load(Ordering::SeqCst) {
                    let asked = Instant::now();
                    write_jobs(&queue, 1);
                    let mut longest = longest_wait.lock().unwrap();
                    *longest = (*longest).max(asked.elapsed());
                }
            })
        })
        .collect();
    std::thread::sleep(ms(1_500));
    let pinned = queue.ops().wal_bytes();
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let released = Instant::now();
    let mut largest = pinned;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("the write path truncated the WAL", secs(60), || {
            largest = largest.max(queue.ops().wal_bytes());
            queue.ops().wal_bytes() < 17 * MIB
        })
    }));
    let took = released.elapsed();
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.join().expect("a writer failed");
    }
    eprintln!(
        "WAL {:.1} MiB when the reader left, largest {:.1} MiB, under 17 MiB after {took:?}; \
         longest single enqueue {:?}",
        pinned as f64 / MIB as f64,
        largest as f64 / MIB as f64,
        *longest_wait.lock().unwrap()
    );
    outcome.unwrap();
    assert!(
        pinned > 17 * MIB,
        "the reader did not pin the WAL: {pinned} bytes"
    );
}
