//! The `Queue` methods added for the `tickler` binary: bulk retry of dead
//! jobs, pruning by state, finished-job and unfinished-job counts, WAL size,
//! a file's schema version, and validation without storing.

use crate::support::common;

use common::{manual_queue, ms, secs, t0, temp_db};
use tickler::{Clock, Error, JobId, JobState, NewJob, Queue};

/// Claims the next job of `queue` and fails it for good.
fn kill_next(queue: &Queue, name: &str) -> JobId {
    let lease = queue
        .manual()
        .claim(name, "w", 1, secs(30))
        .unwrap()
        .remove(0);
    queue.manual().fail_permanently(&lease, "broken").unwrap();
    lease.job_id
}

contract! {
fn retry_dead_revives_every_dead_job_of_a_queue_but_not_a_held_unique_key() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    queue.enqueue(NewJob::new("a")).unwrap();
    queue.enqueue(NewJob::new("b").unique_key("k")).unwrap();
    queue.enqueue(NewJob::new("m").queue("mail")).unwrap();
    let a = kill_next(&queue, "default");
    let b = kill_next(&queue, "default");
    let m = kill_next(&queue, "mail");
    // A new job now holds b's key.
    let holder = queue.enqueue(NewJob::new("b2").unique_key("k")).unwrap();

    assert_eq!(queue.retry_dead(Some("mail")).unwrap(), (1, 0));
    assert_eq!(queue.get(m).unwrap().state, JobState::Pending);
    assert_eq!(queue.get(a).unwrap().state, JobState::Dead);

    assert_eq!(queue.retry_dead(None).unwrap(), (1, 1));
    let revived = queue.get(a).unwrap();
    assert_eq!((revived.state, revived.attempts), (JobState::Pending, 0));
    assert_eq!(revived.finished_at, None);
    assert_eq!(revived.last_error.as_deref(), Some("broken"));
    assert_eq!(queue.get(b).unwrap().state, JobState::Dead);
    assert_eq!(queue.get(holder).unwrap().state, JobState::Pending);
    assert_eq!(queue.retry_dead(None).unwrap(), (0, 1));
}
}

contract! {
fn retry_dead_with_two_dead_jobs_sharing_a_key_revives_one() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    queue.enqueue(NewJob::new("a").unique_key("k")).unwrap();
    let first = kill_next(&queue, "default");
    queue.enqueue(NewJob::new("a").unique_key("k")).unwrap();
    let second = kill_next(&queue, "default");
    assert_eq!(queue.retry_dead(None).unwrap(), (1, 1));
    assert_eq!(queue.get(first).unwrap().state, JobState::Pending);
    assert_eq!(queue.get(second).unwrap().state, JobState::Dead);
}
}

contract! {
fn prune_state_deletes_only_that_finished_state() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let done = queue.enqueue(NewJob::new("a")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.manual().complete(&lease).unwrap();
    let cancelled = queue.enqueue(NewJob::new("b")).unwrap();
    queue.cancel(cancelled).unwrap();
    queue.enqueue(NewJob::new("c")).unwrap();
    let dead = kill_next(&queue, "default");
    clock.advance(secs(10));

    let cutoff = clock.now();
    assert!(matches!(
        queue.prune_state(cutoff, JobState::Pending),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        queue
            .prune_state(cutoff - chrono::Duration::seconds(20), JobState::Succeeded)
            .unwrap(),
        0
    );
    assert_eq!(queue.prune_state(cutoff, JobState::Succeeded).unwrap(), 1);
    assert!(queue.get(done).is_err());
    assert!(queue.get(cancelled).is_ok() && queue.get(dead).is_ok());
    assert_eq!(queue.prune_state(cutoff, JobState::Dead).unwrap(), 1);
    assert!(queue.get(dead).is_err());
    assert!(queue.get(cancelled).is_ok());
}
}

contract! {
fn finished_since_counts_recent_finishes() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    for _ in 0..3 {
        queue.enqueue(NewJob::new("a")).unwrap();
    }
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    queue.manual().complete(&lease).unwrap();
    clock.advance(secs(120));
    kill_next(&queue, "default");
    assert_eq!(queue.ops().finished_since(t0()).unwrap(), 2);
    assert_eq!(
        queue
            .ops().finished_since(t0() + chrono::Duration::seconds(60))
            .unwrap(),
        1
    );
    assert_eq!(
        queue
            .ops().finished_since(t0() + chrono::Duration::seconds(600))
            .unwrap(),
        0
    );
}
}

