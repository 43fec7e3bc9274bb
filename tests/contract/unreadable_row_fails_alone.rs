//! One row that cannot be decoded never blocks a claim, a `list` or a pool
//!.
//!
//! The bug it guards: a payload nested a few hundred levels deep passed
//! `enqueue` (SQLite's `json_valid` allows 1,000 levels) but could not be
//! read back (serde_json stops at 128), and from then on every claim of
//! its queue and every `list` failed, so the jobs behind it never ran.
//! Enqueue now refuses what cannot be read back; and whatever else makes a
//! row unreadable (a hand edit, an older build, damage) costs that job
//! alone: a claim makes it `dead` with an error naming the column, `list`
//! and `get` show it with [`Job::unreadable`] set.

use crate::support::common;
use crate::support::pool;

use common::{engine, manual_queue, raw, secs, temp_db};
use pool::{wait_until, Recorder};
use serde_json::{json, Value};
use tickler::{Error, Job, JobFilter, JobState, NewJob, WorkerPool, MAX_PAYLOAD_DEPTH};

/// `depth` nested arrays around `0`: `[[[0]]]` has depth 3.
fn nested(depth: usize) -> Value {
    let mut v = json!(0);
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

/// The same nesting as JSON text, built without serde_json (which could not
/// hold it), for writing into a row by hand.
fn nested_text(depth: usize) -> String {
    format!("{}0{}", "[".repeat(depth), "]".repeat(depth))
}

contract! {
fn a_payload_deeper_than_the_limit_is_refused_at_enqueue_and_nothing_is_stored() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let err = queue
        .enqueue(NewJob::new("deep").payload(nested(300)))
        .expect_err("a 300-level payload cannot be read back");
    match err {
        Error::PayloadTooDeep { limit, .. } => assert_eq!(limit, MAX_PAYLOAD_DEPTH),
        other => panic!("expected PayloadTooDeep, got {other:?}"),
    }
    assert_eq!(common::row_count(&path), 0);

    // Exactly at the limit is stored and reads back, through get, list and claim.
    let id = queue
        .enqueue(NewJob::new("deep").payload(nested(MAX_PAYLOAD_DEPTH)))
        .unwrap();
    assert_eq!(queue.get(id).unwrap().payload, nested(MAX_PAYLOAD_DEPTH));
    assert_eq!(queue.list(&JobFilter::default()).unwrap().len(), 1);
    let leases = queue.manual().claim("default", "w", 10, secs(30)).unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].payload, nested(MAX_PAYLOAD_DEPTH));
}
}

contract! {
fn a_deep_schedule_template_is_refused_too() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let err = queue
        .upsert_schedule(tickler::NewSchedule::new("s", "* * * * *", "k").payload(nested(300)))
        .expect_err("a schedule would enqueue an unreadable payload on every tick");
    assert!(matches!(err, Error::PayloadTooDeep { .. }), "{err:?}");
}
}

