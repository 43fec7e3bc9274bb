//! Batches, tried the way users of other queues found theirs broken: a
//! member whose parent had already failed when it was stored (cancelled
//! at its insert, it must still be counted, or the batch never ends); a
//! unique_key repeated in one call (the job joins once, and one batch);
//! a callback cancelled then retried by hand before its batch ended (it
//! waits again, not runs early); a member retried after its batch
//! finished (counted again, no callback decided twice, nothing pruned it
//! needs); batches chained through a callback, and a member that would
//! wait on its own batch's callback (refused); a member that fails and
//! retries on its own before its last attempt; dead members deleted by
//! hand; thousands of members in one call; a running member cancelled
//! then retried; an end rolled back with the application's writes; and
//! the last two ends, the last end and the seal, or members being added
//! and the seal, racing from threads.

use crate::support::app_tx;
use crate::support::common;
use crate::support::deps::{counts, member, with_callbacks};
use crate::support::limits;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use limits::{claim, ids, state};
use std::sync::{Arc, Barrier};
use tickler::{JobId, JobState, NewBatch, NewJob, Outcome};

contract! {
/// A member stored to run after a job that had already ended dead is
/// cancelled by its own insert: that end is counted in the same
/// transaction, or the batch would wait for it forever (BullMQ's parents
/// stuck in waiting-children, Celery's chords whose body never runs).
/// One stored after a parent that succeeded is pending and counts
/// nothing yet.
fn a_member_cancelled_by_its_insert_is_counted_and_the_batch_ends() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let failed = queue.enqueue(NewJob::new("parent").max_attempts(1)).unwrap();
    let ok = queue.enqueue(NewJob::new("parent")).unwrap();
    for lease in claim(&queue, 10) {
        if lease.job_id == failed {
            queue.manual().fail(&lease, "broken").unwrap();
        } else {
            queue.manual().complete(&lease).unwrap();
        }
    }
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let doomed = queue
        .enqueue(member(batch.id, 1).after(&[failed]))
        .unwrap();
    let fine = queue.enqueue(member(batch.id, 2).after(&[ok])).unwrap();
    assert_eq!(state(&queue, doomed), JobState::Cancelled);
    assert_eq!(state(&queue, fine), JobState::Pending);
    assert_eq!(
        counts(&queue.batch(batch.id).unwrap()),
        (2, 1, 0, 0, 1),
        "a member cancelled by its insert was not counted"
    );
    queue.seal_batch(batch.id).unwrap();
    let lease = claim(&queue, 10).remove(0);
    assert_eq!(lease.job_id, fine);
    queue.manual().complete(&lease).unwrap();
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (2, 0, 1, 0, 1));
    assert!(done.finished_at.is_some(), "the batch never finished");
    assert_eq!(state(&queue, done.on_failure.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_success.unwrap()), JobState::Cancelled);
}
}

contract! {
/// A unique_key given twice in one call stores one job, which joins its
/// batch once (counted twice, the batch would wait for a member that
/// does not exist), and only the first batch named: the same job named
/// for a second batch is not counted there. A member whose key an older
/// job holds joins nothing, so the batch does not wait on that job
/// (sidekiq-unique-jobs in batches never completing).
fn a_unique_key_repeated_in_one_call_joins_one_batch_once() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let first = queue.open_batch(NewBatch::new().on_finish(NewJob::new("done"))).unwrap();
    let second = queue.open_batch(NewBatch::new().on_finish(NewJob::new("done"))).unwrap();
    let holder = queue.enqueue(NewJob::new("work").unique_key("held")).unwrap();
    let got = queue
        .enqueue_batch(vec![
            member(first.id, 1).unique_key("k"),
            member(first.id, 2).unique_key("k"),
            member(first.id, 3).unique_key("j"),
            member(second.id, 4).unique_key("j"),
            member(second.id, 5).unique_key("held"),
        ])
        .unwrap();
    assert_eq!(got[0], got[1]);
    assert_eq!(got[2], got[3]);
    assert_eq!(got[4], holder);
    assert_eq!(queue.get(got[2]).unwrap().batch, Some(first.id));
    assert_eq!(queue.get(holder).unwrap().batch, None);
    assert_eq!(counts(&queue.batch(first.id).unwrap()), (2, 2, 0, 0, 0));
    assert_eq!(counts(&queue.batch(second.id).unwrap()), (0, 0, 0, 0, 0));

    queue.seal_batch(first.id).unwrap();
    let second_done = queue.seal_batch(second.id).unwrap();
    assert!(second_done.finished_at.is_some(), "an empty batch waited");
    for lease in claim(&queue, 10) {
        if lease.job_id != holder && Some(lease.job_id) != second_done.on_finish {
            queue.manual().complete(&lease).unwrap();
        }
    }
    let done = queue.batch(first.id).unwrap();
    assert_eq!(counts(&done), (2, 0, 2, 0, 0));
    assert!(done.finished_at.is_some(), "the batch waits for a member counted twice");
    assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
}
}

