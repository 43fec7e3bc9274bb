//! What only the MySQL engine has to get right, each test saying why it is
//! MySQL's: connections killed by the server and a server restart in the
//! middle of work reach no user code as errors; a server that stops
//! answering fails a call in bounded time; InnoDB's deadlocks among
//! concurrent batches are retried; the claim and the dashboard's pages
//! read their indexes in order (no sort); unique enqueues racing finishing holders under a trigger get
//! an id; tables of another storage engine and names longer than the
//! schema holds are refused with the reason.
#![cfg(feature = "mysql")]

use crate::support::my;

use mysql::prelude::Queryable;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{Error, JobContext, JobError, JobId, JobState, NewJob, Queue, WorkerPool};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Runs = Arc<Mutex<HashMap<JobId, usize>>>;

/// Each unique key with the number of unfinished jobs that hold it.
fn unfinished_per_key(conn: &mut mysql::Conn) -> Vec<(Vec<u8>, i64)> {
    conn.query(
        "SELECT unique_key, count(*) FROM tickler_jobs
         WHERE status IN ('scheduled', 'pending', 'running') GROUP BY unique_key",
    )
    .unwrap()
}

/// Runs `body` with the server's global `name` set to `value`, and sets it
/// back to what it was, also when `body` panics (the server outlives the
/// test). For a test holding [`my::exclusive_database`].
fn with_global(admin: &mut mysql::Conn, name: &str, value: i64, body: impl FnOnce()) {
    // Typed as the server gives it (a number, or an enumeration's name):
    // the binary protocol's, not the text protocol's bytes.
    let before: mysql::Value = admin
        .exec_first(format!("SELECT @@GLOBAL.{name}"), ())
        .unwrap()
        .unwrap();
    admin
        .query_drop(format!("SET GLOBAL {name} = {value}"))
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    admin
        .exec_drop(format!("SET GLOBAL {name} = ?"), (before,))
        .unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn counting_pool(queue: &Queue, runs: &Runs) -> WorkerPool {
    let runs = Arc::clone(runs);
    WorkerPool::builder(queue)
        .threads(4)
        .lease(secs(3))
        .handler("work", move |ctx: &JobContext| -> Result<(), JobError> {
            std::thread::sleep(Duration::from_millis(1));
            *runs.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
            Ok(())
        })
        .start()
        .expect("start pool")
}

/// Enqueues, runs and checks `n` jobs while `disturb` cuts the server away
/// now and then: every enqueue returns its id, every job succeeds, none is
/// lost.
fn survives(db: &my::TestDb, n: usize, disturb: impl Fn() + Send + Sync) {
    let queue = Queue::open(db.url()).expect("open");
    let runs: Runs = Arc::default();
    let mut pool = counting_pool(&queue, &runs);
    let done = AtomicBool::new(false);
    let ids = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(150));
                disturb();
            }
        });
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let job = NewJob::new("work").payload(serde_json::json!({ "i": i }));
            ids.push(
                queue
                    .enqueue(job)
                    .expect("an enqueue failed past the retries"),
            );
        }
        wait_until("every job ran", secs(120), || {
            let runs = runs.lock().unwrap();
            ids.iter().all(|id| runs.contains_key(id))
        });
        done.store(true, Ordering::SeqCst);
        ids
    });
    wait_until("every job succeeded", secs(60), || {
        ids.iter()
            .all(|id| queue.get(*id).is_ok_and(|j| j.state == JobState::Succeeded))
    });
    pool.shutdown(secs(10));
}

/// MySQL's: a DBA's `KILL CONNECTION` (or a proxy's, or `wait_timeout`) cuts
/// tickler's pooled connections in the middle of claims, outcomes and
/// enqueues; the engine retries on fresh connections and no caller sees it.
#[test]
fn killed_connections_in_the_middle_of_work_reach_no_caller() {
    let Some(db) = my::test_database() else {
        return;
    };
    let kills = AtomicUsize::new(0);
    survives(&db, 400, || {
        kills.fetch_add(db.kill_connections(), Ordering::SeqCst);
    });
    assert!(kills.load(Ordering::SeqCst) > 0, "no connection was killed");
}

/// MySQL's: the server restarts while a pool works and an application
/// enqueues; both carry on once it is back.
#[test]
fn a_server_restart_in_the_middle_of_work_reaches_no_caller() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    if std::env::var("TICKLER_TEST_MYSQL_CTL").map_or(true, |c| c.trim().is_empty()) {
        assert!(
            !my::in_ci(),
            "CI must restart the server (.ci/mariadb sets TICKLER_TEST_MYSQL_CTL)"
        );
        return;
    }
    let restarted = AtomicUsize::new(0);
    survives(&db, 300, || {
        if restarted.load(Ordering::SeqCst) == 0 && my::restart_server() {
            restarted.fetch_add(1, Ordering::SeqCst);
        }
    });
    assert_eq!(restarted.load(Ordering::SeqCst), 1);
}

