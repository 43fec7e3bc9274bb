//! Rate-limit failures reported against other job queues (BullMQ and Bull,
//! Oban Pro, Sidekiq Enterprise and sidekiq-throttled, Hangfire
//! throttling, GoodJob, Celery, River, spring-cloud-gateway's limiter),
//! each tried on tickler's rates (`Limit::rate`). Time is a manual clock,
//! so each instant is exact. Each test names its source; each failed on
//! the first build of rate limits except R4, R5, R6 and R13.

use crate::support::common;
use crate::support::limits::*;

use chrono::{DateTime, TimeZone, Utc};
use common::{fixed_policy, manual_queue_with_policy, ms, secs, temp_db};
use std::time::Duration;
use tickler::{Clock, JobId, JobState, Limit, ManualClock, Queue};

/// Runs every due job each `step` until `until`; returns (job, instant in
/// ms since `t0`) of each start.
fn run_until(
    queue: &Queue,
    clock: &ManualClock,
    step: Duration,
    until: DateTime<Utc>,
) -> Vec<(JobId, i64)> {
    let t0 = clock.now();
    let mut starts = Vec::new();
    loop {
        let now = clock.now();
        for id in run_due(queue) {
            starts.push((id, (now - t0).num_milliseconds()));
        }
        if now >= until {
            return starts;
        }
        clock.advance(step);
    }
}

fn run_at_ms(queue: &Queue, id: JobId, t0: DateTime<Utc>) -> i64 {
    (queue.get(id).unwrap().run_at - t0).num_milliseconds()
}

contract! {
/// R1. BullMQ #2713 (taskforcesh/bullmq, "Change rate limiting not working
/// immediately"): after the rate of a key with deferred jobs is raised,
/// the next job still waits a whole interval of the old rate.
fn raising_a_rate_lets_the_deferred_jobs_start_at_the_new_rate() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(600))).unwrap();
    let jobs: Vec<JobId> = (0..10).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    let t0 = clock.now();
    assert_eq!(run_due(&queue), vec![jobs[0]]);
    // One start per 10 minutes becomes one per 2 minutes.
    queue.set_limit("api", Limit::rate(1, secs(120))).unwrap();
    clock.advance(secs(120));
    let started = run_due(&queue);
    let fresh = queue.enqueue(api("a")).unwrap();
    run_due(&queue);
    assert!(
        !started.is_empty(),
        "2 min after the last start, at 1 per 2 min, nothing started: job 1 still waits until \
         +{} s, and a job enqueued now is deferred to +{} s (the old rate's line)",
        run_at_ms(&queue, jobs[1], t0) / 1_000,
        run_at_ms(&queue, fresh, t0) / 1_000
    );
}
}

contract! {
/// R2. Hangfire #1971 (HangfireIO/Hangfire, "Throttling Breaks when
/// Deleting Processing Jobs": deleted jobs keep their semaphore entries and
/// new jobs go straight to scheduled): cancelled deferred jobs keep their
/// instants in the key's line, and a new job waits behind jobs that no
/// longer exist.
fn cancelling_deferred_jobs_gives_their_instants_back() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(60))).unwrap();
    let jobs: Vec<JobId> = (0..60).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    let t0 = clock.now();
    assert_eq!(run_due(&queue), vec![jobs[0]]);
    for id in &jobs[1..] {
        queue.cancel(*id).unwrap();
    }
    clock.advance(secs(60));
    let fresh = queue.enqueue(api("a")).unwrap();
    let started = run_due(&queue);
    assert_eq!(
        started,
        vec![fresh],
        "a job of a key with nothing waiting, 1 min after its last start at 1 a minute, \
         deferred to +{} min (behind 59 cancelled jobs)",
        run_at_ms(&queue, fresh, t0) / 60_000
    );
}
}

