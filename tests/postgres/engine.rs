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
        .postgres(|o| o.fallback_poll(secs(30)))
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
        .postgres(|o| o.listen(false))
        .postgres(|o| o.fallback_poll(Duration::from_millis(200)))
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
    assert_eq!(
        fixed
            .manual()
            .claim("default", "w", 1, secs(30))
            .unwrap()
            .len(),
        1
    );
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
        for lease in queue
            .manual()
            .claim("default", "w", 4, secs(30))
            .expect("claim")
        {
            seen.push(lease.priority);
            queue.manual().complete(&lease).expect("complete");
        }
    }
    assert_eq!(seen.len(), 40, "the future job must not be claimed");
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "claims not in priority order");
}

/// A regression test from a hunt through other queues' PostgreSQL reports: its doc says the bug it guards.
mod connections {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::time::{Duration, Instant};
    use tickler::{NewJob, Queue};

    fn tickler_connections(client: &mut postgres::Client) -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'tickler'",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0)
    }

    /// Connection counts are a recurring complaint against PostgreSQL queues
    /// (graphile-worker #119, queue_classic #184: a LISTEN connection per
    /// process on top of each pool). A dropped `Queue` leaves nothing behind
    /// (tests/contract/queue_drop.rs for SQLite): its pool, listener and notifier close
    /// their connections, so an application that opens and closes queues does
    /// not run the server out of connections.
    #[test]
    /// The bug it guards (from a hunt through other queues' PostgreSQL reports):
    /// Connections a queue holds on the server, and when it lets them go.
    fn a_dropped_queue_closes_its_connections_soon() {
        let Some(db) = test_database() else { return };
        let mut observer = db.connect();
        for round in 0..3 {
            let queue = Queue::open(db.url()).expect("open");
            let _watcher = queue
                .manual()
                .watcher()
                .expect("watcher (starts the listener)");
            queue
                .enqueue(NewJob::new("work"))
                .expect("enqueue (starts the notifier)");
            std::thread::sleep(Duration::from_millis(300));
            assert!(tickler_connections(&mut observer) > 0);
            drop(_watcher);
            drop(queue);
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                let left = tickler_connections(&mut observer);
                if left == 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: {left} connections still open 3 s after the queue was dropped"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A regression test from a hunt through other queues' PostgreSQL reports: its doc says the bug it guards.
mod cron {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::collections::HashMap;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;
    use tickler::{JobFilter, ManualClock, NewSchedule, OverlapPolicy, Queue};

    /// Solid Queue #636 and #638, and the Oban cron plugin's reason for unique
    /// jobs: several scheduler processes fire the same recurring task at the
    /// same moment. Four "machines" run the due ticks together every minute
    /// for 30 minutes: 30 jobs, one per tick.
    #[test]
    /// The bug it guards (from a hunt through other queues' PostgreSQL reports):
    /// Schedules on several machines: each tick fires once, none is lost.
    fn schedulers_on_four_machines_fire_each_tick_once() {
        let Some(db) = test_database() else { return };
        let clock = Arc::new(ManualClock::new(
            chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        ));
        let machines: Vec<Queue> = (0..4)
            .map(|_| {
                Queue::builder(db.url())
                    .clock(clock.clone())
                    .open()
                    .expect("open")
            })
            .collect();
        for m in &machines {
            m.upsert_schedule(
                NewSchedule::new("every-minute", "* * * * *", "tick").overlap(OverlapPolicy::Allow),
            )
            .expect("every machine declares the schedule at start");
        }
        for _ in 0..30 {
            clock.advance(Duration::from_secs(60));
            let start = Arc::new(Barrier::new(machines.len()));
            let handles: Vec<_> = machines
                .iter()
                .map(|m| {
                    let (m, start) = (m.clone(), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        m.manual()
                            .run_due_ticks()
                            .expect("run_due_ticks")
                            .jobs
                            .len()
                    })
                })
                .collect();
            let fired: usize = handles.into_iter().map(|h| h.join().expect("thread")).sum();
            assert_eq!(fired, 1, "one job per tick across the machines");
        }
        let jobs = machines[0]
            .list(&JobFilter {
                kind: Some("tick".into()),
                limit: 1_000,
                ..Default::default()
            })
            .expect("list");
        assert_eq!(jobs.len(), 30);
        let mut per_due: HashMap<i64, usize> = HashMap::new();
        for j in &jobs {
            *per_due.entry(j.run_at.timestamp()).or_default() += 1;
        }
        assert!(per_due.values().all(|n| *n == 1), "{per_due:?}");
    }
}

/// The bugs these guard (from a hunt through other queues' PostgreSQL reports):
/// Failures other PostgreSQL-backed queues met when the database was set
/// up by a DBA rather than by the queue: a role that may use the tables but
/// not create any, timeouts set for every session, idle sessions cut by the
/// server, a server time zone far from UTC.
mod dba {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::time::Duration;
    use tickler::{JobState, NewJob, Queue};

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// `url` with `user` as its user (URL form `postgres://user@host…`).
    fn as_user(url: &str, user: &str) -> String {
        let scheme_end = url.find("://").expect("a URL") + 3;
        let rest = &url[scheme_end..];
        let host_at = rest.find('@').map_or(0, |at| at + 1);
        format!("{}{user}@{}", &url[..scheme_end], &rest[host_at..])
    }

    fn alter_database(db: &pg::TestDb, setting: &str) {
        db.connect()
            .batch_execute(&format!("ALTER DATABASE \"{}\" SET {setting}", db.name()))
            .expect("ALTER DATABASE");
    }

    /// graphile-worker #132 and #151: the application runs as a role that may
    /// read and write the queue's tables but not create tables (PostgreSQL 15
    /// no longer lets every role create in `public`); the schema was migrated
    /// by its owner. Opening the queue must not need CREATE when there is
    /// nothing to migrate.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn a_role_without_create_opens_a_migrated_database() {
        let Some(db) = test_database() else { return };
        let role = format!("tickler_app_{:08x}", fastrand::u32(..));
        {
            let owner = Queue::open(db.url()).expect("the owner migrates");
            owner.enqueue(NewJob::new("work")).expect("enqueue");
        }
        let mut admin = db.connect();
        admin
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN;
                 REVOKE CREATE ON SCHEMA public FROM PUBLIC;
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role};"
            ))
            .expect("create the application's role");
        let result = (|| -> tickler::Result<()> {
            let app = Queue::open(as_user(db.url(), &role))?;
            let id = app.enqueue(NewJob::new("work"))?;
            let lease = app.manual().claim("default", "w", 2, secs(30))?;
            assert_eq!(lease.len(), 2);
            for l in &lease {
                app.manual().complete(l)?;
            }
            assert_eq!(app.get(id)?.state, JobState::Succeeded);
            Ok(())
        })();
        let server = db.server_url().to_owned();
        drop(admin);
        drop(db);
        pg::connect(&server, "tickler_test_harness")
            .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
            .expect("DROP ROLE");
        result.expect("the application's role uses a migrated queue");
    }

    /// graphile_worker_rs #465, n8n #34685: processes that start together on a
    /// fresh database race the schema install; here the DBA also set a
    /// `lock_timeout` for every session (a common safety net), so the ones
    /// waiting for the first one's migration are cancelled after 10 ms.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn processes_starting_together_migrate_once_under_a_dba_lock_timeout() {
        let Some(db) = test_database() else { return };
        alter_database(&db, "lock_timeout = '10ms'");
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let url = db.url().to_owned();
                std::thread::spawn(move || {
                    Queue::builder(&url)
                        .busy_retry(secs(5))
                        .open()
                        .map(|q| q.enqueue(NewJob::new("work")).map(|_| ()))
                })
            })
            .collect();
        for h in handles {
            h.join()
                .expect("thread")
                .expect("open")
                .expect("enqueue after open");
        }
        let row = db
            .connect()
            .query_one(
                "SELECT count(*), count(DISTINCT version) FROM tickler_schema_migrations",
                &[],
            )
            .expect("versions");
        let (rows, versions): (i64, i64) = (row.get(0), row.get(1));
        assert!(versions > 0);
        assert_eq!(rows, versions, "each migration applied once");
    }

    /// matrix-authentication-service #2625, JobRunr #784: connections the
    /// server cut (here by the DBA's `idle_session_timeout`) must not stop the
    /// queue or reach the application as errors.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn idle_sessions_cut_by_the_server_reach_no_user_code() {
        let Some(db) = test_database() else { return };
        alter_database(&db, "idle_session_timeout = '150ms'");
        let queue = Queue::open(db.url()).expect("open");
        for round in 0..6 {
            std::thread::sleep(Duration::from_millis(300));
            let id = queue
                .enqueue(NewJob::new("work"))
                .unwrap_or_else(|e| panic!("enqueue, round {round}: {e}"));
            std::thread::sleep(Duration::from_millis(300));
            let leases = queue
                .manual()
                .claim("default", "w", 1, secs(30))
                .unwrap_or_else(|e| panic!("claim, round {round}: {e}"));
            assert_eq!(leases.len(), 1);
            std::thread::sleep(Duration::from_millis(300));
            queue
                .manual()
                .complete(&leases[0])
                .unwrap_or_else(|e| panic!("complete, round {round}: {e}"));
            assert_eq!(queue.get(id).expect("get").state, JobState::Succeeded);
        }
    }

    /// A DBA's `idle_session_timeout` ends every idle connection of a pool,
    /// over and over: each replacement is normal work, not a warning. Said
    /// once at info level per process, and the listening connection (idle
    /// by nature) is not ended at each lull. Its own process: the log is
    /// one per process, and the torture test of this binary owns this one's.
    #[test]
    fn sessions_ended_for_idling_are_replaced_without_a_warning() {
        const CHILD: &str = "TICKLER_TEST_QUIET_IDLE_URL";
        if let Some(url) = std::env::var_os(CHILD) {
            idle_sessions_ended_in_this_process(url.to_str().expect("URL"));
            return;
        }
        let Some(db) = test_database() else { return };
        alter_database(&db, "idle_session_timeout = '200ms'");
        let ended = |db: &pg::TestDb| -> i64 {
            db.connect()
                .query_one(
                    "SELECT sessions_fatal FROM pg_stat_database WHERE datname = current_database()",
                    &[],
                )
                .unwrap()
                .get(0)
        };
        let before = ended(&db);
        let exe = std::env::current_exe().expect("test binary");
        let name = crate::support::engine::test_path(
            module_path!(),
            "sessions_ended_for_idling_are_replaced_without_a_warning",
        );
        let out = std::process::Command::new(exe)
            .args(["--exact", &name, "--nocapture", "--test-threads=1"])
            .env(CHILD, db.url())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run the child");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
        let ended = ended(&db) - before;
        assert!(
            ended >= 3,
            "the server ended {ended} idle sessions: the test saw too few to say"
        );
    }

    /// The child of the test above: a pool and a queue idle longer than the
    /// timeout between jobs, some pauses shorter than the pool's unchecked
    /// reuse (the first statement meets the ended session), some longer
    /// (the pool's check finds it).
    fn idle_sessions_ended_in_this_process(url: &str) {
        static LOGGED: std::sync::Mutex<Vec<(log::Level, String)>> =
            std::sync::Mutex::new(Vec::new());
        struct Capture;
        impl log::Log for Capture {
            fn enabled(&self, _: &log::Metadata<'_>) -> bool {
                true
            }
            fn log(&self, r: &log::Record<'_>) {
                if r.level() <= log::Level::Info {
                    let line = format!("{} {}", r.target(), r.args());
                    LOGGED.lock().unwrap().push((r.level(), line));
                }
            }
            fn flush(&self) {}
        }
        log::set_boxed_logger(Box::new(Capture)).expect("the child's only logger");
        log::set_max_level(log::LevelFilter::Info);
        let queue = Queue::open(url).expect("open");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&done);
        let mut pool = tickler::WorkerPool::builder(&queue)
            .threads(2)
            .handler(
                "work",
                move |_: &tickler::JobContext| -> Result<(), tickler::JobError> {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                },
            )
            .start()
            .expect("start pool");
        for (round, pause) in [400, 1500, 400, 600, 1500, 400].into_iter().enumerate() {
            std::thread::sleep(Duration::from_millis(pause));
            let id = queue
                .enqueue(NewJob::new("work"))
                .unwrap_or_else(|e| panic!("enqueue, round {round}: {e}"));
            let deadline = std::time::Instant::now() + secs(30);
            while queue.get(id).expect("get").state != JobState::Succeeded {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: job not run"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        pool.shutdown(secs(10));
        assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 6);
        let logged = LOGGED.lock().unwrap().clone();
        let loud: Vec<_> = logged
            .iter()
            .filter(|(level, _)| *level <= log::Level::Warn)
            .collect();
        assert!(loud.is_empty(), "warnings: {loud:#?}");
        let said = logged
            .iter()
            .filter(|(_, line)| line.contains("idle_session_timeout"))
            .count();
        assert!(said <= 1, "said more than once: {logged:#?}");
    }

    /// A DBA's `statement_timeout` ends a statement of tickler's that waits
    /// for a row lock longer than it allows (here a completion behind an
    /// operator's transaction on the job's row). The server cancels it
    /// (57014); it is tried again within the retry window, as a lock wait
    /// the server ended by `lock_timeout` is, instead of failing: in a pool,
    /// that error dropped the batch's outcomes and those jobs ran again.
    #[test]
    fn a_lock_wait_past_a_dba_statement_timeout_is_tried_again() {
        let Some(db) = test_database() else { return };
        alter_database(&db, "statement_timeout = '200ms'");
        let queue = Queue::open(db.url()).expect("open");
        let id = queue.enqueue(NewJob::new("work")).expect("enqueue");
        let lease = queue
            .manual()
            .claim("default", "w", 1, secs(60))
            .expect("claim")
            .remove(0);
        let mut operator = db.connect();
        let (locked, wait) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let mut tx = operator.transaction().expect("BEGIN");
            tx.execute(
                "SELECT id FROM tickler_jobs WHERE id = $1 FOR UPDATE",
                &[&id.0],
            )
            .expect("lock the job's row");
            locked.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            tx.commit().expect("COMMIT");
        });
        wait.recv().unwrap();
        let completed = queue.manual().complete(&lease);
        holder.join().unwrap();
        completed.expect("the completion waits past the DBA's statement_timeout");
        assert_eq!(queue.get(id).expect("get").state, JobState::Succeeded);
    }

    /// All four of a DBA's timeouts set low on the database at once, with
    /// idle pauses between bursts of work (so that pooled connections are
    /// cut while idle), an operator's transaction holding one job's row and
    /// a pool of 4 threads: every job succeeds, none runs twice (no outcome
    /// lost to an error), and no enqueue fails.
    #[test]
    fn a_busy_pool_under_a_dbas_low_timeouts_loses_nothing() {
        let Some(db) = test_database() else { return };
        for setting in [
            "statement_timeout = '100ms'",
            "lock_timeout = '20ms'",
            "idle_session_timeout = '250ms'",
            "idle_in_transaction_session_timeout = '100ms'",
        ] {
            alter_database(&db, setting);
        }
        let queue = Queue::open(db.url()).expect("open");
        let runs = super::Runs::default();
        let mut pool = super::counting_pool(&queue, &runs, 4);
        let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut ids = Vec::new();
        for burst in 0..4 {
            ids.extend(
                super::enqueue_in_background(&queue, 100, &errors)
                    .join()
                    .unwrap(),
            );
            if burst == 1 {
                // An operator's transaction on the newest job's row, held
                // past every timeout of tickler's statements.
                let id = *ids.last().unwrap();
                let mut operator = db.connect();
                std::thread::spawn(move || {
                    let mut tx = operator.transaction().expect("BEGIN");
                    tx.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0")
                        .unwrap();
                    let _ = tx.execute(
                        "SELECT id FROM tickler_jobs WHERE id = $1 FOR UPDATE",
                        &[&id.0],
                    );
                    std::thread::sleep(Duration::from_millis(700));
                    let _ = tx.commit();
                });
            }
            std::thread::sleep(Duration::from_millis(600));
        }
        super::wait_all_succeeded(&queue, ids.len() as u64);
        pool.shutdown(secs(5));
        assert_eq!(
            errors.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "enqueues failed"
        );
        super::assert_all_succeeded(&queue, &ids, &runs);
        let runs = runs.lock().unwrap();
        let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "jobs that ran more than once: {twice:?}");
    }

    /// Enqueues `jobs` jobs, then claims and completes them: about two dead
    /// row versions each.
    fn leave_dead_versions(queue: &Queue, jobs: usize) {
        let _ = queue
            .enqueue_batch((0..jobs).map(|_| NewJob::new("work")).collect())
            .unwrap();
        loop {
            let leases = queue.manual().claim("default", "w", 500, secs(60)).unwrap();
            if leases.is_empty() {
                break;
            }
            let outcomes: Vec<_> = leases
                .iter()
                .map(|l| (l, tickler::Outcome::Complete))
                .collect();
            queue.manual().record_outcomes(&outcomes).unwrap();
        }
    }

    /// How many vacuums of the jobs table the server has counted.
    fn vacuum_count(admin: &mut postgres::Client) -> i64 {
        admin
            .query_one(
                "SELECT pg_stat_get_vacuum_count('tickler_jobs'::regclass)",
                &[],
            )
            .unwrap()
            .get(0)
    }

    /// A long transaction elsewhere (here a REPEATABLE READ snapshot left
    /// open) keeps every dead row version visible, so a vacuum removes
    /// nothing. tickler vacuums the jobs table itself when it holds many
    /// dead versions; it used to do so again at every look (each second),
    /// a full pass over the table each time for nothing. It now vacuums
    /// once and vacuums again once that is gone. (The warning naming the
    /// holder is not read here: the torture test of this binary owns its
    /// one logger.)
    #[test]
    fn a_vacuum_held_back_by_a_long_transaction_is_not_repeated() {
        let Some(db) = test_database() else { return };
        let queue = Queue::open(db.url()).expect("open");
        let mut admin = db.connect();
        // Autovacuum would make the count below depend on when its
        // launcher visits this database: skipped by tickler's
        // `SKIP_LOCKED` while it runs, or leaving nothing to vacuum.
        admin
            .batch_execute("ALTER TABLE tickler_jobs SET (autovacuum_enabled = false)")
            .unwrap();
        let mut holder = db.connect();
        let mut snapshot = holder
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .start()
            .expect("BEGIN");
        snapshot.query_one("SELECT 1", &[]).unwrap();
        // 6,000 jobs claimed and completed: 12,000 dead versions.
        leave_dead_versions(&queue, 6000);
        let before = vacuum_count(&mut admin);
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(1100));
            queue.manual().reap_at(queue.clock().now()).unwrap();
        }
        let held = vacuum_count(&mut admin) - before;
        let dead: i64 = admin
            .query_one(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'tickler_jobs'::regclass",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            held, 1,
            "vacuums while a snapshot held the dead rows ({dead} dead)"
        );
        snapshot.commit().unwrap();
        // The next look vacuums; a few more looks leave room for a
        // loaded machine's late statistics, and must not vacuum twice.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1100));
            queue.manual().reap_at(queue.clock().now()).unwrap();
        }
        assert_eq!(
            vacuum_count(&mut admin) - before,
            2,
            "a vacuum once the snapshot was gone"
        );
    }

    /// River #59, PgQue #80: a DBA's `statement_timeout` shorter than a
    /// vacuum of the jobs table cancelled tickler's vacuum at every look
    /// (6 of 6 in a hunt, the dead versions piling up). Its vacuum runs
    /// without the limit; tickler's other statements keep it. The vacuum is
    /// made slow here by the database's cost-based delay.
    #[test]
    fn a_dbas_statement_timeout_does_not_cancel_ticklers_vacuum() {
        let Some(db) = test_database() else { return };
        let mut admin = db.connect();
        let queue = Queue::open(db.url()).expect("open");
        admin
            .batch_execute("ALTER TABLE tickler_jobs SET (autovacuum_enabled = false)")
            .unwrap();
        leave_dead_versions(&queue, 6000);
        alter_database(&db, "vacuum_cost_delay = '2ms'");
        alter_database(&db, "vacuum_cost_limit = 1");
        alter_database(&db, "statement_timeout = '300ms'");
        // New sessions only: the database's settings apply from there.
        drop(queue);
        let queue = Queue::open(db.url()).expect("open");
        let timeout: String = db
            .connect()
            .query_one("SHOW statement_timeout", &[])
            .unwrap()
            .get(0);
        assert_eq!(timeout, "300ms");
        let before = vacuum_count(&mut admin);
        let started = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(1100));
        queue.manual().reap_at(queue.clock().now()).unwrap();
        let took = started.elapsed();
        super::wait_until("the vacuum is counted", secs(10), || {
            vacuum_count(&mut admin) > before
        });
        assert!(
            took > Duration::from_millis(1400),
            "the vacuum was not slower than the timeout ({took:?}): the test proves nothing"
        );
    }

    /// pg-boss #58, raystack/entropy #91: a server (or database) whose time zone
    /// is not UTC shifted due times by the offset. tickler keeps milliseconds
    /// since the epoch and reads the server's clock as an instant.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn a_server_time_zone_far_from_utc_moves_nothing() {
        let Some(db) = test_database() else { return };
        alter_database(&db, "timezone = 'Pacific/Kiritimati'");
        let queue = Queue::open(db.url()).expect("open");
        let ours = queue.clock().now_ms();
        let local = chrono::Utc::now().timestamp_millis();
        assert!(
            (ours - local).abs() < 5_000,
            "queue clock {ours} vs this machine {local}"
        );
        let soon = queue
            .enqueue(NewJob::new("work").delay(secs(3600)))
            .expect("enqueue");
        let now = queue.enqueue(NewJob::new("work")).expect("enqueue");
        let leases = queue
            .manual()
            .claim("default", "w", 5, secs(30))
            .expect("claim");
        assert_eq!(leases.iter().map(|l| l.job_id).collect::<Vec<_>>(), [now]);
        let due = queue.get(soon).expect("get").run_at.timestamp_millis() - ours;
        assert!((3_595_000..3_605_000).contains(&due), "due in {due} ms");
    }
}

