//! Operator actions and claim selection: cancel, retry, prune, stats and
//! list do what they say and refuse what they should; a claim takes due jobs
//! of its queue (and kinds) by priority, then due time, then id, and never a
//! job before its run_at.

use crate::support::common;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use common::{ms, secs, t0};
use std::collections::BTreeMap;
use tickler::{Clock, Error, JobFilter, JobId, JobState, Lease, NewJob, Outcome, Queue};

fn claim_one(queue: &Queue) -> Lease {
    let mut leases = queue.manual().claim("default", "w", 1, secs(60)).unwrap();
    assert_eq!(leases.len(), 1, "expected one job to claim");
    leases.remove(0)
}

fn ago(s: i64) -> DateTime<Utc> {
    t0() - ChronoDuration::seconds(s)
}

/// Jobs in each terminal state, finished at the clock's current time. They
/// live in their own queue so their claims take no other test job.
fn finished_jobs(queue: &Queue) -> (JobId, JobId, JobId) {
    let finish = |kind: &str| -> JobId {
        let id = queue.enqueue(NewJob::new(kind).queue("finished")).unwrap();
        if kind == "c" {
            queue.cancel(id).unwrap();
            return id;
        }
        let lease = queue
            .manual()
            .claim("finished", "w", 1, secs(60))
            .unwrap()
            .remove(0);
        assert_eq!(lease.job_id, id);
        match kind {
            "s" => queue.manual().complete(&lease).unwrap(),
            _ => queue.manual().fail_permanently(&lease, "gave up").unwrap(),
        }
        id
    };
    (finish("s"), finish("d"), finish("c"))
}

contract! {
fn cancel_unfinished_jobs_only() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let pending = queue.enqueue(NewJob::new("k")).unwrap();
    let scheduled = queue.enqueue(NewJob::new("k").delay(secs(30))).unwrap();

    clock.advance(secs(1));
    queue.cancel(pending).unwrap();
    queue.cancel(scheduled).unwrap();
    for id in [pending, scheduled] {
        let job = queue.get(id).unwrap();
        assert_eq!(job.state, JobState::Cancelled);
        assert_eq!(job.finished_at, Some(clock.now()));
    }
    clock.advance(secs(60));
    assert!(
        queue
            .manual().claim("default", "w", 10, secs(60))
            .unwrap()
            .is_empty(),
        "a cancelled job was claimed"
    );

    let (succeeded, dead, cancelled) = finished_jobs(&queue);
    for (id, state) in [
        (succeeded, JobState::Succeeded),
        (dead, JobState::Dead),
        (cancelled, JobState::Cancelled),
    ] {
        let before = queue.get(id).unwrap();
        match queue.cancel(id) {
            Err(Error::InvalidState {
                job_id,
                state: found,
                action,
            }) => {
                assert_eq!((job_id, found, action), (id, state, "cancel"));
            }
            other => panic!("cancel of a {state} job: {other:?}"),
        }
        assert_eq!(
            queue.get(id).unwrap(),
            before,
            "refused cancel changed the job"
        );
    }
    assert!(matches!(
        queue.cancel(JobId(999_999)),
        Err(Error::NotFound(JobId(999_999)))
    ));
}
}

