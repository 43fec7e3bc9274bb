//! `--only mysql`: tickler's MySQL engine against raw loops on the same
//! server in the same run: the naive claim of the case study (12 workers,
//! `ORDER BY id LIMIT 1 FOR UPDATE`, REPEATABLE READ), the strict one
//! (`SKIP LOCKED`, 32 per transaction, READ COMMITTED, a `(status, id)`
//! index), the same on two tables (ready and running rows apart),
//! single-row inserts from 16 threads into a plain table and into
//! tickler's own; then tickler's burn-down, wake-ups (same queue and another),
//! enqueues and the claim's cost by depth. Server: `TICKLER_BENCH_MYSQL_URL`
//! (`.ci/mariadb` starts a throwaway MariaDB).

use mysql::prelude::Queryable;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tickler::{JobContext, JobError, NewJob, Queue, WorkerPool};

use super::{emit, round, with_dbname};

const TABLE: &str = "tickler_bench_raw";
const THREADS: usize = 4;
const NAIVE_THREADS: usize = 12;
const INSERT_THREADS: usize = 16;
const BATCH: usize = 32;

fn connect(url: &str, read_committed: bool) -> mysql::Conn {
    let mut init = vec!["SET time_zone = '+00:00'".to_owned()];
    if read_committed {
        init.push("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_owned());
    }
    let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(url).expect("a MySQL URL"))
        .prefer_socket(false)
        .init(init);
    mysql::Conn::new(opts).expect("connect")
}

fn fresh_database(server: &str) -> String {
    fresh_database_named(server, "tickler_bench_engine")
}

/// A fresh, empty database `name`; returns its URL.
pub(super) fn fresh_database_named(server: &str, name: &str) -> String {
    let mut admin = connect(server, false);
    admin
        .query_drop(format!("DROP DATABASE IF EXISTS {name}"))
        .expect("drop database");
    admin
        .query_drop(format!("CREATE DATABASE {name}"))
        .expect("create database");
    with_dbname(server, name)
}

/// A table shaped like a queue's, with `n` pending rows.
fn fresh_table(url: &str, n: usize) {
    let mut c = connect(url, false);
    c.query_drop(format!("DROP TABLE IF EXISTS {TABLE}"))
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE {TABLE} (id BIGINT AUTO_INCREMENT PRIMARY KEY,
             status VARCHAR(16) NOT NULL, payload TEXT NOT NULL, run_token VARCHAR(64),
             KEY by_status (status, id)) ENGINE = InnoDB"
    ))
    .unwrap();
    let mut left = n;
    while left > 0 {
        let k = left.min(1_000);
        let values = vec!["('pending', '{}')"; k].join(", ");
        c.query_drop(format!(
            "INSERT INTO {TABLE} (status, payload) VALUES {values}"
        ))
        .unwrap();
        left -= k;
    }
}

fn check_done(url: &str, n: usize) {
    let done: Option<i64> = connect(url, false)
        .query_first(format!(
            "SELECT count(*) FROM {TABLE} WHERE status = 'done'"
        ))
        .unwrap();
    assert_eq!(done, Some(n as i64), "raw loop left jobs");
}

/// The case study's loop: each of 12 workers takes the lowest pending id
/// with a plain `FOR UPDATE` (they queue behind one another), marks it,
/// commits, then marks it done.
fn naive(url: &str, n: usize) -> f64 {
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..NAIVE_THREADS {
            s.spawn(|| {
                let mut c = connect(url, false);
                loop {
                    c.query_drop("START TRANSACTION").unwrap();
                    let id: Option<i64> = c
                        .query_first(format!(
                            "SELECT id FROM {TABLE} WHERE status = 'pending'
                             ORDER BY id LIMIT 1 FOR UPDATE"
                        ))
                        .unwrap();
                    let Some(id) = id else {
                        c.query_drop("COMMIT").unwrap();
                        return;
                    };
                    c.exec_drop(
                        format!("UPDATE {TABLE} SET status = 'running' WHERE id = ?"),
                        (id,),
                    )
                    .unwrap();
                    c.query_drop("COMMIT").unwrap();
                    c.exec_drop(
                        format!("UPDATE {TABLE} SET status = 'done' WHERE id = ?"),
                        (id,),
                    )
                    .unwrap();
                }
            });
        }
    });
    n as f64 / started.elapsed().as_secs_f64()
}

fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The loop both raw layouts share: per transaction, run `finish` on the
/// previous 32 ids, read the next 32 with `next` (`SKIP LOCKED`), and run
/// `take` on them; READ COMMITTED, 4 threads. `IDS` in a statement stands
/// for the ids' markers.
fn claim_loop(url: &str, n: usize, finish: &[String], next: &str, take: &[String]) -> f64 {
    let run = |c: &mut mysql::Conn, statements: &[String], ids: &[i64]| {
        for sql in statements {
            c.exec_drop(sql.replace("IDS", &marks(ids.len())), ids.to_vec())
                .unwrap();
        }
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut c = connect(url, true);
                let mut held: Vec<i64> = Vec::new();
                loop {
                    c.query_drop("START TRANSACTION").unwrap();
                    if !held.is_empty() {
                        run(&mut c, finish, &held);
                    }
                    let ids: Vec<i64> = c.query(next).unwrap();
                    if !ids.is_empty() {
                        run(&mut c, take, &ids);
                    }
                    c.query_drop("COMMIT").unwrap();
                    if ids.is_empty() && held.is_empty() {
                        return;
                    }
                    held = ids;
                }
            });
        }
    });
    n as f64 / started.elapsed().as_secs_f64()
}

/// The strict loop on one table with a `(status, id)` index: completion
/// and claim are status updates.
fn batched(url: &str, n: usize) -> f64 {
    claim_loop(
        url,
        n,
        &[format!(
            "UPDATE {TABLE} SET status = 'done' WHERE id IN (IDS)"
        )],
        &format!(
            "SELECT id FROM {TABLE} WHERE status = 'pending'
             ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED"
        ),
        &[format!(
            "UPDATE {TABLE} SET status = 'running', run_token = UUID() WHERE id IN (IDS)"
        )],
    )
}

/// Single-row inserts of `payload` by `sql` (one marker) in autocommit
/// from 16 threads.
fn insert(url: &str, n: usize, sql: &str, payload: &str) -> f64 {
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..INSERT_THREADS {
            s.spawn(move || {
                let mut c = connect(url, true);
                let mine = n / INSERT_THREADS + usize::from(t < n % INSERT_THREADS);
                for _ in 0..mine {
                    c.exec_drop(sql, (payload,)).unwrap();
                }
            });
        }
    });
    n as f64 / started.elapsed().as_secs_f64()
}

const READY: &str = "tickler_bench_ready";
const RUNNING: &str = "tickler_bench_running";

/// The two-table layout: `n` rows in a ready table, none running.
fn fresh_two_tables(url: &str, n: usize) {
    let mut c = connect(url, false);
    for t in [READY, RUNNING] {
        c.query_drop(format!("DROP TABLE IF EXISTS {t}")).unwrap();
        c.query_drop(format!(
            "CREATE TABLE {t} (id BIGINT AUTO_INCREMENT PRIMARY KEY,
                 payload TEXT NOT NULL, run_token VARCHAR(64)) ENGINE = InnoDB"
        ))
        .unwrap();
    }
    let mut left = n;
    while left > 0 {
        let k = left.min(1_000);
        let values = vec!["('{}')"; k].join(", ");
        c.query_drop(format!("INSERT INTO {READY} (payload) VALUES {values}"))
            .unwrap();
        left -= k;
    }
}

/// The strict loop on two tables: completion deletes from the running
/// table, and the claim moves rows from the ready table into it. Neither
/// table needs a status index.
fn two_tables(url: &str, n: usize) -> f64 {
    let rate = claim_loop(
        url,
        n,
        &[format!("DELETE FROM {RUNNING} WHERE id IN (IDS)")],
        &format!("SELECT id FROM {READY} ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED"),
        &[
            format!(
                "INSERT INTO {RUNNING} (id, payload, run_token)
                 SELECT id, payload, UUID() FROM {READY} WHERE id IN (IDS)"
            ),
            format!("DELETE FROM {READY} WHERE id IN (IDS)"),
        ],
    );
    let left: Option<i64> = connect(url, false)
        .query_first(format!(
            "SELECT (SELECT count(*) FROM {READY}) + (SELECT count(*) FROM {RUNNING})"
        ))
        .unwrap();
    assert_eq!(left, Some(0), "two-table loop left rows");
    rate
}

/// A pending job in tickler's own table, for [`insert`]: the raw cost of
/// its indexes and generated column, without tickler's validation, pool
/// or transaction.
const INSERT_INTO_JOBS_SQL: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status,
         priority, run_at, max_attempts, created_at, errors)
     VALUES ('default', 'noop', ?, 'pending', 0, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED),
         25, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), '[]')";