contract! {
/// A callback cancelled by hand while its batch runs, then retried by
/// hand, waits again: a retry gives fresh attempts, not leave to run
/// before the members end (Sidekiq's "on_success fired prematurely").
/// The batch's end then releases it. A callback the end cancelled and
/// that is retried after the batch finished runs: the batch has ended.
fn a_callback_retried_by_hand_before_its_batch_ends_waits_again() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let finish = batch.on_finish.unwrap();
    let id = queue.enqueue(member(batch.id, 1)).unwrap();
    queue.cancel(finish).unwrap();
    queue.retry(finish).unwrap();
    assert_eq!(
        state(&queue, finish),
        JobState::Waiting,
        "a callback retried before its batch ended skipped the wait"
    );
    let leases = claim(&queue, 10);
    assert_eq!(ids(&leases), vec![id], "a callback was claimed before its members ended");
    queue.seal_batch(batch.id).unwrap();
    queue.manual().complete(&leases[0]).unwrap();
    assert_eq!(state(&queue, finish), JobState::Pending);
    let failure = batch.on_failure.unwrap();
    assert_eq!(state(&queue, failure), JobState::Cancelled);
    queue.retry(failure).unwrap();
    assert_eq!(state(&queue, failure), JobState::Pending);
}
}

contract! {
/// A member that fails with attempts left is not an end: the batch waits
/// through its retries and the success it ends with counts as one
/// (GoodJob's and Celery's callbacks lost after a retried member). A
/// member retried by hand after its batch finished counts again and its
/// new end moves the counters, but the callbacks, decided once, are not
/// decided again; the pruner, once they ended, deletes the other members
/// and keeps the batch for the one that runs (GoodJob's callback that
/// could not find its batch), which goes with it at the end.
fn a_member_retried_after_its_batch_finished_moves_the_counters_only() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let flaky = queue.enqueue(member(batch.id, 1).max_attempts(3)).unwrap();
    let doomed = queue.enqueue(member(batch.id, 2)).unwrap();
    queue.seal_batch(batch.id).unwrap();
    for lease in claim(&queue, 10) {
        queue.manual().fail(&lease, "down").unwrap();
    }
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (2, 1, 0, 1, 0));
    clock.advance(secs(5));
    let again = claim(&queue, 10);
    assert_eq!(ids(&again), vec![flaky]);
    queue.manual().complete(&again[0]).unwrap();
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (2, 0, 1, 1, 0));
    let finished_at = done.finished_at.expect("finished");

    // The callbacks run and end.
    let callbacks = claim(&queue, 10);
    let mut kinds: Vec<&str> = callbacks.iter().map(|l| l.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, vec!["campaign_done", "some_failed"]);
    for lease in &callbacks {
        queue.manual().complete(lease).unwrap();
    }

    queue.retry(doomed).unwrap();
    let revived = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&revived), (2, 1, 1, 0, 0));
    assert_eq!(revived.finished_at, Some(finished_at));
    clock.advance(secs(60));
    let cut = queue.clock().now();
    assert_eq!(
        queue.prune_state(cut, JobState::Succeeded).unwrap(),
        3,
        "the member that succeeded and the two callbacks that ran"
    );
    let lease = claim(&queue, 10).remove(0);
    assert_eq!(lease.job_id, doomed);
    queue.manual().complete(&lease).unwrap();
    let after = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&after), (2, 0, 2, 0, 0));
    assert_eq!(after.finished_at, Some(finished_at));
    assert_eq!(
        state(&queue, batch.on_success.unwrap()),
        JobState::Cancelled,
        "on_success was decided a second time"
    );
    assert!(claim(&queue, 10).is_empty(), "a callback ran twice");
    clock.advance(secs(60));
    assert_eq!(queue.prune(queue.clock().now()).unwrap(), 2);
    assert!(queue.batch(batch.id).is_err(), "the batch outlived its jobs");
}
}