contract! {
fn retry_revives_dead_and_cancelled_jobs_only() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(2)).unwrap();
    for _ in 0..2 {
        let lease = claim_one(&queue);
        queue.manual().fail(&lease, "broken").unwrap();
        clock.advance(secs(5));
    }
    let dead = queue.get(id).unwrap();
    assert_eq!((dead.state, dead.attempts), (JobState::Dead, 2));

    clock.advance(secs(100));
    queue.retry(id).unwrap();
    let revived = queue.get(id).unwrap();
    assert_eq!(revived.state, JobState::Pending);
    assert_eq!(revived.attempts, 0);
    assert_eq!(revived.run_at, clock.now());
    assert_eq!(revived.finished_at, None);
    assert_eq!(
        revived.last_error.as_deref(),
        Some("broken"),
        "last_error kept"
    );
    // Fresh attempts: it can fail once more without dying.
    let lease = claim_one(&queue);
    assert_eq!(lease.attempt, 1);
    queue.manual().fail(&lease, "broken again").unwrap();
    assert_eq!(queue.get(id).unwrap().state, JobState::Scheduled);

    // A cancelled job can be retried too.
    let cancelled = queue.enqueue(NewJob::new("k").delay(secs(3600))).unwrap();
    queue.cancel(cancelled).unwrap();
    queue.retry(cancelled).unwrap();
    assert_eq!(queue.get(cancelled).unwrap().state, JobState::Pending);

    // Not a succeeded, pending, scheduled or running job.
    let (succeeded, _, _) = finished_jobs(&queue);
    let scheduled = id; // waiting for its backoff
    let pending = queue.enqueue(NewJob::new("p")).unwrap();
    let running = queue.enqueue(NewJob::new("r").priority(100)).unwrap();
    assert_eq!(claim_one(&queue).job_id, running);
    for (job, state) in [
        (succeeded, JobState::Succeeded),
        (scheduled, JobState::Scheduled),
        (pending, JobState::Pending),
        (running, JobState::Running),
    ] {
        let before = queue.get(job).unwrap();
        assert_eq!(before.state, state);
        match queue.retry(job) {
            Err(Error::InvalidState {
                job_id,
                state: found,
                action,
            }) => assert_eq!((job_id, found, action), (job, state, "retry")),
            other => panic!("retry of a {state} job: {other:?}"),
        }
        assert_eq!(
            queue.get(job).unwrap(),
            before,
            "refused retry changed the job"
        );
    }
    assert!(matches!(
        queue.retry(JobId(999_999)),
        Err(Error::NotFound(_))
    ));
}
}

contract! {
fn retry_is_blocked_while_another_job_holds_the_unique_key() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    let old = queue
        .enqueue(NewJob::new("k").unique_key("report-7"))
        .unwrap();
    let lease = claim_one(&queue);
    queue.manual().fail_permanently(&lease, "nope").unwrap();
    let new = queue
        .enqueue(NewJob::new("k").unique_key("report-7"))
        .unwrap();
    assert_ne!(old, new, "a dead job must not hold its key");

    let before = queue.get(old).unwrap();
    match queue.retry(old) {
        Err(Error::UniqueKeyHeld {
            job_id,
            unique_key,
            held_by,
        }) => {
            assert_eq!(
                (job_id, unique_key.as_str(), held_by),
                (old, "report-7", new)
            );
        }
        other => panic!("expected UniqueKeyHeld, got {other:?}"),
    }
    assert_eq!(queue.get(old).unwrap(), before);

    // Once the holder finished, the old job can be retried.
    let lease = claim_one(&queue);
    assert_eq!(lease.job_id, new);
    queue.manual().complete(&lease).unwrap();
    queue.retry(old).unwrap();
    assert_eq!(queue.get(old).unwrap().state, JobState::Pending);
    assert_eq!(
        queue
            .enqueue(NewJob::new("k").unique_key("report-7"))
            .unwrap(),
        old
    );
}
}

contract! {
fn prune_deletes_only_jobs_finished_before_the_cutoff() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    // Unfinished jobs, all created long before any cutoff.
    let pending = queue.enqueue(NewJob::new("p")).unwrap();
    let scheduled = queue
        .enqueue(NewJob::new("s").delay(secs(7 * 24 * 3600)))
        .unwrap();
    let running = queue.enqueue(NewJob::new("r").priority(1)).unwrap();
    assert_eq!(claim_one(&queue).job_id, running);

    clock.set(t0() + ChronoDuration::seconds(10));
    let early = finished_jobs(&queue);
    clock.set(t0() + ChronoDuration::seconds(20));
    let at_cutoff = finished_jobs(&queue);
    clock.set(t0() + ChronoDuration::seconds(30));
    let late = finished_jobs(&queue);

    let cutoff = t0() + ChronoDuration::seconds(20);
    assert_eq!(
        queue.prune(cutoff).unwrap(),
        3,
        "only the three finished at t0+10 s"
    );
    let exists = |id: JobId| match queue.get(id) {
        Ok(_) => true,
        Err(Error::NotFound(_)) => false,
        Err(e) => panic!("{e}"),
    };
    for id in [early.0, early.1, early.2] {
        assert!(!exists(id), "job {id} finished before the cutoff was kept");
    }
    for id in [
        at_cutoff.0,
        at_cutoff.1,
        at_cutoff.2,
        late.0,
        late.1,
        late.2,
    ] {
        assert!(
            exists(id),
            "job {id} finished at or after the cutoff was pruned"
        );
    }
    assert_eq!(queue.prune(cutoff).unwrap(), 0);

    let far = t0() + ChronoDuration::days(365);
    assert_eq!(queue.prune(far).unwrap(), 6);
    for id in [pending, scheduled, running] {
        assert!(exists(id), "unfinished job {id} was pruned");
    }
    assert_eq!(common::row_count(&path), 3);
}
}

