//! Batches (`Queue::open_batch`, `NewJob::batch`, `Queue::seal_batch`),
//! by hand on a manual clock: the callbacks wait from the start and are
//! decided in the transaction that leaves the sealed batch with no member
//! (checked right after that call, with no wait), once; the counters move
//! in the transactions that add and end members, whichever path ends
//! them; a stale holder counts nothing; a member retried by hand remains
//! again; a sealed or unknown batch refuses a member with nothing stored;
//! the pruner keeps members until the callbacks have ended. Workers
//! killed in several processes are in `batches_running`.

use crate::support::common;
use crate::support::deps::{complete_with, counts, member, with_callbacks};
use crate::support::limits;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use limits::{claim, state};
use serde_json::json;
use tickler::{BatchId, Error, JobId, JobState, NewBatch, NewJob, Outcome};

contract! {
/// Callbacks are stored waiting when the batch opens, untouched while
/// members end before the seal, and decided by the last member's end
/// after it: with every member succeeded, on_success and on_finish are
/// released (pending, in that transaction) and on_failure is cancelled
/// with a reason naming the batch. The counters always add up.
fn callbacks_wait_until_the_sealed_batch_s_last_member_ends_then_are_decided_once() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    assert_eq!(batch.description.as_deref(), Some("campaign"));
    assert_eq!(counts(&batch), (0, 0, 0, 0, 0));
    assert!(batch.sealed_at.is_none() && batch.finished_at.is_none());
    let callbacks = batch.callbacks();
    assert_eq!(callbacks.len(), 3);
    for id in &callbacks {
        assert_eq!(state(&queue, *id), JobState::Waiting);
        assert_eq!(queue.get(*id).unwrap().batch, Some(batch.id));
    }

    let first = queue.enqueue(member(batch.id, 1)).unwrap();
    let more = queue
        .enqueue_batch(vec![member(batch.id, 2), member(batch.id, 3)])
        .unwrap();
    assert_eq!(queue.get(first).unwrap().batch, Some(batch.id));
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (3, 3, 0, 0, 0));

    // Claims see members, never the callbacks.
    let leases = claim(&queue, 100);
    let mut claimed: Vec<JobId> = leases.iter().map(|l| l.job_id).collect();
    claimed.sort();
    assert_eq!(claimed, vec![first, more[0], more[1]]);
    // Two end before the seal: counted, nothing decided.
    for lease in &leases[..2] {
        queue
            .manual()
            .record_outcomes(&[(lease, complete_with(json!({ "sent": lease.job_id.0 })))])
            .unwrap()
            .remove(0)
            .unwrap();
    }
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (3, 1, 2, 0, 0));
    for id in &callbacks {
        assert_eq!(state(&queue, *id), JobState::Waiting);
    }
    let sealed = queue.seal_batch(batch.id).unwrap();
    assert!(sealed.sealed_at.is_some());
    assert!(sealed.finished_at.is_none(), "finished with a member left");
    assert_eq!(queue.seal_batch(batch.id).unwrap(), sealed, "a second seal changed it");
    for id in &callbacks {
        assert_eq!(state(&queue, *id), JobState::Waiting);
    }

    queue.manual().complete(&leases[2]).unwrap();
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (3, 0, 3, 0, 0));
    assert!(done.finished_at.is_some());
    assert_eq!(state(&queue, done.on_success.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
    let failure = queue.get(done.on_failure.unwrap()).unwrap();
    assert_eq!(failure.state, JobState::Cancelled);
    let why = failure.last_error.unwrap_or_default();
    assert!(
        why.contains(&format!("every member of batch {} succeeded", batch.id)),
        "{why}"
    );

    // The callbacks run once; the members' outputs are there to read.
    let run = claim(&queue, 100);
    let mut kinds: Vec<&str> = run.iter().map(|l| l.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, vec!["all_sent", "campaign_done"]);
    let members = queue.batch_members(batch.id, None, 10).unwrap();
    assert_eq!(
        members.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![first, more[0], more[1]],
        "members in id order, callbacks not among them"
    );
    assert_eq!(
        members.iter().filter(|j| j.output.is_some()).count(),
        2,
        "two returned an output"
    );
    let page = queue.batch_members(batch.id, Some(first), 1).unwrap();
    assert_eq!(page.iter().map(|j| j.id).collect::<Vec<_>>(), vec![more[0]]);
    assert!(claim(&queue, 100).is_empty());
}
}