/// MySQL's: InnoDB takes a unique index's locks in the order a statement
/// meets the keys, so batches holding the same unique keys in other orders
/// deadlock (1213) now and then; each is retried, no caller sees it, and a
/// key is never held by two unfinished jobs.
#[test]
fn deadlocking_batches_of_shared_unique_keys_are_retried() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    std::thread::scope(|scope| {
        for t in 0..6u64 {
            let queue = queue.clone();
            scope.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                for _ in 0..30 {
                    let mut keys: Vec<usize> = (0..12).collect();
                    rng.shuffle(&mut keys);
                    let jobs = keys
                        .iter()
                        .map(|k| NewJob::new("k").unique_key(format!("key-{k}")))
                        .collect();
                    queue
                        .enqueue_batch(jobs)
                        .expect("a batch failed past the retries");
                }
            });
        }
    });
    let mut conn = db.connect();
    let held = unfinished_per_key(&mut conn);
    assert_eq!(held.len(), 12, "{held:?}");
    assert!(held.iter().all(|(_, n)| *n == 1), "{held:?}");
}

/// MySQL's plans: with many pending jobs of several priorities and many
/// more scheduled ones, the claim's locking read walks the pending index in
/// claim order (no filesort, no scan of other states), so a claim stays
/// cheap at any depth. The statement is the engine's claim read
/// (`src/engine/mysql/claim.rs`) for one queue without a kind filter.
#[test]
fn the_claim_reads_the_pending_index_in_order() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    for chunk in 0..20 {
        let jobs = (0..500)
            .map(|i| {
                let job = NewJob::new("k").priority(i % 5);
                if chunk % 4 == 0 {
                    job
                } else {
                    job.run_at(chrono::Utc::now() + chrono::Duration::hours(1))
                }
            })
            .collect();
        queue.enqueue_batch(jobs).unwrap();
    }
    let mut conn = db.connect();
    conn.query_drop("ANALYZE TABLE tickler_jobs").unwrap();
    let plan: Vec<mysql::Row> = conn
        .query(
            "EXPLAIN SELECT id FROM tickler_jobs AS job
             WHERE (job.unique_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM tickler_jobs AS stopping
                      WHERE stopping.unique_key = job.unique_key
                        AND stopping.status IN ('cancelled', 'dead')
                        AND stopping.lease_expires_at >= 0))
               AND status = 'pending' AND queue = 'default'
               AND NOT EXISTS (SELECT 1 FROM tickler_paused_queues AS paused
                               WHERE paused.queue = job.queue)
             ORDER BY priority DESC, run_at, id LIMIT 32 FOR UPDATE SKIP LOCKED",
        )
        .unwrap();
    let outer = plan
        .iter()
        .find(|r| r.get::<Option<String>, _>("table").flatten().as_deref() == Some("job"))
        .expect("a row of the plan reads the jobs");
    let key: Option<String> = outer.get("key").flatten();
    let extra: String = outer
        .get::<Option<String>, _>("Extra")
        .flatten()
        .unwrap_or_default();
    assert_eq!(key.as_deref(), Some("tickler_jobs_pending"), "{plan:?}");
    assert!(!extra.contains("filesort"), "the claim sorts: {extra}");
}

