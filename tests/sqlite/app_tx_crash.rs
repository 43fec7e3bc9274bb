//! A worker process killed with SIGKILL around `ctx.complete_with` leaves
//! the handler's writes and the job's completion both or neither:
//!
//! - killed inside the closure (the handler's rows written, so many that
//!   SQLite already spilled pages of the open transaction into the WAL; the
//!   transaction still open): neither the rows nor `succeeded`; the job is
//!   still `running`, is reaped and its rerun writes the rows once;
//! - killed right after `complete_with` returned: both.
//!
//! The child is this test binary re-run with `--exact <child fn>`; it says
//! where it is with marker lines on stdout, and the parent kills it there.

use crate::support::app_tx;

use app_tx::{
    count, create_effects, effects_of, insert_effect, manual_queue, marker, raw, secs, temp_db,
    ChildTest,
};
use std::path::{Path, PathBuf};
use tickler::{JobContext, JobId, JobState, NewJob, Queue, WorkerPool};

const ENV_DB: &str = "TICKLER_APP_TX_CRASH_DB";
const ENV_MODE: &str = "TICKLER_APP_TX_CRASH_MODE";
const CHILD_TEST: &str = "crash_child_process";

/// Rows of 1 KiB the handler writes besides its effect row in "in_tx"
/// mode: 4 MiB, twice SQLite's default page cache, so the open transaction
/// spills pages into the WAL before it is killed.
const FILLER_ROWS: usize = 4096;

fn status(conn: &rusqlite::Connection, id: JobId) -> (String, i64) {
    conn.query_row(
        "SELECT status, attempts FROM tickler_jobs WHERE id = ?1",
        [id.0],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

fn wal_bytes(db: &Path) -> u64 {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(PathBuf::from(wal)).map_or(0, |m| m.len())
}

fn setup() -> (tempfile::TempDir, PathBuf, JobId) {
    let (dir, path) = temp_db();
    let queue = Queue::open(&path).unwrap();
    create_effects(&queue.open_connection().unwrap());
    let id = queue.enqueue(NewJob::new("crash").max_attempts(5)).unwrap();
    drop(queue);
    (dir, path, id)
}

#[test]
fn killed_inside_the_completion_transaction_leaves_neither_row_nor_success() {
    let (dir, path, id) = setup();
    let wal_before = wal_bytes(&path);
    let mut child = ChildTest::spawn(
        &crate::support::engine::test_path(module_path!(), CHILD_TEST),
        &[(ENV_DB, path.as_os_str()), (ENV_MODE, "in_tx".as_ref())],
        dir.path(),
    );
    let line = child.wait_line("IN_TX", secs(30));
    assert_eq!(line, format!("IN_TX {}", id.0));

    // The child holds the open transaction: from outside, nothing yet.
    let check = raw(&path);
    assert_eq!(count(&check, "effects"), 0);
    assert_eq!(status(&check, id), ("running".to_owned(), 1));
    let wal_during = wal_bytes(&path);
    eprintln!("WAL before {wal_before} bytes, with the open transaction {wal_during} bytes");
    assert!(
        wal_during > wal_before + (FILLER_ROWS as u64 * 1024) / 2,
        "the open transaction did not spill into the WAL ({wal_before} -> {wal_during})"
    );
    drop(check);

    child.kill9();

    // Reopen the file after the crash: neither.
    let check = raw(&path);
    let rows = count(&check, "effects");
    let (state, attempts) = status(&check, id);
    assert_eq!(rows, 0, "handler rows survived a crash before commit");
    assert_eq!(
        state, "running",
        "job left {state} by a crash before commit"
    );
    assert_eq!(attempts, 1);
    assert_eq!(
        check
            .query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
            .unwrap(),
        "ok"
    );

    // The job is not lost: its holder is gone, so the next process to open
    // the file takes it back at once, and the rerun writes its rows
    // exactly once.
    let (queue, clock) = manual_queue(&path);
    assert_ne!(queue.get(id).unwrap().state, tickler::JobState::Running);
    clock.set(chrono::Utc::now() + chrono::Duration::hours(1));
    let lease = queue
        .manual()
        .claim("default", "rerun", 1, secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, id);
    // 2 if the killed run's start was recorded (about a second after it
    // began), else 1: a run whose start was not recorded is given back.
    assert!((1..=2).contains(&lease.attempt), "{lease:?}");
    queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), Some(&lease.run_token.0), "effect")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(effects_of(&check, id.0), 1);
    assert_eq!(count(&check, "effects"), 1);
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
}

#[test]
fn killed_right_after_complete_with_returned_leaves_both() {
    let (dir, path, id) = setup();
    let mut child = ChildTest::spawn(
        &crate::support::engine::test_path(module_path!(), CHILD_TEST),
        &[(ENV_DB, path.as_os_str()), (ENV_MODE, "after".as_ref())],
        dir.path(),
    );
    let line = child.wait_line("COMMITTED", secs(30));
    assert_eq!(line, format!("COMMITTED {}", id.0));
    child.kill9();

    let check = raw(&path);
    let (state, attempts) = status(&check, id);
    assert_eq!(effects_of(&check, id.0), 1, "the committed row is missing");
    assert_eq!(count(&check, "effects"), 1);
    assert_eq!(state, "succeeded", "the committed completion is missing");
    assert_eq!(attempts, 1);
    let token: String = check
        .query_row(
            "SELECT run_token FROM effects WHERE job_id = ?1",
            [id.0],
            |r| r.get(0),
        )
        .unwrap();
    let job_token: String = check
        .query_row(
            "SELECT run_token FROM tickler_jobs WHERE id = ?1",
            [id.0],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(token, job_token);

    // Nothing runs it again.
    let queue = Queue::open(&path).unwrap();
    assert_eq!(queue.manual().reap().unwrap(), 0);
    assert!(queue
        .manual()
        .claim("default", "again", 10, secs(30))
        .unwrap()
        .is_empty());
}

/// The child: a pool whose handler blocks where the parent kills it.
/// Returns at once unless started by a test above.
#[test]
fn crash_child_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let mode = std::env::var(ENV_MODE).expect("child mode");
    let queue = Queue::open(PathBuf::from(db)).expect("child: open queue");
    let _pool = WorkerPool::builder(&queue)
        .threads(1)
        .handler("crash", move |ctx: &JobContext| {
            let id = ctx.job_id().0;
            let token = ctx.run_token().0.clone();
            match mode.as_str() {
                "in_tx" => {
                    ctx.complete_with(|tx: &tickler::rusqlite::Transaction| {
                        insert_effect(tx, Some(id), Some(&token), "effect")?;
                        let filler = "x".repeat(1024);
                        for _ in 0..FILLER_ROWS {
                            insert_effect(tx, None, None, &filler)?;
                        }
                        marker(format!("IN_TX {id}"));
                        std::thread::sleep(secs(120));
                        Ok(())
                    })?;
                }
                "after" => {
                    ctx.complete_with(|tx: &tickler::rusqlite::Transaction| {
                        insert_effect(tx, Some(id), Some(&token), "effect")?;
                        Ok(())
                    })?;
                    marker(format!("COMMITTED {id}"));
                    std::thread::sleep(secs(120));
                }
                other => panic!("unknown mode {other}"),
            }
            Ok(())
        })
        .start()
        .expect("child: start pool");
    // The parent kills this process; never get here in time.
    std::thread::sleep(secs(120));
    panic!("child was not killed");
}
