//! Misfires (ticks due while no scheduler ran) and wall-clock steps.

use crate::support::schedule;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use schedule::{piling, queue_at, run_ats, run_until, temp_db, utc};
use std::time::{Duration, Instant};
use tickler::{JobFilter, MisfirePolicy, Queue};

fn hours(start: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    (0..n)
        .map(|i| start + ChronoDuration::hours(i as i64))
        .collect()
}

/// An hourly schedule that ran normally until 2026-01-01 02:00, then the
/// device was off until 2026-01-04 02:30 (72 missed ticks, none on time).
/// Returns the ticks enqueued on wake-up, and the schedule's next tick.
fn three_day_gap(policy: MisfirePolicy) -> (Vec<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 1, 1, 0, 30, 0));
    queue
        .upsert_schedule(piling("hourly", "0 * * * *", "tick").misfire(policy))
        .unwrap();
    run_until(&queue, &clock, utc(2026, 1, 1, 2, 0, 0));
    assert_eq!(run_ats(&queue, "tick"), hours(utc(2026, 1, 1, 1, 0, 0), 2));
    clock.set(utc(2026, 1, 4, 2, 30, 0));
    let run = queue.manual().run_due_ticks().unwrap();
    let after = run_ats(&queue, "tick")[2..].to_vec();
    assert_eq!(run.jobs.len(), after.len());
    assert_eq!(run.next_tick_at, Some(utc(2026, 1, 4, 3, 0, 0)));
    // Then it goes on normally.
    clock.set(utc(2026, 1, 4, 3, 0, 0));
    let on = queue.manual().run_due_ticks().unwrap();
    assert_eq!(on.jobs.len(), 1);
    assert_eq!(
        queue.get(on.jobs[0]).unwrap().run_at,
        utc(2026, 1, 4, 3, 0, 0)
    );
    (after, queue.get_schedule("hourly").unwrap().next_tick_at)
}

contract! {
fn skip_after_three_days_fires_nothing_for_the_missed_ticks() {
    let (fired, next) = three_day_gap(MisfirePolicy::Skip);
    assert!(fired.is_empty(), "{fired:?}");
    assert_eq!(next, Some(utc(2026, 1, 4, 4, 0, 0)));
}
}

contract! {
fn fire_once_after_three_days_fires_one_catch_up_for_the_latest_tick() {
    let (fired, _) = three_day_gap(MisfirePolicy::FireOnce);
    assert_eq!(fired, vec![utc(2026, 1, 4, 2, 0, 0)]);
}
}

contract! {
fn fire_all_after_three_days_fires_the_oldest_max_ticks() {
    let (fired, _) = three_day_gap(MisfirePolicy::FireAll { max: 5 });
    assert_eq!(fired, hours(utc(2026, 1, 1, 3, 0, 0), 5));
    let (fired, _) = three_day_gap(MisfirePolicy::FireAll { max: 1000 });
    assert_eq!(fired, hours(utc(2026, 1, 1, 3, 0, 0), 72));
}
}

/// A schedule every `cron` from 2023-01-01, device off until
/// 2026-01-01 00:00:30 (three years). Returns the ticks enqueued on
/// wake-up and how long that took.
fn three_year_gap(cron: &str, policy: MisfirePolicy) -> (Vec<DateTime<Utc>>, Duration) {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2023, 1, 1, 0, 0, 0));
    queue
        .upsert_schedule(piling("s", cron, "tick").misfire(policy))
        .unwrap();
    assert_eq!(
        queue.get_schedule("s").unwrap().next_tick_at,
        Some(utc(2023, 1, 1, 0, 0, 0))
    );
    clock.set(utc(2026, 1, 1, 0, 0, 30));
    let started = Instant::now();
    let run = queue.manual().run_due_ticks().unwrap();
    let took = started.elapsed();
    let fired = run_ats(&queue, "tick");
    assert_eq!(run.jobs.len(), fired.len());
    let next = queue.get_schedule("s").unwrap().next_tick_at.unwrap();
    assert!(next > utc(2026, 1, 1, 0, 0, 30) && next <= utc(2026, 1, 1, 0, 1, 0));
    // A second run finds nothing more to do.
    assert!(queue.manual().run_due_ticks().unwrap().jobs.is_empty());
    (fired, took)
}