/// MySQL's plans of the dashboard's pages (`Ops::page`, the statements of
/// `src/engine/mysql/read.rs`): past a cursor, a page of dead jobs reads
/// the finished-by-state index and one of pending jobs the claim's index,
/// each as a range in its order (no filesort, no other index). The
/// statements are the engine's page reads of one queue with a kind
/// filter, past a cursor, as `page_after` words them.
#[test]
fn a_page_past_a_cursor_reads_its_state_index_in_order() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    for _ in 0..10 {
        let jobs = (0..500)
            .map(|i| NewJob::new(format!("k{}", i % 3)).priority(i % 5))
            .collect();
        queue.enqueue_batch(jobs).unwrap();
    }
    let mut conn = db.connect();
    conn.query_drop(
        "UPDATE tickler_jobs SET status = 'dead', finished_at = 1000000 + id WHERE id % 4 = 0",
    )
    .unwrap();
    conn.query_drop("ANALYZE TABLE tickler_jobs").unwrap();
    for (sql, index) in [
        (
            "EXPLAIN SELECT id FROM tickler_jobs WHERE status = 'dead' AND finished_at IS NOT NULL
               AND queue = 'default' AND ('k1' IS NULL OR kind = 'k1')
               AND finished_at <= 1003000 AND (finished_at < 1003000 OR id < 3000)
             ORDER BY finished_at DESC, id DESC LIMIT 50",
            "tickler_jobs_finished_state",
        ),
        (
            "EXPLAIN SELECT id FROM tickler_jobs WHERE status = 'pending' AND queue = 'default'
               AND ('k1' IS NULL OR kind = 'k1')
               AND priority = 2 AND run_at >= 0 AND (run_at > 0 OR id > 2000)
             ORDER BY priority DESC, run_at, id LIMIT 50",
            "tickler_jobs_pending",
        ),
        (
            "EXPLAIN SELECT id FROM tickler_jobs WHERE status = 'pending' AND queue = 'default'
               AND ('k1' IS NULL OR kind = 'k1') AND priority < 2
             ORDER BY priority DESC, run_at, id LIMIT 50",
            "tickler_jobs_pending",
        ),
    ] {
        let plan: Vec<mysql::Row> = conn.query(sql).unwrap();
        assert_eq!(plan.len(), 1, "{plan:?}");
        let key: Option<String> = plan[0].get("key").flatten();
        let extra: String = plan[0]
            .get::<Option<String>, _>("Extra")
            .flatten()
            .unwrap_or_default();
        assert_eq!(key.as_deref(), Some(index), "{sql}: {plan:?}");
        assert!(!extra.contains("filesort"), "{sql} sorts: {extra}");
    }
}

/// MySQL's: a table that is not InnoDB's (made by hand, or substituted by
/// a server without InnoDB) has neither row locks nor transactions; the
/// queue refuses to open on it and says which table and what to run.
#[test]
fn a_table_of_another_storage_engine_is_refused_at_open() {
    let Some(db) = my::test_database() else {
        return;
    };
    drop(Queue::open(db.url()).expect("open"));
    db.connect()
        .query_drop("ALTER TABLE tickler_paused_queues ENGINE = MyISAM")
        .unwrap();
    let err = Queue::open(db.url()).expect_err("opened on a MyISAM table");
    let text = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        text.contains("tickler_paused_queues") && text.contains("InnoDB"),
        "{text}"
    );
}

/// MySQL's schema bounds names (255 bytes for a queue or a kind): a longer
/// one is refused with a typed error that says so, and the batch it came
/// in stores nothing.
#[test]
fn a_name_longer_than_the_schema_holds_is_refused_and_nothing_is_stored() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let long = "q".repeat(256);
    let err = queue
        .enqueue_batch(vec![
            NewJob::new("k"),
            NewJob::new("k").queue(long.as_str()),
        ])
        .expect_err("a 256-byte queue name was stored");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("255"), "{err}");
    let stored: Option<i64> = db
        .connect()
        .query_first("SELECT count(*) FROM tickler_jobs")
        .unwrap();
    assert_eq!(stored, Some(0));
    queue
        .enqueue(NewJob::new("k").queue("q".repeat(255)))
        .unwrap();
}

/// MySQL's: with a trigger on the jobs table (an application's audit
/// trail), MariaDB's answer to `INSERT … ON DUPLICATE KEY UPDATE` carries
/// no id, so the engine reads the holder of the key itself. Enqueues of a
/// few keys racing with a pool that finishes their holders each get an id,
/// and a key is never held twice.
#[test]
fn unique_enqueues_racing_finishing_holders_get_an_id_with_a_trigger_on_the_table() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let mut conn = db.connect();
    conn.query_drop(
        "CREATE TABLE audit (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                             job_id BIGINT, status VARBINARY(9)) ENGINE = InnoDB",
    )
    .unwrap();
    conn.query_drop(
        "CREATE TRIGGER audit_row AFTER UPDATE ON tickler_jobs FOR EACH ROW
         INSERT INTO audit (job_id, status) VALUES (NEW.id, NEW.status)",
    )
    .unwrap();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .handler("k", |_: &JobContext| -> Result<(), JobError> { Ok(()) })
        .start()
        .expect("start pool");
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let queue = queue.clone();
            scope.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t);
                for _ in 0..400 {
                    let key = format!("key-{}", rng.usize(0..4));
                    queue
                        .enqueue(NewJob::new("k").unique_key(key))
                        .expect("an enqueue of a unique key failed");
                }
            });
        }
    });
    pool.shutdown(secs(10));
    let held = unfinished_per_key(&mut conn);
    assert!(held.iter().all(|(_, n)| *n == 1), "{held:?}");
}

