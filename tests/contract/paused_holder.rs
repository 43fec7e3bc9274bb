//! A holder that stalls past its lease cannot finish the job.
//!
//! A child process (this test binary run again) claims a job with a short
//! lease and keeps it alive with heartbeats. The parent stops the child with
//! SIGSTOP, as a debugger, a swapped-out VM or a stuck disk would, waits
//! until the lease has run out, reaps the job, claims it again from its own
//! `Queue` and completes it. Then it resumes the child with SIGCONT. The
//! child's next heartbeat and its late `complete` must both be refused with
//! `LeaseLost`, and the row must stay exactly as the parent left it.

use crate::support::reliability;

use reliability::{
    child_output, engine, expect_success, ms, secs, signal, spawn_child, temp_db, wait_until,
};
use std::process::Child;
use std::time::Instant;
use tickler::{Durability, Error, NewJob, Queue, RetryPolicy};

const ENV_DB: &str = "TICKLER_PAUSED_HOLDER_DB";
const CHILD: &str = "paused_holder_child";
const LEASE_MS: u64 = 800;

/// SIGCONTs and kills the child if the test fails while it is stopped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            signal(&self.0, libc::SIGCONT);
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// True if no transaction of another connection is open: on SQLite, a
/// write transaction can start on the file within 100 ms; on PostgreSQL,
/// no other session of the database is inside a transaction (a holder
/// frozen inside one would hold its row lock, which the reaper skips).
fn write_lock_is_free(path: &std::path::Path) -> bool {
    if engine::on_postgres() {
        return engine::query_int(
            path,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND state IN ('active', 'idle in transaction')",
            &[],
        ) == 0;
    }
    let conn = rusqlite::Connection::open(path).expect("raw connection");
    conn.busy_timeout(ms(100)).expect("busy timeout");
    conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK").is_ok()
}

/// The `RESULT <what> <outcome>` lines the child printed.
fn child_results(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .filter_map(|l| l.split_once(' '))
        .map(|(what, outcome)| (what.to_owned(), outcome.to_owned()))
        .collect()
}

contract! {
fn a_holder_stopped_past_its_lease_gets_lease_lost_when_it_resumes() {
    let (dir, path) = temp_db();
    // Backoff of 1 ms: the reaped job is due again at once.
    let queue = Queue::builder(engine::target(&path))
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(RetryPolicy {
            base: ms(1),
            cap: ms(1),
            jitter: false,
        })
        .open()
        .unwrap();
    let id = queue
        .enqueue(NewJob::new("report").max_attempts(5))
        .unwrap();

    let child = spawn_child(
        &crate::support::engine::case_name(module_path!(), CHILD),
        dir.path(),
        "holder",
        &[(ENV_DB, path.to_str().unwrap())],
    );
    let mut child = Guard(child);
    wait_until("the child claimed the job", secs(30), || {
        child_output(dir.path(), "holder").contains("CLAIMED")
    });
    let claimed = queue.get(id).unwrap();
    let child_token = claimed.run_token.clone().expect("child's run_token");
    let first_expiry = claimed.lease_expires_at.expect("lease");
    wait_until("a heartbeat of the child landed", secs(10), || {
        queue.get(id).unwrap().lease_expires_at.unwrap() > first_expiry
    });

    // Freeze the holder (not inside one of its heartbeat transactions:
    // frozen there it would hold SQLite's write lock and stall every
    // writer, or PostgreSQL's row lock) and let its lease run out.
    loop {
        signal(&child.0, libc::SIGSTOP);
        if write_lock_is_free(&path) {
            break;
        }
        signal(&child.0, libc::SIGCONT);
        std::thread::sleep(ms(7));
    }
    let stopped_at = Instant::now();
    let expiry = queue.get(id).unwrap().lease_expires_at.unwrap();
    while chrono::Utc::now() <= expiry + chrono::Duration::milliseconds(20) {
        std::thread::sleep(ms(10));
    }
    assert_eq!(queue.manual().reap().unwrap(), 1, "the stale lease was not reaped");

    // A second holder: this process.
    std::thread::sleep(ms(5));
    let leases = queue
        .manual().claim("default", "second-holder", 1, secs(30))
        .unwrap();
    assert_eq!(leases.len(), 1, "the reaped job was not claimable again");
    let mine = &leases[0];
    assert_eq!(mine.job_id, id);
    assert_eq!(mine.attempt, 2);
    assert_ne!(mine.run_token, child_token);
    queue.manual().complete(mine).unwrap();
    let done = queue.get(id).unwrap();

    // Wake the first holder; it tries to go on.
    let stopped_for = stopped_at.elapsed();
    signal(&child.0, libc::SIGCONT);
    expect_success(&mut child.0, dir.path(), "holder", secs(30));
    let out = child_output(dir.path(), "holder");
    let results = child_results(&out);
    eprintln!("child stopped for {stopped_for:?}; it reported {results:?}");
    assert_eq!(
        results,
        vec![
            ("heartbeat".to_owned(), "LeaseLost".to_owned()),
            ("complete".to_owned(), "LeaseLost".to_owned()),
        ],
        "child output:\n{out}"
    );

    // The row is what the second holder wrote, untouched by the first.
    let row = queue.get(id).unwrap();
    assert_eq!(row, done);
    assert_eq!(row.state, tickler::JobState::Succeeded);
    assert_eq!(row.run_token.as_ref(), Some(&mine.run_token));
    assert_eq!(row.claimed_by.as_deref(), Some("second-holder"));
    assert_eq!(row.attempts, 2);
}
}

fn outcome(result: &tickler::Result<impl Sized>) -> &'static str {
    match result {
        Ok(_) => "Ok",
        Err(Error::LeaseLost { .. }) => "LeaseLost",
        Err(_) => "OtherError",
    }
}

contract! {
/// The child side: claim, then heartbeat every 100 ms until a heartbeat is
/// refused (or 60 s pass), then try to complete. Does nothing unless started
/// by the test above.
fn paused_holder_child() {
    let Some(queue) = reliability::child_queue(ENV_DB) else {
        return;
    };
    let leases = queue
        .manual().claim("default", "first-holder", 1, ms(LEASE_MS))
        .unwrap();
    assert_eq!(leases.len(), 1, "nothing to claim");
    let lease = &leases[0];
    println!("CLAIMED {} {}", lease.job_id, lease.run_token);
    let started = Instant::now();
    let mut beats = 0;
    loop {
        std::thread::sleep(ms(100));
        let beat = queue.manual().heartbeat(lease, ms(LEASE_MS));
        if beat.is_err() {
            if let Err(e) = &beat {
                println!("heartbeat refused: {e}");
            }
            println!("RESULT heartbeat {}", outcome(&beat));
            break;
        }
        beats += 1;
        assert!(
            started.elapsed() < secs(60),
            "never stopped: {beats} heartbeats held"
        );
    }
    println!("{beats} heartbeats held before the stop");
    let late = queue.manual().complete(lease);
    if let Err(e) = &late {
        println!("complete refused: {e}");
    }
    println!("RESULT complete {}", outcome(&late));
}
}
