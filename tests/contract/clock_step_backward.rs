//! A backward step of the wall clock (a bad RTC, a manual fix, an NTP
//! correction on an edge box whose clock was in the future) neither stalls
//! nor repeats.
//!
//! The bugs these guard: after the clock was set back two hours, a
//! `* * * * *` schedule fired nothing until the clock had caught up with
//! where it was, and a lease taken before the step was not reaped for those
//! two hours.

use crate::support::schedule;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use schedule::{queue_at, run_ats, run_until, temp_db, utc};
use std::collections::BTreeSet;
use std::time::Duration;
use tickler::{Error, JobState, MisfirePolicy, NewJob, NewSchedule, OverlapPolicy};

fn minutes(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut at = from;
    while at <= to {
        out.push(at);
        at += ChronoDuration::minutes(1);
    }
    out
}

fn minute_schedule() -> NewSchedule {
    // No worker runs in these tests: let the tick jobs pile up.
    NewSchedule::new("m", "* * * * *", "tick").overlap(OverlapPolicy::Allow)
}

contract! {
fn a_minute_schedule_resumes_at_the_next_minute_after_a_two_hour_step_back() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 10, 0, 30));
    queue.upsert_schedule(minute_schedule()).unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 5, 30));
    assert_eq!(
        run_ats(&queue, "tick"),
        minutes(utc(2026, 5, 1, 10, 1, 0), utc(2026, 5, 1, 10, 5, 0))
    );

    // The clock was two hours ahead; it is set right.
    clock.set(utc(2026, 5, 1, 8, 5, 30));
    // A sleeping scheduler learns that something is due now.
    assert!(queue.manual().next_schedule_tick().unwrap().unwrap() <= clock_now(&clock));
    let run = queue.manual().run_due_ticks().unwrap();
    assert!(run.jobs.is_empty());
    assert_eq!(run.next_tick_at, Some(utc(2026, 5, 1, 8, 6, 0)));
    assert_eq!(
        queue.get_schedule("m").unwrap().next_tick_at,
        Some(utc(2026, 5, 1, 8, 6, 0))
    );
    assert_eq!(
        queue.next_ticks("m", 1).unwrap()[0].at,
        utc(2026, 5, 1, 8, 6, 0)
    );

    // The next minute fires.
    clock.set(utc(2026, 5, 1, 8, 6, 0));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(
        queue.get(run.jobs[0]).unwrap().run_at,
        utc(2026, 5, 1, 8, 6, 0)
    );

    // Time passes past where the clock stood: 10:01 … 10:05 already fired
    // and do not fire again; every other minute fires once.
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 30, 0));
    let fired = run_ats(&queue, "tick");
    let unique: BTreeSet<_> = fired.iter().copied().collect();
    assert_eq!(unique.len(), fired.len(), "a tick instant fired twice");
    let expected: BTreeSet<_> = minutes(utc(2026, 5, 1, 8, 6, 0), utc(2026, 5, 1, 10, 30, 0))
        .into_iter()
        .collect();
    assert_eq!(unique, expected);
    let schedule = queue.get_schedule("m").unwrap();
    assert_eq!(schedule.last_tick_at, Some(utc(2026, 5, 1, 10, 30, 0)));
    assert_eq!(schedule.next_tick_at, Some(utc(2026, 5, 1, 10, 31, 0)));
}
}

fn clock_now(clock: &tickler::ManualClock) -> DateTime<Utc> {
    use tickler::Clock;
    clock.now()
}

