//! Every attempt's error is kept, bounded.
//!
//! The bug it guards: only `last_error` was kept, so the story of a job
//! that failed in three different ways showed only the last, and that
//! error stayed on the job after it later succeeded. Now each failed
//! attempt (a handler's error, a permanent failure, an expired lease)
//! appends `{attempt, at, error, worker}` to [`Job::errors`], the last
//! [`ERROR_HISTORY_MAX`] are kept, and success clears `last_error` only.

use crate::support::cli;
use crate::support::common;

use cli::Env;
use common::{fixed_policy, manual_queue_with_policy, secs, t0, temp_db};
use tickler::{JobState, NewJob, ERROR_HISTORY_MAX};

contract! {
fn each_failed_attempt_is_kept_with_its_time_and_worker_and_success_clears_last_error() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k").max_attempts(5)).unwrap();

    let lease = queue
        .manual().claim("default", "worker-a", 1, secs(30))
        .unwrap()
        .remove(0);
    queue.manual().fail(&lease, "connection refused").unwrap();
    clock.advance(secs(5));
    let lease = queue
        .manual().claim("default", "worker-b", 1, secs(30))
        .unwrap()
        .remove(0);
    clock.advance(secs(31));
    assert_eq!(queue.manual().reap().unwrap(), 1, "lease of attempt 2 expired");
    clock.advance(secs(5));
    let lease3 = queue
        .manual().claim("default", "worker-c", 1, secs(30))
        .unwrap()
        .remove(0);
    assert!(
        queue.manual().fail(&lease, "too late").is_err(),
        "attempt 2's holder is fenced"
    );
    queue.manual().fail(&lease3, "HTTP 503").unwrap();
    clock.advance(secs(5));
    let lease = queue
        .manual().claim("default", "worker-d", 1, secs(30))
        .unwrap()
        .remove(0);
    queue.manual().complete(&lease).unwrap();

    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.last_error, None, "success clears last_error");
    let story: Vec<(u32, &str, Option<&str>)> = job
        .errors
        .iter()
        .map(|e| (e.attempt, e.error.as_str(), e.worker.as_deref()))
        .collect();
    assert_eq!(story.len(), 3, "{story:?}");
    assert_eq!(story[0], (1, "connection refused", Some("worker-a")));
    assert_eq!(story[1].0, 2);
    assert!(story[1].1.contains("lease expired"), "{story:?}");
    assert_eq!(story[1].2, Some("worker-b"));
    assert_eq!(story[2], (3, "HTTP 503", Some("worker-c")));
    assert_eq!(job.errors[0].at, t0());
    assert_eq!(job.errors[2].at, t0() + chrono::Duration::seconds(41));
}
}

contract! {
fn a_permanent_failure_is_kept_too_and_a_manual_retry_keeps_the_history() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.manual().fail_permanently(&lease, "bad input").unwrap();
    queue.retry(id).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.manual().fail_permanently(&lease, "still bad").unwrap();
    let job = queue.get(id).unwrap();
    let errors: Vec<(u32, &str)> = job
        .errors
        .iter()
        .map(|e| (e.attempt, e.error.as_str()))
        .collect();
    assert_eq!(errors, vec![(1, "bad input"), (1, "still bad")]);
}
}

contract! {
fn the_history_keeps_the_last_entries_up_to_its_bound() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let attempts = ERROR_HISTORY_MAX + 5;
    let id = queue
        .enqueue(NewJob::new("k").max_attempts(attempts as u32))
        .unwrap();
    for n in 1..=attempts {
        let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
        queue.manual().fail(&lease, &format!("failure {n}")).unwrap();
        clock.advance(secs(120));
    }
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Dead);
    assert_eq!(job.errors.len(), ERROR_HISTORY_MAX);
    assert_eq!(job.errors[0].error, "failure 6");
    assert_eq!(job.errors[0].attempt, 6);
    assert_eq!(
        job.errors.last().unwrap().error,
        format!("failure {attempts}")
    );
    assert_eq!(
        job.last_error.as_deref(),
        Some(format!("failure {attempts}").as_str())
    );
}
}

