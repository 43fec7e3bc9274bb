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

/// A pool of one async slot for kind `k`, counting its runs in `running`:
/// a job whose payload says `"deaf": true` awaits 10 minutes, deaf to
/// `ctx.cancelled()`; any other returns at once.
fn one_slot_pool(
    queue: &Queue,
    rt: &tokio::runtime::Runtime,
    running: &Arc<Running>,
    grace: Duration,
) -> WorkerPool {
    let running = Arc::clone(running);
    WorkerPool::builder(queue)
        .async_concurrency(1)
        .timeout_grace(grace)
        .runtime(rt.handle().clone())
        .async_handler("k", move |ctx: JobContext| {
            let running = Arc::clone(&running);
            async move {
                let _in = running.enter();
                if ctx.payload()["deaf"].as_bool() == Some(true) {
                    tokio::time::sleep(secs(600)).await;
                }
                Ok::<(), JobError>(())
            }
        })
        .start()
        .unwrap()
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
    let mut pool = one_slot_pool(&queue, &rt, &running, Duration::from_millis(200));
    let stubborn = queue
        .enqueue(
            NewJob::new("k")
                .payload(serde_json::json!({"deaf": true}))
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
    /// Dropped, more than 2 s after a task of the same lane, past the delay
    /// before starts are recorded, was aborted at its timeout: a bound on
    /// waiting for the hand-backs set then must not hold at the next end.
    DroppedAfterAnEarlierAbort,
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
        move |ctx: JobContext| {
            let running = Arc::clone(&running);
            async move {
                if ctx.payload()["deaf"].as_bool() == Some(true) {
                    // Deaf to its cancellation, but awaiting: abortable.
                    loop {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }
                let _in = running.enter();
                tokio::time::sleep(secs(600)).await;
                Ok::<(), JobError>(())
            }
        }
    };
    if let RuntimeEnd::DroppedAfterAnEarlierAbort = end {
        queue
            .enqueue(
                NewJob::new("k")
                    .payload(serde_json::json!({"deaf": true}))
                    .timeout(Duration::from_millis(1300))
                    .max_attempts(1),
            )
            .unwrap();
    }
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
            .timeout_grace(Duration::from_millis(100))
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
            if let RuntimeEnd::DroppedAfterAnEarlierAbort = end {
                wait_until("the deaf job was aborted", secs(10), || {
                    queue.count(JobState::Dead).unwrap() == 1
                });
                std::thread::sleep(Duration::from_millis(2500));
            }
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
    // Read at once, as a process that exits right after its runtime
    // leaves them: the runtime's end waited for the hand-backs.
    for id in &ids {
        let job = queue.get(*id).unwrap();
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Pending, 0),
            "{end:?}: {job:?}"
        );
    }
    let later = queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap();
    let dead_before = queue.count(JobState::Dead).unwrap();
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
    assert_eq!(queue.count(JobState::Dead).unwrap(), dead_before);
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
fn jobs_running_when_the_runtime_is_dropped_after_an_earlier_abort_go_back_pending() {
    jobs_running_when_the_runtime_ends_go_back_pending(RuntimeEnd::DroppedAfterAnEarlierAbort);
}
}

contract! {
fn jobs_running_when_a_current_thread_tokio_main_returns_go_back_pending() {
    jobs_running_when_the_runtime_ends_go_back_pending(RuntimeEnd::CurrentThreadMainReturns);
}
}

const ENV_DB: &str = "TICKLER_TOKIO_MAIN_CHILD_DB";
/// `running`: main returns while its 3 jobs run; `finished`: main returns
/// as soon as its 20 jobs' handlers have all returned `Ok`.
const ENV_MODE: &str = "TICKLER_TOKIO_MAIN_CHILD_MODE";

contract! {
/// The child of the two tests below (does nothing unless started by one):
/// a `#[tokio::main]` in miniature. Its pool is a local of the async main,
/// its jobs run past the delay before their starts are recorded, and then
/// main returns: the pool is dropped on the runtime's thread, the runtime
/// is dropped, and the process exits at once.
fn tokio_main_child_process() {
    let (Ok(db), Ok(mode)) = (std::env::var(ENV_DB), std::env::var(ENV_MODE)) else {
        return;
    };
    let queue = Queue::open(&db).expect("child: open");
    let returned = Arc::new(AtomicUsize::new(0));
    runtime().block_on(async {
        let _pool = {
            let returned = Arc::clone(&returned);
            let lasts = if mode == "running" { secs(600) } else { Duration::from_millis(1200) };
            WorkerPool::builder(&queue)
                .async_handler("k", move |_ctx: JobContext| {
                    let returned = Arc::clone(&returned);
                    async move {
                        tokio::time::sleep(lasts).await;
                        returned.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), JobError>(())
                    }
                })
                .start()
                .unwrap()
        };
        if mode == "running" {
            let reads = queue.to_async();
            while reads.count(JobState::Running).await.unwrap() < 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
        } else {
            // Returns as the last handler does, before the pool can have
            // recorded its outcome.
            while returned.load(Ordering::SeqCst) < 20 {
                tokio::task::yield_now().await;
            }
        }
        eprintln!("child: main returns");
    });
}
}