contract! {
/// Batches chained through a callback: the members of a second batch run
/// after the first batch's on_success. When a member of the first dies,
/// on_success is cancelled, the second batch's members with it, each
/// counted in the second batch, whose seal then decides on_failure.
fn a_batch_whose_members_wait_on_another_batch_s_callback_ends_when_it_is_cancelled() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let first = queue.open_batch(with_callbacks()).unwrap();
    let second = queue.open_batch(with_callbacks()).unwrap();
    let gate = first.on_success.unwrap();
    let waiting = queue
        .enqueue_batch((0..3).map(|n| member(second.id, n).after(&[gate])).collect())
        .unwrap();
    let failing = queue.enqueue(member(first.id, 9)).unwrap();
    queue.seal_batch(first.id).unwrap();
    assert_eq!(counts(&queue.batch(second.id).unwrap()), (3, 3, 0, 0, 0));
    let lease = claim(&queue, 10).remove(0);
    assert_eq!(lease.job_id, failing);
    queue
        .manual()
        .record_outcomes(&[(&lease, Outcome::Fail("no".into()))])
        .unwrap();
    assert_eq!(state(&queue, gate), JobState::Cancelled);
    for id in &waiting {
        assert_eq!(state(&queue, *id), JobState::Cancelled);
    }
    assert_eq!(counts(&queue.batch(second.id).unwrap()), (3, 0, 0, 0, 3));
    let done = queue.seal_batch(second.id).unwrap();
    assert!(done.finished_at.is_some());
    assert_eq!(state(&queue, done.on_failure.unwrap()), JobState::Pending);
    assert_eq!(state(&queue, done.on_success.unwrap()), JobState::Cancelled);
}
}

contract! {
/// Dead members deleted by hand (BullMQ's removeOnFail that left the
/// parent waiting): `delete_dead` keeps them while their batch has not
/// finished, so a callback can still read them, and deletes them once
/// the callbacks ended.
fn delete_dead_keeps_the_dead_members_of_a_batch_until_its_callbacks_ended() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue
        .open_batch(NewBatch::new().on_failure(NewJob::new("some_failed")))
        .unwrap();
    let ids_stored = queue
        .enqueue_batch((0..2).map(|n| member(batch.id, n)).collect())
        .unwrap();
    let leases = claim(&queue, 10);
    queue.manual().fail(&leases[0], "down").unwrap();
    assert_eq!(queue.delete_dead(None, None).unwrap(), 0, "open batch");
    queue.seal_batch(batch.id).unwrap();
    queue.manual().complete(&leases[1]).unwrap();
    assert_eq!(queue.delete_dead(None, None).unwrap(), 0, "callback waiting");
    let callback = claim(&queue, 10).remove(0);
    assert_eq!(Some(callback.job_id), batch.on_failure);
    let members = queue.batch_members(batch.id, None, 10).unwrap();
    assert_eq!(members.iter().map(|j| j.id).collect::<Vec<_>>(), ids_stored);
    queue.manual().complete(&callback).unwrap();
    assert_eq!(queue.delete_dead(None, None).unwrap(), 1);
    let after = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&after), (2, 0, 1, 1, 0), "deleting a member moved the counters");
}
}

