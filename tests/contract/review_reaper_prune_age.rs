//! Review: reaper.rs computes the prune cutoff as
//! `now - chrono::Duration::from_std(age).unwrap_or_default()`.
//! - An age too large for chrono's TimeDelta (e.g. `Duration::MAX`, "keep
//!   for ever") becomes ZERO: every finished job is deleted at once.
//! - An age that fits TimeDelta but not the calendar (e.g. 10^13 s) makes
//!   `DateTime - TimeDelta` panic inside the reaper thread: the thread dies
//!   and nothing is reaped any more, so jobs of dead workers stay `running`
//!   for ever.

use crate::support::common;

use chrono::Utc;
use std::sync::Arc;
use std::time::Duration;
use tickler::{Durability, JobState, ManualClock, NewJob, Queue, Reaper, ReaperConfig};

fn queue(dir: &tempfile::TempDir, clock: Arc<ManualClock>) -> Queue {
    Queue::builder(common::engine::target(&dir.path().join("q.db")))
        .durability(Durability::Normal)
        .clock(clock)
        .open()
        .unwrap()
}

contract! {
fn keep_for_ever_does_not_prune_everything() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let queue = queue(&dir, clock.clone());
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue
        .claim("default", "w", 1, Duration::from_secs(30))
        .unwrap()
        .remove(0);
    queue.complete(&lease).unwrap();
    clock.advance(Duration::from_secs(60));

    let mut reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: Duration::from_millis(10),
            prune_finished_after: Some(Duration::MAX),
            ..ReaperConfig::default()
        },
    );
    std::thread::sleep(Duration::from_millis(200));
    reaper.stop();
    let found = queue.get(id);
    eprintln!("job finished a minute ago, prune_finished_after = Duration::MAX: {found:?}");
    assert!(
        found.is_ok(),
        "the job was pruned a minute after it finished"
    );
}
}

contract! {
fn a_very_long_prune_age_does_not_stop_reaping() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let queue = queue(&dir, clock.clone());
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    // The holder dies: its lease is never renewed.
    queue
        .claim("default", "dead-worker", 1, Duration::from_secs(1))
        .unwrap();

    let _reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: Duration::from_millis(10),
            // ~317 000 years.
            prune_finished_after: Some(Duration::from_secs(10_000_000_000_000)),
            // The manual clock jumps 5 s below; that is not a step to wait out here.
            clock_step_hold: Duration::ZERO,
        },
    );
    std::thread::sleep(Duration::from_millis(100));
    clock.advance(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    let state = queue.get(id).unwrap().state;
    eprintln!("job of a dead worker, lease expired 4 s ago: {state:?}");
    assert_ne!(
        state,
        JobState::Running,
        "the reaper thread is gone; the job is stuck running"
    );
}
}