contract! {
fn prune_counts_across_many_batches() {
    const JOBS: usize = 12_000;
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let jobs = (0..JOBS)
        .map(|i| NewJob::new("k").payload(serde_json::json!(i)))
        .collect();
    queue.enqueue_batch(jobs).unwrap();
    let leases = queue.manual().claim("default", "w", JOBS, secs(60)).unwrap();
    assert_eq!(leases.len(), JOBS);
    let outcomes: Vec<_> = leases.iter().map(|l| (l, Outcome::Complete)).collect();
    assert!(queue
        .manual().record_outcomes(&outcomes)
        .unwrap()
        .iter()
        .all(Result::is_ok));
    queue.enqueue(NewJob::new("keep")).unwrap();
    clock.advance(ms(1));
    assert_eq!(queue.prune(clock.now()).unwrap(), JOBS as u64);
    assert_eq!(common::row_count(&path), 1);
}
}

contract! {
fn stats_count_per_queue_and_state() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    assert_eq!(queue.stats().unwrap().counts.len(), 0);
    assert_eq!(queue.stats().unwrap().oldest_due, None);

    // Queue "default": one running, one succeeded, two pending, one scheduled.
    queue.enqueue(NewJob::new("k").priority(5)).unwrap();
    queue.enqueue(NewJob::new("k").priority(5)).unwrap();
    let leases = queue.manual().claim("default", "w", 2, secs(60)).unwrap();
    queue.manual().complete(&leases[0]).unwrap();
    queue.enqueue(NewJob::new("k").run_at(ago(10))).unwrap();
    queue.enqueue(NewJob::new("k")).unwrap();
    queue.enqueue(NewJob::new("k").delay(secs(3600))).unwrap();
    // Queue "mail": one pending (due earliest of all), one dead, one cancelled.
    queue
        .enqueue(NewJob::new("m").queue("mail").run_at(ago(60)))
        .unwrap();
    queue
        .enqueue(NewJob::new("m").queue("mail").priority(9))
        .unwrap();
    let dead = queue.manual().claim("mail", "w", 1, secs(60)).unwrap().remove(0);
    queue.manual().fail_permanently(&dead, "x").unwrap();
    let cancelled = queue.enqueue(NewJob::new("m").queue("mail")).unwrap();
    queue.cancel(cancelled).unwrap();

    let stats = queue.stats().unwrap();
    let expected: BTreeMap<(String, JobState), u64> = [
        (("default", JobState::Running), 1),
        (("default", JobState::Succeeded), 1),
        (("default", JobState::Pending), 2),
        (("default", JobState::Scheduled), 1),
        (("mail", JobState::Pending), 1),
        (("mail", JobState::Dead), 1),
        (("mail", JobState::Cancelled), 1),
    ]
    .into_iter()
    .map(|((q, s), n)| ((q.to_owned(), s), n))
    .collect();
    assert_eq!(stats.counts, expected);
    assert_eq!(stats.total(JobState::Pending), 3);
    assert_eq!(stats.total(JobState::Succeeded), 1);
    assert_eq!(stats.oldest_due, Some(ago(60)));

    // A scheduled job that fell due counts as due before any claim promotes it.
    let (_dir2, path2) = common::temp_db();
    let (later, later_clock) = common::manual_queue(&path2);
    later.enqueue(NewJob::new("k").delay(secs(30))).unwrap();
    assert_eq!(later.stats().unwrap().oldest_due, None);
    later_clock.advance(secs(45));
    let stats = later.stats().unwrap();
    assert_eq!(stats.oldest_due, Some(t0() + ChronoDuration::seconds(30)));
    assert_eq!(stats.total(JobState::Scheduled), 1);
}
}

