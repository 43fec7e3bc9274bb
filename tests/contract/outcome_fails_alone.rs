//! One outcome (or heartbeat) that cannot be stored never costs the others
//! (issue 13, point 2).
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
    if common::engine::on_postgres() {
        // A text value holds up to 1 GB there and no limit can be lowered:
        // the error is cut to MAX_ERROR_BYTES all the same, and its batch
        // must land.
        return Queue::builder(common::engine::target(path))
            .durability(Durability::Normal)
            .retry_policy(common::fixed_policy())
            .max_payload_bytes(64 * 1024)
            .open()
            .expect("open");
    }
    Queue::builder(path)
        .durability(Durability::Normal)
        .retry_policy(common::fixed_policy())
        .max_payload_bytes(64 * 1024)
        .on_connection(|conn: &rusqlite::Connection| {
            conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, LENGTH_LIMIT)?;
            Ok(())
        })
        .open()
        .expect("open with a lowered length limit")
}

fn claim_all(queue: &Queue, n: usize) -> Vec<Lease> {
    let leases = queue.claim("default", "w", n, secs(60)).unwrap();
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
        .record_outcomes(&outcomes)
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
    queue.fail(&lease, &error).unwrap();
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
    let results = queue.record_outcomes(&outcomes).expect("the batch lands");
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
        .fail(&lease, "login failed with password=hunter2")
        .expect("the failure is recorded, without the text that was refused");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead);
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
        .heartbeat_many(&refs, secs(60))
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