/// Three jobs; the middle one damaged by hand in the given way.
fn three_jobs_with_a_damaged_middle(
    damage: &str,
) -> (tempfile::TempDir, tickler::Queue, [tickler::JobId; 3]) {
    let (dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let ids = queue
        .enqueue_batch(vec![
            NewJob::new("k").payload(json!({"n": 1})),
            NewJob::new("k").payload(json!({"n": 2})),
            NewJob::new("k").payload(json!({"n": 3})),
        ])
        .unwrap();
    let sql = damage.replace("$ID", &ids[1].0.to_string());
    engine::execute_batch(&path, &sql);
    (dir, queue, [ids[0], ids[1], ids[2]])
}

fn deep_payload_damage() -> String {
    format!(
        "UPDATE tickler_jobs SET payload = '{}' WHERE id = $ID",
        nested_text(300)
    )
}

const BAD_UTF8_KIND: &str = "UPDATE tickler_jobs SET kind = CAST(x'6bff' AS TEXT) WHERE id = $ID";

contract! {
fn a_claim_makes_an_unreadable_job_dead_and_hands_out_the_others() {
    let mut damages = vec![(deep_payload_damage(), "payload")];
    // PostgreSQL refuses text that is not UTF-8, so no row holds it there.
    if engine::on_mysql() {
        // Names are bytes there; no CAST AS TEXT.
        damages.push((BAD_UTF8_KIND.replace("CAST(x'6bff' AS TEXT)", "x'6bff'"), "kind"));
    } else if !engine::on_postgres() {
        damages.push((BAD_UTF8_KIND.to_owned(), "kind"));
    }
    for (damage, column) in damages {
        let (_dir, queue, ids) = three_jobs_with_a_damaged_middle(&damage);
        let leases = queue
            .manual().claim("default", "w", 10, secs(30))
            .unwrap_or_else(|e| panic!("{column}: the claim failed as a whole: {e}"));
        let claimed: Vec<_> = leases.iter().map(|l| l.job_id).collect();
        assert_eq!(claimed, vec![ids[0], ids[2]], "{column}");

        let bad = queue.get(ids[1]).unwrap();
        assert_eq!(bad.state, JobState::Dead, "{column}");
        let error = bad.last_error.clone().unwrap_or_default();
        assert!(
            error.contains(column) && error.contains("could not be read"),
            "{column}: last_error {error:?}"
        );
        assert!(
            bad.unreadable.is_some(),
            "{column}: get must say what is unreadable"
        );
        // Nothing else was touched, and the queue claims on.
        for lease in &leases {
            queue.manual().complete(lease).unwrap();
        }
        assert!(queue
            .manual().claim("default", "w", 10, secs(30))
            .unwrap()
            .is_empty());
    }
}
}

contract! {
fn list_and_get_show_an_unreadable_row_instead_of_failing() {
    let (_dir, queue, ids) = three_jobs_with_a_damaged_middle(&deep_payload_damage());
    let jobs: Vec<Job> = queue
        .list(&JobFilter::default())
        .expect("list must not fail");
    assert_eq!(jobs.len(), 3);
    assert_eq!(jobs[0].payload, json!({"n": 1}));
    assert_eq!(jobs[2].payload, json!({"n": 3}));
    assert!(jobs[0].unreadable.is_none());
    let bad = &jobs[1];
    assert_eq!(bad.id, ids[1]);
    assert_eq!(bad.state, JobState::Pending, "reading changes nothing");
    let what = bad.unreadable.as_deref().expect("unreadable is set");
    assert!(what.contains("payload"), "{what}");
    assert!(queue.get(ids[1]).unwrap().unreadable.is_some());
}
}

contract! {
fn a_pool_runs_the_jobs_behind_an_unreadable_row() {
    let (_dir, path) = temp_db();
    let queue = pool::open_queue(&path);
    let first = queue
        .enqueue(NewJob::new("script").payload(json!({})))
        .unwrap();
    engine::execute_batch(
        &path,
        &format!(
            "UPDATE tickler_jobs SET payload = '{}' WHERE id = {}",
            nested_text(300),
            first.0
        ),
    );
    let behind = queue
        .enqueue_batch(
            (0..20)
                .map(|_| NewJob::new("script").payload(json!({})))
                .collect(),
        )
        .unwrap();
    let rec = Recorder::new();
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("script", rec.script())
        .start()
        .unwrap();
    wait_until("the 20 jobs behind the bad row ran", secs(20), || {
        behind
            .iter()
            .all(|id| queue.get(*id).unwrap().state == JobState::Succeeded)
    });
    pool.shutdown(secs(5));
    assert_eq!(queue.get(first).unwrap().state, JobState::Dead);
    assert!(
        rec.runs_of(first).is_empty(),
        "the unreadable job was never run"
    );
}
}

contract! { sqlite_only:
/// SQLite only: The mapping of a rusqlite error; PostgreSQL's is in
/// src/error.rs.
fn a_check_constraint_failure_is_a_typed_error() {
    let (_dir, path) = temp_db();
    let (_queue, _clock) = manual_queue(&path);
    let sqlite_error = raw(&path)
        .execute(
            "INSERT INTO tickler_jobs (queue, kind, payload, status, run_at, max_attempts, created_at)
             VALUES ('default', 'k', '{}', 'pending', 0, 0, 0)",
            [],
        )
        .expect_err("max_attempts = 0 breaks a CHECK constraint");
    let error = Error::from(sqlite_error);
    assert!(
        matches!(error, Error::ConstraintViolated { .. }),
        "a CHECK failure must be typed, got {error:?}"
    );
    assert!(error.to_string().contains("CHECK"), "{error}");
}
}
