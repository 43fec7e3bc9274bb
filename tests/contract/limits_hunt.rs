//! A hunt through other queues' trackers for failures of concurrency and
//! rate limits, their events, `explain` and operator actions, each tried
//! on tickler (not repeating `limits_reported` and `rate_reported`). Each
//! test names its source. Time is a manual clock where it can be.

use crate::support::common;
use crate::support::limits::*;

use common::{fixed_policy, manual_queue_with_policy, ms, secs, temp_db};
use std::time::Duration;
use tickler::{Clock, Error, JobId, JobState, Limit, ManualClock, NewJob, Outcome, Queue};

/// Runs every due job each `step` for `span`; returns (job, ms since the
/// start) of each start.
fn run_for(
    queue: &Queue,
    clock: &ManualClock,
    step: Duration,
    span: Duration,
) -> Vec<(JobId, i64)> {
    let t0 = clock.now();
    let end = t0 + chrono::Duration::from_std(span).unwrap();
    let mut starts = Vec::new();
    loop {
        let now = clock.now();
        for id in run_due(queue) {
            starts.push((id, (now - t0).num_milliseconds()));
        }
        if now >= end {
            return starts;
        }
        clock.advance(step);
    }
}

contract! {
/// L1. Solid Queue PR #125 (rails/solid_queue, "Release next blocked job
/// when discarding a job that holds a concurrency lock") and saq PR #156
/// (tobymao/saq, "Retry should not be responsible for releasing a job's
/// lock"): a job whose run timed out with attempts left waits for its
/// retry as `scheduled`, keeping its lease (its handler may still run), and
/// with it its slot. Cancelling it then must not give that slot up before
/// the lease ends: a new job of the key would start beside the old run.
fn cancelling_a_timed_out_holders_retry_keeps_its_slot_until_its_lease_ends() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    queue.manual().mark_started(&[&first[0]]).unwrap();
    queue
        .manual()
        .record_outcomes(&[(&first[0], Outcome::TimedOut("too slow".into()))])
        .unwrap();
    assert_eq!(state(&queue, a1), JobState::Scheduled);
    assert_eq!(held(&queue, "a"), 1, "timed out, its handler may run on: slot held");
    queue.cancel(a1).unwrap();
    let held_after = held(&queue, "a");
    let a2 = queue.enqueue(sync("a")).unwrap();
    let beside = claim(&queue, 10);
    assert!(
        held_after == 1 && beside.is_empty(),
        "after cancelling a1's retry, key a holds {held_after} and {:?} (a2 = {a2}) started beside \
         a1's timed-out run, whose lease runs 30 s more",
        ids(&beside)
    );
}
}

contract! {
/// L1b. The same through another door: a job cancelled while running,
/// retried (it waits `scheduled` for its unstopped holder's lease, keeping
/// the slot: limits_reported H1), then cancelled again.
fn cancelling_again_a_retried_cancelled_holder_keeps_its_slot_until_its_lease_ends() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    assert_eq!(claim(&queue, 10).len(), 1);
    queue.cancel(a1).unwrap();
    queue.retry(a1).unwrap();
    assert_eq!(state(&queue, a1), JobState::Scheduled);
    assert_eq!(held(&queue, "a"), 1);
    queue.cancel(a1).unwrap();
    let held_after = held(&queue, "a");
    queue.enqueue(sync("a")).unwrap();
    let beside = claim(&queue, 10);
    assert!(
        held_after == 1 && beside.is_empty(),
        "cancelled, retried, cancelled again: key a holds {held_after} and {:?} started beside \
         a1's unstopped run",
        ids(&beside)
    );
}
}

contract! {
/// L2. The same cancel, seen from the jobs blocked on the slot: when the
/// kept lease is cleared by the cancel rather than ended by the reaper,
/// no release runs, so the blocked job waits for the safety sweep.
fn cancelling_a_timed_out_holders_retry_leaves_no_blocked_job_to_the_sweep() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(state(&queue, a2), JobState::Blocked);
    queue.manual().mark_started(&[&first[0]]).unwrap();
    queue
        .manual()
        .record_outcomes(&[(&first[0], Outcome::TimedOut("too slow".into()))])
        .unwrap();
    queue.cancel(a1).unwrap();
    clock.advance(secs(31));
    queue.manual().reap().unwrap();
    let next = claim(&queue, 10);
    let a2_was = state(&queue, a2);
    let swept = if next.is_empty() {
        queue.manual().sweep_limits().unwrap()
    } else {
        0
    };
    assert_eq!(
        ids(&next),
        vec![a2],
        "a1's lease ran out and the reaper passed, yet a2 is {:?}; the safety sweep then \
         released {swept} job(s) no release had handed the slot",
        a2_was
    );
}
}

