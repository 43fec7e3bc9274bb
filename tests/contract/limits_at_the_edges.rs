//! Time and limits at the edges: a `run_at` before 1970
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
    assert_eq!(queue.manual().claim("default", "w", 1, secs(30)).unwrap().len(), 1);
}
}

contract! {
fn a_snooze_before_1970_means_due_now_and_gives_the_attempt_back() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    let at = Utc.with_ymd_and_hms(1960, 1, 1, 0, 0, 0).unwrap();
    queue
        .manual().snooze(&lease, at)
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
    // PostgreSQL stores at most 1 GB in a value: the same limit holds; on
    // MySQL, where max_allowed_packet lets it through (.ci/mariadb: 1 GB).
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
        .sqlite(|o| o.on_connection(|conn| {
            conn.set_limit(
                tickler::rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
                1_500_000,
            )?;
            Ok(())
        }))
        .max_payload_bytes(1_000_000)
        .open()
        .expect_err("a row of 1,500,000 bytes cannot hold a payload of 1,000,000 and the rest");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    // Nothing was written: an older binary sharing the file would otherwise
    // find it migrated to a newer schema by a process that then refused to
    // run.
    assert_eq!(tickler::Ops::file_schema_version(&path).unwrap(), Some(0));
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

/// Failures reported against other job queues, tried on tickler: they pass
/// and stay as regression tests, each naming the report it follows.
mod other_queues_reports {
    use crate::support::common;
    use chrono::{TimeZone, Utc};
    use common::{fixed_policy, manual_queue_with_policy, secs, temp_db};
    use tickler::{Error, NewJob};

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
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
        let claimed = queue.manual().claim("default", "w", 10, secs(30)).unwrap();
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].job_id, early);
    }
    }

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// Time edges, the lease side: a claim clamps its lease to the storable
    /// range (9999-12-31); a heartbeat asked for a very long extension
    /// should too.
    fn a_very_long_heartbeat_stays_in_the_storable_range() {
        let (_dir, path) = temp_db();
        let (queue, _clock) = manual_queue_with_policy(&path, fixed_policy());
        queue.enqueue(NewJob::new("k")).unwrap();
        let huge = std::time::Duration::from_millis(tickler::MAX_TIMESTAMP_MS as u64);
        let lease = queue.manual().claim("default", "w", 1, huge).unwrap().remove(0);
        let last = Utc.timestamp_millis_opt(tickler::MAX_TIMESTAMP_MS).unwrap();
        assert!(lease.lease_expires_at <= last);
        let renewed = queue.manual().heartbeat(&lease, huge).unwrap();
        assert!(renewed <= last, "heartbeat granted a lease until {renewed}");
    }
    }
}

contract! {
/// Names and unique keys are compared byte for byte: a collation that folds
/// case or ignores trailing spaces (MySQL's default ones do both) would
/// make `mail` and `Mail ` one queue, and let one key hold off another.
fn names_and_keys_that_differ_only_in_case_or_trailing_spaces_are_distinct() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    let names = ["mail", "mail ", "Mail"];
    let ids: Vec<_> = names
        .iter()
        .map(|name| {
            queue
                .enqueue(NewJob::new("k").queue(*name).unique_key(format!("key-{name}")))
                .unwrap()
        })
        .collect();
    assert_eq!(
        ids.iter().collect::<std::collections::BTreeSet<_>>().len(),
        3,
        "a unique key held off another: {ids:?}"
    );
    for (name, id) in names.iter().zip(&ids) {
        let leases = queue.manual().claim(name, "w", 10, secs(30)).unwrap();
        let claimed: Vec<_> = leases.iter().map(|l| l.job_id).collect();
        assert_eq!(claimed, vec![*id], "queue {name:?}");
        assert_eq!(leases[0].queue, *name);
    }
}
}
