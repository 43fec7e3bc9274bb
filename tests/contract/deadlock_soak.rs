//! Every path that touches limits takes its locks in one order (see
//! `LimitTx`), so on a server engine no transaction waits for another in a
//! cycle: 3 queues (each with its own connections, as 3 processes would
//! have) × 4 handler threads run jobs of 6 overlapping keys of two limits,
//! each with a `max_per_key`, a `max_total` and a rate, while enqueued jobs
//! keep coming (up to a backlog); two threads keep setting the limits to
//! new values, one of them deleting and setting the second again; another
//! cancels and retries jobs at random; handlers fail now and then (retried
//! after a short backoff) and call `rate_limited`; a reaper keeps the
//! rates and sweeps. Deadlocks are
//! retried, so none shows in the results: the server's own count is what
//! must not move (`DeadlockWatch`, which says how it is kept to this
//! case's transactions; tickler keeps no count of its own). Two kinds of
//! InnoDB deadlock are counted apart and printed, not failed, as they are
//! not of the limits' lock order: between claims' own statements alone
//! (each waits for an index entry, due or pending, the other locked: by its
//! locking read of the other index, which left it locked on a row it passed
//! over, or by its update; claims without any limit meet them too), and
//! where a `SKIP LOCKED` read waited, which MariaDB was seen to do for a
//! row another transaction had just written (such a read never waits on
//! PostgreSQL, and the order relies on it to wait for no job row under a
//! limit's lock).
//!
//! On every engine (SQLite has one writer and no row locks, so only this
//! part means anything there), the limits still hold: a handler of the
//! first limit, which is never deleted, never sees more than its largest
//! `max_per_key` of its key or its largest `max_total` at once; and once
//! the load stops and both limits are set wide, every job ends.
//!
//! `TICKLER_DEADLOCK_SOAK_SECS` sets how long the load lasts (default 5).

use crate::support::engine::{self, DeadlockWatch};
use crate::support::pool::{ms, secs, temp_db, wait_until};

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tickler::{
    Durability, Error, JobContext, JobError, JobId, JobState, Limit, NewJob, Queue, Reaper,
    ReaperConfig, RetryPolicy, WorkerPool,
};

const QUEUES: usize = 3;
const THREADS: usize = 4;
const KEYS: usize = 6;
/// The largest `max_per_key` and `max_total` the first limit is ever set to.
const MOST_PER_KEY: u32 = 2;
const MOST_TOTAL: u32 = 6;
/// Long enough that no handler loses its lease, short enough that a job
/// retried while its cancelled run still held it is soon due.
const LEASE: Duration = Duration::from_secs(5);
/// The most unfinished jobs the load lets wait.
const BACKLOG: u64 = 2_000;

fn open(path: &Path) -> Queue {
    Queue::builder(engine::target(path))
        .sqlite(|o| o.durability(Durability::Normal))
        .retry_policy(RetryPolicy {
            base: ms(5),
            cap: ms(40),
            jitter: true,
        })
        .open()
        .expect("open queue")
}

fn pick<T: Copy>(of: &[T]) -> T {
    of[fastrand::usize(..of.len())]
}

/// The first limit, at one of its values: never over [`MOST_PER_KEY`] and
/// [`MOST_TOTAL`].
fn first_limit() -> Limit {
    Limit::per_key(fastrand::u32(1..=MOST_PER_KEY))
        .total(pick(&[3, 4, MOST_TOTAL]))
        .with_rate(pick(&[20, 40, 80]), secs(1))
        .burst(fastrand::u32(0..=2))
}

fn second_limit() -> Limit {
    Limit::per_key(fastrand::u32(1..=3))
        .total(pick(&[2, 5, 8]))
        .with_rate(pick(&[15, 30, 60]), secs(1))
        .burst(fastrand::u32(0..=2))
}

/// Wide enough that the backlog runs out at once.
fn wide() -> Limit {
    Limit::per_key(MOST_PER_KEY)
        .total(MOST_TOTAL)
        .with_rate(5_000, secs(1))
        .burst(100)
}

/// The handlers of the first limit running now, per key, as they see it.
#[derive(Default)]
struct Oracle {
    running: Mutex<HashMap<String, u32>>,
    violations: Mutex<Vec<String>>,
}