contract! {
/// L3. Solid Queue #546 (rails/solid_queue, "When the worker dies, the
/// concurrency limit is not reset ... even after the job is pruned") and
/// Hangfire #1971 ("Throttling Breaks when Deleting Processing Jobs"): a
/// job cancelled while running keeps its lease (and slot) until its holder
/// stops or the lease runs out; the reaper then clears it and hands the
/// slot on. If an operator prunes the row after the lease ran out but
/// before the reaper's pass, nothing hands the slot on.
fn pruning_a_cancelled_holder_whose_lease_ran_out_hands_its_slot_on() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    queue.manual().mark_started(&[&first[0]]).unwrap();
    assert_eq!(state(&queue, a2), JobState::Blocked);
    queue.cancel(a1).unwrap();
    assert_eq!(held(&queue, "a"), 1, "cancelled, its holder not stopped: slot held");
    // The holder never reports (its process died); its lease runs out.
    clock.advance(secs(31));
    // Its slot is handed on by the reaper's pass over run-out leases: the
    // pruner leaves the row to it rather than free the slot to no one.
    let pruned = queue.prune(clock.now()).unwrap();
    assert_eq!(pruned, 0, "a1's slot not handed on yet: left for the reaper");
    queue.manual().reap().unwrap();
    assert_eq!(queue.prune(clock.now()).unwrap(), 1, "after the reaper's pass");
    let next = claim(&queue, 10);
    let a2_was = state(&queue, a2);
    let swept = if next.is_empty() {
        queue.manual().sweep_limits().unwrap()
    } else {
        0
    };
    assert_eq!(
        ids(&next),
        vec![a2],
        "a1 was pruned after its lease ran out and the reaper passed: a2 is still {:?}; the \
         safety sweep then released {swept} job(s)",
        a2_was
    );
}
}

contract! {
/// L4. Kestra #13743 (kestra-io/kestra, "Concurrency limit is not work
/// when execution is killed in bulk": two running executions killed at
/// once, only one queued execution started): two holders that end in one
/// batch of outcomes, or are taken back in one reaper pass, free two
/// slots, of one key and under a total across keys.
fn two_holders_ending_together_free_two_slots() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let mut wrong = Vec::new();
    // One key, max 2: two outcomes in one batch (a success and a failure).
    queue.set_limit("sync", Limit::per_key(2)).unwrap();
    for _ in 0..6 {
        queue.enqueue(sync("a")).unwrap();
    }
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 2);
    queue
        .manual()
        .record_outcomes(&[
            (&first[0], Outcome::Complete),
            (&first[1], Outcome::FailPermanently("x".into())),
        ])
        .unwrap();
    let next = claim(&queue, 10);
    if next.len() != 2 {
        wrong.push(format!("one batch ended two holders of key a; {} started", next.len()));
    }
    // Both taken back by one reaper pass.
    queue.manual().mark_started(&next.iter().collect::<Vec<_>>()).unwrap();
    clock.advance(secs(31));
    queue.manual().reap().unwrap();
    let after_reap = claim(&queue, 10);
    if after_reap.len() != 2 {
        wrong.push(format!(
            "one reaper pass took back two holders of key a; {} started",
            after_reap.len()
        ));
    }
    for lease in &after_reap {
        queue.manual().complete(lease).unwrap();
    }
    while !run_due(&queue).is_empty() {}
    clock.advance(secs(120));
    while !run_due(&queue).is_empty() {}
    // Under a total: keys b and c, one each, two at once overall.
    queue.set_limit("tot", Limit::per_key(1).total(2)).unwrap();
    let tot = |key: &str| NewJob::new("sync").limit("tot", key);
    for key in ["b", "c", "b", "c", "d"] {
        queue.enqueue(tot(key)).unwrap();
    }
    let held = claim(&queue, 10);
    assert_eq!(held.len(), 2);
    queue
        .manual()
        .record_outcomes(&[(&held[0], Outcome::Complete), (&held[1], Outcome::Complete)])
        .unwrap();
    let next = claim(&queue, 10);
    if next.len() != 2 {
        wrong.push(format!("one batch ended both holders of a total of 2; {} started", next.len()));
    }
    let swept = queue.manual().sweep_limits().unwrap();
    if swept != 0 {
        wrong.push(format!("the safety sweep released {swept} job(s) no release had"));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
}

