//! Async handlers run as tasks (feature `tokio`): a job awaiting a timer
//! holds a slot of its task lane, not a thread, so a pool runs as many
//! as its async concurrency allows whatever its thread count; a kind
//! given its own concurrency is bounded by it alone; a task that ignores
//! its timeout is aborted and its attempt counted; and a pool lives and
//! dies with its runtime: when the runtime ends under a live pool (dropped,
//! `shutdown_timeout`, the return of `#[tokio::main]`, in this process or
//! in a child that then exits), the jobs it was running go back pending
//! with their attempts given back, nothing more of those kinds is
//! claimed, and a `max_attempts(1)` job is never dead for it.

use crate::support::common;
use crate::support::engine;
use crate::support::pool::{open_queue, secs, temp_db, wait_until};

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tickler::{JobContext, JobError, JobId, JobState, NewJob, Queue, WorkerPool};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Counts the runs going on now, and the most seen at once.
#[derive(Default)]
struct Running {
    now: AtomicUsize,
    most: AtomicUsize,
    ended: AtomicUsize,
}

impl Running {
    fn enter(&self) -> RunGuard<'_> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        RunGuard(self)
    }
}

/// Leaves the count when the run's future ends or is dropped.
struct RunGuard<'a>(&'a Running);

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
}

contract! {
/// 60 jobs each awaiting a 300 ms timer, on a pool of 1 thread with an
/// async concurrency of 20, and a kind of its own with a concurrency of 2:
/// the wide kind reaches 20 at once (a thread per job would cap it at 1)
/// and never more; the narrow one never more than 2.
fn async_jobs_take_slots_of_their_lane_not_threads() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = runtime();
    let (wide, narrow) = (Arc::new(Running::default()), Arc::new(Running::default()));
    let mut pool = {
        let (wide, narrow) = (Arc::clone(&wide), Arc::clone(&narrow));
        WorkerPool::builder(&queue)
            .threads(1)
            .async_concurrency(20)
            .async_concurrency_for("narrow", 2)
            .runtime(rt.handle().clone())
            .async_handler("wide", move |_ctx: JobContext| {
                let wide = Arc::clone(&wide);
                async move {
                    let _in = wide.enter();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<(), JobError>(())
                }
            })
            .async_handler("narrow", move |_ctx: JobContext| {
                let narrow = Arc::clone(&narrow);
                async move {
                    let _in = narrow.enter();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<(), JobError>(())
                }
            })
            .start()
            .unwrap()
    };
    let jobs: Vec<NewJob> = (0..60)
        .map(|i| NewJob::new(if i % 6 == 0 { "narrow" } else { "wide" }))
        .collect();
    queue.enqueue_batch(jobs).unwrap();
    wait_until("every job succeeded", secs(60), || {
        queue.count(JobState::Succeeded).unwrap() == 60
    });
    pool.shutdown(secs(5));
    assert_eq!(wide.most.load(Ordering::SeqCst), 20, "the wide kind's most at once");
    assert!(narrow.most.load(Ordering::SeqCst) <= 2, "the narrow kind ran {} at once",
        narrow.most.load(Ordering::SeqCst));
    assert_eq!(wide.ended.load(Ordering::SeqCst) + narrow.ended.load(Ordering::SeqCst), 60);
}
}