/// A regression test from a hunt through other queues' PostgreSQL reports: its doc says the bug it guards.
mod failover {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::{terminate_connections, test_database};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tickler::{JobState, NewJob, Queue};

    fn read_only(db: &pg::TestDb, on: bool) {
        let mut admin = db.connect();
        // Its own session may have started read-only; ALTER DATABASE cannot
        // run in a read-only transaction.
        admin
            .batch_execute("SET default_transaction_read_only = off")
            .expect("SET");
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" SET default_transaction_read_only = {on}",
                db.name()
            ))
            .expect("ALTER DATABASE");
        // Sessions take the setting when they start.
        terminate_connections(db.url(), Some("tickler"));
    }

    /// JobRunr #1264: during a database upgrade the writer became a reader for
    /// a while; state updates failed with "read-only" and jobs stayed
    /// `running` until a restart. Here, for a second, every new connection is
    /// read-only (as after a failover to a standby), then writable again:
    /// enqueues, claims and outcomes ride it out, and the pooled connections
    /// that were read-only are not used again.
    #[test]
    /// The bug it guards (from a hunt through other queues' PostgreSQL reports):
    /// A failover that leaves the queue's connections on a read-only server.
    fn a_read_only_second_reaches_no_user_code() {
        let Some(db) = test_database() else { return };
        let queue = Queue::open(db.url()).expect("open");
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (queue, stop) = (queue.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut done = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let id = queue.enqueue(NewJob::new("work")).expect("enqueue");
                    for lease in queue
                        .manual()
                        .claim("default", "w", 4, Duration::from_secs(30))
                        .expect("claim")
                    {
                        queue.manual().complete(&lease).expect("complete");
                    }
                    done.push(id);
                }
                done
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        read_only(&db, true);
        std::thread::sleep(Duration::from_secs(1));
        read_only(&db, false);
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        let ids = worker.join().expect("no user call failed");
        for lease in queue
            .manual()
            .claim("default", "w", 100, Duration::from_secs(30))
            .expect("claim")
        {
            queue.manual().complete(&lease).expect("complete");
        }
        for id in ids {
            assert_eq!(queue.get(id).expect("get").state, JobState::Succeeded);
        }
    }
}