contract! {
/// L5. Kestra #13211 (kestra-io/kestra, "Concurrency limit is ignored
/// when an execution is killed and other executions are queued": killing
/// a queued execution started another without checking the limit):
/// cancelling a blocked job frees nothing, and retrying it puts it back
/// under the limit.
fn cancelling_a_blocked_job_frees_nothing_and_its_retry_stays_limited() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let _a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let a3 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    queue.cancel(a2).unwrap();
    assert!(claim(&queue, 10).is_empty(), "a blocked job cancelled: a1 still holds");
    assert_eq!(state(&queue, a3), JobState::Blocked);
    queue.retry(a2).unwrap();
    let beside = claim(&queue, 10);
    assert!(beside.is_empty(), "{:?} started beside a1 after a2's retry", ids(&beside));
    assert_eq!(state(&queue, a2), JobState::Blocked);
    queue.manual().complete(&first[0]).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(next.len(), 1, "one slot freed: {:?}", ids(&next));
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

contract! {
/// L6. BullMQ #3325 (taskforcesh/bullmq, "Delayed jobs will break group
/// rate-limiting": with any delayed job in the queue, a group limited to
/// one per 2 s ran one per 10 s until it came due): a key's rate is kept
/// whatever delayed jobs wait beside it, limited or not.
fn delayed_jobs_beside_a_rated_key_do_not_slow_it() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(2))).unwrap();
    let jobs: Vec<JobId> = (0..40).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    let other = queue.enqueue(NewJob::new("other").delay(secs(30))).unwrap();
    let other_key = queue.enqueue(api("b").delay(secs(25))).unwrap();
    let starts = run_for(&queue, &clock, ms(100), secs(30));
    let of_a: Vec<i64> = starts
        .iter()
        .filter(|(id, _)| jobs.contains(id))
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(of_a.len(), 16, "key a at 1 per 2 s over 30 s started at ms {of_a:?}");
    let started: Vec<JobId> = starts.iter().map(|s| s.0).collect();
    assert!(started.contains(&other) && started.contains(&other_key), "{starts:?}");
}
}

contract! {
/// L7. sidekiq-limit_fetch #56 (d34ndev/sidekiq-limit_fetch, "limit not
/// being followed": `explain` said limit 1, busy 0, while the queue was
/// held), Solid Queue #456 ("Job with concurrency key blocked when it
/// shouldn't have") and rocketjob PR #50 ("Capture throttle reason": why
/// a job waits should be visible): a job blocked by its limit's total,
/// its own key free, is explained as "0 of 1 held" with no holder named.
fn explain_of_a_job_blocked_by_the_total_says_so() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1).total(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let b1 = queue.enqueue(sync("b")).unwrap();
    assert_eq!(claim(&queue, 10).len(), 1);
    assert_eq!(state(&queue, b1), JobState::Blocked);
    let why = queue.explain(b1).unwrap();
    let line = why.to_string();
    let names_a1 = matches!(&why.reason, tickler::Reason::Blocked { holders, .. }
        if holders.iter().any(|h| h.job_id == a1));
    assert!(
        line.contains("total") || names_a1,
        "b1 waits for a1 (the total of 1), explained as: {line:?} ({:?})",
        why.reason
    );
}
}