contract! {
fn list_filters_by_state_queue_and_kind() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    let a1 = queue.enqueue(NewJob::new("alpha")).unwrap();
    let b1 = queue.enqueue(NewJob::new("beta")).unwrap();
    let a2 = queue.enqueue(NewJob::new("alpha").queue("other")).unwrap();
    let a3 = queue.enqueue(NewJob::new("alpha")).unwrap();
    queue.cancel(b1).unwrap();

    let ids = |filter: JobFilter| -> Vec<JobId> {
        queue
            .list(&filter)
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect()
    };
    assert_eq!(ids(JobFilter::default()), vec![a1, b1, a2, a3]);
    assert_eq!(
        ids(JobFilter {
            kind: Some("alpha".into()),
            ..Default::default()
        }),
        vec![a1, a2, a3]
    );
    assert_eq!(
        ids(JobFilter {
            queue: Some("default".into()),
            ..Default::default()
        }),
        vec![a1, b1, a3]
    );
    assert_eq!(
        ids(JobFilter {
            state: Some(JobState::Cancelled),
            ..Default::default()
        }),
        vec![b1]
    );
    assert_eq!(
        ids(JobFilter {
            state: Some(JobState::Pending),
            queue: Some("default".into()),
            kind: Some("alpha".into()),
            limit: 100
        }),
        vec![a1, a3]
    );
    assert_eq!(
        ids(JobFilter {
            limit: 2,
            ..Default::default()
        }),
        vec![a1, b1]
    );
    assert!(ids(JobFilter {
        queue: Some("none".into()),
        ..Default::default()
    })
    .is_empty());
    let listed = queue.list(&JobFilter::default()).unwrap();
    assert_eq!(listed[0], queue.get(a1).unwrap(), "list and get disagree");
}
}

contract! {
fn claim_order_is_priority_then_due_time_then_id() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    // (priority, due seconds ago); enqueued in scrambled order.
    let specs = [
        (0, 5),
        (10, 1),
        (-5, 100),
        (10, 3),
        (0, 5),
        (0, 50),
        (10, 3),
        (i32::MAX, 0),
        (i32::MIN, 1000),
    ];
    let mut jobs: Vec<(i32, DateTime<Utc>, JobId)> = specs
        .iter()
        .map(|&(priority, secs_ago)| {
            let run_at = ago(secs_ago);
            let id = queue
                .enqueue(NewJob::new("k").priority(priority).run_at(run_at))
                .unwrap();
            (priority, run_at, id)
        })
        .collect();
    jobs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let expected: Vec<JobId> = jobs.iter().map(|j| j.2).collect();

    // One by one: the selection itself follows the order.
    let mut one_by_one = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..expected.len() {
        let lease = claim_one(&queue);
        one_by_one.push(lease.job_id);
        leases.push(lease);
    }
    assert_eq!(one_by_one, expected);

    // In one batch: the same order, and a partial batch takes the first ones.
    for lease in &leases {
        queue.manual().release(lease).unwrap();
    }
    let first_four: Vec<JobId> = queue
        .manual().claim("default", "w", 4, secs(60))
        .unwrap()
        .iter()
        .map(|l| l.job_id)
        .collect();
    assert_eq!(first_four, expected[..4]);
    let rest: Vec<JobId> = queue
        .manual().claim("default", "w", 100, secs(60))
        .unwrap()
        .iter()
        .map(|l| l.job_id)
        .collect();
    assert_eq!(rest, expected[4..]);

    // A higher-priority job that falls due goes before lower ones already due.
    queue.enqueue(NewJob::new("k").priority(1)).unwrap();
    let urgent = queue
        .enqueue(NewJob::new("k").priority(2).delay(secs(10)))
        .unwrap();
    clock.advance(secs(10));
    assert_eq!(claim_one(&queue).job_id, urgent);
}
}

