//! Prepared statements outliving the schema they were planned against.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::time::Duration;
use tickler::{NewJob, Queue};

/// graphile-worker #175 ("cached plan must not change result type"): a
/// column's type changed while workers ran (a newer version's migration
/// in a rolling deploy, or an operator's ALTER TABLE); the old workers'
/// cached statements then failed on every use until restarted.
#[test]
fn a_column_type_changed_under_a_running_queue_is_replanned() {
    let Some(db) = test_database() else { return };
    let queue = Queue::builder(db.url())
        .max_connections(2)
        .open()
        .expect("open");
    let id = queue.enqueue(NewJob::new("work")).expect("enqueue");
    // Every pooled connection prepares the statements it runs.
    for _ in 0..4 {
        queue.get(id).expect("get");
        let leases = queue
            .claim("default", "w", 1, Duration::from_secs(30))
            .expect("claim");
        for l in &leases {
            queue.fail(l, "again").expect("fail");
        }
        queue.list(&Default::default()).expect("list");
    }
    db.connect()
        .batch_execute(
            "ALTER TABLE tickler_jobs ALTER COLUMN last_error TYPE varchar(100000);
             ALTER TABLE tickler_jobs ALTER COLUMN queue TYPE varchar(1000)",
        )
        .expect("ALTER TABLE");
    for round in 0..4 {
        let job = queue
            .get(id)
            .unwrap_or_else(|e| panic!("get after ALTER TABLE, round {round}: {e}"));
        assert_eq!(job.id, id);
        queue
            .list(&Default::default())
            .unwrap_or_else(|e| panic!("list after ALTER TABLE, round {round}: {e}"));
        queue
            .enqueue(NewJob::new("work"))
            .unwrap_or_else(|e| panic!("enqueue after ALTER TABLE, round {round}: {e}"));
        let leases = queue
            .claim("default", "w", 1, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("claim after ALTER TABLE, round {round}: {e}"));
        for l in &leases {
            queue.complete(l).expect("complete");
        }
    }
}