contract! {
/// R3. BullMQ #2713 again, and Bull #1110/#2235 (OptimalBits/bull, jobs
/// left delayed long after the limiter should let them go): a rate that is
/// removed (set_limit without a rate, or delete_limit) leaves its deferred
/// jobs waiting the old instants, and with set_limit the key's line stays
/// stored, so a rate set again later defers new jobs behind it.
fn removing_a_rate_frees_its_deferred_jobs_and_forgets_its_line() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::per_key(5).with_rate(1, secs(3_600))).unwrap();
    let jobs: Vec<JobId> = (0..10).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    let t0 = clock.now();
    assert_eq!(run_due(&queue), vec![jobs[0]]);
    // The operator drops the rate, keeping the concurrency limit.
    queue.set_limit("api", Limit::per_key(5)).unwrap();
    clock.advance(secs(1));
    let freed = run_due(&queue);
    let waiting: Vec<i64> = jobs[1..].iter().map(|id| run_at_ms(&queue, *id, t0) / 60_000).collect();
    // Cancel what is left, and later set a high rate again.
    for id in &jobs[1..] {
        let _ = queue.cancel(*id);
    }
    clock.advance(secs(60));
    queue.set_limit("api", Limit::per_key(5).with_rate(10, secs(1))).unwrap();
    let fresh = queue.enqueue(api("a")).unwrap();
    let later = run_due(&queue);
    let mut wrong = Vec::new();
    // Five at once (its concurrency limit); none left waiting an instant.
    if freed.len() != 5 || waiting.iter().any(|m| *m > 0) {
        wrong.push(format!(
            "the rate was removed, yet {} of its 9 deferred jobs started; they wait until \
             +{waiting:?} min",
            freed.len()
        ));
    }
    if later != vec![fresh] {
        wrong.push(format!(
            "rate 10/s set again on a key with nothing waiting: its job deferred to +{} min \
             (the stale line of the removed rate)",
            run_at_ms(&queue, fresh, t0) / 60_000
        ));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
}

contract! {
/// R4. Bull #2235 (OptimalBits/bull, "Issues with delayed queue jobs
/// processing"): after a spike over the rate, incoming jobs at a fraction
/// of the rate kept being delayed behind the delayed set, in a cycle.
fn after_a_spike_drains_jobs_below_the_rate_start_at_once() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    // 150 a minute; a spike of 300 at once, then 20 a minute.
    queue.set_limit("api", Limit::rate(150, secs(60))).unwrap();
    queue.enqueue_batch((0..300).map(|_| api("a")).collect()).unwrap();
    let t0 = clock.now();
    let spike = run_until(&queue, &clock, ms(100), t0 + chrono::Duration::seconds(121));
    assert_eq!(spike.len(), 300, "the spike drains in 2 min at the rate");
    let mut late = Vec::new();
    for _ in 0..20 {
        let id = queue.enqueue(api("a")).unwrap();
        let at = clock.now();
        let started = run_due(&queue);
        if started != vec![id] {
            late.push(((at - t0).num_seconds(), run_at_ms(&queue, id, t0) - (at - t0).num_milliseconds()));
            run_until(&queue, &clock, ms(100), at + chrono::Duration::seconds(3));
        } else {
            clock.advance(secs(3));
        }
    }
    assert!(late.is_empty(), "jobs at 20 a minute deferred (enqueued at s, by ms): {late:?}");
}
}

contract! {
/// R5. Oban #750 (oban-bg/oban, "Rate limiter may not fetch jobs"): with
/// 1 a minute, a job run at 23:59:30 kept the next day's 00:01:00 job from
/// running (a window computed across midnight); the same across a change
/// of daylight saving time (Europe, 2026-10-25 01:00 UTC).
fn a_rate_of_one_a_minute_lets_the_next_run_start_after_midnight() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(60))).unwrap();
    for (first, second) in [
        (Utc.with_ymd_and_hms(2026, 8, 1, 23, 59, 30).unwrap(), Utc.with_ymd_and_hms(2026, 8, 2, 0, 1, 0).unwrap()),
        (Utc.with_ymd_and_hms(2026, 10, 25, 0, 59, 30).unwrap(), Utc.with_ymd_and_hms(2026, 10, 25, 1, 0, 31).unwrap()),
    ] {
        clock.set(first);
        let one = queue.enqueue(api("a")).unwrap();
        assert_eq!(run_due(&queue), vec![one]);
        clock.set(second);
        let two = queue.enqueue(api("a")).unwrap();
        assert_eq!(run_due(&queue), vec![two], "the run at {second} after one at {first}");
    }
}
}

