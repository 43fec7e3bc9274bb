//! Review: `complete_with` runs `app_writes` while holding the process's
//! write mutex (and SQLite's write lock). Calling any other write of the
//! same `Queue` from inside it, e.g. the natural "complete this job and
//! enqueue the next step" with `queue.enqueue` instead of `enqueue_tx`,
//! re-locks the std Mutex on the same thread: the thread hangs for ever
//! (no error, no panic), and since the enqueue became the EnqueueGroup
//! leader, every later `enqueue` of the process waits behind it too.
//! Nothing in the docs of `complete_with` warns against it (only against
//! "opening its own transaction").

use std::sync::mpsc;
use std::time::Duration;
use tickler::{Durability, NewJob, Queue};

#[test]
fn enqueue_inside_complete_with_returns_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::builder(dir.path().join("q.db"))
        .durability(Durability::Normal)
        .open()
        .unwrap();
    queue.enqueue(NewJob::new("step1")).unwrap();
    let lease = queue
        .claim("default", "w", 1, Duration::from_secs(60))
        .unwrap()
        .remove(0);

    let (done_tx, done_rx) = mpsc::channel();
    {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let r = queue.complete_with(&lease, |_tx| queue.enqueue(NewJob::new("step2")));
            let _ = done_tx.send(format!("{r:?}"));
        });
    }
    let first = done_rx.recv_timeout(Duration::from_secs(3));

    // Meanwhile an unrelated thread's enqueue also hangs.
    let (other_tx, other_rx) = mpsc::channel();
    {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let r = queue.enqueue(NewJob::new("unrelated"));
            let _ = other_tx.send(format!("{r:?}"));
        });
    }
    let second = other_rx.recv_timeout(Duration::from_secs(2));
    eprintln!("complete_with: {first:?}; unrelated enqueue: {second:?}");
    assert!(
        first.is_ok(),
        "complete_with + enqueue hung (self-deadlock on the writer mutex)"
    );
    assert!(
        second.is_ok(),
        "an unrelated enqueue in another thread hung too"
    );
}
