//! Job events (`Queue::subscribe`, `WorkerPool::subscribe`): one event per
//! transition this process causes or observes, in a bounded buffer that
//! drops (and counts) what a slow reader leaves. Runs on either engine.

use crate::support::pool;
use std::cell::Cell;

use pool::{ms, open_queue, open_queue_slow_retry, secs, temp_db, wait_until, Recorder};
use serde_json::json;
use std::time::Duration;
use tickler::{
    Event, JobContext, JobEvent, JobEventKind, JobId, JobState, NewJob, NewSchedule, OverlapPolicy,
    Queue, Subscription, WorkerPool, DEFAULT_EVENT_BUFFER,
};

/// The job events of `id` received within `within`, until `last` matches.
fn events_of(
    sub: &Subscription,
    id: JobId,
    within: Duration,
    last: impl Fn(&JobEventKind) -> bool,
) -> Vec<JobEvent> {
    let deadline = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match sub.recv_timeout(left) {
            Some(Event::Job(e)) if e.job_id == id => {
                let done = last(&e.what);
                seen.push(e);
                if done {
                    return seen;
                }
            }
            Some(_) => {}
            None => break,
        }
    }
    panic!("no final event for job {id} within {within:?}; saw {seen:#?}")
}

fn pool(queue: &Queue, rec: &std::sync::Arc<Recorder>) -> WorkerPool {
    WorkerPool::builder(queue)
        .threads(2)
        .handler("script", rec.script())
        .timeout_grace(ms(100))
        .start()
        .unwrap()
}

contract! {
fn a_run_is_started_then_succeeded_with_its_token_and_times() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let sub = queue.subscribe(64);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec);
    let id = queue
        .enqueue(NewJob::new("script").payload(json!({"sleep_ms": 50})))
        .unwrap();
    let events = events_of(&sub, id, secs(10), |w| *w == JobEventKind::Succeeded);
    let kinds: Vec<&JobEventKind> = events.iter().map(|e| &e.what).collect();
    assert_eq!(kinds.len(), 3, "{events:#?}");
    assert_eq!(*kinds[0], JobEventKind::Enqueued);
    let job = queue.get(id).unwrap();
    assert_eq!(
        *kinds[1],
        JobEventKind::Started {
            run_token: job.run_token.clone().unwrap()
        }
    );
    for e in &events {
        assert_eq!((e.kind.as_str(), e.queue.as_str()), ("script", "default"));
    }
    assert_eq!(events[1].attempt, Some(1));
    assert!(events[1].queue_time.is_some());
    let run_time = events[2].run_time.expect("run time on the outcome");
    assert!(run_time >= ms(50), "{run_time:?}");
    assert_eq!(sub.dropped(), 0);
    pool.shutdown(secs(5));
}
}

contract! {
fn failures_say_their_retry_delay_and_the_last_one_says_dead() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec);
    let sub = pool.subscribe(64);
    let retried = queue
        .enqueue(NewJob::new("script").payload(json!({"action": "error", "message": "boom"})))
        .unwrap();
    let events = events_of(&sub, retried, secs(10), |w| {
        matches!(w, JobEventKind::Failed { .. })
    });
    assert_eq!(
        events.last().unwrap().what,
        JobEventKind::Failed {
            error: "boom".into(),
            retry_in: secs(3600)
        }
    );
    assert_eq!(queue.get(retried).unwrap().state, JobState::Scheduled);

    let dead = queue
        .enqueue(
            NewJob::new("script")
                .max_attempts(1)
                .payload(json!({"action": "error", "message": "last"})),
        )
        .unwrap();
    let events = events_of(&sub, dead, secs(10), |w| {
        matches!(w, JobEventKind::Dead { .. })
    });
    assert_eq!(
        events.last().unwrap().what,
        JobEventKind::Dead {
            error: "last".into()
        }
    );
    let permanent = queue
        .enqueue(NewJob::new("script").payload(json!({"action": "permanent"})))
        .unwrap();
    events_of(&sub, permanent, secs(10), |w| {
        matches!(w, JobEventKind::Dead { .. })
    });
    pool.shutdown(secs(5));
}
}

