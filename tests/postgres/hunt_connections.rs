//! Connections a queue holds on the server, and when it lets them go.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::test_database;
use std::time::{Duration, Instant};
use tickler::{NewJob, Queue};

fn tickler_connections(client: &mut postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'tickler'",
            &[],
        )
        .expect("pg_stat_activity")
        .get(0)
}

/// Connection counts are a recurring complaint against PostgreSQL queues
/// (graphile-worker #119, queue_classic #184: a LISTEN connection per
/// process on top of each pool). A dropped `Queue` leaves nothing behind
/// (tests/contract/queue_drop.rs for SQLite): its pool, listener and notifier close
/// their connections, so an application that opens and closes queues does
/// not run the server out of connections.
#[test]
fn a_dropped_queue_closes_its_connections_soon() {
    let Some(db) = test_database() else { return };
    let mut observer = db.connect();
    for round in 0..3 {
        let queue = Queue::open(db.url()).expect("open");
        let _watcher = queue.watcher().expect("watcher (starts the listener)");
        queue
            .enqueue(NewJob::new("work"))
            .expect("enqueue (starts the notifier)");
        std::thread::sleep(Duration::from_millis(300));
        assert!(tickler_connections(&mut observer) > 0);
        drop(_watcher);
        drop(queue);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = tickler_connections(&mut observer);
            if left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {left} connections still open 3 s after the queue was dropped"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
