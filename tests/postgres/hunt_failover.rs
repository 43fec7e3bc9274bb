//! A failover that leaves the queue's connections on a read-only server.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::{terminate_connections, test_database};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tickler::{JobState, NewJob, Queue};

fn read_only(db: &pg::TestDb, on: bool) {
    let mut admin = db.connect();
    // Its own session may have started read-only; ALTER DATABASE cannot
    // run in a read-only transaction.
    admin
        .batch_execute("SET default_transaction_read_only = off")
        .expect("SET");
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = {on}",
            db.name()
        ))
        .expect("ALTER DATABASE");
    // Sessions take the setting when they start.
    terminate_connections(db.url(), Some("tickler"));
}

/// JobRunr #1264: during a database upgrade the writer became a reader for
/// a while; state updates failed with "read-only" and jobs stayed
/// `running` until a restart. Here, for a second, every new connection is
/// read-only (as after a failover to a standby), then writable again:
/// enqueues, claims and outcomes ride it out, and the pooled connections
/// that were read-only are not used again.
#[test]
fn a_read_only_second_reaches_no_user_code() {
    let Some(db) = test_database() else { return };
    let queue = Queue::open(db.url()).expect("open");
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (queue, stop) = (queue.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut done = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let id = queue.enqueue(NewJob::new("work")).expect("enqueue");
                for lease in queue
                    .claim("default", "w", 4, Duration::from_secs(30))
                    .expect("claim")
                {
                    queue.complete(&lease).expect("complete");
                }
                done.push(id);
            }
            done
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    read_only(&db, true);
    std::thread::sleep(Duration::from_secs(1));
    read_only(&db, false);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let ids = worker.join().expect("no user call failed");
    for lease in queue
        .claim("default", "w", 100, Duration::from_secs(30))
        .expect("claim")
    {
        queue.complete(&lease).expect("complete");
    }
    for id in ids {
        assert_eq!(queue.get(id).expect("get").state, JobState::Succeeded);
    }
}