/// MySQL's: a statement may have at most 65,535 placeholders, and a claim
/// writes three per row; a claim of 22,000 jobs is cut into several
/// statements and takes them all, each once.
#[test]
fn a_claim_larger_than_one_statement_holds_takes_every_job() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    for _ in 0..11 {
        queue
            .enqueue_batch((0..2_000).map(|_| NewJob::new("k")).collect())
            .unwrap();
    }
    let leases = queue
        .manual()
        .claim("default", "w", 22_000, secs(60))
        .expect("claim of 22,000");
    assert_eq!(leases.len(), 22_000);
    let ids: std::collections::HashSet<JobId> = leases.iter().map(|l| l.job_id).collect();
    assert_eq!(ids.len(), 22_000, "a job claimed twice");
    assert_eq!(
        queue
            .manual()
            .claim("default", "w", 10, secs(60))
            .unwrap()
            .len(),
        0
    );
}

/// MySQL's: a process that starts while a DBA (or a proxy, or a restart)
/// cuts connections opens its queue anyway. Open checks the server,
/// migrates and reads the server's clock on pooled connections; a cut in
/// any of them is retried within the open's window, as a write's would be,
/// instead of failing the process at start. Each open is on a fresh
/// database, so the migration itself runs under the cuts, and the clock it
/// starts with is the server's (a sample timed across failed tries would
/// run ahead).
#[test]
fn a_queue_opens_while_its_connections_are_killed() {
    let mut kills = 0;
    for i in 0..12 {
        let Some(db) = my::test_database() else {
            return;
        };
        // Every other open finds the schema made and meets a cut every few
        // milliseconds; the others migrate, which takes longer than that
        // between two cuts, so they meet one every 50 ms.
        let pause = if i % 2 == 0 {
            drop(Queue::open(db.url()).expect("an open with no cuts"));
            Duration::from_millis(2)
        } else {
            Duration::from_millis(50)
        };
        let done = AtomicBool::new(false);
        let killed = AtomicUsize::new(0);
        let opened = std::thread::scope(|scope| {
            scope.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    killed.fetch_add(db.kill_connections(), Ordering::SeqCst);
                    std::thread::sleep(pause);
                }
            });
            let opened = Queue::open(db.url());
            // Before asserting: the killing thread must stop for the scope to end.
            done.store(true, Ordering::SeqCst);
            opened
        });
        let queue =
            opened.unwrap_or_else(|e| panic!("open {i} failed under killed connections: {e}"));
        kills += killed.load(Ordering::SeqCst);
        let server_ms: i64 = db
            .connect()
            .query_first("SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS SIGNED)")
            .unwrap()
            .unwrap();
        let ahead = queue.clock().now().timestamp_millis() - server_ms;
        assert!(
            ahead.abs() < 1_000,
            "open {i}: the queue's clock is {ahead} ms off the server's"
        );
        let id = queue
            .enqueue(NewJob::new("k"))
            .expect("enqueue after the open");
        assert_eq!(queue.get(id).unwrap().state, JobState::Pending);
    }
    assert!(kills > 0, "no connection was killed");
}

/// MySQL's: a statement travels in one packet, and a DBA may lower
/// `max_allowed_packet` far below the default. A batch whose payloads each
/// fit but together pass one packet is cut into statements that fit, and
/// every job is stored, instead of the client refusing the statement (and
/// tickler retrying it for the whole window as if the connection were cut).
#[test]
fn a_batch_larger_than_one_packet_is_stored_in_statements_that_fit() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    with_global(&mut db.connect(), "max_allowed_packet", 2_097_152, || {
        let queue = Queue::builder(db.url())
            .max_payload_bytes(1_000_000)
            .open()
            .expect("open");
        // 20 payloads of about 105 kB: under 2 MiB of payload together,
        // over one 2 MiB packet with the statement's other values.
        let text = "x".repeat(104_848);
        let jobs: Vec<NewJob> = (0..20)
            .map(|_| NewJob::new("k").payload(serde_json::json!(text)))
            .collect();
        let ids = queue.enqueue_batch(jobs).expect("the batch");
        assert_eq!(ids.len(), 20);
        for id in ids {
            let job = queue.get(id).expect("a stored job");
            assert_eq!(job.payload, serde_json::json!(text));
        }
    });
}

/// The server's prepared statements in use, over all clients.
fn prepared_statements(admin: &mut mysql::Conn) -> i64 {
    let (_, count): (String, String) = admin
        .query_first("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'")
        .unwrap()
        .unwrap();
    count.parse().unwrap()
}

