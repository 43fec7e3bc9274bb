//! Transactional completion: `Queue::complete_with` runs the application's
//! writes and the fenced completion in one transaction. Its writes land
//! together with `succeeded`, or, when the lease is gone (reaped, re-claimed,
//! cancelled, already completed) or the application aborts, not at all.

use crate::support::app_tx;

use app_tx::{count, create_effects, effects_of, insert_effect, manual_queue, secs, temp_db};
use std::cell::Cell;
use tickler::{Error, JobState, NewJob};

#[test]
fn complete_with_after_the_reaper_took_the_lease_returns_lease_lost_and_writes_nothing() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let app = queue.open_connection().unwrap();
    create_effects(&app);
    let id = queue.enqueue(NewJob::new("work").max_attempts(5)).unwrap();

    let first = queue
        .manual()
        .claim("default", "w1", 1, secs(1))
        .unwrap()
        .remove(0);
    assert_eq!(first.job_id, id);
    clock.advance(secs(2));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let reaped = queue.get(id).unwrap();
    assert_ne!(reaped.state, JobState::Running);

    // The stale holder finishes its work: its writes happen inside the
    // transaction (it reads them back) and are then rolled back.
    let ran = Cell::new(false);
    let err = queue
        .complete_with(&first, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), Some(&first.run_token.0), "stale")?;
            assert_eq!(
                effects_of(tx, id.0),
                1,
                "the closure's write is visible to it"
            );
            ran.set(true);
            Ok(())
        })
        .unwrap_err();
    assert!(ran.get(), "the closure did not run");
    assert!(err.is_lease_lost(), "expected LeaseLost, got {err:?}");
    assert_eq!(
        effects_of(&app, id.0),
        0,
        "a stale holder's app write landed"
    );
    assert_eq!(queue.get(id).unwrap(), reaped, "the reaped row was changed");

    // A new holder claims it after the backoff; the stale holder is still
    // refused, and the row stays the new holder's.
    clock.advance(secs(2));
    let second = queue
        .manual()
        .claim("default", "w2", 1, secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(second.job_id, id);
    assert_ne!(second.run_token, first.run_token);
    let held = queue.get(id).unwrap();
    let err = queue
        .complete_with(&first, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), Some(&first.run_token.0), "stale again")?;
            Ok(())
        })
        .unwrap_err();
    assert!(err.is_lease_lost(), "expected LeaseLost, got {err:?}");
    assert_eq!(effects_of(&app, id.0), 0);
    let after = queue.get(id).unwrap();
    assert_eq!(after, held, "the new holder's row was changed");
    assert_eq!(after.state, JobState::Running);
    assert_eq!(after.run_token.as_ref(), Some(&second.run_token));
    assert_eq!(after.attempts, 2);
    assert_eq!(after.claimed_by.as_deref(), Some("w2"));

    // The new holder completes with its writes.
    queue
        .complete_with(&second, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), Some(&second.run_token.0), "fresh")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(effects_of(&app, id.0), 1);
    let token: String = app
        .query_row(
            "SELECT run_token FROM effects WHERE job_id = ?1",
            [id.0],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(token, second.run_token.0);
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
}

#[test]
fn the_closures_writes_and_succeeded_land_together() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let app = queue.open_connection().unwrap();
    create_effects(&app);
    let id = queue.enqueue(NewJob::new("work")).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    clock.advance(secs(3));

    let value = queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), Some(&lease.run_token.0), "one")?;
            insert_effect(tx, Some(id.0), Some(&lease.run_token.0), "two")?;
            Ok(tx.last_insert_rowid())
        })
        .unwrap();
    assert!(value > 0, "the closure's value is returned");
    assert_eq!(effects_of(&app, id.0), 2);
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.attempts, 1);
    assert_eq!(job.finished_at, Some(clock_now(&queue)));
    assert_eq!(job.lease_expires_at, None);

    // Completing again with the same lease is refused and writes nothing:
    // the effect cannot be applied twice.
    let err = queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), Some(&lease.run_token.0), "twice")?;
            Ok(())
        })
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(effects_of(&app, id.0), 2);
    assert_eq!(queue.get(id).unwrap(), job);
    // So is a plain complete.
    assert!(queue.manual().complete(&lease).unwrap_err().is_lease_lost());
}