contract! {
/// Thousands of members in one call, ended by one bulk cancel: every
/// statement that names them takes them all (more ids than MySQL's
/// chunks), the counters add up, the batch finishes, and its members
/// page out whole.
fn thousands_of_members_join_in_one_call_and_end_in_one_bulk_cancel() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    const N: u64 = 2_500;
    let stored = queue
        .enqueue_batch((0..N).map(|n| member(batch.id, n)).collect())
        .unwrap();
    queue.seal_batch(batch.id).unwrap();
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (N, N, 0, 0, 0));
    assert_eq!(queue.cancel_pending(None, Some("send")).unwrap(), N);
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (N, 0, 0, 0, N));
    assert!(done.finished_at.is_some());
    assert_eq!(state(&queue, done.on_failure.unwrap()), JobState::Pending);
    let mut paged: Vec<JobId> = Vec::new();
    loop {
        let page = queue
            .batch_members(batch.id, paged.last().copied(), 1_000)
            .unwrap();
        if page.is_empty() {
            break;
        }
        paged.extend(page.iter().map(|j| j.id));
    }
    assert_eq!(paged, stored);
}
}

contract! {
/// The last two members ending at once from two threads, and the last
/// member's end racing the seal: in every round the callbacks are
/// decided, once (neither end nor the seal may each see the other's
/// batch as not done and leave it never finished).
fn the_last_ends_and_the_seal_racing_from_threads_decide_the_callbacks() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    for round in 0..8 {
        let batch = queue.open_batch(with_callbacks()).unwrap();
        queue
            .enqueue_batch((0..2).map(|n| member(batch.id, n)).collect())
            .unwrap();
        let seal_first = round % 2 == 0;
        if seal_first {
            queue.seal_batch(batch.id).unwrap();
        }
        let leases = claim(&queue, 10);
        assert_eq!(leases.len(), 2);
        let racers = if seal_first { 2 } else { 3 };
        let barrier = Arc::new(Barrier::new(racers));
        std::thread::scope(|s| {
            for lease in &leases {
                let (queue, barrier) = (&queue, barrier.clone());
                s.spawn(move || {
                    barrier.wait();
                    queue.manual().complete(lease).unwrap();
                });
            }
            if !seal_first {
                let (queue, barrier) = (&queue, barrier.clone());
                s.spawn(move || {
                    barrier.wait();
                    queue.seal_batch(batch.id).unwrap();
                });
            }
        });
        let done = queue.batch(batch.id).unwrap();
        assert_eq!(counts(&done), (2, 0, 2, 0, 0), "round {round}");
        assert!(done.finished_at.is_some(), "round {round}: never finished");
        assert_eq!(state(&queue, done.on_success.unwrap()), JobState::Pending);
        assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
        let ran = claim(&queue, 10);
        assert_eq!(ran.len(), 2, "round {round}: callbacks released {}", ran.len());
        for lease in &ran {
            queue.manual().complete(lease).unwrap();
        }
    }
}
}

