//! Overlap policies: what a tick does while an earlier run of the same
//! schedule is not finished (pending, scheduled or running).
//!
//! The bug this guards: a `* * * * * *` schedule whose job takes 3.5 s ran
//! up to 4 copies at once, with no way to say "not while the last one runs".

use crate::support::schedule;

use chrono::Duration as ChronoDuration;
use schedule::{queue_at, run_ats, temp_db, utc};
use std::time::Duration;
use tickler::{Error, JobState, NewSchedule, OverlapPolicy, Queue};

fn every_second(queue: &Queue, overlap: OverlapPolicy) {
    queue
        .upsert_schedule(NewSchedule::new("s", "* * * * * *", "tick").overlap(overlap))
        .unwrap();
}

contract! {
fn the_default_is_forbid() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 5, 1, 0, 0, 0));
    let stored = queue
        .upsert_schedule(NewSchedule::new("backup", "30 2 * * *", "backup"))
        .unwrap();
    assert_eq!(stored.overlap, OverlapPolicy::Forbid);
    assert_eq!(stored.skipped_ticks, 0);
    assert_eq!(OverlapPolicy::default(), OverlapPolicy::Forbid);
}
}

contract! {
fn forbid_skips_ticks_while_the_last_run_is_pending_running_or_scheduled_and_counts_them() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    every_second(&queue, OverlapPolicy::Forbid);

    let first = queue.manual().run_due_ticks().unwrap();
    assert_eq!(first.jobs.len(), 1);
    assert_eq!(first.skipped, 0);

    // Pending: the next tick is skipped.
    clock.set(start + ChronoDuration::seconds(1));
    let run = queue.manual().run_due_ticks().unwrap();
    assert!(run.jobs.is_empty());
    assert_eq!(run.skipped, 1);

    // Running: skipped too.
    let lease = queue
        .manual().claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, first.jobs[0]);
    clock.set(start + ChronoDuration::seconds(2));
    assert_eq!(queue.manual().run_due_ticks().unwrap().skipped, 1);

    // Waiting for a retry (scheduled): not finished, skipped.
    queue.manual().fail(&lease, "boom").unwrap();
    assert_eq!(queue.get(lease.job_id).unwrap().state, JobState::Scheduled);
    clock.set(start + ChronoDuration::seconds(3));
    assert_eq!(queue.manual().run_due_ticks().unwrap().skipped, 1);

    // Finished: the next tick fires again.
    queue.cancel(lease.job_id).unwrap();
    clock.set(start + ChronoDuration::seconds(4));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(run.skipped, 0);

    let schedule = queue.get_schedule("s").unwrap();
    assert_eq!(schedule.skipped_ticks, 3);
    // Skipped ticks are handled: the schedule moved past them.
    assert_eq!(
        schedule.last_tick_at,
        Some(start + ChronoDuration::seconds(4))
    );
    assert_eq!(run_ats(&queue, "tick").len(), 2);
    assert_eq!(
        queue.get(run.jobs[0]).unwrap().run_at,
        start + ChronoDuration::seconds(4)
    );
}
}

contract! {
fn forbid_with_a_job_of_three_and_a_half_seconds_never_runs_two_at_once() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    every_second(&queue, OverlapPolicy::Forbid);
    // A worker that takes each job as soon as it is due and finishes it
    // 3.5 s later; the clock moves in steps of 0.5 s.
    let mut running: Option<(tickler::Lease, chrono::DateTime<chrono::Utc>)> = None;
    let mut most_at_once = 0;
    for half_seconds in 0..40 {
        let now = start + ChronoDuration::milliseconds(500 * half_seconds);
        clock.set(now);
        if let Some((lease, done_at)) = &running {
            if *done_at <= now {
                queue.manual().complete(lease).unwrap();
                running = None;
            }
        }
        queue.manual().run_due_ticks().unwrap();
        if running.is_none() {
            if let Some(lease) = queue
                .manual().claim("default", "w", 1, Duration::from_secs(30))
                .unwrap()
                .pop()
            {
                running = Some((lease, now + ChronoDuration::milliseconds(3500)));
            }
        }
        let unfinished = queue.count(JobState::Pending).unwrap()
            + queue.count(JobState::Running).unwrap()
            + queue.count(JobState::Scheduled).unwrap();
        most_at_once = most_at_once.max(unfinished);
    }
    assert_eq!(most_at_once, 1);
    let schedule = queue.get_schedule("s").unwrap();
    assert!(schedule.skipped_ticks > 0);
}
}

contract! {
fn replace_cancels_the_running_run_and_fences_its_outcome() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    every_second(&queue, OverlapPolicy::Replace);

    let first = queue.manual().run_due_ticks().unwrap().jobs[0];
    let old = queue
        .manual().claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(old.job_id, first);

    clock.set(start + ChronoDuration::seconds(1));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(run.replaced, vec![first]);
    assert_eq!(run.skipped, 0);
    assert_eq!(queue.get(first).unwrap().state, JobState::Cancelled);
    assert_eq!(queue.get(run.jobs[0]).unwrap().state, JobState::Pending);

    // The replaced holder's outcome is refused, and changes nothing.
    assert!(matches!(queue.manual().complete(&old), Err(Error::LeaseLost { .. })));
    assert!(matches!(
        queue.manual().heartbeat(&old, Duration::from_secs(30)),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(queue.get(first).unwrap().state, JobState::Cancelled);

    // The new run is claimed and finishes normally.
    let new = queue
        .manual().claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    assert_eq!(new.job_id, run.jobs[0]);
    queue.manual().complete(&new).unwrap();
    assert_eq!(queue.get_schedule("s").unwrap().skipped_ticks, 0);
}
}

contract! {
fn replace_also_replaces_a_run_that_has_not_started() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    every_second(&queue, OverlapPolicy::Replace);
    let first = queue.manual().run_due_ticks().unwrap().jobs[0];
    clock.set(start + ChronoDuration::seconds(1));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.replaced, vec![first]);
    assert_eq!(queue.get(first).unwrap().state, JobState::Cancelled);
    assert_eq!(queue.count(JobState::Pending).unwrap(), 1);
}
}

