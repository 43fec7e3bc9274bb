//! Guarantee 3, leases fenced by run_token: once a holder has lost its lease
//! (reaped and claimed again, finished, or cancelled), every heartbeat and
//! every outcome it tries returns `Error::LeaseLost` and changes nothing;
//! each claim carries a fresh, distinct UUID v4 run_token.

use crate::support::common;

use chrono::Duration as ChronoDuration;
use common::{ms, secs};
use std::collections::HashSet;
use tickler::{Error, JobId, JobState, Lease, NewJob, Outcome, Queue};

/// What an old holder may try with its lease.
const OLD_HOLDER_ACTIONS: [&str; 8] = [
    "heartbeat",
    "heartbeat_many",
    "complete",
    "fail",
    "fail_permanently",
    "snooze",
    "release",
    "record_outcomes",
];

/// Runs one action with `lease` and returns the error for it, or `None` if it
/// was accepted.
fn try_action(queue: &Queue, lease: &Lease, action: &str) -> Option<Error> {
    let later = queue.clock().now() + ChronoDuration::minutes(5);
    let result = match action {
        "heartbeat" => queue.manual().heartbeat(lease, secs(30)).map(|_| ()),
        "heartbeat_many" => queue
            .manual()
            .heartbeat_many(&[lease], secs(30))
            .expect("heartbeat transaction")
            .remove(0)
            .map(|_| ()),
        "complete" => queue.manual().complete(lease),
        "fail" => queue.manual().fail(lease, "old holder failed"),
        "fail_permanently" => queue.manual().fail_permanently(lease, "old holder gave up"),
        "snooze" => queue.manual().snooze(lease, later),
        "release" => queue.manual().release(lease),
        "record_outcomes" => queue
            .manual()
            .record_outcomes(&[(lease, Outcome::Fail("old holder, batched".into()))])
            .expect("outcome transaction")
            .remove(0),
        other => panic!("unknown action {other}"),
    };
    result.err()
}

/// Every action with `lease` is refused with LeaseLost for `id`, and the
/// stored job is exactly as before each attempt.
fn assert_fenced_off(queue: &Queue, lease: &Lease, id: JobId) {
    for action in OLD_HOLDER_ACTIONS {
        let before = queue.get(id).unwrap();
        let err = try_action(queue, lease, action)
            .unwrap_or_else(|| panic!("{action} with a lost lease was accepted"));
        assert!(
            err.is_lease_lost(),
            "{action} with a lost lease: expected LeaseLost, got {err:?}"
        );
        assert!(
            matches!(err, Error::LeaseLost { job_id } if job_id == id),
            "{action}: LeaseLost names the wrong job: {err:?}"
        );
        let mut after = queue.get(id).unwrap();
        if before.state == JobState::Cancelled && !action.starts_with("heartbeat") {
            // The one change a refused outcome makes: a cancelled job's
            // holder has stopped, so its unique_key is free
            // (tests/contract/cancel_keeps_unique_key.rs). A heartbeat says nothing
            // of the sort.
            assert_eq!(after.lease_expires_at, None, "{action}: stop not recorded");
            after.lease_expires_at = before.lease_expires_at;
        }
        assert_eq!(before, after, "{action} with a lost lease changed the job");
    }
}

fn claim_one(queue: &Queue, lease: std::time::Duration) -> Lease {
    let mut leases = queue.manual().claim("default", "w", 1, lease).unwrap();
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.remove(0)
}

contract! { poolers:
fn reaped_holder_is_fenced_off_and_new_holder_wins() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("mail").max_attempts(5)).unwrap();

    let old = claim_one(&queue, secs(10));
    assert_eq!(old.attempt, 1);
    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1, "the expired lease was not reaped");

    // The reaper's backoff (1 s, no jitter) must pass before the re-claim.
    clock.advance(secs(1));
    let new = claim_one(&queue, secs(10));
    assert_eq!(new.job_id, id);
    assert_eq!(new.attempt, 2, "re-claim is the second attempt");
    assert_ne!(
        new.run_token, old.run_token,
        "re-claim reused the run_token"
    );
    assert!(common::is_uuid_v4(&old.run_token.0), "{}", old.run_token);
    assert!(common::is_uuid_v4(&new.run_token.0), "{}", new.run_token);

    let held = queue.get(id).unwrap();
    assert_eq!(held.state, JobState::Running);
    assert_eq!(held.run_token.as_ref(), Some(&new.run_token));

    // The old holder can do nothing, and the row stays as the new holder left it.
    assert_fenced_off(&queue, &old, id);
    assert_eq!(queue.get(id).unwrap(), held);

    // The new holder's lease still works after all that.
    queue
        .manual().heartbeat(&new, secs(20))
        .expect("new holder heartbeat");
    queue.manual().complete(&new).expect("new holder completes");
    let done = queue.get(id).unwrap();
    assert_eq!(done.state, JobState::Succeeded);
    assert!(done.finished_at.is_some());

    // After the outcome, neither the old nor the new lease can change it.
    assert_fenced_off(&queue, &old, id);
    assert_fenced_off(&queue, &new, id);
    assert_eq!(queue.get(id).unwrap(), done);
}
}

