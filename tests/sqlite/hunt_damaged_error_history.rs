//! Hunt (issue 13 review): a row whose `errors` column is damaged.
//!
//! JobRunr#1403: a large stack trace left a job's JSON column cut off
//! (invalid JSON) and from then on the worker crashed on every poll.
//! tickler reads a damaged `errors` leniently (`Job::unreadable`), but its
//! fail, dead and reap statements *write* it with `json_insert`, which
//! SQLite refuses for text that is not JSON. The damage here is made past
//! the CHECK constraint (`PRAGMA ignore_check_constraints`), standing for
//! a hand edit or a disk error, the cases `Job::unreadable` is for.

use crate::support::common;

use common::{fixed_policy, manual_queue_with_policy, raw, secs, temp_db};
use std::path::Path;
use tickler::{JobId, JobState, NewJob, Outcome};

fn damage_errors(path: &Path, id: JobId) {
    raw(path)
        .execute_batch(&format!(
            "PRAGMA ignore_check_constraints = ON;
             UPDATE tickler_jobs SET errors = '[{{\"attempt\": 1, \"at\": 0, \"err' WHERE id = {};
             PRAGMA ignore_check_constraints = OFF;",
            id.0
        ))
        .unwrap();
}

#[test]
fn a_damaged_error_history_is_reported_on_reads() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    damage_errors(&path, id);
    let job = queue.get(id).unwrap();
    assert!(job.unreadable.unwrap().contains("errors"));
}

#[test]
fn a_damaged_error_history_fails_only_its_own_outcome() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    queue
        .enqueue_batch(vec![NewJob::new("k"), NewJob::new("k")])
        .unwrap();
    let leases = queue.claim("default", "w", 2, secs(30)).unwrap();
    damage_errors(&path, leases[0].job_id);
    let results = queue.record_outcomes(&[
        (&leases[0], Outcome::Fail("boom".into())),
        (&leases[1], Outcome::Complete),
    ]);
    let results = results
        .unwrap_or_else(|e| panic!("the whole batch failed because of one damaged row: {e}"));
    assert!(results[1].is_ok(), "{results:?}");
    assert_eq!(
        queue.get(leases[1].job_id).unwrap().state,
        JobState::Succeeded
    );
}

#[test]
fn a_damaged_error_history_does_not_block_the_reaper() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    queue
        .enqueue_batch(vec![NewJob::new("k"), NewJob::new("k")])
        .unwrap();
    let leases = queue.claim("default", "w", 2, secs(30)).unwrap();
    damage_errors(&path, leases[0].job_id);
    clock.advance(secs(60));
    let reaped = queue.reap();
    let healthy = queue.get(leases[1].job_id).unwrap().state;
    assert!(
        healthy != JobState::Running,
        "the healthy job with an expired lease was not taken back (reap returned {reaped:?})"
    );
}

#[test]
fn an_unreadable_row_with_a_damaged_history_does_not_block_claims() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
    let ids = queue
        .enqueue_batch(vec![NewJob::new("k"), NewJob::new("k")])
        .unwrap();
    // The first job's payload is unreadable by serde (too deep) and its
    // history damaged: the claim takes it, finds it unreadable, makes it dead.
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    raw(&path)
        .execute(
            "UPDATE tickler_jobs SET payload = ?1 WHERE id = ?2",
            rusqlite::params![deep, ids[0].0],
        )
        .unwrap();
    damage_errors(&path, ids[0]);
    let claimed = queue.claim("default", "w", 2, secs(30));
    let claimed = claimed.unwrap_or_else(|e| panic!("the claim of the whole queue failed: {e}"));
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job_id, ids[1]);
}
