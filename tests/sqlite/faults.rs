//! Faults of the disk and the file.
//!
//! - Disk full, simulated with SQLite's `max_page_count` set on every
//!   connection tickler opens (`QueueBuilder::on_connection`): an enqueue,
//!   a batch and a completion that need a page more than allowed fail with
//!   `Error::DiskFull`; nothing committed before is lost (read back through
//!   a fresh `Queue` without the limit); the same queue goes on serving
//!   what fits, and once space returns (reopened without the limit) it works
//!   as before.
//! - A read-only file, a read-only folder: `Error::ReadOnly` at open. Root
//!   (or CAP_DAC_OVERRIDE) writes through permission bits; the tests detect
//!   that and skip those assertions with a note instead of passing falsely.
//! - A file that is not a SQLite database, and a real tickler file truncated
//!   to a fraction of its size: `Error::NotADatabase`, and the bytes on disk
//!   are exactly what they were.

use crate::support::reliability;

use reliability::{permission_bits_are_ignored, secs, temp_db};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use tickler::{Durability, Error, JobFilter, JobId, JobState, NewJob, Queue};

fn open(path: &Path) -> Queue {
    Queue::builder(path)
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue")
}

/// A queue whose every connection may grow the file to at most `pages`.
fn open_limited(path: &Path, pages: i64) -> Queue {
    Queue::builder(path)
        .sqlite(|o| o.durability(Durability::Normal))
        .sqlite(|o| o.on_connection(move |c| c.pragma_update(None, "max_page_count", pages)))
        .open()
        .expect("open queue with max_page_count")
}

/// The file's size in pages, as SQLite counts it (WAL included).
fn page_count(queue: &Queue) -> i64 {
    queue
        .open_connection()
        .unwrap()
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap()
}

fn payload(n: usize, size: usize) -> serde_json::Value {
    serde_json::json!({ "n": n, "filler": "p".repeat(size) })
}

/// Every job in the file, by id.
fn all_jobs(queue: &Queue) -> std::collections::BTreeMap<JobId, tickler::Job> {
    queue
        .list(&JobFilter {
            limit: 1_000_000,
            ..JobFilter::default()
        })
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j))
        .collect()
}