fn clock_now(queue: &tickler::Queue) -> chrono::DateTime<chrono::Utc> {
    queue.clock().now()
}

#[test]
fn an_application_error_rolls_back_everything_and_the_job_stays_running() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let app = queue.open_connection().unwrap();
    create_effects(&app);
    let id = queue.enqueue(NewJob::new("work")).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    let running = queue.get(id).unwrap();

    // Error::aborted from the closure.
    let err = queue
        .complete_with(
            &lease,
            |tx: &tickler::rusqlite::Transaction| -> tickler::Result<()> {
                insert_effect(tx, Some(id.0), None, "half done")?;
                Err(Error::aborted("stock ran out"))
            },
        )
        .unwrap_err();
    match &err {
        Error::Aborted(inner) => assert_eq!(inner.to_string(), "stock ran out"),
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert!(err.to_string().contains("stock ran out"), "{err}");
    assert_eq!(count(&app, "effects"), 0, "an aborted write landed");
    assert_eq!(queue.get(id).unwrap(), running, "an abort changed the job");

    // A failing SQL statement of the application's, after a good one.
    let err = queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), None, "first")?;
            tx.execute("INSERT INTO no_such_table VALUES (1)", [])?;
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, Error::Sqlite(_)), "{err:?}");
    assert_eq!(
        count(&app, "effects"),
        0,
        "a write before a failed one landed"
    );
    assert_eq!(queue.get(id).unwrap(), running);

    // The lease is still held: the next try succeeds, with only its writes.
    queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), None, "done")?;
            Ok(())
        })
        .unwrap();
    assert_eq!(count(&app, "effects"), 1);
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
}

#[test]
fn complete_with_on_a_cancelled_job_returns_lease_lost_and_writes_nothing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let app = queue.open_connection().unwrap();
    create_effects(&app);
    let id = queue.enqueue(NewJob::new("work")).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    queue.cancel(id).unwrap();
    let cancelled = queue.get(id).unwrap();

    let err = queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            insert_effect(tx, Some(id.0), None, "after cancel")?;
            Ok(())
        })
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(count(&app, "effects"), 0);
    assert_eq!(queue.get(id).unwrap(), cancelled);
    assert_eq!(cancelled.state, JobState::Cancelled);
}

#[test]
fn a_follow_up_job_enqueued_in_the_closure_exists_iff_the_completion_commits() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let first = queue.enqueue(NewJob::new("step1").max_attempts(5)).unwrap();

    // A stale holder's follow-up is rolled back with its completion.
    let stale = queue
        .manual()
        .claim("default", "w1", 1, secs(1))
        .unwrap()
        .remove(0);
    clock.advance(secs(2));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let err = queue
        .complete_with(&stale, |tx: &tickler::rusqlite::Transaction| {
            queue.enqueue_tx(tx, NewJob::new("step2"))
        })
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(queue.count(JobState::Pending).unwrap(), 0);
    assert_eq!(queue.count(JobState::Scheduled).unwrap(), 1);

    // The holder's follow-up lands with its completion.
    clock.advance(secs(2));
    let lease = queue
        .manual()
        .claim("default", "w2", 1, secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, first);
    let second = queue
        .complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            queue.enqueue_tx(
                tx,
                NewJob::new("step2").payload(serde_json::json!({"after": first.0})),
            )
        })
        .unwrap();
    assert_eq!(queue.get(first).unwrap().state, JobState::Succeeded);
    let next = queue.get(second).unwrap();
    assert_eq!(next.state, JobState::Pending);
    assert_eq!(next.payload["after"], first.0);
}