impl Oracle {
    fn enter(&self, key: &str) {
        let mut running = self.running.lock().unwrap();
        *running.entry(key.to_owned()).or_default() += 1;
        let (of_key, total) = (running[key], running.values().sum::<u32>());
        if of_key > MOST_PER_KEY || total > MOST_TOTAL {
            self.violations
                .lock()
                .unwrap()
                .push(format!("key {key}: {of_key} running, {total} in all"));
        }
    }

    fn leave(&self, key: &str) {
        *self.running.lock().unwrap().get_mut(key).expect("entered") -= 1;
    }
}

/// Jobs not finished, in any queue.
fn unfinished(queue: &Queue) -> u64 {
    let counts = queue.stats().unwrap();
    [
        JobState::Scheduled,
        JobState::Pending,
        JobState::Blocked,
        JobState::Running,
    ]
    .into_iter()
    .map(|s| counts.total(s))
    .sum()
}

/// Runs `step` until `stop`, `pause` apart.
fn repeat(
    stop: &Arc<AtomicBool>,
    pause: std::ops::Range<u64>,
    mut step: impl FnMut() + Send + 'static,
) -> JoinHandle<()> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            step();
            std::thread::sleep(ms(fastrand::u64(pause.clone())));
        }
    })
}

/// An operator's call on a job picked at random, which may have moved on
/// (finished, or not cancelled): refused, and that is all.
fn tolerated(result: tickler::Result<()>) {
    match result {
        Ok(()) | Err(Error::InvalidState { .. } | Error::UniqueKeyHeld { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

/// A claim's own statement, as InnoDB prints it: its locking read of the
/// due jobs (through the index of its order), the promote of due ones, the
/// claim.
fn is_claims(statement: &str) -> bool {
    let read = statement.contains("FROM tickler_jobs AS job FORCE INDEX (tickler_jobs_pending)")
        || statement.contains("FROM tickler_jobs AS job FORCE INDEX (tickler_jobs_due)");
    (read && statement.ends_with("FOR UPDATE SKIP LOCKED"))
        || statement.starts_with("UPDATE tickler_jobs SET status = 'running'")
        || (statement
            .starts_with("UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET status = 'pending'")
            && statement.ends_with("AND status = 'scheduled'"))
}

contract! {
fn limits_keep_one_lock_order_under_load() {
    let soak: u64 = std::env::var("TICKLER_DEADLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let (_dir, path) = temp_db();
    let queue = open(&path);
    queue.set_limit("a", first_limit()).unwrap();
    queue.set_limit("b", second_limit()).unwrap();
    let watch = DeadlockWatch::start(&path);

    let oracle = Arc::new(Oracle::default());
    let pools: Vec<(Queue, WorkerPool)> = (0..QUEUES)
        .map(|_| {
            let queue = open(&path);
            let oracle = oracle.clone();
            let pool = WorkerPool::builder(&queue)
                .threads(THREADS)
                .lease(LEASE)
                .handler("call", move |ctx: &JobContext| -> Result<(), JobError> {
                    let slot = ctx.lease().limit.clone().expect("a limited job");
                    let watched = slot.name == "a";
                    if watched {
                        oracle.enter(&slot.key);
                    }
                    let result = match fastrand::u8(..100) {
                        0..=7 => Err(JobError::retry("failed, to be retried")),
                        8..=12 => Err(ctx.rate_limited(ms(fastrand::u64(10..60)))),
                        _ => {
                            std::thread::sleep(ms(fastrand::u64(1..6)));
                            Ok(())
                        }
                    };
                    if watched {
                        oracle.leave(&slot.key);
                    }
                    result
                })
                .start()
                .unwrap();
            (queue, pool)
        })
        .collect();
    let mut reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: ms(100),
            ..ReaperConfig::default()
        },
    );

    let stop = Arc::new(AtomicBool::new(false));
    let ids: Arc<Mutex<Vec<JobId>>> = Arc::default();
    let mut load = Vec::new();
    {
        // About 300 jobs a second, more than the slower rates let start,
        // while fewer than BACKLOG wait: a long load keeps its backlog.
        let (queue, ids) = (queue.clone(), ids.clone());
        let mut calls = 0u32;
        let mut waiting = 0;
        load.push(repeat(&stop, 8..12, move || {
            if calls.is_multiple_of(20) {
                waiting = unfinished(&queue);
            }
            calls += 1;
            if waiting > BACKLOG {
                return;
            }
            let jobs = (0..3)
                .map(|_| {
                    let name = pick(&["a", "b"]);
                    NewJob::new("call")
                        .limit(name, format!("k{}", fastrand::usize(..KEYS)))
                        .max_attempts(1_000)
                })
                .collect();
            let enqueued = queue.enqueue_batch(jobs).unwrap();
            ids.lock().unwrap().extend(enqueued);
        }));
    }
    // The second limit is deleted and set again by one thread alone: two
    // set_limit of a name just deleted both insert its row, and InnoDB
    // answers two inserts over the deleted row's index entry with a
    // deadlock, between the operator's calls alone.
    for second in [true, false] {
        let queue = queue.clone();
        load.push(repeat(&stop, 10..40, move || match fastrand::u8(..100) {
            60..=84 if second => queue.set_limit("b", second_limit()).unwrap(),
            85.. if second => {
                queue.delete_limit("b").unwrap();
                std::thread::sleep(ms(5));
                queue.set_limit("b", second_limit()).unwrap();
            }
            _ => queue.set_limit("a", first_limit()).unwrap(),
        }));
    }
    {
        let (queue, ids) = (queue.clone(), ids.clone());
        load.push(repeat(&stop, 3..10, move || {
            let Some(id) = ({
                let ids = ids.lock().unwrap();
                (!ids.is_empty()).then(|| ids[fastrand::usize(..ids.len())])
            }) else {
                return;
            };
            if fastrand::u8(..3) == 0 {
                tolerated(queue.retry(id));
            } else {
                tolerated(queue.cancel(id));
            }
        }));
    }
    let started = Instant::now();
    std::thread::sleep(secs(soak));
    stop.store(true, Ordering::Relaxed);
    for thread in load {
        thread.join().expect("a load thread");
    }
    let loaded = started.elapsed();

    queue.set_limit("a", wide()).unwrap();
    queue.set_limit("b", wide()).unwrap();
    let drained = wait_until("every job ended", secs(60), || unfinished(&queue) == 0);
    let counts = queue.stats().unwrap();
    let swept = queue.ops().limit_sweep_unblocked();
    reaper.stop();
    for (pool_queue, mut pool) in pools {
        pool.shutdown(secs(10));
        drop(pool);
        drop(pool_queue);
    }
    drop(queue);
    let deadlocks = watch.finish();

    let claims_alone = deadlocks
        .statements
        .iter()
        .filter(|waits| waits.iter().all(|s| is_claims(s)))
        .count() as u64;
    let skip_waited = deadlocks
        .statements
        .iter()
        .filter(|waits| !waits.iter().all(|s| is_claims(s)))
        .filter(|waits| waits.iter().any(|s| s.ends_with("SKIP LOCKED")))
        .count() as u64;
    let enqueued = ids.lock().unwrap().len();
    eprintln!(
        "{:?}: {enqueued} jobs in {loaded:.1?} (then {drained:.1?} to drain): {} succeeded, \
         {} cancelled, {} dead; {} deadlocks of this case ({claims_alone} between claims \
         alone, {skip_waited} where a SKIP LOCKED read waited), {} of the server meanwhile; \
         the reaper's sweep found {swept} missed releases",
        engine::current(),
        counts.total(JobState::Succeeded),
        counts.total(JobState::Cancelled),
        counts.total(JobState::Dead),
        deadlocks.ours,
        deadlocks.server,
    );
    for waits in &deadlocks.statements {
        eprintln!("deadlock: {}", waits.join("\n      and: "));
    }
    let violations = oracle.violations.lock().unwrap();
    assert!(violations.is_empty(), "over the first limit:\n{}", violations.join("\n"));
    assert_eq!(counts.total(JobState::Succeeded) + counts.total(JobState::Cancelled)
        + counts.total(JobState::Dead), enqueued as u64, "{counts:?}");
    assert_eq!(
        deadlocks.ours - claims_alone - skip_waited,
        0,
        "the server found deadlocks among this case's transactions"
    );
}
}