/// Runs the child in `mode` on the queue of `path` and returns what it
/// printed.
fn run_tokio_main_child(dir: &std::path::Path, path: &std::path::Path, mode: &str) -> String {
    let stderr = dir.join("child.stderr");
    let status = engine::child_case(module_path!(), "tokio_main_child_process")
        .env(ENV_DB, engine::target(path))
        .env(ENV_MODE, mode)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .status()
        .unwrap();
    let said = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(
        status.success() && said.contains("child: main returns"),
        "{status}: {said}"
    );
    said
}

contract! {
fn a_process_whose_tokio_main_returns_leaves_its_jobs_pending() {
    let (dir, path) = common::temp_db();
    let queue = Queue::open(engine::target(&path)).unwrap();
    let ids: Vec<JobId> = (0..3)
        .map(|_| queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap())
        .collect();
    let said = run_tokio_main_child(dir.path(), &path, "running");
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

contract! {
/// The outcomes of handlers that returned before main did are recorded
/// before the process exits: dropping the pool on the runtime's thread
/// waits for them (before, 4 to 20 of 20 succeeded jobs were left running
/// with their attempts counted, dead once taken back).
fn a_process_whose_tokio_main_returns_keeps_the_outcomes_of_its_handlers() {
    let (dir, path) = common::temp_db();
    let queue = Queue::open(engine::target(&path)).unwrap();
    queue
        .enqueue_batch((0..20).map(|_| NewJob::new("k").max_attempts(1)).collect())
        .unwrap();
    let said = run_tokio_main_child(dir.path(), &path, "finished");
    assert_eq!(
        queue.count(JobState::Succeeded).unwrap(),
        20,
        "running {}, pending {}\n{said}",
        queue.count(JobState::Running).unwrap(),
        queue.count(JobState::Pending).unwrap()
    );
}
}

contract! {
/// Jobs of three task lanes and a sync kind, each with its dispatcher, 60
/// deaf tasks of `max_attempts(1)` aborted at staggered timeouts while
/// other jobs keep every dispatcher busy: each aborted run's timeout is
/// recorded before its refused hand-back, so none runs twice. (With one
/// outcome channel for all lanes, two dispatchers took the two and the
/// hand-back committed first in 3 to 6 runs of 30: the job was pending
/// again, its attempt given back.)
fn aborted_runs_are_recorded_in_order_in_a_pool_of_many_lanes() {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = runtime();
    let runs: Arc<Mutex<HashMap<JobId, usize>>> = Arc::default();
    let deaf = |ctx: &JobContext, runs: &Mutex<HashMap<JobId, usize>>| {
        *runs.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
        forever()
    };
    let mut pool = {
        let (runs1, runs2) = (Arc::clone(&runs), Arc::clone(&runs));
        WorkerPool::builder(&queue)
            .threads(1)
            .timeout_grace(Duration::from_millis(20))
            .async_concurrency(100)
            .async_concurrency_for("deaf", 100)
            .async_concurrency_for("deaf2", 100)
            .runtime(rt.handle().clone())
            .handler("sync", |_: &JobContext| Ok::<(), JobError>(()))
            .async_handler("other", |_ctx: JobContext| async { Ok::<(), JobError>(()) })
            .async_handler("deaf", move |ctx: JobContext| deaf(&ctx, &runs1))
            .async_handler("deaf2", move |ctx: JobContext| deaf(&ctx, &runs2))
            .start()
            .unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let noise = {
        let (queue, stop) = (queue.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            for kind in ["other", "sync"].iter().cycle() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                queue.enqueue(NewJob::new(*kind)).unwrap();
            }
        })
    };
    let ids: Vec<JobId> = (0..60u64)
        .map(|i| {
            let kind = if i % 2 == 0 { "deaf" } else { "deaf2" };
            let job = NewJob::new(kind)
                .timeout(Duration::from_millis(100 + i * 23))
                .max_attempts(1);
            queue.enqueue(job).unwrap()
        })
        .collect();
    wait_until("every deaf job is dead", secs(60), || {
        ids.iter().all(|id| queue.get(*id).unwrap().state == JobState::Dead)
    });
    stop.store(true, Ordering::SeqCst);
    noise.join().unwrap();
    pool.shutdown(secs(5));
    let runs = runs.lock().unwrap();
    let again: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(again.is_empty(), "max_attempts(1) jobs ran more than once: {again:?}");
    assert_eq!(runs.len(), 60);
}
}

contract! {
/// A task written off at its timeout that never reaches an `.await` (it
/// blocks its runtime thread) gives its slot back when it is written off,
/// as a replacement thread stands in for a stuck thread: the next job of
/// a lane of one slot runs, and shutdown does not wait for the stuck one.
fn a_stuck_task_gives_its_slot_back_when_written_off() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = runtime();
    let mut pool = WorkerPool::builder(&queue)
        .timeout_grace(Duration::from_millis(100))
        .async_concurrency(1)
        .runtime(rt.handle().clone())
        .async_handler("k", |ctx: JobContext| async move {
            if ctx.payload()["block"].as_bool() == Some(true) {
                std::thread::sleep(secs(4));
            }
            Ok::<(), JobError>(())
        })
        .start()
        .unwrap();
    let stuck = queue
        .enqueue(
            NewJob::new("k")
                .payload(serde_json::json!({"block": true}))
                .timeout(Duration::from_millis(200))
                .max_attempts(1),
        )
        .unwrap();
    wait_until("the stuck job is dead", secs(10), || {
        queue.get(stuck).unwrap().state == JobState::Dead
    });
    let next = queue.enqueue(NewJob::new("k")).unwrap();
    wait_until("the next job ran beside the stuck one", secs(3), || {
        queue.get(next).unwrap().state == JobState::Succeeded
    });
    let report = pool.shutdown(secs(3));
    assert_eq!(report.still_running, 0, "{report:?}");
}
}