contract! {
/// R6. Sidekiq #6010 (sidekiq/sidekiq, job["overrated"] not reset: over-
/// limit reschedules eat into the error retries), Hangfire #2296
/// (throttling semaphores cause a wrong retry count), GoodJob #1353
/// (bensheldon/good_job: a throttled job rescheduled about 3 hours later
/// by the retry backoff): deferrals use no attempt and no backoff, and a
/// retry of a failed run is deferred like any start.
fn deferrals_use_no_attempt_and_no_backoff_and_retries_still_end() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(10))).unwrap();
    let mut jobs: Vec<JobId> = (0..4).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    let once = queue.enqueue(api("a").max_attempts(1)).unwrap();
    let failing = queue.enqueue(api("a").max_attempts(2)).unwrap();
    jobs.push(once);
    let t0 = clock.now();
    let mut starts: Vec<(JobId, i64)> = Vec::new();
    while clock.now() < t0 + chrono::Duration::seconds(120) {
        for lease in claim(&queue, 100) {
            starts.push((lease.job_id, (clock.now() - t0).num_seconds()));
            if lease.job_id == failing {
                queue.manual().fail(&lease, "429 from the remote side").unwrap();
            } else {
                queue.manual().complete(&lease).unwrap();
            }
        }
        clock.advance(secs(1));
    }
    let job = queue.get(once).unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Succeeded, 1), "a max_attempts(1) job deferred {} times", job.rate_deferrals);
    let job = queue.get(failing).unwrap();
    let at: Vec<i64> = starts.iter().filter(|s| s.0 == failing).map(|s| s.1).collect();
    assert_eq!((job.state, job.attempts, job.errors.len()), (JobState::Dead, 2, 2), "starts at {at:?}");
    // First start at its turn (50 s); its retry (backoff 1 s) at the next
    // instant of the key (60 s), not later.
    assert_eq!(at, vec![50, 60], "{} deferrals", job.rate_deferrals);
}
}

contract! {
/// R7. BullMQ #2193 (taskforcesh/bullmq, "RateLimitError() not working":
/// delayed jobs still moved to active while the queue was rate limited by
/// a handler) and BullMQ #1915 ("Wrong job is picked after rate limit"):
/// a handler's rate_limited holds back the key's deferred jobs, and after
/// the wait the key's jobs start in their order, the held one first.
fn a_handler_told_to_wait_holds_deferred_jobs_and_keeps_their_order() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(10, secs(1))).unwrap();
    let jobs: Vec<JobId> = (0..5).map(|_| queue.enqueue(api("a")).unwrap()).collect();
    let t0 = clock.now();
    assert_eq!(run_due(&queue), vec![jobs[0]]);
    clock.advance(ms(100));
    let handler = |ctx: &tickler::JobContext| -> Result<(), tickler::JobError> {
        Err(ctx.rate_limited(Duration::from_secs(30)))
    };
    let told = tickler::testing::run_one(&queue, "default", "api", &handler).unwrap().unwrap();
    assert_eq!(told.0, jobs[1]);
    // Until the wait ends (100 ms + 30 s), nothing of the key starts.
    let during = run_until(&queue, &clock, ms(100), t0 + chrono::Duration::milliseconds(30_000));
    assert!(during.is_empty(), "started while held back: {during:?}");
    let after = run_until(&queue, &clock, ms(100), t0 + chrono::Duration::seconds(32));
    let order: Vec<JobId> = after.iter().map(|s| s.0).collect();
    let names = |ids: &[JobId]| -> Vec<usize> {
        ids.iter().map(|id| jobs.iter().position(|j| j == id).unwrap()).collect()
    };
    assert_eq!(
        names(&order),
        vec![1, 2, 3, 4],
        "order after the wait (job index, start ms): {:?}; job 1 deferred {} times",
        after.iter().map(|s| (names(&[s.0])[0], s.1)).collect::<Vec<_>>(),
        queue.get(jobs[1]).unwrap().rate_deferrals
    );
}
}

