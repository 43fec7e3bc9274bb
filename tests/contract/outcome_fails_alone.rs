//! One outcome (or heartbeat) that cannot be stored never costs the others
//!.
//!
//! The bug it guards: one handler error longer than SQLite's length limit,
//! recorded in the same group commit as seven successes, failed the whole
//! transaction ("string or blob too big"): the seven finished jobs ran
//! again, and the failing one stayed `running` until the reaper made it
//! `dead` as "lease expired". Now error texts are cut to
//! [`MAX_ERROR_BYTES`] (head and tail kept, the cut said), and a statement
//! SQLite refuses for one outcome or heartbeat fails that item alone.

use crate::support::common;
use crate::support::pool;

use common::{manual_queue, secs, temp_db};
use pool::{wait_until, Recorder};
use rusqlite::limits::Limit;
use serde_json::json;
use std::sync::Arc;
use tickler::{
    Durability, Error, JobId, JobState, Lease, NewJob, Outcome, Queue, WorkerPool, MAX_ERROR_BYTES,
};

/// SQLite's length limit on every connection of the queue, lowered by the
/// `on_connection` hook so that an error "too big for SQLite" needs 3 MiB,
/// not 1 GB.
const LENGTH_LIMIT: i32 = 2 * 1024 * 1024;

/// Retries without jitter (`fixed_policy`, 1 s first): the default full
/// jitter draws the first retry's delay from 0 to 1,000 ms, and a draw of
/// 0 (1 in 1,001) makes the retry due at once, so the job is `pending`,
/// not `scheduled` (seen once in a fresh clone's run).
fn queue_with_length_limit(path: &std::path::Path) -> Queue {
    if !common::engine::current().is_embedded() {
        // A text value holds up to 1 GB there and no limit can be lowered:
        // the error is cut to MAX_ERROR_BYTES all the same, and its batch
        // must land.
        return Queue::builder(common::engine::target(path))
            .sqlite(|o| o.durability(Durability::Normal))
            .retry_policy(common::fixed_policy())
            .max_payload_bytes(64 * 1024)
            .open()
            .expect("open");
    }
    Queue::builder(path)
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(common::fixed_policy())
        .max_payload_bytes(64 * 1024)
        .sqlite(|o| {
            o.on_connection(|conn: &rusqlite::Connection| {
                conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, LENGTH_LIMIT)?;
                Ok(())
            })
        })
        .open()
        .expect("open with a lowered length limit")
}

fn claim_all(queue: &Queue, n: usize) -> Vec<Lease> {
    let leases = queue.manual().claim("default", "w", n, secs(60)).unwrap();
    assert_eq!(leases.len(), n);
    leases
}

contract! {
fn an_error_over_sqlites_length_limit_is_cut_and_its_batch_lands() {
    let (_dir, path) = temp_db();
    let queue = queue_with_length_limit(&path);
    let ids = queue
        .enqueue_batch((0..8).map(|_| NewJob::new("k").max_attempts(3)).collect())
        .unwrap();
    let leases = claim_all(&queue, 8);
    let huge = format!("HEAD{}TAIL", "x".repeat(3 * 1024 * 1024));
    let mut outcomes: Vec<(&Lease, Outcome)> =
        leases[..7].iter().map(|l| (l, Outcome::Complete)).collect();
    outcomes.push((&leases[7], Outcome::Fail(huge.clone())));
    let results = queue
        .manual().record_outcomes(&outcomes)
        .expect("the batch as a whole must land");
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "outcome {i}: {r:?}");
    }
    for id in &ids[..7] {
        assert_eq!(queue.get(*id).unwrap().state, JobState::Succeeded);
    }
    let failed = queue.get(ids[7]).unwrap();
    assert_eq!(failed.state, JobState::Scheduled, "retried after backoff");
    let error = failed.last_error.unwrap();
    assert!(error.len() <= MAX_ERROR_BYTES, "{} bytes kept", error.len());
    assert!(error.starts_with("HEADxxx"), "head kept");
    assert!(error.ends_with("xxxTAIL"), "tail kept");
    assert!(
        error.contains(&format!("of {} bytes cut", huge.len())),
        "the cut is said: {}",
        &error[6000..6300]
    );
}
}

contract! {
fn a_cut_error_stays_valid_utf8_at_both_cuts() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = claim_all(&queue, 1).remove(0);
    // Four-byte characters, so that a byte cut would land inside one.
    let error = "é😀".repeat(10_000);
    queue.manual().fail(&lease, &error).unwrap();
    let kept = queue.get(id).unwrap().last_error.unwrap();
    assert!(kept.len() <= MAX_ERROR_BYTES);
    assert!(kept.starts_with("é😀é😀"));
    assert!(kept.ends_with("é😀é😀"));
}
}

