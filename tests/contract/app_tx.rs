//! Completing a job in one transaction with the application's writes
//! (`Queue::complete_with`): one method on every engine, given a closure
//! over the engine's own transaction type. The writes and the completion
//! commit together, a lost lease writes neither, and a closure over another
//! engine's transaction is refused before anything is written.

use crate::support::common;
use crate::support::engine;

use crate::support::app_tx::{app_effects, complete_writing, create_app_effects};
use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use tickler::{Error, JobState, Lease, NewJob, Queue};

/// `complete_with` running `sql` (statements as text) in the engine's own
/// transaction.
fn complete_running(queue: &Queue, lease: &Lease, sql: &str) -> tickler::Result<()> {
    #[cfg(feature = "postgres")]
    if engine::on_postgres() {
        return queue.complete_with(lease, |tx: &mut tickler::postgres::Transaction| {
            tx.batch_execute(sql)?;
            Ok(())
        });
    }
    #[cfg(feature = "mysql")]
    if engine::on_mysql() {
        use tickler::mysql::prelude::Queryable;
        return queue.complete_with(lease, |tx: &mut tickler::mysql::Transaction| {
            tx.query_drop(sql)?;
            Ok(())
        });
    }
    queue.complete_with(lease, |tx: &tickler::rusqlite::Transaction| {
        tx.execute_batch(sql)?;
        Ok(())
    })
}

contract! { poolers:
fn complete_with_commits_the_writes_with_the_completion_and_a_lost_lease_writes_neither() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    create_app_effects(&path);
    let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();
    let first = queue.manual().claim("default", "w1", 1, secs(30)).unwrap().remove(0);
    // The first holder's lease runs out and the job is claimed again.
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    clock.advance(secs(2)); // past the 1 s backoff
    let second = queue.manual().claim("default", "w2", 1, secs(30)).unwrap().remove(0);
    assert_eq!(second.job_id, id);

    let err = complete_writing(&queue, &first).unwrap_err();
    assert!(matches!(err, Error::LeaseLost { job_id } if job_id == id), "{err:?}");
    assert_eq!(app_effects(&path), 0, "a stale holder's writes committed");
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);

    complete_writing(&queue, &second).unwrap();
    assert_eq!(app_effects(&path), 1);
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    // Completed once: the same lease cannot complete (nor write) again.
    let again = complete_writing(&queue, &second).unwrap_err();
    assert!(matches!(again, Error::LeaseLost { .. }), "{again:?}");
    assert_eq!(app_effects(&path), 1);
}
}

contract! { servers_only:
/// Servers only: nobody can cut the connections to a SQLite file. Right
/// after the server cut every connection of the queue (a DBA's kill, a
/// proxy's idle cut, a failover), `complete_with` is handed a live one:
/// the application's statements run once and are not retried, so the
/// pool checks the connection it hands them however recently it was used.
fn complete_with_right_after_the_connections_were_cut_gets_a_live_one() {
    let (_dir, path) = temp_db();
    create_app_effects(&path);
    let queue = Queue::open(engine::target(&path)).unwrap();
    for round in 0..5 {
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
        // The claim's connection went back to the pool a moment ago.
        assert!(engine::cut_connections(&path) > 0, "round {round}: nothing to cut");
        complete_writing(&queue, &lease)
            .unwrap_or_else(|e| panic!("round {round}: complete_with failed: {e}"));
        assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
    }
    assert_eq!(app_effects(&path), 5);
}
}

#[cfg(feature = "postgres")]
contract! { poolers:
fn a_closure_over_another_engines_transaction_is_refused_and_writes_nothing() {
    // Here, not at the top: without the `postgres` feature this body is
    // not compiled, and the imports would be unused.
    use common::manual_queue;
    use std::cell::Cell;

    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    let ran = Cell::new(false);
    let err = if engine::on_postgres() {
        queue.complete_with(&lease, |_tx: &tickler::rusqlite::Transaction| {
            ran.set(true);
            Ok(())
        })
    } else {
        queue.complete_with(&lease, |_tx: &mut tickler::postgres::Transaction| {
            ran.set(true);
            Ok(())
        })
    }
    .unwrap_err();

    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("complete_with"), "{err}");
    assert!(!ran.get(), "the closure ran on another engine's transaction");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Running, "{job:?}");
    assert_eq!(job.run_token.as_ref(), Some(&lease.run_token));
    queue.manual().complete(&lease).unwrap();
}
}

