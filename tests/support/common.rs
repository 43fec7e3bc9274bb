//! Helpers shared by the integration tests. Each test file uses a subset.
#![allow(dead_code)]

pub use super::engine;

use chrono::{DateTime, TimeZone, Utc};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{Durability, ManualClock, Queue, RetryPolicy};

/// A fixed start time for manual clocks: 2024-05-01T12:00:00Z.
pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 1, 12, 0, 0).unwrap()
}

/// `secs` seconds as a Duration.
pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `ms` milliseconds as a Duration.
pub fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// A temporary directory and the path of a queue file inside it, which
/// belongs to the current case's engine (see `engine`).
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    temp_db_named("jobs.db")
}

/// [`temp_db`] with a file name of the caller's.
pub fn temp_db_named(file: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    engine::claim_dir(dir.path());
    let path = dir.path().join(file);
    (dir, path)
}

/// Polls `cond` every 5 ms until it is true; panics naming `what` after
/// `timeout`. Returns how long it took.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        if start.elapsed() >= timeout {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        std::thread::sleep(ms(5));
    }
}

/// A queue on `path` whose clock stands at [`t0`] and only moves by hand.
pub fn manual_queue(path: &Path) -> (Queue, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(t0()));
    let queue = Queue::builder(engine::target(path))
        .clock(clock.clone())
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue");
    (queue, clock)
}

/// As [`manual_queue`], with a retry policy.
pub fn manual_queue_with_policy(path: &Path, policy: RetryPolicy) -> (Queue, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(t0()));
    let queue = Queue::builder(engine::target(path))
        .clock(clock.clone())
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(policy)
        .open()
        .expect("open queue");
    (queue, clock)
}

/// Backoff without jitter: base 1 s, cap 60 s, so delays are predictable.
pub fn fixed_policy() -> RetryPolicy {
    RetryPolicy {
        base: secs(1),
        cap: secs(60),
        jitter: false,
    }
}

/// A plain SQLite connection on the file, beside tickler's own (SQLite-only
/// tests; the others reach either engine through `engine::execute`).
pub fn raw(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("raw open");
    conn.busy_timeout(secs(10)).expect("busy timeout");
    conn
}

/// Number of rows in the jobs table, on either engine.
pub fn row_count(path: &Path) -> i64 {
    engine::row_count(path)
}

/// True if `s` is a lowercase-or-uppercase hex UUID of version 4, RFC 4122 variant.
pub fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 36 {
        return false;
    }
    for (i, c) in b.iter().enumerate() {
        let dash = matches!(i, 8 | 13 | 18 | 23);
        if dash != (*c == b'-') {
            return false;
        }
        if !dash && !c.is_ascii_hexdigit() {
            return false;
        }
    }
    b[14] == b'4' && matches!(b[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}