/// MySQL's: every pooled connection's prepared statements count against
/// the server's `max_prepared_stmt_count`, shared by all its clients, and
/// batches of each size are statements of their own. Batches of 2 to 300
/// jobs keep at most the URL's `stmt_cache_size` per connection; and with
/// the server's limit lowered under what tickler's connections would
/// hold, every batch is still stored (a connection refused a statement
/// is dropped, freeing its statements, and the work retried).
#[test]
fn batches_of_every_size_keep_within_the_statement_cache_and_the_servers_limit() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    let mut admin = db.connect();
    let batches = |queue: &Queue| {
        for n in 2..=300usize {
            let jobs = (0..n)
                .map(|i| NewJob::new("k").payload(serde_json::json!(i)))
                .collect();
            let ids = queue
                .enqueue_batch(jobs)
                .unwrap_or_else(|e| panic!("a batch of {n}: {e}"));
            assert_eq!(ids.len(), n);
        }
    };
    let before = prepared_statements(&mut admin);
    let queue = Queue::open(format!("{}?stmt_cache_size=16", db.url())).expect("open");
    batches(&queue);
    let connections: i64 = admin
        .exec_first(
            "SELECT count(*) FROM information_schema.PROCESSLIST
             WHERE DB = ? AND ID <> CONNECTION_ID()",
            (db.url().rsplit('/').next().unwrap(),),
        )
        .unwrap()
        .unwrap();
    let held = prepared_statements(&mut admin) - before;
    assert!(
        held <= 16 * connections,
        "{held} prepared statements on {connections} connections with stmt_cache_size=16"
    );
    drop(queue);
    // The closed connections' statements go as the server ends each one.
    let mut last = -1;
    wait_until(
        "the closed connections' statements are gone",
        secs(10),
        || {
            let now = prepared_statements(&mut admin);
            std::mem::replace(&mut last, now) == now && now <= before + 16
        },
    );

    let low = prepared_statements(&mut admin) + 40;
    with_global(&mut admin, "max_prepared_stmt_count", low, || {
        let queue = Queue::open(db.url()).expect("open");
        batches(&queue);
    });
}

/// MySQL's: it is the engine whose other processes learn of changes by
/// looking at a fingerprint of the tables. A job whose id was drawn before
/// another's but committed after it (an application's transaction), and a
/// queue paused while another is resumed between two looks, each change
/// what a pool may claim: another process's watcher must wake for both.
#[test]
fn another_processs_watcher_wakes_for_a_lower_id_committed_later_and_a_swapped_pause() {
    let Some(db) = my::test_database() else {
        return;
    };
    let a = Queue::open(db.url()).expect("open a");
    let b = Queue::open(db.url()).expect("open b");
    let mut watcher = b.manual().watcher().unwrap();
    let wait = |watcher: &mut tickler::ChangeWatcher| {
        watcher
            .wait(secs(4), Duration::from_millis(50))
            .expect("wait")
    };

    let mut conn = db.connect();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let low = a.enqueue_tx(&mut tx, NewJob::new("k")).unwrap();
    let high = a.enqueue(NewJob::new("k")).unwrap();
    assert!(low < high, "the application's job drew the lower id");
    assert!(wait(&mut watcher), "no wake-up for the later job");
    tx.commit().unwrap();
    assert!(
        wait(&mut watcher),
        "no wake-up for job {low:?}, committed after job {high:?}"
    );

    a.pause_queue("one").unwrap();
    assert!(wait(&mut watcher), "no wake-up for a pause");
    a.pause_queue("two").unwrap();
    a.resume_queue("one").unwrap();
    assert!(
        wait(&mut watcher),
        "no wake-up for queue one resumed while queue two was paused"
    );
}