contract! {
/// R10. spring-cloud-gateway PR #1688 (a request stamped by a machine whose
/// clock is slower reset the limiter: 8 requests admitted where the burst
/// is 4) and sidekiq-throttled #38 ("make sure all instances' clocks are in
/// sync"): two processes whose clocks differ by 2 s (on a server engine,
/// each process's sample of the server's clock, e.g. after a step of the
/// server's clock, before the next resample 30 s on) claim one key in
/// turn. Each claim of the one behind reads the key as seen "in the
/// future", takes it for a step back and moves the key back by 2 s.
fn two_processes_whose_clocks_differ_keep_one_rate() {
    let (_dir, path) = temp_db();
    let (a, ahead) = manual_queue_with_policy(&path, fixed_policy());
    let behind = std::sync::Arc::new(ManualClock::new(ahead.now() - chrono::Duration::seconds(2)));
    let b = Queue::builder(crate::support::engine::target(&path))
        .clock(behind.clone())
        .open()
        .unwrap();
    a.set_limit("api", Limit::rate(1, secs(10))).unwrap();
    let t0 = behind.now();
    // Starts in the true time (the clock that is behind).
    let mut starts: Vec<i64> = Vec::new();
    for _ in 0..300 {
        for queue in [&b, &a] {
            queue.enqueue(api("a")).unwrap();
            let n = run_due(queue).len();
            starts.extend(std::iter::repeat_n((behind.now() - t0).num_milliseconds(), n));
        }
        ahead.advance(ms(100));
        behind.advance(ms(100));
    }
    // The clocks disagree by 2 s, so two starts may be 8 s apart in one of
    // them; what must not happen is a key moved back at each claim.
    let most = most_in_a_span(&starts, 10_000);
    assert!(
        most <= 2 && starts.len() <= 4,
        "1 per 10 s: {most} starts in 10 s, {} in 30 s (at ms {:?})",
        starts.len(),
        &starts[..starts.len().min(12)]
    );
}
}

contract! {
/// R12. Sidekiq #3323 ("[Ent] Concurrent limiter does not expire
/// lmtr-cfree-* key") and aspnetcore-redis-rate-limiting #197 ("Missing
/// expiration": an ever-growing number of limiter keys): a key's stored
/// rate state outlives its jobs, so a limit keyed per user keeps one row
/// per user ever seen.
fn a_keys_rate_state_goes_when_its_jobs_are_gone() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(10, secs(1))).unwrap();
    queue.enqueue_batch((0..500).map(|i| api(&format!("user-{i}"))).collect()).unwrap();
    assert_eq!(run_due(&queue).len(), 100);
    while !run_due(&queue).is_empty() {}
    clock.advance(secs(7 * 86_400));
    queue.prune(clock.now()).unwrap();
    // The reaper forgets 64 keys a pass.
    for _ in 0..8 {
        queue.manual().reap_at(clock.now()).unwrap();
    }
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), 0);
    let rows = crate::support::engine::query_int(&path, "SELECT count(*) FROM tickler_limit_rates", &[]);
    assert_eq!(rows, 0, "a week after the last of 500 keys' jobs ran and were pruned, {rows} rate rows remain");
}
}

contract! {
/// R13. sidekiq-throttled #66 (a throttled job also under
/// sidekiq-unique-jobs: locks lost, jobs stopped): a unique job deferred
/// over the rate keeps its unique key while it waits and runs once.
fn a_deferred_unique_job_keeps_its_key_and_runs_once() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.set_limit("api", Limit::rate(1, secs(10))).unwrap();
    let first = queue.enqueue(api("a")).unwrap();
    let unique = queue.enqueue(api("a").unique_key("sync-42")).unwrap();
    assert_eq!(run_due(&queue), vec![first]);
    assert_eq!(state(&queue, unique), JobState::Scheduled);
    assert_eq!(queue.enqueue(api("a").unique_key("sync-42")).unwrap(), unique, "deduplicated while deferred");
    clock.advance(secs(10));
    assert_eq!(run_due(&queue), vec![unique]);
    clock.advance(secs(10));
    assert!(run_due(&queue).is_empty());
    assert_eq!(queue.get(unique).unwrap().attempts, 1);
}
}