contract! { sqlite_only:
/// SQLite only: there a test can hold the one write lock every outcome
/// needs. An aborted task's drop does not wait, on its runtime thread, for
/// its timeout to be recorded: with the write lock held for 3 s across
/// the abort, a ticker on the runtime's only worker thread is never held
/// up (it was, for 2 s).
fn an_aborted_task_does_not_stall_its_runtime_thread() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;
    use std::time::Instant;
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let gap = Arc::new(Mutex::new(Duration::ZERO));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (gap, stop) = (Arc::clone(&gap), Arc::clone(&stop));
        rt.spawn(async move {
            let mut last = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let mut most = gap.lock().unwrap();
                *most = (*most).max(last.elapsed());
                last = Instant::now();
            }
        });
    }
    let mut pool = WorkerPool::builder(&queue)
        .timeout_grace(Duration::from_millis(100))
        .runtime(rt.handle().clone())
        .async_handler("k", |_ctx: JobContext| forever())
        .start()
        .unwrap();
    let id = queue
        .enqueue(NewJob::new("k").timeout(Duration::from_millis(1600)).max_attempts(1))
        .unwrap();
    wait_until("running", secs(10), || queue.get(id).unwrap().state == JobState::Running);
    std::thread::sleep(Duration::from_millis(1350)); // its start recorded by now
    *gap.lock().unwrap() = Duration::ZERO;
    engine::hold_job_row(&path, id.0, Duration::from_millis(3000))
        .join()
        .unwrap();
    wait_until("dead", secs(10), || queue.get(id).unwrap().state == JobState::Dead);
    stop.store(true, Ordering::SeqCst);
    let most = *gap.lock().unwrap();
    pool.shutdown(secs(5));
    assert!(most < Duration::from_millis(500), "the runtime's thread stalled {most:?}");
}
}