contract! { servers_only:
/// Servers only: a SQLite queue's write connection is the application's
/// too, in its own process. A session setting the application changes in
/// its `complete_with` transaction (a `SET` rather than a `SET LOCAL`)
/// stays on tickler's pooled connection; here it is the one most harmful
/// to tickler's next statements there: on MySQL `autocommit = 0` (an
/// enqueue acknowledged but never committed), on PostgreSQL a
/// `search_path` without tickler's tables.
fn a_session_setting_changed_in_complete_with_does_not_reach_the_queue() {
    let (_dir, path) = temp_db();
    let harmful = if engine::on_mysql() {
        "SET SESSION autocommit = 0"
    } else {
        "SET search_path = pg_catalog"
    };
    let queue = Queue::open(engine::target(&path)).unwrap();
    for round in 0..3 {
        queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
        complete_running(&queue, &lease, harmful)
            .unwrap_or_else(|e| panic!("round {round}: complete_with failed: {e}"));
    }
    for n in 0..10 {
        queue
            .enqueue(NewJob::new("after"))
            .unwrap_or_else(|e| panic!("enqueue {n} after the application's SET: {e}"));
    }
    // Counted on a connection of the test's own: committed, not merely
    // visible to the session that wrote it.
    let committed = engine::query_int(
        &path,
        "SELECT count(*) FROM tickler_jobs WHERE kind = 'after'",
        &[],
    );
    assert_eq!(committed, 10, "acknowledged enqueues that did not commit");
    let succeeded = engine::query_int(
        &path,
        "SELECT count(*) FROM tickler_jobs WHERE status = 'succeeded'",
        &[],
    );
    assert_eq!(succeeded, 3);
}
}

/// A handler's `complete_with` whose application writes take `pause`, on
/// PostgreSQL or MySQL (`postgres`, `mysql`: told by the test's thread,
/// which knows its engine) or SQLite.
#[cfg_attr(
    not(all(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
fn complete_slowly(
    ctx: &tickler::JobContext,
    (postgres, mysql): (bool, bool),
    pause: std::time::Duration,
) -> tickler::Result<()> {
    #[cfg(feature = "postgres")]
    if postgres {
        return ctx.complete_with(|_: &mut tickler::postgres::Transaction| {
            std::thread::sleep(pause);
            Ok(())
        });
    }
    #[cfg(feature = "mysql")]
    if mysql {
        return ctx.complete_with(|_: &mut tickler::mysql::Transaction| {
            std::thread::sleep(pause);
            Ok(())
        });
    }
    ctx.complete_with(|_: &tickler::rusqlite::Transaction| {
        std::thread::sleep(pause);
        Ok(())
    })
}

contract! { servers_only:
/// A pool's heartbeat renews all of its leases in one transaction, which
/// locks their rows in id order. A handler's `complete_with` keeps its
/// job's row locked for as long as the application's writes take, and a
/// heartbeat that waited for that lock renewed none of the pool's other
/// leases: they ran out, and those jobs ran a second time beside the
/// first. (On SQLite the application's writes hold the file's one write
/// lock, which every writer waits for: there, a long `complete_with`
/// holds back every write, as the docs say.)
fn a_long_complete_with_does_not_hold_back_the_other_leases_of_its_pool() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let (_dir, path) = temp_db();
    let queue = Queue::builder(engine::target(&path))
        .busy_timeout(secs(1))
        .busy_retry(secs(2))
        .open()
        .expect("open");
    let long_runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&long_runs);
    let server = (engine::on_postgres(), engine::on_mysql());
    let mut pool = tickler::WorkerPool::builder(&queue)
        .threads(3)
        .lease(secs(2))
        .heartbeat_interval(std::time::Duration::from_millis(500))
        .handler("slow", move |ctx: &tickler::JobContext| {
            complete_slowly(ctx, server, secs(5))?;
            Ok(())
        })
        .handler("long", move |_: &tickler::JobContext| {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(secs(7));
            Ok(())
        })
        .start()
        .expect("pool");
    // The slow job's id is the lower: a heartbeat locking rows in id order
    // waits for it before it holds the long job's row, which the reaper can
    // then take.
    let slow = queue.enqueue(NewJob::new("slow")).unwrap();
    let long = queue.enqueue(NewJob::new("long")).unwrap();
    let deadline = std::time::Instant::now() + secs(40);
    while [long, slow]
        .iter()
        .any(|id| queue.get(*id).unwrap().state != JobState::Succeeded)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the jobs did not finish: {:?}, the long one run {} times",
            [long, slow].map(|id| {
                let job = queue.get(id).unwrap();
                (job.state, job.attempts, job.last_error)
            }),
            long_runs.load(std::sync::atomic::Ordering::SeqCst)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    pool.shutdown(secs(5));
    assert_eq!(
        long_runs.load(Ordering::SeqCst),
        1,
        "the long job ran again while it ran: its lease was not renewed"
    );
}
}

contract! { poolers:
/// A lock on the job's row that outlasts one lock wait (a deadlock broken
/// by the server, a long transaction of someone else's, SQLite's write
/// lock) is waited out within the retry window when it is met before the
/// application's writes ran: nothing of theirs ran yet, so another try
/// runs them once. A handler's `complete_with` on MySQL failed with
/// "Deadlock found" under a busy pool.
fn complete_with_waits_out_a_lock_met_before_the_applications_writes() {
    let (_dir, path) = temp_db();
    create_app_effects(&path);
    let queue = Queue::builder(engine::target(&path))
        .busy_timeout(secs(1))
        .busy_retry(secs(10))
        .open()
        .expect("open");
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    let holder = engine::hold_job_row(&path, id.0, std::time::Duration::from_millis(2500));
    let done = complete_writing(&queue, &lease);
    holder.join().expect("the lock's holder");
    done.unwrap_or_else(|e| panic!("complete_with gave up inside its window: {e}"));
    assert_eq!(app_effects(&path), 1, "the application's writes ran once");
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
}
}
