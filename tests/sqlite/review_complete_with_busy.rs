//! Review: `Queue::complete_with` says "Only a busy BEGIN is retried, before
//! app_writes ran; a busy later on ... fails the call." In fact a busy-class
//! error (SQLITE_BUSY / SQLITE_LOCKED) returned from inside `app_writes`
//! makes `write_locked` retry the closure; the second run finds
//! `app_writes` already taken and returns `Error::Busy { waited_ms: 0 }`,
//! which is itself `is_busy()`, so the loop spins with backoff for the whole
//! busy_timeout + busy_retry window (30 s by default) and finally returns
//! `Error::Busy`, hiding the application's real error.

use std::time::{Duration, Instant};
use tickler::{Durability, Error, NewJob, Queue};

#[test]
fn locked_error_inside_app_writes_is_reported_at_once_not_after_the_busy_window() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder(dir.path().join("q.db"))
        .durability(Durability::Normal)
        .busy_timeout(Duration::from_millis(200))
        .busy_retry(Duration::from_secs(3))
        .open()
        .unwrap();
    let conn = queue.open_connection().unwrap();
    conn.execute_batch("CREATE TABLE app (x INTEGER); INSERT INTO app VALUES (1), (2);")
        .unwrap();
    drop(conn);
    queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue
        .claim("default", "w", 1, Duration::from_secs(60))
        .unwrap()
        .remove(0);

    let started = Instant::now();
    let result = queue.complete_with(&lease, |tx| {
        // An ordinary SQLite error from application code: DROP TABLE while a
        // statement on it is still active gives SQLITE_LOCKED
        // ("database table is locked").
        let mut stmt = tx.prepare("SELECT x FROM app")?;
        let mut rows = stmt.query([])?;
        let _ = rows.next()?;
        tx.execute("DROP TABLE app", [])?;
        Ok(())
    });
    let took = started.elapsed();
    eprintln!("complete_with returned after {took:?}: {result:?}");
    assert!(
        !matches!(result, Err(Error::Busy { .. })),
        "the application's own error was replaced by Error::Busy: {result:?}"
    );
    assert!(
        took < Duration::from_secs(1),
        "complete_with spun for {took:?} before returning"
    );
}