/// A trigger on tickler's table that refuses one job's update when `when`
/// (a condition on `NEW` and `OLD`) holds, as an application's trigger or
/// a damaged row could.
fn refuse(path: &std::path::Path, name: &str, when: &str) {
    let sql = if common::engine::on_postgres() {
        format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'refused by the test trigger {name}'; END $$;
             CREATE TRIGGER {name} BEFORE UPDATE ON tickler_jobs FOR EACH ROW
               WHEN ({when}) EXECUTE FUNCTION {name}();"
        )
    } else if common::engine::on_mysql() {
        format!(
            "CREATE TRIGGER {name} BEFORE UPDATE ON tickler_jobs FOR EACH ROW
             BEGIN IF {when} THEN
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test trigger {name}';
             END IF; END"
        )
    } else {
        format!(
            "CREATE TRIGGER {name} BEFORE UPDATE ON tickler_jobs WHEN {when}
             BEGIN SELECT RAISE(ABORT, 'refused by the test trigger {name}'); END;"
        )
    };
    common::engine::execute_batch(path, &sql);
}

contract! {
fn an_outcome_sqlite_refuses_fails_alone_and_the_rest_of_the_batch_lands() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let ids: Vec<JobId> = queue
        .enqueue_batch((0..8).map(|_| NewJob::new("k")).collect())
        .unwrap();
    let leases = claim_all(&queue, 8);
    refuse(
        &path,
        "refuse_one",
        &format!("NEW.id = {} AND NEW.status = 'succeeded'", ids[3].0),
    );
    let outcomes: Vec<(&Lease, Outcome)> = leases.iter().map(|l| (l, Outcome::Complete)).collect();
    let results = queue.manual().record_outcomes(&outcomes).expect("the batch lands");
    for (lease, result) in leases.iter().zip(&results) {
        if lease.job_id == ids[3] {
            let err = result
                .as_ref()
                .expect_err("the refused outcome is its own error");
            assert!(
                matches!(err, Error::ConstraintViolated { message } if message.contains("refuse_one")),
                "{err:?}"
            );
            assert_eq!(queue.get(lease.job_id).unwrap().state, JobState::Running);
        } else {
            assert!(result.is_ok(), "{:?}: {result:?}", lease.job_id);
            assert_eq!(queue.get(lease.job_id).unwrap().state, JobState::Succeeded);
        }
    }
}
}

contract! {
fn a_failure_whose_error_text_is_refused_is_recorded_with_a_short_note() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap();
    let lease = claim_all(&queue, 1).remove(0);
    refuse(&path, "no_secrets", "NEW.last_error LIKE '%password=%'");
    queue
        .manual().fail(&lease, "login failed with password=hunter2")
        .expect("the failure is recorded, without the text that was refused");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead);
    let error = job.last_error.unwrap();
    assert!(error.contains("could not be stored"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
}
}

