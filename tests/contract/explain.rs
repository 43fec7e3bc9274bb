//! `Queue::explain`: why a job is where it is, on every engine: due or in
//! a paused queue, waiting for its time, deferred by its limit's rate (and
//! its place in the key's line), blocked on its concurrency limit (by
//! which holders, until when), waiting for its parents or, a batch's
//! callback, for its batch and its seal, running, finished.

use crate::support::common;
use crate::support::limits::*;

use common::{fixed_policy, manual_queue_with_policy, temp_db};
use std::time::Duration;
use tickler::{
    BatchCallback, Clock, Holder, IfParentFails, JobState, Limit, NewBatch, NewJob, Reason,
};

contract! {
fn explain_says_why_a_job_is_not_running() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let t0 = clock.now();

    let due = queue.enqueue(NewJob::new("k")).unwrap();
    assert_eq!(queue.explain(due).unwrap().reason, Reason::Due);
    queue.pause_queue("default").unwrap();
    let why = queue.explain(due).unwrap();
    assert_eq!(why.reason, Reason::QueuePaused { queue: "default".into() });
    assert_eq!(why.to_string(), "due, but queue default is paused");
    queue.resume_queue("default").unwrap();
    let later = queue.enqueue(NewJob::new("k").delay(Duration::from_secs(90))).unwrap();
    assert_eq!(
        queue.explain(later).unwrap().reason,
        Reason::Waiting { until: t0 + chrono::Duration::seconds(90) }
    );
    let claimed = claim(&queue, 10);
    assert_eq!(ids(&claimed), vec![due]);
    match queue.explain(due).unwrap().reason {
        Reason::Running { worker, lease_until } => {
            assert_eq!(worker.as_deref(), Some("w"));
            assert_eq!(lease_until, Some(t0 + chrono::Duration::seconds(30)));
        }
        other => panic!("{other:?}"),
    }
    queue.manual().fail_permanently(&claimed[0], "no such file").unwrap();
    let why = queue.explain(due).unwrap();
    assert_eq!(why.reason, Reason::Finished);
    assert_eq!(why.to_string(), "dead: no such file");

    // Blocked: by whom, until when.
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let holder = queue.enqueue(sync("42")).unwrap();
    let waiter = queue.enqueue(sync("42")).unwrap();
    assert_eq!(ids(&claim(&queue, 10)), vec![holder]);
    let why = queue.explain(waiter).unwrap();
    let until = t0 + chrono::Duration::seconds(30);
    assert_eq!(
        why.reason,
        Reason::Blocked {
            limit: "sync".into(),
            key: "42".into(),
            held: 1,
            max_per_key: Some(1),
            max_total: None,
            total_held: 1,
            by_total: false,
            limit_set: true,
            holders: vec![Holder {
                job_id: holder,
                worker: Some("w".into()),
                lease_until: Some(until),
                weight: 1,
            }],
        }
    );
    assert_eq!(
        why.to_string(),
        format!(
            "blocked by limit sync/42: 1 of 1 held by job {holder} (worker w, lease until {})",
            until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    );

    // Deferred by a rate: until when, which place in the key's line.
    queue.set_limit("api", Limit::rate(10, Duration::from_secs(1))).unwrap();
    let line: Vec<_> = (0..4)
        .map(|_| queue.enqueue(NewJob::new("api").limit("api", "team-7")).unwrap())
        .collect();
    assert_eq!(ids(&claim(&queue, 10)), vec![line[0]]);
    for (i, id) in line.iter().enumerate().skip(1) {
        let until = t0 + chrono::Duration::milliseconds(100 * i as i64);
        assert_eq!(
            queue.explain(*id).unwrap().reason,
            Reason::Deferred { limit: "api".into(), key: "team-7".into(), until, place: i as u64 }
        );
    }
    let why = queue.explain(line[2]).unwrap().to_string();
    assert!(why.starts_with("deferred by rate limit api/team-7 until "), "{why}");
    assert!(why.ends_with("(2nd in line)"), "{why}");
    // A retry's backoff is waiting, not a place in a line.
    clock.advance(Duration::from_millis(100));
    let second = claim(&queue, 10);
    assert_eq!(ids(&second), vec![line[1]]);
    queue.manual().fail(&second[0], "boom").unwrap();
    assert!(matches!(queue.explain(line[1]).unwrap().reason, Reason::Waiting { .. }));
    assert!(matches!(
        queue.explain(line[2]).unwrap().reason,
        Reason::Deferred { place: 1, .. }
    ));
    assert!(matches!(queue.explain(tickler::JobId(9_999)), Err(tickler::Error::NotFound(_))));
}
}