contract! {
/// Members added from several threads while another seals the batch:
/// each is either stored and counted before the seal, or refused with
/// nothing stored; no member joins a sealed batch (jobs added to a batch
/// that had already run its callbacks).
fn members_racing_the_seal_are_counted_or_refused() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    const ADDERS: usize = 4;
    let barrier = Arc::new(Barrier::new(ADDERS + 1));
    let joined: Vec<bool> = std::thread::scope(|s| {
        let adders: Vec<_> = (0..ADDERS)
            .map(|n| {
                let (queue, barrier) = (&queue, barrier.clone());
                s.spawn(move || {
                    barrier.wait();
                    let mut joined = 0;
                    for k in 0..10u64 {
                        match queue.enqueue(member(batch.id, n as u64 * 10 + k)) {
                            Ok(_) => joined += 1,
                            Err(tickler::Error::BatchSealed(b)) => assert_eq!(b, batch.id),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    joined
                })
            })
            .collect();
        barrier.wait();
        // Sealed while the adders are at work.
        while queue.batch(batch.id).unwrap().members < 2 {
            std::thread::yield_now();
        }
        queue.seal_batch(batch.id).unwrap();
        adders
            .into_iter()
            .flat_map(|a| {
                let n: usize = a.join().unwrap();
                std::iter::repeat_n(true, n)
            })
            .collect()
    });
    let stored = queue
        .list(&Default::default())
        .unwrap()
        .into_iter()
        .filter(|j| j.kind == "send")
        .count();
    let sealed = queue.batch(batch.id).unwrap();
    assert_eq!(stored, joined.len(), "a refused member was stored");
    assert_eq!(sealed.members as usize, stored);
    assert!(stored >= 2, "sealed before the members joined: {stored}");
    assert!(queue.enqueue(member(batch.id, 99)).is_err());
    let leases = claim(&queue, 100);
    assert_eq!(leases.len(), stored, "a callback ran before the members");
    for lease in &leases {
        queue.manual().complete(lease).unwrap();
    }
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(done.remaining, 0);
    assert!(done.finished_at.is_some());
    assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
}
}

contract! {
/// A running member cancelled by hand is counted cancelled at once (its
/// batch finishes on it); retried by hand, it remains again and waits for
/// the cancelled run's lease to run out. The old holder's late success is
/// refused and counts nothing; the new run's success counts once, and
/// the callbacks, decided at the cancel, stay as they were.
fn a_running_member_cancelled_then_retried_counts_only_its_new_run() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let id = queue.enqueue(member(batch.id, 1)).unwrap();
    queue.seal_batch(batch.id).unwrap();
    let old = claim(&queue, 10).remove(0);
    assert_eq!(old.job_id, id);
    queue.cancel(id).unwrap();
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (1, 0, 0, 0, 1));
    assert!(done.finished_at.is_some());
    queue.retry(id).unwrap();
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (1, 1, 0, 0, 0));
    assert!(
        queue.manual().complete(&old).is_err(),
        "the cancelled run's holder completed the retried job"
    );
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (1, 1, 0, 0, 0));
    let callbacks = claim(&queue, 10);
    assert!(callbacks.iter().all(|l| l.job_id != id), "ran beside its old run");
    clock.advance(secs(31));
    let new = claim(&queue, 10)
        .into_iter()
        .find(|l| l.job_id == id)
        .expect("the retry runs once the old lease ran out");
    queue.manual().complete(&new).unwrap();
    let after = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&after), (1, 0, 1, 0, 0));
    assert_eq!(after.finished_at, done.finished_at);
    assert_eq!(state(&queue, after.on_success.unwrap()), JobState::Cancelled);
}
}

contract! {
/// A member that would run after a callback of its own batch is refused
/// with nothing stored: the callback waits for every member, so neither
/// would ever run and the batch would never end. A member that runs after
/// another batch's callback is fine (see the chained batches above).
fn a_member_that_runs_after_its_own_batch_s_callback_is_refused() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    let before = queue.list(&Default::default()).unwrap().len();
    for callback in batch.callbacks() {
        match queue.enqueue_batch(vec![
            member(batch.id, 1),
            member(batch.id, 2).after(&[callback]),
        ]) {
            Err(tickler::Error::InvalidArgument(why)) => {
                assert!(why.contains(&callback.to_string()), "{why}")
            }
            other => panic!("a member waiting on its own callback was stored: {other:?}"),
        }
    }
    assert_eq!(queue.list(&Default::default()).unwrap().len(), before);
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (0, 0, 0, 0, 0));
    let other = queue.open_batch(with_callbacks()).unwrap();
    queue
        .enqueue(member(other.id, 3).after(&[batch.on_finish.unwrap()]))
        .unwrap();
    assert_eq!(counts(&queue.batch(other.id).unwrap()).0, 1);
}
}

contract! {
/// A member completed in the application's own transaction
/// (`complete_with`) whose writes fail: nothing of its end is counted and
/// no callback is decided (a callback that fired for an end rolled back);
/// completed again, it counts once and decides the callbacks.
fn a_member_s_end_rolled_back_with_the_application_s_writes_counts_nothing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue.open_batch(with_callbacks()).unwrap();
    queue.enqueue(member(batch.id, 1)).unwrap();
    queue.seal_batch(batch.id).unwrap();
    let lease = claim(&queue, 10).remove(0);
    // The table the application writes to does not exist yet.
    assert!(app_tx::complete_writing(&queue, &lease).is_err());
    assert_eq!(counts(&queue.batch(batch.id).unwrap()), (1, 1, 0, 0, 0));
    assert_eq!(state(&queue, batch.on_finish.unwrap()), JobState::Waiting);
    app_tx::create_app_effects(&path);
    app_tx::complete_writing(&queue, &lease).unwrap();
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(counts(&done), (1, 0, 1, 0, 0));
    assert_eq!(state(&queue, done.on_finish.unwrap()), JobState::Pending);
    assert_eq!(app_tx::app_effects(&path), 1);
}
}