contract! {
fn claim_kinds_and_queues_restrict_what_is_claimed() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    let a = queue.enqueue(NewJob::new("a")).unwrap();
    let b = queue.enqueue(NewJob::new("b")).unwrap();
    let c = queue.enqueue(NewJob::new("c")).unwrap();
    let other = queue.enqueue(NewJob::new("a").queue("other")).unwrap();

    assert!(queue
        .manual().claim_kinds("default", "w", 10, secs(60), Some(&[]))
        .unwrap()
        .is_empty());
    assert!(queue
        .manual().claim_kinds("default", "w", 10, secs(60), Some(&["zzz"]))
        .unwrap()
        .is_empty());
    let got: Vec<JobId> = queue
        .manual().claim_kinds("default", "w", 10, secs(60), Some(&["a", "c"]))
        .unwrap()
        .iter()
        .map(|l| l.job_id)
        .collect();
    assert_eq!(got, vec![a, c]);
    assert_eq!(queue.get(b).unwrap().state, JobState::Pending);
    assert_eq!(queue.get(other).unwrap().state, JobState::Pending);

    let got: Vec<JobId> = queue
        .manual().claim("default", "w", 10, secs(60))
        .unwrap()
        .iter()
        .map(|l| l.job_id)
        .collect();
    assert_eq!(got, vec![b], "claim took a job of another queue");
    assert_eq!(queue.get(other).unwrap().state, JobState::Pending);
    assert_eq!(queue.manual().claim("default", "w", 0, secs(60)).unwrap(), vec![]);
    let got = queue.manual().claim("other", "w", 10, secs(60)).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].job_id, got[0].queue.as_str()), (other, "other"));
}
}

contract! {
fn delayed_job_is_claimable_at_its_run_at_and_not_before() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    let delayed = queue.enqueue(NewJob::new("k").delay(secs(60))).unwrap();
    let at = t0() + ChronoDuration::seconds(90);
    let absolute = queue.enqueue(NewJob::new("k").run_at(at)).unwrap();
    // A job of another queue due at the same time must not be promoted by
    // claims on this one.
    let elsewhere = queue
        .enqueue(NewJob::new("k").queue("other").delay(secs(60)))
        .unwrap();
    for id in [delayed, absolute, elsewhere] {
        assert_eq!(queue.get(id).unwrap().state, JobState::Scheduled);
    }
    assert_eq!(
        queue.get(delayed).unwrap().run_at,
        t0() + ChronoDuration::seconds(60)
    );

    clock.set(t0() + ChronoDuration::seconds(60) - ChronoDuration::milliseconds(1));
    assert!(queue
        .manual().claim("default", "w", 10, secs(60))
        .unwrap()
        .is_empty());
    clock.advance(ms(1));
    let got = queue.manual().claim("default", "w", 10, secs(60)).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job_id, delayed);
    assert_eq!(got[0].run_at, clock.now());
    assert_eq!(queue.get(elsewhere).unwrap().state, JobState::Scheduled);

    clock.set(at - ChronoDuration::milliseconds(1));
    assert!(queue
        .manual().claim("default", "w", 10, secs(60))
        .unwrap()
        .is_empty());
    clock.set(at);
    assert_eq!(claim_one(&queue).job_id, absolute);
}
}

contract! {
fn priority_holds_when_more_than_a_promote_batch_falls_due_at_once() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    // 6,000 low-priority jobs due first, then one urgent job due a little later.
    let backlog = (0..6_000)
        .map(|i| {
            NewJob::new("low")
                .payload(serde_json::json!(i))
                .delay(secs(10) + ms(i))
        })
        .collect();
    queue.enqueue_batch(backlog).unwrap();
    let urgent = queue
        .enqueue(NewJob::new("urgent").priority(100).delay(secs(60)))
        .unwrap();
    // All of them are due now (the box was off for an hour).
    clock.advance(secs(3600));
    let first = claim_one(&queue);
    assert_eq!(
        first.job_id, urgent,
        "claimed a priority {} job while a due priority 100 job waited",
        first.priority
    );
}
}

