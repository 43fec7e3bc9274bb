//! Concurrency-limit failures reported against other queues (Solid Queue,
//! Oban, BullMQ, celery-singleton), each tried on tickler: a slot given up
//! while the old run may still be going (a retry, a timeout), a slot lost
//! when the job handed it is cancelled, a paused queue or a lowered limit
//! or one busy key holding slots others could use, scheduled jobs and
//! retries slipping past the limit, a stale holder freeing a slot twice.
//! Each ends with the safety sweep finding nothing to hand on: every slot
//! went on by the transaction that freed it.

use crate::support::common;
use crate::support::limits::*;

use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
use tickler::{JobState, Limit, NewJob, Outcome};

// H1. Solid Queue #689/#761: a slot given up while the old run may still
// be running. Retrying a job cancelled while running (holder not
// reported, lease not expired) clears its lease: the slot is freed at
// once, and another job of the key starts beside the old run.
contract! {
fn retry_of_a_cancelled_holder_keeps_its_slot() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    queue.cancel(a1).unwrap();
    assert_eq!(held(&queue, "a"), 1, "cancelled, holder not stopped: slot held");
    queue.retry(a1).unwrap();
    assert_eq!(state(&queue, a1), JobState::Scheduled, "its retry waits for the lease");
    let a2 = queue.enqueue(sync("a")).unwrap();
    let second = claim(&queue, 10);
    assert!(second.is_empty(), "a2 {:?} started beside a1's unstopped run", state(&queue, a2));
}
}

// H2. Same, for a job that timed out with its attempts used up (dead,
// keeping its lease): retry_dead makes it pending at once with no lease,
// so it is claimed and admitted while its own timed-out run still holds.
contract! {
fn retry_dead_of_a_timed_out_holder_keeps_its_slot() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a").max_attempts(1)).unwrap();
    let first = claim(&queue, 10);
    queue.manual().mark_started(&[&first[0]]).unwrap();
    let r = queue
        .manual()
        .record_outcomes(&[(&first[0], Outcome::TimedOut("too slow".into()))])
        .unwrap();
    assert!(r[0].is_ok());
    assert_eq!(state(&queue, a1), JobState::Dead);
    assert_eq!(held(&queue, "a"), 1, "dead past its timeout: its run may still be going");
    let (retried, _) = queue.retry_dead(None).unwrap();
    assert_eq!(retried, 1);
    let again = claim(&queue, 10);
    assert!(again.is_empty(), "a1 claimed again beside its own timed-out run: {again:?}");
}
}

