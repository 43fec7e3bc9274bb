//! Storing, previewing, pausing and deleting schedules; the jobs ticks
//! enqueue; typed errors that store nothing.

use crate::support::schedule;

use schedule::{piling, queue_at, run_ats, run_until, temp_db, utc};
use std::time::Duration;
use tickler::{Error, JobState, Limit, LimitSlot, MisfirePolicy, NewJob, NewSchedule};

contract! {
fn a_tick_enqueues_the_template_due_at_the_tick_with_a_unique_key() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 6, 1, 8, 59, 0));
    let stored = queue
        .upsert_schedule(
            NewSchedule::new("report", "0 9 * * *", "make_report")
                .time_zone("Europe/Berlin")
                .payload(serde_json::json!({"format": "pdf"}))
                .queue("reports")
                .priority(7)
                .max_attempts(3)
                .timeout(Duration::from_secs(90)),
        )
        .unwrap();
    // 09:00 CEST = 07:00 UTC, tomorrow (today's has passed).
    assert_eq!(stored.next_tick_at, Some(utc(2026, 6, 2, 7, 0, 0)));
    assert_eq!(stored.misfire, MisfirePolicy::FireOnce);
    assert!(!stored.paused);
    assert_eq!(stored.last_tick_at, None);

    // Not due yet: nothing happens.
    assert!(queue.manual().run_due_ticks().unwrap().jobs.is_empty());
    clock.set(utc(2026, 6, 2, 7, 0, 0));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(run.next_tick_at, Some(utc(2026, 6, 3, 7, 0, 0)));
    let job = queue.get(run.jobs[0]).unwrap();
    assert_eq!(job.kind, "make_report");
    assert_eq!(job.queue, "reports");
    assert_eq!(job.priority, 7);
    assert_eq!(job.max_attempts, 3);
    assert_eq!(job.timeout, Some(Duration::from_secs(90)));
    assert_eq!(job.payload, serde_json::json!({"format": "pdf"}));
    assert_eq!(job.run_at, utc(2026, 6, 2, 7, 0, 0));
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(
        job.unique_key.as_deref(),
        Some(
            format!(
                "tickler:schedule:report:{}",
                utc(2026, 6, 2, 7, 0, 0).timestamp_millis()
            )
            .as_str()
        )
    );
    let schedule = queue.get_schedule("report").unwrap();
    assert_eq!(schedule.last_tick_at, Some(utc(2026, 6, 2, 7, 0, 0)));
    assert_eq!(schedule.next_tick_at, Some(utc(2026, 6, 3, 7, 0, 0)));
}
}

contract! {
fn a_schedule_that_names_a_limit_gives_every_ticks_job_a_slot_of_it() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 6, 1, 8, 59, 0));
    queue.set_limit("sync", Limit::per_key(1)).unwrap();
    let stored = queue
        .upsert_schedule(NewSchedule::new("sync-a", "0 9 * * *", "sync").limit("sync", "a"))
        .unwrap();
    let slot = Some(LimitSlot {
        name: "sync".into(),
        key: "a".into(),
        weight: 1,
    });
    assert_eq!(stored.limit, slot);
    assert_eq!(queue.get_schedule("sync-a").unwrap().limit, slot);
    // A sync of the same account enqueued by hand holds the key's slot.
    let by_hand = queue
        .enqueue(NewJob::new("sync").limit("sync", "a"))
        .unwrap();
    let lease = Duration::from_secs(60);
    let held = queue.manual().claim("default", "w", 1, lease).unwrap();
    assert_eq!(held[0].job_id, by_hand);
    clock.set(utc(2026, 6, 1, 9, 0, 0));
    let run = queue.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(queue.get(run.jobs[0]).unwrap().limit, slot);
    // The tick's job waits for it rather than running beside the holder.
    assert!(queue.manual().claim("default", "w", 1, lease).unwrap().is_empty());
    assert_eq!(queue.get(run.jobs[0]).unwrap().state, JobState::Blocked);
    // A weight changes the template; a bad limit stores nothing.
    let heavier = queue
        .upsert_schedule(
            NewSchedule::new("sync-a", "0 9 * * *", "sync")
                .limit("sync", "a")
                .limit_weight(2),
        )
        .unwrap();
    assert_eq!(heavier.limit.map(|l| l.weight), Some(2));
    for bad in [
        NewSchedule::new("bad", "0 9 * * *", "sync")
            .limit("sync", "a")
            .limit_weight(0),
        NewSchedule::new("bad", "0 9 * * *", "sync").limit("", "a"),
    ] {
        let err = queue.upsert_schedule(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    assert!(matches!(
        queue.get_schedule("bad"),
        Err(Error::UnknownSchedule { .. })
    ));
}
}