contract! {
/// L8. Oban #1019 (oban-bg/oban, a paused queue with a global limit:
/// jobs sat in `available` with nothing saying why): a blocked job of a
/// paused queue is passed over when its key's slot is freed (by design),
/// and is then explained as blocked by a key nobody holds.
fn explain_of_a_blocked_job_in_a_paused_queue_names_the_pause() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let _a1 = queue.enqueue(sync("a")).unwrap();
    let p = queue.enqueue(sync("a").queue("slow")).unwrap();
    let first = claim(&queue, 10);
    assert!(claim_in(&queue, "slow", 10).is_empty());
    assert_eq!(state(&queue, p), JobState::Blocked);
    queue.pause_queue("slow").unwrap();
    queue.manual().complete(&first[0]).unwrap();
    assert_eq!(state(&queue, p), JobState::Blocked, "passed over: its queue is paused");
    let why = queue.explain(p).unwrap();
    let line = why.to_string();
    assert!(
        line.contains("paused"),
        "p waits for its paused queue (key a is free), explained as: {line:?}"
    );
}
}

contract! {
/// L9. River #779 (riverqueue/river, "invalid UTF8 byte sequence for
/// unique_key") and the "invalid byte sequence for encoding UTF8: 0x00"
/// reports of PostgreSQL-backed queues; sidekiq-throttled #131 (one
/// limit's key holding back another's): limit names and keys with a NUL,
/// case or trailing-space differences, 4-byte characters, or at their
/// length caps are either kept byte for byte (one slot each, distinct) or
/// refused with a typed error; one over a cap is refused.
fn limit_names_and_keys_with_odd_bytes_are_kept_apart_or_refused() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let mut wrong = Vec::new();
    let long_key = "🔑".repeat(tickler::MAX_LIMIT_KEY_BYTES / 4);
    let long_name = "ñ".repeat(tickler::MAX_LIMIT_NAME_BYTES / 2);
    let names = ["odd", "odd\0nul", "Odd", "odd ", long_name.as_str()];
    let keys = ["k", "k\0x", "K", "k ", "ключ🔑", long_key.as_str(), ""];
    let mut expected = 0;
    for name in names {
        match queue.set_limit(name, Limit::per_key(1)) {
            Ok(()) => {}
            Err(Error::InvalidArgument(_)) if name.contains('\0') => continue,
            Err(e) => {
                wrong.push(format!("set_limit({name:?}): {e:?}"));
                continue;
            }
        }
        for key in keys {
            let job = || NewJob::new("odd").limit(name, key);
            match queue.enqueue(job()) {
                Ok(_) => {
                    queue.enqueue(job()).unwrap();
                    expected += 1;
                }
                Err(Error::InvalidArgument(_)) if key.contains('\0') => {}
                Err(e) => wrong.push(format!("enqueue limit ({name:?}, {key:?}): {e:?}")),
            }
        }
    }
    let leases = queue.manual().claim("default", "w", 1_000, secs(30)).unwrap();
    let mut per: std::collections::BTreeMap<(String, String), usize> = Default::default();
    for lease in &leases {
        let slot = lease.limit.clone().expect("limited");
        *per.entry((slot.name, slot.key)).or_default() += 1;
    }
    if leases.len() != expected || per.values().any(|n| *n != 1) {
        wrong.push(format!(
            "{expected} distinct (limit, key) pairs of 2 jobs each at 1 per key: {} started, \
             per pair {:?}",
            leases.len(),
            per.iter()
                .filter(|(_, n)| **n != 1)
                .map(|((n, k), c)| (n.escape_debug().to_string(), k.chars().take(12).collect::<String>().escape_debug().to_string(), *c))
                .collect::<Vec<_>>()
        ));
    }
    // Read back as written.
    let usage = queue.limit_usage(None).unwrap();
    for u in &usage {
        if !names.contains(&u.name.as_str()) || !keys.contains(&u.key.as_str()) {
            wrong.push(format!("limit_usage read back ({:?}, {:?})", u.name, u.key));
        }
    }
    // Over the caps: typed errors.
    let over_key = "k".repeat(tickler::MAX_LIMIT_KEY_BYTES + 1);
    match queue.enqueue(NewJob::new("odd").limit("odd", over_key)) {
        Err(Error::InvalidArgument(_)) => {}
        other => wrong.push(format!("a key over the cap: {other:?}")),
    }
    let over_name = "n".repeat(tickler::MAX_LIMIT_NAME_BYTES + 1);
    match queue.set_limit(&over_name, Limit::per_key(1)) {
        Err(Error::InvalidArgument(_)) => {}
        other => wrong.push(format!("a name over the cap: {other:?}")),
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
}

contract! {
/// L10. GoodJob #622 / PR #657 (bensheldon/good_job, "Copy forward
/// concurrency key value when retrying a job": a retried job ran beside
/// another of its key) and Hangfire #2317 ("Jobs stuck in scheduled after
/// failing to acquire semaphore"): a dead limited job retried by the
/// operator (retry and retry_dead) keeps its limit and key, waits blocked
/// while its key is held, and gets the next slot.
fn a_retried_dead_limited_job_waits_for_its_key_then_runs() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let x = queue.enqueue(sync("a").max_attempts(1)).unwrap();
    let y = queue.enqueue(sync("a").max_attempts(1)).unwrap();
    for _ in 0..2 {
        let l = claim(&queue, 10);
        assert_eq!(l.len(), 1);
        queue.manual().fail(&l[0], "boom").unwrap();
    }
    assert_eq!((state(&queue, x), state(&queue, y)), (JobState::Dead, JobState::Dead));
    let holder = queue.enqueue(sync("a")).unwrap();
    let h = claim(&queue, 10);
    assert_eq!(ids(&h), vec![holder]);
    queue.retry(x).unwrap();
    assert_eq!(queue.retry_dead(None).unwrap(), (1, 0));
    let beside = claim(&queue, 10);
    assert!(beside.is_empty(), "{:?} started beside the holder", ids(&beside));
    let usage = queue.limit_usage(Some("sync")).unwrap();
    assert_eq!((usage[0].key.as_str(), usage[0].blocked), ("a", 2), "{usage:?}");
    queue.manual().complete(&h[0]).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(next.len(), 1);
    queue.manual().complete(&next[0]).unwrap();
    let last = claim(&queue, 10);
    assert_eq!(last.len(), 1);
    assert_eq!(ids(&[next, last].concat()), vec![x, y]);
}
}

