//! Transactional enqueue: a job written with `Queue::enqueue_tx` inside the
//! application's own transaction exists if and only if that transaction
//! commits, together with the application's rows; a worker pool in another
//! OS process, idle and waiting, picks it up after the commit; and a
//! refused job (bad input) leaves the caller's transaction usable.

use crate::support::app_tx;

use app_tx::{
    count, create_effects, insert_effect, marker, ms, raw, secs, temp_db, wait_until, ChildTest,
};
use rusqlite::{OptionalExtension, TransactionBehavior};
use std::path::PathBuf;
use std::time::Instant;
use tickler::{Durability, Error, JobContext, JobState, NewJob, Queue, WorkerPool};

const ENV_DB: &str = "TICKLER_APP_TX_ENQUEUE_DB";
const CHILD_TEST: &str = "pool_child_process";

/// Number of jobs in the file, seen through `conn` (in its transaction if
/// one is open).
fn jobs_seen_by(conn: &rusqlite::Connection) -> i64 {
    count(conn, "tickler_jobs")
}

#[test]
fn a_rolled_back_transaction_leaves_neither_the_job_nor_the_app_row() {
    let (_dir, path) = temp_db();
    let queue = Queue::open(&path).unwrap();
    let mut conn = queue.open_connection().unwrap();
    create_effects(&conn);

    // Explicit rollback, single and batch enqueue.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    insert_effect(&tx, None, None, "order 1").unwrap();
    let id = queue
        .enqueue_tx(
            &tx,
            NewJob::new("confirm").payload(serde_json::json!({"order": 1})),
        )
        .unwrap();
    let batch = queue
        .enqueue_batch_tx(&tx, vec![NewJob::new("a"), NewJob::new("b")])
        .unwrap();
    assert_eq!(batch.len(), 2);
    // Inside the transaction the job and the row are there ...
    assert_eq!(jobs_seen_by(&tx), 3);
    assert_eq!(count(&tx, "effects"), 1);
    // ... and nobody else sees them before the commit.
    assert!(matches!(queue.get(id), Err(Error::NotFound(_))));
    assert_eq!(queue.count(JobState::Pending).unwrap(), 0);
    tx.rollback().unwrap();

    assert!(matches!(queue.get(id), Err(Error::NotFound(_))));
    assert_eq!(queue.count(JobState::Pending).unwrap(), 0);
    let check = raw(&path);
    assert_eq!(jobs_seen_by(&check), 0, "a rolled-back job stayed");
    assert_eq!(count(&check, "effects"), 0, "a rolled-back app row stayed");

    // A transaction dropped without commit rolls back the same way.
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        insert_effect(&tx, None, None, "order 2").unwrap();
        queue.enqueue_tx(&tx, NewJob::new("confirm")).unwrap();
    }
    assert_eq!(
        jobs_seen_by(&check),
        0,
        "a dropped transaction's job stayed"
    );
    assert_eq!(count(&check, "effects"), 0);
    // No claim finds anything either.
    assert!(queue
        .manual()
        .claim("default", "w", 10, secs(30))
        .unwrap()
        .is_empty());
}

