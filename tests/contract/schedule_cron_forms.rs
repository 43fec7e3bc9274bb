//! The cron expressions people really write: single-number steps (`a/n`,
//! read as `a-max/n` like Kubernetes CronJob, Quartz and croniter),
//! `@midnight`, and errors that name the field and its range.

use crate::support::schedule;

use schedule::{queue_at, temp_db, utc};
use tickler::{Error, NewSchedule};

/// (expression, first ticks at or after 2026-01-01 00:00 UTC, a Thursday).
const TABLE: &[(&str, &[&str])] = &[
    (
        "0 1/3 * * *",
        &[
            "2026-01-01T01:00:00Z",
            "2026-01-01T04:00:00Z",
            "2026-01-01T07:00:00Z",
            "2026-01-01T10:00:00Z",
            "2026-01-01T13:00:00Z",
            "2026-01-01T16:00:00Z",
            "2026-01-01T19:00:00Z",
            "2026-01-01T22:00:00Z",
            "2026-01-02T01:00:00Z",
        ],
    ),
    (
        "0 0/12 * * *",
        &[
            "2026-01-01T00:00:00Z",
            "2026-01-01T12:00:00Z",
            "2026-01-02T00:00:00Z",
        ],
    ),
    (
        "5/15 * * * *",
        &[
            "2026-01-01T00:05:00Z",
            "2026-01-01T00:20:00Z",
            "2026-01-01T00:35:00Z",
            "2026-01-01T00:50:00Z",
            "2026-01-01T01:05:00Z",
        ],
    ),
    (
        "10/20 * * * * *",
        &[
            "2026-01-01T00:00:10Z",
            "2026-01-01T00:00:30Z",
            "2026-01-01T00:00:50Z",
            "2026-01-01T00:01:10Z",
        ],
    ),
    (
        "0 0 10/10 * *",
        &[
            "2026-01-10T00:00:00Z",
            "2026-01-20T00:00:00Z",
            "2026-01-30T00:00:00Z",
            "2026-02-10T00:00:00Z",
        ],
    ),
    (
        "0 0 1 2/6 *",
        &[
            "2026-02-01T00:00:00Z",
            "2026-08-01T00:00:00Z",
            "2027-02-01T00:00:00Z",
        ],
    ),
    // Day-of-week runs 0-6 for a step: Mon, Wed, Fri, never Sunday (7).
    (
        "0 0 * * 1/2",
        &[
            "2026-01-02T00:00:00Z",
            "2026-01-05T00:00:00Z",
            "2026-01-07T00:00:00Z",
            "2026-01-09T00:00:00Z",
            "2026-01-12T00:00:00Z",
        ],
    ),
    (
        "0 0 * * 5/1",
        &[
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z",
            "2026-01-09T00:00:00Z",
        ],
    ),
    // A step in a list, next to a plain value.
    (
        "0 3,1/6 * * *",
        &[
            "2026-01-01T01:00:00Z",
            "2026-01-01T03:00:00Z",
            "2026-01-01T07:00:00Z",
            "2026-01-01T13:00:00Z",
            "2026-01-01T19:00:00Z",
            "2026-01-02T01:00:00Z",
        ],
    ),
    // Names take a step too.
    (
        "0 0 1 JAN/4 *",
        &[
            "2026-01-01T00:00:00Z",
            "2026-05-01T00:00:00Z",
            "2026-09-01T00:00:00Z",
        ],
    ),
    (
        "@midnight",
        &[
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z",
        ],
    ),
    (
        "@MIDNIGHT",
        &["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"],
    ),
    // Forms that already worked keep their meaning.
    (
        "*/20 * * * *",
        &[
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:20:00Z",
            "2026-01-01T00:40:00Z",
        ],
    ),
    (
        "0 2-10/4 * * *",
        &[
            "2026-01-01T02:00:00Z",
            "2026-01-01T06:00:00Z",
            "2026-01-01T10:00:00Z",
            "2026-01-02T02:00:00Z",
        ],
    ),
];

contract! {
fn single_number_steps_and_midnight_fire_at_their_documented_instants() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    for (expression, expected) in TABLE {
        let spec = NewSchedule::new("t", *expression, "k");
        let got: Vec<String> = queue
            .next_ticks(&spec, expected.len())
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
            .into_iter()
            .map(|t| t.at.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .collect();
        assert_eq!(&got, expected, "{expression}");
        // And it can be stored.
        queue.upsert_schedule(spec).unwrap();
    }
}
}

fn reason(expression: &str) -> String {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    match queue.upsert_schedule(NewSchedule::new("t", expression, "k")) {
        Err(e @ Error::InvalidSchedule { .. }) => {
            assert!(queue.list_schedules().unwrap().is_empty());
            e.to_string()
        }
        other => panic!("{expression}: expected InvalidSchedule, got {other:?}"),
    }
}

contract! {
fn an_out_of_range_value_names_the_field_and_its_range() {
    for (expression, needle) in [
        ("0 24 * * *", "hour 24 is out of range 0-23"),
        ("* * * * 30", "day-of-week 30 is out of range 0-7"),
        ("60 * * * *", "minute 60 is out of range 0-59"),
        ("61 * * * * *", "second 61 is out of range 0-59"),
        ("* 60 * * * *", "minute 60 is out of range 0-59"),
        ("0 0 32 * *", "day-of-month 32 is out of range 1-31"),
        ("0 0 0 * *", "day-of-month 0 is out of range 1-31"),
        ("0 0 1 13 *", "month 13 is out of range 1-12"),
        ("0 1-24 * * *", "hour 24 is out of range 0-23"),
        ("0 25/3 * * *", "hour 25 is out of range 0-23"),
        (
            "0 0 * * 7/2",
            "day-of-week 7 is out of range 0-6 for a step",
        ),
    ] {
        let message = reason(expression);
        assert!(message.contains(needle), "{expression}: {message}");
        assert!(!message.contains("Number out of bounds"), "{message}");
    }
}
}

contract! {
fn nonsense_stays_refused_with_a_hint_that_means_the_same() {
    for expression in [
        "/10 * * * *",
        "0 1/ * * *",
        "0 1/0 * * *",
        "0 1/x * * *",
        "0 a/3 * * *",
    ] {
        let message = reason(expression);
        assert!(!message.contains("*/3"), "{expression}: {message}");
    }
    // The hint for a missing start shows both meanings.
    let message = reason("/10 * * * *");
    assert!(message.contains("minute"), "{message}");
    assert!(
        message.contains("*/10") && message.contains("0/10"),
        "{message}"
    );
    // @reboot and friends are not cron schedules.
    assert!(reason("@reboot").contains("@reboot"));
    assert!(reason("@every 5m").contains("@every"));
}
}
