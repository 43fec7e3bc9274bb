//! Issue 19: a pool claims ahead of its free threads by time, not by count.
//!
//! With default settings a pool that has seen its handlers return fast
//! claims hundreds of jobs ahead. When those jobs turn out to be long (its
//! threads stay busy), what it claimed ahead must not stay with it: after
//! the holding time (`prefetch_hold`) it hands them back, and it claims none
//! ahead again until one of its threads is free. Another process, idle,
//! then runs them while the first pool's threads are still busy.

use crate::support::pool;
use crate::support::reliability;

use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
use reliability::spawn_child;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tickler::{JobFilter, JobState, NewJob, Queue, WorkerPool, WorkerPoolBuilder};

const THREADS_A: usize = 2;
const LONG_JOBS: usize = 12;
const ENV_DB: &str = "TICKLER_PREFETCH_CHILD_DB";
const ENV_DIR: &str = "TICKLER_PREFETCH_CHILD_DIR";
const CHILD_TEST: &str = "idle_pool_child_process";

/// Pool A with default settings, 2 threads, warmed up by 300 jobs of kind
/// `quick` that return at once: from then on it expects its jobs to be
/// short and claims far ahead. Then 12 jobs of kind `script` that block,
/// all claimed by A (it is the only pool serving them so far).
fn warmed_up_pool(queue: &Queue, rec: &Arc<Recorder>) -> (WorkerPool, Instant) {
    let pool = WorkerPool::builder(queue)
        .threads(THREADS_A)
        .worker_id("pool-a")
        .handler("quick", rec.script())
        .handler("script", rec.script())
        .start()
        .unwrap();
    pool::warm_up(queue, "quick", 300);
    queue
        .enqueue_batch(
            (0..LONG_JOBS)
                .map(|_| NewJob::new("script").payload(json!({"block": true})))
                .collect(),
        )
        .unwrap();
    let enqueued = Instant::now();
    wait_until("pool A runs its long jobs", secs(10), || {
        rec.started() == 300 + THREADS_A
    });
    (pool, enqueued)
}

fn held_by(queue: &Queue, worker: &str) -> usize {
    queue
        .list(&JobFilter {
            state: Some(JobState::Running),
            limit: 1_000,
            ..JobFilter::default()
        })
        .unwrap()
        .iter()
        .filter(|job| job.claimed_by.as_deref() == Some(worker))
        .count()
}

contract! {
fn jobs_claimed_ahead_of_busy_threads_are_handed_back_once() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    let (mut pool, _) = warmed_up_pool(&queue, &rec);
    // It claimed the long jobs ahead (their run time was unknown to it), then
    // handed back those its threads could not start within the holding time.
    wait_until(
        "pool A handed back what it could not start",
        secs(5),
        || pool.stats().handed_back > 0 && pool.in_flight() == THREADS_A,
    );
    let handed_back = pool.stats().handed_back;
    assert!(handed_back <= LONG_JOBS - THREADS_A);
    // Its threads are still busy: it must not claim them again (and hand
    // them back again) for as long as that lasts.
    for _ in 0..20 {
        std::thread::sleep(ms(25));
        assert_eq!(pool.in_flight(), THREADS_A);
        assert_eq!(held_by(&queue, "pool-a"), THREADS_A);
        assert_eq!(
            queue.count(JobState::Pending).unwrap(),
            (LONG_JOBS - THREADS_A) as u64
        );
    }
    assert_eq!(
        pool.stats().handed_back,
        handed_back,
        "pool A claimed the handed-back jobs again while its threads were busy"
    );
    // Handed back with the attempt given back.
    for job in queue
        .list(&JobFilter {
            state: Some(JobState::Pending),
            ..JobFilter::default()
        })
        .unwrap()
    {
        assert_eq!(job.attempts, 0, "job {} lost an attempt", job.id);
    }
    rec.gate.open();
    wait_until("every job ran", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() == (300 + LONG_JOBS) as u64
    });
    pool.shutdown(secs(5));
}
}

contract! {
fn an_idle_process_gets_the_jobs_a_busy_one_claimed_ahead() {
    let (dir, path) = temp_db();
    let queue = open_queue(&path);
    let rec = Recorder::new();
    // Process B is started, and starts its pool once A holds the long jobs.
    let child = spawn_child(
        &crate::support::engine::case_name(module_path!(), CHILD_TEST),
        dir.path(),
        "b",
        &[
            (ENV_DB, path.to_str().unwrap()),
            (ENV_DIR, dir.path().to_str().unwrap()),
        ],
    );
    let mut child = scopeguard(child);
    wait_until("process B is ready", secs(30), || {
        dir.path().join("b.ready").exists()
    });
    let (mut pool, enqueued) = warmed_up_pool(&queue, &rec);
    std::fs::write(dir.path().join("go"), b"").unwrap();
    // B gets what A claimed ahead and cannot start, while A's two threads
    // are still blocked. (Its handler blocks too, until the parent says.)
    let took = wait_until("process B runs the rest", secs(10), || {
        held_by(&queue, "pool-b") == LONG_JOBS - THREADS_A
    });
    assert_eq!(held_by(&queue, "pool-a"), THREADS_A);
    assert_eq!(rec.ended(), 300, "A's long jobs are still running");
    eprintln!(
        "B held the other {} long jobs {:?} after they were enqueued ({:?} of polling); A handed back {}",
        LONG_JOBS - THREADS_A,
        enqueued.elapsed(),
        took,
        pool.stats().handed_back
    );
    std::fs::write(dir.path().join("release"), b"").unwrap();
    rec.gate.open();
    wait_until("every job ran", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() == (300 + LONG_JOBS) as u64
    });
    pool.shutdown(secs(5));
    let status = child.0.wait().unwrap();
    assert!(status.success(), "process B failed: {status}");
}
}

/// Kills the child if the test fails before it ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scopeguard(child: std::process::Child) -> ChildGuard {
    ChildGuard(child)
}

contract! {
/// Process B: a pool (default settings, a thread per long job), started
/// when the parent writes `go`, whose handler blocks until the parent
/// writes `release`, so the test can count what it holds. Does nothing
/// unless started by the test above.
fn idle_pool_child_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let dir = std::path::PathBuf::from(std::env::var_os(ENV_DIR).unwrap());
    let queue = open_queue(Path::new(&db));
    let release = dir.join("release");
    std::fs::write(dir.join("b.ready"), b"").unwrap();
    wait_until("the parent's go", secs(60), || dir.join("go").exists());
    let builder: WorkerPoolBuilder = WorkerPool::builder(&queue)
        .threads(LONG_JOBS)
        .worker_id("pool-b")
        .without_reaper()
        .without_scheduler();
    let mut pool = builder
        .handler("script", move |_: &tickler::JobContext| {
            let until = Instant::now() + secs(30);
            while !release.exists() && Instant::now() < until {
                std::thread::sleep(ms(5));
            }
            Ok::<(), tickler::JobError>(())
        })
        .start()
        .unwrap();
    wait_until("the parent's release", secs(60), || {
        dir.join("release").exists()
    });
    pool.shutdown(secs(10));
}
}