#[test]
fn a_committed_transaction_leaves_both_and_an_idle_pool_in_another_process_runs_the_job() {
    let (dir, path) = temp_db();
    let queue = Queue::builder(&path)
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .unwrap();
    let mut conn = queue.open_connection().unwrap();
    create_effects(&conn);

    // The child's pool starts first and goes idle: the job must reach it
    // through the commit of the application's connection, not a timer
    // (its max_idle is 60 s, far beyond the wait below).
    let mut child = ChildTest::spawn(
        &crate::support::engine::test_path(module_path!(), CHILD_TEST),
        &[(ENV_DB, path.as_os_str())],
        dir.path(),
    );
    child.wait_line("POOL_READY", secs(30));

    // First a transaction that rolls back: the child must never see its job.
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        insert_effect(&tx, None, None, "rolled back").unwrap();
        queue
            .enqueue_tx(
                &tx,
                NewJob::new("note").payload(serde_json::json!("rolled back")),
            )
            .unwrap();
        tx.rollback().unwrap();
    }

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    insert_effect(&tx, None, None, "placed").unwrap();
    let app_row = tx.last_insert_rowid();
    let id = queue
        .enqueue_tx(
            &tx,
            NewJob::new("note").payload(serde_json::json!({ "row": app_row })),
        )
        .unwrap();
    tx.execute(
        "UPDATE effects SET job_id = ?1 WHERE id = ?2",
        [id.0, app_row],
    )
    .unwrap();
    tx.commit().unwrap();
    let committed = Instant::now();

    // Both are there, seen from a connection of its own. The child's
    // handler adds a row of its own ("ran for row …") and may already
    // have, woken by this very commit: only the application's rows count
    // here (counting every row failed now and then in CI).
    let check = raw(&path);
    let app_rows: i64 = check
        .query_row(
            "SELECT count(*) FROM effects WHERE note NOT LIKE 'ran%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(app_rows, 1);
    assert_eq!(jobs_seen_by(&check), 1);
    let job_of_row: i64 = check
        .query_row("SELECT job_id FROM effects WHERE id = ?1", [app_row], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(job_of_row, id.0);

    // The other process runs it.
    let took = wait_until("the child's pool to finish the job", secs(20), || {
        queue.get(id).unwrap().state == JobState::Succeeded
    });
    eprintln!(
        "job ran in the other process {:?} after the commit (seen after {took:?})",
        committed.elapsed()
    );
    let line = child.wait_line("RAN", secs(10));
    child.wait_success(secs(30));

    let job = queue.get(id).unwrap();
    assert_eq!(job.attempts, 1);
    let child_pid: i64 = line
        .split_whitespace()
        .nth(2)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("bad marker {line:?}"));
    assert_ne!(child_pid, i64::from(std::process::id()));
    assert_eq!(line, format!("RAN {} {child_pid}", id.0));
    // The handler's own row, written by the child process.
    let (ran_by, note): (i64, String) = check
        .query_row(
            "SELECT pid, note FROM effects WHERE job_id = ?1 AND note LIKE 'ran%'",
            [id.0],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        ran_by, child_pid,
        "the job was not run by the other process"
    );
    assert_eq!(note, format!("ran for row {app_row}"));
    // The rolled-back job never existed, so it never ran.
    assert_eq!(jobs_seen_by(&check), 1);
    let rolled_back: Option<i64> = check
        .query_row(
            "SELECT id FROM effects WHERE note = 'rolled back'",
            [],
            |r| r.get(0),
        )
        .optional()
        .unwrap();
    assert_eq!(rolled_back, None);
}

/// The child side of the test above: returns at once unless started by it.
#[test]
fn pool_child_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let queue = Queue::builder(PathBuf::from(db))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("child: open queue");
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .max_idle(secs(60))
        .handler("note", |ctx: &JobContext| {
            let row = ctx.payload()["row"].as_i64().ok_or_else(|| {
                tickler::JobError::permanent(format!("unexpected payload {}", ctx.payload()))
            })?;
            let id = ctx.job_id().0;
            ctx.complete_with(|tx: &tickler::rusqlite::Transaction| {
                insert_effect(tx, Some(id), None, &format!("ran for row {row}"))?;
                Ok(())
            })?;
            marker(format!("RAN {id} {}", std::process::id()));
            Ok(())
        })
        .start()
        .expect("child: start pool");
    // Let the dispatcher find the file empty and go to sleep.
    std::thread::sleep(ms(50));
    marker("POOL_READY");
    wait_until("a job to succeed", secs(60), || {
        queue.count(JobState::Succeeded).unwrap() == 1
    });
    pool.shutdown(secs(5));
}