/// `complete_with` returns the closure's error and retries only a busy
/// BEGIN. A closure failing with a busy error (SQLITE_BUSY from an attached
/// database, say) must not be retried: until 1a62054 a second try found the
/// closure consumed and reported `Busy`, which was retried again for the
/// whole busy window (busy_timeout + busy_retry, 30 s by default) with this
/// process's write mutex held.
#[test]
fn a_busy_error_from_the_closure_is_returned_at_once() {
    let (_dir, path) = temp_db();
    let queue = tickler::Queue::builder(&path)
        .sqlite(|o| o.durability(tickler::Durability::Normal))
        .busy_timeout(std::time::Duration::from_millis(500))
        .busy_retry(std::time::Duration::from_millis(1500))
        .open()
        .unwrap();
    queue.enqueue(NewJob::new("work")).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    let started = std::time::Instant::now();
    let calls = Cell::new(0);
    let err = queue
        .complete_with(
            &lease,
            |_tx: &tickler::rusqlite::Transaction| -> tickler::Result<()> {
                calls.set(calls.get() + 1);
                Err(Error::Busy { waited_ms: 4321 })
            },
        )
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(calls.get(), 1, "the closure ran again");
    // Returned as it is, or wrapped as the application's (Aborted): either
    // way it is the closure's error, not a Busy of tickler's own.
    let own = match &err {
        Error::Busy { waited_ms: 4321 } => true,
        Error::Aborted(inner) => inner.to_string().contains("4321"),
        _ => false,
    };
    assert!(own, "the closure's error was replaced by {err:?}");
    assert!(
        took < std::time::Duration::from_millis(200),
        "complete_with took {took:?} to return the closure's error"
    );
}

/// Calling a non-transactional `Queue` write (here `enqueue`) inside the
/// closure would re-lock the process's write mutex on the same thread and
/// never return (it did, until 1a62054); it must fail instead, telling the
/// caller to write through `tx` (`enqueue_tx`).
#[test]
fn queue_writes_inside_the_closure_fail_instead_of_deadlocking() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    queue.enqueue(NewJob::new("work")).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, secs(30))
        .unwrap()
        .remove(0);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let q = queue.clone();
    // Left running (stuck) if the bug is there; the test process ends anyway.
    std::thread::spawn(move || {
        let result = q.complete_with(&lease, |_tx: &tickler::rusqlite::Transaction| {
            q.enqueue(NewJob::new("follow_up"))
        });
        let _ = done_tx.send(result.map(|_| ()));
    });
    match done_rx.recv_timeout(secs(5)) {
        Ok(Err(Error::InvalidArgument(message))) => {
            assert!(message.contains("enqueue_tx"), "{message}")
        }
        Ok(Err(e)) => panic!("expected InvalidArgument, got {e:?}"),
        Ok(Ok(())) => panic!("a nested write transaction inside complete_with succeeded"),
        Err(_) => panic!("complete_with with Queue::enqueue inside its closure hung for 5 s"),
    }
    // Nothing was written, the lease is still held.
    assert_eq!(queue.count(JobState::Running).unwrap(), 1);
    assert_eq!(queue.count(JobState::Pending).unwrap(), 0);
}

/// A regression test from a review: its doc says the bug it guards.
mod a_locked_error_in_app_writes {
    use std::time::{Duration, Instant};
    use tickler::{Durability, Error, NewJob, Queue};