/// MySQL's (PostgreSQL's engine has its own read timeouts to get right): a
/// server that stops answering, its process stopped while the kernel
/// still accepts and acknowledges, fails a call after a bounded wait
/// instead of blocking it until the server comes back, and the queue and a
/// pool carry on once it answers again.
#[test]
fn a_server_that_stops_answering_fails_a_call_in_bounded_time_and_the_queue_recovers() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    let queue = Queue::builder(db.url())
        .busy_timeout(secs(1))
        .busy_retry(secs(2))
        .open()
        .expect("open");
    let runs: Runs = Arc::default();
    let mut pool = counting_pool(&queue, &runs);
    let enqueue_some = |n: usize| -> Vec<JobId> {
        (0..n)
            .map(|_| queue.enqueue(NewJob::new("work")).expect("enqueue"))
            .collect()
    };
    let before = enqueue_some(20);
    wait_until("the jobs before the stop ran", secs(60), || {
        let runs = runs.lock().unwrap();
        before.iter().all(|id| runs.contains_key(id))
    });

    let Some(stopped) = my::Stopped::server(db.url()) else {
        return;
    };
    let (enqueued, enqueue_rx) = std::sync::mpsc::channel();
    let during = queue.clone();
    std::thread::spawn(move || {
        let _ = enqueued.send(during.enqueue(NewJob::new("work")));
    });
    let (opened, open_rx) = std::sync::mpsc::channel();
    let url = db.url().to_owned();
    std::thread::spawn(move || {
        let _ = opened.send(
            Queue::builder(url)
                .busy_timeout(secs(1))
                .busy_retry(secs(2))
                .open(),
        );
    });
    // Far above the wait the engine allows itself (the read timeout and
    // one pool timeout), far below "until the server is back".
    let enqueue = enqueue_rx.recv_timeout(secs(120));
    let open = open_rx.recv_timeout(secs(60));
    drop(stopped);
    let enqueue = enqueue.expect("an enqueue was still blocked after 120 s on a stopped server");
    let open = open
        .expect("an open was still blocked on a stopped server 60 s after the enqueue returned");
    for (what, error) in [
        ("enqueue", enqueue.map(|_| ()).err()),
        ("open", open.map(|_| ()).err()),
    ] {
        let error = error.unwrap_or_else(|| panic!("an {what} succeeded on a stopped server"));
        eprintln!("the {what} on the stopped server failed with: {error}");
        assert!(
            error.to_string().contains("did not answer"),
            "the {what} on a stopped server failed without naming the cause: {error}"
        );
    }

    let after = enqueue_some(20);
    wait_until("the jobs after the stop ran", secs(120), || {
        let runs = runs.lock().unwrap();
        after.iter().all(|id| runs.contains_key(id))
    });
    wait_until("every job succeeded", secs(60), || {
        before
            .iter()
            .chain(&after)
            .all(|id| queue.get(*id).is_ok_and(|j| j.state == JobState::Succeeded))
    });
    pool.shutdown(secs(10));
}

/// MySQL's, as the test above: a call on a stopped server fails after one
/// answer wait (10 s here), not one per connection it touches: neither a
/// transaction's ROLLBACK on the connection that gave up, nor r2d2's check
/// of each idle connection in turn (idle over 1 s, so each is checked),
/// waits a whole answer wait again. Four idle connections and a
/// transactional read would take 20 s and more.
#[test]
fn a_call_on_a_stopped_server_waits_one_answer_wait_however_many_connections_are_idle() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    let queue = Queue::builder(db.url())
        .busy_timeout(secs(1))
        .busy_retry(secs(2))
        .postgres(|o| o.max_connections(4))
        .open()
        .expect("open");
    let id = queue.enqueue(NewJob::new("work")).expect("enqueue");
    // Several connections in use at once, then idle long enough to be
    // checked at their next checkout.
    let until = Instant::now() + Duration::from_millis(800);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let q = queue.clone();
            std::thread::spawn(move || {
                while Instant::now() < until {
                    q.get(id).expect("get");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let Some(stopped) = my::Stopped::server(db.url()) else {
        return;
    };
    let started = Instant::now();
    let got = queue.get(id);
    let get_took = started.elapsed();
    let started = Instant::now();
    let enqueued = queue.enqueue(NewJob::new("work"));
    let enqueue_took = started.elapsed();
    drop(stopped);
    assert!(got.is_err() && enqueued.is_err(), "{got:?} {enqueued:?}");
    // One answer wait (10 s) and the pool's own second, with room for a
    // slow machine; two answer waits would be 20 s.
    for (what, took) in [("get", get_took), ("enqueue", enqueue_took)] {
        assert!(
            took < secs(16),
            "a {what} on a stopped server took {took:?}"
        );
    }
    queue
        .enqueue(NewJob::new("work"))
        .expect("enqueue once the server is back");
}

/// MySQL's: a server's configuration can turn `autocommit` off for every
/// session (`autocommit = 0` in a my.cnf, or `completion_type = CHAIN`,
/// which opens a new transaction at each COMMIT). A single enqueue is one
/// statement that tickler commits by autocommit: on such a server it was
/// acknowledged, seen by no other session, and lost when its connection
/// went, unless the session sets both back.
#[test]
fn a_server_configured_without_autocommit_loses_no_acknowledged_enqueue() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    for (name, value) in [("autocommit", 0), ("completion_type", 1)] {
        with_global(&mut db.connect(), name, value, || {
            let queue = Queue::open(db.url()).unwrap();
            queue.enqueue(NewJob::new(name).queue(name)).unwrap();
            let claimed = queue.manual().claim(name, "w", 1, secs(30)).unwrap();
            queue.manual().complete(&claimed[0]).unwrap();
            // Last: a transaction started after them would commit them.
            for _ in 0..2 {
                queue.enqueue(NewJob::new(name).queue(name)).unwrap();
            }
            // Closing the queue's connections rolls back what they left open.
            drop(queue);
            let mut other = db.connect();
            other
                .query_drop("SET SESSION autocommit = 1, completion_type = 0")
                .unwrap();
            let stored: Vec<(Vec<u8>, i64)> = other
                .exec(
                    "SELECT status, count(*) FROM tickler_jobs WHERE kind = ? \
                     GROUP BY status ORDER BY status",
                    (name,),
                )
                .unwrap();
            assert_eq!(
                stored,
                vec![(b"pending".to_vec(), 2), (b"succeeded".to_vec(), 1)],
                "{name} = {value}: acknowledged writes another session cannot see"
            );
        });
    }
}

/// MySQL's: a server whose default row format is COMPACT (an old my.cnf,
/// a server upgraded in place) refuses an index on a column longer than
/// 767 bytes, as the unique key's is. The first open creates every table
/// with DYNAMIC rows instead of failing halfway with "Index column size
/// too large".
#[test]
fn a_server_defaulting_to_compact_rows_opens_and_takes_long_unique_keys() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    // 1 is COMPACT among REDUNDANT, COMPACT, DYNAMIC.
    with_global(&mut db.connect(), "innodb_default_row_format", 1, || {
        let queue = Queue::open(db.url()).expect("open on a server defaulting to COMPACT");
        let key = "k".repeat(1000);
        queue.enqueue(NewJob::new("long").unique_key(&key)).unwrap();
        let formats: Vec<(String, String)> = db
            .connect()
            .query(
                "SELECT TABLE_NAME, ROW_FORMAT FROM information_schema.TABLES
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'tickler%'
                 ORDER BY TABLE_NAME",
            )
            .unwrap();
        assert!(formats.len() >= 4, "{formats:?}");
        for (table, format) in formats {
            assert_eq!(format, "Dynamic", "{table}");
        }
    });
}

