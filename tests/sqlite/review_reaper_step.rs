//! Review: the reaper's clock-step hold compares wall and monotonic time at
//! the top of a pass, but `Queue::reap` reads "now" again later, inside its
//! write transaction, after waiting for the process's write connection (and
//! SQLite's write lock, up to busy_timeout + busy_retry). A forward step
//! that lands while the reaper waits for the lock is not seen by the
//! detector of this pass, and `reap` runs with the stepped time: every live
//! lease is taken back at once, with no hold, and live holders get
//! LeaseLost (their jobs are handed to other workers while they still run).

use chrono::Utc;
use crossbeam_channel::bounded;
use std::sync::Arc;
use std::time::Duration;
use tickler::{Durability, Error, JobState, ManualClock, NewJob, Queue, Reaper, ReaperConfig};

#[test]
fn a_step_during_the_reapers_lock_wait_is_held_off_too() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let queue = Queue::builder(dir.path().join("q.db"))
        .durability(Durability::Normal)
        .clock(clock.clone())
        .open()
        .unwrap();
    let live = queue.enqueue(NewJob::new("k")).unwrap();
    let live_lease = queue
        .claim("default", "live-holder", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    queue.enqueue(NewJob::new("x").queue("other")).unwrap();
    let other = queue
        .claim("other", "test", 1, Duration::from_secs(60))
        .unwrap()
        .remove(0);

    let _reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: Duration::from_millis(10),
            clock_step_hold: Duration::from_secs(5),
            ..ReaperConfig::default()
        },
    );
    std::thread::sleep(Duration::from_millis(100));

    // Some ordinary write holds the write connection for 300 ms (here a
    // complete_with; in production an fsync on slow storage, or another
    // process holding SQLite's write lock).
    let (holding_tx, holding_rx) = bounded::<()>(1);
    let holder = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let _ = queue.complete_with(&other, |_tx| {
                holding_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                Err::<(), _>(Error::aborted("test only held the lock"))
            });
        })
    };
    holding_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100)); // the reaper is now waiting
    clock.advance(Duration::from_secs(3600)); // NTP steps the clock
    holder.join().unwrap();
    std::thread::sleep(Duration::from_millis(100));

    // Within the 5 s hold, the live holder renews its lease.
    let job = queue.get(live).unwrap();
    let beat = queue.heartbeat(&live_lease, Duration::from_secs(30));
    eprintln!(
        "job state {:?}, last_error {:?}, heartbeat {beat:?}",
        job.state, job.last_error
    );
    assert_eq!(
        job.state,
        JobState::Running,
        "taken back inside the clock-step hold"
    );
    assert!(
        beat.is_ok(),
        "live holder lost its lease inside the hold: {beat:?}"
    );
}