contract! {
fn allow_lets_runs_overlap() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    every_second(&queue, OverlapPolicy::Allow);
    queue.manual().run_due_ticks().unwrap();
    queue
        .manual().claim("default", "w", 1, Duration::from_secs(30))
        .unwrap();
    for s in 1..4 {
        clock.set(start + ChronoDuration::seconds(s));
        let run = queue.manual().run_due_ticks().unwrap();
        assert_eq!(run.jobs.len(), 1);
        assert_eq!(run.skipped, 0);
        assert!(run.replaced.is_empty());
    }
    assert_eq!(queue.count(JobState::Running).unwrap(), 1);
    assert_eq!(queue.count(JobState::Pending).unwrap(), 3);
    assert_eq!(queue.get_schedule("s").unwrap().skipped_ticks, 0);
}
}

contract! {
fn forbid_looks_only_at_runs_of_its_own_schedule() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    // "a" and "a:1" share a key prefix; neither may block the other.
    for name in ["a", "a:1"] {
        queue
            .upsert_schedule(NewSchedule::new(name, "* * * * * *", name))
            .unwrap();
    }
    assert_eq!(queue.manual().run_due_ticks().unwrap().jobs.len(), 2);
    queue
        .manual().claim("default", "w", 2, Duration::from_secs(30))
        .unwrap()
        .into_iter()
        .filter(|l| l.kind == "a")
        .for_each(|l| queue.manual().complete(&l).unwrap());
    clock.set(start + ChronoDuration::seconds(1));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1, "only \"a\" fires: {run:?}");
    assert_eq!(run.skipped, 1);
    assert_eq!(queue.get(run.jobs[0]).unwrap().kind, "a");
    assert_eq!(queue.get_schedule("a").unwrap().skipped_ticks, 0);
    assert_eq!(queue.get_schedule("a:1").unwrap().skipped_ticks, 1);
}
}

contract! {
fn changing_the_overlap_policy_keeps_the_count_and_the_next_tick() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 0, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    every_second(&queue, OverlapPolicy::Forbid);
    queue.manual().run_due_ticks().unwrap();
    clock.set(start + ChronoDuration::seconds(1));
    queue.manual().run_due_ticks().unwrap();
    let before = queue.get_schedule("s").unwrap();
    assert_eq!(before.skipped_ticks, 1);
    every_second(&queue, OverlapPolicy::Allow);
    let after = queue.get_schedule("s").unwrap();
    assert_eq!(after.overlap, OverlapPolicy::Allow);
    assert_eq!(after.skipped_ticks, 1);
    assert_eq!(after.next_tick_at, before.next_tick_at);
}
}

/// A regression test from a hunt through other queues' reports: its doc says the bug it guards.
mod forbid_and_a_cancelled_run {
    use crate::support::schedule;

    use chrono::Duration as ChronoDuration;
    use schedule::{queue_at, temp_db, utc};
    use std::time::Duration;
    use tickler::{NewSchedule, OverlapPolicy};

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// `OverlapPolicy::Forbid` and a cancelled run
    /// whose holder has not stopped.
    ///
    /// `cancel` of a running job keeps its lease (and unique_key) until its
    /// holder reports, "so two runs for one key never overlap". Each tick of
    /// a schedule has its own unique_key, so that guard does not cover ticks;
    /// Forbid's "earlier run not finished" only looks at scheduled, pending and
    /// running jobs.
    fn forbid_waits_for_a_cancelled_run_whose_holder_has_not_stopped() {
        let (_dir, path) = temp_db();
        let start = utc(2026, 5, 1, 0, 0, 0);
        let (queue, clock) = queue_at(&path, start);
        queue
            .upsert_schedule(
                NewSchedule::new("backup", "* * * * * *", "tick").overlap(OverlapPolicy::Forbid),
            )
            .unwrap();
        let first = queue.manual().run_due_ticks().unwrap().jobs[0];
        let holder = queue
            .manual().claim("default", "w1", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);
        assert_eq!(holder.job_id, first);

        // An operator cancels the running backup; its holder has not stopped
        // yet (it has not reported, its lease runs for another minute).
        queue.cancel(first).unwrap();
        let job = queue.get(first).unwrap();
        assert!(job.lease_expires_at.is_some(), "the cancel keeps the lease");

        clock.set(start + ChronoDuration::seconds(1));
        let run = queue.manual().run_due_ticks().unwrap();
        let second = queue
            .manual().claim("default", "w2", 1, Duration::from_secs(60))
            .unwrap();
        assert!(
            run.jobs.is_empty() && second.is_empty(),
            "a second backup run started while the first one's holder was still running: \
             fired {:?}, skipped {}, claimed {:?}",
            run.jobs,
            run.skipped,
            second.iter().map(|l| l.job_id).collect::<Vec<_>>()
        );
    }
    }
}