/// Quantile `q` of sorted milliseconds.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// How soon an idle pool starts a job enqueued through `enqueuer`, over
/// `n` jobs each after a random idle spell (0 to 2.5 s), so the watcher's
/// backed-off step is met in every phase. A second `Queue` on the same
/// URL shares nothing with the pool's (no in-process wake), which is what
/// another process sees.
fn wake_ups(pool_queue: &Queue, enqueuer: &Queue, n: usize) -> (f64, f64, f64) {
    let (tx, rx) = crossbeam_channel::unbounded::<(u64, Instant)>();
    let mut pool = WorkerPool::builder(pool_queue)
        .threads(THREADS)
        .handler("wake", move |ctx: &JobContext| {
            let i = ctx.payload()["i"].as_u64().unwrap_or(u64::MAX);
            tx.send((i, Instant::now())).ok();
            Ok::<(), JobError>(())
        })
        .start()
        .expect("start pool");
    let mut rng = fastrand::Rng::with_seed(7);
    let mut delays = Vec::with_capacity(n);
    for i in 0..n as u64 {
        std::thread::sleep(Duration::from_millis(rng.u64(0..2_500)));
        let job = NewJob::new("wake").payload(json!({ "i": i }));
        enqueuer.enqueue(job).expect("enqueue");
        let enqueued = Instant::now();
        let (got, started) = rx.recv_timeout(Duration::from_secs(30)).expect("a start");
        assert_eq!(got, i, "jobs started out of turn");
        delays.push(started.saturating_duration_since(enqueued).as_secs_f64() * 1e3);
    }
    pool.shutdown(Duration::from_secs(5));
    delays.sort_by(f64::total_cmp);
    (
        quantile(&delays, 0.5),
        quantile(&delays, 0.95),
        quantile(&delays, 1.0),
    )
}

fn noop_pool(queue: &Queue, done: &Arc<AtomicUsize>) -> WorkerPool {
    let done = Arc::clone(done);
    WorkerPool::builder(queue)
        .threads(THREADS)
        .handler("noop", move |_: &JobContext| {
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<(), JobError>(())
        })
        .start()
        .expect("start pool")
}

fn fill(queue: &Queue, n: usize, job: impl Fn() -> NewJob) {
    let mut left = n;
    while left > 0 {
        let k = left.min(5_000);
        queue
            .enqueue_batch((0..k).map(|_| job()).collect())
            .expect("fill");
        left -= k;
    }
}