contract! {
fn a_box_whose_clock_was_years_ahead_goes_on_after_the_fix_and_skips_the_ticks_it_fired() {
    let (_dir, path) = temp_db();
    // The schedule ran normally for a while.
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 10, 0, 30));
    queue.upsert_schedule(minute_schedule()).unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 3, 30));
    // The box reboots with a bad RTC: 2031. FireOnce fires one catch-up tick,
    // then three minutes of ticks.
    clock.set(utc(2031, 1, 1, 0, 0, 30));
    queue.manual().run_due_ticks().unwrap();
    run_until(&queue, &clock, utc(2031, 1, 1, 0, 3, 30));
    // NTP sets the clock right, a few minutes after the reboot.
    clock.set(utc(2026, 5, 1, 10, 10, 30));
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 15, 0));
    let fired = run_ats(&queue, "tick");
    let mut expected = minutes(utc(2026, 5, 1, 10, 1, 0), utc(2026, 5, 1, 10, 3, 0));
    expected.extend(minutes(utc(2031, 1, 1, 0, 0, 0), utc(2031, 1, 1, 0, 3, 0)));
    expected.extend(minutes(
        utc(2026, 5, 1, 10, 11, 0),
        utc(2026, 5, 1, 10, 15, 0),
    ));
    assert_eq!(fired, expected);
    // Years later the ticks fired under the wrong clock do not fire again.
    clock.set(utc(2030, 12, 31, 23, 58, 30));
    queue.manual().run_due_ticks().unwrap(); // a misfire: fires 23:58 once
    run_until(&queue, &clock, utc(2031, 1, 1, 0, 5, 0));
    let fired = run_ats(&queue, "tick");
    let unique: BTreeSet<_> = fired.iter().copied().collect();
    assert_eq!(unique.len(), fired.len(), "a tick instant fired twice");
    let tail: Vec<_> = fired
        .into_iter()
        .filter(|at| *at >= utc(2030, 12, 31, 0, 0, 0))
        .collect();
    let mut expected = minutes(utc(2030, 12, 31, 23, 58, 0), utc(2031, 1, 1, 0, 5, 0));
    expected.sort();
    let mut tail_sorted = tail.clone();
    tail_sorted.sort();
    assert_eq!(tail_sorted, expected);
}
}

contract! {
fn a_small_step_back_just_after_a_tick_does_not_fire_it_again() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 10, 0, 30));
    queue.upsert_schedule(minute_schedule()).unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 1, 0));
    clock.set(utc(2026, 5, 1, 10, 0, 59));
    queue.manual().run_due_ticks().unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 3, 0));
    assert_eq!(
        run_ats(&queue, "tick"),
        minutes(utc(2026, 5, 1, 10, 1, 0), utc(2026, 5, 1, 10, 3, 0))
    );
}
}

contract! {
fn a_paused_schedule_resumed_after_a_step_back_goes_on_from_the_new_now() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 10, 0, 30));
    queue.upsert_schedule(minute_schedule()).unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 5, 30));
    queue.pause_schedule("m").unwrap();
    clock.set(utc(2026, 5, 1, 8, 0, 30));
    queue.resume_schedule("m").unwrap();
    assert_eq!(
        queue.get_schedule("m").unwrap().next_tick_at,
        Some(utc(2026, 5, 1, 8, 1, 0))
    );
}
}

contract! {
fn a_forward_step_is_still_a_misfire() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 10, 0, 30));
    queue
        .upsert_schedule(minute_schedule().misfire(MisfirePolicy::FireOnce))
        .unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 10, 2, 30));
    clock.set(utc(2026, 5, 1, 12, 2, 30));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(
        queue.get(run.jobs[0]).unwrap().run_at,
        utc(2026, 5, 1, 12, 2, 0)
    );
    assert_eq!(run.next_tick_at, Some(utc(2026, 5, 1, 12, 3, 0)));
}
}

// ------------------------------------------------------------------ leases

const LEASE: Duration = Duration::from_secs(30);