/// A regression test from a hunt through other queues' PostgreSQL reports: its doc says the bug it guards.
mod locks {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};
    use tickler::{Clock, Lease, ManualClock, NewJob, Outcome, Queue};

    /// pg-boss #282, procrastinate #328: "deadlock detected" between the
    /// queue's maintenance and its workers. Here a pool's outcomes (failures,
    /// which are one statement per job, and of jobs cancelled meanwhile) and
    /// heartbeats race the reaper over the same expired leases. PostgreSQL
    /// breaks a deadlock after `deadlock_timeout` (1 s) and tickler retries,
    /// so the sign of one is a call that took a second.
    #[test]
    /// The bug it guards (from a hunt through other queues' PostgreSQL reports):
    /// Deadlocks between the queue's own transactions: heartbeats, outcomes,
    /// the reaper and cancels on the same rows.
    fn outcomes_heartbeats_and_the_reaper_do_not_deadlock() {
        let Some(db) = test_database() else { return };
        let start_at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let clock = Arc::new(ManualClock::new(start_at));
        let open = || {
            Queue::builder(db.url())
                .clock(clock.clone())
                .open()
                .expect("open")
        };
        let (worker, reaper, beater) = (open(), open(), open());
        let mut slowest = Duration::ZERO;
        for round in 0..15 {
            let jobs = (0..30)
                .map(|_| NewJob::new("work").max_attempts(100))
                .collect();
            worker.enqueue_batch(jobs).expect("enqueue");
            let leases: Vec<Lease> = worker
                .manual()
                .claim("default", "w", 30, Duration::from_secs(5))
                .expect("claim");
            assert_eq!(leases.len(), 30, "round {round}");
            for l in leases.iter().step_by(2) {
                worker.cancel(l.job_id).expect("cancel");
            }
            clock.advance(Duration::from_secs(6));
            let barrier = Arc::new(Barrier::new(3));
            let timed = |f: Box<dyn FnOnce() + Send>| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let began = Instant::now();
                    f();
                    began.elapsed()
                })
            };
            let outcomes_leases = leases.clone();
            let w = worker.clone();
            let t1 = timed(Box::new(move || {
                let outcomes: Vec<(&Lease, Outcome)> = outcomes_leases
                    .iter()
                    .map(|l| (l, Outcome::Fail("boom".into())))
                    .collect();
                w.manual()
                    .record_outcomes(&outcomes)
                    .expect("record_outcomes");
            }));
            let r = reaper.clone();
            let t2 = timed(Box::new(move || {
                r.manual().reap().expect("reap");
            }));
            let beat_leases: Vec<Lease> = leases.iter().rev().cloned().collect();
            let b = beater.clone();
            let t3 = timed(Box::new(move || {
                let refs: Vec<&Lease> = beat_leases.iter().collect();
                b.manual()
                    .heartbeat_many(&refs, Duration::from_secs(5))
                    .expect("heartbeat_many");
            }));
            for t in [t1, t2, t3] {
                slowest = slowest.max(t.join().expect("thread"));
            }
            // Leave nothing running for the next round.
            clock.advance(Duration::from_secs(60));
            worker.manual().reap().expect("reap");
            let _ = worker.prune(clock.now() + chrono::Duration::days(1));
            for l in worker
                .manual()
                .claim("default", "w", 100, Duration::from_secs(5))
                .expect("claim")
            {
                worker.manual().complete(&l).expect("complete");
            }
        }
        assert!(
            slowest < Duration::from_millis(700),
            "a call took {slowest:?}: deadlocked and waited for deadlock_timeout"
        );
    }
}