    #[test]
    /// The bug it guards (from a review):
    /// `Queue::complete_with` says "Only a busy BEGIN is retried, before
    /// app_writes ran; a busy later on ... fails the call." In fact a busy-class
    /// error (SQLITE_BUSY / SQLITE_LOCKED) returned from inside `app_writes`
    /// makes `write_locked` retry the closure; the second run finds
    /// `app_writes` already taken and returns `Error::Busy { waited_ms: 0 }`,
    /// which is itself `is_busy()`, so the loop spins with backoff for the whole
    /// busy_timeout + busy_retry window (30 s by default) and finally returns
    /// `Error::Busy`, hiding the application's real error.
    fn locked_error_inside_app_writes_is_reported_at_once_not_after_the_busy_window() {
        let dir = tempfile::tempdir().unwrap();
        let queue = Queue::builder(dir.path().join("q.db"))
            .sqlite(|o| o.durability(Durability::Normal))
            .busy_timeout(Duration::from_millis(200))
            .busy_retry(Duration::from_secs(3))
            .open()
            .unwrap();
        let conn = queue.open_connection().unwrap();
        conn.execute_batch("CREATE TABLE app (x INTEGER); INSERT INTO app VALUES (1), (2);")
            .unwrap();
        drop(conn);
        queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue
            .manual()
            .claim("default", "w", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);

        let started = Instant::now();
        let result = queue.complete_with(&lease, |tx: &tickler::rusqlite::Transaction| {
            // An ordinary SQLite error from application code: DROP TABLE while a
            // statement on it is still active gives SQLITE_LOCKED
            // ("database table is locked").
            let mut stmt = tx.prepare("SELECT x FROM app")?;
            let mut rows = stmt.query([])?;
            let _ = rows.next()?;
            tx.execute("DROP TABLE app", [])?;
            Ok(())
        });
        let took = started.elapsed();
        eprintln!("complete_with returned after {took:?}: {result:?}");
        assert!(
            !matches!(result, Err(Error::Busy { .. })),
            "the application's own error was replaced by Error::Busy: {result:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "complete_with spun for {took:?} before returning"
        );
    }
}

/// A regression test from a review: its doc says the bug it guards.
mod enqueue_inside_complete_with {
    use std::sync::mpsc;
    use std::time::Duration;
    use tickler::{Durability, NewJob, Queue};

    #[test]
    /// The bug it guards (from a review):
    /// `complete_with` runs `app_writes` while holding the process's
    /// write mutex (and SQLite's write lock). Calling any other write of the
    /// same `Queue` from inside it, e.g. the natural "complete this job and
    /// enqueue the next step" with `queue.enqueue` instead of `enqueue_tx`,
    /// re-locks the std Mutex on the same thread: the thread hangs for ever
    /// (no error, no panic), and since the enqueue became the EnqueueGroup
    /// leader, every later `enqueue` of the process waits behind it too.
    /// Nothing in the docs of `complete_with` warns against it (only against
    /// "opening its own transaction").
    fn enqueue_inside_complete_with_returns_instead_of_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let queue = Queue::builder(dir.path().join("q.db"))
            .sqlite(|o| o.durability(Durability::Normal))
            .open()
            .unwrap();
        queue.enqueue(NewJob::new("step1")).unwrap();
        let lease = queue
            .manual()
            .claim("default", "w", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);

        let (done_tx, done_rx) = mpsc::channel();
        {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let r = queue.complete_with(&lease, |_tx: &tickler::rusqlite::Transaction| {
                    queue.enqueue(NewJob::new("step2"))
                });
                let _ = done_tx.send(format!("{r:?}"));
            });
        }
        let first = done_rx.recv_timeout(Duration::from_secs(3));

        // Meanwhile an unrelated thread's enqueue also hangs.
        let (other_tx, other_rx) = mpsc::channel();
        {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let r = queue.enqueue(NewJob::new("unrelated"));
                let _ = other_tx.send(format!("{r:?}"));
            });
        }
        let second = other_rx.recv_timeout(Duration::from_secs(2));
        eprintln!("complete_with: {first:?}; unrelated enqueue: {second:?}");
        assert!(
            first.is_ok(),
            "complete_with + enqueue hung (self-deadlock on the writer mutex)"
        );
        assert!(
            second.is_ok(),
            "an unrelated enqueue in another thread hung too"
        );
    }
}