pub fn engine(quick: bool) {
    let Some(server) = std::env::var("TICKLER_BENCH_MYSQL_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!(
            "# mysql skipped: TICKLER_BENCH_MYSQL_URL is not set \
             (.ci/mariadb cargo bench --features mysql --bench tickler_bench -- --only mysql)"
        );
        return;
    };
    let (naive_jobs, burn, inserts) = if quick {
        (2_000, 20_000, 4_000)
    } else {
        (10_000, 200_000, 40_000)
    };
    let depths: &[usize] = if quick {
        &[1_000, 100_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    let version: String = connect(&server, false)
        .query_first("SELECT VERSION()")
        .unwrap()
        .unwrap_or_default();
    let raw_url = fresh_database(&server);

    fresh_table(&raw_url, naive_jobs);
    let naive_rate = naive(&raw_url, naive_jobs);
    check_done(&raw_url, naive_jobs);
    fresh_table(&raw_url, burn);
    let raw_batched = batched(&raw_url, burn);
    check_done(&raw_url, burn);
    fresh_two_tables(&raw_url, burn);
    let raw_two_tables = two_tables(&raw_url, burn);
    fresh_table(&raw_url, 0);
    let raw_insert = insert(
        &raw_url,
        inserts,
        &format!("INSERT INTO {TABLE} (status, payload) VALUES ('pending', ?)"),
        "{}",
    );
    let schema_url = fresh_database(&server);
    drop(Queue::open(&schema_url).expect("open"));
    let raw_schema_insert = insert(&schema_url, inserts, INSERT_INTO_JOBS_SQL, "null");
    emit(
        json!({"scenario": "mysql_raw_baselines", "server_version": version,
        "naive_for_update_12_threads": round(naive_rate),
        "claim_complete_batched_4_threads": round(raw_batched),
        "claim_complete_batched_two_tables_4_threads": round(raw_two_tables),
        "insert_16_threads": round(raw_insert),
        "insert_into_tickler_jobs_16_threads": round(raw_schema_insert),
        "note": "naive: REPEATABLE READ, SELECT .. ORDER BY id LIMIT 1 FOR UPDATE, UPDATE, COMMIT, UPDATE done; batched: READ COMMITTED, per transaction UPDATE done WHERE id IN (previous 32), SELECT .. LIMIT 32 FOR UPDATE SKIP LOCKED, UPDATE running WHERE id IN (..); insert: autocommit single-row INSERTs"}),
    );

    // Burn-down of no-op jobs, 4 threads, default settings.
    let url = fresh_database(&server);
    let queue = Queue::open(&url).expect("open");
    fill(&queue, burn, || NewJob::new("noop"));
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut pool = noop_pool(&queue, &done);
    let until = Instant::now() + Duration::from_secs(900);
    while done.load(Ordering::Relaxed) < burn {
        assert!(Instant::now() < until, "burn-down did not finish");
        std::thread::sleep(Duration::from_millis(1));
    }
    let rate = burn as f64 / started.elapsed().as_secs_f64();
    pool.shutdown(Duration::from_secs(5));
    emit(
        json!({"scenario": "mysql_burn_down", "threads": THREADS, "settings": "default",
        "jobs": burn, "jobs_per_s": round(rate),
        "ratio_to_raw_batched": round(rate / raw_batched),
        "ratio_to_naive": round(rate / naive_rate), "target": 0.7}),
    );
    drop(queue);

    // Single enqueues from 16 threads, on as many connections as the raw loop.
    let url = fresh_database(&server);
    let queue = Queue::builder(&url)
        .postgres(|o| o.max_connections(INSERT_THREADS as u32 + 1))
        .open()
        .expect("open");
    let start = Arc::new(Barrier::new(INSERT_THREADS + 1));
    let handles: Vec<_> = (0..INSERT_THREADS)
        .map(|t| {
            let (queue, start) = (queue.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mine = inserts / INSERT_THREADS + usize::from(t < inserts % INSERT_THREADS);
                start.wait();
                for _ in 0..mine {
                    queue.enqueue(NewJob::new("noop")).expect("enqueue");
                }
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    for h in handles {
        h.join().expect("enqueue thread");
    }
    let rate = inserts as f64 / started.elapsed().as_secs_f64();
    emit(
        json!({"scenario": "mysql_enqueue_16_threads", "jobs": inserts,
        "jobs_per_s": round(rate), "ratio_to_raw_insert": round(rate / raw_insert),
        "ratio_to_raw_insert_same_table": round(rate / raw_schema_insert),
        "target": 0.8, "settings": "max_connections(17)"}),
    );
    drop(queue);

    // Wake-ups: a job enqueued through the pool's own queue, and through
    // another queue on the same server (as from another process).
    let url = fresh_database(&server);
    let queue = Queue::open(&url).expect("open");
    let other = Queue::open(&url).expect("open a second queue");
    let wake_jobs = if quick { 12 } else { 40 };
    for (path, enqueuer) in [("same_queue", &queue), ("other_process", &other)] {
        let (p50, p95, max) = wake_ups(&queue, enqueuer, wake_jobs);
        emit(
            json!({"scenario": "mysql_wake_up", "path": path, "jobs": wake_jobs,
            "p50_ms": round(p50), "p95_ms": round(p95), "max_ms": round(max),
            "settings": "default (fallback_poll 1 s)"}),
        );
    }
    drop((queue, other));

    // Claim plus completion by depth, also with 99 % of the jobs in the
    // future at a higher priority (a plan that read them would grow).
    for shape in ["due", "future_99"] {
        for &n in depths {
            let url = fresh_database(&server);
            let queue = Queue::open(&url).expect("open");
            let (due, future) = if shape == "due" {
                (n, 0)
            } else {
                (n / 100, n - n / 100)
            };
            fill(&queue, due, || NewJob::new("noop"));
            let later = chrono::Utc::now() + chrono::Duration::days(365);
            fill(&queue, future, || {
                NewJob::new("noop").priority(10).run_at(later)
            });
            connect(&url, false)
                .query_drop("ANALYZE TABLE tickler_jobs")
                .unwrap();
            let measured = 1_000.min(due);
            let started = Instant::now();
            for _ in 0..measured {
                let leases = queue
                    .manual()
                    .claim("default", "bench", 1, Duration::from_secs(60))
                    .expect("claim");
                assert_eq!(leases.len(), 1, "a due job");
                queue.manual().complete(&leases[0]).expect("complete");
            }
            let us = started.elapsed().as_secs_f64() * 1e6 / measured as f64;
            emit(
                json!({"scenario": "mysql_depth", "shape": shape, "waiting": n,
                "claim_and_complete_us": round(us)}),
            );
        }
    }
}
