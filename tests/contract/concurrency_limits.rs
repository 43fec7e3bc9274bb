//! Concurrency limits (`Queue::set_limit`, `NewJob::limit`): a slot is a
//! lease. At every instant the lease holders of a key weigh at most the
//! limit; a job that does not fit is blocked (no attempt used, no error
//! written) and made pending by the transaction that frees a slot; a
//! holder that lost its lease frees nothing twice; limit changes, cancels,
//! retries, weights and totals; a pool of many threads never runs more
//! than the limit of a key at once.

use crate::support::common;
use crate::support::limits::*;
use crate::support::pool;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use pool::open_queue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tickler::{Error, JobContext, JobError, JobId, JobState, Limit, NewJob, WorkerPool};

contract! {
fn a_key_runs_at_most_its_limit_and_a_freed_slot_goes_to_the_next_blocked_job() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let a3 = queue.enqueue(sync("a")).unwrap();
    let b1 = queue.enqueue(sync("b")).unwrap();

    // One claim of ten: one job per key; the others of key a are blocked,
    // with no attempt used and no error written.
    let first = claim(&queue, 10);
    assert_eq!(ids(&first), vec![a1, b1]);
    for id in [a2, a3] {
        let job = queue.get(id).unwrap();
        assert_eq!((job.state, job.attempts, job.errors.len()), (JobState::Blocked, 0, 0));
        assert_eq!(job.last_error, None);
        assert_eq!(job.run_token, None);
    }
    assert!(claim(&queue, 10).is_empty(), "a claim never hands out a blocked job");
    let lease = |id| first.iter().find(|l| l.job_id == id).unwrap().clone();
    assert_eq!(
        lease(a1).limit.as_ref().map(|s| (s.name.as_str(), s.key.as_str(), s.weight)),
        Some(("sync", "a", 1))
    );

    // Success frees the slot in its own transaction: a2 is pending at once.
    queue.manual().complete(&lease(a1)).unwrap();
    assert_eq!(state(&queue, a2), JobState::Pending);
    assert_eq!(state(&queue, a3), JobState::Blocked);
    let second = claim(&queue, 10);
    assert_eq!(ids(&second), vec![a2]);

    // A failure that will be retried frees it too, and so does a snooze.
    queue.manual().fail(&second[0], "boom").unwrap();
    assert_eq!(state(&queue, a3), JobState::Pending);
    let third = claim(&queue, 10);
    assert_eq!(ids(&third), vec![a3]);
    assert_eq!(state(&queue, a2), JobState::Scheduled, "a2 waits for its backoff");
    let usage = queue.limit_usage(Some("sync")).unwrap();
    let a = usage.iter().find(|u| u.key == "a").unwrap();
    assert_eq!((a.held, a.holders), (1, 1));
    queue.manual().snooze(&third[0], chrono::Utc::now() + chrono::Duration::hours(1)).unwrap();
    queue.manual().complete(&lease(b1)).unwrap();
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0, "every release was handed on");
}
}

contract! {
fn a_holder_whose_lease_was_taken_back_frees_nothing_twice() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let first = queue.enqueue(sync("a")).unwrap();
    let second = queue.enqueue(sync("a")).unwrap();
    let third = queue.enqueue(sync("a")).unwrap();
    let stale = claim(&queue, 10);
    assert_eq!(ids(&stale), vec![first]);
    queue.manual().mark_started(&[&stale[0]]).unwrap();

    // The holder stalls past its lease: the reaper takes it back, and
    // with it the slot, which goes to the next job in line.
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_eq!(state(&queue, second), JobState::Pending);
    let next = claim(&queue, 10);
    assert_eq!(ids(&next), vec![second]);

    // The stale holder reports late: refused, and it frees no slot.
    let late = queue.manual().complete(&stale[0]).unwrap_err();
    assert!(matches!(late, Error::LeaseLost { .. }), "{late:?}");
    assert_eq!(state(&queue, third), JobState::Blocked);
    // Its job, due again after its backoff, is blocked behind the holder.
    clock.advance(secs(2));
    assert!(claim(&queue, 10).is_empty(), "still one holder of key a");
    assert_eq!(state(&queue, first), JobState::Blocked);
    let a = queue.limit_usage(Some("sync")).unwrap();
    assert_eq!((a[0].held, a[0].holders, a[0].blocked), (1, 1, 2), "{a:?}");
    queue.manual().complete(&next[0]).unwrap();
    assert_eq!(state(&queue, third), JobState::Pending);
}
}

