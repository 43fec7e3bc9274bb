//! What only the PostgreSQL engine has to get right: connections cut by
//! the server and a server restart in the middle of work reach no user
//! code as errors (beyond the documented retry window, 30 s by default);
//! wake-ups across processes come by LISTEN and fall back to polling when
//! it is off; "now" is the server's clock; claims stay right when the
//! server plans them generically. The contract itself (claims, fencing,
//! reaper, pools, schedules) runs on both engines from the same test
//! bodies: see tests/contract.
#![cfg(feature = "postgres")]

use crate::support::pg;

use pg::{exclusive_server, restart_server, terminate_connections, test_database};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{JobContext, JobError, JobId, JobState, NewJob, Queue, WorkerPool};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs of each job, by id.
type Runs = Arc<Mutex<HashMap<JobId, usize>>>;

fn counting_pool(queue: &Queue, runs: &Runs, threads: usize) -> WorkerPool {
    let runs = Arc::clone(runs);
    // A short lease: a claim lost with its connection (not taken up) comes
    // back within seconds.
    WorkerPool::builder(queue)
        .threads(threads)
        .lease(secs(3))
        .handler("work", move |ctx: &JobContext| -> Result<(), JobError> {
            std::thread::sleep(Duration::from_millis(1));
            *runs.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
            Ok(())
        })
        .start()
        .expect("start pool")
}

