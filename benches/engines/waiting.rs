//! `--only waiting`: what 100,000 jobs waiting on a parent that never
//! ends cost the claim, on every engine built in and reachable: the same
//! burn-down (20,000 no-op jobs, each transaction recording 32 outcomes
//! and claiming the next 32, as a pool's dispatcher does) on a fresh
//! store with and without them, alternated, three rounds each (the
//! server's statistics brought up to date after each fill), reported as
//! the ratio of the medians. The waiting jobs are in the claimed queue:
//! only their state keeps them out of the claim's way.
//!
//! A check that the figure can move: the same run with the waiting jobs
//! made pending-but-paused would be read by a claim that scanned by queue
//! alone; here, a claim plan that read the waiting rows would scale with
//! them (100,000 against 20,000 jobs claimed) and show far above 1.1.

use serde_json::json;
use std::time::{Duration, Instant};
use tickler::{ClaimRequest, Lease, NewJob, Outcome, OutcomeSync, Queue};

use super::emit;

const WAITING: usize = 100_000;
const JOBS: usize = 20_000;
const BATCH: usize = 32;

/// A queue on a fresh store, and what makes its statistics current once
/// it is filled (so that neither run pays for the server's own analysis
/// of the rows just written, nor plans with stale statistics).
type Fresh = Box<dyn Fn() -> (Queue, Box<dyn Fn()>)>;

fn stores() -> Vec<(&'static str, Fresh)> {
    let mut out: Vec<(&'static str, Fresh)> = Vec::new();
    out.push((
        "sqlite",
        Box::new(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let queue = Queue::open(dir.path().join("waiting.db")).expect("open");
            // The folder goes when the run is over and this is dropped.
            let settle = move || {
                let _ = dir.path();
            };
            (queue, Box::new(settle) as Box<dyn Fn()>)
        }),
    ));
    #[cfg(feature = "postgres")]
    if let Ok(server) = std::env::var("TICKLER_BENCH_DATABASE_URL") {
        out.push((
            "postgres",
            Box::new(move || {
                let url = super::pg_bench::fresh_database_named(&server, "tickler_bench_waiting");
                let queue = Queue::open(&url).expect("open");
                let settle = move || {
                    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
                    // One statement a call: VACUUM refuses the implicit
                    // transaction of a multi-statement string.
                    for table in ["tickler_jobs", "tickler_deps"] {
                        c.batch_execute(&format!("VACUUM ANALYZE {table}"))
                            .expect("vacuum");
                    }
                };
                (queue, Box::new(settle) as Box<dyn Fn()>)
            }),
        ));
    }
    #[cfg(feature = "mysql")]
    if let Ok(server) = std::env::var("TICKLER_BENCH_MYSQL_URL") {
        out.push((
            "mysql",
            Box::new(move || {
                let url =
                    super::mysql_bench::fresh_database_named(&server, "tickler_bench_waiting");
                let queue = Queue::open(&url).expect("open");
                let settle = move || {
                    use mysql::prelude::Queryable;
                    let mut c = mysql::Conn::new(mysql::Opts::from_url(&url).expect("url"))
                        .expect("connect");
                    c.query_drop("ANALYZE TABLE tickler_jobs, tickler_deps")
                        .expect("analyze");
                };
                (queue, Box::new(settle) as Box<dyn Fn()>)
            }),
        ));
    }
    out
}

fn fill(queue: &Queue, waiting: usize) {
    if waiting > 0 {
        let parent = queue
            .enqueue(NewJob::new("never").queue("held"))
            .expect("parent");
        for from in (0..waiting).step_by(5_000) {
            let jobs = (from..waiting.min(from + 5_000))
                .map(|_| NewJob::new("noop").after(&[parent]))
                .collect();
            queue.enqueue_batch(jobs).expect("waiting");
        }
    }
    for _ in 0..JOBS / 5_000 {
        let jobs = (0..5_000).map(|_| NewJob::new("noop")).collect();
        queue.enqueue_batch(jobs).expect("fill");
    }
}

/// The burn-down's time.
fn burn(queue: &Queue) -> Duration {
    let started = Instant::now();
    let mut done = 0;
    let mut finished: Vec<Lease> = Vec::new();
    loop {
        let outcomes: Vec<(&Lease, Outcome)> =
            finished.iter().map(|l| (l, Outcome::Complete)).collect();
        let claim = ClaimRequest {
            queues: &["default"],
            worker_id: "bench",
            max: BATCH,
            lease: Duration::from_secs(30),
            kinds: Some(&["noop"]),
            oldest_first: 0,
        };
        let (recorded, claimed) = queue
            .manual()
            .record_and_claim_ahead(&outcomes, Some(&claim), OutcomeSync::Now)
            .expect("record and claim");
        done += recorded.iter().filter(|r| r.is_ok()).count();
        if claimed.is_empty() {
            break;
        }
        finished = claimed;
    }
    assert_eq!(done, JOBS);
    started.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(super) fn run() {
    for (engine, fresh) in stores() {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            for waiting in [0, WAITING] {
                let (queue, settle) = fresh();
                fill(&queue, waiting);
                settle();
                let took = burn(&queue).as_secs_f64();
                if waiting == 0 {
                    without.push(took);
                } else {
                    with.push(took);
                }
            }
        }
        let (with, without) = (median(with), median(without));
        emit(
            json!({"scenario": "waiting", "engine": engine, "waiting": WAITING,
            "jobs": JOBS, "batch": BATCH,
            "jobs_per_s_without": (JOBS as f64 / without).round(),
            "jobs_per_s_with": (JOBS as f64 / with).round(),
            "with_over_without": ((with / without) * 1000.0).round() / 1000.0}),
        );
    }
}