/// Returns once a statement sleeps in a trigger's `DO SLEEP(3)` (as the
/// transaction of `who` does, holding its locks).
fn wait_for_trigger_sleep(conn: &mut mysql::Conn, who: &str) {
    wait_until(&format!("{who} sleeps in the trigger"), secs(10), || {
        let sleeping: Option<i64> = conn
            .query_first(
                "SELECT count(*) FROM information_schema.PROCESSLIST
                 WHERE INFO = 'DO SLEEP(3)' AND STATE = 'User sleep' AND DB = DATABASE()",
            )
            .unwrap();
        sleeping == Some(1)
    });
}

/// MySQL's: an InnoDB range scan with `FOR UPDATE` locks the first row
/// past its range, until its transaction ends, and a claim skips what is
/// locked. The reaper's look for finished jobs whose holder's lease ran
/// out ended on the first pending row of its index, so a claim while the
/// reaper's transaction was open took a lower-priority job first (one
/// pool thread then ran its jobs out of order). A trigger holds the
/// reaper's transaction open here; PostgreSQL locks only the rows a
/// locking read returns, and SQLite has one writer.
#[test]
fn a_claim_while_the_reaper_is_in_its_transaction_takes_the_highest_priority_job() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    // A cancelled job whose holder's lease runs out: the reaper clears it.
    let stopping = queue.enqueue(NewJob::new("k").priority(100)).unwrap();
    let lease = queue
        .manual()
        .claim("default", "w", 1, Duration::from_millis(1))
        .unwrap()
        .remove(0);
    assert_eq!(lease.job_id, stopping);
    queue.cancel(stopping).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let first = queue.enqueue(NewJob::new("k").priority(10)).unwrap();
    let second = queue.enqueue(NewJob::new("k").priority(0)).unwrap();
    let mut conn = db.connect();
    conn.query_drop(
        "CREATE TRIGGER slow_reaper BEFORE UPDATE ON tickler_jobs FOR EACH ROW
         IF OLD.status = 'cancelled' AND NEW.lease_expires_at IS NULL THEN DO SLEEP(3); END IF",
    )
    .unwrap();
    std::thread::scope(|scope| {
        let reaper = scope.spawn(|| queue.manual().reap().unwrap());
        wait_for_trigger_sleep(&mut conn, "the reaper");
        let claimed = queue
            .manual()
            .claim("default", "w", 1, secs(60))
            .unwrap()
            .remove(0);
        assert_eq!(
            claimed.job_id, first,
            "the claim skipped the highest-priority job"
        );
        reaper.join().unwrap();
    });
    let claimed = queue.manual().claim("default", "w", 1, secs(60)).unwrap();
    assert_eq!(claimed[0].job_id, second);
    let job = queue.get(stopping).unwrap();
    assert_eq!(job.state, JobState::Cancelled);
}

