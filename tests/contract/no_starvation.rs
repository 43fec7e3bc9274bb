//! No job waits for ever while its pool makes progress.
//!
//! The bug it guards: a pool serving two queues always claimed from the
//! first one first, and within a queue always took the highest priority,
//! so the other queue's job (or the priority-0 job) waited for as long as
//! the flood lasted while thousands of others ran. Now each queue gets a
//! fair share of every claim, the queue asked first rotates, and one claim
//! in [`DEFAULT_PRIORITY_AGING`] takes the oldest due job whatever its
//! priority (off with `strict_priority`).

use crate::support::common;
use crate::support::pool;

use pool::{open_queue, secs, temp_db, wait_until, Recorder};
use tickler::{JobId, JobState, NewJob, Queue, WorkerPool, DEFAULT_PRIORITY_AGING};

const FLOOD: usize = 300;

/// Where `id` came in the order the pool started jobs (0 = first).
fn start_position(rec: &Recorder, id: JobId) -> usize {
    let mut runs = rec.runs();
    runs.sort_by_key(|r| r.started);
    runs.iter()
        .position(|r| r.job_id == id)
        .expect("the job ran")
}

fn drain(queue: &Queue, rec: &std::sync::Arc<Recorder>, builder: tickler::WorkerPoolBuilder) {
    let mut pool = builder.handler("script", rec.script()).start().unwrap();
    wait_until("every job ran", secs(60), || {
        queue.count(JobState::Succeeded).unwrap() as usize == FLOOD + 1
    });
    pool.shutdown(secs(5));
}

/// One low-priority job, then a flood of high-priority ones, all due.
fn low_then_flood(queue: &Queue) -> JobId {
    let low = queue.enqueue(NewJob::new("script").priority(0)).unwrap();
    queue
        .enqueue_batch(
            (0..FLOOD)
                .map(|_| NewJob::new("script").priority(10))
                .collect(),
        )
        .unwrap();
    low
}

contract! { poolers:
fn a_low_priority_job_starts_early_in_a_flood_of_high_priority_ones() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let low = low_then_flood(&queue);
    let rec = Recorder::new();
    drain(&queue, &rec, WorkerPool::builder(&queue).threads(1));
    let position = start_position(&rec, low);
    assert!(
        position <= DEFAULT_PRIORITY_AGING,
        "the priority-0 job started {position}th of {}",
        FLOOD + 1
    );
}
}

contract! { poolers:
fn strict_priority_keeps_the_old_order() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let low = low_then_flood(&queue);
    let rec = Recorder::new();
    drain(
        &queue,
        &rec,
        WorkerPool::builder(&queue).threads(1).strict_priority(),
    );
    assert_eq!(start_position(&rec, low), FLOOD, "strictly last");
}
}

contract! { poolers:
fn a_second_queue_is_served_during_a_flood_in_the_first() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    queue
        .enqueue_batch(
            (0..FLOOD)
                .map(|_| NewJob::new("script").queue("bulk"))
                .collect(),
        )
        .unwrap();
    let urgent = queue
        .enqueue(NewJob::new("script").queue("urgent"))
        .unwrap();
    let rec = Recorder::new();
    drain(
        &queue,
        &rec,
        WorkerPool::builder(&queue)
            .queue("bulk")
            .queue("urgent")
            .threads(2)
            .prefetch(8),
    );
    let position = start_position(&rec, urgent);
    assert!(
        position < 12,
        "the job of the second queue started {position}th of {}",
        FLOOD + 1
    );
}
}

contract! { poolers:
fn stats_show_the_oldest_due_job_per_queue_and_priority() {
    let (_dir, path) = temp_db();
    let (queue, clock) = common::manual_queue(&path);
    queue.enqueue(NewJob::new("k").priority(0)).unwrap();
    clock.advance(secs(60));
    queue.enqueue(NewJob::new("k").priority(10)).unwrap();
    queue
        .enqueue(NewJob::new("k").queue("other").priority(10))
        .unwrap();
    let stats = queue.stats().unwrap();
    let by = &stats.oldest_due_by_priority;
    assert_eq!(by.len(), 3, "{by:?}");
    assert_eq!(by[&("default".to_owned(), 0)], common::t0());
    assert_eq!(
        by[&("default".to_owned(), 10)],
        common::t0() + chrono::Duration::seconds(60)
    );
}
}