contract! {
fn snoozes_cancels_retries_lost_leases_and_timeouts_are_reported() {
    let (_dir, path) = temp_db();
    let queue = open_queue_slow_retry(&path);
    let sub = queue.subscribe(256);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec);

    let snoozed = queue
        .enqueue(NewJob::new("script").payload(json!({"snooze_ms": 60_000})))
        .unwrap();
    let events = events_of(&sub, snoozed, secs(10), |w| {
        matches!(w, JobEventKind::Snoozed { .. })
    });
    assert!(matches!(
        events.last().unwrap().what,
        JobEventKind::Snoozed { .. }
    ));

    // Cancelled while running: the queue reports the cancel, the pool the
    // lost lease.
    let running = queue
        .enqueue(NewJob::new("script").payload(json!({"wait_cancel_ms": 10_000})))
        .unwrap();
    wait_until("the job runs", secs(10), || {
        queue.get(running).unwrap().state == JobState::Running
    });
    queue.cancel(running).unwrap();
    // The queue reports the cancel before the pool reports the lease it
    // lost to it, although the pool may learn of the cancel's commit
    // before `cancel` returns (as it did on PostgreSQL on a loaded
    // machine): the pool's event waits for the cancel's.
    let (cancelled, lost) = (Cell::new(false), Cell::new(false));
    let events = events_of(&sub, running, secs(10), |w| {
        cancelled.set(cancelled.get() || *w == JobEventKind::Cancelled);
        lost.set(lost.get() || *w == JobEventKind::LeaseLost);
        cancelled.get() && lost.get()
    });
    let at = |kind: JobEventKind| events.iter().position(|e| e.what == kind);
    assert!(
        at(JobEventKind::Cancelled) < at(JobEventKind::LeaseLost),
        "{events:#?}"
    );

    queue.retry(running).unwrap();
    events_of(&sub, running, secs(10), |w| *w == JobEventKind::Retried);

    // A handler that ignores its timeout.
    let stuck = queue
        .enqueue(
            NewJob::new("script")
                .max_attempts(1)
                .timeout(ms(50))
                .payload(json!({"sleep_ms": 1_500})),
        )
        .unwrap();
    let events = events_of(&sub, stuck, secs(10), |w| {
        matches!(w, JobEventKind::TimedOut { .. })
    });
    assert_eq!(
        events.last().unwrap().what,
        JobEventKind::TimedOut { dead: true }
    );
    pool.shutdown(secs(5));
}
}

contract! {
fn schedule_ticks_fired_and_skipped_are_reported() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let sub = queue.subscribe(64);
    queue
        .upsert_schedule(
            NewSchedule::new("every-second", "* * * * * *", "nobody-runs-this")
                .overlap(OverlapPolicy::Forbid),
        )
        .unwrap();
    let mut fired = None;
    let mut skipped = None;
    wait_until("a tick fired and a later one skipped", secs(10), || {
        queue.manual().run_due_ticks().unwrap();
        for event in sub.drain() {
            if let Event::Tick(t) = event {
                assert_eq!(t.schedule, "every-second");
                match t.job_id {
                    Some(id) => fired = fired.or(Some(id)),
                    None => skipped = skipped.or(Some(t.tick_at)),
                }
            }
        }
        std::thread::sleep(ms(200));
        fired.is_some() && skipped.is_some()
    });
    assert_eq!(queue.get(fired.unwrap()).unwrap().kind, "nobody-runs-this");
}
}

contract! {
fn a_reader_that_never_reads_loses_events_not_jobs() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let sub = queue.subscribe(4);
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec);
    let pool_sub = pool.subscribe(1);
    queue
        .enqueue_batch((0..200).map(|_| NewJob::new("script")).collect())
        .unwrap();
    wait_until("all jobs ran", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() == 200
    });
    pool.shutdown(secs(5));
    // 200 enqueued, 200 started, 200 succeeded: 600 for the queue's
    // reader, 400 for the pool's; all but what fits were dropped.
    assert_eq!(sub.drain().len(), 4);
    assert_eq!(sub.dropped(), 596);
    assert_eq!(pool_sub.drain().len(), 1);
    assert_eq!(pool_sub.dropped(), 399);
}
}