contract! {
fn an_abandoned_lease_is_reaped_within_a_lease_duration_after_a_two_hour_step_back() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 10, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    let abandoned = queue.enqueue(NewJob::new("k")).unwrap();
    let live = queue.enqueue(NewJob::new("k")).unwrap();
    let leases = queue.manual().claim("default", "w", 2, LEASE).unwrap();
    let live_lease = leases.iter().find(|l| l.job_id == live).unwrap();

    clock.set(start - ChronoDuration::hours(2));
    // The pass right after the step takes nothing: no lease has run out.
    assert_eq!(queue.manual().reap().unwrap(), 0);
    assert_eq!(queue.get(abandoned).unwrap().state, JobState::Running);

    // The live holder heartbeats every 10 s, from the new time.
    for _ in 0..3 {
        clock.advance(Duration::from_secs(10));
        queue.manual().heartbeat(live_lease, LEASE).unwrap();
        queue.manual().reap().unwrap();
    }
    clock.advance(Duration::from_millis(1));
    // 30 s after the step: the abandoned job is taken back, the live one kept.
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_ne!(queue.get(abandoned).unwrap().state, JobState::Running);
    let kept = queue.get(live).unwrap();
    assert_eq!(kept.state, JobState::Running);
    assert_eq!(kept.run_token.as_ref(), Some(&live_lease.run_token));
    queue.manual().complete(live_lease).unwrap();
    let abandoned_lease = leases.iter().find(|l| l.job_id == abandoned).unwrap();
    assert!(matches!(
        queue.manual().complete(abandoned_lease),
        Err(Error::LeaseLost { .. })
    ));
}
}

contract! {
fn a_lease_is_not_taken_back_early_after_a_step_back() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 10, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    queue.manual().claim("default", "w", 1, LEASE).unwrap();
    clock.set(start - ChronoDuration::hours(2));
    queue.manual().reap().unwrap();
    clock.advance(LEASE - Duration::from_secs(1));
    assert_eq!(queue.manual().reap().unwrap(), 0);
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);
}
}

contract! {
fn a_step_back_smaller_than_the_margin_changes_nothing() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 10, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    queue.manual().claim("default", "w", 1, LEASE).unwrap();
    clock.set(start - ChronoDuration::seconds(1));
    queue.manual().reap().unwrap();
    assert_eq!(
        queue.get(id).unwrap().lease_expires_at,
        Some(start + ChronoDuration::seconds(30))
    );
}
}

contract! {
fn a_long_heartbeat_extension_is_kept_without_a_step() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 10, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, LEASE).unwrap().remove(0);
    // A handler that knows it will be busy asks for an hour.
    queue.manual().heartbeat(&lease, Duration::from_secs(3600)).unwrap();
    clock.advance(Duration::from_secs(600));
    assert_eq!(queue.manual().reap().unwrap(), 0);
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);
    // A later claim is judged by its own lease, not by an earlier
    // attempt's last heartbeat (a short one here).
    queue.manual().heartbeat(&lease, Duration::from_secs(5)).unwrap();
    queue.manual().fail(&lease, "again").unwrap();
    clock.advance(Duration::from_secs(3600));
    let again = queue
        .manual().claim("default", "w", 1, Duration::from_secs(600))
        .unwrap()
        .remove(0);
    assert_eq!(again.job_id, id);
    for _ in 0..4 {
        clock.advance(Duration::from_secs(20));
        assert_eq!(queue.manual().reap().unwrap(), 0);
    }
    assert_eq!(queue.get(id).unwrap().state, JobState::Running);
}
}

contract! {
fn a_forward_step_still_expires_leases_as_before() {
    let (_dir, path) = temp_db();
    let start = utc(2026, 5, 1, 10, 0, 0);
    let (queue, clock) = queue_at(&path, start);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    queue.manual().claim("default", "w", 1, LEASE).unwrap();
    clock.set(start + ChronoDuration::hours(2));
    // Queue::reap judges by the clock alone; the Reaper thread's hold after
    // a forward step is tested in tests/contract/clock_step.rs.
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_ne!(queue.get(id).unwrap().state, JobState::Running);
}
}

contract! {
fn a_job_that_was_due_before_a_step_back_is_claimed_at_once_not_when_the_clock_catches_up() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 10, 0, 0));
    let due = queue.enqueue(NewJob::new("k")).unwrap();
    let later = queue
        .enqueue(NewJob::new("k").delay(Duration::from_secs(60)))
        .unwrap();
    clock.set(utc(2026, 5, 1, 8, 0, 0));
    assert_eq!(
        queue.manual().next_due(&["default"], None).unwrap(),
        Some(utc(2026, 5, 1, 8, 0, 0)),
        "a pending job is due now"
    );
    let claimed = queue
        .manual().claim("default", "w", 10, Duration::from_secs(30))
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job_id, due);
    // A job delayed to an absolute time still waits for that time.
    assert_eq!(queue.get(later).unwrap().state, JobState::Scheduled);
}
}

