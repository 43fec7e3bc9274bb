//! Proof that the async face does not block the runtime: on a
//! `current_thread` runtime, where any blocking call stalls every task, a
//! ticker task that sleeps 1 ms at a time keeps its lateness under
//! [`MAX_LATENESS`] (and its 99th percentile under [`P99_LATENESS`]) while
//! the same runtime enqueues 10,000 typed jobs through `AsyncQueue`, runs
//! them with async handlers, reads their counts and shuts the pool down
//! with `shutdown_async`.
//!
//! For scale: one blocking enqueue under `Durability::Full` waits for an
//! fsync (milliseconds to tens of milliseconds on an SD card), and a sync
//! `shutdown` here would stall the ticker until its grace ran out, as the
//! handlers it waits for need this very thread (the test has one such
//! handler, 200 ms long, running as shutdown begins). Measured here at
//! about 1.1 ms p50 (tokio's timer rounds up to whole milliseconds), 3 to
//! 7 ms p99 and 5 to 26 ms worst. The bounds leave room for
//! a loaded 2-core machine (the test runs beside other test binaries).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{JobArgs, JobContext, JobState, Queue, WorkerPool};

/// Worst lateness of one 1-ms tick allowed during the whole run.
const MAX_LATENESS: Duration = Duration::from_millis(100);
/// 99th percentile of the ticks' lateness allowed.
const P99_LATENESS: Duration = Duration::from_millis(20);
const JOBS: usize = 10_000;
/// The `n` of the one slow job, running while the pool shuts down.
const SLOW: usize = usize::MAX;
static SLOW_STARTED: AtomicUsize = AtomicUsize::new(0);

#[derive(Serialize, Deserialize)]
struct Chirp {
    n: usize,
}

impl JobArgs for Chirp {
    const KIND: &'static str = "chirp";
}

/// Sleeps 1 ms at a time until `stop`, returning each wake-up's lateness
/// (how much later than 1 ms after it went to sleep it ran again).
async fn ticker(stop: Arc<AtomicBool>) -> Vec<Duration> {
    let mut lateness = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let slept = Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        lateness.push(slept.elapsed().saturating_sub(Duration::from_millis(1)));
    }
    lateness
}

#[test]
fn the_runtime_thread_never_waits_for_the_queue_or_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (lateness, took) = runtime.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let ticks = tokio::spawn(ticker(Arc::clone(&stop)));
        let began = Instant::now();
        // Opening is blocking work too (migrations, pragmas).
        let queue = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || Queue::open(path))
                .await
                .unwrap()
                .unwrap()
                .to_async()
        };
        let pool = WorkerPool::builder(queue.queue())
            .threads(4)
            .async_handler_for(|_ctx: JobContext, chirp: Chirp| async move {
                if chirp.n == SLOW {
                    SLOW_STARTED.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                tokio::task::yield_now().await;
                Ok(())
            })
            .start()
            .unwrap();
        for chunk in 0..JOBS / 100 {
            let batch: Vec<Chirp> = (0..90).map(|i| Chirp { n: chunk * 100 + i }).collect();
            queue.enqueue_args_batch(&batch).await.unwrap();
            for i in 90..100 {
                queue
                    .enqueue_args(&Chirp { n: chunk * 100 + i })
                    .await
                    .unwrap();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while queue.count(JobState::Succeeded).await.unwrap() < JOBS as u64 {
            assert!(Instant::now() < deadline, "the jobs did not finish");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Shutdown begins while a handler runs (it needs this thread to
        // finish) and while jobs keep arriving: those not started by then
        // are handed back.
        let slow = queue.enqueue_args(&Chirp { n: SLOW }).await.unwrap();
        while SLOW_STARTED.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the slow job did not start");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let late: Vec<Chirp> = (0..50).map(|n| Chirp { n }).collect();
        queue.enqueue_args_batch(&late).await.unwrap();
        let report = pool.shutdown_async(Duration::from_secs(10)).await;
        assert_eq!(report.still_running, 0, "{report:?}");
        assert_eq!(queue.get(slow).await.unwrap().state, JobState::Succeeded);
        let stats = queue.stats().await.unwrap();
        assert_eq!(stats.total(JobState::Running), 0);
        assert_eq!(stats.total(JobState::Dead), 0);
        assert!(stats.total(JobState::Succeeded) >= JOBS as u64);
        stop.store(true, Ordering::SeqCst);
        (ticks.await.unwrap(), began.elapsed())
    });
    let mut sorted = lateness.clone();
    sorted.sort();
    let max = *sorted.last().unwrap();
    let p99 = sorted[sorted.len() * 99 / 100];
    let p50 = sorted[sorted.len() / 2];
    println!(
        "{JOBS} jobs in {took:?}: {} ticks, lateness p50 {p50:?}, p99 {p99:?}, max {max:?}",
        sorted.len()
    );
    assert!(
        sorted.len() as u128 > took.as_millis() / 4,
        "the ticker ran only {} times in {took:?}",
        sorted.len()
    );
    assert!(max < MAX_LATENESS, "a tick was {max:?} late");
    assert!(p99 < P99_LATENESS, "p99 lateness {p99:?}");
}