contract! {
/// A waiting job names the parents it still waits for, where each is (a
/// running one's worker and lease, a scheduled one's time), and says what
/// a failed parent holds; a parent that ended is no longer listed.
fn explain_names_the_parents_a_waiting_job_waits_for() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let t0 = clock.now();
    let running = queue.enqueue(NewJob::new("k")).unwrap();
    let later = queue.enqueue(NewJob::new("k").delay(Duration::from_secs(90))).unwrap();
    let held = queue.enqueue(NewJob::new("k").queue("other")).unwrap();
    let done = queue.enqueue(NewJob::new("k").queue("other")).unwrap();
    let claimed = claim(&queue, 10);
    assert_eq!(ids(&claimed), vec![running]);
    let child = queue
        .enqueue(
            NewJob::new("k")
                .after(&[running, later])
                .after_with(held, IfParentFails::Hold)
                .after_with(done, IfParentFails::Run),
        )
        .unwrap();
    queue.cancel(held).unwrap();
    queue.cancel(done).unwrap();
    let why = queue.explain(child).unwrap();
    let lease_until = t0 + chrono::Duration::seconds(30);
    match &why.reason {
        Reason::AfterParents { parents, count } => {
            assert_eq!(*count, 3, "{why}");
            let seen: Vec<_> = parents.iter().map(|p| (p.job_id, p.state)).collect();
            assert_eq!(
                seen,
                vec![
                    (running, JobState::Running),
                    (later, JobState::Scheduled),
                    (held, JobState::Cancelled)
                ]
            );
            assert_eq!(parents[0].worker.as_deref(), Some("w"));
            assert_eq!(parents[0].lease_until, Some(lease_until));
            assert_eq!(parents[1].worker, None);
            assert_eq!(parents[2].if_fails, IfParentFails::Hold);
        }
        other => panic!("{other:?}"),
    }
    let text = why.to_string();
    let at = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(
        text,
        format!(
            "waiting for {running} (running on w, lease until {}) and {later} (scheduled {}) \
             and {held} (cancelled; held until it is retried and succeeds)",
            at(lease_until),
            at(t0 + chrono::Duration::seconds(90))
        )
    );
    queue.manual().complete(&claimed[0]).unwrap();
    match queue.explain(child).unwrap().reason {
        Reason::AfterParents { parents, count } => {
            assert_eq!(count, 2);
            assert_eq!(parents[0].job_id, later);
        }
        other => panic!("{other:?}"),
    }
}
}

contract! {
/// A waiting batch callback names its batch, which callback it is, what
/// decides it, how many members remain and how many failed; while the
/// batch is not sealed it says the seal is what it waits for too, even
/// with every member ended. A member waiting for parents still names its
/// parents; a decided callback is explained as any job.
fn explain_says_a_batch_callback_waits_for_its_batch_and_its_seal() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let batch = queue
        .open_batch(
            NewBatch::new()
                .on_success(NewJob::new("all_sent"))
                .on_failure(NewJob::new("some_failed"))
                .on_finish(NewJob::new("campaign_done")),
        )
        .unwrap();
    let members = queue
        .enqueue_batch((0..3).map(|_| NewJob::new("send").batch(batch.id).max_attempts(1)).collect())
        .unwrap();
    let unsealed = "; the batch is not sealed: it never finishes until it is sealed (seal_batch), \
                    however many members have ended";
    let finish = batch.on_finish.unwrap();
    let why = queue.explain(finish).unwrap();
    assert_eq!(
        why.reason,
        Reason::AfterBatch {
            batch: batch.id,
            callback: BatchCallback::OnFinish,
            members: 3,
            remaining: 3,
            failed: 0,
            sealed: false,
        }
    );
    assert_eq!(
        why.to_string(),
        format!(
            "on_finish callback of batch {} (released however the members end): \
             3 of 3 members remaining{unsealed}",
            batch.id
        )
    );

    // Every member ends, one dead: nothing fires while nobody sealed it.
    let mut leases = claim(&queue, 10);
    leases.sort_by_key(|l| l.job_id);
    assert_eq!(ids(&leases), members);
    queue.manual().complete(&leases[0]).unwrap();
    queue.manual().complete(&leases[1]).unwrap();
    queue.manual().fail_permanently(&leases[2], "bounced").unwrap();
    let why = queue.explain(batch.on_success.unwrap()).unwrap();
    assert_eq!(
        why.reason,
        Reason::AfterBatch {
            batch: batch.id,
            callback: BatchCallback::OnSuccess,
            members: 3,
            remaining: 0,
            failed: 1,
            sealed: false,
        }
    );
    assert_eq!(
        why.to_string(),
        format!(
            "on_success callback of batch {} (released if every member succeeds, else cancelled): \
             0 of 3 members remaining, 1 failed{unsealed}",
            batch.id
        )
    );
    let why = queue.explain(batch.on_failure.unwrap()).unwrap().to_string();
    assert!(
        why.starts_with(&format!(
            "on_failure callback of batch {} (released if any member ends dead or cancelled, \
             else cancelled): ",
            batch.id
        )),
        "{why}"
    );

    // Sealed with a member left: no word of the seal. A member that runs
    // after another job names its parent, not the batch.
    let other = queue.open_batch(NewBatch::new().on_finish(NewJob::new("report"))).unwrap();
    let parent = queue.enqueue(NewJob::new("fetch")).unwrap();
    let member = queue.enqueue(NewJob::new("send").batch(other.id).after(&[parent])).unwrap();
    queue.seal_batch(other.id).unwrap();
    let why = queue.explain(other.on_finish.unwrap()).unwrap();
    assert!(matches!(why.reason, Reason::AfterBatch { sealed: true, remaining: 1, .. }), "{why}");
    assert!(why.to_string().ends_with(": 1 of 1 members remaining"), "{why}");
    match queue.explain(member).unwrap().reason {
        Reason::AfterParents { parents, count: 1 } => assert_eq!(parents[0].job_id, parent),
        other => panic!("{other:?}"),
    }

    // The seal decides: the callbacks are explained as any job.
    queue.seal_batch(batch.id).unwrap();
    assert_eq!(queue.explain(finish).unwrap().reason, Reason::Due);
    assert_eq!(queue.explain(batch.on_failure.unwrap()).unwrap().reason, Reason::Due);
    assert_eq!(queue.explain(batch.on_success.unwrap()).unwrap().reason, Reason::Finished);
}
}