/// Failures reported against other job queues, tried on tickler: they pass
/// and stay as regression tests, each naming the report it follows.
mod other_queues_reports {
    use crate::support::common;
    use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
    use tickler::{Error, JobState, NewJob, Outcome};

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// riverqueue/riverui#622, procrastinate#1446: retrying a discarded unique
    /// job while another live job holds the key hit the unique index (500).
    fn retrying_a_dead_job_whose_key_is_taken_is_a_typed_refusal() {
        let (_dir, path) = temp_db();
        let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
        let dead = queue
            .enqueue(NewJob::new("k").unique_key("u").max_attempts(1))
            .unwrap();
        let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
        queue.manual().fail(&lease, "boom").unwrap();
        assert_eq!(queue.get(dead).unwrap().state, JobState::Dead);
        let live = queue.enqueue(NewJob::new("k").unique_key("u")).unwrap();
        assert_ne!(dead, live);
        let err = queue.retry(dead).unwrap_err();
        assert!(
            matches!(err, Error::UniqueKeyHeld { held_by, .. } if held_by == live),
            "{err:?}"
        );
        assert_eq!(queue.retry_dead(None).unwrap(), (0, 1));
        assert_eq!(queue.get(dead).unwrap().state, JobState::Dead);
        assert_eq!(queue.get(live).unwrap().state, JobState::Pending);
    }
    }

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// rq/rq#1408, OCA/queue#773: a job cancelled while running was retried
    /// when its handler then failed.
    fn a_job_cancelled_while_running_is_never_retried() {
        let (_dir, path) = temp_db();
        let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
        let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();
        let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
        queue.cancel(id).unwrap();
        let results = queue
            .manual().record_outcomes(&[(&lease, Outcome::Fail("failed after cancel".into()))])
            .unwrap();
        assert!(
            matches!(results[0], Err(Error::LeaseLost { .. })),
            "{results:?}"
        );
        clock.advance(secs(3600));
        assert_eq!(queue.manual().reap().unwrap(), 0);
        assert!(queue
            .manual().claim("default", "w", 10, secs(30))
            .unwrap()
            .is_empty());
        let job = queue.get(id).unwrap();
        assert_eq!(job.state, JobState::Cancelled);
        assert!(job.errors.is_empty());
    }
    }
}

contract! {
fn bulk_actions_on_dead_jobs_take_only_their_queue_and_kind() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    // Dead jobs: (queue a, kind x) twice, (a, y), (b, x); one pending
    // (a, x) that no dead-job action may touch.
    let dead = |q: &str, kind: &str| -> JobId {
        let id = queue.enqueue(NewJob::new(kind).queue(q)).unwrap();
        let lease = queue.manual().claim(q, "w", 1, secs(60)).unwrap().remove(0);
        assert_eq!(lease.job_id, id);
        queue.manual().fail_permanently(&lease, "gave up").unwrap();
        id
    };
    let ax = [dead("a", "x"), dead("a", "x")];
    let ay = dead("a", "y");
    let bx = dead("b", "x");
    let pending = queue.enqueue(NewJob::new("x").queue("a")).unwrap();
    let count = |q: Option<&str>, k: Option<&str>, cap: u64| {
        queue.ops().count_matching(JobState::Dead, q, k, cap).unwrap()
    };
    assert_eq!(count(None, None, 100), 4);
    assert_eq!(count(Some("a"), None, 100), 3);
    assert_eq!(count(None, Some("x"), 100), 3);
    assert_eq!(count(Some("a"), Some("x"), 100), 2);
    assert_eq!(count(Some("c"), None, 100), 0);
    assert_eq!(count(Some("a"), None, 2), 2, "the cap bounds the count");
    assert_eq!(
        queue.ops().count_matching(JobState::Pending, Some("a"), Some("x"), 100).unwrap(),
        1
    );

    assert_eq!(queue.retry_dead_matching(Some("a"), Some("x")).unwrap(), (2, 0));
    for id in ax {
        let job = queue.get(id).unwrap();
        assert_eq!((job.state, job.attempts), (JobState::Pending, 0));
    }
    assert_eq!(queue.get(ay).unwrap().state, JobState::Dead);
    assert_eq!(queue.get(bx).unwrap().state, JobState::Dead);

    assert_eq!(queue.delete_dead(None, Some("x")).unwrap(), 1, "only b's x");
    assert!(matches!(queue.get(bx), Err(Error::NotFound(_))));
    assert_eq!(queue.get(ay).unwrap().state, JobState::Dead);
    assert_eq!(queue.delete_dead(Some("b"), None).unwrap(), 0);
    assert_eq!(queue.delete_dead(Some("a"), None).unwrap(), 1);
    assert!(matches!(queue.get(ay), Err(Error::NotFound(_))));
    for id in ax.into_iter().chain([pending]) {
        assert_eq!(queue.get(id).unwrap().state, JobState::Pending);
    }
    assert_eq!(count(None, None, 100), 0);
}
}