contract! {
/// A member that ends dead, one cancelled by hand and one cancelled by
/// the bulk cancel: on_failure and on_finish are released, on_success is
/// cancelled naming the counts, and a job that runs after on_success is
/// cancelled with it.
fn a_failed_member_releases_on_failure_and_cancels_on_success_and_its_children() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let after_success = queue
        .enqueue(NewJob::new("report").after(&[batch.on_success.unwrap()]))
        .unwrap();
    let ids = queue
        .enqueue_batch((0..4).map(|n| member(batch.id, n)).collect())
        .unwrap();
    queue.seal_batch(batch.id).unwrap();
    queue.cancel(ids[0]).unwrap();
    let leases = claim(&queue, 2);
    queue
        .manual()
        .record_outcomes(&[
            (&leases[0], Outcome::Fail("smtp said no".into())),
            (&leases[1], Outcome::Complete),
        ])
        .unwrap();
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (4, 1, 1, 1, 1));
    assert_eq!(queue.cancel_pending(None, Some("send")).unwrap(), 1);
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (4, 0, 1, 1, 2));
    assert!(done.finished_at.is_some());
    assert_eq!(state(&queue, done.on_failure.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
    let success = queue.get(done.on_success.unwrap()).unwrap();
    assert_eq!(success.state, JobState::Cancelled);
    assert!(
        success
            .last_error
            .unwrap_or_default()
            .contains("1 dead and 2 cancelled of 4 members"),
        "the reason names the counts"
    );
    assert_eq!(state(&queue, after_success), JobState::Cancelled);
}
}

contract! {
/// A batch sealed after its last member ended is decided by the seal; an
/// empty batch too (every member "succeeded"). A sealed batch refuses a
/// member, and an unknown one too, each insert storing nothing (not even
/// the other jobs of the same call).
fn the_seal_decides_when_nothing_remains_and_a_sealed_batch_refuses_members() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let empty = queue
        .open_batch(NewBatch::new().on_success(NewJob::new("nothing_to_do")))
        .unwrap();
    let sealed = queue.seal_batch(empty.id).unwrap();
    assert!(sealed.finished_at.is_some());
    assert_eq!(state(&queue, sealed.on_success.unwrap()), JobState::Pending);

    let batch = queue.open_batch(with_callbacks()).unwrap();
    let id = queue.enqueue(member(batch.id, 1)).unwrap();
    let lease = claim(&queue, 10)
        .into_iter()
        .find(|l| l.job_id == id)
        .unwrap();
    queue.manual().complete(&lease).unwrap();
    assert_eq!(
        state(&queue, batch.on_finish.unwrap()),
        JobState::Waiting,
        "decided before the seal"
    );
    let sealed = queue.seal_batch(batch.id).unwrap();
    assert!(sealed.finished_at.is_some());
    assert_eq!(state(&queue, batch.on_finish.unwrap()), JobState::Pending);

    let before = queue.list(&Default::default()).unwrap().len();
    match queue.enqueue_batch(vec![NewJob::new("other"), member(batch.id, 2)]) {
        Err(Error::BatchSealed(b)) => assert_eq!(b, batch.id),
        other => panic!("a sealed batch took a member: {other:?}"),
    }
    match queue.enqueue(member(BatchId(batch.id.0 + 1000), 3)) {
        Err(Error::BatchNotFound(b)) => assert_eq!(b.0, batch.id.0 + 1000),
        other => panic!("an unknown batch took a member: {other:?}"),
    }
    assert_eq!(queue.list(&Default::default()).unwrap().len(), before);
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (1, 0, 1, 0, 0));
    assert!(matches!(
        queue.seal_batch(BatchId(-5)),
        Err(Error::BatchNotFound(_))
    ));
    assert!(matches!(queue.batch(BatchId(-5)), Err(Error::BatchNotFound(_))));
    for refused in [
        NewBatch::new().on_success(NewJob::new("x").unique_key("k")),
        NewBatch::new().on_finish(NewJob::new("x").after(&[id])),
        NewBatch::new().on_failure(NewJob::new("x").batch(batch.id)),
        NewBatch::new().description("x".repeat(tickler::MAX_BATCH_DESCRIPTION_BYTES + 1)),
    ] {
        assert!(
            matches!(queue.open_batch(refused.clone()), Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
    }
}
}

contract! {
/// A member whose lease ran out is taken back by the reaper (dead, its
/// attempts used up): counted once, by the reaper's transaction; the
/// stale holder's late success is refused and counts nothing.
fn a_reaped_member_counts_once_and_its_stale_holder_counts_nothing() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let id = queue.enqueue(member(batch.id, 1)).unwrap();
    queue.seal_batch(batch.id).unwrap();
    let stale = claim(&queue, 10).remove(0);
    assert_eq!(stale.job_id, id);
    clock.advance(std::time::Duration::from_secs(600));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_eq!(state(&queue, id), JobState::Dead);
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (1, 0, 0, 1, 0));
    assert!(matches!(
        queue.manual().complete(&stale),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(queue.batch(batch.id).unwrap(), done, "a stale holder counted");
    assert_eq!(state(&queue, done.on_failure.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_success.unwrap()), JobState::Cancelled);
}
}

