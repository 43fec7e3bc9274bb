//! Helpers shared by the schedule_* integration tests.
#![allow(dead_code)]

pub use super::engine;

use chrono::{DateTime, TimeZone, Utc};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tickler::{Durability, JobFilter, ManualClock, Queue};

/// A UTC instant.
pub fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

/// A temporary directory and a queue file path inside it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    super::common::temp_db_named("schedules.db")
}

/// A queue on `path` whose clock stands at `start` and moves only by hand;
/// retries wait without jitter (a jittered backoff may be 0 ms, which
/// makes a failed job pending at once, one time in a thousand).
pub fn queue_at(path: &Path, start: DateTime<Utc>) -> (Queue, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(start));
    let queue = Queue::builder(engine::target(path))
        .clock(clock.clone())
        .retry_policy(super::common::fixed_policy())
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue");
    (queue, clock)
}

/// Runs the schedules like a scheduler that is always awake: moves the
/// clock to each next tick up to `until` and fires it.
pub fn run_until(queue: &Queue, clock: &ManualClock, until: DateTime<Utc>) {
    while let Some(next) = queue.manual().next_schedule_tick().unwrap() {
        if next > until {
            break;
        }
        clock.set(next);
        queue.manual().run_due_ticks().unwrap();
    }
    clock.set(until);
    queue.manual().run_due_ticks().unwrap();
}

/// run_at of every job of `kind`, in id (enqueue) order.
pub fn run_ats(queue: &Queue, kind: &str) -> Vec<DateTime<Utc>> {
    queue
        .list(&JobFilter {
            kind: Some(kind.to_owned()),
            limit: 1_000_000,
            ..JobFilter::default()
        })
        .unwrap()
        .into_iter()
        .map(|job| job.run_at)
        .collect()
}

/// `NewSchedule::new` with `OverlapPolicy::Allow`, for the tests of which
/// instants fire: no worker runs in them, so tick jobs pile up unfinished,
/// which the default policy (`Forbid`) would turn into skipped ticks.
pub fn piling(
    name: impl Into<String>,
    cron: impl Into<String>,
    kind: impl Into<String>,
) -> tickler::NewSchedule {
    tickler::NewSchedule::new(name, cron, kind).overlap(tickler::OverlapPolicy::Allow)
}