contract! {
fn weights_and_a_total_are_kept_and_a_job_heavier_than_its_limit_is_dead_saying_why() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    // A box that runs two small transcodes, or one large one, of any
    // source, and at most three over all sources.
    queue.set_limit("transcode", Limit::per_key(2).total(3)).unwrap();
    let job = |key: &str, weight: u32| {
        NewJob::new("transcode").limit("transcode", key).limit_weight(weight)
    };
    let large = queue.enqueue(job("pi", 2)).unwrap();
    let small = queue.enqueue(job("pi", 1)).unwrap();
    let other = queue.enqueue(job("nas", 1)).unwrap();
    let too_many = queue.enqueue(job("usb", 1)).unwrap();
    let never = queue.enqueue(job("pi", 3)).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(ids(&first), vec![large, other], "2 + 1 slots: the total is reached");
    assert_eq!(state(&queue, small), JobState::Blocked);
    assert_eq!(state(&queue, too_many), JobState::Blocked);
    let dead = queue.get(never).unwrap();
    assert_eq!(dead.state, JobState::Dead);
    let error = dead.last_error.unwrap();
    assert!(error.contains("transcode") && error.contains("max_per_key 2"), "{error}");

    // The large one ends: the total has room for two, key pi for two.
    queue
        .manual()
        .complete(first.iter().find(|l| l.job_id == large).unwrap())
        .unwrap();
    assert_eq!(state(&queue, small), JobState::Pending);
    assert_eq!(state(&queue, too_many), JobState::Pending);
    let second = claim(&queue, 10);
    assert_eq!(ids(&second), vec![small, too_many]);
    let held: u64 = queue.limit_usage(None).unwrap().iter().map(|u| u.held).sum();
    assert_eq!(held, 3);
}
}

contract! {
fn raising_a_limit_hands_out_the_new_slots_at_once_and_lowering_it_admits_nothing_until_below() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let jobs: Vec<JobId> = (0..5).map(|_| queue.enqueue(sync("a")).unwrap()).collect();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    assert_eq!(
        queue.limit_usage(Some("sync")).unwrap()[0].blocked,
        4
    );

    queue.set_limit("sync", Limit::per_key(3)).unwrap();
    let pending = jobs.iter().filter(|id| state(&queue, **id) == JobState::Pending).count();
    assert_eq!(pending, 2, "the two new slots are handed out by the change itself");
    let second = claim(&queue, 10);
    assert_eq!(second.len(), 2);

    // Three hold; lowered to 1, none is stopped and none is admitted
    // until the holders weigh less than 1.
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    assert_eq!(queue.limits().unwrap()[0].limit, Limit::per_key(1));
    for lease in second.iter().chain(&first).take(2) {
        queue.manual().complete(lease).unwrap();
        assert!(claim(&queue, 10).is_empty(), "one holder left, the limit is 1");
    }
    let last_holder = second.iter().chain(&first).nth(2).unwrap();
    queue.manual().complete(last_holder).unwrap();
    assert_eq!(claim(&queue, 10).len(), 1);

    // Deleted, the limit limits nothing: the blocked job runs at once.
    assert!(queue.delete_limit("sync").unwrap());
    assert!(!queue.delete_limit("sync").unwrap());
    assert_eq!(claim(&queue, 10).len(), 1);
    assert!(queue.limits().unwrap().is_empty());
}
}