contract! { poolers:
fn one_lost_lease_in_a_batch_does_not_block_the_others() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let a = queue.enqueue(NewJob::new("a")).unwrap();
    let old_a = claim_one(&queue, secs(5));
    let b = queue.enqueue(NewJob::new("b")).unwrap();
    let held_b = claim_one(&queue, secs(60));
    assert_eq!((old_a.job_id, held_b.job_id), (a, b));

    clock.advance(secs(6));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let reaped_a = queue.get(a).unwrap();

    let results = queue
        .manual().record_outcomes(&[(&old_a, Outcome::Complete), (&held_b, Outcome::Complete)])
        .unwrap();
    assert!(
        matches!(&results[0], Err(e) if e.is_lease_lost()),
        "{results:?}"
    );
    assert!(results[1].is_ok(), "{results:?}");
    assert_eq!(
        queue.get(a).unwrap(),
        reaped_a,
        "lost outcome changed job a"
    );
    assert_eq!(queue.get(b).unwrap().state, JobState::Succeeded);

    let beats = queue.manual().heartbeat_many(&[&old_a, &held_b], secs(10)).unwrap();
    assert!(
        beats
            .iter()
            .all(|r| matches!(r, Err(e) if e.is_lease_lost())),
        "{beats:?}"
    );
}
}

contract! { poolers:
fn cancelled_running_job_refuses_its_holder() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let id = queue.enqueue(NewJob::new("mail")).unwrap();
    let lease = claim_one(&queue, secs(10));

    queue.cancel(id).expect("cancel a running job");
    let mut cancelled = queue.get(id).unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(cancelled.lease_expires_at, Some(lease.lease_expires_at));

    assert_fenced_off(&queue, &lease, id);
    // Its refused outcomes said the holder stopped: nothing else changed.
    cancelled.lease_expires_at = None;
    assert_eq!(queue.get(id).unwrap(), cancelled);

    // Nor does its lease running out bring it back.
    clock.advance(secs(60));
    assert_eq!(queue.manual().reap().unwrap(), 0, "the reaper took a cancelled job");
    assert_eq!(queue.get(id).unwrap(), cancelled);
    assert!(queue
        .manual().claim("default", "w2", 10, secs(10))
        .unwrap()
        .is_empty());
}
}

contract! { poolers:
fn heartbeat_of_held_lease_is_accepted_and_fenced_on_token() {
    // Control for the tests above: the same calls succeed while the lease is
    // held, and a lease with a made-up token for the same job is refused.
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let id = queue.enqueue(NewJob::new("mail")).unwrap();
    let lease = claim_one(&queue, secs(10));

    let mut forged = lease.clone();
    forged.run_token.0 = "00000000-0000-4000-8000-000000000000".into();
    assert_fenced_off(&queue, &forged, id);

    clock.advance(ms(2_500));
    let expiry = queue.manual().heartbeat(&lease, secs(10)).unwrap();
    assert_eq!(expiry, clock_now(&queue) + ChronoDuration::seconds(10));
    assert_eq!(queue.get(id).unwrap().lease_expires_at, Some(expiry));
    queue.manual().complete(&lease).unwrap();
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
}
}

fn clock_now(queue: &Queue) -> chrono::DateTime<chrono::Utc> {
    queue.clock().now()
}

contract! { poolers:
fn every_claim_gets_a_distinct_uuid_v4_token() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    let jobs = (0..500)
        .map(|i| NewJob::new("k").payload(serde_json::json!(i)))
        .collect();
    queue.enqueue_batch(jobs).unwrap();

    let mut tokens = HashSet::new();
    let mut first = Vec::new();
    // Many jobs in one claiming statement: each row gets its own token.
    for lease in queue.manual().claim("default", "w", 500, secs(60)).unwrap() {
        assert!(
            common::is_uuid_v4(&lease.run_token.0),
            "{}",
            lease.run_token
        );
        assert_eq!(
            queue.get(lease.job_id).unwrap().run_token.as_ref(),
            Some(&lease.run_token),
            "stored token differs from the lease's"
        );
        assert!(tokens.insert(lease.run_token.0.clone()), "token repeated");
        first.push(lease);
    }
    assert_eq!(first.len(), 500);

    // The same job claimed again and again: a new token every time.
    let again = first.swap_remove(0);
    queue.manual().release(&again).unwrap();
    for _ in 0..50 {
        let lease = claim_one(&queue, secs(60));
        assert_eq!(lease.job_id, again.job_id);
        assert!(
            common::is_uuid_v4(&lease.run_token.0),
            "{}",
            lease.run_token
        );
        assert!(
            tokens.insert(lease.run_token.0.clone()),
            "token repeated on re-claim"
        );
        queue.manual().release(&lease).unwrap();
    }
    assert_eq!(tokens.len(), 550);
}
}
