//! A live holder does not lose its job because another connection held the
//! write lock.
//!
//! The bug it guards: with a 1 s lease, a 3 s job and another connection
//! holding SQLite's write lock for 1.5 s, the holder's heartbeat waits
//! behind that lock, and so does a reaper in another process. When the
//! lock is released, whichever gets it first wins: a reaper that won took
//! the healthy job (9 of 40 trials), and it ran twice. Now a reaper takes a
//! lease only after two looks at least a settle time apart, each of which
//! got the write lock without waiting, saw it expired with the same expiry:
//! a heartbeat queued behind a stall lands in between.
//!
//! The parent runs the holders (8 worker pools, each on its own `Queue`,
//! so their heartbeats run at different moments) and the blocking
//! connection; the reaper runs in a child process (this test binary run
//! again, only [`reaper_child_process`]) with the default 1 s interval, so
//! its pass falls at a different moment of each stall. 5 rounds of 8 jobs:
//! 40 trials.

use crate::support::pool;

use pool::{ms, secs, temp_db, wait_until, Recorder};
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tickler::{Durability, JobId, JobState, NewJob, Queue, Reaper, ReaperConfig, WorkerPool};

const ENV_DB: &str = "TICKLER_STALL_REAPER_DB";
const CHILD_TEST: &str = "reaper_child_process";
const LEASE: Duration = Duration::from_secs(1);
const JOB: Duration = Duration::from_millis(3000);
const STALL: Duration = Duration::from_millis(1500);
const POOLS: usize = 8;
const ROUNDS: usize = 5;

fn open(path: &Path) -> Queue {
    Queue::builder(path)
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue")
}

/// Not a test of its own: the reaper process of
/// [`a_write_lock_stall_does_not_cost_live_holders_their_jobs`]. Runs until
/// its parent removes the file named by the database path plus `.run`.
#[test]
fn reaper_child_process() {
    let Ok(db) = std::env::var(ENV_DB) else {
        return;
    };
    let queue = open(Path::new(&db));
    let mut reaper = Reaper::spawn(
        queue,
        ReaperConfig {
            interval: secs(1),
            ..ReaperConfig::default()
        },
    );
    let run = format!("{db}.run");
    std::fs::write(format!("{db}.ready"), b"").unwrap();
    while Path::new(&run).exists() {
        std::thread::sleep(ms(20));
    }
    reaper.stop();
}

fn spawn_reaper(db: &Path) -> Child {
    std::fs::write(format!("{}.run", db.display()), b"").unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            crate::support::engine::test_path(module_path!(), CHILD_TEST).as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_DB, db)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the reaper process")
}