contract! { sqlite_only:
/// SQLite only: claiming ahead is the same on every engine, and this
/// counts hand-backs, a matter of timing, not of storage. How long tasks
/// run does not enter what the worker threads claim ahead: a pool whose
/// 1 thread runs 20-ms sync jobs hands back as few of them with 3,000
/// instant async jobs beside them as without (it handed back 14 when the
/// tasks' run times pulled the estimate down).
fn tasks_run_times_do_not_change_what_threads_claim_ahead() {
    fn handed_back(with_tasks: bool) -> usize {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rt = runtime();
        let builder = WorkerPool::builder(&queue)
            .threads(1)
            .handler("slow", |_: &JobContext| {
                std::thread::sleep(Duration::from_millis(20));
                Ok::<(), JobError>(())
            });
        let builder = if with_tasks {
            builder
                .runtime(rt.handle().clone())
                .async_handler("fast", |_ctx: JobContext| async { Ok::<(), JobError>(()) })
        } else {
            builder
        };
        let mut pool = builder.start().unwrap();
        queue
            .enqueue_batch((0..60).map(|_| NewJob::new("slow")).collect())
            .unwrap();
        if with_tasks {
            queue
                .enqueue_batch((0..3000).map(|_| NewJob::new("fast")).collect())
                .unwrap();
        }
        let total = if with_tasks { 3060 } else { 60 };
        wait_until("all done", secs(60), || {
            queue.count(JobState::Succeeded).unwrap() == total
        });
        let handed_back = pool.stats().handed_back;
        pool.shutdown(secs(5));
        handed_back
    }
    let alone = handed_back(false);
    let beside = handed_back(true);
    assert!(beside <= alone + 5, "handed back: {alone} alone, {beside} beside tasks");
}
}

contract! {
/// A `current_thread` runtime not driven for 2 s (its thread busy
/// elsewhere, as a GUI's may be) runs nothing meanwhile: the timeouts of
/// the jobs spawned onto it count from their tasks' first poll, not from
/// the spawn, so none is aborted or counted before it ran.
fn a_tasks_timeout_counts_from_its_first_poll() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .timeout_grace(Duration::from_millis(200))
        .runtime(rt.handle().clone())
        .async_handler("k", |_ctx: JobContext| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<(), JobError>(())
        })
        .start()
        .unwrap();
    queue
        .enqueue_batch(
            (0..3)
                .map(|_| NewJob::new("k").timeout(Duration::from_millis(300)).max_attempts(1))
                .collect(),
        )
        .unwrap();
    std::thread::sleep(secs(2));
    let reads = queue.to_async();
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + secs(20);
        while reads.count(JobState::Succeeded).await.unwrap() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "the jobs did not finish");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert_eq!(queue.count(JobState::Dead).unwrap(), 0);
    pool.shutdown(secs(5));
}
}

contract! {
/// A task deaf to `ctx.cancelled()` whose job is cancelled (no timeout) is
/// aborted the grace after its lease was lost, and its slot comes back:
/// the next job of a lane of one slot runs.
fn a_task_deaf_to_its_lost_lease_is_aborted_after_the_grace() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = runtime();
    let running = Arc::new(Running::default());
    let mut pool = one_slot_pool(&queue, &rt, &running, Duration::from_millis(300));
    let deaf = queue
        .enqueue(NewJob::new("k").payload(serde_json::json!({"deaf": true})))
        .unwrap();
    wait_until("the deaf job started", secs(10), || {
        running.now.load(Ordering::SeqCst) == 1
    });
    queue.cancel(deaf).unwrap();
    let next = queue.enqueue(NewJob::new("k")).unwrap();
    wait_until("the next job ran in the freed slot", secs(10), || {
        queue.get(next).unwrap().state == JobState::Succeeded
    });
    assert_eq!(running.ended.load(Ordering::SeqCst), 2, "the deaf task was not dropped");
    assert_eq!(queue.get(deaf).unwrap().state, JobState::Cancelled);
    let report = pool.shutdown(secs(3));
    assert_eq!(report.still_running, 0, "{report:?}");
}
}

contract! {
/// 2,000 jobs of 1 ms of CPU each, on a runtime of one worker thread, all
/// claimed at once: most wait for the thread far longer than their 500 ms
/// timeout, which counts from each one's first poll, so none is aborted
/// unrun (1,507 were).
fn a_busy_runtime_spends_no_timeout_of_a_task_not_yet_polled() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .timeout_grace(Duration::from_millis(200))
        .runtime(rt.handle().clone())
        .async_handler("k", |_ctx: JobContext| async {
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_millis(1) {}
            Ok::<(), JobError>(())
        })
        .start()
        .unwrap();
    queue
        .enqueue_batch(
            (0..2000)
                .map(|_| NewJob::new("k").timeout(Duration::from_millis(500)).max_attempts(1))
                .collect(),
        )
        .unwrap();
    wait_until("every job ended", secs(120), || {
        queue.count(JobState::Succeeded).unwrap() + queue.count(JobState::Dead).unwrap() == 2000
    });
    pool.shutdown(secs(5));
    assert_eq!(queue.count(JobState::Dead).unwrap(), 0);
}
}

/// A handler's run that never ends, deaf to cancellation: it only awaits
/// a timer, again and again.
async fn forever() -> Result<(), JobError> {
    loop {
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}