contract! {
/// A dead member retried by hand (one by `retry`, one by `retry_dead`)
/// remains again until it ends again; a batch not yet finished then waits
/// for it, and decides by its new end.
fn a_member_retried_by_hand_remains_again_until_it_ends_again() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let ids = queue
        .enqueue_batch((0..3).map(|n| member(batch.id, n)).collect())
        .unwrap();
    let leases = claim(&queue, 2);
    for lease in &leases {
        queue.manual().fail(lease, "down").unwrap();
    }
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (3, 1, 0, 2, 0));
    queue.retry(leases[0].job_id).unwrap();
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (3, 2, 0, 1, 0));
    assert_eq!(queue.retry_dead(None).unwrap().0, 1);
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (3, 3, 0, 0, 0));
    queue.seal_batch(batch.id).unwrap();
    let leases = claim(&queue, 10);
    let mut claimed: Vec<JobId> = leases.iter().map(|l| l.job_id).collect();
    claimed.sort();
    assert_eq!(claimed, ids, "the members run again, and no callback before them");
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (3, 0, 3, 0, 0));
    assert_eq!(state(&queue, done.on_success.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_failure.unwrap()), JobState::Cancelled);
}
}

contract! {
/// The pruner at age 0 keeps every member while the batch has not
/// finished, and after, while a callback has not ended (it reads the
/// members); then the members go, and the batch with its last job.
fn the_pruner_keeps_members_until_the_callbacks_have_ended() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue
        .open_batch(NewBatch::new().on_finish(NewJob::new("report")))
        .unwrap();
    let ids = queue
        .enqueue_batch((0..3).map(|n| member(batch.id, n)).collect())
        .unwrap();
    for lease in claim(&queue, 2) {
        queue
            .manual()
            .record_outcomes(&[(&lease, complete_with(json!(lease.job_id.0)))])
            .unwrap();
    }
    clock.advance(std::time::Duration::from_secs(3600));
    let prune = || queue.prune(queue.clock().now() + chrono::Duration::seconds(1));
    assert_eq!(prune().unwrap(), 0, "a member of an open batch was pruned");
    queue.seal_batch(batch.id).unwrap();
    let last = claim(&queue, 10).remove(0);
    queue
        .manual()
        .record_outcomes(&[(&last, complete_with(json!(last.job_id.0)))])
        .unwrap();
    clock.advance(secs(1));
    assert_eq!(prune().unwrap(), 0, "a member was pruned before the callback ran");
    let callback = claim(&queue, 10).remove(0);
    assert_eq!(Some(callback.job_id), batch.on_finish);
    let outputs: Vec<serde_json::Value> = queue
        .batch_members(batch.id, None, 100)
        .unwrap()
        .into_iter()
        .filter_map(|j| j.output)
        .collect();
    assert_eq!(
        outputs,
        ids.iter().map(|id| json!(id.0)).collect::<Vec<_>>(),
        "the callback reads each member's output"
    );
    queue.manual().complete(&callback).unwrap();
    clock.advance(secs(1));
    assert_eq!(prune().unwrap(), 4, "the members and the callback");
    assert!(matches!(
        queue.batch(batch.id),
        Err(Error::BatchNotFound(_))
    ));
}
}

contract! {
/// A callback cancelled by hand while its batch runs, then retried by
/// hand before the batch finished, waits again: it is not run early, and
/// the batch's end decides it. Retried after the batch finished, it runs.
fn a_callback_retried_by_hand_before_its_batch_finished_waits_again() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let on_finish = batch.on_finish.unwrap();
    let on_success = batch.on_success.unwrap();
    let id = queue.enqueue(member(batch.id, 1)).unwrap();
    queue.cancel(on_finish).unwrap();
    queue.retry(on_finish).unwrap();
    assert_eq!(state(&queue, on_finish), JobState::Waiting, "a callback ran before its batch ended");
    queue.seal_batch(batch.id).unwrap();
    let lease = claim(&queue, 10).remove(0);
    assert_eq!(lease.job_id, id, "only the member is due");
    queue.manual().complete(&lease).unwrap();
    assert_eq!(state(&queue, on_finish), JobState::Pending);
    // on_success was released too; cancelled and retried now, the batch
    // having finished, it is due at once.
    queue.cancel(on_success).unwrap();
    queue.retry(on_success).unwrap();
    assert_eq!(state(&queue, on_success), JobState::Pending);
}
}