/// A regression test from a hunt through other queues' PostgreSQL reports: its doc says the bug it guards.
mod nul {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::time::Duration;
    use tickler::{Error, JobFilter, NewJob, NewSchedule, Queue};

    fn clear_or_stored<T: std::fmt::Debug>(what: &str, r: tickler::Result<T>) {
        match r {
            Ok(_) | Err(Error::InvalidArgument(_) | Error::UnknownSchedule { .. }) => {}
            Err(e) => panic!("{what}: neither stored nor refused with a clear error: {e:?}"),
        }
    }

    /// hardbyte/awa #85, sqlg #536: "invalid byte sequence for encoding UTF8:
    /// 0x00" from job arguments and names with a NUL character. A payload
    /// keeps it (JSON escapes it); names are refused with a clear error; error
    /// messages and worker ids are stored with the character replaced.
    #[test]
    /// The bug it guards (from a hunt through other queues' PostgreSQL reports):
    /// Text PostgreSQL refuses: the NUL character.
    fn nul_characters_are_stored_or_refused_clearly() {
        let Some(db) = test_database() else { return };
        let queue = Queue::open(db.url()).expect("open");
        let payload = serde_json::json!({ "s": "a\u{0}b" });
        let id = queue
            .enqueue(NewJob::new("work").payload(payload.clone()))
            .expect("a payload with NUL is JSON-escaped");
        assert_eq!(queue.get(id).expect("get").payload, payload);
        let lease = queue
            .manual()
            .claim("default", "worker\u{0}1", 1, Duration::from_secs(30))
            .expect("a worker id with NUL")
            .remove(0);
        queue
            .manual()
            .fail(&lease, "broke at \u{0} here")
            .expect("an error text with NUL");
        clear_or_stored("kind", queue.enqueue(NewJob::new("wo\u{0}rk")));
        clear_or_stored(
            "unique_key",
            queue.enqueue(NewJob::new("work").unique_key("k\u{0}")),
        );
        clear_or_stored(
            "schedule name",
            queue.upsert_schedule(NewSchedule::new("nightly\u{0}", "0 3 * * *", "work")),
        );
        clear_or_stored(
            "schedule kind",
            queue.upsert_schedule(NewSchedule::new("nightly", "0 3 * * *", "wo\u{0}rk")),
        );
        clear_or_stored(
            "schedule queue",
            queue
                .upsert_schedule(NewSchedule::new("nightly2", "0 3 * * *", "work").queue("q\u{0}")),
        );
        clear_or_stored(
            "schedule payload",
            queue.upsert_schedule(
                NewSchedule::new("nightly3", "0 3 * * *", "work").payload(payload.clone()),
            ),
        );
        clear_or_stored("get_schedule", queue.get_schedule("nightly\u{0}"));
        clear_or_stored("delete_schedule", queue.delete_schedule("nightly\u{0}"));
        clear_or_stored(
            "list by kind",
            queue.list(&JobFilter {
                kind: Some("wo\u{0}rk".into()),
                ..Default::default()
            }),
        );
        clear_or_stored(
            "claim",
            queue
                .manual()
                .claim("q\u{0}", "w", 1, Duration::from_secs(30)),
        );
        clear_or_stored(
            "claim_kinds",
            queue.manual().claim_kinds(
                "default",
                "w",
                1,
                Duration::from_secs(30),
                Some(&["wo\u{0}rk"]),
            ),
        );
    }
}