contract! {
fn events_are_this_queue_handles_only() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let sub = queue.subscribe(64);
    // Another handle on the same file stands in for another process.
    let other = open_queue(&path);
    let id = other.enqueue(NewJob::new("k")).unwrap();
    other.cancel(id).unwrap();
    assert_eq!(sub.recv_timeout(ms(200)), None);
    // A clone is the same handle.
    queue.clone().enqueue(NewJob::new("k")).unwrap();
    assert!(sub.recv_timeout(ms(200)).is_some());
}
}

contract! {
/// A job's events in the order they happened, as the docs promise,
/// under a busy pool: its `Enqueued` before its `Started`, `Started`
/// before its outcome. The enqueuer publishes `Enqueued` after its
/// commit returns, and a pool thread of the same process can claim and
/// start (even finish) the job in between: 25-34 jobs of 200 had
/// `Started` before `Enqueued` that way, 9 `Succeeded` before it.
fn each_jobs_events_arrive_in_order_under_a_busy_pool() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let sub = queue.subscribe(DEFAULT_EVENT_BUFFER);
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("k", |_: &JobContext| Ok(()))
        .start()
        .unwrap();
    let per_thread = 100;
    let enqueuers: Vec<_> = (0..3)
        .map(|_| {
            let queue = queue.clone();
            std::thread::spawn(move || {
                (0..per_thread)
                    .map(|_| queue.enqueue(NewJob::new("k")).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<JobId> = enqueuers
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    wait_until("every job succeeded", secs(60), || {
        queue.count(JobState::Succeeded).unwrap() == ids.len() as u64
    });
    pool.shutdown(secs(5));
    let mut per_job: std::collections::HashMap<JobId, Vec<JobEventKind>> = Default::default();
    while let Some(Event::Job(e)) = sub.recv_timeout(secs(1)) {
        per_job.entry(e.job_id).or_default().push(e.what);
    }
    assert_eq!(sub.dropped(), 0);
    let out_of_order: Vec<_> = ids
        .iter()
        .filter_map(|id| {
            let seen = per_job.get(id).cloned().unwrap_or_default();
            let in_order = matches!(
                seen.as_slice(),
                [JobEventKind::Enqueued, JobEventKind::Started { .. }, JobEventKind::Succeeded]
            );
            (!in_order).then_some((*id, seen))
        })
        .collect();
    assert!(
        out_of_order.is_empty(),
        "{} of {} jobs' events out of order, e.g. {:?}",
        out_of_order.len(),
        ids.len(),
        &out_of_order[..out_of_order.len().min(3)]
    );
}
}

contract! {
fn a_limited_run_is_reported_blocked_then_unblocked_and_one_over_its_rate_deferred() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    queue.set_limit("sync", tickler::Limit::per_key(1)).unwrap();
    queue
        .set_limit("api", tickler::Limit::rate(1, secs(3600)))
        .unwrap();
    let sub = queue.subscribe(256);
    let job = |limit: &str, sleep_ms: u64| {
        NewJob::new("script")
            .payload(json!({ "sleep_ms": sleep_ms }))
            .limit(limit, "k")
    };
    // Both of a key in one claim: the second does not fit.
    let ids = queue
        .enqueue_batch(vec![job("sync", 300), job("sync", 0)])
        .unwrap();
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec);
    let second = events_of(&sub, ids[1], secs(20), |w| *w == JobEventKind::Succeeded);
    let limit_of = |limit: &str| (limit.to_owned(), "k".to_owned());
    let seen: Vec<&JobEventKind> = second.iter().map(|e| &e.what).collect();
    assert!(
        matches!(
            seen.as_slice(),
            [
                JobEventKind::Enqueued,
                JobEventKind::Blocked { limit, key },
                JobEventKind::Unblocked { limit: l2, key: k2 },
                JobEventKind::Started { .. },
                JobEventKind::Succeeded,
            ] if (limit.clone(), key.clone()) == limit_of("sync") && (l2.clone(), k2.clone()) == limit_of("sync")
        ),
        "{seen:#?}"
    );
    assert_eq!(second[1].attempt, Some(1), "the run pushed back");
    assert_eq!((second[1].kind.as_str(), second[1].queue.as_str()), ("script", "default"));
    assert_eq!((second[2].kind.as_str(), second[2].queue.as_str()), ("script", "default"));
    // Over a rate of one an hour, the second waits an hour in its place.
    let rated = queue
        .enqueue_batch(vec![job("api", 0), job("api", 0)])
        .unwrap();
    let deferred = events_of(&sub, rated[1], secs(20), |w| {
        matches!(w, JobEventKind::Deferred { .. })
    });
    let stored = queue.get(rated[1]).unwrap();
    assert_eq!(stored.state, JobState::Scheduled);
    match &deferred.last().unwrap().what {
        JobEventKind::Deferred { limit, key, until } => {
            assert_eq!((limit.clone(), key.clone()), limit_of("api"));
            assert_eq!(*until, stored.run_at, "the instant it may start, as stored");
        }
        other => panic!("{other:?}"),
    }
    pool.shutdown(secs(5));
    assert_eq!(sub.dropped(), 0);
}
}

/// Failures reported against other job queues' dashboards, metrics
/// endpoints, job events and queue pauses, tried on tickler: they pass and
/// stay as regression tests, each naming the report it follows.
mod other_queues_reports {
    use crate::support::pool;
    use pool::{open_queue, secs, temp_db, wait_until};
    use std::time::Instant;
    use tickler::{
        Event, JobContext, JobError, JobEventKind, JobId, JobState, NewJob, Queue, WorkerPool,
        DEFAULT_EVENT_BUFFER,
    };

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// sentry-elixir #805, error-tracker #63 and firezone #13764 (a telemetry
    /// handler that raised was detached: every later event was lost, silently)
    /// and graphile-worker #155 (a throwing event handler could leave the
    /// queue in an unexpected state): a reader that panics, one that never
    /// reads and one that is dropped neither slow nor stop the pool, and a
    /// reader that keeps reading gets every event.
    fn a_panicking_stalled_or_dropped_reader_harms_neither_pool_nor_other_readers() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let mut pool = WorkerPool::builder(&queue)
            .threads(4)
            .handler("k", |_: &JobContext| Ok(()))
            .start()
            .unwrap();
        let good = pool.subscribe(DEFAULT_EVENT_BUFFER);
        let stalled = pool.subscribe(1);
        drop(queue.subscribe(8));
        let panicking = queue.subscribe(DEFAULT_EVENT_BUFFER);
        let reader = std::thread::spawn(move || {
            let _first = panicking.recv_timeout(secs(30));
            panic!("a reader's own bug");
        });
        let n = 500;
        queue
            .enqueue_batch((0..n).map(|_| NewJob::new("k")).collect())
            .unwrap();
        assert!(reader.join().is_err());
        wait_until("every job ran", secs(30), || {
            queue.count(JobState::Succeeded).unwrap() == n as u64
        });
        pool.shutdown(secs(5));
        let succeeded = good
            .drain()
            .into_iter()
            .filter(|e| matches!(e, Event::Job(j) if j.what == JobEventKind::Succeeded))
            .count();
        assert_eq!(succeeded, n);
        assert_eq!(good.dropped(), 0);
        assert_eq!(stalled.dropped(), 2 * n as u64 - 1);
    }
    }

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// BullMQ #2517 and #2139 (QueueEvents missed some completed events under
    /// concurrency, so a monitor counting them waited forever): with room in
    /// its buffer a reader gets, per job, exactly one enqueued, one started
    /// per attempt and one final event, none lost or doubled, across threads,
    /// retries and dead jobs.
    fn every_job_has_exactly_one_final_event() {
        let (_dir, path) = temp_db();
        let queue = Queue::builder(pool::engine::target(&path))
            .retry_policy(pool::no_backoff())
            .open()
            .unwrap();
        let sub = queue.subscribe(DEFAULT_EVENT_BUFFER);
        let mut pool = WorkerPool::builder(&queue)
            .threads(4)
            .handler("k", |ctx: &JobContext| {
                let n = ctx.job_id().0;
                match (n % 3, ctx.attempt()) {
                    // Fails once, then succeeds.
                    (1, 1) => Err(JobError::Retry("once".into())),
                    // Never succeeds: dead after its 2 attempts.
                    (2, _) => Err(JobError::Retry("always".into())),
                    _ => Ok(()),
                }
            })
            .start()
            .unwrap();
        let n = 600;
        let ids = queue
            .enqueue_batch((0..n).map(|_| NewJob::new("k").max_attempts(2)).collect())
            .unwrap();
        wait_until("every job finished", secs(60), || {
            queue.count(JobState::Succeeded).unwrap() + queue.count(JobState::Dead).unwrap() == n as u64
        });
        pool.shutdown(secs(5));
        let deadline = Instant::now() + secs(2);
        let mut per_job: std::collections::HashMap<JobId, Vec<JobEventKind>> = Default::default();
        while let Some(Event::Job(e)) = sub.recv_timeout(
            deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_default(),
        ) {
            per_job.entry(e.job_id).or_default().push(e.what);
        }
        assert_eq!(sub.dropped(), 0);
        for id in ids {
            let seen = &per_job[&id];
            let count = |f: fn(&JobEventKind) -> bool| seen.iter().filter(|k| f(k)).count();
            let attempts = if id.0 % 3 == 0 { 1 } else { 2 };
            assert_eq!(count(|k| *k == JobEventKind::Enqueued), 1, "{id}: {seen:?}");
            assert_eq!(
                count(|k| matches!(k, JobEventKind::Started { .. })),
                attempts,
                "{id}: {seen:?}"
            );
            assert_eq!(
                count(|k| matches!(k, JobEventKind::Failed { .. })),
                attempts - 1,
                "{id}: {seen:?}"
            );
            let finals = count(|k| matches!(k, JobEventKind::Succeeded | JobEventKind::Dead { .. }));
            assert_eq!(finals, 1, "{id}: {seen:?}");
            let last = seen.last().unwrap();
            match id.0 % 3 {
                2 => assert!(matches!(last, JobEventKind::Dead { .. }), "{id}: {seen:?}"),
                _ => assert_eq!(*last, JobEventKind::Succeeded, "{id}: {seen:?}"),
            }
        }
    }
    }
}

