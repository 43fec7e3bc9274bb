//! Transactional completion: `Queue::complete_with` runs the application's
//! writes and the fenced completion in one transaction. Its writes land
//! together with `succeeded`, or, when the lease is gone (reaped, re-claimed,
//! cancelled, already completed) or the application aborts, not at all.

mod app_tx_common;

use app_tx_common::{
    count, create_effects, effects_of, insert_effect, manual_queue, secs, temp_db,
};
use std::cell::Cell;
use tickler::{Error, JobState, NewJob};

#[test]
fn complete_with_after_the_reaper_took_the_lease_returns_lease_lost_and_writes_nothing() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let app = queue.open_connection().unwrap();
    create_effects(&app);
    let id = queue.enqueue(NewJob::new("work").max_attempts(5)).unwrap();

    let first = queue.claim("default", "w1", 1, secs(1)).unwrap().remove(0);
    assert_eq!(first.job_id, id);
    clock.advance(secs(2));
    assert_eq!(queue.reap().unwrap(), 1);
    let reaped = queue.get(id).unwrap();
    assert_ne!(reaped.state, JobState::Running);

    // The stale holder finishes its work: its writes happen inside the
    // transaction (it reads them back) and are then rolled back.
    let ran = Cell::new(false);
    let err = queue
        .complete_with(&first, |tx| {
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
    let second = queue.claim("default", "w2", 1, secs(30)).unwrap().remove(0);
    assert_eq!(second.job_id, id);
    assert_ne!(second.run_token, first.run_token);
    let held = queue.get(id).unwrap();
    let err = queue
        .complete_with(&first, |tx| {
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
        .complete_with(&second, |tx| {
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
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    clock.advance(secs(3));

    let value = queue
        .complete_with(&lease, |tx| {
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
        .complete_with(&lease, |tx| {
            insert_effect(tx, Some(id.0), Some(&lease.run_token.0), "twice")?;
            Ok(())
        })
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(effects_of(&app, id.0), 2);
    assert_eq!(queue.get(id).unwrap(), job);
    // So is a plain complete.
    assert!(queue.complete(&lease).unwrap_err().is_lease_lost());
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
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    let running = queue.get(id).unwrap();

    // Error::aborted from the closure.
    let err = queue
        .complete_with(&lease, |tx| -> tickler::Result<()> {
            insert_effect(tx, Some(id.0), None, "half done")?;
            Err(Error::aborted("stock ran out"))
        })
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
        .complete_with(&lease, |tx| {
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
        .complete_with(&lease, |tx| {
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
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.cancel(id).unwrap();
    let cancelled = queue.get(id).unwrap();

    let err = queue
        .complete_with(&lease, |tx| {
            insert_effect(tx, Some(id.0), None, "after cancel")?;
            Ok(())
        })
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(count(&app, "effects"), 0);
    assert_eq!(queue.get(id).unwrap(), cancelled);
    assert_eq!(cancelled.state, JobState::Cancelled);
}