/// A regression test from a hunt through other queues' PostgreSQL reports: its doc says the bug it guards.
mod plans {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::time::Duration;
    use tickler::{NewJob, Queue};

    /// graphile-worker #175 ("cached plan must not change result type"): a
    /// column's type changed while workers ran (a newer version's migration
    /// in a rolling deploy, or an operator's ALTER TABLE); the old workers'
    /// cached statements then failed on every use until restarted.
    #[test]
    /// The bug it guards (from a hunt through other queues' PostgreSQL reports):
    /// Prepared statements outliving the schema they were planned against.
    fn a_column_type_changed_under_a_running_queue_is_replanned() {
        let Some(db) = test_database() else { return };
        let queue = Queue::builder(db.url())
            .postgres(|o| o.max_connections(2))
            .open()
            .expect("open");
        let id = queue.enqueue(NewJob::new("work")).expect("enqueue");
        // Every pooled connection prepares the statements it runs.
        for _ in 0..4 {
            queue.get(id).expect("get");
            let leases = queue
                .manual()
                .claim("default", "w", 1, Duration::from_secs(30))
                .expect("claim");
            for l in &leases {
                queue.manual().fail(l, "again").expect("fail");
            }
            queue.list(&Default::default()).expect("list");
        }
        db.connect()
            .batch_execute(
                "ALTER TABLE tickler_jobs ALTER COLUMN last_error TYPE varchar(100000);
                 ALTER TABLE tickler_jobs ALTER COLUMN queue TYPE varchar(1000)",
            )
            .expect("ALTER TABLE");
        for round in 0..4 {
            let job = queue
                .get(id)
                .unwrap_or_else(|e| panic!("get after ALTER TABLE, round {round}: {e}"));
            assert_eq!(job.id, id);
            queue
                .list(&Default::default())
                .unwrap_or_else(|e| panic!("list after ALTER TABLE, round {round}: {e}"));
            queue
                .enqueue(NewJob::new("work"))
                .unwrap_or_else(|e| panic!("enqueue after ALTER TABLE, round {round}: {e}"));
            let leases = queue
                .manual()
                .claim("default", "w", 1, Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("claim after ALTER TABLE, round {round}: {e}"));
            for l in &leases {
                queue.manual().complete(l).expect("complete");
            }
        }
    }
}

