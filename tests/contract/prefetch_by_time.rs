//! A pool claims ahead of its free threads by time, not by count.
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

contract! { poolers:
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
    // The count is taken as the hand-back is sent; its commit may come a
    // little later on a loaded machine (through a pooler, later still).
    wait_until(
        "pool A's hand-back is committed",
        secs(5),
        || held_by(&queue, "pool-a") == THREADS_A,
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

contract! { poolers:
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

contract! { poolers:
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

/// The bugs these guard (from a hunt through other queues' reports):
/// failures other job queues had with prefetching,
/// claiming ahead and batched acknowledgement, tried on tickler.
///
/// Each test names the report it comes from. A pool "claims ahead" when it
/// has seen its handlers return fast (`warmed_up`): the jobs it claims
/// beyond its free threads wait in its job channel, running in the file,
/// until a thread takes them or they are handed back (`prefetch_hold`).
mod other_queues_prefetch_reports {
    use crate::support::common;
    use crate::support::pool;
    use crate::support::reliability;

    use pool::{ms, open_queue, secs, temp_db, wait_until, Recorder};
    use reliability::{expect_success, spawn_child};
    use serde_json::json;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Instant;
    use tickler::{
        Error, JobFilter, JobId, JobState, Lease, NewJob, Outcome, Queue, ReaperConfig, WorkerPool,
        WorkerPoolBuilder,
    };

    const WARM_UP: usize = 50;

    /// A pool of `threads` serving kinds `quick` and `script` (both the
    /// recorder's script), built by `tune`.
    fn pool(
        queue: &Queue,
        rec: &Arc<Recorder>,
        threads: usize,
        tune: impl FnOnce(WorkerPoolBuilder) -> WorkerPoolBuilder,
    ) -> WorkerPool {
        tune(
            WorkerPool::builder(queue)
                .threads(threads)
                .handler("quick", rec.script())
                .handler("script", rec.script()),
        )
        .start()
        .unwrap()
    }

    /// Runs `WARM_UP` jobs that return at once, so that `pool` has a mean run
    /// time of microseconds and claims far ahead of its free threads.
    fn warm_up(queue: &Queue, rec: &Arc<Recorder>) {
        let started = rec.started();
        pool::warm_up(queue, "quick", WARM_UP);
        assert_eq!(rec.started(), started + WARM_UP);
    }

    /// Enqueues a job that blocks at the recorder's gate and waits until it
    /// started.
    fn block_a_thread(queue: &Queue, rec: &Arc<Recorder>) -> JobId {
        let started = rec.started();
        let id = queue
            .enqueue(NewJob::new("script").payload(json!({"block": true})))
            .unwrap();
        wait_until("the blocking job started", secs(10), || {
            rec.started() == started + 1
        });
        id
    }

    fn running_ids(queue: &Queue) -> Vec<JobId> {
        queue
            .list(&JobFilter {
                state: Some(JobState::Running),
                limit: 10_000,
                ..JobFilter::default()
            })
            .unwrap()
            .into_iter()
            .map(|job| job.id)
            .collect()
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// rq/rq#2292 "Job still runs when canceled with job.cancel() before it
    /// starts": a job cancelled while it waits in a pool's channel (claimed
    /// ahead, running in the file, not started) must never start, and its
    /// unique_key must be free again once the pool has let it go.
    fn a_job_cancelled_while_claimed_ahead_never_starts() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        // A long holding time: the job stays claimed ahead until the gate opens.
        let mut pool = pool(&queue, &rec, 1, |b| b.prefetch_hold(secs(30)));
        warm_up(&queue, &rec);
        let blocker = block_a_thread(&queue, &rec);
        let ahead = queue
            .enqueue(NewJob::new("quick").unique_key("report-1"))
            .unwrap();
        wait_until("the job is claimed ahead", secs(10), || {
            running_ids(&queue).contains(&ahead)
        });
        assert!(rec.runs_of(ahead).is_empty());
        queue.cancel(ahead).unwrap();
        // Give the pool time to notice (its heartbeat thread looks every 100 ms).
        std::thread::sleep(ms(500));
        rec.gate.open();
        wait_until("the blocking job succeeded", secs(10), || {
            queue.get(blocker).unwrap().state == JobState::Succeeded
        });
        // A job with the same key can run now.
        let next = queue
            .enqueue(NewJob::new("quick").unique_key("report-1"))
            .unwrap();
        wait_until("the next job with the key ran", secs(10), || {
            queue.get(next).unwrap().state == JobState::Succeeded
        });
        assert!(
            rec.runs_of(ahead).is_empty(),
            "the cancelled job ran while it waited in the channel"
        );
        assert_eq!(queue.get(ahead).unwrap().state, JobState::Cancelled);
        pool.shutdown(secs(5));
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// MassTransit/MassTransit#3585 "Extend SQS visibility timeout for
    /// prefetched messages" (and spulec/PyQS#29): a prefetched message's
    /// visibility ran out while it waited for a consumer, so it was delivered
    /// twice. vsivsi/meteor-job-collection#164: jobs in the prefetch queue were
    /// failed for their work timeout before they started. Here: jobs wait
    /// claimed ahead for many lease lengths, with the reaper running every
    /// 50 ms; each must run once, on its first attempt, and its own timeout
    /// (shorter than the wait) must count from its start.
    fn a_job_claimed_ahead_keeps_its_lease_and_its_timeout_counts_from_its_start() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let mut pool = pool(&queue, &rec, 1, |b| {
            b.lease(ms(300))
                .prefetch_hold(secs(30))
                .reaper(ReaperConfig {
                    interval: ms(50),
                    ..ReaperConfig::default()
                })
        });
        warm_up(&queue, &rec);
        let blocker = block_a_thread(&queue, &rec);
        let ahead = queue
            .enqueue_batch(
                (0..5)
                    .map(|_| {
                        NewJob::new("script")
                            .payload(json!({"sleep_ms": 20}))
                            .max_attempts(1)
                            .timeout(ms(200))
                    })
                    .collect(),
            )
            .unwrap();
        wait_until("the jobs are claimed ahead", secs(10), || {
            let running = running_ids(&queue);
            ahead.iter().all(|id| running.contains(id))
        });
        // Five lease lengths, seven timeouts.
        std::thread::sleep(ms(1_500));
        for id in &ahead {
            let job = queue.get(*id).unwrap();
            assert_eq!(job.state, JobState::Running, "job {id} lost its lease");
            assert_eq!(job.attempts, 1);
        }
        rec.gate.open();
        wait_until("every job ran", secs(10), || {
            ahead
                .iter()
                .chain([&blocker])
                .all(|id| queue.get(*id).unwrap().state.is_terminal())
        });
        for id in &ahead {
            let job = queue.get(*id).unwrap();
            assert_eq!(job.state, JobState::Succeeded, "{id}: {:?}", job.last_error);
            let runs = rec.runs_of(*id);
            assert_eq!(runs.len(), 1, "job {id} ran {} times", runs.len());
            assert_eq!(runs[0].attempt, 1);
        }
        pool.shutdown(secs(5));
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// celery/celery#4537 "Worker prefetching tasks even after setting
    /// acks_late=True ...": stopped with 20 tasks reserved, the worker gave one
    /// back. Here: a pool holding 20 jobs claimed ahead behind a thread that
    /// outlives the shutdown grace hands every one of them back before
    /// `shutdown` returns (the process may exit right after), attempt given
    /// back, so that none of them is lost to the reaper or goes dead.
    fn shutdown_hands_back_every_job_claimed_ahead_at_once() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let mut first = pool(&queue, &rec, 1, |b| b.prefetch_hold(secs(30)));
        warm_up(&queue, &rec);
        let blocker = block_a_thread(&queue, &rec);
        let ahead = queue
            .enqueue_batch(
                (0..20)
                    .map(|_| NewJob::new("quick").max_attempts(1))
                    .collect(),
            )
            .unwrap();
        wait_until("the jobs are claimed ahead", secs(10), || {
            running_ids(&queue).len() == 21
        });
        let report = first.shutdown(ms(200));
        assert_eq!(report.released, 20, "{report:?}");
        assert_eq!(report.still_running, 1, "{report:?}");
        for id in &ahead {
            let job = queue.get(*id).unwrap();
            assert_eq!(job.state, JobState::Pending, "job {id} was not handed back");
            assert_eq!(job.attempts, 0);
        }
        assert_eq!(running_ids(&queue), vec![blocker]);
        rec.gate.open();
        let mut second = pool(&queue, &rec, 2, |b| b);
        wait_until("every job ran", secs(10), || {
            ahead
                .iter()
                .all(|id| queue.get(*id).unwrap().state == JobState::Succeeded)
        });
        second.shutdown(secs(5));
        drop(first);
    }
    }

    /// rails/solid_queue#119 "Fix a couple of race-conditions on shutdown",
    /// and celery/celery#4537 again: a claim that commits while the pool is
    /// being stopped. The dispatcher checks `stopping` before it claims; if the
    /// claim waits for the write lock (another process holds it) and commits
    /// after `shutdown` took the unstarted jobs out of the channel, what it
    /// claimed ahead lands in the channel of a stopped pool whose only thread
    /// is busy past the grace. `shutdown` has returned (the process may exit
    /// now), yet the job stays `running`, held by this pool: if the process
    /// exits, the job waits for the reaper, which takes an attempt from it
    /// (with `max_attempts(1)`: dead, never run).
    /// Stops a warmed-up 1-thread pool whose thread is blocked at the gate
    /// while its dispatcher waits for the write lock (held by "another
    /// process", a raw connection) to claim ahead a job that fell due; the
    /// lock is let go after `shutdown` returned. Returns the blocked job and
    /// the late one.
    fn stop_while_a_claim_waits(queue: &Queue, path: &Path, rec: &Arc<Recorder>) -> (JobId, JobId) {
        let mut pool = pool(queue, rec, 1, |b| {
            b.worker_id("stopping-pool")
                .lease(secs(2))
                .without_reaper()
                .without_scheduler()
        });
        warm_up(queue, rec);
        let blocker = block_a_thread(queue, rec);
        // Due in 1 s: the dispatcher sleeps until then, then claims it ahead
        // of its busy thread.
        let late = queue
            .enqueue(NewJob::new("quick").max_attempts(1).delay(secs(1)))
            .unwrap();
        // Another process's write transaction, held across the due time.
        let other = common::raw(path);
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        std::thread::sleep(ms(1_500));
        // The claim is now waiting for the lock; the pool is stopped.
        let report = pool.shutdown(ms(100));
        assert_eq!(report.still_running, 1, "{report:?}");
        assert_eq!(report.released, 0, "{report:?}");
        other.execute_batch("COMMIT").unwrap();
        // Well within the time the pool's thread stays blocked.
        std::thread::sleep(ms(1_000));
        drop(pool);
        (blocker, late)
    }

    contract! { sqlite_only:
    /// The bug it guards (from a hunt through other queues' reports):
    /// rails/solid_queue#119 "Fix a couple of race-conditions on shutdown",
    /// and celery/celery#4537 again: a claim that commits while the pool is
    /// being stopped. The dispatcher checks `stopping` before it claims; if the
    /// claim waits for the write lock (another process holds it) and commits
    /// after `shutdown` took the unstarted jobs out of the channel, what it
    /// claimed ahead lands in the channel of a stopped pool whose only thread
    /// is busy past the grace. `shutdown` had returned, yet the job stayed
    /// `running`, held by this pool, until that thread was free. Now the
    /// dispatcher hands back what a claim brings in after shutdown began.
    ///
    /// SQLite only: A claim waiting for SQLite's write lock; on PostgreSQL claims
    /// skip locked rows and never wait.
    fn a_claim_ahead_that_commits_during_shutdown_is_handed_back_too() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let (blocker, late) = stop_while_a_claim_waits(&queue, &path, &rec);
        let job = queue.get(late).unwrap();
        eprintln!(
            "after shutdown returned: job {late} is {:?}, attempts {}, claimed by {:?}",
            job.state, job.attempts, job.claimed_by
        );
        let held = job.state == JobState::Running;
        rec.gate.open();
        wait_until("the blocking job ended", secs(10), || {
            queue.get(blocker).unwrap().state == JobState::Succeeded
        });
        // In this process it heals once the thread is free: the worker takes
        // the job out of the channel and hands it back unstarted.
        wait_until("the late job is handed back", secs(10), || {
            queue.get(late).unwrap().state == JobState::Pending
        });
        assert!(rec.runs_of(late).is_empty());
        assert!(
            !held,
            "a job claimed ahead as shutdown ran stayed running (held by the stopped pool) after shutdown returned"
        );
    }
    }

    const ENV_DB: &str = "TICKLER_HUNT_PREFETCH_DB";
    const CHILD: &str = "stop_while_a_claim_waits_child";

    contract! { sqlite_only:
    /// The bug it guards (from a hunt through other queues' reports):
    /// The same, with the process exiting soon after `shutdown` returned, as a
    /// service does: the job it claimed ahead was left running in the file; the
    /// reaper took it back with an attempt used, and with `max_attempts(1)` it
    /// was dead without ever having started. (A process that exits in the
    /// milliseconds between such a late claim and its hand-back still leaves
    /// the job to the reaper.)
    ///
    /// SQLite only: A claim waiting for SQLite's write lock; on PostgreSQL claims
    /// skip locked rows and never wait.
    fn a_process_exiting_after_shutdown_leaves_no_job_claimed_ahead() {
        let (dir, path) = temp_db();
        let mut child = spawn_child(
            &crate::support::engine::case_name(module_path!(), CHILD),
            dir.path(),
            "child",
            &[(ENV_DB, path.to_str().unwrap())],
        );
        expect_success(&mut child, dir.path(), "child", secs(60));
        let queue = open_queue(&path);
        let late = JobId(
            std::fs::read_to_string(dir.path().join("late"))
                .unwrap()
                .parse()
                .unwrap(),
        );
        let job = queue.get(late).unwrap();
        eprintln!(
            "after the process exited: job {late} is {:?}, attempts {}, claimed by {:?}",
            job.state, job.attempts, job.claimed_by
        );
        // Its holder is gone: opening the queue took it back at once, as
        // a run that never started, without waiting for its lease (2 s).
        let job = queue.get(late).unwrap();
        assert_eq!(
            (job.state, job.attempts),
            (JobState::Pending, 0),
            "a job that never started: {:?}",
            job.last_error
        );
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// The child of the test above: does nothing unless started by it.
    fn stop_while_a_claim_waits_child() {
        let Some(db) = std::env::var_os(ENV_DB) else {
            return;
        };
        let path = std::path::PathBuf::from(db);
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let (_, late) = stop_while_a_claim_waits(&queue, &path, &rec);
        std::fs::write(path.with_file_name("late"), late.0.to_string()).unwrap();
        // Returning ends the process, the blocked handler with it.
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// MassTransit/MassTransit#6179 (a duplicate delivery's lock context never
    /// completed) and sidekiq/sidekiq#3039 (duplicate jobs with the same JID):
    /// one batched completion holding the same job twice, under its old
    /// (reaped) lease and under its new one, in either order, plus the new one
    /// twice. Only the new lease completes it, once; every other entry is
    /// `LeaseLost`; the other jobs of the batch complete.
    fn a_batch_with_an_old_and_a_new_lease_of_one_job_completes_it_once() {
        let (_dir, path) = temp_db();
        let (queue, clock) = common::manual_queue(&path);
        let ids = queue
            .enqueue_batch((0..3).map(|_| NewJob::new("k")).collect())
            .unwrap();
        let first = queue.manual().claim("default", "w", 3, secs(10)).unwrap();
        assert_eq!(first.len(), 3);
        let old = first.iter().find(|l| l.job_id == ids[1]).unwrap().clone();
        // The job's lease runs out (the others are renewed), the reaper takes
        // it back, it is claimed again (an hour is past any default backoff).
        for lease in first.iter().filter(|l| l.job_id != ids[1]) {
            queue.manual().heartbeat(lease, secs(10_000)).unwrap();
        }
        clock.advance(secs(11));
        queue.manual().reap().unwrap();
        clock.advance(secs(3_600));
        let again = queue.manual().claim("default", "w", 3, secs(10)).unwrap();
        assert_eq!(again.len(), 1);
        let new = again[0].clone();
        assert_eq!(new.job_id, old.job_id);
        assert_ne!(new.run_token, old.run_token);
        let others: Vec<&Lease> = first.iter().filter(|l| l.job_id != ids[1]).collect();
        let batch: Vec<(&Lease, Outcome)> = vec![
            (others[0], Outcome::Complete),
            (&old, Outcome::Complete),
            (&new, Outcome::Complete),
            (&old, Outcome::Complete),
            (&new, Outcome::Complete),
            (others[1], Outcome::Complete),
        ];
        let results = queue.manual().record_outcomes(&batch).unwrap();
        let lost = |r: &tickler::Result<()>| matches!(r, Err(Error::LeaseLost { .. }));
        assert!(results[0].is_ok(), "{results:?}");
        assert!(lost(&results[1]), "{results:?}");
        assert!(results[2].is_ok(), "{results:?}");
        assert!(lost(&results[3]), "{results:?}");
        assert!(lost(&results[4]), "{results:?}");
        assert!(results[5].is_ok(), "{results:?}");
        for id in &ids {
            assert_eq!(queue.get(*id).unwrap().state, JobState::Succeeded);
        }
        assert_eq!(
            queue.get(ids[1]).unwrap().run_token.as_ref(),
            Some(&new.run_token)
        );

        // The new lease first, then the old one.
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        let old = queue.manual().claim("default", "w", 1, secs(10)).unwrap().remove(0);
        clock.advance(secs(11));
        queue.manual().reap().unwrap();
        clock.advance(secs(3_600));
        let new = queue.manual().claim("default", "w", 1, secs(10)).unwrap().remove(0);
        assert_eq!(new.job_id, id);
        let results = queue
            .manual().record_outcomes(&[(&new, Outcome::Complete), (&old, Outcome::Complete)])
            .unwrap();
        assert!(results[0].is_ok(), "{results:?}");
        assert!(lost(&results[1]), "{results:?}");
        assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// aspnetboilerplate/aspnetboilerplate#6647 "GetWaitingJobsAsync with
    /// 1000 ... high waiting time for tasks with higher priority": a batch
    /// fetched ahead holds a priority job back until it is worked off. Here a
    /// warmed-up 1-thread pool with default settings works off 2 ms jobs; a
    /// job of higher priority enqueued meanwhile waits for a handful of them
    /// (what was claimed ahead for half the holding time, plus aging), not for
    /// hundreds.
    fn a_priority_job_waits_for_little_of_what_was_claimed_ahead() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let rec = Recorder::new();
        let mut pool = pool(&queue, &rec, 1, |b| b);
        warm_up(&queue, &rec);
        queue
            .enqueue_batch(
                (0..600)
                    .map(|_| NewJob::new("script").payload(json!({"sleep_ms": 2})))
                    .collect(),
            )
            .unwrap();
        wait_until("a hundred have started", secs(30), || {
            rec.started() >= WARM_UP + 100
        });
        let urgent = queue.enqueue(NewJob::new("quick").priority(10)).unwrap();
        let enqueued = Instant::now();
        wait_until("the urgent job ran", secs(30), || {
            !rec.runs_of(urgent).is_empty()
        });
        let started = rec.runs_of(urgent)[0].started;
        let before = rec
            .runs()
            .iter()
            .filter(|r| r.kind == "script" && r.started > enqueued && r.started < started)
            .count();
        let left = queue.count(JobState::Pending).unwrap();
        eprintln!(
            "the urgent job waited {:?} and for {before} jobs claimed before it ({left} still pending)",
            started - enqueued
        );
        assert!(
            left > 0,
            "the backlog ran out first: the test proves nothing"
        );
        assert!(
            before <= 60,
            "the urgent job waited for {before} jobs of lower priority"
        );
        pool.shutdown(secs(10));
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// Hand-back storms (the other side of celery/celery#2788, "Any way to
    /// disable prefetching?": a busy worker keeps what an idle one could run):
    /// two warmed-up pools on one file, each with its only thread blocked.
    /// Jobs neither can start must not be passed back and forth between them
    /// (each claiming them ahead, holding them, handing them back, ...): each
    /// pool hands back at most once until one of its threads is free, and the
    /// jobs stay pending with no attempt used.
    fn two_busy_pools_do_not_pass_jobs_back_and_forth() {
        let (_dir, path) = temp_db();
        let queue_a = open_queue(&path);
        let queue_b = open_queue(&path);
        let rec = Recorder::new();
        // A job one pool hands back is no new row: on an engine without
        // notifications across processes (MySQL) the other pool finds it
        // when its idle wait ends. A short wait bounds the passing phase
        // well inside the half second this test lets it run.
        let mut a = pool(&queue_a, &rec, 1, |b| b.worker_id("pool-a").max_idle(ms(100)));
        warm_up(&queue_a, &rec);
        let mut b = pool(&queue_b, &rec, 1, |b| b.worker_id("pool-b").max_idle(ms(100)));
        // Warm up B alone: A's only thread is blocked first.
        block_a_thread(&queue_a, &rec);
        warm_up(&queue_b, &rec);
        block_a_thread(&queue_b, &rec);
        let held = |queue: &Queue, worker: &str| {
            queue
                .list(&JobFilter {
                    state: Some(JobState::Running),
                    limit: 1_000,
                    ..JobFilter::default()
                })
                .unwrap()
                .iter()
                .filter(|j| j.claimed_by.as_deref() == Some(worker))
                .count()
        };
        wait_until("each pool runs one blocked job", secs(10), || {
            held(&queue_a, "pool-a") == 1 && held(&queue_a, "pool-b") == 1
        });
        // (A may have claimed B's warm-up jobs ahead and handed them back.)
        let before = a.stats().handed_back + b.stats().handed_back;
        let jobs = queue_a
            .enqueue_batch((0..30).map(|_| NewJob::new("quick")).collect())
            .unwrap();
        // Let them be claimed ahead and handed back, then watch.
        std::thread::sleep(ms(500));
        let handed_back = a.stats().handed_back + b.stats().handed_back - before;
        for _ in 0..20 {
            std::thread::sleep(ms(25));
            assert_eq!(queue_a.count(JobState::Pending).unwrap(), 30);
        }
        let later = a.stats().handed_back + b.stats().handed_back - before;
        eprintln!("handed back: {handed_back} in the first 500 ms, {later} after 1 s");
        assert_eq!(later, handed_back, "the pools keep passing jobs around");
        assert!(handed_back <= 60, "{handed_back} hand-backs of 30 jobs");
        for id in &jobs {
            assert_eq!(queue_a.get(*id).unwrap().attempts, 0);
        }
        rec.gate.open();
        wait_until("every job ran", secs(10), || {
            jobs.iter()
                .all(|id| queue_a.get(*id).unwrap().state == JobState::Succeeded)
        });
        for id in &jobs {
            assert_eq!(rec.runs_of(*id).len(), 1);
        }
        a.shutdown(secs(5));
        b.shutdown(secs(5));
    }
    }

    contract! { poolers:
    /// The bug it guards (from a hunt through other queues' reports):
    /// Hand-backs must never cost an attempt (celery/celery#4537's requeued
    /// tasks counted as delivered; solid_queue#119's released executions):
    /// two pools on one file that hand back all the time (a holding time of
    /// 1 ms, 3 ms jobs, each pool warmed up to expect microseconds) work off
    /// jobs allowed one attempt each. Every one succeeds, ran once, on
    /// attempt 1; none goes dead.
    fn constant_hand_backs_cost_no_attempt() {
        let (_dir, path) = temp_db();
        let queue_a = open_queue(&path);
        let queue_b = open_queue(&path);
        let rec = Recorder::new();
        let mut a = pool(&queue_a, &rec, 1, |b| b.prefetch_hold(ms(1)));
        warm_up(&queue_a, &rec);
        let mut b = pool(&queue_b, &rec, 1, |b| b.prefetch_hold(ms(1)));
        let jobs = queue_a
            .enqueue_batch(
                (0..300)
                    .map(|_| {
                        NewJob::new("script")
                            .payload(json!({"sleep_ms": 3}))
                            .max_attempts(1)
                    })
                    .collect(),
            )
            .unwrap();
        wait_until("every job finished", secs(60), || {
            jobs.iter()
                .all(|id| queue_a.get(*id).unwrap().state.is_terminal())
        });
        let handed_back = a.stats().handed_back + b.stats().handed_back;
        eprintln!("handed back {handed_back} times");
        assert!(
            handed_back > 0,
            "nothing was handed back: the test proves nothing"
        );
        for id in &jobs {
            let job = queue_a.get(*id).unwrap();
            assert_eq!(job.state, JobState::Succeeded, "{id}: {:?}", job.last_error);
            let runs = rec.runs_of(*id);
            assert_eq!(runs.len(), 1);
            assert_eq!(runs[0].attempt, 1);
        }
        a.shutdown(secs(5));
        b.shutdown(secs(5));
    }
    }
}