fn integrity(path: &Path) -> String {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn disk_full_during_enqueue_is_a_typed_error_and_loses_nothing() {
    let (_dir, path) = temp_db();
    let before: Vec<JobId> = {
        let queue = open(&path);
        (0..200)
            .map(|n| {
                queue
                    .enqueue(NewJob::new("early").payload(payload(n, 500)))
                    .unwrap()
            })
            .collect()
    };

    // Room for a few dozen more pages, then full.
    let limited = open_limited(&path, page_count(&open(&path)) + 40);
    let mut fitted = Vec::new();
    let full = loop {
        match limited.enqueue(NewJob::new("late").payload(payload(fitted.len(), 2_000))) {
            Ok(id) => fitted.push(id),
            Err(e) => break e,
        }
        assert!(
            fitted.len() < 10_000,
            "max_page_count never stopped the enqueues"
        );
    };
    assert!(
        matches!(full, Error::DiskFull),
        "expected DiskFull, got {full:?}"
    );
    assert!(!fitted.is_empty(), "the limit left no room at all");
    eprintln!("{} enqueues fitted before: {full}", fitted.len());

    // A batch that does not fit is refused whole.
    let batch = (0..50)
        .map(|n| NewJob::new("batch").payload(payload(n, 2_000)))
        .collect();
    let refused = limited.enqueue_batch(batch).unwrap_err();
    assert!(matches!(refused, Error::DiskFull), "{refused:?}");

    // The full queue still serves reads.
    assert_eq!(
        limited.get(before[0]).unwrap().payload,
        payload(0, 500),
        "reads work on a full file"
    );

    // Nothing committed before is lost, nothing of the refused writes is
    // there: read through a queue without the limit.
    let fresh = open(&path);
    let jobs = all_jobs(&fresh);
    assert_eq!(jobs.len(), before.len() + fitted.len());
    for (n, id) in before.iter().enumerate() {
        assert_eq!(jobs[id].payload, payload(n, 500), "job {id}");
        assert_eq!(jobs[id].state, JobState::Pending);
    }
    for (n, id) in fitted.iter().enumerate() {
        assert_eq!(jobs[id].payload, payload(n, 2_000), "job {id}");
    }
    assert!(jobs.values().all(|j| j.kind != "batch"));

    // Space returns: without the limit the queue works as before.
    drop(limited);
    let more: Vec<JobId> = (0..100)
        .map(|n| {
            fresh
                .enqueue(NewJob::new("after").payload(payload(n, 2_000)))
                .unwrap()
        })
        .collect();
    assert_eq!(more.len(), 100);
    let total = before.len() + fitted.len() + more.len();
    let leases = fresh
        .manual()
        .claim("default", "w", total, secs(60))
        .unwrap();
    assert_eq!(leases.len(), total);
    for lease in &leases {
        fresh.manual().complete(lease).unwrap();
    }
    assert_eq!(fresh.count(JobState::Succeeded).unwrap() as usize, total);
    drop(fresh);
    assert_eq!(integrity(&path), "ok");
}

#[test]
fn disk_full_during_completion_is_a_typed_error_and_the_lease_survives_it() {
    let (_dir, path) = temp_db();
    let jobs = 3_000;
    let leases = {
        let queue = open(&path);
        queue
            .enqueue_batch(
                (0..jobs)
                    .map(|n| NewJob::new("work").payload(payload(n, 20)))
                    .collect(),
            )
            .unwrap();
        queue
            .manual()
            .claim("default", "w", jobs, secs(600))
            .unwrap()
    };
    assert_eq!(leases.len(), jobs);

    // Fill the file to its limit, then complete until a completion needs a
    // page that is not there.
    let limited = open_limited(&path, page_count(&open(&path)) + 10);
    let mut filler = 0;
    while limited
        .enqueue(NewJob::new("filler").payload(payload(filler, 1_000)))
        .is_ok()
    {
        filler += 1;
    }
    let mut completed = Vec::new();
    let mut failure = None;
    for lease in &leases {
        match limited.manual().complete(lease) {
            Ok(()) => completed.push(lease.job_id),
            Err(e) => {
                failure = Some((lease, e));
                break;
            }
        }
    }
    let (stuck, error) = failure.expect("every completion fitted: the file never filled up");
    assert!(
        matches!(error, Error::DiskFull),
        "expected DiskFull, got {error:?}"
    );
    eprintln!(
        "{filler} fillers, then {} completions fitted before: {error}",
        completed.len()
    );

    // The failed completion changed nothing: the job is still running under
    // the same lease, which can still be renewed.
    let fresh = open(&path);
    let row = fresh.get(stuck.job_id).unwrap();
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.run_token.as_ref(), Some(&stuck.run_token));
    for id in &completed {
        assert_eq!(
            fresh.get(*id).unwrap().state,
            JobState::Succeeded,
            "job {id}"
        );
    }
    assert_eq!(
        fresh.count(JobState::Running).unwrap() as usize,
        jobs - completed.len()
    );

    // Space returns: the same leases complete now.
    drop(limited);
    for lease in &leases[completed.len()..] {
        fresh.manual().complete(lease).unwrap();
    }
    assert_eq!(fresh.count(JobState::Succeeded).unwrap() as usize, jobs);
    assert_eq!(fresh.count(JobState::Pending).unwrap() as usize, filler);
    drop(fresh);
    assert_eq!(integrity(&path), "ok");
}