contract! {
fn oldest_due_is_the_earliest_due_time_of_a_queue() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue(&path);
    assert_eq!(queue.ops().oldest_due("a").unwrap(), None);
    // A later due time at a higher priority: the oldest is by due time,
    // not claim order.
    queue.enqueue(NewJob::new("k").queue("a")).unwrap();
    let first = clock.now();
    clock.advance(secs(10));
    queue.enqueue(NewJob::new("k").queue("a").priority(5)).unwrap();
    queue.enqueue(NewJob::new("k").queue("b")).unwrap();
    assert_eq!(queue.ops().oldest_due("a").unwrap(), Some(first));
    assert_eq!(queue.ops().oldest_due("b").unwrap(), Some(clock.now()));
    // A scheduled job counts once it is due, even before it is promoted.
    let later = clock.now() + ChronoDuration::seconds(60);
    queue.enqueue(NewJob::new("k").queue("c").run_at(later)).unwrap();
    assert_eq!(queue.ops().oldest_due("c").unwrap(), None);
    clock.advance(secs(61));
    assert_eq!(queue.ops().oldest_due("c").unwrap(), Some(later));
}
}

contract! {
fn cancel_pending_takes_only_pending_jobs_of_its_queue_and_kind_and_hands_on_their_slots() {
    let (_dir, path) = common::temp_db();
    let (queue, _clock) = common::manual_queue(&path);
    queue.set_limit("l", tickler::Limit::per_key(1)).unwrap();
    let running = queue.enqueue(NewJob::new("x").queue("a")).unwrap();
    let lease = queue.manual().claim("a", "w", 1, secs(60)).unwrap().remove(0);
    assert_eq!(lease.job_id, running);
    let ax = [
        queue.enqueue(NewJob::new("x").queue("a")).unwrap(),
        queue.enqueue(NewJob::new("x").queue("a")).unwrap(),
    ];
    let ay = queue.enqueue(NewJob::new("y").queue("a")).unwrap();
    let bx = queue.enqueue(NewJob::new("x").queue("b")).unwrap();
    let later = queue.enqueue(NewJob::new("x").queue("a").delay(secs(60))).unwrap();
    // Key k of limit l: the first job runs, the others are blocked; when
    // it is done its slot is handed to the second (pending), the third
    // still waits.
    let first = queue.enqueue(NewJob::new("w").queue("c").limit("l", "k")).unwrap();
    let slot = queue.enqueue(NewJob::new("x").queue("c").limit("l", "k")).unwrap();
    let waiting = queue.enqueue(NewJob::new("z").queue("c").limit("l", "k")).unwrap();
    let leases = queue.manual().claim("c", "w", 10, secs(60)).unwrap();
    assert_eq!(leases.iter().map(|l| l.job_id).collect::<Vec<_>>(), vec![first]);
    queue.manual().complete(&leases[0]).unwrap();
    assert_eq!(queue.get(slot).unwrap().state, JobState::Pending);
    assert_eq!(queue.get(waiting).unwrap().state, JobState::Blocked);
    assert_eq!(
        queue.ops().count_matching(JobState::Pending, Some("a"), Some("x"), 100).unwrap(),
        2
    );

    assert_eq!(queue.cancel_pending(Some("a"), Some("x")).unwrap(), 2);
    for id in ax {
        assert_eq!(queue.get(id).unwrap().state, JobState::Cancelled);
        assert!(queue.get(id).unwrap().finished_at.is_some());
    }
    for (id, state) in [
        (ay, JobState::Pending),
        (bx, JobState::Pending),
        (later, JobState::Scheduled),
        (running, JobState::Running),
        (slot, JobState::Pending),
    ] {
        assert_eq!(queue.get(id).unwrap().state, state, "job {id}");
    }

    assert_eq!(queue.cancel_pending(None, Some("x")).unwrap(), 2, "b's and c's");
    assert_eq!(queue.get(bx).unwrap().state, JobState::Cancelled);
    assert_eq!(queue.get(slot).unwrap().state, JobState::Cancelled);
    assert_eq!(
        queue.get(waiting).unwrap().state,
        JobState::Pending,
        "the cancelled job's slot went on to the blocked one"
    );
    assert_eq!(queue.cancel_pending(Some("nowhere"), None).unwrap(), 0);
    // The running job's holder is untouched.
    queue.manual().complete(&lease).unwrap();
}
}