contract! {
fn a_new_schedule_fires_a_tick_at_exactly_now() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 6, 1, 9, 0, 0));
    let stored = queue
        .upsert_schedule(NewSchedule::new("s", "0 9 * * *", "tick"))
        .unwrap();
    assert_eq!(stored.next_tick_at, Some(utc(2026, 6, 1, 9, 0, 0)));
    assert_eq!(queue.manual().run_due_ticks().unwrap().jobs.len(), 1);
}
}

contract! {
fn paused_schedules_fire_nothing_and_resume_after_the_pause() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 6, 1, 0, 0, 0));
    queue
        .upsert_schedule(piling("s", "0 * * * *", "tick"))
        .unwrap();
    run_until(&queue, &clock, utc(2026, 6, 1, 1, 0, 0));
    queue.pause_schedule("s").unwrap();
    assert!(queue.get_schedule("s").unwrap().paused);
    assert_eq!(queue.manual().next_schedule_tick().unwrap(), None);
    clock.set(utc(2026, 6, 1, 5, 30, 0));
    assert!(queue.manual().run_due_ticks().unwrap().jobs.is_empty());
    queue.resume_schedule("s").unwrap();
    // The ticks of the pause (02:00 … 05:00) are not fired.
    assert_eq!(
        queue.manual().next_schedule_tick().unwrap(),
        Some(utc(2026, 6, 1, 6, 0, 0))
    );
    run_until(&queue, &clock, utc(2026, 6, 1, 7, 0, 0));
    assert_eq!(
        run_ats(&queue, "tick"),
        vec![
            utc(2026, 6, 1, 0, 0, 0),
            utc(2026, 6, 1, 1, 0, 0),
            utc(2026, 6, 1, 6, 0, 0),
            utc(2026, 6, 1, 7, 0, 0)
        ]
    );
}
}

contract! {
fn upsert_keeps_the_next_tick_unless_the_timing_changes() {
    let (_dir, path) = temp_db();
    let (queue, clock) = queue_at(&path, utc(2026, 6, 1, 0, 0, 0));
    queue
        .upsert_schedule(NewSchedule::new("s", "0 * * * *", "tick"))
        .unwrap();
    run_until(&queue, &clock, utc(2026, 6, 1, 0, 0, 0));
    clock.set(utc(2026, 6, 1, 3, 30, 0));
    // Same expression, new payload: the missed ticks stay missed.
    let same = queue
        .upsert_schedule(NewSchedule::new("s", "0 * * * *", "tick").payload(serde_json::json!(1)))
        .unwrap();
    assert_eq!(same.next_tick_at, Some(utc(2026, 6, 1, 1, 0, 0)));
    assert_eq!(same.payload, serde_json::json!(1));
    // A new expression starts from now.
    let changed = queue
        .upsert_schedule(NewSchedule::new("s", "45 * * * *", "tick"))
        .unwrap();
    assert_eq!(changed.next_tick_at, Some(utc(2026, 6, 1, 3, 45, 0)));
    assert_eq!(changed.created_at, same.created_at);
    assert_eq!(queue.list_schedules().unwrap().len(), 1);
}
}

contract! {
fn delete_leaves_enqueued_jobs() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 6, 1, 0, 0, 0));
    queue
        .upsert_schedule(NewSchedule::new("a", "0 * * * *", "tick"))
        .unwrap();
    queue
        .upsert_schedule(NewSchedule::new("b", "30 * * * *", "tick"))
        .unwrap();
    queue.manual().run_due_ticks().unwrap();
    let names: Vec<_> = queue
        .list_schedules()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(queue.delete_schedule("a").unwrap());
    assert!(!queue.delete_schedule("a").unwrap());
    assert_eq!(queue.list_schedules().unwrap().len(), 1);
    assert_eq!(run_ats(&queue, "tick").len(), 1);
}
}

contract! {
fn next_ticks_of_a_stored_schedule_by_name() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    queue
        .upsert_schedule(NewSchedule::new("s", "0 0 L * *", "tick"))
        .unwrap();
    let at: Vec<_> = queue
        .next_ticks("s", 3)
        .unwrap()
        .into_iter()
        .map(|t| t.at)
        .collect();
    assert_eq!(
        at,
        vec![
            utc(2026, 1, 31, 0, 0, 0),
            utc(2026, 2, 28, 0, 0, 0),
            utc(2026, 3, 31, 0, 0, 0)
        ]
    );
    // The nth-weekday extension: second Tuesday of the month.
    let spec = NewSchedule::new("x", "0 12 * * 2#2", "tick");
    assert_eq!(
        queue.next_ticks(&spec, 1).unwrap()[0].at,
        utc(2026, 1, 13, 12, 0, 0)
    );
}
}