contract! {
/// L11. sidekiq-throttled #66 and #25 (ixti/sidekiq-throttled, a job
/// both throttled and unique: locks lost, jobs disappearing): a unique
/// job blocked on its limit keeps its unique_key (an enqueue of the same
/// key returns it), runs once, and cancelling it while blocked frees the
/// key without freeing a slot.
fn a_blocked_unique_job_keeps_its_key_and_runs_once() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let _a1 = queue.enqueue(sync("a")).unwrap();
    let u = queue.enqueue(sync("a").unique_key("u-1")).unwrap();
    let v = queue.enqueue(sync("a").unique_key("v-1")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(first.len(), 1);
    assert_eq!(state(&queue, u), JobState::Blocked);
    assert_eq!(queue.enqueue(sync("a").unique_key("u-1")).unwrap(), u);
    queue.cancel(v).unwrap();
    let v2 = queue.enqueue(sync("a").unique_key("v-1")).unwrap();
    assert_ne!(v2, v, "v's key was freed by its cancel");
    assert!(claim(&queue, 10).is_empty(), "a1 still holds");
    queue.manual().complete(&first[0]).unwrap();
    let next = claim(&queue, 10);
    assert_eq!(ids(&next), vec![u]);
    queue.manual().complete(&next[0]).unwrap();
    let last = claim(&queue, 10);
    assert_eq!(ids(&last), vec![v2]);
    queue.manual().complete(&last[0]).unwrap();
    assert!(claim(&queue, 10).is_empty());
    assert_eq!(queue.get(u).unwrap().attempts, 1);
}
}

contract! {
/// L12. Oban #792 and #1477 (oban-bg/oban, a partitioned rate limit: jobs
/// without the partition key, or another partition's use, held back a
/// partition): keys of one limit are independent, the empty key included,
/// and a handler told to wait on one key holds back that key alone.
fn one_keys_rate_and_hold_leave_other_keys_alone() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(10))).unwrap();
    let empty = queue.enqueue(api("")).unwrap();
    let a = queue.enqueue(api("a")).unwrap();
    let started = run_due(&queue);
    assert_eq!(ids_sorted(started), ids_sorted(vec![empty, a]));
    // A handler of key a is told to wait 60 s.
    clock.advance(secs(10));
    let a2 = queue.enqueue(api("a")).unwrap();
    let handler = |ctx: &tickler::JobContext| -> Result<(), tickler::JobError> {
        Err(ctx.rate_limited(Duration::from_secs(60)))
    };
    let told = tickler::testing::run_one(&queue, "default", "api", &handler).unwrap().unwrap();
    assert_eq!(told.0, a2);
    let e2 = queue.enqueue(api("")).unwrap();
    let b = queue.enqueue(api("b")).unwrap();
    let now = run_due(&queue);
    assert_eq!(
        ids_sorted(now),
        ids_sorted(vec![e2, b]),
        "key a is held back 60 s; the empty key (due after 10 s) and key b are not"
    );
}
}