// H3. A timed-out run with attempts left: its retry waits for the lease
// to run out (the handler may still run), but the slot is freed at once.
contract! {
fn timed_out_run_with_attempts_left_keeps_its_slot_until_its_lease_ends() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    assert_eq!(state(&queue, a2), JobState::Blocked);
    queue.manual().mark_started(&[&first[0]]).unwrap();
    queue
        .manual()
        .record_outcomes(&[(&first[0], Outcome::TimedOut("too slow".into()))])
        .unwrap();
    let job = queue.get(a1).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(
        state(&queue, a2),
        JobState::Blocked,
        "a2 released while a1's timed-out handler may run until its lease ends"
    );
    assert!(claim(&queue, 10).is_empty());
    // The lease runs out: the reaper hands the slot on.
    clock.advance(secs(31));
    queue.manual().reap().unwrap();
    assert_eq!(claim(&queue, 10).len(), 1);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// H4. Solid Queue #125 (discarding a job that was handed the slot): the
// slot handed to a released job is lost when that job is cancelled
// before a claim; its blocked siblings wait for the reaper's sweep.
contract! {
fn cancelling_a_released_job_hands_its_slot_on() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let _a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let a3 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    queue.manual().complete(&first[0]).unwrap();
    assert_eq!(state(&queue, a2), JobState::Pending);
    queue.cancel(a2).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(next.iter().map(|l| l.job_id).collect::<Vec<_>>(), vec![a3]);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// H5. Oban global_limit + paused queue: the slot is handed to the next
// blocked job even if it is in a paused queue, so the same key's jobs in
// running queues wait with the slot free.
contract! {
fn a_paused_queue_does_not_hold_a_keys_slot() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let _a1 = queue.enqueue(sync("a")).unwrap();
    let p = queue.enqueue(sync("a").queue("slow")).unwrap();
    let a3 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    assert!(claim_in(&queue, "slow", 10).is_empty());
    assert_eq!(state(&queue, p), JobState::Blocked);
    assert_eq!(state(&queue, a3), JobState::Blocked);
    queue.pause_queue("slow").unwrap();
    queue.manual().complete(&first[0]).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(next.len(), 1, "key a's slot is free; a3's queue runs; slow is paused");
    assert_eq!(state(&queue, p), JobState::Blocked);
    // Resumed, its job gets the next slot.
    queue.resume_queue("slow").unwrap();
    queue.manual().complete(&next[0]).unwrap();
    assert_eq!(claim_in(&queue, "slow", 10).len(), 1);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// H6. Lowering a limit below the weight of a job already blocked: the
// heavy job heads its key's line and can never fit, so it stalls every
// job of that key for ever (it is only made dead when claimed, and it is
// never released to be claimed). The sweep finds nothing.
contract! {
fn lowering_a_limit_below_a_blocked_jobs_weight_does_not_stall_its_key() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(2)).unwrap();
    let _r = queue.enqueue(sync("a").limit_weight(2)).unwrap();
    let heavy = queue.enqueue(sync("a").limit_weight(2)).unwrap();
    let light = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    assert_eq!(state(&queue, heavy), JobState::Blocked);
    assert_eq!(state(&queue, light), JobState::Blocked);
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    queue.manual().complete(&first[0]).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(
        (state(&queue, light), next.len()),
        (JobState::Running, 1),
        "key a is empty, light fits, but waits behind a job that can never run"
    );
    let heavy = queue.get(heavy).unwrap();
    assert_eq!(heavy.state, JobState::Dead);
    assert!(heavy.last_error.unwrap().contains("max_per_key 1"));
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// H6b. The same with a total: a blocked job heavier than the lowered
// total stalls every key of the limit.
contract! {
fn lowering_a_total_below_a_blocked_jobs_weight_does_not_stall_the_limit() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(2).total(2)).unwrap();
    let _r = queue.enqueue(sync("a").limit_weight(2)).unwrap();
    let heavy = queue.enqueue(sync("b").limit_weight(2)).unwrap();
    let other = queue.enqueue(sync("c")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    assert_eq!(state(&queue, heavy), JobState::Blocked);
    assert_eq!(state(&queue, other), JobState::Blocked);
    queue.set_limit("sync", Limit::per_key(2).total(1)).unwrap();
    queue.manual().complete(&first[0]).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(next.len(), 1, "nothing holds; key c's job fits the total of 1");
    assert_eq!(state(&queue, heavy), JobState::Dead);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// H7. Oban Pro partitioned global limits / BullMQ groups: one busy key
// starves the others. With a total, a release that read the blocked jobs
// of the limit in claim order whatever their key would find only the
// first key's when it has thousands.
contract! {
fn a_busy_key_does_not_starve_another_key_under_a_total() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1).total(8)).unwrap();
    let busy: Vec<NewJob> = (0..1_005).map(|_| sync("a")).collect();
    queue.enqueue_batch(busy).unwrap();
    let b1 = queue.enqueue(sync("b")).unwrap();
    let b2 = queue.enqueue(sync("b")).unwrap();
    let mut holders = Vec::new();
    while queue.count(JobState::Pending).unwrap() > 0 {
        holders.extend(claim(&queue, 200));
    }
    // a1 and b1 run, everything else is blocked.
    assert_eq!(holders.len(), 2);
    assert_eq!(state(&queue, b2), JobState::Blocked);
    let b1_lease = holders.iter().find(|l| l.job_id == b1).unwrap().clone();
    queue.manual().complete(&b1_lease).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(
        next.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        vec![b2],
        "key b is empty and the total has 7 free slots"
    );
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// Positive checks (what other queues got wrong, tickler gets right).

// Solid Queue / GoodJob: limits bypassed for scheduled (delayed) jobs and
// for retries.
contract! {
fn scheduled_jobs_and_retries_are_limited() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let later = queue.enqueue_in(sync("a"), secs(5)).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    clock.advance(secs(6));
    assert!(claim(&queue, 10).is_empty(), "the delayed job is due but a1 holds");
    assert_eq!(state(&queue, later), JobState::Blocked);
    // a1 fails: later gets the slot; a1's retry, due after backoff, blocks.
    queue.manual().fail(&first[0], "boom").unwrap();
    let second = claim(&queue, 10);
    assert_eq!(second.iter().map(|l| l.job_id).collect::<Vec<_>>(), vec![later]);
    clock.advance(secs(2));
    assert!(claim(&queue, 10).is_empty());
    assert_eq!(state(&queue, a1), JobState::Blocked);
    queue.manual().complete(&second[0]).unwrap();
    assert_eq!(claim(&queue, 10).len(), 1);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// Solid Queue #478: jobs stay blocked after the limit is removed; and a
// limit deleted then set again.
contract! {
fn deleting_then_setting_a_limit_again_keeps_it() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    for _ in 0..4 {
        queue.enqueue(sync("a")).unwrap();
    }
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    queue.delete_limit("sync").unwrap();
    let second = claim(&queue, 10);
    assert_eq!(second.len(), 3, "deleted: every blocked job runs");
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    queue.enqueue(sync("a")).unwrap();
    assert!(claim(&queue, 10).is_empty(), "four hold, the limit is 1 again");
    for l in first.iter().chain(&second).take(3) {
        queue.manual().complete(l).unwrap();
        assert!(claim(&queue, 10).is_empty());
    }
    queue.manual().complete(&second[2]).unwrap();
    assert_eq!(claim(&queue, 10).len(), 1);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

// Solid Queue #761 (stale holder releases twice) with the reaper and a
// refused late report in one record_and_claim batch.
contract! {
fn a_stale_report_batched_with_a_claim_frees_nothing() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    for _ in 0..3 {
        queue.enqueue(sync("a")).unwrap();
    }
    let stale = claim(&queue, 10);
    queue.manual().mark_started(&[&stale[0]]).unwrap();
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let live = claim(&queue, 10);
    assert_eq!(live.len(), 1);
    let r = queue
        .manual()
        .record_outcomes(&[(&stale[0], Outcome::Complete), (&stale[0], Outcome::Complete)])
        .unwrap();
    assert!(r.iter().all(|r| r.is_err()));
    assert!(claim(&queue, 10).is_empty(), "one holder, limit 1");
    assert_eq!(held(&queue, "a"), 1);
}
}

// H0. limit_usage, the operator's reading, on a key none of whose jobs
// holds a lease (only pending or blocked jobs).
contract! {
fn limit_usage_reads_a_key_with_only_waiting_jobs() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    queue.enqueue(sync("a")).unwrap();
    let usage = queue.limit_usage(Some("sync"));
    assert!(usage.is_ok(), "{usage:?}");
}
}