const QUICK: Duration = Duration::from_secs(3);

contract! {
fn three_years_every_minute_is_bounded_for_every_policy() {
    // 1.58 million missed ticks; the one at 00:00:00 is 30 s late: on time.
    let (fired, took) = three_year_gap("* * * * *", MisfirePolicy::Skip);
    assert_eq!(fired, vec![utc(2026, 1, 1, 0, 0, 0)]);
    assert!(took < QUICK, "{took:?}");

    let (fired, took) = three_year_gap("* * * * *", MisfirePolicy::FireOnce);
    assert_eq!(fired, vec![utc(2026, 1, 1, 0, 0, 0)]);
    assert!(took < QUICK, "{took:?}");

    let (fired, took) = three_year_gap("* * * * *", MisfirePolicy::FireAll { max: 100 });
    let mut expected: Vec<DateTime<Utc>> = (0..100)
        .map(|i| utc(2023, 1, 1, 0, 0, 0) + ChronoDuration::minutes(i))
        .collect();
    expected.push(utc(2026, 1, 1, 0, 0, 0));
    assert_eq!(fired, expected);
    assert!(took < QUICK, "{took:?}");
}
}

contract! {
fn three_years_of_a_sparse_schedule_fire_once_finds_the_latest_tick() {
    // 09:15 on weekdays in Berlin; the latest before 2026-01-01 00:00:30 is
    // Wednesday 2025-12-31 09:15 CET = 08:15 UTC.
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2023, 1, 1, 0, 0, 0));
    queue
        .upsert_schedule(piling("s", "15 9 * * MON-FRI", "tick").time_zone("Europe/Berlin"))
        .unwrap();
    clock.set(utc(2026, 1, 1, 0, 0, 30));
    let started = Instant::now();
    queue.manual().run_due_ticks().unwrap();
    assert!(started.elapsed() < QUICK);
    assert_eq!(run_ats(&queue, "tick"), vec![utc(2025, 12, 31, 8, 15, 0)]);
    assert_eq!(
        queue.get_schedule("s").unwrap().next_tick_at,
        Some(utc(2026, 1, 1, 8, 15, 0))
    );
}
}

contract! {
fn three_years_every_second_with_a_short_grace() {
    // 94 million missed ticks. With a 2 s grace, the ticks at 00:00:28,
    // :29 and :30 are on time.
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2023, 1, 1, 0, 0, 0));
    for policy in [
        MisfirePolicy::Skip,
        MisfirePolicy::FireOnce,
        MisfirePolicy::FireAll { max: 10 },
    ] {
        let name = format!("{policy:?}");
        queue
            .upsert_schedule(
                piling(name.clone(), "* * * * * *", name.clone())
                    .misfire(policy)
                    .misfire_grace(Duration::from_secs(2)),
            )
            .unwrap();
    }
    clock.set(utc(2026, 1, 1, 0, 0, 30));
    let started = Instant::now();
    queue.manual().run_due_ticks().unwrap();
    assert!(started.elapsed() < QUICK, "{:?}", started.elapsed());
    let on_time: Vec<_> = (28..=30).map(|s| utc(2026, 1, 1, 0, 0, s)).collect();
    assert_eq!(run_ats(&queue, "Skip"), on_time);
    assert_eq!(run_ats(&queue, "FireOnce"), vec![utc(2026, 1, 1, 0, 0, 30)]);
    let mut all: Vec<_> = (0..10).map(|s| utc(2023, 1, 1, 0, 0, s)).collect();
    all.extend(on_time);
    assert_eq!(run_ats(&queue, "FireAll { max: 10 }"), all);
}
}

