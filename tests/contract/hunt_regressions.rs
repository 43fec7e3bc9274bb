//! Hunt (issue 13 review): failures reported against other job queues,
//! tried on tickler; these pass (tickler handles them) and stay as
//! regression tests. The report each one follows is named on the test.

use crate::support::common;

use chrono::{TimeZone, Utc};
use common::{engine, fixed_policy, manual_queue_with_policy, secs, temp_db};
use tickler::{Error, JobState, NewJob, Outcome, ERROR_HISTORY_MAX, MAX_ERROR_BYTES};

contract! {
/// riverqueue/river#1302 (PR #1373): the rescuer overwrote a job that its
/// worker completed between the rescuer's fetch and its update.
fn a_completion_between_the_reapers_two_looks_wins() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    clock.advance(secs(31));
    let now = tickler::Clock::now(&*clock);
    let reaper = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.reap_at(now))
    };
    // The reaper's first look only notes the expired lease; complete in between.
    std::thread::sleep(std::time::Duration::from_millis(30));
    queue.complete(&lease).unwrap();
    assert_eq!(reaper.join().unwrap().unwrap(), 0);
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert!(job.errors.is_empty(), "{:?}", job.errors);
}
}

contract! {
/// riverqueue/riverui#622, procrastinate#1446: retrying a discarded unique
/// job while another live job holds the key hit the unique index (500).
fn retrying_a_dead_job_whose_key_is_taken_is_a_typed_refusal() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let dead = queue
        .enqueue(NewJob::new("k").unique_key("u").max_attempts(1))
        .unwrap();
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.fail(&lease, "boom").unwrap();
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
/// rq/rq#1408, OCA/queue#773: a job cancelled while running was retried
/// when its handler then failed.
fn a_job_cancelled_while_running_is_never_retried() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.cancel(id).unwrap();
    let results = queue
        .record_outcomes(&[(&lease, Outcome::Fail("failed after cancel".into()))])
        .unwrap();
    assert!(
        matches!(results[0], Err(Error::LeaseLost { .. })),
        "{results:?}"
    );
    clock.advance(secs(3600));
    assert_eq!(queue.reap().unwrap(), 0);
    assert!(queue
        .claim("default", "w", 10, secs(30))
        .unwrap()
        .is_empty());
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Cancelled);
    assert!(job.errors.is_empty());
}
}

contract! {
/// taskforcesh/bullmq#907 (a stack trace appended on every retry grows the
/// job without bound) and seomoz/qless-core#7 (a job that used up its
/// retries lost its failure details).
fn the_error_history_is_bounded_and_survives_death() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(30)).unwrap();
    for attempt in 1..=30u32 {
        let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
        let trace = format!("attempt {attempt}\n{}", "at frame\n".repeat(20_000));
        queue.fail(&lease, &trace).unwrap();
        clock.advance(secs(120));
    }
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(job.errors.len(), ERROR_HISTORY_MAX);
    assert_eq!(job.errors.first().unwrap().attempt, 11);
    assert_eq!(job.errors.last().unwrap().attempt, 30);
    assert!(job.errors.iter().all(|e| e.error.len() <= MAX_ERROR_BYTES));
    assert!(job.last_error.unwrap().starts_with("attempt 30"));
    let stored = stored_history_bytes(&path, id);
    // JSON escapes newlines: a little over 20 x 8 KiB on disk.
    assert!(
        stored < (ERROR_HISTORY_MAX * (MAX_ERROR_BYTES * 2 + 512)) as i64,
        "{stored}"
    );
}
}

contract! {
/// The same with control characters, which JSON escapes as `\u00XX` (six
/// bytes each): the history on disk is about 6 x 20 x 8 KiB, still under
/// the 1 MiB a row keeps beside its payload (`ROW_HEADROOM`).
fn the_stored_history_of_control_character_errors_stays_under_the_row_headroom() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(25)).unwrap();
    for _ in 0..25 {
        let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
        queue.fail(&lease, &"\u{1}".repeat(100_000)).unwrap();
        clock.advance(secs(120));
    }
    let stored = stored_history_bytes(&path, id);
    eprintln!("stored history: {stored} bytes");
    assert!(stored < 1024 * 1024 - 64 * 1024, "{stored}");
    assert!(queue.get(id).unwrap().unreadable.is_none());
}
}

