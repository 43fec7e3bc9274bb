//! CPU probe: the cost per job of a worker pool's claim → run → record path,
//! for a profiler. Fills a fresh queue (`Durability::Normal`) with no-op
//! jobs, then burns them down with a pool of no-op handlers and prints the
//! rate and the process's CPU time per 1,000 jobs of the burn.
//!
//! ```text
//! cargo run --release --example cpu_probe -- [JOBS] [THREADS] [PREFETCH]
//! ```
//!
//! Defaults: 20,000 jobs, 1 thread, the pool's default prefetch cap
//! ([`tickler::DEFAULT_PREFETCH`]). Under callgrind
//! (instruction counts are repeatable on a noisy machine; build with
//! `CARGO_PROFILE_RELEASE_DEBUG=true`):
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=probe.out \
//!     target/release/examples/cpu_probe 20000
//! callgrind_annotate --inclusive=yes probe.out | head -60
//! ```
//!
//! The burn's own cost is the inclusive cost of the pool's thread
//! functions (`tickler::worker::dispatch_loop`, `work_loop`,
//! `heartbeat_loop`); the fill shows up under `Queue::enqueue_batch`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{Durability, JobContext, JobError, NewJob, Queue, WorkerPool};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut next = |default: usize| {
        args.next()
            .map_or(default, |a| a.parse().expect("a whole number"))
    };
    let jobs = next(20_000);
    let threads = next(1);
    let prefetch = next(tickler::DEFAULT_PREFETCH);

    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::builder(dir.path().join("probe.db"))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open");
    let mut left = jobs;
    while left > 0 {
        let chunk = left.min(5_000);
        queue
            .enqueue_batch((0..chunk).map(|_| NewJob::new("noop")).collect())
            .expect("fill");
        left -= chunk;
    }

    let done = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&done);
    let cpu = cpu_time();
    let started = Instant::now();
    let mut pool = WorkerPool::builder(&queue)
        .threads(threads)
        .prefetch(prefetch)
        .handler("noop", move |_: &JobContext| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok::<(), JobError>(())
        })
        .start()
        .expect("start pool");
    while done.load(Ordering::Relaxed) < jobs {
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    pool.shutdown(Duration::from_secs(5));
    let cpu = cpu_time() - cpu;
    println!(
        "{jobs} jobs, {threads} thread(s), prefetch({prefetch}): {:.0} jobs/s, {:.2} CPU-ms per 1000 jobs",
        jobs as f64 / elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / jobs as f64
    );
}

/// CPU time (user + system) of the whole process so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