contract! {
/// A pool's outcome that releases a job running after it reports
/// `Released` for that job, and the pool then runs it; a parent's failure
/// that cancels one reports `Cancelled`.
fn an_outcome_that_releases_a_child_reports_it() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let sub = queue.subscribe(DEFAULT_EVENT_BUFFER);
    let parent = queue.enqueue(NewJob::new("script").payload(json!({}))).unwrap();
    let child = queue
        .enqueue(NewJob::new("script").payload(json!({})).after(&[parent]))
        .unwrap();
    let doomed = queue
        .enqueue(NewJob::new("script").payload(json!({"action": "permanent"})).max_attempts(1))
        .unwrap();
    let orphan = queue
        .enqueue(NewJob::new("script").payload(json!({})).after(&[doomed]))
        .unwrap();
    let rec = Recorder::new();
    let mut pool = pool(&queue, &rec);
    // Both jobs' events, in the order they came, until each has ended.
    let (mut of_child, mut of_orphan) = (Vec::new(), Vec::new());
    let deadline = std::time::Instant::now() + secs(10);
    while !(of_child.contains(&JobEventKind::Succeeded)
        && of_orphan.contains(&JobEventKind::Cancelled))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match sub.recv_timeout(left) {
            Some(Event::Job(e)) if e.job_id == child => of_child.push(e.what),
            Some(Event::Job(e)) if e.job_id == orphan => of_orphan.push(e.what),
            Some(_) => {}
            None => panic!("child {of_child:?}, orphan {of_orphan:?}"),
        }
    }
    let after_enqueue = |seen: &[JobEventKind]| -> Vec<JobEventKind> {
        seen.iter()
            .filter(|k| !matches!(k, JobEventKind::Enqueued))
            .cloned()
            .collect()
    };
    assert!(
        matches!(
            after_enqueue(&of_child).as_slice(),
            [JobEventKind::Released, JobEventKind::Started { .. }, JobEventKind::Succeeded]
        ),
        "{of_child:?}"
    );
    assert_eq!(after_enqueue(&of_orphan), vec![JobEventKind::Cancelled]);
    pool.shutdown(secs(5));
    assert_eq!(queue.get(orphan).unwrap().state, JobState::Cancelled);
}
}