fn finish_and_prune(queue: &Queue, now: DateTime<Utc>) {
    loop {
        let leases = queue
            .manual()
            .claim("default", "w", 100, Duration::from_secs(30))
            .unwrap();
        if leases.is_empty() {
            break;
        }
        for lease in &leases {
            queue.manual().complete(lease).unwrap();
        }
    }
    queue.prune(now + ChronoDuration::hours(1)).unwrap();
}

contract! {
fn a_backward_clock_step_of_one_hour_enqueues_no_tick_twice() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 0, 0, 0));
    queue
        .upsert_schedule(piling("s", "*/10 * * * *", "tick"))
        .unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 2, 0, 0));
    assert_eq!(run_ats(&queue, "tick").len(), 13); // 00:00 … 02:00
                                                   // The jobs ran and were pruned: no unique_key is held any more, only the
                                                   // schedule's own bookkeeping stands between the step and a duplicate.
    finish_and_prune(&queue, utc(2026, 5, 1, 2, 0, 0));
    assert!(queue.list(&JobFilter::default()).unwrap().is_empty());

    // NTP steps the clock back one hour.
    clock.set(utc(2026, 5, 1, 1, 0, 0));
    assert!(queue.manual().run_due_ticks().unwrap().jobs.is_empty());
    let schedule = queue.get_schedule("s").unwrap();
    assert_eq!(schedule.next_tick_at, Some(utc(2026, 5, 1, 2, 10, 0)));
    assert_eq!(schedule.last_tick_at, Some(utc(2026, 5, 1, 2, 0, 0)));
    // The preview agrees: nothing before the last tick comes again.
    assert_eq!(
        queue.next_ticks("s", 1).unwrap()[0].at,
        utc(2026, 5, 1, 2, 10, 0)
    );

    // Time passes again, past where it was, to 03:00.
    run_until(&queue, &clock, utc(2026, 5, 1, 3, 0, 0));
    let fired = run_ats(&queue, "tick");
    let expected: Vec<_> = (0..6)
        .map(|i| utc(2026, 5, 1, 2, 10, 0) + ChronoDuration::minutes(10 * i))
        .collect();
    assert_eq!(fired, expected);
}
}

contract! {
fn a_forward_clock_step_is_a_misfire() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 0, 0, 0));
    queue
        .upsert_schedule(piling("skip", "*/10 * * * *", "skip").misfire(MisfirePolicy::Skip))
        .unwrap();
    queue
        .upsert_schedule(piling("once", "*/10 * * * *", "once"))
        .unwrap();
    run_until(&queue, &clock, utc(2026, 5, 1, 0, 10, 0));
    // The clock jumps forward 55 minutes: 00:20 … 01:00 were stepped over.
    clock.set(utc(2026, 5, 1, 1, 5, 0));
    queue.manual().run_due_ticks().unwrap();
    let before = vec![utc(2026, 5, 1, 0, 0, 0), utc(2026, 5, 1, 0, 10, 0)];
    assert_eq!(run_ats(&queue, "skip"), before);
    let mut once = before.clone();
    once.push(utc(2026, 5, 1, 1, 0, 0));
    assert_eq!(run_ats(&queue, "once"), once);
}
}

contract! {
fn ticks_within_the_grace_are_on_time_and_all_fire() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 5, 1, 0, 0, 0));
    queue
        .upsert_schedule(piling("s", "*/10 * * * * *", "tick").misfire(MisfirePolicy::Skip))
        .unwrap();
    // A scheduler 45 s late (a busy disk): four ticks, all within 60 s.
    clock.set(utc(2026, 5, 1, 0, 0, 45));
    queue.manual().run_due_ticks().unwrap();
    let expected: Vec<_> = (0..5).map(|i| utc(2026, 5, 1, 0, 0, 10 * i)).collect();
    assert_eq!(run_ats(&queue, "tick"), expected);
}
}