/// MySQL's, as the reaper's case above: a claim promotes its queue's due
/// scheduled jobs, and a locking scan over that queue's due times ended on
/// the next entry of the index, the earliest scheduled job of the next
/// queue, and held it until the claim committed. A claim of that queue
/// beside it skipped its own due job and got nothing. A trigger holds the
/// first claim's transaction open.
#[test]
fn a_claim_in_another_queue_beside_a_claim_in_its_transaction_gets_its_due_job() {
    let Some(db) = my::test_database() else {
        return;
    };
    let queue = Queue::open(db.url()).expect("open");
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(200);
    let a = queue
        .enqueue(NewJob::new("k").queue("a").run_at(soon))
        .unwrap();
    let b = queue
        .enqueue(NewJob::new("k").queue("b").run_at(soon))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut conn = db.connect();
    conn.query_drop(
        "CREATE TRIGGER slow_claim BEFORE UPDATE ON tickler_jobs FOR EACH ROW
         IF NEW.queue = 'a' AND NEW.status = 'running' THEN DO SLEEP(3); END IF",
    )
    .unwrap();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| queue.manual().claim("a", "w", 5, secs(60)).unwrap());
        wait_for_trigger_sleep(&mut conn, "the claim of queue a");
        let claimed = queue.manual().claim("b", "w", 1, secs(60)).unwrap();
        assert_eq!(
            claimed.iter().map(|l| l.job_id).collect::<Vec<_>>(),
            vec![b],
            "queue b's due job was skipped"
        );
        let first = first.join().unwrap();
        assert_eq!(first[0].job_id, a);
    });
}

/// MySQL's: a DBA's server-wide statement time limit (MariaDB's
/// `max_statement_time`, MySQL's `max_execution_time`) ends any statement
/// that runs longer, one that only waits for a row lock too, with an error
/// no retry is for: in a pool, a whole batch of outcomes lost and those
/// jobs run again. tickler's sessions lift it; their lock waits are
/// bounded by `busy_timeout` instead.
#[test]
fn a_servers_statement_time_limit_does_not_end_ticklers_lock_waits() {
    let Some(db) = my::exclusive_database() else {
        return;
    };
    let mut admin = db.connect();
    let version: String = admin.query_first("SELECT VERSION()").unwrap().unwrap();
    let (name, limit) = if version.contains("MariaDB") {
        ("max_statement_time", 1)
    } else {
        ("max_execution_time", 1000)
    };
    with_global(&mut admin, name, limit, || {
        let queue = Queue::builder(db.url())
            .busy_timeout(secs(4))
            .open()
            .expect("open");
        let id = queue.enqueue(NewJob::new("k")).unwrap();
        let lease = queue
            .manual()
            .claim("default", "w", 1, secs(60))
            .unwrap()
            .remove(0);
        let mut other = db.connect();
        other.query_drop("START TRANSACTION").unwrap();
        other
            .exec_drop(
                "SELECT id FROM tickler_jobs WHERE id = ? FOR UPDATE",
                (id.0,),
            )
            .unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(secs(2));
            other.query_drop("COMMIT").unwrap();
        });
        let completed = queue.manual().complete(&lease);
        holder.join().unwrap();
        completed.expect("the completion waits for the row lock, past the server's limit");
        assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
    });
}

/// MySQL's: `GET_LOCK` names are the server's, not a database's. The
/// migration's lock is named after its database, so a migration stuck in
/// another database (its host gone without closing the connection, which
/// the server keeps for hours) does not hold back the opens of this one,
/// while processes opening this new database together still migrate it
/// one at a time and all open.
#[test]
fn a_migration_waits_only_for_migrations_of_its_own_database() {
    let Some(db) = my::test_database() else {
        return;
    };
    let mut stuck = db.connect();
    // The name tickler used for every database on the server.
    let held: Option<i64> = stuck
        .query_first("SELECT GET_LOCK('tickler_migrate', 0)")
        .unwrap();
    assert_eq!(held, Some(1));
    let url = db.url().to_owned();
    let (done, opened) = std::sync::mpsc::channel();
    for _ in 0..4 {
        let (url, done) = (url.clone(), done.clone());
        std::thread::spawn(move || {
            let _ = done.send(Queue::open(&url).and_then(|q| q.enqueue(NewJob::new("k"))));
        });
    }
    for _ in 0..4 {
        let id = opened
            .recv_timeout(secs(30))
            .expect("an open waited for another database's migration lock");
        id.expect("open and enqueue");
    }
    let jobs: Option<i64> = db
        .connect()
        .query_first("SELECT COUNT(*) FROM tickler_jobs")
        .unwrap();
    assert_eq!(jobs, Some(4));
    drop(stuck);
}