/// The bugs these guard (from a hunt through other queues' PostgreSQL reports):
/// Unique jobs inserted concurrently, as several machines do.
mod unique {
    #![cfg(feature = "postgres")]

    use crate::support::pg;

    use pg::test_database;
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};
    use tickler::{JobFilter, NewJob, Queue};

    /// A large batch of jobs with unique keys. The lock table is shared by
    /// every session of the server (`max_locks_per_transaction` × the
    /// connections: 6,400 entries on a stock server): a batch that took one
    /// lock per key failed with "out of shared memory" (seen at 100,000 keys,
    /// and at the 20,000 here, three times the table), and left none for the
    /// server's other clients while it ran. All are stored, each key once,
    /// and a second batch of the same keys stores nothing new.
    #[test]
    fn a_batch_of_unique_keys_larger_than_the_servers_lock_table_is_stored() {
        const KEYS: usize = 20_000;
        let Some(db) = test_database() else { return };
        let queue = Queue::open(db.url()).expect("open");
        let jobs = |n: usize| -> Vec<NewJob> {
            (0..n)
                .map(|i| NewJob::new("work").unique_key(format!("key-{i}")))
                .collect()
        };
        let ids = queue.enqueue_batch(jobs(KEYS)).expect("the batch");
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), KEYS);
        let again = queue
            .enqueue_batch(jobs(KEYS))
            .expect("the same batch again");
        assert_eq!(again, ids, "each key's holder's id, in order");
        assert_eq!(
            queue.count(tickler::JobState::Pending).unwrap(),
            KEYS as u64
        );
    }

    fn keyed_jobs(queue: &Queue, key: &str) -> usize {
        queue
            .list(&JobFilter {
                limit: 10_000,
                ..Default::default()
            })
            .expect("list")
            .into_iter()
            .filter(|j| j.unique_key.as_deref() == Some(key))
            .count()
    }

    /// Oban #1087: the same unique job inserted from several nodes at once
    /// was stored more than once. Six "processes" (each its own `Queue`)
    /// insert one key at the same moment: one job, one id for all.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn one_key_from_many_processes_at_once_is_one_job() {
        let Some(db) = test_database() else { return };
        let queues: Vec<Queue> = (0..6)
            .map(|_| Queue::open(db.url()).expect("open"))
            .collect();
        for round in 0..15 {
            let key = format!("k{round}");
            let start = Arc::new(Barrier::new(queues.len()));
            let handles: Vec<_> = queues
                .iter()
                .map(|q| {
                    let (q, key, start) = (q.clone(), key.clone(), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        q.enqueue(NewJob::new("work").unique_key(key))
                    })
                })
                .collect();
            let ids: Vec<_> = handles
                .into_iter()
                .map(|h| h.join().expect("thread").expect("enqueue"))
                .collect();
            assert!(ids.iter().all(|id| *id == ids[0]), "round {round}: {ids:?}");
            assert_eq!(keyed_jobs(&queues[0], &key), 1, "round {round}");
        }
    }

    /// pg-boss #282 ("deadlock detected" between two of the queue's own
    /// statements): here two batches hold the same unique keys in opposite
    /// orders. Each insert
    /// of a key waits for the other batch's uncommitted insert of it, so two
    /// batches meeting in the middle deadlock; PostgreSQL breaks it after
    /// `deadlock_timeout` (1 s) and the retry succeeds, so the only sign is a
    /// second lost per collision. Batches must take keys in one order.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn batches_with_keys_in_opposite_orders_do_not_deadlock() {
        let Some(db) = test_database() else { return };
        let a = Queue::open(db.url()).expect("open");
        let b = Queue::open(db.url()).expect("open");
        let mut slowest = Duration::ZERO;
        for round in 0..10 {
            let keys: Vec<String> = (0..20).map(|i| format!("r{round}-k{i}")).collect();
            let start = Arc::new(Barrier::new(2));
            let run = |q: &Queue, keys: Vec<String>| {
                let (q, start) = (q.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    let jobs = keys
                        .into_iter()
                        .map(|k| NewJob::new("work").unique_key(k))
                        .collect();
                    start.wait();
                    let began = Instant::now();
                    let ids = q.enqueue_batch(jobs).expect("enqueue_batch");
                    (ids, began.elapsed())
                })
            };
            let forward = run(&a, keys.clone());
            let backward = run(&b, keys.iter().rev().cloned().collect());
            let (ids_f, took_f) = forward.join().expect("thread");
            let (mut ids_b, took_b) = backward.join().expect("thread");
            ids_b.reverse();
            assert_eq!(ids_f, ids_b, "round {round}: one job per key");
            slowest = slowest.max(took_f).max(took_b);
        }
        assert!(
            slowest < Duration::from_millis(700),
            "a batch took {slowest:?}: deadlocked and waited for deadlock_timeout"
        );
    }

    /// Oban #1093: an insert that found a key held by another transaction's
    /// uncommitted job assumed that job would commit; when it rolled back, no
    /// job was left. The waiting insert must store its own job then.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn a_key_whose_holder_rolls_back_is_inserted_by_the_waiter() {
        let Some(db) = test_database() else { return };
        let queue = Queue::open(db.url()).expect("open");
        let mut app = db.connect();
        let mut tx = app.transaction().expect("begin");
        let held = queue
            .enqueue_tx(&mut tx, NewJob::new("work").unique_key("k"))
            .expect("enqueue in the app's transaction");
        let other = queue.clone();
        let waiter = std::thread::spawn(move || other.enqueue(NewJob::new("work").unique_key("k")));
        std::thread::sleep(Duration::from_millis(300));
        tx.rollback().expect("rollback");
        let id = waiter.join().expect("thread").expect("enqueue");
        assert_ne!(id, held, "the rolled-back job does not exist");
        assert_eq!(
            queue
                .get(id)
                .expect("the waiter's job")
                .unique_key
                .as_deref(),
            Some("k")
        );
        assert_eq!(keyed_jobs(&queue, "k"), 1);
    }

    /// Oban #1087 again, with a DBA's `lock_timeout`: a key held by an
    /// application's transaction that stays open a little longer than the
    /// timeout. The insert waiting on it is cancelled ("canceling statement
    /// due to lock timeout"); that is a moment's contention, not an error
    /// of the job, and is retried like the other transient failures.
    #[test]
    /// The bug it guards: see this module's doc (from a hunt through other queues' PostgreSQL reports).
    fn a_key_held_past_a_dba_lock_timeout_is_waited_out() {
        let Some(db) = test_database() else { return };
        db.connect()
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" SET lock_timeout = '50ms'",
                db.name()
            ))
            .expect("ALTER DATABASE");
        let queue = Queue::open(db.url()).expect("open");
        let mut app = db.connect();
        let mut tx = app.transaction().expect("begin");
        let held = queue
            .enqueue_tx(&mut tx, NewJob::new("work").unique_key("k"))
            .expect("enqueue in the app's transaction");
        let other = queue.clone();
        let waiter = std::thread::spawn(move || other.enqueue(NewJob::new("work").unique_key("k")));
        std::thread::sleep(Duration::from_millis(400));
        tx.commit().expect("commit");
        let id = waiter
            .join()
            .expect("thread")
            .expect("enqueue behind the app's transaction");
        assert_eq!(id, held);
    }
}