contract! {
fn show_and_list_json_print_the_history() {
    let env = Env::new();
    let queue = env.queue();
    let id = queue.enqueue(NewJob::new("k").max_attempts(3)).unwrap();
    let lease = queue
        .manual().claim("default", "mailer-1", 1, secs(30))
        .unwrap()
        .remove(0);
    queue
        .manual().fail(&lease, "first: timeout talking to smtp")
        .unwrap();
    drop(queue);

    let shown = env.run(&["show", &id.to_string()]).ok();
    assert!(
        shown.contains("#1 at") && shown.contains("by mailer-1: first: timeout talking to smtp"),
        "{shown}"
    );
    let json = env.run(&["show", &id.to_string(), "--json"]).ok();
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["errors"][0]["attempt"], 1);
    assert_eq!(value["errors"][0]["worker"], "mailer-1");
    assert_eq!(
        value["errors"][0]["error"],
        "first: timeout talking to smtp"
    );
    let listed = env.run(&["list", "--json"]).ok();
    let line: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(line["errors"][0]["error"], "first: timeout talking to smtp");
}
}

/// Failures reported against other job queues, tried on tickler: they pass
/// and stay as regression tests, each naming the report it follows.
mod other_queues_reports {
    use crate::support::common;
    use common::{engine, fixed_policy, manual_queue_with_policy, secs, temp_db};
    use tickler::{JobState, NewJob, ERROR_HISTORY_MAX, MAX_ERROR_BYTES};

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// taskforcesh/bullmq#907 (a stack trace appended on every retry grows the
    /// job without bound) and seomoz/qless-core#7 (a job that used up its
    /// retries lost its failure details).
    fn the_error_history_is_bounded_and_survives_death() {
        let (_dir, path) = temp_db();
        let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
        let id = queue.enqueue(NewJob::new("k").max_attempts(30)).unwrap();
        for attempt in 1..=30u32 {
            let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
            let trace = format!("attempt {attempt}\n{}", "at frame\n".repeat(20_000));
            queue.manual().fail(&lease, &trace).unwrap();
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
    /// The bug it guards (from a hunt through other queues' reports):
    /// The same with control characters, which JSON escapes as `\u00XX` (six
    /// bytes each): the history on disk is about 6 x 20 x 8 KiB, still under
    /// the 1 MiB a row keeps beside its payload (`ROW_HEADROOM`).
    fn the_stored_history_of_control_character_errors_stays_under_the_row_headroom() {
        let (_dir, path) = temp_db();
        let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
        let id = queue.enqueue(NewJob::new("k").max_attempts(25)).unwrap();
        for _ in 0..25 {
            let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
            queue.manual().fail(&lease, &"\u{1}".repeat(100_000)).unwrap();
            clock.advance(secs(120));
        }
        let stored = stored_history_bytes(&path, id);
        eprintln!("stored history: {stored} bytes");
        assert!(stored < 1024 * 1024 - 64 * 1024, "{stored}");
        assert!(queue.get(id).unwrap().unreadable.is_none());
    }
    }

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
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
            let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
            queue.manual().fail(&lease, text).unwrap();
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

    /// Bytes of the job's `errors` column as stored (JSON text).
    fn stored_history_bytes(path: &std::path::Path, id: tickler::JobId) -> i64 {
        // MySQL has no CAST AS TEXT; its `errors` is text already.
        let sql = if engine::on_mysql() {
            "SELECT length(errors) FROM tickler_jobs WHERE id = ?1"
        } else {
            "SELECT length(CAST(errors AS TEXT)) FROM tickler_jobs WHERE id = ?1"
        };
        engine::query_int(path, sql, &[id.0.into()])
    }
}