contract! {
fn a_retry_at_its_own_delay_whose_error_text_is_refused_is_recorded_with_a_short_note() {
    // A kind's own retry policy (`FailRetryAfter`) goes through the same
    // rule as the queue's: on the server engines it used to come back as
    // the refusal, the job left running until its lease ran out.
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = claim_all(&queue, 1).remove(0);
    refuse(&path, "no_secrets_later", "NEW.last_error LIKE '%password=%'");
    let failure = Outcome::FailRetryAfter("login failed with password=hunter2".into(), secs(30));
    let results = queue
        .manual()
        .record_outcomes(&[(&lease, failure)])
        .expect("the transaction lands");
    results[0]
        .as_ref()
        .expect("the failure is recorded, without the text that was refused");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    let error = job.last_error.unwrap();
    assert!(error.contains("could not be stored"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
}
}

contract! {
fn a_heartbeat_sqlite_refuses_fails_alone_and_the_others_are_renewed() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let ids: Vec<JobId> = queue
        .enqueue_batch((0..4).map(|_| NewJob::new("k")).collect())
        .unwrap();
    let leases = claim_all(&queue, 4);
    refuse(
        &path,
        "stuck_lease",
        &format!(
            "NEW.id = {} AND NEW.lease_expires_at <> OLD.lease_expires_at",
            ids[1].0
        ),
    );
    clock.advance(secs(10));
    let refs: Vec<&Lease> = leases.iter().collect();
    let results = queue
        .manual().heartbeat_many(&refs, secs(60))
        .expect("the heartbeat transaction lands");
    for (lease, result) in leases.iter().zip(&results) {
        let job = queue.get(lease.job_id).unwrap();
        if lease.job_id == ids[1] {
            assert!(
                matches!(result, Err(Error::ConstraintViolated { .. })),
                "{result:?}"
            );
            assert_eq!(job.lease_expires_at, Some(lease.lease_expires_at));
        } else {
            let renewed = result.as_ref().expect("renewed");
            assert_eq!(job.lease_expires_at, Some(*renewed));
            assert!(*renewed > lease.lease_expires_at);
        }
    }
}
}

contract! {
fn in_a_pool_one_huge_error_costs_no_other_job() {
    let (_dir, path) = temp_db();
    let queue = queue_with_length_limit(&path);
    let rec = Recorder::new();
    let script = rec.script();
    let huge = Arc::new("y".repeat(3 * 1024 * 1024));
    let huge_for_handler = Arc::clone(&huge);
    // Eight handlers held at one gate finish together, so their outcomes
    // share a group commit.
    let ids: Vec<JobId> = queue
        .enqueue_batch(
            (0..8)
                .map(|i| {
                    NewJob::new("gated")
                        .payload(json!({"block": true, "huge": i == 5}))
                        .max_attempts(1)
                })
                .collect(),
        )
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(8)
        .handler("gated", move |ctx: &tickler::JobContext| {
            tickler::Handler::run(&script, ctx)?;
            if ctx.payload()["huge"] == json!(true) {
                return Err(tickler::JobError::retry(huge_for_handler.as_str()));
            }
            Ok(())
        })
        .start()
        .unwrap();
    wait_until("all eight handlers started", secs(10), || {
        rec.started() == 8
    });
    rec.gate.open();
    wait_until("every job finished", secs(10), || {
        ids.iter()
            .all(|id| queue.get(*id).unwrap().state.is_terminal())
    });
    pool.shutdown(secs(5));
    for (i, id) in ids.iter().enumerate() {
        let job = queue.get(*id).unwrap();
        if i == 5 {
            assert_eq!(job.state, JobState::Dead);
            assert!(job.last_error.unwrap().len() <= MAX_ERROR_BYTES);
        } else {
            assert_eq!(job.state, JobState::Succeeded, "job {i}");
        }
        assert_eq!(rec.runs_of(*id).len(), 1, "job {i} ran once");
    }
    drop(huge);
}
}

/// The bugs these guard (from a review):
/// one handler's out-of-range snooze time poisons the whole outcome
/// batch of the worker pool.
///
/// `Queue::record_and_claim` validates every Snooze time up front and
/// returns `Err(TimeOutOfRange)` for the whole call if any one is out of
/// range. The dispatcher's `record()` does not retry that error (not busy),
/// logs "outcome(s) not recorded", and removes every job of the batch from
/// the in-flight map. So:
/// - the *other* jobs of the batch that succeeded stay `running`, no longer
///   heartbeated; the reaper later takes them back and they run again (or,
///   with no attempts left, end `dead` although they succeeded);
/// - the bad job itself never gets a clear error: it sits `running` until its
///   lease runs out.
///
/// Contract 7: "Bad input gets a clear error and loses nothing."
mod a_bad_snooze_in_an_outcome_batch {
    use crate::support::common;

    use chrono::{TimeZone, Utc};
    use crossbeam_channel::{bounded, Receiver};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use tickler::{
        Clock, Durability, Error, JobContext, JobError, JobState, ManualClock, NewJob, Queue,
        WorkerPool,
    };

    fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        let until = Instant::now() + limit;
        while !check() {
            assert!(Instant::now() < until, "timed out waiting for: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn far_future() -> chrono::DateTime<Utc> {
        // Past tickler's MAX_TIMESTAMP_MS (9999-12-31), inside chrono's range.
        Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap()
    }

    contract! {
    /// The bug it guards: see this module's doc (from a review).
    fn a_bad_snooze_alone_leaves_its_job_running_without_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        // An hour's backoff: the failed attempt's retry does not start (and
        // show the job running again) before the check, on a slow machine.
        let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .retry_policy(crate::support::pool::hour_backoff())
            .open()
            .unwrap();
        let id = queue.enqueue(NewJob::new("bad")).unwrap();
        let mut pool = WorkerPool::builder(&queue)
            .threads(1)
            .lease(Duration::from_secs(30))
            .handler("bad", |_: &JobContext| Err::<(), _>(JobError::Snooze(far_future())))
            .without_reaper()
            .without_scheduler()
            .start()
            .unwrap();
        wait_until(
            "the handler ran and the pool forgot the job",
            Duration::from_secs(5),
            || queue.get(id).unwrap().attempts == 1 && pool.in_flight() == 0,
        );
        std::thread::sleep(Duration::from_millis(300));
        let job = queue.get(id).unwrap();
        pool.shutdown(Duration::from_secs(1));
        eprintln!(
            "job after the bad snooze: state {:?}, last_error {:?}",
            job.state, job.last_error
        );
        assert_ne!(
            job.state,
            JobState::Running,
            "the job is still running, its outcome silently dropped and no longer heartbeated \
             (last_error {:?})",
            job.last_error
        );
    }
    }

    contract! { sqlite_only:
    /// The bug it guards (from a review):
    /// SQLite only: The batch is made by holding SQLite's write lock with
    /// complete_with; on PostgreSQL the bad snooze alone is the first test's
    /// case.
    fn a_bad_snooze_loses_the_outcome_of_a_job_that_succeeded_in_the_same_batch() {
        let dir = tempfile::tempdir().unwrap();
        let start = Utc::now();
        let clock = Arc::new(ManualClock::new(start));
        let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .clock(clock.clone())
            .open()
            .unwrap();

        // Gates the two handlers so they return while the dispatcher is blocked.
        let (go_tx, go_rx) = bounded::<()>(2);
        let go_rx: Arc<Mutex<Receiver<()>>> = Arc::new(Mutex::new(go_rx));
        let (started_tx, started_rx) = bounded::<()>(2);
        let handler = |result: Result<(), JobError>| {
            let go_rx = Arc::clone(&go_rx);
            let started_tx = started_tx.clone();
            move |_: &JobContext| {
                started_tx.send(()).unwrap();
                let rx = go_rx.lock().unwrap().clone();
                rx.recv_timeout(Duration::from_secs(10)).unwrap();
                result.clone()
            }
        };

        let ok = queue.enqueue(NewJob::new("ok").max_attempts(1)).unwrap();
        queue.enqueue(NewJob::new("bad")).unwrap();
        // Falls due later; its claim makes the dispatcher block on the write lock.
        queue
            .enqueue(NewJob::new("later").run_at(start + chrono::Duration::seconds(10)))
            .unwrap();
        // A lease on another queue, so the test can hold the process's write
        // connection with complete_with.
        queue.enqueue(NewJob::new("x").queue("other")).unwrap();
        let other = queue
            .manual().claim("other", "test", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);

        let mut pool = WorkerPool::builder(&queue)
            .threads(3)
            .lease(Duration::from_secs(30))
            .max_idle(Duration::from_millis(10))
            .handler("ok", handler(Ok(())))
            .handler("bad", handler(Err(JobError::Snooze(far_future()))))
            .handler("later", |_: &JobContext| Ok::<(), JobError>(()))
            .without_reaper()
            .without_scheduler()
            .start()
            .unwrap();
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        started_rx.recv_timeout(Duration::from_secs(5)).unwrap();

        // Hold the write connection for 800 ms.
        let (holding_tx, holding_rx) = bounded::<()>(1);
        let holder = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let r: tickler::Result<()> = queue.complete_with(&other, |_tx: &tickler::rusqlite::Transaction| {
                    holding_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(800));
                    Err(Error::aborted("test only held the lock"))
                });
                assert!(r.is_err());
            })
        };
        holding_rx.recv().unwrap();
        // "later" falls due: the dispatcher wakes (max_idle 10 ms), sees it due
        // and blocks in its claim on the write connection.
        clock.advance(Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(200));
        // Both handlers return while the dispatcher is blocked; their outcomes
        // queue up and are recorded in one batch.
        go_tx.send(()).unwrap();
        go_tx.send(()).unwrap();
        holder.join().unwrap();

        wait_until(
            "both gated jobs left the pool",
            Duration::from_secs(5),
            || pool.in_flight() == 0,
        );
        std::thread::sleep(Duration::from_millis(300));
        let job = queue.get(ok).unwrap();
        let _ = clock.now();
        pool.shutdown(Duration::from_secs(1));
        assert_eq!(
            job.state,
            JobState::Succeeded,
            "job {ok:?} succeeded but its outcome was dropped with the bad snooze's batch"
        );
    }
    }
}