#[test]
fn refused_jobs_leave_the_callers_transaction_usable() {
    let (_dir, path) = temp_db();
    let queue = Queue::builder(&path).max_payload_bytes(64).open().unwrap();
    let mut conn = queue.open_connection().unwrap();
    create_effects(&conn);

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    insert_effect(&tx, None, None, "before").unwrap();

    let refusals = [
        (NewJob::new(""), "empty kind"),
        (NewJob::new("k").queue(""), "empty queue"),
        (NewJob::new("k").max_attempts(0), "max_attempts 0"),
        (
            NewJob::new("k").payload(serde_json::json!("x".repeat(200))),
            "payload too large",
        ),
        (NewJob::new("k").unique_key(""), "empty unique_key"),
        (
            NewJob::new("k").timeout(std::time::Duration::ZERO),
            "zero timeout",
        ),
    ];
    for (job, what) in refusals {
        let err = queue.enqueue_tx(&tx, job).expect_err(what);
        match (what, &err) {
            ("empty kind", Error::EmptyKind)
            | ("empty queue", Error::EmptyQueue)
            | ("max_attempts 0", Error::InvalidMaxAttempts)
            | ("payload too large", Error::PayloadTooLarge { .. })
            | ("empty unique_key", Error::InvalidArgument(_))
            | ("zero timeout", Error::InvalidArgument(_)) => {}
            _ => panic!("{what}: unexpected error {err:?}"),
        }
        assert_eq!(jobs_seen_by(&tx), 0, "{what}: a refused job was written");
    }
    // A batch with one bad job writes none of them, the good one included.
    let err = queue
        .enqueue_batch_tx(&tx, vec![NewJob::new("good"), NewJob::new("")])
        .unwrap_err();
    assert!(matches!(err, Error::EmptyKind), "{err:?}");
    assert_eq!(jobs_seen_by(&tx), 0, "a refused batch wrote part of itself");
    // The app's earlier write is intact and the transaction goes on.
    assert_eq!(count(&tx, "effects"), 1);
    let id = queue.enqueue_tx(&tx, NewJob::new("good")).unwrap();
    insert_effect(&tx, Some(id.0), None, "after").unwrap();
    // unique_key deduplicates inside the caller's transaction too.
    let first = queue
        .enqueue_tx(&tx, NewJob::new("once").unique_key("k-1"))
        .unwrap();
    let again = queue
        .enqueue_tx(&tx, NewJob::new("once").unique_key("k-1"))
        .unwrap();
    assert_eq!(first, again);
    tx.commit().unwrap();

    let check = raw(&path);
    assert_eq!(count(&check, "effects"), 2);
    assert_eq!(jobs_seen_by(&check), 2);
    assert_eq!(queue.get(id).unwrap().state, JobState::Pending);
    assert_eq!(queue.get(id).unwrap().kind, "good");
}

/// `enqueue_batch_tx` is "all or none" also when SQLite fails in the middle
/// of the batch (here the disk fills up, simulated with `max_page_count` on
/// the caller's connection, after the first of three big jobs): either the
/// caller's transaction is still open and holds none of the batch, or (what
/// SQLite does on SQLITE_FULL) SQLite rolled the whole transaction back, the
/// caller's own rows too, and its commit fails. Never part of the batch.
#[test]
fn a_batch_that_fails_half_way_leaves_none_of_itself() {
    let (_dir, path) = temp_db();
    let queue = Queue::open(&path).unwrap();
    let mut conn = queue.open_connection().unwrap();
    create_effects(&conn);
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    // Room for about one 60 KB payload (4 KiB pages), not three.
    conn.execute_batch(&format!("PRAGMA max_page_count = {}", pages + 24))
        .unwrap();

    let big = serde_json::json!("x".repeat(60_000));
    // One fits: the batch below fails in its middle, not at its first job.
    {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        insert_effect(&tx, None, None, "order").unwrap();
        queue
            .enqueue_batch_tx(&tx, vec![NewJob::new("big").payload(big.clone())])
            .expect("room for one big job");
        tx.rollback().unwrap();
    }

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    insert_effect(&tx, None, None, "order").unwrap();
    let err = queue
        .enqueue_batch_tx(
            &tx,
            (0..3)
                .map(|_| NewJob::new("big").payload(big.clone()))
                .collect(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::DiskFull), "{err:?}");
    let rolled_back_by_sqlite = tx.is_autocommit();
    let jobs_in_tx = jobs_seen_by(&tx);
    let rows_in_tx = count(&tx, "effects");
    tx.execute_batch("PRAGMA max_page_count = 1000000").unwrap();
    let committed = tx.commit();
    eprintln!(
        "after DiskFull: rolled back by SQLite {rolled_back_by_sqlite}, \
         jobs {jobs_in_tx}, app rows {rows_in_tx}, commit {committed:?}"
    );
    assert_eq!(
        jobs_in_tx, 0,
        "part of a failed batch is in the transaction"
    );
    if rolled_back_by_sqlite {
        assert_eq!(rows_in_tx, 0);
        assert!(committed.is_err(), "commit of a rolled-back transaction");
    } else {
        assert_eq!(rows_in_tx, 1, "the caller's own row was lost");
        committed.unwrap();
    }
    let check = raw(&path);
    assert_eq!(jobs_seen_by(&check), 0);
    assert_eq!(count(&check, "effects"), i64::from(!rolled_back_by_sqlite));
}