/// Holds SQLite's write lock for `STALL` from a connection of its own, as a
/// long application transaction or a slow disk would.
fn stall_the_write_lock(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(secs(10)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::sleep(STALL);
    conn.execute_batch("COMMIT").unwrap();
}

#[test]
fn a_write_lock_stall_does_not_cost_live_holders_their_jobs() {
    let (_dir, path) = temp_db();
    let queue = open(&path);
    let mut reaper = spawn_reaper(&path);
    wait_until("the reaper process is ready", secs(30), || {
        Path::new(&format!("{}.ready", path.display())).exists()
    });

    let rec = Recorder::new();
    let mut ids: Vec<JobId> = Vec::new();
    for round in 0..ROUNDS {
        // One pool per job, each on its own Queue (its own connection and
        // heartbeat thread), started a little apart.
        let mut pools = Vec::new();
        let mut round_ids = Vec::new();
        for p in 0..POOLS {
            let own = open(&path);
            let queue_name = format!("r{round}p{p}");
            round_ids.push(
                own.enqueue(
                    NewJob::new("script")
                        .queue(queue_name.clone())
                        .payload(json!({"sleep_ms": JOB.as_millis() as u64}))
                        .max_attempts(5),
                )
                .unwrap(),
            );
            pools.push(
                WorkerPool::builder(&own)
                    .queue(queue_name)
                    .threads(1)
                    .lease(LEASE)
                    .handler("script", rec.script())
                    .without_reaper()
                    .without_scheduler()
                    .start()
                    .unwrap(),
            );
            std::thread::sleep(ms(23 + 17 * p as u64));
        }
        wait_until("every job of the round started", secs(10), || {
            round_ids.iter().all(|id| !rec.runs_of(*id).is_empty())
        });
        std::thread::sleep(ms(100 * round as u64));
        stall_the_write_lock(&path);
        wait_until("every job of the round finished", secs(30), || {
            round_ids
                .iter()
                .all(|id| queue.get(*id).unwrap().state != JobState::Running)
        });
        for mut pool in pools {
            pool.shutdown(secs(5));
        }
        ids.extend(round_ids);
    }

    // A holder that is really gone is still reaped within lease + bound.
    queue.enqueue(NewJob::new("gone").queue("gone")).unwrap();
    let gone = queue
        .manual()
        .claim("gone", "vanished", 1, LEASE)
        .unwrap()
        .remove(0);
    let claimed = Instant::now();
    wait_until("the gone holder's job is reaped", secs(10), || {
        queue.get(gone.job_id).unwrap().state != JobState::Running
    });
    let reaped_after = claimed.elapsed();

    std::fs::remove_file(format!("{}.run", path.display())).unwrap();
    let _ = reaper.wait();

    let mut double = Vec::new();
    for id in &ids {
        let job = queue.get(*id).unwrap();
        if job.state != JobState::Succeeded || job.attempts != 1 || !job.errors.is_empty() {
            double.push(format!(
                "job {id}: {:?}, attempts {}, runs {}, errors {:?}",
                job.state,
                job.attempts,
                rec.runs_of(*id).len(),
                job.errors.iter().map(|e| &e.error).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        double.is_empty(),
        "{} of {} live holders lost their job to the reaper:\n{}",
        double.len(),
        ids.len(),
        double.join("\n")
    );
    // Lease 1 s + the reaper's interval (1 s) + its confirming looks.
    assert!(
        reaped_after < LEASE + secs(4),
        "a gone holder was reaped only after {reaped_after:?}"
    );
}

/// A regression test from a review: its doc says the bug it guards.
mod a_step_during_the_reapers_lock_wait {
    use chrono::Utc;
    use crossbeam_channel::bounded;
    use std::sync::Arc;
    use std::time::Duration;
    use tickler::{Durability, Error, JobState, ManualClock, NewJob, Queue, Reaper, ReaperConfig};

    #[test]
    /// The bug it guards (from a review):
    /// the reaper's clock-step hold compares wall and monotonic time at
    /// the top of a pass, but `Queue::reap` reads "now" again later, inside its
    /// write transaction, after waiting for the process's write connection (and
    /// SQLite's write lock, up to busy_timeout + busy_retry). A forward step
    /// that lands while the reaper waits for the lock is not seen by the
    /// detector of this pass, and `reap` runs with the stepped time: every live
    /// lease is taken back at once, with no hold, and live holders get
    /// LeaseLost (their jobs are handed to other workers while they still run).
    fn a_step_during_the_reapers_lock_wait_is_held_off_too() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let queue = Queue::builder(dir.path().join("q.db"))
            .sqlite(|o| o.durability(Durability::Normal))
            .clock(clock.clone())
            .open()
            .unwrap();
        let live = queue.enqueue(NewJob::new("k")).unwrap();
        let live_lease = queue
            .manual()
            .claim("default", "live-holder", 1, Duration::from_secs(30))
            .unwrap()
            .remove(0);
        queue.enqueue(NewJob::new("x").queue("other")).unwrap();
        let other = queue
            .manual()
            .claim("other", "test", 1, Duration::from_secs(60))
            .unwrap()
            .remove(0);

        let _reaper = Reaper::spawn(
            queue.clone(),
            ReaperConfig {
                interval: Duration::from_millis(10),
                clock_step_hold: Duration::from_secs(5),
                ..ReaperConfig::default()
            },
        );
        std::thread::sleep(Duration::from_millis(100));

        // Some ordinary write holds the write connection for 300 ms (here a
        // complete_with; in production an fsync on slow storage, or another
        // process holding SQLite's write lock).
        let (holding_tx, holding_rx) = bounded::<()>(1);
        let holder = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                let _ = queue.complete_with(&other, |_tx: &tickler::rusqlite::Transaction| {
                    holding_tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                    Err::<(), _>(Error::aborted("test only held the lock"))
                });
            })
        };
        holding_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100)); // the reaper is now waiting
        clock.advance(Duration::from_secs(3600)); // NTP steps the clock
        holder.join().unwrap();
        std::thread::sleep(Duration::from_millis(100));

        // Within the 5 s hold, the live holder renews its lease.
        let job = queue.get(live).unwrap();
        let beat = queue
            .manual()
            .heartbeat(&live_lease, Duration::from_secs(30));
        eprintln!(
            "job state {:?}, last_error {:?}, heartbeat {beat:?}",
            job.state, job.last_error
        );
        assert_eq!(
            job.state,
            JobState::Running,
            "taken back inside the clock-step hold"
        );
        assert!(
            beat.is_ok(),
            "live holder lost its lease inside the hold: {beat:?}"
        );
    }
}