/// PostgreSQL's: JIT (on by default since PostgreSQL 12) compiles every
/// statement whose estimated cost passes `jit_above_cost`, and the planner
/// prices a claim's `LIMIT` under its `NOT EXISTS` as a read of the whole
/// table: on a deep queue each claim spent 300 ms compiling what ran in
/// 0.3 ms. tickler's sessions turn it off, also on a database that turns
/// it on for every statement, and again after the application's own
/// statements in `complete_with` set it.
#[test]
fn tickler_sessions_never_compile_with_jit() {
    let Some(db) = test_database() else {
        return;
    };
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{0}\" SET jit = on; ALTER DATABASE \"{0}\" SET jit_above_cost = 0",
            db.name()
        ))
        .unwrap();
    // The database's setting reaches a session that does not set its own.
    let plain: String = db.connect().query_one("SHOW jit", &[]).unwrap().get(0);
    assert_eq!(plain, "on");
    let queue = Queue::open(db.url()).expect("open");
    for round in 0..3 {
        let lease = pg::enqueue_and_claim(&queue, NewJob::new("k"));
        let seen = queue
            .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
                let jit: String = tx.query_one("SHOW jit", &[])?.get(0);
                tx.batch_execute("SET jit = on")?;
                Ok(jit)
            })
            .unwrap();
        assert_eq!(
            seen, "off",
            "round {round}: a session of tickler's compiles with JIT"
        );
    }
}