contract! {
/// A task that ignores its cancellation past its timeout plus the grace is
/// aborted (its future dropped at its next `.await`), its job failed as
/// timed out with the attempt counted, and its slot comes back: the next
/// job of a lane of one slot runs.
fn a_task_past_its_timeout_and_grace_is_aborted_and_its_slot_comes_back() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = runtime();
    let running = Arc::new(Running::default());
    let mut pool = {
        let running = Arc::clone(&running);
        WorkerPool::builder(&queue)
            .async_concurrency(1)
            .timeout_grace(Duration::from_millis(200))
            .runtime(rt.handle().clone())
            .async_handler("k", move |ctx: JobContext| {
                let running = Arc::clone(&running);
                async move {
                    let _in = running.enter();
                    if ctx.payload()["stubborn"].as_bool() == Some(true) {
                        // Deaf to ctx.cancelled().
                        tokio::time::sleep(secs(600)).await;
                    }
                    Ok::<(), JobError>(())
                }
            })
            .start()
            .unwrap()
    };
    let stubborn = queue
        .enqueue(
            NewJob::new("k")
                .payload(serde_json::json!({"stubborn": true}))
                .timeout(Duration::from_millis(300))
                .max_attempts(1),
        )
        .unwrap();
    wait_until("the stubborn job started", secs(10), || {
        running.now.load(Ordering::SeqCst) == 1
    });
    let next = queue.enqueue(NewJob::new("k")).unwrap();
    wait_until("the next job ran in the freed slot", secs(20), || {
        queue.get(next).unwrap().state == JobState::Succeeded
    });
    assert_eq!(running.ended.load(Ordering::SeqCst), 2, "the stubborn task was not dropped");
    let job = queue.get(stubborn).unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Dead, 1), "{job:?}");
    let error = job.last_error.unwrap_or_default();
    assert!(error.contains("timed out") && error.contains("task aborted"), "{error}");
    pool.shutdown(secs(5));
}
}

/// How the runtime of a test ends under its live pool.
#[derive(Clone, Copy, Debug)]
enum RuntimeEnd {
    Dropped,
    ShutdownTimeout,
    /// As `#[tokio::main]` does: the pool is started inside `block_on`,
    /// which returns it, and the runtime is dropped after.
    MainReturns,
    /// The same on a `current_thread` runtime (`#[tokio::main(flavor =
    /// "current_thread")]`), whose tasks run only inside `block_on`.
    CurrentThreadMainReturns,
}

/// Jobs of `max_attempts(1)` running on a runtime that ends under the live
/// pool: back to pending, attempts given back, and no other job of the
/// kind is claimed afterwards (it stays pending, unclaimed, its attempt
/// unused), until a pool on a live runtime runs them all once.
fn jobs_running_when_the_runtime_ends_go_back_pending(end: RuntimeEnd) {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let running = Arc::new(Running::default());
    let handler = {
        let running = Arc::clone(&running);
        move |_ctx: JobContext| {
            let running = Arc::clone(&running);
            async move {
                let _in = running.enter();
                tokio::time::sleep(secs(600)).await;
                Ok::<(), JobError>(())
            }
        }
    };
    let ids: Vec<JobId> = (0..3)
        .map(|_| queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap())
        .collect();
    let rt = match end {
        RuntimeEnd::CurrentThreadMainReturns => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime"),
        _ => runtime(),
    };
    let start_pool = |queue: &Queue| {
        WorkerPool::builder(queue)
            .async_handler("k", handler.clone())
            .start()
            .unwrap()
    };
    let mut pool = match end {
        RuntimeEnd::MainReturns | RuntimeEnd::CurrentThreadMainReturns => rt.block_on(async {
            let pool = start_pool(&queue);
            while running.now.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Past the pool's delay before it records a start, so that a
            // crash would count these attempts.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            pool
        }),
        _ => {
            let pool = rt.block_on(async { start_pool(&queue) });
            wait_until("the jobs started", secs(10), || {
                running.now.load(Ordering::SeqCst) == 3
            });
            std::thread::sleep(Duration::from_millis(1500));
            pool
        }
    };
    match end {
        RuntimeEnd::ShutdownTimeout => rt.shutdown_timeout(Duration::from_millis(100)),
        _ => drop(rt),
    }
    assert_eq!(
        running.now.load(Ordering::SeqCst),
        0,
        "tokio dropped the tasks"
    );
    wait_until("the interrupted jobs were handed back", secs(10), || {
        ids.iter()
            .all(|id| queue.get(*id).unwrap().state == JobState::Pending)
    });
    for id in &ids {
        let job = queue.get(*id).unwrap();
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Pending, 0),
            "{end:?}: {job:?}"
        );
    }
    let later = queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let job = queue.get(later).unwrap();
    assert_eq!(
        (job.state, job.attempts, job.claimed_by),
        (JobState::Pending, 0, None),
        "{end:?}: a job enqueued after its runtime ended was claimed"
    );
    pool.shutdown(secs(5));

    // A pool on a live runtime runs each once.
    let rt = runtime();
    let done = Arc::new(AtomicUsize::new(0));
    let mut pool = {
        let done = Arc::clone(&done);
        WorkerPool::builder(&queue)
            .runtime(rt.handle().clone())
            .async_handler("k", move |_ctx: JobContext| {
                let done = Arc::clone(&done);
                async move {
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), JobError>(())
                }
            })
            .start()
            .unwrap()
    };
    wait_until("every job succeeded", secs(20), || {
        queue.count(JobState::Succeeded).unwrap() == 4
    });
    pool.shutdown(secs(5));
    assert_eq!(done.load(Ordering::SeqCst), 4);
}

