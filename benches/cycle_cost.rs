//! The storage work a worker pool does per job, on one thread and with no
//! timer, so that its cost can be counted exactly (instructions under
//! callgrind, which are the same from one run to the next, where a
//! multi-threaded burn-down's wall and CPU times move by up to 25 %):
//! 20,000 no-op jobs enqueued in batches of 5,000, then burnt down as the
//! pool's dispatcher does, each transaction recording the previous 32
//! outcomes and claiming the next 32 (`Manual::record_and_claim_ahead`,
//! outcomes synced later), under `Durability::Normal` (`--full`: `Full`).
//!
//! With `--waiting N`, N jobs wait beside them for a parent that never
//! runs (`NewJob::after`, in a queue no one claims): the claim must not
//! feel them.
//!
//! ```text
//! cargo bench --bench cycle_cost [-- --full] [--waiting 100000]
//! valgrind --tool=callgrind --toggle-collect='cycle_cost::burn*' target/release/deps/cycle_cost-…
//! ```

use std::time::{Duration, Instant};
use tickler::{ClaimRequest, Durability, Lease, NewJob, Outcome, OutcomeSync, Queue};

const JOBS: usize = 20_000;
const BATCH: usize = 32;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--full");
    let waiting: usize = args
        .iter()
        .position(|a| a == "--waiting")
        .and_then(|i| args.get(i + 1))
        .map_or(0, |n| n.parse().expect("--waiting N"));
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = Queue::builder(dir.path().join("jobs.db"))
        .sqlite(|o| {
            o.durability(if full {
                Durability::Full
            } else {
                Durability::Normal
            })
        })
        .open()
        .expect("open");
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
    let started = Instant::now();
    let done = burn(&queue);
    let took = started.elapsed();
    assert_eq!(done, JOBS);
    println!(
        "{{\"scenario\": \"cycle_cost\", \"durability\": \"{}\", \"jobs\": {JOBS}, \"waiting\": {waiting}, \"batch\": {BATCH}, \"jobs_per_s\": {:.0}}}",
        if full { "full" } else { "normal" },
        JOBS as f64 / took.as_secs_f64()
    );
}

/// Burns the queue down as a dispatcher does; returns the jobs completed.
#[inline(never)]
fn burn(queue: &Queue) -> usize {
    let mut done = 0;
    let mut finished: Vec<Lease> = Vec::new();
    loop {
        let outcomes: Vec<(&Lease, Outcome)> =
            finished.iter().map(|l| (l, Outcome::Complete)).collect();
        let claim = ClaimRequest {
            queues: &["default"],
            worker_id: "cycle",
            max: BATCH,
            lease: Duration::from_secs(30),
            kinds: Some(&["noop"]),
            oldest_first: 0,
        };
        let (recorded, claimed) = queue
            .manual()
            .record_and_claim_ahead(&outcomes, Some(&claim), OutcomeSync::Deferred)
            .expect("record and claim");
        done += recorded.iter().filter(|r| r.is_ok()).count();
        if claimed.is_empty() {
            return done;
        }
        finished = claimed;
    }
}
