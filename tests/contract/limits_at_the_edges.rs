//! Time and limits at the edges (issue 13, point 8): a `run_at` before 1970
//! means "due now", a payload limit above what SQLite can store is refused
//! when the queue is opened, and a unique_key has a size cap with a typed
//! error.

use crate::support::common;

use chrono::{TimeZone, Utc};
use common::{manual_queue, secs, t0, temp_db};
use tickler::{Error, JobState, NewJob, Queue, MAX_UNIQUE_KEY_BYTES};

contract! {
fn a_run_at_before_1970_means_due_now() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let at = Utc.with_ymd_and_hms(1960, 1, 1, 0, 0, 0).unwrap();
    let id = queue
        .enqueue(NewJob::new("k").run_at(at))
        .expect("a past time is due now, also before 1970");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.run_at, t0());
    assert_eq!(queue.claim("default", "w", 1, secs(30)).unwrap().len(), 1);
}
}

contract! {
fn a_snooze_before_1970_means_due_now_and_gives_the_attempt_back() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.claim("default", "w", 1, secs(30)).unwrap().remove(0);
    let at = Utc.with_ymd_and_hms(1960, 1, 1, 0, 0, 0).unwrap();
    queue
        .snooze(&lease, at)
        .expect("a past snooze time is due now");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.run_at, t0());
    assert_eq!(job.attempts, 0);
}
}

contract! {
fn a_payload_limit_sqlite_cannot_store_is_refused_at_open() {
    let (_dir, path) = temp_db();
    // PostgreSQL stores at most 1 GB in a value: the same limit holds.
    let path = common::engine::target(&path);
    let err = Queue::builder(&path)
        .max_payload_bytes(2_000_000_000)
        .open()
        .expect_err("SQLite stores at most 1,000,000,000 bytes in a value");
    match &err {
        Error::Config(message) => {
            assert!(message.contains("max_payload_bytes"), "{message}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
    // The largest allowed limit opens.
    Queue::builder(&path)
        .max_payload_bytes(tickler::MAX_PAYLOAD_BYTES_LIMIT)
        .open()
        .expect("the documented largest limit opens");
}
}

contract! { sqlite_only:
/// SQLite only: SQLite's own length limit, lowered by an on_connection hook.
fn a_payload_limit_over_a_lowered_row_limit_is_refused_before_the_file_is_migrated() {
    let (_dir, path) = temp_db();
    let err = Queue::builder(&path)
        .on_connection(|conn| {
            conn.set_limit(
                tickler::rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
                1_500_000,
            )?;
            Ok(())
        })
        .max_payload_bytes(1_000_000)
        .open()
        .expect_err("a row of 1,500,000 bytes cannot hold a payload of 1,000,000 and the rest");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    // Nothing was written: an older binary sharing the file would otherwise
    // find it migrated to a newer schema by a process that then refused to
    // run.
    assert_eq!(Queue::file_schema_version(&path).unwrap(), Some(0));
}
}

contract! {
fn a_unique_key_over_the_cap_is_a_typed_error_and_stores_nothing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let key = "k".repeat(MAX_UNIQUE_KEY_BYTES + 1);
    match queue.enqueue(NewJob::new("k").unique_key(key)) {
        Err(Error::UniqueKeyTooLong { size, limit }) => {
            assert_eq!(size, MAX_UNIQUE_KEY_BYTES + 1);
            assert_eq!(limit, MAX_UNIQUE_KEY_BYTES);
        }
        other => panic!("expected UniqueKeyTooLong, got {other:?}"),
    }
    assert_eq!(common::row_count(&path), 0);
    let at_cap = "k".repeat(MAX_UNIQUE_KEY_BYTES);
    queue
        .enqueue(NewJob::new("k").unique_key(at_cap))
        .expect("a key at the cap is stored");
}
}