/// The bugs these guard (from a review):
/// `Queue::next_due` looks only at the *first pending row in claim
/// order* (priority DESC, run_at, id) and takes its run_at. A pending row's
/// run_at can be later than now after the wall clock steps back (a pending
/// job stays pending). Then a due, lower-priority pending job is hidden:
/// next_due reports a future time, and the worker pool's dispatcher
/// (which trusts next_due before taking the write lock) sleeps instead of
/// claiming the due job, until the clock catches up with the other job.
mod next_due_after_a_backward_step {
    use crate::support::common;

    use chrono::{Duration as CDuration, Utc};
    use std::sync::Arc;
    use std::time::Duration;
    use tickler::{
        Clock, Durability, JobContext, JobError, JobState, ManualClock, NewJob, Queue, WorkerPool,
    };

    fn setup() -> (
        tempfile::TempDir,
        Queue,
        Arc<ManualClock>,
        tickler::JobId,
        tickler::JobId,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let start = Utc::now();
        let clock = Arc::new(ManualClock::new(start));
        let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .clock(clock.clone())
            .open()
            .unwrap();
        // Both due now, so both are inserted pending.
        let high = queue
            .enqueue(NewJob::new("k").priority(10).run_at(start))
            .unwrap();
        let low = queue
            .enqueue(
                NewJob::new("k")
                    .priority(0)
                    .run_at(start - CDuration::hours(2)),
            )
            .unwrap();
        // NTP steps the wall clock back one hour.
        clock.set(start - CDuration::hours(1));
        (dir, queue, clock, high, low)
    }

    contract! {
    /// The bug it guards: see this module's doc (from a review).
    fn next_due_sees_a_due_lower_priority_pending_job() {
        let (_dir, queue, clock, _high, low) = setup();
        assert_eq!(queue.get(low).unwrap().state, JobState::Pending);
        // `low` is due (run_at two hours before the start, one hour before now):
        // a claim would take it right now.
        let next = queue.manual().next_due(&["default"], None).unwrap().unwrap();
        eprintln!("now = {}, next_due = {next}", clock.now_ms());
        assert!(
            next.timestamp_millis() <= clock.now_ms(),
            "next_due says {next}, an hour ahead, although job {low:?} is due now"
        );
    }
    }

    contract! {
    /// The bug it guards: see this module's doc (from a review).
    fn pool_claims_a_due_lower_priority_job_after_a_backward_step() {
        let dir = tempfile::tempdir().unwrap();
        let start = Utc::now();
        let clock = Arc::new(ManualClock::new(start));
        let queue = Queue::builder(common::engine::target(&dir.path().join("q.db")))
            .sqlite(|o| o.durability(Durability::Normal))
            .clock(clock.clone())
            .open()
            .unwrap();
        // A high-priority job, pending (due at enqueue).
        queue.enqueue(NewJob::new("k").priority(10)).unwrap();
        // NTP steps the wall clock back one hour.
        clock.set(start - CDuration::hours(1));
        let mut pool = WorkerPool::builder(&queue)
            .threads(1)
            .handler("k", |_: &JobContext| Ok::<(), JobError>(()))
            .without_reaper()
            .without_scheduler()
            .max_idle(Duration::from_millis(20))
            .start()
            .unwrap();
        // Let the dispatcher's first claim find nothing due.
        std::thread::sleep(Duration::from_millis(200));
        // A new job, due now.
        let low = queue.enqueue(NewJob::new("k")).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let state = queue.get(low).unwrap().state;
        pool.shutdown(Duration::from_secs(1));
        assert_eq!(
            state,
            JobState::Succeeded,
            "the due job was not claimed in 1.5 s: the dispatcher trusted next_due"
        );
    }
    }
}