fn ids_sorted(mut v: Vec<JobId>) -> Vec<JobId> {
    v.sort();
    v
}

contract! {
/// L13. Solid Queue #125 again (a slot given back by a job leaving the
/// key's holders other than by finishing): a holder that snoozes gives its
/// slot to the next blocked job at once, and when it comes due again it
/// waits its turn behind that job rather than starting beside it.
fn a_snoozing_holder_hands_its_slot_on_and_waits_its_turn_after() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let a1 = queue.enqueue(sync("a")).unwrap();
    let a2 = queue.enqueue(sync("a")).unwrap();
    let first = claim(&queue, 10);
    assert_eq!(state(&queue, a2), JobState::Blocked);
    queue.manual().snooze(&first[0], clock.now() + chrono::Duration::seconds(5)).unwrap();
    let second = claim(&queue, 10);
    assert_eq!(ids(&second), vec![a2], "a1 snoozed: its slot goes to a2");
    clock.advance(secs(6));
    assert!(claim(&queue, 10).is_empty(), "a1 due again, a2 holds");
    assert_eq!(state(&queue, a1), JobState::Blocked);
    let job = queue.get(a1).unwrap();
    assert_eq!(job.attempts, 0, "neither the snooze nor the push back used an attempt");
    queue.manual().complete(&second[0]).unwrap();
    assert_eq!(ids(&claim(&queue, 10)), vec![a1]);
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
}
}

contract! {
/// L16. rocketjob PR #50 (reidmorrison/rocketjob, "Capture throttle
/// reason": the reason is cleared "so a job now allowed to run no longer
/// reports as throttled") and Hangfire #2317 ("Jobs stuck in scheduled
/// after failing to acquire semaphore", the dashboard still showing the
/// semaphore as the reason): once the rate is deleted, its formerly
/// deferred jobs are due now and limited by nothing; neither `explain` nor
/// `limit_usage` (the tickler_limit_jobs{state="deferred"} gauge) should
/// still call them deferred by the deleted rate.
fn jobs_of_a_deleted_rate_are_not_explained_or_counted_as_deferred() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(3_600))).unwrap();
    let jobs: Vec<JobId> = (0..3).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    assert_eq!(run_due(&queue), vec![jobs[0]]);
    assert!(matches!(queue.explain(jobs[2]).unwrap().reason, tickler::Reason::Deferred { .. }));
    assert!(queue.delete_limit("api").unwrap());
    let why = queue.explain(jobs[2]).unwrap();
    let deferred: u64 = queue.limit_usage(Some("api")).unwrap().iter().map(|u| u.deferred).sum();
    assert!(
        !matches!(why.reason, tickler::Reason::Deferred { .. }) && deferred == 0,
        "limit api deleted: job 2 ({:?}, due {}) explained as {:?}; limit_usage counts {deferred} \
         deferred",
        queue.get(jobs[2]).unwrap().state,
        queue.get(jobs[2]).unwrap().run_at,
        why.to_string()
    );
}
}

/// Failures of the limit events and of dead-on-claim jobs with a pool.
mod with_a_pool {
    use crate::support::pool;
    use pool::{open_queue, secs, temp_db, wait_until};
    use std::collections::HashMap;
    use std::time::Instant;
    use tickler::{
        Event, JobContext, JobEventKind, JobId, JobState, Limit, NewJob, WorkerPool,
        DEFAULT_EVENT_BUFFER,
    };