/// Enqueues `n` jobs one by one from a thread, counting errors.
fn enqueue_in_background(
    queue: &Queue,
    n: usize,
    errors: &Arc<AtomicUsize>,
) -> std::thread::JoinHandle<Vec<JobId>> {
    let queue = queue.clone();
    let errors = Arc::clone(errors);
    std::thread::spawn(move || {
        let mut ids = Vec::new();
        for i in 0..n {
            match queue.enqueue(NewJob::new("work").payload(serde_json::json!({ "i": i }))) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    eprintln!("enqueue failed: {e}");
                    errors.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        ids
    })
}

/// Waits until `n` jobs succeeded; on timeout, shows where the others are.
fn wait_all_succeeded(queue: &Queue, n: u64) {
    let deadline = Instant::now() + secs(90);
    while queue.count(JobState::Succeeded).unwrap_or(0) < n {
        if Instant::now() > deadline {
            let stuck: Vec<_> = queue
                .list(&tickler::JobFilter::default())
                .unwrap_or_default()
                .into_iter()
                .filter(|j| j.state != JobState::Succeeded)
                .take(5)
                .collect();
            panic!(
                "not every job succeeded: {:?}; some of the others: {stuck:#?}",
                queue.stats()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_all_succeeded(queue: &Queue, ids: &[JobId], runs: &Runs) {
    for id in ids {
        let job = queue.get(*id).expect("get");
        assert_eq!(job.state, JobState::Succeeded, "job {id}: {job:?}");
    }
    let runs = runs.lock().unwrap();
    for id in ids {
        assert!(
            runs.get(id).copied().unwrap_or(0) >= 1,
            "job {id} never ran"
        );
    }
}

#[test]
fn connections_cut_by_the_server_reach_no_user_code() {
    let Some(db) = test_database() else { return };
    let queue = Queue::open(db.url()).expect("open");
    let runs: Runs = Arc::default();
    let mut pool = counting_pool(&queue, &runs, 2);
    let errors = Arc::new(AtomicUsize::new(0));
    let producer = enqueue_in_background(&queue, 600, &errors);
    let mut cut = 0;
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(60));
        // Every connection of the database but the one doing it: the
        // pool's, the listener's, the producer's.
        cut += terminate_connections(db.url(), None);
    }
    let ids = producer.join().expect("producer");
    assert!(cut > 0, "no connection was cut");
    assert_eq!(errors.load(Ordering::SeqCst), 0, "an enqueue failed");
    assert_eq!(ids.len(), 600);
    wait_all_succeeded(&queue, 600);
    let report = pool.shutdown(secs(10));
    assert_eq!(report.still_running, 0);
    assert_all_succeeded(&queue, &ids, &runs);
    // An enqueue whose COMMIT was answered on a connection cut right then
    // was retried: it must not have stored its job twice.
    let stored = queue.list(&tickler::JobFilter {
        limit: 10_000,
        ..Default::default()
    });
    assert_eq!(stored.expect("list").len(), 600, "jobs stored twice");
}

#[test]
fn a_server_restart_in_the_middle_of_work_reaches_no_user_code() {
    let _exclusive = exclusive_server();
    let Some(db) = test_database() else { return };
    if !pg::can_restart_server() {
        eprintln!("note: skipped: TICKLER_TEST_PG_CTL is not set");
        assert!(!pg::in_ci(), "CI must be able to restart the server");
        return;
    }
    let queue = Queue::open(db.url()).expect("open");
    let runs: Runs = Arc::default();
    let mut pool = counting_pool(&queue, &runs, 2);
    let errors = Arc::new(AtomicUsize::new(0));
    let producer = enqueue_in_background(&queue, 400, &errors);
    std::thread::sleep(Duration::from_millis(200));
    assert!(restart_server(), "restart");
    let ids = producer.join().expect("producer");
    assert_eq!(errors.load(Ordering::SeqCst), 0, "an enqueue failed");
    wait_all_succeeded(&queue, 400);
    pool.shutdown(secs(10));
    assert_all_succeeded(&queue, &ids, &runs);
}

/// An idle pool in one "process" (its own `Queue`, so no in-process
/// wake-up) starts a job enqueued in another well within a second, though
/// it would otherwise not look for 30 s: the wake-up came by LISTEN, at
/// once (not at the end of the listener's one-second wait for more).
#[test]
fn a_job_from_another_process_wakes_an_idle_pool_by_listen() {
    let Some(db) = test_database() else { return };
    let worker_side = Queue::builder(db.url())
        .fallback_poll(secs(30))
        .open()
        .expect("open");
    let runs: Runs = Arc::default();
    let runs2 = Arc::clone(&runs);
    let mut pool = WorkerPool::builder(&worker_side)
        .threads(1)
        .max_idle(secs(30))
        .poll_interval(secs(30))
        .handler("work", move |ctx: &JobContext| -> Result<(), JobError> {
            *runs2.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
            Ok(())
        })
        .start()
        .expect("start");
    // Let it find nothing, go to sleep and start listening.
    std::thread::sleep(Duration::from_millis(500));
    let producer_side = Queue::open(db.url()).expect("open");
    for _ in 0..3 {
        let id = producer_side.enqueue(NewJob::new("work")).expect("enqueue");
        let asked = Instant::now();
        wait_until("the job started", secs(10), || {
            runs.lock().unwrap().contains_key(&id)
        });
        assert!(
            asked.elapsed() < Duration::from_millis(700),
            "took {:?}: not woken by NOTIFY at once",
            asked.elapsed()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    pool.shutdown(secs(5));
}

/// Behind a pooler in transaction mode LISTEN does not work: with
/// `listen(false)` a pool still finds other processes' jobs, by polling
/// every `fallback_poll`.
#[test]
fn without_listen_an_idle_pool_polls_at_the_fallback_interval() {
    let Some(db) = test_database() else { return };
    let worker_side = Queue::builder(db.url())
        .listen(false)
        .fallback_poll(Duration::from_millis(200))
        .open()
        .expect("open");
    let runs: Runs = Arc::default();
    let runs2 = Arc::clone(&runs);
    let mut pool = WorkerPool::builder(&worker_side)
        .threads(1)
        .max_idle(secs(30))
        .handler("work", move |ctx: &JobContext| -> Result<(), JobError> {
            *runs2.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
            Ok(())
        })
        .start()
        .expect("start");
    std::thread::sleep(Duration::from_millis(500));
    let producer_side = Queue::open(db.url()).expect("open");
    let id = producer_side.enqueue(NewJob::new("work")).expect("enqueue");
    wait_until("the job started by polling", secs(10), || {
        runs.lock().unwrap().contains_key(&id)
    });
    pool.shutdown(secs(5));
}

/// "Now" on PostgreSQL is the server's clock (sampled, then counted on the
/// monotonic clock), not this machine's wall clock; a clock given to the
/// builder (tests) replaces it.
#[test]
fn now_is_the_servers_clock_unless_one_is_given() {
    let Some(db) = test_database() else { return };
    let queue = Queue::open(db.url()).expect("open");
    let mut client = db.connect();
    for _ in 0..5 {
        let server: i64 = client
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                &[],
            )
            .unwrap()
            .get(0);
        let ours = queue.clock().now_ms();
        assert!(
            (ours - server).abs() < 250,
            "queue clock {ours} vs server {server}"
        );
    }
    let manual = Arc::new(tickler::ManualClock::new(
        chrono::DateTime::from_timestamp(1_000_000, 0).unwrap(),
    ));
    let fixed = Queue::builder(db.url())
        .clock(manual.clone())
        .open()
        .expect("open");
    assert_eq!(fixed.clock().now_ms(), 1_000_000_000);
    // A job due in 30 s by the manual clock is not claimed by a handle
    // whose clock is the server's, and is by one 30 s ahead.
    fixed
        .enqueue(NewJob::new("work").delay(secs(3600)))
        .expect("enqueue");
    manual.advance(secs(3601));
    assert_eq!(fixed.claim("default", "w", 1, secs(30)).unwrap().len(), 1);
}

/// The claim is written so that a generic plan (what PostgreSQL uses for
/// a prepared statement after five runs, or always with this setting)
/// still takes jobs in order and only due ones.
#[test]
fn claims_stay_right_under_generic_plans() {
    let Some(db) = test_database() else { return };
    let url = format!(
        "{}{}options=-c%20plan_cache_mode%3Dforce_generic_plan",
        db.url(),
        if db.url().contains('?') { "&" } else { "?" }
    );
    let queue = Queue::open(&url).expect("open");
    let mode: String = pg::connect(&url, "tickler_plan_check")
        .query_one("SHOW plan_cache_mode", &[])
        .expect("SHOW")
        .get(0);
    assert_eq!(mode, "force_generic_plan");
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(
            queue
                .enqueue(NewJob::new("work").priority(i % 4))
                .expect("enqueue"),
        );
    }
    queue
        .enqueue(NewJob::new("work").priority(100).delay(secs(3600)))
        .expect("enqueue future");
    let mut seen = Vec::new();
    for _ in 0..12 {
        for lease in queue.claim("default", "w", 4, secs(30)).expect("claim") {
            seen.push(lease.priority);
            queue.complete(&lease).expect("complete");
        }
    }
    assert_eq!(seen.len(), 40, "the future job must not be claimed");
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "claims not in priority order");
}