contract! {
fn unfinished_counts_scheduled_pending_and_running_of_queues_and_kinds() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    queue.enqueue(NewJob::new("shell")).unwrap();
    queue.enqueue(NewJob::new("shell").delay(secs(60))).unwrap();
    queue.enqueue(NewJob::new("other")).unwrap();
    queue.enqueue(NewJob::new("shell").queue("mail")).unwrap();
    assert_eq!(queue.ops().unfinished(&["default"], None).unwrap(), 3);
    assert_eq!(queue.ops().unfinished(&["default"], Some(&["shell"])).unwrap(), 2);
    assert_eq!(
        queue
            .ops().unfinished(&["default", "mail"], Some(&["shell", "other"]))
            .unwrap(),
        4
    );
    assert_eq!(queue.ops().unfinished(&[], None).unwrap(), 0);
    assert_eq!(queue.ops().unfinished(&["default"], Some(&[])).unwrap(), 0);

    let lease = queue
        .manual().claim_kinds("default", "w", 1, ms(30_000), Some(&["shell"]))
        .unwrap()
        .remove(0);
    assert_eq!(queue.ops().unfinished(&["default"], Some(&["shell"])).unwrap(), 2);
    queue.manual().complete(&lease).unwrap();
    assert_eq!(queue.ops().unfinished(&["default"], Some(&["shell"])).unwrap(), 1);
}
}

contract! {
fn wal_bytes_and_file_schema_version() {
    let (dir, path) = temp_db();
    if common::engine::on_postgres() {
        // By design there is no WAL file of the queue's own to measure,
        // checkpoint or sync: the server's settings make commits durable.
        let queue = Queue::open(common::engine::target(&path)).unwrap();
        queue.enqueue(NewJob::new("a")).unwrap();
        assert_eq!(queue.ops().wal_bytes(), 0);
        assert!(matches!(queue.ops().checkpoint(), Err(Error::Unsupported { .. })));
        queue.sync().expect("sync is a no-op");
        return;
    }
    assert_eq!(tickler::Ops::file_schema_version(&path).unwrap(), None);
    let queue = Queue::open(&path).unwrap();
    queue.enqueue(NewJob::new("a")).unwrap();
    assert!(queue.ops().wal_bytes() > 0);
    queue.ops().checkpoint().unwrap();
    assert_eq!(queue.ops().wal_bytes(), 0);
    assert_eq!(
        tickler::Ops::file_schema_version(&path).unwrap(),
        Some(tickler::Ops::schema_version())
    );

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(tickler::Ops::file_schema_version(&empty).unwrap(), Some(0));
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, "not a database at all ".repeat(100)).unwrap();
    assert!(matches!(
        tickler::Ops::file_schema_version(&junk),
        Err(Error::NotADatabase { .. })
    ));
}
}

contract! {
fn validate_job_checks_without_storing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    assert!(queue.validate_job(&NewJob::new("a")).is_ok());
    assert!(matches!(
        queue.validate_job(&NewJob::new("")),
        Err(Error::EmptyKind)
    ));
    assert!(matches!(
        queue.validate_job(&NewJob::new("a").max_attempts(0)),
        Err(Error::InvalidMaxAttempts)
    ));
    assert!(matches!(
        queue.validate_job(&NewJob::new("a").payload(serde_json::json!("x".repeat(2 << 20)))),
        Err(Error::PayloadTooLarge { .. })
    ));
    assert_eq!(queue.list(&Default::default()).unwrap().len(), 0);
}
}