/// A tickler file with some jobs, closed.
fn make_db(path: &Path, jobs: usize) {
    let queue = open(path);
    queue
        .enqueue_batch(
            (0..jobs)
                .map(|n| NewJob::new("work").payload(payload(n, 200)))
                .collect(),
        )
        .unwrap();
    let checkpoint = queue.ops().checkpoint().unwrap();
    assert!(checkpoint.complete);
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

const ROOT_NOTE: &str = "running with permission to write through read-only bits (root or CAP_DAC_OVERRIDE): the ReadOnly assertion is skipped; run the tests as an ordinary user to check it";

#[test]
fn a_read_only_file_gives_read_only_at_open() {
    let (_dir, path) = temp_db();
    make_db(&path, 10);
    let bytes = std::fs::read(&path).unwrap();
    set_mode(&path, 0o444);
    let result = Queue::open(&path);
    if permission_bits_are_ignored() {
        eprintln!("NOTE: {ROOT_NOTE} (open gave {:?})", result.as_ref().err());
    } else {
        let e = result.expect_err("opened a read-only file");
        assert!(
            matches!(e, Error::ReadOnly { .. }),
            "expected ReadOnly, got {e:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file changed");
    }
    set_mode(&path, 0o644);
}

#[test]
fn a_read_only_folder_gives_read_only_at_open() {
    let (dir, path) = temp_db();
    make_db(&path, 10);
    assert!(
        !dir.path().join("jobs.db-wal").exists(),
        "the WAL outlived the last connection"
    );
    set_mode(dir.path(), 0o555);
    let existing = Queue::open(&path);
    let new = Queue::open(dir.path().join("new.db"));
    let ignored = permission_bits_are_ignored();
    set_mode(dir.path(), 0o755);
    if ignored {
        eprintln!(
            "NOTE: {ROOT_NOTE} (existing file: {:?}; new file: {:?})",
            existing.as_ref().err(),
            new.as_ref().err()
        );
        return;
    }
    let e = existing.expect_err("opened a file in a read-only folder");
    assert!(
        matches!(e, Error::ReadOnly { .. }),
        "existing file: expected ReadOnly, got {e:?}"
    );
    let e = new.expect_err("created a file in a read-only folder");
    assert!(
        matches!(e, Error::ReadOnly { .. }),
        "new file: expected ReadOnly, got {e:?}"
    );
}

/// Opens `path`, expects `NotADatabase`, and checks the bytes did not change.
fn assert_refused_untouched(path: &Path, what: &str) {
    let bytes = std::fs::read(path).unwrap();
    let result = Queue::open(path);
    let e = result.expect_err(&format!("{what}: opened as a queue"));
    assert!(
        matches!(e, Error::NotADatabase { .. }),
        "{what}: expected NotADatabase, got {e:?}"
    );
    let version = tickler::Ops::file_schema_version(path);
    assert!(
        matches!(version, Err(Error::NotADatabase { .. })),
        "{what}: file_schema_version gave {version:?}"
    );
    assert!(
        std::fs::read(path).unwrap() == bytes,
        "{what}: the file was changed"
    );
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let (_dir, path) = temp_db();
    let text: String = (0..2_000)
        .map(|i| format!("line {i} of my notes\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    assert_refused_untouched(&path, "a text file");

    let (_dir, path) = temp_db();
    let noise: Vec<u8> = (0..64 * 1024).map(|_| fastrand::u8(..)).collect();
    std::fs::write(&path, noise).unwrap();
    assert_refused_untouched(&path, "random bytes");
}

#[test]
fn a_truncated_database_is_refused_and_left_alone() {
    let (dir, original) = temp_db();
    make_db(&original, 2_000);
    let full = std::fs::read(&original).unwrap();
    assert!(
        full.len() > 64 * 1024,
        "the file is too small to cut: {}",
        full.len()
    );
    for (num, den) in [(1, 2), (1, 4), (1, 10), (9, 10)] {
        for page_aligned in [true, false] {
            let mut len = full.len() * num / den;
            if page_aligned {
                len -= len % 4096;
            } else {
                len = len - len % 4096 + 1234;
            }
            let path = dir
                .path()
                .join(format!("cut-{num}-{den}-{page_aligned}.db"));
            std::fs::write(&path, &full[..len]).unwrap();
            assert_refused_untouched(
                &path,
                &format!("cut to {num}/{den} ({len} of {} bytes)", full.len()),
            );
        }
    }
}

/// The bugs these guard (from a hunt through other queues' reports):
/// a row whose `errors` column is damaged.
///
/// JobRunr#1403: a large stack trace left a job's JSON column cut off
/// (invalid JSON) and from then on the worker crashed on every poll.
/// tickler reads a damaged `errors` leniently (`Job::unreadable`), but its
/// fail, dead and reap statements *write* it with `json_insert`, which
/// SQLite refuses for text that is not JSON. The damage here is made past
/// the CHECK constraint (`PRAGMA ignore_check_constraints`), standing for
/// a hand edit or a disk error, the cases `Job::unreadable` is for.
mod damaged_error_histories {
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
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
    fn a_damaged_error_history_is_reported_on_reads() {
        let (_dir, path) = temp_db();
        let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        damage_errors(&path, id);
        let job = queue.get(id).unwrap();
        assert!(job.unreadable.unwrap().contains("errors"));
    }

    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
    fn a_damaged_error_history_fails_only_its_own_outcome() {
        let (_dir, path) = temp_db();
        let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
        queue
            .enqueue_batch(vec![NewJob::new("k"), NewJob::new("k")])
            .unwrap();
        let leases = queue.manual().claim("default", "w", 2, secs(30)).unwrap();
        damage_errors(&path, leases[0].job_id);
        let results = queue.manual().record_outcomes(&[
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
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
    fn a_damaged_error_history_does_not_block_the_reaper() {
        let (_dir, path) = temp_db();
        let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
        queue
            .enqueue_batch(vec![NewJob::new("k"), NewJob::new("k")])
            .unwrap();
        let leases = queue.manual().claim("default", "w", 2, secs(30)).unwrap();
        damage_errors(&path, leases[0].job_id);
        clock.advance(secs(60));
        let reaped = queue.manual().reap();
        let healthy = queue.get(leases[1].job_id).unwrap().state;
        assert!(
            healthy != JobState::Running,
            "the healthy job with an expired lease was not taken back (reap returned {reaped:?})"
        );
    }

    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' reports).
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
        let claimed = queue.manual().claim("default", "w", 2, secs(30));
        let claimed =
            claimed.unwrap_or_else(|e| panic!("the claim of the whole queue failed: {e}"));
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].job_id, ids[1]);
    }
}
