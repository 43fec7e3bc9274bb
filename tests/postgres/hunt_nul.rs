//! Text PostgreSQL refuses: the NUL character.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::time::Duration;
use tickler::{Error, JobFilter, NewJob, NewSchedule, Queue};

fn clear_or_stored<T: std::fmt::Debug>(what: &str, r: tickler::Result<T>) {
    match r {
        Ok(_) | Err(Error::InvalidArgument(_) | Error::UnknownSchedule { .. }) => {}
        Err(e) => panic!("{what}: neither stored nor refused with a clear error: {e:?}"),
    }
}

/// hardbyte/awa #85, sqlg #536: "invalid byte sequence for encoding UTF8:
/// 0x00" from job arguments and names with a NUL character. A payload
/// keeps it (JSON escapes it); names are refused with a clear error; error
/// messages and worker ids are stored with the character replaced.
#[test]
fn nul_characters_are_stored_or_refused_clearly() {
    let Some(db) = test_database() else { return };
    let queue = Queue::open(db.url()).expect("open");
    let payload = serde_json::json!({ "s": "a\u{0}b" });
    let id = queue
        .enqueue(NewJob::new("work").payload(payload.clone()))
        .expect("a payload with NUL is JSON-escaped");
    assert_eq!(queue.get(id).expect("get").payload, payload);
    let lease = queue
        .claim("default", "worker\u{0}1", 1, Duration::from_secs(30))
        .expect("a worker id with NUL")
        .remove(0);
    queue
        .fail(&lease, "broke at \u{0} here")
        .expect("an error text with NUL");
    clear_or_stored("kind", queue.enqueue(NewJob::new("wo\u{0}rk")));
    clear_or_stored(
        "unique_key",
        queue.enqueue(NewJob::new("work").unique_key("k\u{0}")),
    );
    clear_or_stored(
        "schedule name",
        queue.upsert_schedule(NewSchedule::new("nightly\u{0}", "0 3 * * *", "work")),
    );
    clear_or_stored(
        "schedule kind",
        queue.upsert_schedule(NewSchedule::new("nightly", "0 3 * * *", "wo\u{0}rk")),
    );
    clear_or_stored(
        "schedule queue",
        queue.upsert_schedule(NewSchedule::new("nightly2", "0 3 * * *", "work").queue("q\u{0}")),
    );
    clear_or_stored(
        "schedule payload",
        queue.upsert_schedule(
            NewSchedule::new("nightly3", "0 3 * * *", "work").payload(payload.clone()),
        ),
    );
    clear_or_stored("get_schedule", queue.get_schedule("nightly\u{0}"));
    clear_or_stored("delete_schedule", queue.delete_schedule("nightly\u{0}"));
    clear_or_stored(
        "list by kind",
        queue.list(&JobFilter {
            kind: Some("wo\u{0}rk".into()),
            ..Default::default()
        }),
    );
    clear_or_stored(
        "claim",
        queue.claim("q\u{0}", "w", 1, Duration::from_secs(30)),
    );
    clear_or_stored(
        "claim_kinds",
        queue.claim_kinds(
            "default",
            "w",
            1,
            Duration::from_secs(30),
            Some(&["wo\u{0}rk"]),
        ),
    );
}
