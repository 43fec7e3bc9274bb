//! Schedules on the two DST nights of 2026, in America/New_York and
//! Europe/Berlin: the exact UTC instants enqueued.
//!
//! New York: 2026-03-08 02:00 EST → 03:00 EDT (07:00 UTC);
//!           2026-11-01 02:00 EDT → 01:00 EST (06:00 UTC).
//! Berlin:   2026-03-29 02:00 CET → 03:00 CEST (01:00 UTC);
//!           2026-10-25 03:00 CEST → 02:00 CET (01:00 UTC).

use crate::support::schedule;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use schedule::{piling, queue_at, run_ats, run_until, temp_db, utc};

/// The ticks a schedule enqueues between `from` and `to` (UTC), with a
/// scheduler that is always awake; also checks that the preview
/// (`next_ticks`) said the same.
fn fired(cron: &str, zone: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, from);
    let spec = piling("s", cron, "tick").time_zone(zone);
    let preview: Vec<DateTime<Utc>> = queue
        .next_ticks(&spec, 500)
        .unwrap()
        .into_iter()
        .map(|t| t.at)
        .take_while(|at| *at <= to)
        .collect();
    queue.upsert_schedule(spec).unwrap();
    run_until(&queue, &clock, to);
    let got = run_ats(&queue, "tick");
    assert_eq!(got, preview, "enqueued ticks differ from the preview");
    got
}

fn every(start: DateTime<Utc>, step_minutes: i64, count: usize) -> Vec<DateTime<Utc>> {
    (0..count)
        .map(|i| start + ChronoDuration::minutes(step_minutes * i as i64))
        .collect()
}

contract! {
fn new_york_spring_forward_fires_a_missing_time_once_after_the_gap() {
    let got = fired(
        "30 2 * * *",
        "America/New_York",
        utc(2026, 3, 7, 0, 0, 0),
        utc(2026, 3, 10, 0, 0, 0),
    );
    assert_eq!(
        got,
        vec![
            utc(2026, 3, 7, 7, 30, 0), // 02:30 EST
            utc(2026, 3, 8, 7, 0, 0),  // 02:30 does not exist: 03:00 EDT
            utc(2026, 3, 9, 6, 30, 0), // 02:30 EDT
        ]
    );
}
}

contract! {
fn berlin_spring_forward_fires_a_missing_time_once_after_the_gap() {
    let got = fired(
        "30 2 * * *",
        "Europe/Berlin",
        utc(2026, 3, 27, 12, 0, 0),
        utc(2026, 3, 31, 0, 0, 0),
    );
    assert_eq!(
        got,
        vec![
            utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
            utc(2026, 3, 29, 1, 0, 0),  // 02:30 does not exist: 03:00 CEST
            utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
        ]
    );
}
}

contract! {
fn several_missing_times_in_one_gap_fire_once() {
    let got = fired(
        "0,20,40 2 * * *",
        "America/New_York",
        utc(2026, 3, 8, 0, 0, 0),
        utc(2026, 3, 8, 12, 0, 0),
    );
    assert_eq!(got, vec![utc(2026, 3, 8, 7, 0, 0)]);
}
}

contract! {
fn new_york_fall_back_fires_a_repeated_time_once_at_its_first_occurrence() {
    let got = fired(
        "30 1 * * *",
        "America/New_York",
        utc(2026, 10, 31, 0, 0, 0),
        utc(2026, 11, 3, 0, 0, 0),
    );
    assert_eq!(
        got,
        vec![
            utc(2026, 10, 31, 5, 30, 0), // 01:30 EDT
            utc(2026, 11, 1, 5, 30, 0),  // 01:30 EDT, not again at 01:30 EST
            utc(2026, 11, 2, 6, 30, 0),  // 01:30 EST
        ]
    );
}
}

contract! {
fn berlin_fall_back_fires_a_repeated_time_once_at_its_first_occurrence() {
    let got = fired(
        "30 2 * * *",
        "Europe/Berlin",
        utc(2026, 10, 23, 12, 0, 0),
        utc(2026, 10, 27, 0, 0, 0),
    );
    assert_eq!(
        got,
        vec![
            utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
            utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST, not again at 02:30 CET
            utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
        ]
    );
}
}

contract! {
fn every_fifteen_minutes_runs_on_real_time_through_both_new_york_nights() {
    // 00:00 EST to 05:00 EDT: 4 real hours, 17 ticks 15 minutes apart.
    let spring = fired(
        "*/15 * * * *",
        "America/New_York",
        utc(2026, 3, 8, 5, 0, 0),
        utc(2026, 3, 8, 9, 0, 0),
    );
    assert_eq!(spring, every(utc(2026, 3, 8, 5, 0, 0), 15, 17));
    // 00:00 EDT to 03:00 EST: 4 real hours, the 01:xx hour twice.
    let fall = fired(
        "*/15 * * * *",
        "America/New_York",
        utc(2026, 11, 1, 4, 0, 0),
        utc(2026, 11, 1, 8, 0, 0),
    );
    assert_eq!(fall, every(utc(2026, 11, 1, 4, 0, 0), 15, 17));
}
}

contract! {
fn every_fifteen_minutes_runs_on_real_time_through_both_berlin_nights() {
    let spring = fired(
        "*/15 * * * *",
        "Europe/Berlin",
        utc(2026, 3, 28, 23, 0, 0),
        utc(2026, 3, 29, 3, 0, 0),
    );
    assert_eq!(spring, every(utc(2026, 3, 28, 23, 0, 0), 15, 17));
    let fall = fired(
        "*/15 * * * *",
        "Europe/Berlin",
        utc(2026, 10, 24, 23, 0, 0),
        utc(2026, 10, 25, 3, 0, 0),
    );
    assert_eq!(fall, every(utc(2026, 10, 24, 23, 0, 0), 15, 17));
}
}

contract! {
fn hourly_fires_in_both_occurrences_of_the_repeated_hour() {
    let got = fired(
        "0 * * * *",
        "America/New_York",
        utc(2026, 11, 1, 4, 30, 0),
        utc(2026, 11, 1, 7, 30, 0),
    );
    // 01:00 EDT, 01:00 EST, 02:00 EST.
    assert_eq!(
        got,
        vec![
            utc(2026, 11, 1, 5, 0, 0),
            utc(2026, 11, 1, 6, 0, 0),
            utc(2026, 11, 1, 7, 0, 0)
        ]
    );
}
}

contract! {
fn preview_shows_local_wall_clock_with_its_offset() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 10, 31, 12, 0, 0));
    let spec = piling("s", "30 1 * * *", "tick").time_zone("America/New_York");
    let ticks = queue.next_ticks(&spec, 2).unwrap();
    assert_eq!(ticks[0].at, utc(2026, 11, 1, 5, 30, 0));
    assert_eq!(ticks[0].local.to_rfc3339(), "2026-11-01T01:30:00-04:00");
    assert_eq!(ticks[1].local.to_rfc3339(), "2026-11-02T01:30:00-05:00");
    // Nothing was stored.
    assert!(queue.list_schedules().unwrap().is_empty());
}
}