contract! {
fn enqueue_in_is_due_after_the_delay() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    let id = queue
        .enqueue_in(NewJob::new("later"), Duration::from_secs(90))
        .unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(job.run_at, utc(2026, 1, 1, 0, 1, 30));
    assert_eq!(job.state, JobState::Scheduled);
}
}

contract! {
fn an_invalid_expression_is_a_typed_error_and_stores_nothing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    for bad in [
        "61 * * * *",
        "* * *",
        "*/0 * * * *",
        "0 0 32 1 *",
        "",
        "every day",
    ] {
        let err = queue
            .upsert_schedule(NewSchedule::new("s", bad, "tick"))
            .unwrap_err();
        match &err {
            Error::InvalidSchedule { expression, reason } => {
                assert_eq!(expression, bad);
                assert!(!reason.is_empty());
            }
            other => panic!("{bad:?}: expected InvalidSchedule, got {other:?}"),
        }
        assert!(err.to_string().contains("5 fields"), "{err}");
        assert!(matches!(
            queue.next_ticks(&NewSchedule::new("s", bad, "tick"), 1),
            Err(Error::InvalidSchedule { .. })
        ));
    }
    assert!(queue.list_schedules().unwrap().is_empty());
}
}

contract! {
fn an_expression_that_never_fires_is_refused() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    for never in ["0 0 30 2 *", "0 0 31 4,6,9,11 *"] {
        let err = queue
            .upsert_schedule(NewSchedule::new("s", never, "tick"))
            .unwrap_err();
        match &err {
            Error::InvalidSchedule { expression, reason } => {
                assert_eq!(expression, never);
                assert!(reason.contains("never fires"), "{reason}");
            }
            other => panic!("expected InvalidSchedule, got {other:?}"),
        }
    }
    // Rare is not never: 29 February.
    queue
        .upsert_schedule(NewSchedule::new("leap", "0 0 29 2 *", "tick"))
        .unwrap();
    assert_eq!(
        queue.get_schedule("leap").unwrap().next_tick_at,
        Some(utc(2028, 2, 29, 0, 0, 0))
    );
    assert_eq!(queue.list_schedules().unwrap().len(), 1);
}
}

contract! {
fn an_unknown_time_zone_is_a_typed_error_and_stores_nothing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    for zone in ["Mars/Olympus_Mons", "europe/berlin", "", "EST5EDT6"] {
        let err = queue
            .upsert_schedule(NewSchedule::new("s", "0 * * * *", "tick").time_zone(zone))
            .unwrap_err();
        match &err {
            Error::UnknownTimeZone { name } => assert_eq!(name, zone),
            other => panic!("expected UnknownTimeZone, got {other:?}"),
        }
        assert!(err.to_string().contains("IANA"), "{err}");
    }
    assert!(queue.list_schedules().unwrap().is_empty());
}
}

contract! {
fn bad_templates_and_settings_are_refused_and_keep_the_stored_schedule() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    let good = queue
        .upsert_schedule(NewSchedule::new("s", "0 * * * *", "tick"))
        .unwrap();
    assert!(matches!(
        queue.upsert_schedule(NewSchedule::new("s", "0 * * * *", "")),
        Err(Error::EmptyKind)
    ));
    assert!(matches!(
        queue.upsert_schedule(NewSchedule::new("s", "0 * * * *", "tick").max_attempts(0)),
        Err(Error::InvalidMaxAttempts)
    ));
    assert!(matches!(
        queue.upsert_schedule(NewSchedule::new("", "0 * * * *", "tick")),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        queue.upsert_schedule(
            NewSchedule::new("s", "0 * * * *", "tick").misfire(MisfirePolicy::FireAll { max: 0 })
        ),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        queue.upsert_schedule(
            NewSchedule::new("s", "0 * * * *", "tick").misfire_grace(Duration::from_secs(7200))
        ),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        queue.upsert_schedule(NewSchedule::new("s", "0 0 30 2 *", "tick")),
        Err(Error::InvalidSchedule { .. })
    ));
    assert_eq!(queue.list_schedules().unwrap(), vec![good]);
}
}

contract! {
fn unknown_schedule_names_are_typed_errors() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = queue_at(&path, utc(2026, 1, 1, 0, 0, 0));
    for result in [
        queue.pause_schedule("nope"),
        queue.resume_schedule("nope"),
        queue.get_schedule("nope").map(|_| ()),
        queue.next_ticks("nope", 1).map(|_| ()),
    ] {
        match result {
            Err(Error::UnknownSchedule { name }) => assert_eq!(name, "nope"),
            other => panic!("expected UnknownSchedule, got {other:?}"),
        }
    }
}
}
