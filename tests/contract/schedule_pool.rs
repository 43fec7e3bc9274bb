//! A worker pool runs the scheduler by default, on the real clock.

use crate::support::schedule;

use schedule::temp_db;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{Durability, JobContext, JobError, NewSchedule, Queue, WorkerPool};

fn queue(path: &std::path::Path) -> Queue {
    Queue::builder(schedule::engine::target(path))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .unwrap()
}

contract! {
fn a_pool_fires_a_per_second_schedule_at_each_tick() {
    let (_dir, path) = temp_db();
    let queue = queue(&path);
    queue
        .upsert_schedule(NewSchedule::new("every-second", "* * * * * *", "tick"))
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let mut pool = WorkerPool::builder(&queue)
        .threads(2)
        .handler("tick", move |ctx: &JobContext| {
            let late = ctx.now() - ctx.lease().run_at;
            log.lock().unwrap().push((ctx.lease().run_at, late));
            Ok::<(), JobError>(())
        })
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(6);
    while seen.lock().unwrap().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    pool.shutdown(Duration::from_secs(2));
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 3, "{seen:?}");
    for pair in seen.windows(2) {
        assert_eq!((pair[1].0 - pair[0].0).num_milliseconds(), 1000, "{seen:?}");
    }
    for (run_at, late) in &seen {
        // Due at exactly a whole second, started soon after it.
        assert_eq!(run_at.timestamp_subsec_millis(), 0);
        assert!(late.num_milliseconds() >= 0, "{seen:?}");
        assert!(late.num_milliseconds() < 900, "{seen:?}");
    }
}
}

contract! {
fn a_pool_without_scheduler_fires_no_tick() {
    let (_dir, path) = temp_db();
    let queue = queue(&path);
    queue
        .upsert_schedule(NewSchedule::new("every-second", "* * * * * *", "tick"))
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .without_scheduler()
        .handler("tick", |_: &JobContext| Ok::<(), JobError>(()))
        .start()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    pool.shutdown(Duration::from_secs(1));
    assert_eq!(queue.stats().unwrap().counts.values().sum::<u64>(), 0);
}
}

contract! {
fn a_scheduler_wakes_when_a_schedule_is_added() {
    let (_dir, path) = temp_db();
    let queue = queue(&path);
    let mut scheduler = tickler::Scheduler::spawn(
        queue.clone(),
        tickler::SchedulerConfig {
            max_idle: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Due now: fires without waiting for max_idle.
    let started = Instant::now();
    queue
        .upsert_schedule(NewSchedule::new("s", "* * * * * *", "tick"))
        .unwrap();
    while queue.stats().unwrap().counts.is_empty() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    scheduler.stop();
}
}
