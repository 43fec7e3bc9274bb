//! `tickler schedule …`: add, list, pause, resume, rm, next; errors; and a
//! schedule of shell jobs fired by `tickler work` (a durable cron).

use crate::support::cli;

use cli::{eventually, signal, wait_for, Env};
use std::time::Duration;
use tickler::JobState;

#[test]
fn add_list_pause_resume_next_and_rm() {
    let env = Env::new();
    let out = env
        .run(&[
            "schedule",
            "add",
            "backup",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "shell",
            r#"{"argv": ["backup.sh"]}"#,
            "--queue",
            "maintenance",
            "--max-attempts",
            "3",
            "--timeout",
            "10m",
            "--misfire",
            "fire-all",
            "--misfire-limit",
            "5",
        ])
        .ok();
    assert!(
        out.starts_with("added schedule backup: next tick "),
        "{out}"
    );
    assert!(out.contains("+05:30"), "local time with the zone: {out}");

    let stored = env.queue().get_schedule("backup").unwrap();
    assert_eq!(stored.time_zone, "Europe/Berlin");
    assert_eq!(stored.queue, "maintenance");
    assert_eq!(stored.max_attempts, 3);
    assert_eq!(stored.timeout, Some(Duration::from_secs(600)));
    assert_eq!(stored.misfire, tickler::MisfirePolicy::FireAll { max: 5 });
    assert_eq!(stored.payload, serde_json::json!({"argv": ["backup.sh"]}));

    let table = env.run(&["schedule", "list", "--utc"]).ok();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(lines[0].starts_with("NAME"), "{table}");
    for cell in [
        "backup",
        "30 2 * * *",
        "Europe/Berlin",
        "shell",
        "maintenance",
        "active",
        "UTC",
    ] {
        assert!(lines[1].contains(cell), "{cell}: {table}");
    }

    // Replacing keeps the name; --paused pauses.
    let out = env
        .run(&[
            "schedule",
            "add",
            "backup",
            "0 3 * * *",
            "shell",
            "--paused",
        ])
        .ok();
    assert_eq!(out.trim(), "replaced schedule backup: paused");
    let table = env.run(&["schedule", "list"]).ok();
    assert!(table.contains("paused"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(env.run(&["schedule", "list", "--json"]).ok().trim()).unwrap();
    assert_eq!(json["paused"], true);
    assert_eq!(json["cron"], "0 3 * * *");
    assert_eq!(json["time_zone"], "UTC");

    let out = env.run(&["schedule", "resume", "backup"]).ok();
    assert!(
        out.starts_with("resumed schedule backup: next tick"),
        "{out}"
    );
    assert!(!env.queue().get_schedule("backup").unwrap().paused);
    let out = env.run(&["schedule", "pause", "backup"]).ok();
    assert_eq!(out.trim(), "paused schedule backup");

    // Preview a stored schedule: its zone, its ticks.
    let out = env
        .run(&["schedule", "next", "backup", "-n", "3", "--utc"])
        .ok();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for line in &lines {
        assert!(line.contains("03:00:00 UTC"), "{out}");
    }

    let out = env.run(&["schedule", "rm", "backup"]).ok();
    assert!(out.contains("deleted schedule backup"), "{out}");
    assert!(env.queue().list_schedules().unwrap().is_empty());
}

#[test]
fn next_previews_a_cron_expression_in_a_zone_without_a_queue_file() {
    let env = Env::new();
    let out = env
        .run(&[
            "schedule",
            "next",
            "30 2 * * *",
            "-n",
            "4",
            "--tz",
            "America/New_York",
            "--utc",
        ])
        .ok();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let mut previous = String::new();
    for line in &lines {
        // UTC first, then the wall clock of the zone.
        assert!(line.contains(" UTC  ("), "{out}");
        assert!(line.contains("America/New_York)"), "{out}");
        let wall = line.split('(').nth(1).unwrap();
        assert!(
            wall.contains(" 02:30:00 -0") || wall.contains(" 03:00:00 -04:00"),
            "{out}"
        );
        assert!(line[..19] > *previous, "{out}");
        previous = line[..19].to_owned();
    }
    assert!(!env.db.exists(), "a preview creates no queue file");

    let out = env.run(&["schedule", "next", "*/15 * * * *"]).ok();
    assert_eq!(out.lines().count(), 10, "{out}");
}

#[test]
fn schedule_errors() {
    let env = Env::new();
    env.run(&["init"]).ok();
    env.run(&["schedule", "add", "x", "61 * * * *", "k"])
        .fails(2, &["invalid cron expression \"61 * * * *\"", "5 fields"]);
    env.run(&["schedule", "add", "x", "0 0 30 2 *", "k"])
        .fails(2, &["invalid cron expression"]);
    env.run(&[
        "schedule",
        "add",
        "x",
        "* * * * *",
        "k",
        "--tz",
        "Mars/Olympus",
    ])
    .fails(2, &["unknown time zone \"Mars/Olympus\"", "IANA"]);
    env.run(&[
        "schedule",
        "add",
        "x",
        "* * * * *",
        "k",
        "--misfire",
        "fire-all",
    ])
    .fails(2, &["--misfire-limit"]);
    env.run(&["schedule", "next", "* * * *", "--tz", "UTC"])
        .fails(2, &["invalid cron expression"]);
    assert!(env.queue().list_schedules().unwrap().is_empty());

    for args in [
        &["schedule", "rm", "nope"][..],
        &["schedule", "pause", "nope"],
        &["schedule", "resume", "nope"],
    ] {
        env.run(args)
            .fails(1, &["no schedule named \"nope\"", "tickler schedule list"]);
    }
    env.run(&["schedule", "next", "nope"])
        .fails(1, &["no schedule named \"nope\"", "quote all its fields"]);
    env.run(&["schedule", "add", "s", "* * * * *", "k"]).ok();
    env.run(&["schedule", "next", "s", "--tz", "UTC"])
        .fails(2, &["--tz is for a cron expression"]);
    assert_eq!(env.run(&["schedule", "add", "only-a-name"]).code, 2);
}

#[test]
fn work_fires_a_schedule_of_shell_jobs() {
    let env = Env::new();
    env.run(&[
        "schedule",
        "add",
        "every-second",
        "* * * * * *",
        "shell",
        r#"{"argv": ["sh", "-c", "echo tick >> ticks.txt"]}"#,
    ])
    .ok();
    let child = env.spawn(&["work", "--lease", "2s"]);
    let file = env.dir.path().join("ticks.txt");
    let count = || std::fs::read_to_string(&file).map_or(0, |t| t.lines().count());
    eventually(Duration::from_secs(15), "two ticks", || count() >= 2);
    signal(&child, libc::SIGTERM);
    let run = wait_for(child, Duration::from_secs(10));
    assert_eq!(run.code, 0, "{run:#?}");

    let n = count();
    let done = env.in_state(JobState::Succeeded);
    assert_eq!(done.len(), n);
    let keys: std::collections::BTreeSet<_> = done.iter().map(|j| j.unique_key.clone()).collect();
    assert_eq!(keys.len(), n, "one job per tick");
    assert!(done.iter().all(|j| j
        .unique_key
        .as_deref()
        .is_some_and(|k| k.starts_with("tickler:schedule:every-second:"))));
    let last = env
        .queue()
        .get_schedule("every-second")
        .unwrap()
        .last_tick_at;
    assert!(last.is_some());
}

#[test]
fn a_schedule_added_with_a_limit_gives_it_to_every_tick() {
    let env = Env::new();
    env.run(&[
        "schedule",
        "add",
        "sync-42",
        "*/5 * * * *",
        "sync",
        "--limit",
        "sync:account-42",
        "--limit-weight",
        "2",
    ])
    .ok();
    let stored = env.queue().get_schedule("sync-42").unwrap();
    assert_eq!(
        stored.limit.map(|l| (l.name, l.key, l.weight)),
        Some(("sync".into(), "account-42".into(), 2))
    );
    let json: serde_json::Value =
        serde_json::from_str(env.run(&["schedule", "list", "--json"]).ok().trim()).unwrap();
    assert_eq!(json["limit"]["key"], "account-42", "{json}");
    // A weight without a limit means nothing: refused as a usage error.
    let out = env.run(&[
        "schedule",
        "add",
        "x",
        "* * * * *",
        "k",
        "--limit-weight",
        "2",
    ]);
    assert_eq!(out.code, 2, "{out:?}");
}