contract! {
fn jobs_running_when_the_runtime_is_dropped_go_back_pending() {
    jobs_running_when_the_runtime_ends_go_back_pending(RuntimeEnd::Dropped);
}
}

contract! {
fn jobs_running_at_a_runtimes_shutdown_timeout_go_back_pending() {
    jobs_running_when_the_runtime_ends_go_back_pending(RuntimeEnd::ShutdownTimeout);
}
}

contract! {
fn jobs_running_when_a_tokio_main_returns_go_back_pending() {
    jobs_running_when_the_runtime_ends_go_back_pending(RuntimeEnd::MainReturns);
}
}

contract! {
fn jobs_running_when_a_current_thread_tokio_main_returns_go_back_pending() {
    jobs_running_when_the_runtime_ends_go_back_pending(RuntimeEnd::CurrentThreadMainReturns);
}
}

const ENV_DB: &str = "TICKLER_TOKIO_MAIN_CHILD_DB";

contract! {
/// The child of [`a_process_whose_tokio_main_returns_leaves_its_jobs_pending`]
/// (does nothing unless started by it): a `#[tokio::main]` in miniature.
/// Its pool is a local of the async main, its jobs run past the delay
/// before their starts are recorded, and then main returns: the pool is
/// dropped on the runtime's thread, the runtime is dropped, and the
/// process exits.
fn tokio_main_child_process() {
    let Ok(db) = std::env::var(ENV_DB) else {
        return;
    };
    let queue = Queue::open(&db).expect("child: open");
    runtime().block_on(async {
        let _pool = WorkerPool::builder(&queue)
            .async_handler("k", |_ctx: JobContext| async {
                tokio::time::sleep(secs(600)).await;
                Ok::<(), JobError>(())
            })
            .start()
            .unwrap();
        let reads = queue.to_async();
        while reads.count(JobState::Running).await.unwrap() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        eprintln!("child: main returns");
    });
}
}

contract! {
fn a_process_whose_tokio_main_returns_leaves_its_jobs_pending() {
    let (dir, path) = common::temp_db();
    let queue = Queue::open(engine::target(&path)).unwrap();
    let ids: Vec<JobId> = (0..3)
        .map(|_| queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap())
        .collect();
    let stderr = dir.path().join("child.stderr");
    let status = engine::child_case(module_path!(), "tokio_main_child_process")
        .env(ENV_DB, engine::target(&path))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .status()
        .unwrap();
    let said = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(status.success() && said.contains("child: main returns"), "{status}: {said}");
    for id in ids {
        let job = queue.get(id).unwrap();
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Pending, 0),
            "left by a process whose main returned: {job:?}\n{said}"
        );
    }
}
}