/// A DBA's defaults for the database that tickler's guarantees cannot
/// live with are overridden in tickler's sessions, also after the
/// application's statements in `complete_with`: `synchronous_commit = off`
/// (an acknowledged enqueue lost in a crash: 7 and 17 of about 18,000 in a
/// hunt's runs) becomes `local`, and a `default_transaction_isolation` of
/// `serializable` (claims failing each other with serialization errors)
/// becomes `read committed`. A stronger `synchronous_commit`, set for
/// replication, stays.
#[test]
fn a_dbas_durability_and_isolation_defaults_do_not_reach_ticklers_sessions() {
    let Some(db) = test_database() else {
        return;
    };
    let settings = |queue: &Queue, change: &str| -> (String, String) {
        let lease = pg::enqueue_and_claim(queue, NewJob::new("k"));
        let change = change.to_owned();
        queue
            .complete_with(&lease, move |tx: &mut tickler::postgres::Transaction| {
                let seen = tx.query_one(
                    "SELECT current_setting('synchronous_commit'),
                            current_setting('transaction_isolation')",
                    &[],
                )?;
                tx.batch_execute(&change)?;
                Ok((seen.get(0), seen.get(1)))
            })
            .unwrap()
    };
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{0}\" SET synchronous_commit = off;
             ALTER DATABASE \"{0}\" SET default_transaction_isolation = 'serializable'",
            db.name()
        ))
        .unwrap();
    let queue = Queue::open(db.url()).expect("open");
    for round in 0..3 {
        // Each round's application sets them back as the DBA had.
        let seen = settings(
            &queue,
            "SET synchronous_commit = off; SET default_transaction_isolation = 'serializable'",
        );
        assert_eq!(
            seen,
            ("local".to_owned(), "read committed".to_owned()),
            "round {round}"
        );
    }
    drop(queue);
    db.connect()
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET synchronous_commit = remote_apply",
            db.name()
        ))
        .unwrap();
    let queue = Queue::open(db.url()).expect("open");
    assert_eq!(settings(&queue, "SELECT 1").0, "remote_apply");
}

/// A job the engine refuses only once its group is stored (a NUL in a
/// queue name: PostgreSQL's text cannot hold one, the other engines'
/// can, hence here) fails its own caller alone: concurrent callers whose
/// jobs went into the same group commit get their jobs stored. Before,
/// the group's leader got the refusal for its own valid job (151 of
/// 4,500 valid enqueues failed).
#[test]
fn a_refused_job_in_a_group_commit_fails_only_its_own_caller() {
    let Some(db) = test_database() else { return };
    let queue = Queue::open(db.url()).expect("open");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bad: Vec<_> = (0..3)
        .map(|_| {
            let (queue, stop) = (queue.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut refused = 0;
                while !stop.load(Ordering::Relaxed) {
                    match queue.enqueue(NewJob::new("bad").queue("has\0nul")) {
                        Err(tickler::Error::InvalidArgument(_)) => refused += 1,
                        other => panic!("a NUL in a queue name: {other:?}"),
                    }
                }
                refused
            })
        })
        .collect();
    let good: Vec<_> = (0..3)
        .map(|t| {
            let queue = queue.clone();
            std::thread::spawn(move || {
                (0..500)
                    .map(|i| {
                        let payload = serde_json::json!([t, i]);
                        let id = queue
                            .enqueue(NewJob::new("good").payload(payload.clone()))
                            .unwrap_or_else(|e| panic!("a valid enqueue failed: {e}"));
                        (id, payload)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let stored: Vec<_> = good.into_iter().flat_map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let refused: usize = bad.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(refused > 0, "no refused job met a group");
    for (id, payload) in stored {
        assert_eq!(queue.get(id).unwrap().payload, payload);
    }
}