contract! {
fn a_cancelled_holder_keeps_its_slot_until_it_stops_and_a_blocked_job_can_be_cancelled() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let running = queue.enqueue(sync("a")).unwrap();
    let waiting = queue.enqueue(sync("a")).unwrap();
    let cancelled_while_blocked = queue.enqueue(sync("a")).unwrap();
    let held = claim(&queue, 10);
    assert_eq!(ids(&held), vec![running]);

    queue.cancel(cancelled_while_blocked).unwrap();
    assert_eq!(state(&queue, cancelled_while_blocked), JobState::Cancelled);

    // Cancelled while it runs, its handler may still be running: the slot
    // stays taken until the holder reports (refused), then goes on.
    queue.cancel(running).unwrap();
    assert_eq!(state(&queue, waiting), JobState::Blocked);
    assert!(claim(&queue, 10).is_empty());
    let refused = queue.manual().complete(&held[0]).unwrap_err();
    assert!(matches!(refused, Error::LeaseLost { .. }), "{refused:?}");
    assert_eq!(state(&queue, waiting), JobState::Pending);
    let next = claim(&queue, 10);
    assert_eq!(ids(&next), vec![waiting]);

    // A cancelled holder that never reports keeps the slot until its lease
    // runs out; the reaper then hands it on.
    let after = queue.enqueue(sync("a")).unwrap();
    assert!(claim(&queue, 10).is_empty());
    queue.cancel(waiting).unwrap();
    clock.advance(secs(31));
    queue.manual().reap().unwrap();
    assert_eq!(state(&queue, after), JobState::Pending);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

contract! {
fn bad_limits_are_refused_before_anything_is_written() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    for limit in [Limit::per_key(0), Limit::per_key(1).total(0)] {
        let err = queue.set_limit("x", limit).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    let long = "n".repeat(tickler::MAX_LIMIT_NAME_BYTES + 1);
    for name in ["", long.as_str()] {
        let err = queue.set_limit(name, Limit::per_key(1)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        let err = queue.enqueue(NewJob::new("k").limit(name, "key")).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    let err = queue.enqueue(NewJob::new("k").limit("x", "key").limit_weight(0)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let key = "k".repeat(tickler::MAX_LIMIT_KEY_BYTES + 1);
    let err = queue.enqueue(NewJob::new("k").limit("x", key)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(queue.limits().unwrap().is_empty());
    assert_eq!(queue.stats().unwrap().counts.len(), 0);
}
}

contract! { poolers:
fn a_pool_of_many_threads_never_runs_more_than_a_keys_limit_at_once() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    queue.set_limit("sync", Limit::per_key(2)).unwrap();
    let live: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    let handler = {
        let live = live.clone();
        move |ctx: &JobContext| -> Result<(), JobError> {
            let key = ctx.lease().limit.as_ref().unwrap().key.clone();
            {
                let mut live = live.lock().unwrap();
                let entry = live.entry(key.clone()).or_default();
                entry.0 += 1;
                entry.1 = entry.1.max(entry.0);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            live.lock().unwrap().get_mut(&key).unwrap().0 -= 1;
            Ok(())
        }
    };
    let jobs: Vec<NewJob> = (0..80)
        .map(|i| NewJob::new("sync").limit("sync", format!("account-{}", i % 4)))
        .collect();
    queue.enqueue_batch(jobs).unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(12)
        .lease(secs(10))
        .handler("sync", handler)
        .start()
        .unwrap();
    pool::wait_until("every job succeeded", secs(60), || {
        queue.stats().unwrap().total(JobState::Succeeded) == 80
    });
    pool.shutdown(secs(5));
    let live = live.lock().unwrap();
    assert_eq!(live.len(), 4);
    for (key, (now, most)) in live.iter() {
        assert_eq!(*now, 0);
        assert_eq!(*most, 2, "key {key}: at most 2 at once, and 2 reached");
    }
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

/// The lost wake-up race on a server, forced both ways: a claim that
/// pushes job J back because key K is full, and the release of K's holder
/// in another transaction. Both lock the limit's row; a connection of the
/// test's own holds it while the two queue up behind it in a chosen order.
/// Claim first: the claim still counts the holder (its release has not
/// committed) and blocks J, then the release sees J blocked and makes it
/// pending. Release first: it finds nothing blocked (J's claim has not
/// committed), then the claim counts no holder and keeps J. Either way J
/// runs next, never blocked beside a free slot. Server engines only: on
/// SQLite one writer at a time makes the two transactions one after the
/// other by construction.
fn race(claim_first: bool) {
    let (_dir, path) = temp_db();
    // Lock waits longer than the test's hold: on MySQL a wait that ran out
    // would be retried, and the two would lose their order in the line.
    let queue = tickler::Queue::builder(crate::support::engine::target(&path))
        .clock(std::sync::Arc::new(tickler::ManualClock::new(common::t0())))
        .retry_policy(fixed_policy())
        .busy_timeout(secs(30))
        .open()
        .unwrap();
    queue.set_limit("race", Limit::per_key(1)).unwrap();
    queue.enqueue(NewJob::new("k").limit("race", "k")).unwrap();
    let holder = claim(&queue, 1).remove(0);
    let j = queue.enqueue(NewJob::new("k").limit("race", "k")).unwrap();
    let lock = crate::support::engine::hold_limit_row(&path, "race", secs(3));
    // Polled every 50 ms: each look is a connection of its own.
    let waiting = |n: i64| {
        let deadline = std::time::Instant::now() + secs(10);
        while crate::support::engine::lock_waiters(&path) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "no {n} transactions wait for the limit"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let claimer = {
        let queue = queue.clone();
        move || claim(&queue, 10)
    };
    let releaser = {
        let queue = queue.clone();
        move || queue.manual().complete(&holder)
    };
    let (claimed, released) = if claim_first {
        let c = std::thread::spawn(claimer);
        waiting(1);
        let r = std::thread::spawn(releaser);
        waiting(2);
        (c.join().unwrap(), r.join().unwrap())
    } else {
        let r = std::thread::spawn(releaser);
        waiting(1);
        let c = std::thread::spawn(claimer);
        waiting(2);
        (c.join().unwrap(), r.join().unwrap())
    };
    lock.join().unwrap();
    released.unwrap();
    if claim_first {
        assert!(claimed.is_empty(), "the holder still counted: {claimed:?}");
        assert_eq!(
            state(&queue, j),
            JobState::Pending,
            "the release handed the slot on"
        );
        assert_eq!(ids(&claim(&queue, 10)), vec![j]);
    } else {
        assert_eq!(ids(&claimed), vec![j], "the claim saw the slot free");
    }
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}

contract! { servers_only:
fn a_claim_that_blocks_a_job_then_a_release_of_its_key_hand_the_slot_on() {
    race(true);
}
}

contract! { servers_only:
fn a_release_then_a_claim_of_its_key_keep_the_job() {
    race(false);
}
}