contract! {
/// jobrunr/jobrunr#1403 (a cut stack trace left invalid JSON behind) and
/// collectiveidea/delayed_job#1173 (an error message in an odd encoding
/// broke the worker): cuts land on character boundaries, NUL bytes and
/// multi-byte text round-trip, and the history stays readable.
fn odd_error_texts_round_trip_and_keep_the_history_readable() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(3)).unwrap();
    let texts = [
        "nul\0inside \u{1}\u{7f} \"quoted\" \\ back".to_owned(),
        "€😀".repeat(5_000),
    ];
    for text in &texts {
        let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
        queue.fail(&lease, text).unwrap();
        clock.advance(secs(120));
    }
    let job = queue.get(id).unwrap();
    assert!(job.unreadable.is_none(), "{:?}", job.unreadable);
    if engine::on_postgres() {
        // PostgreSQL's text and jsonb cannot hold NUL: the engine stores
        // U+FFFD in its place, by design; the rest round-trips.
        assert_eq!(job.errors[0].error, texts[0].replace('\0', "\u{FFFD}"));
    } else {
        assert_eq!(job.errors[0].error, texts[0]);
    }
    assert!(job.errors[1].error.len() <= MAX_ERROR_BYTES);
    assert!(job.errors[1].error.starts_with("€😀"));
    assert!(job.errors[1].error.ends_with("€😀"));
}
}

contract! {
/// enioka-Haute-Couture/jqm#361 (no run_after past 2038) and timestamp
/// range reports: far-future and pre-1970 due times.
fn due_times_at_the_ends_of_the_calendar() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let y2100 = Utc.with_ymd_and_hms(2100, 1, 1, 0, 0, 0).unwrap();
    let last = Utc.timestamp_millis_opt(tickler::MAX_TIMESTAMP_MS).unwrap();
    let a = queue.enqueue(NewJob::new("k").run_at(y2100)).unwrap();
    let b = queue.enqueue(NewJob::new("k").run_at(last)).unwrap();
    assert_eq!(queue.get(a).unwrap().run_at, y2100);
    assert_eq!(queue.get(b).unwrap().run_at, last);
    let after = last + chrono::Duration::milliseconds(1);
    assert!(matches!(
        queue.enqueue(NewJob::new("k").run_at(after)),
        Err(Error::TimeOutOfRange { .. })
    ));
    assert!(matches!(
        queue.enqueue(NewJob::new("k").delay(std::time::Duration::MAX)),
        Err(Error::TimeOutOfRange { .. })
    ));
    let early = queue
        .enqueue(NewJob::new("k").run_at(chrono::DateTime::<Utc>::MIN_UTC))
        .unwrap();
    let claimed = queue.claim("default", "w", 10, secs(30)).unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job_id, early);
}
}

contract! {
/// Time edges, the lease side: a claim clamps its lease to the storable
/// range (9999-12-31); a heartbeat asked for a very long extension
/// should too.
fn a_very_long_heartbeat_stays_in_the_storable_range() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue.enqueue(NewJob::new("k")).unwrap();
    let huge = std::time::Duration::from_millis(tickler::MAX_TIMESTAMP_MS as u64);
    let lease = queue.claim("default", "w", 1, huge).unwrap().remove(0);
    let last = Utc.timestamp_millis_opt(tickler::MAX_TIMESTAMP_MS).unwrap();
    assert!(lease.lease_expires_at <= last);
    let renewed = queue.heartbeat(&lease, huge).unwrap();
    assert!(renewed <= last, "heartbeat granted a lease until {renewed}");
}
}

/// Bytes of the job's `errors` column as stored (JSON text).
fn stored_history_bytes(path: &std::path::Path, id: tickler::JobId) -> i64 {
    engine::query_int(
        path,
        "SELECT length(CAST(errors AS TEXT)) FROM tickler_jobs WHERE id = ?1",
        &[id.0.into()],
    )
}