    contract! {
    /// L14. BullMQ #2517 and #2139 (missed completed events under
    /// concurrency), storviaio/vantage PR #28 ("prevent rate-limited jobs
    /// from being counted multiple times"): under a burst of limited jobs
    /// on a pool, each job's limit events pair up — every Unblocked follows
    /// a Blocked of the same job, every Blocked is answered by an Unblocked
    /// before the job starts — and nothing is left to the safety sweep.
    fn a_pools_limit_events_pair_up_under_a_burst() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        queue.set_limit("sync", Limit::per_key(1).total(2)).unwrap();
        let sub = queue.subscribe(DEFAULT_EVENT_BUFFER);
        let mut pool = WorkerPool::builder(&queue)
            .threads(4)
            .handler("sync", |_: &JobContext| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                Ok(())
            })
            .start()
            .unwrap();
        let n = 90;
        let ids = queue
            .enqueue_batch(
                (0..n)
                    .map(|i| NewJob::new("sync").limit("sync", ["a", "b", "c"][i % 3]))
                    .collect(),
            )
            .unwrap();
        wait_until("every job succeeded", secs(60), || {
            queue.count(JobState::Succeeded).unwrap() == n as u64
        });
        pool.shutdown(secs(5));
        let deadline = Instant::now() + secs(1);
        let mut per_job: HashMap<JobId, Vec<JobEventKind>> = HashMap::new();
        while let Some(Event::Job(e)) = sub.recv_timeout(
            deadline.checked_duration_since(Instant::now()).unwrap_or_default(),
        ) {
            per_job.entry(e.job_id).or_default().push(e.what);
        }
        assert_eq!(sub.dropped(), 0);
        let mut odd = Vec::new();
        for id in &ids {
            let seen = &per_job[id];
            let mut waiting = false;
            let mut ok = true;
            for what in seen {
                match what {
                    JobEventKind::Blocked { .. } => {
                        ok &= !waiting;
                        waiting = true;
                    }
                    JobEventKind::Unblocked { .. } => {
                        ok &= waiting;
                        waiting = false;
                    }
                    JobEventKind::Started { .. } => ok &= !waiting,
                    _ => {}
                }
            }
            let finals = seen.iter().filter(|k| **k == JobEventKind::Succeeded).count();
            if !ok || waiting || finals != 1 {
                odd.push((*id, seen.clone()));
            }
        }
        let swept = queue.ops().limit_sweep_unblocked();
        assert!(
            odd.is_empty() && swept == 0,
            "{} of {n} jobs' limit events do not pair up (sweep released {swept}), e.g. {:#?}",
            odd.len(),
            &odd[..odd.len().min(3)]
        );
    }
    }

    contract! {
    /// L15. sidekiq-throttled #25 (ixti/sidekiq-throttled, "disappearing
    /// jobs": enqueued, never run, no trace) and BullMQ #2517 (a monitor
    /// waiting for a final event waits for ever): a job heavier than its
    /// limit can ever hold is made dead by the pool's claim; a subscriber
    /// must see it end (Dead), as it sees every other final transition.
    fn a_job_too_heavy_for_its_limit_is_reported_dead() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        queue.set_limit("sync", Limit::per_key(1)).unwrap();
        let sub = queue.subscribe(DEFAULT_EVENT_BUFFER);
        let mut pool = WorkerPool::builder(&queue)
            .threads(2)
            .handler("sync", |_: &JobContext| Ok(()))
            .start()
            .unwrap();
        let heavy = queue
            .enqueue(NewJob::new("sync").limit("sync", "a").limit_weight(2))
            .unwrap();
        wait_until("the heavy job is dead", secs(20), || {
            queue.get(heavy).unwrap().state == JobState::Dead
        });
        let deadline = Instant::now() + secs(1);
        let mut seen = Vec::new();
        while let Some(e) = sub.recv_timeout(
            deadline.checked_duration_since(Instant::now()).unwrap_or_default(),
        ) {
            if let Event::Job(e) = e {
                if e.job_id == heavy {
                    seen.push(e.what);
                }
            }
        }
        pool.shutdown(secs(5));
        assert!(
            seen.iter().any(|k| matches!(k, JobEventKind::Dead { .. })),
            "made dead by the pool's claim ({:?}); its events: {seen:?}",
            queue.get(heavy).unwrap().last_error
        );
    }
    }
}
