//! The kill -9 torture run, shared by `examples/torture.rs` (long
//! runs), `tests/sqlite/torture_short.rs` (CI, SQLite), `tests/postgres/torture_short.rs`
//! (CI, PostgreSQL) and `tests/mysql/torture_short.rs` (CI, MariaDB). The
//! same run and checks serve every engine: the queue is a SQLite file in
//! the run's folder, a PostgreSQL database (feature `postgres`) or a
//! MySQL/MariaDB database (feature `mysql`), as [`Settings::db_url`] says.
//!
//! A supervisor starts `workers` worker processes (each a [`WorkerPool`] of
//! `threads` threads) and one producer process on one database, all copies
//! of the running executable told their role by environment variables.
//! Every 0.5–3 s it kills a random worker with SIGKILL and starts a new one.
//! The producer enqueues without pause (single jobs and batches, some with
//! unique keys, some delayed, some that always fail with a small
//! `max_attempts`, some that outlive the lease and live on heartbeats).
//! On a server (PostgreSQL, MySQL/MariaDB) the supervisor also, at random
//! intervals, terminates every connection to the database on the server
//! side, and restarts the server a few times when given a command for it.
//!
//! What each side records, so that the end can be checked:
//!
//! - every process appends to its own ledger (`ledger/<role>-<slot>-<pid>.log`),
//!   one `write(2)` per line on an `O_APPEND` file, which survives SIGKILL;
//!   each line starts with the wall-clock time in milliseconds:
//!   handlers write `start` before running and `ok` only after
//!   `JobContext::complete_with` (over the server's own transaction on
//!   PostgreSQL and MySQL) returned `Ok` (the completion was accepted),
//!   `lost` after it returned `LeaseLost`, `cut` after it failed because
//!   the connection was lost (on a server it runs the application's writes
//!   once and so does not retry through a lost connection, as documented); the producer writes
//!   every id it was told was enqueued; every other `Err` that reached this
//!   code is an `err` line, and every warning or error tickler logged is a
//!   `log` line; the supervisor writes each connection cut and server
//!   restart with its start and end;
//! - the database records, inside tickler's own transactions: a completion
//!   inserts one row into `torture_effects` (no unique constraint, so a
//!   double completion would show), and triggers on `tickler_jobs` append
//!   every claim and every transition out of `running` (an accepted outcome
//!   or a take-back by the reaper) to `torture_audit`.
//!
//! At the end (producer stopped, no more kills or cuts, workers drain the
//! queue and stop, one last reaper pass) [`supervise`] checks: no
//! acknowledged enqueue is missing (lost = 0); every job is terminal; no
//! run_token has two accepted outcomes, no job two `succeeded`, no job two
//! effects; every `ok` in a ledger is a committed effect; no run_token was
//! started twice; every duplicate execution is explained by a kill that hit
//! the running handler or by a cut or restart during the run; no error
//! reached user code (`Busy` or other; on a server a `cut` completion
//! counts only if a cut or restart was under way); no process died unless
//! killed. On SQLite: the WAL stayed under its bound, `PRAGMA
//! integrity_check` is `ok`. On a server: tickler logged no error (it gave
//! up on nothing after its retry window), and the table's and indexes'
//! sizes at the end are reported; on PostgreSQL the B-tree indexes pass
//! `amcheck` (when the extension is there), on MySQL/MariaDB every table
//! passes `CHECK TABLE … EXTENDED`.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::{Error, JobContext, JobError, NewJob, Queue, RetryPolicy, WorkerPool, DEFAULT_QUEUE};

/// Role of a child process: `worker` or `producer`.
pub const ENV_ROLE: &str = "TICKLER_TORTURE_ROLE";
/// The run's folder (ledgers, stop files, the SQLite file).
pub const ENV_DIR: &str = "TICKLER_TORTURE_DIR";
/// The queue's location: the SQLite file's path, or a PostgreSQL or MySQL
/// URL.
pub const ENV_DB: &str = "TICKLER_TORTURE_DB";
/// A worker's slot number.
pub const ENV_SLOT: &str = "TICKLER_TORTURE_SLOT";
/// Threads per worker pool.
pub const ENV_THREADS: &str = "TICKLER_TORTURE_THREADS";

/// The pool's lease; the `slow` jobs run longer and live on heartbeats.
const LEASE: Duration = Duration::from_secs(3);
const HEARTBEAT: Duration = Duration::from_millis(300);
/// How long a `slow` job runs: longer than [`LEASE`].
const SLOW_RUN_MS: std::ops::RangeInclusive<u64> = 4_000..=5_000;
/// One `slow` job per this interval from the producer.
const SLOW_EVERY: Duration = Duration::from_millis(2_000);
/// The producer pauses while more jobs than this are unfinished, so the
/// queue drains in bounded time at the end.
const BACKLOG_LIMIT: u64 = 1_500;
/// Distinct unique keys the producer uses.
const UNIQUE_KEYS: u32 = 40;
/// SQLite's `journal_size_limit` as tickler sets it (64 MiB): the size the
/// `-wal` file is cut back to when the log starts over. It is not a cap: the
/// log only starts over once a checkpoint has copied all of it back and no
/// reader is using it, which under writers that never pause takes a while.
pub const JOURNAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;
/// The default bound on the WAL checked by the run: the `journal_size_limit`.
pub const WAL_BOUND: u64 = JOURNAL_SIZE_LIMIT;

const STOP_PRODUCER: &str = "stop-producer";
const STOP_WORKERS: &str = "stop-workers";

/// The error message of the `failing` kind; accepted failures carry it.
const FAILS: &str = "always fails";

/// What the supervisor is asked to do.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long workers are killed and the producer enqueues.
    pub duration: Duration,
    /// Worker processes.
    pub workers: usize,
    /// Threads per worker pool.
    pub threads: usize,
    /// The run's folder; created if missing.
    pub dir: PathBuf,
    /// Shortest and longest pause between two kills.
    pub kill_every: (Duration, Duration),
    /// Longest wait for the queue to drain at the end.
    pub drain_timeout: Duration,
    /// The largest `-wal` file allowed, in bytes (default [`WAL_BOUND`]).
    pub wal_bound: u64,
    /// The URL of a fresh PostgreSQL (`postgres://`) or MySQL/MariaDB
    /// (`mysql://`, `mariadb://`) database (`None`: a SQLite file in
    /// `dir`).
    pub db_url: Option<String>,
    /// On a server: shortest and longest pause between two cuts of every
    /// connection to the database.
    pub cut_every: (Duration, Duration),
    /// On a server: a shell command that restarts it and returns once it
    /// is up (as `TICKLER_TEST_PG_CTL` or `TICKLER_TEST_MYSQL_CTL`);
    /// `None`: no restarts.
    pub server_ctl: Option<String>,
    /// On a server: restarts, spread evenly over the run.
    pub restarts: usize,
}

impl Settings {
    /// Defaults: 3 workers of 4 threads, a kill every 0.5–3 s.
    pub fn new(dir: PathBuf, duration: Duration) -> Settings {
        Settings {
            duration,
            workers: 3,
            threads: 4,
            dir,
            kill_every: (Duration::from_millis(500), Duration::from_millis(3_000)),
            drain_timeout: Duration::from_secs(120),
            wal_bound: WAL_BOUND,
            db_url: None,
            cut_every: (Duration::from_secs(3), Duration::from_secs(10)),
            server_ctl: None,
            restarts: 3,
        }
    }

    /// The queue's location as `Queue::open` takes it.
    fn location(&self) -> PathBuf {
        match &self.db_url {
            Some(url) => PathBuf::from(url),
            None => self.dir.join("torture.db"),
        }
    }

    fn engine(&self) -> Engine {
        match self.db_url.as_deref() {
            None => Engine::Sqlite,
            Some(url) if url.starts_with("mysql://") || url.starts_with("mariadb://") => {
                Engine::Mysql
            }
            Some(_) => Engine::Postgres,
        }
    }

    /// On a database server rather than a SQLite file.
    fn is_server(&self) -> bool {
        self.db_url.is_some()
    }
}

/// The engine under torture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Sqlite,
    Postgres,
    Mysql,
}

impl Engine {
    /// As `Ops::engine` names it.
    fn name(self) -> &'static str {
        match self {
            Engine::Sqlite => "SQLite",
            Engine::Postgres => "PostgreSQL",
            Engine::Mysql => "MySQL",
        }
    }

    fn of(queue: &Queue) -> Engine {
        match queue.ops().engine() {
            "PostgreSQL" => Engine::Postgres,
            "MySQL" => Engine::Mysql,
            _ => Engine::Sqlite,
        }
    }
}

/// How child processes are started: copies of the running executable.
#[derive(Debug, Clone, Copy)]
pub enum Launcher {
    /// The running program is the example: run it again as is.
    Example,
    /// The running program is a test binary: run only this test, which calls
    /// [`run_role`] when it finds [`ENV_ROLE`].
    TestBinary {
        /// Name of that test function.
        test: &'static str,
    },
}

// ------------------------------------------------------------------ ledger

/// An append-only file, one `write(2)` per line (`O_APPEND`), so a line is
/// either wholly there or not at all, whatever kills the process.
#[derive(Debug, Clone)]
pub struct Ledger(Arc<File>);

impl Ledger {
    /// Opens (creates) the ledger at `path` for appending.
    pub fn create(path: &Path) -> Ledger {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("opening ledger {}: {e}", path.display()));
        Ledger(Arc::new(file))
    }

    /// Appends `text` (newlines made spaces) after the wall-clock time in
    /// milliseconds, in one `write(2)`.
    pub fn line(&self, text: &str) {
        let line = format!("{} {}\n", now_ms(), text.replace('\n', " "));
        let written = (&*self.0)
            .write(line.as_bytes())
            .unwrap_or_else(|e| panic!("writing ledger: {e}"));
        assert_eq!(written, line.len(), "short ledger write");
    }
}

/// Wall-clock milliseconds, comparable across the run's processes.
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Sends tickler's warnings and errors (the pool, the reaper) to the ledger.
struct LedgerLogger(Ledger);

impl log::Log for LedgerLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0
                .line(&format!("log {} {}", record.level(), record.args()));
        }
    }

    fn flush(&self) {}
}

/// Sends tickler's warnings and errors to `ledger` as `log` lines (once per
/// process).
pub fn install_logger(ledger: &Ledger) {
    if log::set_boxed_logger(Box::new(LedgerLogger(ledger.clone()))).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

// ------------------------------------------------------------------ roles

/// Runs the role named by [`ENV_ROLE`] and returns the exit code.
pub fn run_role() -> i32 {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let dir = PathBuf::from(env(ENV_DIR));
    let db = PathBuf::from(env(ENV_DB));
    match env(ENV_ROLE).as_str() {
        "worker" => {
            let slot: usize = env(ENV_SLOT).parse().expect("slot");
            let threads: usize = env(ENV_THREADS).parse().expect("threads");
            run_worker(&dir, &db, slot, threads)
        }
        "producer" => run_producer(&dir, &db),
        other => {
            eprintln!("unknown torture role {other:?}");
            2
        }
    }
}

/// Backoff of the workers: short, so the drain at the end is quick.
fn worker_retry_policy() -> RetryPolicy {
    RetryPolicy {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(1),
        jitter: true,
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Quick,
    Slow,
    Failing,
}

fn run_worker(dir: &Path, db: &Path, slot: usize, threads: usize) -> i32 {
    let pid = std::process::id();
    let ledger = Ledger::create(&dir.join(format!("ledger/worker-{slot}-{pid}.log")));
    install_logger(&ledger);
    let queue = match Queue::builder(db)
        .retry_policy(worker_retry_policy())
        .open()
    {
        Ok(queue) => queue,
        Err(e) => {
            ledger.line(&format!("err open {e}"));
            return 3;
        }
    };
    let engine = Engine::of(&queue);
    let handler = |kind: Kind| {
        let ledger = ledger.clone();
        move |ctx: &JobContext| handle(&ledger, ctx, kind, engine)
    };
    let pool = WorkerPool::builder(&queue)
        .threads(threads)
        .lease(LEASE)
        .heartbeat_interval(HEARTBEAT)
        .handler("quick", handler(Kind::Quick))
        .handler("slow", handler(Kind::Slow))
        .handler("failing", handler(Kind::Failing))
        .start();
    let mut pool = match pool {
        Ok(pool) => pool,
        Err(e) => {
            ledger.line(&format!("err pool_start {e}"));
            return 3;
        }
    };
    ledger.line("ready");
    while !dir.join(STOP_WORKERS).exists() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = pool.shutdown(Duration::from_secs(30));
    ledger.line(&format!(
        "exit released={} still_running={}",
        report.released, report.still_running
    ));
    0
}

/// The handlers. `quick` and `slow` complete with one effect row written in
/// the completing transaction; `failing` always fails.
fn handle(ledger: &Ledger, ctx: &JobContext, kind: Kind, engine: Engine) -> Result<(), JobError> {
    let id = ctx.job_id().0;
    let token = ctx.run_token().0.clone();
    ledger.line(&format!(
        "start {id} {token} {} {}",
        ctx.attempt(),
        ctx.kind()
    ));
    match kind {
        Kind::Failing => {
            ledger.line(&format!("fail {id} {token}"));
            return Err(JobError::retry(format!("{FAILS} (run {token})")));
        }
        Kind::Quick => std::thread::sleep(Duration::from_millis(fastrand::u64(0..=10))),
        Kind::Slow => {
            let until = Instant::now() + Duration::from_millis(fastrand::u64(SLOW_RUN_MS));
            while Instant::now() < until {
                if let Some(reason) = ctx.cancel_reason() {
                    ledger.line(&format!("cancelled {id} {token} {reason:?}"));
                    return Err(JobError::retry(format!("cancelled: {reason:?}")));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let pid = std::process::id();
    let done = match engine {
        Engine::Postgres => complete_pg(ctx, id, &token, pid),
        Engine::Mysql => complete_my(ctx, id, &token, pid),
        Engine::Sqlite => ctx.complete_with(|tx: &tickler::rusqlite::Transaction| {
            tx.execute(
                "INSERT INTO torture_effects (job_id, run_token, pid) VALUES (?1, ?2, ?3)",
                rusqlite::params![id, token, pid],
            )?;
            Ok(())
        }),
    };
    match done {
        Ok(()) => {
            ledger.line(&format!("ok {id} {token}"));
            Ok(())
        }
        Err(e) if e.is_lease_lost() => {
            ledger.line(&format!("lost {id} {token}"));
            Err(JobError::retry(e))
        }
        Err(e) if connection_lost(&e) => {
            // Documented: complete_with on a server runs the application's
            // writes once, so a lost connection reaches the handler; the job's
            // next outcome (this failure, fenced) settles what committed.
            ledger.line(&format!("cut {id} {token} {}", describe(&e)));
            Err(JobError::retry(e))
        }
        Err(e) => {
            ledger.line(&format!("err complete_with {id} {token} {}", describe(&e)));
            Err(JobError::retry(e))
        }
    }
}

#[cfg(feature = "postgres")]
fn complete_pg(ctx: &JobContext, id: i64, token: &str, pid: u32) -> Result<(), Error> {
    ctx.complete_with(|tx: &mut tickler::postgres::Transaction| {
        tx.execute(
            "INSERT INTO torture_effects (job_id, run_token, pid) VALUES ($1, $2, $3)",
            &[&id, &token, &i64::from(pid)],
        )?;
        Ok(())
    })
}

#[cfg(not(feature = "postgres"))]
fn complete_pg(_: &JobContext, _: i64, _: &str, _: u32) -> Result<(), Error> {
    unreachable!("a PostgreSQL queue needs the postgres feature")
}

#[cfg(feature = "mysql")]
fn complete_my(ctx: &JobContext, id: i64, token: &str, pid: u32) -> Result<(), Error> {
    use tickler::mysql::prelude::Queryable;
    ctx.complete_with(|tx: &mut tickler::mysql::Transaction| {
        tx.exec_drop(
            "INSERT INTO torture_effects (job_id, run_token, pid) VALUES (?, ?, ?)",
            (id, token, pid),
        )?;
        Ok(())
    })
}

#[cfg(not(feature = "mysql"))]
fn complete_my(_: &JobContext, _: i64, _: &str, _: u32) -> Result<(), Error> {
    unreachable!("a MySQL queue needs the mysql feature")
}

/// The connection to the server was lost (cut, server restarting) or no
/// connection could be had: what cuts and restarts cause, and nothing else.
#[allow(clippy::match_single_binding)] // SQLite alone: no arm but the last
fn connection_lost(e: &Error) -> bool {
    match e {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        Error::Pool(_) => true,
        #[cfg(feature = "postgres")]
        Error::Postgres(e) => {
            e.is_closed()
                || match e.code() {
                    Some(code) => {
                        let code = code.code();
                        code.starts_with("08") || code.starts_with("57P")
                    }
                    None => e.as_db_error().is_none(),
                }
        }
        #[cfg(feature = "mysql")]
        Error::Mysql(e) => my::connection_lost(e),
        _ => false,
    }
}

fn describe(e: &Error) -> String {
    let busy = if e.is_busy() { "BUSY " } else { "" };
    #[cfg(feature = "postgres")]
    if let Error::Postgres(pe) = e {
        // Its Display says only "db error".
        if let Some(db) = pe.as_db_error() {
            return format!("{e}: {} ({})", db.message(), db.code().code());
        }
    }
    format!("{busy}{e}")
}

fn filler() -> String {
    let n = fastrand::usize(16..=256);
    std::iter::repeat_with(fastrand::alphanumeric)
        .take(n)
        .collect()
}

fn quick_job(tag: &str) -> NewJob {
    NewJob::new("quick")
        .priority(fastrand::i32(-2..=2))
        .payload(serde_json::json!({ "tag": tag, "filler": filler() }))
}

fn run_producer(dir: &Path, db: &Path) -> i32 {
    let pid = std::process::id();
    let ledger = Ledger::create(&dir.join(format!("ledger/producer-0-{pid}.log")));
    install_logger(&ledger);
    let queue = match Queue::open(db) {
        Ok(queue) => queue,
        Err(e) => {
            ledger.line(&format!("err open {e}"));
            return 3;
        }
    };
    ledger.line("ready");
    let mut next_slow = Instant::now();
    let mut ops = 0u64;
    while !dir.join(STOP_PRODUCER).exists() {
        ops += 1;
        if ops.is_multiple_of(32) {
            // Wait while the workers are behind.
            loop {
                match queue.ops().unfinished(&[DEFAULT_QUEUE], None) {
                    Ok(n) if n > BACKLOG_LIMIT && !dir.join(STOP_PRODUCER).exists() => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Ok(_) => break,
                    Err(e) => {
                        ledger.line(&format!("err unfinished {}", describe(&e)));
                        break;
                    }
                }
            }
        }
        let (what, result) = if Instant::now() >= next_slow {
            next_slow = Instant::now() + SLOW_EVERY;
            let job = NewJob::new("slow").payload(serde_json::json!({ "tag": "slow" }));
            ("slow", queue.enqueue(job).map(|id| vec![id]))
        } else {
            match fastrand::u32(0..100) {
                0..=54 => (
                    "single",
                    queue.enqueue(quick_job("single")).map(|id| vec![id]),
                ),
                55..=69 => {
                    let jobs = (0..fastrand::usize(2..=20))
                        .map(|_| quick_job("batch"))
                        .collect();
                    ("batch", queue.enqueue_batch(jobs))
                }
                70..=79 => {
                    let key = format!("key-{}", fastrand::u32(0..UNIQUE_KEYS));
                    let job = quick_job("unique").unique_key(key);
                    ("unique", queue.enqueue(job).map(|id| vec![id]))
                }
                80..=91 => {
                    let delay = Duration::from_millis(fastrand::u64(50..=3_000));
                    let job = quick_job("delayed").delay(delay);
                    ("delayed", queue.enqueue(job).map(|id| vec![id]))
                }
                _ => {
                    let job = NewJob::new("failing")
                        .max_attempts(fastrand::u32(1..=3))
                        .payload(serde_json::json!({ "tag": "failing" }));
                    ("failing", queue.enqueue(job).map(|id| vec![id]))
                }
            }
        };
        match result {
            Ok(ids) => {
                let ids: Vec<String> = ids.iter().map(|id| id.0.to_string()).collect();
                ledger.line(&format!("enq {what} {}", ids.join(" ")));
            }
            Err(e) => ledger.line(&format!("err enqueue {what} {}", describe(&e))),
        }
    }
    ledger.line("exit");
    0
}

// ------------------------------------------------------------- supervisor

/// The figures and violations of one run.
#[derive(Debug, Default)]
pub struct Report {
    pub engine: &'static str,
    /// On a server: its version, as it says.
    pub server_version: String,
    pub seconds: f64,
    pub workers: usize,
    pub threads: usize,
    pub acknowledged: usize,
    pub jobs_in_file: usize,
    pub lost: usize,
    pub by_state: BTreeMap<String, u64>,
    pub unfinished: u64,
    pub kills: usize,
    pub kills_hit_running: usize,
    pub executions: usize,
    pub duplicate_executions: usize,
    pub live_runs_not_counted: usize,
    pub kills_that_hit: usize,
    pub busy_logged: usize,
    pub claims: usize,
    pub accepted_outcomes: usize,
    pub user_errors: usize,
    pub busy_errors: usize,
    pub tickler_errors_logged: usize,
    pub tickler_warnings_logged: usize,
    pub max_wal_bytes: u64,
    pub wal_bound: u64,
    pub wal_samples: u64,
    pub integrity: String,
    pub drain_seconds: f64,
    /// On a server: times every connection to the database was cut, and
    /// how many connections that cut in all.
    pub cuts: usize,
    pub connections_cut: usize,
    /// On a server: restarts, and the longest one in seconds.
    pub restarts: usize,
    pub longest_restart: f64,
    /// On a server: restarts by someone else (other tests on the server).
    pub external_restarts: usize,
    /// `complete_with` calls on a server that failed on a lost connection.
    pub completions_cut: usize,
    /// Duplicate executions explained by a cut or restart under way.
    pub runs_hit_by_disruptions: usize,
    /// On a server at the end: `tickler_jobs`'s table (PostgreSQL's heap,
    /// InnoDB's clustered index) and secondary index bytes.
    pub table_bytes: i64,
    pub index_bytes: i64,
    /// MySQL at the end: free bytes in `tickler_jobs`'s tablespace and
    /// InnoDB's estimate of its rows (after `ANALYZE TABLE`).
    pub my_free_bytes: i64,
    pub my_rows_estimate: i64,
    /// PostgreSQL at the end: live and dead tuples, autovacuum runs (from
    /// `pg_stat_user_tables`).
    pub pg_live_tuples: i64,
    pub pg_dead_tuples: i64,
    pub pg_autovacuums: i64,
    /// Jobs that used more than one attempt.
    pub jobs_with_retries: usize,
    /// Jobs, and runs, given back uncounted (claimed, never started).
    pub jobs_given_back: usize,
    pub runs_given_back: usize,
    /// Jobs that used more attempts than they had runs that started.
    pub attempts_without_a_start: usize,
    pub violations: Vec<String>,
}

impl Report {
    /// True when nothing was violated.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = self.engine != "SQLite";
        let version = if self.server_version.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.server_version)
        };
        writeln!(
            f,
            "torture on {}{version}: {:.0} s of kills, {} worker processes x {} threads, 1 producer",
            self.engine, self.seconds, self.workers, self.threads
        )?;
        writeln!(
            f,
            "  enqueues acknowledged:      {} jobs ({} rows in the database)",
            self.acknowledged, self.jobs_in_file
        )?;
        writeln!(f, "  lost:                       {}", self.lost)?;
        writeln!(
            f,
            "  final states:               {:?} (unfinished {})",
            self.by_state, self.unfinished
        )?;
        writeln!(
            f,
            "  kills (SIGKILL):            {} ({} hit running handlers, interrupting {} runs)",
            self.kills, self.kills_that_hit, self.kills_hit_running
        )?;
        if server {
            writeln!(
                f,
                "  connection cuts:            {} ({} connections terminated)",
                self.cuts, self.connections_cut
            )?;
            writeln!(
                f,
                "  server restarts:            {} (longest {:.1} s), {} more by someone else",
                self.restarts, self.longest_restart, self.external_restarts
            )?;
        }
        writeln!(
            f,
            "  claims / handler runs:      {} / {}",
            self.claims, self.executions
        )?;
        writeln!(
            f,
            "  accepted outcomes:          {} (no run_token twice, no job succeeded twice)",
            self.accepted_outcomes
        )?;
        writeln!(
            f,
            "  duplicate executions:       {} ({} runs interrupted by kills, {} by cuts or restarts; {} runs of live workers unexplained)",
            self.duplicate_executions,
            self.kills_hit_running,
            self.runs_hit_by_disruptions,
            self.live_runs_not_counted
        )?;
        writeln!(
            f,
            "  attempts:                   {} jobs used more than one; {} runs of {} jobs given back uncounted (claimed, never started); {} jobs used an attempt no run of theirs started",
            self.jobs_with_retries,
            self.runs_given_back,
            self.jobs_given_back,
            self.attempts_without_a_start
        )?;
        writeln!(
            f,
            "  errors reaching user code:  {} (Busy: {})",
            self.user_errors, self.busy_errors
        )?;
        if server {
            writeln!(
                f,
                "  completions cut:            {} (complete_with on a connection lost during a cut or restart)",
                self.completions_cut
            )?;
            writeln!(
                f,
                "  tickler log lines:          {} errors, {} warnings (retried inside tickler's window)",
                self.tickler_errors_logged, self.tickler_warnings_logged
            )?;
            if self.engine == "MySQL" {
                writeln!(
                    f,
                    "  tickler_jobs at the end:    data {:.1} MiB, indexes {:.1} MiB, {:.1} MiB free, about {} rows",
                    self.table_bytes as f64 / 1_048_576.0,
                    self.index_bytes as f64 / 1_048_576.0,
                    self.my_free_bytes as f64 / 1_048_576.0,
                    self.my_rows_estimate
                )?;
            } else {
                writeln!(
                    f,
                    "  tickler_jobs at the end:    heap {:.1} MiB, indexes {:.1} MiB, {} live / {} dead tuples, {} autovacuums",
                    self.table_bytes as f64 / 1_048_576.0,
                    self.index_bytes as f64 / 1_048_576.0,
                    self.pg_live_tuples,
                    self.pg_dead_tuples,
                    self.pg_autovacuums
                )?;
            }
        } else {
            writeln!(
                f,
                "  tickler log lines:          {} errors, {} warnings ({} about a locked database, retried inside tickler)",
                self.tickler_errors_logged, self.tickler_warnings_logged, self.busy_logged
            )?;
            writeln!(
                f,
                "  max WAL size:               {} bytes ({:.1} MiB; bound {} MiB, journal_size_limit {} MiB; {} samples)",
                self.max_wal_bytes,
                self.max_wal_bytes as f64 / 1_048_576.0,
                self.wal_bound / 1_048_576,
                JOURNAL_SIZE_LIMIT / 1_048_576,
                self.wal_samples
            )?;
        }
        writeln!(
            f,
            "  drain at the end:           {:.1} s",
            self.drain_seconds
        )?;
        if self.engine == "MySQL" {
            writeln!(f, "  CHECK TABLE … EXTENDED:     {}", self.integrity)?;
        } else if server {
            writeln!(f, "  amcheck (B-tree indexes):   {}", self.integrity)?;
        } else {
            writeln!(f, "  PRAGMA integrity_check:     {}", self.integrity)?;
        }
        if self.violations.is_empty() {
            write!(f, "RESULT: PASS")
        } else {
            writeln!(f, "VIOLATIONS:")?;
            for v in &self.violations {
                writeln!(f, "  - {v}")?;
            }
            write!(f, "RESULT: FAIL")
        }
    }
}

struct Proc {
    role: &'static str,
    slot: usize,
    child: Child,
}

struct Spawner<'a> {
    settings: &'a Settings,
    launcher: Launcher,
    started: usize,
}

impl Spawner<'_> {
    fn spawn(&mut self, role: &'static str, slot: usize) -> Proc {
        self.started += 1;
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        if let Launcher::TestBinary { test } = self.launcher {
            cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
        }
        let out_path = self
            .settings
            .dir
            .join(format!("out/{role}-{slot}-{}.txt", self.started));
        let out = File::create(&out_path).expect("child output file");
        let err = out.try_clone().expect("child output file");
        let child = cmd
            .env(ENV_ROLE, role)
            .env(ENV_DIR, &self.settings.dir)
            .env(ENV_DB, self.settings.location())
            .env(ENV_SLOT, slot.to_string())
            .env(ENV_THREADS, self.settings.threads.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawning a torture child");
        Proc { role, slot, child }
    }
}

/// Waits for `proc` to exit, at most `timeout`; kills it after that.
/// Returns its exit status, `None` if it had to be killed.
fn wait_exit(proc: &mut Proc, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = proc.child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Audit tables and triggers, created before any child starts. The triggers
/// run inside tickler's own transactions, so `torture_audit` holds exactly
/// the claims and the transitions out of `running` that committed.
const AUDIT_SQL: &str = "
CREATE TABLE IF NOT EXISTS torture_effects (
    job_id INTEGER NOT NULL, run_token TEXT NOT NULL, pid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS torture_audit (
    event TEXT NOT NULL, job_id INTEGER NOT NULL, run_token TEXT,
    old_attempts INTEGER NOT NULL, new_attempts INTEGER NOT NULL,
    new_status TEXT NOT NULL, old_error TEXT, new_error TEXT);
CREATE TRIGGER IF NOT EXISTS torture_claim AFTER UPDATE OF status ON tickler_jobs
    WHEN NEW.status = 'running' AND OLD.status <> 'running'
BEGIN
    INSERT INTO torture_audit VALUES ('claim', NEW.id, NEW.run_token,
        OLD.attempts, NEW.attempts, NEW.status, OLD.last_error, NEW.last_error);
END;
CREATE TRIGGER IF NOT EXISTS torture_end AFTER UPDATE OF status ON tickler_jobs
    WHEN OLD.status = 'running' AND NEW.status <> 'running'
BEGIN
    INSERT INTO torture_audit VALUES ('end', OLD.id, OLD.run_token,
        OLD.attempts, NEW.attempts, NEW.status, OLD.last_error, NEW.last_error);
END;
";

/// A short run from a test: runs the torture with the test binary's
/// `role` test as its processes, prints the report, and fails the test
/// (keeping the ledgers and child output in `dir` for a look) unless it
/// passed with kills and work done; a run on a server must also have cut
/// connections. The caller checks what only it knows (a restart).
pub fn short_run(settings: &Settings, dir: tempfile::TempDir, role: &'static str) -> Report {
    let report = supervise(settings, Launcher::TestBinary { test: role });
    println!("{report}");
    if !report.passed() {
        let kept = dir.keep();
        panic!(
            "torture run failed; its files are in {}\n{report}",
            kept.display()
        );
    }
    assert!(report.kills > 0, "no worker was killed: {report}");
    assert!(report.acknowledged > 100, "too little work: {report}");
    if settings.db_url.is_some() {
        assert!(report.cuts > 0, "no connection was cut: {report}");
    }
    report
}

/// Runs the whole torture and checks it. Panics only on a broken harness
/// (cannot create files, spawn processes); everything about tickler is in
/// the returned report.
pub fn supervise(settings: &Settings, launcher: Launcher) -> Report {
    let mut report = Report {
        workers: settings.workers,
        threads: settings.threads,
        wal_bound: settings.wal_bound,
        ..Report::default()
    };
    for sub in ["ledger", "out"] {
        std::fs::create_dir_all(settings.dir.join(sub)).expect("creating the run folder");
    }
    report.engine = settings.engine().name();
    let db = settings.location();
    // Opening the queue migrates its schema, which the audit's triggers
    // need.
    let queue = Queue::open(&db).expect("supervisor: open the queue");
    match (&settings.db_url, settings.engine()) {
        (None, _) => queue
            .open_connection()
            .and_then(|c| Ok(c.execute_batch(AUDIT_SQL)?))
            .expect("supervisor: create the audit tables"),
        (Some(url), Engine::Mysql) => my::create_audit(url),
        (Some(url), _) => pg::create_audit(url),
    }

    // The WAL sampler (SQLite: a server's WAL is the server's business).
    let sampling = Arc::new(AtomicBool::new(!settings.is_server()));
    let max_wal = Arc::new(AtomicU64::new(0));
    let samples = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (sampling, max_wal, samples) = (sampling.clone(), max_wal.clone(), samples.clone());
        let wal = PathBuf::from(format!("{}-wal", db.display()));
        std::thread::spawn(move || {
            while sampling.load(Ordering::SeqCst) {
                let len = std::fs::metadata(&wal).map_or(0, |m| m.len());
                max_wal.fetch_max(len, Ordering::SeqCst);
                samples.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // On a server: connection cuts and restarts while the kills go on.
    let disrupting = Arc::new(AtomicBool::new(true));
    let disruptor = settings.db_url.clone().map(|url| {
        let settings = settings.clone();
        let disrupting = disrupting.clone();
        let ledger = Ledger::create(
            &settings
                .dir
                .join(format!("ledger/supervisor-0-{}.log", std::process::id())),
        );
        std::thread::spawn(move || {
            let mut server = match settings.engine() {
                Engine::Mysql => my::server(&url),
                _ => pg::server(&url),
            };
            disrupt(&settings, &mut *server, &ledger, &disrupting)
        })
    });

    let mut spawner = Spawner {
        settings,
        launcher,
        started: 0,
    };
    let mut workers: Vec<Proc> = (0..settings.workers)
        .map(|slot| spawner.spawn("worker", slot))
        .collect();
    let mut producer = spawner.spawn("producer", 0);
    let mut killed_pids: HashSet<u32> = HashSet::new();

    let started = Instant::now();
    let end = started + settings.duration;
    let (min_gap, max_gap) = settings.kill_every;
    let next_gap = || {
        let span = u64::try_from((max_gap - min_gap).as_millis()).unwrap_or(0);
        min_gap + Duration::from_millis(fastrand::u64(0..=span))
    };
    let mut next_kill = Instant::now() + next_gap();
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        for proc in workers.iter_mut().chain(std::iter::once(&mut producer)) {
            if let Some(status) = proc.child.try_wait().expect("try_wait") {
                report.violations.push(format!(
                    "{} {} (pid {}) exited on its own with {status}; see {}",
                    proc.role,
                    proc.slot,
                    proc.child.id(),
                    settings.dir.join("out").display()
                ));
                *proc = spawner.spawn(proc.role, proc.slot);
            }
        }
        if Instant::now() >= next_kill {
            let slot = fastrand::usize(0..workers.len());
            let proc = &mut workers[slot];
            killed_pids.insert(proc.child.id());
            proc.child.kill().expect("SIGKILL a worker");
            proc.child.wait().expect("reaping a killed worker");
            report.kills += 1;
            *proc = spawner.spawn("worker", slot);
            next_kill = Instant::now() + next_gap();
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    disrupting.store(false, Ordering::SeqCst);
    if let Some(disruptor) = disruptor {
        let done = disruptor.join().expect("the disruptor thread panicked");
        report.cuts = done.cuts;
        report.connections_cut = done.connections_cut;
        report.restarts = done.restarts;
        report.longest_restart = done.longest_restart;
        report.external_restarts = done.external_restarts;
        if let Some(e) = done.failure {
            report.violations.push(e);
        }
    }

    // Stop the producer, let the workers drain the queue, stop them.
    File::create(settings.dir.join(STOP_PRODUCER)).expect("stop file");
    match wait_exit(&mut producer, Duration::from_secs(60)) {
        Some(status) if status.success() => {}
        other => report
            .violations
            .push(format!("producer did not stop cleanly: {other:?}")),
    }
    let drain_started = Instant::now();
    loop {
        match queue.ops().unfinished(&[DEFAULT_QUEUE], None) {
            Ok(0) => break,
            Ok(n) if drain_started.elapsed() >= settings.drain_timeout => {
                report.violations.push(format!(
                    "{n} job(s) still unfinished {:?} after the producer stopped",
                    settings.drain_timeout
                ));
                break;
            }
            Ok(_) => {}
            Err(e) => report
                .violations
                .push(format!("supervisor: counting unfinished jobs: {e}")),
        }
        for proc in workers.iter_mut() {
            if let Some(status) = proc.child.try_wait().expect("try_wait") {
                report.violations.push(format!(
                    "worker {} (pid {}) exited on its own during the drain with {status}",
                    proc.slot,
                    proc.child.id()
                ));
                *proc = spawner.spawn("worker", proc.slot);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    report.drain_seconds = drain_started.elapsed().as_secs_f64();
    File::create(settings.dir.join(STOP_WORKERS)).expect("stop file");
    for proc in workers.iter_mut() {
        match wait_exit(proc, Duration::from_secs(60)) {
            Some(status) if status.success() => {}
            other => report.violations.push(format!(
                "worker {} (pid {}) did not stop cleanly: {other:?}",
                proc.slot,
                proc.child.id()
            )),
        }
    }
    match queue.manual().reap() {
        Ok(0) => {}
        Ok(n) => report
            .violations
            .push(format!("the last reaper pass still took back {n} job(s)")),
        Err(e) => report
            .violations
            .push(format!("the last reaper pass failed: {e}")),
    }
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.join();
    report.max_wal_bytes = max_wal.load(Ordering::SeqCst);
    report.wal_samples = samples.load(Ordering::SeqCst);

    check(settings, &queue, &killed_pids, &mut report);
    report
}

/// One line of a ledger, split into words.
struct Line {
    pid: u32,
    /// When it was written (wall clock, ms).
    at_ms: i64,
    words: Vec<String>,
}

fn read_ledgers(dir: &Path, report: &mut Report) -> Vec<Line> {
    let mut lines = Vec::new();
    let entries = std::fs::read_dir(dir.join("ledger")).expect("reading the ledger folder");
    for entry in entries {
        let path = entry.expect("ledger entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let pid: u32 = name
            .rsplit('-')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("ledger name {name:?} has no pid"));
        let text = std::fs::read_to_string(&path).expect("reading a ledger");
        if !text.is_empty() && !text.ends_with('\n') {
            report
                .violations
                .push(format!("torn last line in ledger {}", path.display()));
        }
        for line in text.lines() {
            let mut words = line.split_whitespace().map(str::to_owned);
            let at_ms = words
                .next()
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("ledger line {line:?} has no time"));
            lines.push(Line {
                pid,
                at_ms,
                words: words.collect(),
            });
        }
    }
    lines
}

/// A transition out of `running`, as the audit trigger saw it.
struct End {
    job_id: i64,
    status: String,
    how: EndedBy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndedBy {
    /// An outcome its holder reported (complete, fail).
    Outcome,
    /// The reaper took the job back (lease expired).
    Reaper,
    /// Handed back unstarted (release, attempt given back).
    Release,
}

/// One row of `torture_audit`.
struct AuditRow {
    event: String,
    job_id: i64,
    run_token: String,
    old_attempts: i64,
    new_attempts: i64,
    new_status: String,
    old_error: Option<String>,
    new_error: Option<String>,
}

/// The checks' view of the database: the same questions on either engine.
enum Probe {
    Sqlite(rusqlite::Connection),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Client),
    #[cfg(feature = "mysql")]
    Mysql(mysql::Conn),
}

impl Probe {
    fn open(settings: &Settings, queue: &Queue) -> Probe {
        match (&settings.db_url, settings.engine()) {
            (None, _) => Probe::Sqlite(queue.open_connection().expect("supervisor: connection")),
            (Some(url), Engine::Mysql) => my::probe(url),
            (Some(url), _) => pg::probe(url),
        }
    }

    /// The server's version (empty on SQLite).
    fn version(&mut self) -> String {
        match self {
            Probe::Sqlite(_) => String::new(),
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => c
                .query_one(
                    "SELECT 'PostgreSQL ' || current_setting('server_version')",
                    &[],
                )
                .map(|r| r.get(0))
                .unwrap_or_default(),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::version(c),
        }
    }

    fn ids(&mut self) -> HashSet<i64> {
        let sql = "SELECT id FROM tickler_jobs";
        match self {
            Probe::Sqlite(c) => {
                let mut stmt = c.prepare(sql).unwrap();
                let rows = stmt.query_map([], |r| r.get(0)).unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            }
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => c
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect(),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::query::<i64>(c, sql).into_iter().collect(),
        }
    }

    /// A query answering one number.
    fn count(&mut self, sql: &str) -> i64 {
        match self {
            Probe::Sqlite(c) => c.query_row(sql, [], |r| r.get(0)).unwrap(),
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => c.query_one(sql, &[]).unwrap().get(0),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::query::<i64>(c, sql)[0],
        }
    }

    /// Per job: its attempts, and its runs given back uncounted.
    fn attempts(&mut self) -> HashMap<i64, (i64, i64)> {
        let sql = "SELECT id, attempts, given_back FROM tickler_jobs";
        match self {
            Probe::Sqlite(c) => {
                let mut stmt = c.prepare(sql).unwrap();
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
                    .unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            }
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => c
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), (r.get(1), r.get(2))))
                .collect(),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::query::<(i64, i64, i64)>(c, sql)
                .into_iter()
                .map(|(id, attempts, given_back)| (id, (attempts, given_back)))
                .collect(),
        }
    }

    fn by_state(&mut self) -> BTreeMap<String, u64> {
        let sql = "SELECT status, count(*) FROM tickler_jobs GROUP BY status";
        match self {
            Probe::Sqlite(c) => {
                let mut stmt = c.prepare(sql).unwrap();
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
                    .unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            }
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => c
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
                .collect(),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::query::<(String, u64)>(c, sql).into_iter().collect(),
        }
    }

    fn audit(&mut self) -> Vec<AuditRow> {
        let columns = "event, job_id, run_token, old_attempts, new_attempts, new_status, \
                       old_error, new_error";
        match self {
            Probe::Sqlite(c) => {
                let sql = format!("SELECT {columns} FROM torture_audit ORDER BY rowid");
                let mut stmt = c.prepare(&sql).unwrap();
                let rows = stmt
                    .query_map([], |r| {
                        Ok(AuditRow {
                            event: r.get(0)?,
                            job_id: r.get(1)?,
                            run_token: r.get(2)?,
                            old_attempts: r.get(3)?,
                            new_attempts: r.get(4)?,
                            new_status: r.get(5)?,
                            old_error: r.get(6)?,
                            new_error: r.get(7)?,
                        })
                    })
                    .unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            }
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => {
                let sql = format!("SELECT {columns} FROM torture_audit ORDER BY seq");
                c.query(&sql, &[])
                    .unwrap()
                    .iter()
                    .map(|r| AuditRow {
                        event: r.get(0),
                        job_id: r.get(1),
                        run_token: r.get(2),
                        old_attempts: r.get(3),
                        new_attempts: r.get(4),
                        new_status: r.get(5),
                        old_error: r.get(6),
                        new_error: r.get(7),
                    })
                    .collect()
            }
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => {
                let sql = format!("SELECT {columns} FROM torture_audit ORDER BY seq");
                type Row = (
                    String,
                    i64,
                    String,
                    i64,
                    i64,
                    String,
                    Option<String>,
                    Option<String>,
                );
                my::query::<Row>(c, &sql)
                    .into_iter()
                    .map(|r| AuditRow {
                        event: r.0,
                        job_id: r.1,
                        run_token: r.2,
                        old_attempts: r.3,
                        new_attempts: r.4,
                        new_status: r.5,
                        old_error: r.6,
                        new_error: r.7,
                    })
                    .collect()
            }
        }
    }

    fn effects(&mut self) -> Vec<(i64, String)> {
        let sql = "SELECT job_id, run_token FROM torture_effects";
        match self {
            Probe::Sqlite(c) => {
                let mut stmt = c.prepare(sql).unwrap();
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
                    .unwrap();
                rows.collect::<rusqlite::Result<_>>().unwrap()
            }
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => c
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect(),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::query::<(i64, String)>(c, sql),
        }
    }

    /// The engine's own consistency check: `PRAGMA integrity_check` on
    /// SQLite, `amcheck` on PostgreSQL, `CHECK TABLE … EXTENDED` on MySQL.
    /// `Err` is a violation.
    fn integrity(&mut self) -> Result<String, String> {
        match self {
            Probe::Sqlite(c) => {
                let answer = c
                    .query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
                    .unwrap_or_else(|e| format!("integrity_check failed: {e}"));
                if answer == "ok" {
                    Ok(answer)
                } else {
                    Err(format!("PRAGMA integrity_check: {answer}"))
                }
            }
            #[cfg(feature = "postgres")]
            Probe::Postgres(c) => pg::amcheck(c),
            #[cfg(feature = "mysql")]
            Probe::Mysql(c) => my::check_tables(c),
        }
    }
}

/// A cut or restart, from its start to its end plus what it can still
/// cost after the server is back: a lease that ran out while heartbeats
/// could not reach the server is taken back by the next reaper pass.
struct Disruption {
    from_ms: i64,
    until_ms: i64,
}

/// How long after a cut or restart its effects may show.
const DISRUPTION_TAIL_MS: i64 = 2 * LEASE.as_millis() as i64;

fn check(settings: &Settings, queue: &Queue, killed: &HashSet<u32>, report: &mut Report) {
    let mut db = Probe::open(settings, queue);
    report.server_version = db.version();
    let lines = read_ledgers(&settings.dir, report);

    // Lost: every acknowledged id is in the database.
    let in_file = db.ids();
    let acknowledged: HashSet<i64> = lines
        .iter()
        .filter(|l| l.words.first().map(String::as_str) == Some("enq"))
        .flat_map(|l| l.words[2..].iter().map(|id| id.parse::<i64>().unwrap()))
        .collect();
    report.acknowledged = acknowledged.len();
    report.jobs_in_file = in_file.len();
    let lost: Vec<&i64> = acknowledged.difference(&in_file).collect();
    report.lost = lost.len();
    if !lost.is_empty() {
        let sample: Vec<_> = lost.iter().take(10).collect();
        report.violations.push(format!(
            "{} acknowledged job(s) are not in the database, e.g. {sample:?}",
            lost.len()
        ));
    }

    // Nor a job more: a row no enqueue returned is an enqueue that took
    // effect twice (retried after a COMMIT whose reply was lost).
    let unasked: Vec<&i64> = in_file.difference(&acknowledged).collect();
    if !unasked.is_empty() {
        let sample: Vec<_> = unasked.iter().take(10).collect();
        report.violations.push(format!(
            "{} job(s) in the database were not returned by any enqueue, e.g. {sample:?}",
            unasked.len()
        ));
    }

    // Every job terminal; attempts within max_attempts; failing jobs dead.
    report.by_state = db.by_state();
    report.unfinished = ["scheduled", "pending", "running"]
        .iter()
        .map(|s| report.by_state.get(*s).copied().unwrap_or(0))
        .sum();
    if report.unfinished > 0 {
        report.violations.push(format!(
            "{} job(s) are not terminal: {:?}",
            report.unfinished, report.by_state
        ));
    }
    let over = db.count("SELECT count(*) FROM tickler_jobs WHERE attempts > max_attempts");
    if over > 0 {
        report.violations.push(format!(
            "{over} job(s) have more attempts than max_attempts"
        ));
    }
    let wrong_failing =
        db.count("SELECT count(*) FROM tickler_jobs WHERE kind = 'failing' AND status <> 'dead'");
    if wrong_failing > 0 {
        report.violations.push(format!(
            "{wrong_failing} always-failing job(s) did not end dead"
        ));
    }

    // The audit: claims and accepted outcomes, per run_token.
    let mut claims: HashMap<String, i64> = HashMap::new();
    let mut ends: HashMap<String, Vec<End>> = HashMap::new();
    for row in db.audit() {
        let token = row.run_token;
        if row.event == "claim" {
            if claims.insert(token.clone(), row.job_id).is_some() {
                report
                    .violations
                    .push(format!("run_token {token} was handed out by two claims"));
            }
            continue;
        }
        let how = if row.new_attempts < row.old_attempts {
            EndedBy::Release
        } else if row.new_status != "succeeded"
            && row.new_error != row.old_error
            && row
                .new_error
                .as_deref()
                .is_some_and(|e| e.starts_with("lease expired") || e.starts_with("worker gone"))
        {
            EndedBy::Reaper
        } else {
            EndedBy::Outcome
        };
        ends.entry(token).or_default().push(End {
            job_id: row.job_id,
            status: row.new_status,
            how,
        });
    }
    report.claims = claims.len();
    report.accepted_outcomes = ends
        .values()
        .flatten()
        .filter(|e| e.how == EndedBy::Outcome)
        .count();
    for (token, list) in &ends {
        if list.len() > 1 {
            report.violations.push(format!(
                "run_token {token} (job {}) left `running` {} times: {:?}",
                list[0].job_id,
                list.len(),
                list.iter().map(|e| &e.status).collect::<Vec<_>>()
            ));
        }
        if !claims.contains_key(token) {
            report
                .violations
                .push(format!("run_token {token} ended without a claim"));
        }
    }
    let mut succeeded_per_job: HashMap<i64, Vec<&str>> = HashMap::new();
    for (token, list) in &ends {
        for end in list.iter().filter(|e| e.status == "succeeded") {
            succeeded_per_job
                .entry(end.job_id)
                .or_default()
                .push(token.as_str());
        }
    }
    for (job, tokens) in &succeeded_per_job {
        if tokens.len() > 1 {
            report.violations.push(format!(
                "job {job} was accepted as succeeded {} times ({tokens:?})",
                tokens.len()
            ));
        }
    }

    // Effects: one per succeeded job, written by the run that succeeded.
    let mut effects_per_job: HashMap<i64, Vec<String>> = HashMap::new();
    for (job, token) in db.effects() {
        effects_per_job.entry(job).or_default().push(token);
    }
    let effect_tokens: HashSet<&str> = effects_per_job
        .values()
        .flatten()
        .map(String::as_str)
        .collect();
    for (job, tokens) in &effects_per_job {
        if tokens.len() > 1 {
            report.violations.push(format!(
                "job {job} has {} committed effects ({tokens:?})",
                tokens.len()
            ));
        }
        let succeeded = succeeded_per_job.get(job).map(Vec::as_slice);
        if succeeded != Some(&[tokens[0].as_str()][..]) {
            report.violations.push(format!(
                "job {job}: effect by run {} but succeeded by {succeeded:?}",
                tokens[0]
            ));
        }
    }
    let succeeded_rows = db.count("SELECT count(*) FROM tickler_jobs WHERE status = 'succeeded'");
    if succeeded_rows as usize != effects_per_job.len() {
        report.violations.push(format!(
            "{succeeded_rows} succeeded job(s) but {} with an effect",
            effects_per_job.len()
        ));
    }

    // The cuts and restarts, as the supervisor recorded them.
    let disruptions: Vec<Disruption> = lines
        .iter()
        .filter(|l| l.words.first().map(String::as_str) == Some("disrupt"))
        .map(|l| Disruption {
            from_ms: l.words[2].parse().unwrap(),
            until_ms: l.words[3].parse::<i64>().unwrap() + DISRUPTION_TAIL_MS,
        })
        .collect();
    let disrupted = |from_ms: i64, until_ms: i64| {
        disruptions
            .iter()
            .any(|d| from_ms <= d.until_ms && until_ms >= d.from_ms)
    };

    // Ledgers against the database.
    let mut started_by: HashMap<&str, u32> = HashMap::new();
    // Per run_token: its first and last ledger line's time.
    let mut run_span: HashMap<&str, (i64, i64)> = HashMap::new();
    let mut cut_tokens: HashSet<&str> = HashSet::new();
    for line in &lines {
        let w = &line.words;
        let tag = w.first().map(String::as_str).unwrap_or("");
        if matches!(
            tag,
            "start" | "ok" | "lost" | "cut" | "err" | "fail" | "cancelled"
        ) {
            if let Some(token) = w.get(2).filter(|_| tag != "err") {
                let span = run_span
                    .entry(token.as_str())
                    .or_insert((line.at_ms, line.at_ms));
                span.0 = span.0.min(line.at_ms);
                span.1 = span.1.max(line.at_ms);
            }
        }
        match tag {
            "start" => {
                report.executions += 1;
                let token = w[2].as_str();
                if let Some(other) = started_by.insert(token, line.pid) {
                    report.violations.push(format!(
                        "run_token {token} was started twice (pids {other} and {})",
                        line.pid
                    ));
                }
                if !claims.contains_key(token) {
                    report
                        .violations
                        .push(format!("run_token {token} was started but never claimed"));
                }
            }
            "ok" if !effect_tokens.contains(w[2].as_str()) => {
                report.violations.push(format!(
                    "pid {} was told job {} completed (run {}) but no effect is in the database",
                    line.pid, w[1], w[2]
                ));
            }
            "lost" if effect_tokens.contains(w[2].as_str()) => {
                report.violations.push(format!(
                    "pid {} got LeaseLost for job {} (run {}) but its effect committed",
                    line.pid, w[1], w[2]
                ));
            }
            "cut" => {
                report.completions_cut += 1;
                cut_tokens.insert(w[2].as_str());
                if !disrupted(line.at_ms, line.at_ms) {
                    report.user_errors += 1;
                    report.violations.push(format!(
                        "a connection was lost with no cut or restart under way, in pid {}: {}",
                        line.pid,
                        w.join(" ")
                    ));
                }
            }
            "err" => {
                report.user_errors += 1;
                let text = w.join(" ");
                if text.contains("BUSY") {
                    report.busy_errors += 1;
                }
                report.violations.push(format!(
                    "error reached user code in pid {}: {text}",
                    line.pid
                ));
            }
            "log" => {
                let text = w.join(" ");
                let error = w.get(1).map(String::as_str) == Some("ERROR");
                if error {
                    report.tickler_errors_logged += 1;
                    // On a server: tickler logs an error only once its retry
                    // window is over, which no cut or restart should reach.
                    if settings.is_server() {
                        report
                            .violations
                            .push(format!("tickler gave up in pid {}: {text}", line.pid));
                    }
                } else {
                    report.tickler_warnings_logged += 1;
                }
                let lower = text.to_lowercase();
                if lower.contains("locked") || lower.contains("busy") {
                    report.busy_logged += 1;
                    if error {
                        report.busy_errors += 1;
                        report.violations.push(format!(
                            "tickler gave up on a locked database in pid {}: {text}",
                            line.pid
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    // Accepted failures each come from a run that said it failed.
    for (token, list) in &ends {
        for end in list {
            if end.how == EndedBy::Outcome
                && end.status != "succeeded"
                && !started_by.contains_key(token.as_str())
            {
                report.violations.push(format!(
                    "job {} left running as {} by run {token}, which no handler started",
                    end.job_id, end.status
                ));
            }
        }
    }

    // Duplicate executions: handler runs whose result did not count (no
    // outcome accepted, so the job was taken back and ran again or went
    // dead; or a completion cut off from the server that did not commit),
    // against what may cost a run: a kill of its process, or a cut or
    // restart while it ran. A live worker on a healthy server never loses
    // a run.
    let mut interrupted_pids: HashSet<u32> = HashSet::new();
    for (token, pid) in &started_by {
        let accepted = ends
            .get(*token)
            .is_some_and(|list| list.iter().any(|e| e.how == EndedBy::Outcome));
        let cut_off = cut_tokens.contains(token) && !effect_tokens.contains(token);
        if accepted && !cut_off {
            continue;
        }
        report.duplicate_executions += 1;
        let (from_ms, until_ms) = run_span[token];
        // A cut completion's cause is known (its time was checked against
        // the cuts above), whatever later happened to its process.
        if cut_off {
            report.runs_hit_by_disruptions += 1;
        } else if killed.contains(pid) {
            report.kills_hit_running += 1;
            interrupted_pids.insert(*pid);
        } else if disrupted(from_ms, until_ms) {
            report.runs_hit_by_disruptions += 1;
        } else {
            report.live_runs_not_counted += 1;
        }
    }
    report.kills_that_hit = interrupted_pids.len();
    if report.live_runs_not_counted > 0 {
        report.violations.push(format!(
            "{} duplicate executions but only {} runs were interrupted by kills and {} by \
             cuts or restarts ({} runs of live workers did not count)",
            report.duplicate_executions,
            report.kills_hit_running,
            report.runs_hit_by_disruptions,
            report.live_runs_not_counted
        ));
    }

    // An attempt counts when its handler starts: no job used more
    // attempts than it had runs that started (a handler's `start` line),
    // however often its claims were cut short by kills before a start.
    let mut started_runs: HashMap<i64, i64> = HashMap::new();
    for token in started_by.keys() {
        if let Some(job) = claims.get(*token) {
            *started_runs.entry(*job).or_default() += 1;
        }
    }
    for (job, (attempts, given_back)) in db.attempts() {
        let started = started_runs.get(&job).copied().unwrap_or(0);
        if attempts > 1 {
            report.jobs_with_retries += 1;
        }
        if given_back > 0 {
            report.jobs_given_back += 1;
            report.runs_given_back += given_back as usize;
        }
        if attempts > started {
            report.attempts_without_a_start += 1;
            if report.attempts_without_a_start <= 10 {
                report.violations.push(format!(
                    "job {job} used {attempts} attempt(s) but only {started} of its runs started"
                ));
            }
        }
    }

    if !settings.is_server() && report.max_wal_bytes >= report.wal_bound {
        report.violations.push(format!(
            "the WAL reached {} bytes (bound {})",
            report.max_wal_bytes, report.wal_bound
        ));
    }
    #[cfg(feature = "postgres")]
    if let Probe::Postgres(client) = &mut db {
        pg::sizes(client, report);
    }
    #[cfg(feature = "mysql")]
    if let Probe::Mysql(conn) = &mut db {
        my::sizes(conn, report);
    }
    match db.integrity() {
        Ok(answer) => report.integrity = answer,
        Err(e) => {
            report.integrity = e.clone();
            report.violations.push(e);
        }
    }
}

/// What the disruptor did.
#[derive(Debug, Default)]
struct Disrupted {
    cuts: usize,
    connections_cut: usize,
    restarts: usize,
    longest_restart: f64,
    /// Restarts of the server by someone else, seen during the run.
    external_restarts: usize,
    /// The harness could not cut or restart (not a finding about tickler,
    /// but the run did not test what it says).
    failure: Option<String>,
}

/// A database server as the disruptor sees it: PostgreSQL or MySQL.
trait Server {
    /// Whether the server restarted since the last look (by its start time
    /// or its uptime), reconnecting if need be; `None` if it cannot be
    /// asked now.
    fn restarted(&mut self) -> Option<bool>;
    /// After a restart by the harness, once the server accepts connections
    /// again: connects again and takes the new server as the one to watch.
    fn restarted_by_us(&mut self);
    /// Cuts every client connection to the database but the one cutting;
    /// returns how many.
    fn cut(&mut self) -> Result<usize, String>;
}

/// Until `going` turns false: every `cut_every` cuts every client
/// connection to the database; restarts the server `restarts` times,
/// spread evenly over the run. Each is a `disrupt` line in `ledger` with
/// its start and end (ms).
fn disrupt(
    settings: &Settings,
    server: &mut dyn Server,
    ledger: &Ledger,
    going: &AtomicBool,
) -> Disrupted {
    let mut done = Disrupted::default();
    let started = Instant::now();
    let restarts = if settings.server_ctl.is_some() {
        settings.restarts
    } else {
        0
    };
    let mut restart_at: Vec<Instant> = (1..=restarts)
        .rev()
        .map(|i| started + settings.duration.mul_f64(i as f64 / (restarts + 1) as f64))
        .collect();
    let (min_gap, max_gap) = settings.cut_every;
    let next_gap = || {
        let span = u64::try_from((max_gap - min_gap).as_millis()).unwrap_or(0);
        min_gap + Duration::from_millis(fastrand::u64(0..=span))
    };
    let mut next_cut = Instant::now() + next_gap();
    // Someone else may restart the server too (other tests sharing it):
    // seen by its start time or uptime, recorded as a disruption from the
    // last look at the old server to the first at the new one.
    let mut looked_ms = now_ms();
    let mut next_look = Instant::now();
    while going.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
        if Instant::now() >= next_look {
            next_look = Instant::now() + Duration::from_millis(250);
            if let Some(restarted) = server.restarted() {
                if restarted {
                    ledger.line(&format!("disrupt external {looked_ms} {}", now_ms()));
                    done.external_restarts += 1;
                }
                looked_ms = now_ms();
            }
        }
        if restart_at.last().is_some_and(|at| Instant::now() >= *at) {
            restart_at.pop();
            let command = settings.server_ctl.as_deref().unwrap_or_default();
            let from = now_ms();
            let clock = Instant::now();
            let status = Command::new("sh")
                .arg("-c")
                .arg(command)
                .stdin(Stdio::null())
                .status();
            match status {
                Ok(status) if status.success() => {}
                other => {
                    done.failure = Some(format!("restarting the server failed: {other:?}"));
                    return done;
                }
            }
            // Up means accepting connections again.
            server.restarted_by_us();
            looked_ms = now_ms();
            done.restarts += 1;
            done.longest_restart = done.longest_restart.max(clock.elapsed().as_secs_f64());
            ledger.line(&format!("disrupt restart {from} {}", now_ms()));
            next_cut = Instant::now() + next_gap();
        } else if Instant::now() >= next_cut {
            let from = now_ms();
            match server.cut() {
                Ok(cut) => {
                    done.cuts += 1;
                    done.connections_cut += cut;
                    ledger.line(&format!("disrupt cut {from} {}", now_ms()));
                }
                // The server went away under the cut (restarted by
                // someone else): the watch above records that.
                Err(e) => ledger.line(&format!("note: a cut failed: {e}")),
            }
            next_cut = Instant::now() + next_gap();
        }
    }
    done
}

/// The PostgreSQL side of the harness: audit triggers, cuts, restarts and
/// the end checks through a `postgres` client of its own.
#[cfg(feature = "postgres")]
mod pg {
    use super::{Probe, Report, Server};
    use std::time::{Duration, Instant};

    /// The same records as the SQLite triggers: one trigger function, so
    /// a claim and an end are told apart by the status change.
    const AUDIT_SQL: &str = "
    CREATE TABLE torture_effects (
        job_id BIGINT NOT NULL, run_token TEXT NOT NULL, pid BIGINT NOT NULL);
    CREATE TABLE torture_audit (
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        event TEXT NOT NULL, job_id BIGINT NOT NULL, run_token TEXT,
        old_attempts BIGINT NOT NULL, new_attempts BIGINT NOT NULL,
        new_status TEXT NOT NULL, old_error TEXT, new_error TEXT);
    CREATE FUNCTION torture_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.status = 'running' AND OLD.status <> 'running' THEN
            INSERT INTO torture_audit (event, job_id, run_token, old_attempts,
                new_attempts, new_status, old_error, new_error)
            VALUES ('claim', NEW.id, NEW.run_token, OLD.attempts, NEW.attempts,
                NEW.status, OLD.last_error, NEW.last_error);
        ELSIF OLD.status = 'running' AND NEW.status <> 'running' THEN
            INSERT INTO torture_audit (event, job_id, run_token, old_attempts,
                new_attempts, new_status, old_error, new_error)
            VALUES ('end', OLD.id, OLD.run_token, OLD.attempts, NEW.attempts,
                NEW.status, OLD.last_error, NEW.last_error);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER torture_audit AFTER UPDATE OF status ON tickler_jobs
        FOR EACH ROW EXECUTE FUNCTION torture_audit_row();
    ";

    /// A client as `application_name`, retried while the server restarts.
    fn connect(url: &str, application_name: &str) -> postgres::Client {
        let mut config: postgres::Config = url
            .parse()
            .unwrap_or_else(|e| panic!("not a PostgreSQL URL: {e}"));
        config
            .application_name(application_name)
            .connect_timeout(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match config.connect(postgres::NoTls) {
                Ok(client) => return client,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("torture: cannot connect to the database: {e}"),
            }
        }
    }

    /// Creates the audit tables; refuses a database that held a run
    /// already, whose jobs would count against this one.
    pub(super) fn create_audit(url: &str) {
        let mut client = connect(url, "torture_supervisor");
        let jobs: i64 = client
            .query_one("SELECT count(*) FROM tickler_jobs", &[])
            .expect("counting jobs")
            .get(0);
        assert_eq!(
            jobs, 0,
            "torture: the database already holds jobs; give it a fresh one"
        );
        client
            .batch_execute(AUDIT_SQL)
            .expect("torture: creating the audit tables (a fresh database is needed)");
    }

    pub(super) fn probe(url: &str) -> Probe {
        Probe::Postgres(connect(url, "torture_supervisor"))
    }

    pub(super) fn server(url: &str) -> Box<dyn Server> {
        let mut watch = connect(url, "torture_disruptor");
        let start = postmaster_start(&mut watch).unwrap_or_default();
        Box::new(Pg {
            url: url.to_owned(),
            watch,
            start,
        })
    }

    /// The disruptor's side of PostgreSQL: a client that watches the
    /// server's start time, and a fresh one per cut.
    struct Pg {
        url: String,
        watch: postgres::Client,
        start: i64,
    }

    impl Server for Pg {
        fn restarted(&mut self) -> Option<bool> {
            let start = match postmaster_start(&mut self.watch) {
                Some(start) => start,
                None => {
                    // Cut by a cut of ours, or the server restarted.
                    self.watch = connect(&self.url, "torture_disruptor");
                    postmaster_start(&mut self.watch)?
                }
            };
            let changed = start != self.start;
            self.start = start;
            Some(changed)
        }

        fn restarted_by_us(&mut self) {
            self.watch = connect(&self.url, "torture_disruptor");
            self.start = postmaster_start(&mut self.watch).unwrap_or_default();
        }

        fn cut(&mut self) -> Result<usize, String> {
            let mut client = connect(&self.url, "torture_disruptor");
            // Client backends only: autovacuum workers are the server's,
            // not tickler's.
            client
                .query_one(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'",
                    &[],
                )
                .map(|row| row.get::<_, i64>(0) as usize)
                .map_err(|e| e.to_string())
        }
    }

    /// When the server started (ms), `None` if it cannot be asked.
    fn postmaster_start(client: &mut postgres::Client) -> Option<i64> {
        client
            .query_one(
                "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000)::bigint",
                &[],
            )
            .ok()
            .map(|r| r.get(0))
    }

    /// `amcheck`'s `bt_index_check` (with `heapallindexed`) on every
    /// B-tree index of `tickler_jobs`: PostgreSQL's counterpart of
    /// `PRAGMA integrity_check` for what tickler writes. `Ok` with a note
    /// when the extension is not installed on the server.
    pub(super) fn amcheck(client: &mut postgres::Client) -> Result<String, String> {
        if let Err(e) = client.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck") {
            return Ok(format!("skipped (no amcheck: {e})"));
        }
        let checked = client.query_one(
            "SELECT count(bt_index_check(c.oid, true))
             FROM pg_index i
             JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_am a ON a.oid = c.relam
             WHERE i.indrelid = 'tickler_jobs'::regclass AND a.amname = 'btree'",
            &[],
        );
        match checked {
            Ok(row) => Ok(format!("ok ({} indexes)", row.get::<_, i64>(0))),
            Err(e) => Err(format!("amcheck: {e:?}")),
        }
    }

    /// Sizes and dead tuples of `tickler_jobs` at the end.
    pub(super) fn sizes(client: &mut postgres::Client, report: &mut Report) {
        let row = client
            .query_one(
                "SELECT pg_relation_size('tickler_jobs'), pg_indexes_size('tickler_jobs'),
                        coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
                        coalesce(s.autovacuum_count, 0)
                 FROM (SELECT 1) one
                 LEFT JOIN pg_stat_user_tables s ON s.relname = 'tickler_jobs'",
                &[],
            )
            .expect("reading tickler_jobs's sizes");
        report.table_bytes = row.get(0);
        report.index_bytes = row.get(1);
        report.pg_live_tuples = row.get(2);
        report.pg_dead_tuples = row.get(3);
        report.pg_autovacuums = row.get(4);
    }
}

/// Without the `postgres` feature there is no PostgreSQL queue to torture.
#[cfg(not(feature = "postgres"))]
mod pg {
    use super::{Probe, Server};

    const NEEDS: &str = "a PostgreSQL torture run needs the `postgres` feature";

    pub(super) fn create_audit(_: &str) {
        panic!("{NEEDS}")
    }

    pub(super) fn probe(_: &str) -> Probe {
        panic!("{NEEDS}")
    }

    pub(super) fn server(_: &str) -> Box<dyn Server> {
        panic!("{NEEDS}")
    }
}

/// The MySQL/MariaDB side of the harness: audit triggers, cuts, restarts
/// and the end checks through a `mysql` connection of its own.
#[cfg(feature = "mysql")]
mod my {
    use super::{Probe, Report, Server};
    use mysql::prelude::{FromRow, Queryable};
    use std::time::{Duration, Instant};

    /// The same records as the SQLite triggers, in one trigger (MySQL has
    /// no `UPDATE OF` column list): a claim and an end are told apart by
    /// the status change. The columns take the types of `tickler_jobs`'s
    /// (`run_token` and `status` are VARBINARY there).
    const AUDIT_SQL: [&str; 3] = [
        "CREATE TABLE torture_effects (
            job_id BIGINT NOT NULL, run_token VARBINARY(64) NOT NULL, pid BIGINT NOT NULL
        ) ENGINE = InnoDB",
        "CREATE TABLE torture_audit (
            seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            event VARBINARY(8) NOT NULL, job_id BIGINT NOT NULL, run_token VARBINARY(64),
            old_attempts BIGINT NOT NULL, new_attempts BIGINT NOT NULL,
            new_status VARBINARY(9) NOT NULL,
            old_error LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
            new_error LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
        ) ENGINE = InnoDB",
        "CREATE TRIGGER torture_audit_row AFTER UPDATE ON tickler_jobs FOR EACH ROW
        BEGIN
            IF NEW.status = 'running' AND OLD.status <> 'running' THEN
                INSERT INTO torture_audit (event, job_id, run_token, old_attempts,
                    new_attempts, new_status, old_error, new_error)
                VALUES ('claim', NEW.id, NEW.run_token, OLD.attempts, NEW.attempts,
                    NEW.status, OLD.last_error, NEW.last_error);
            ELSEIF OLD.status = 'running' AND NEW.status <> 'running' THEN
                INSERT INTO torture_audit (event, job_id, run_token, old_attempts,
                    new_attempts, new_status, old_error, new_error)
                VALUES ('end', OLD.id, OLD.run_token, OLD.attempts, NEW.attempts,
                    NEW.status, OLD.last_error, NEW.last_error);
            END IF;
        END",
    ];

    /// The crate's options for `url` (it knows `mysql://` only, tickler
    /// takes `mariadb://` too).
    fn opts(url: &str) -> mysql::Opts {
        let url = match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        };
        let parsed = mysql::Opts::from_url(&url).unwrap_or_else(|e| panic!("not a MySQL URL: {e}"));
        mysql::OptsBuilder::from_opts(parsed)
            .tcp_connect_timeout(Some(Duration::from_secs(10)))
            .into()
    }

    /// A connection to the database, retried while the server restarts.
    fn connect(url: &str) -> mysql::Conn {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match mysql::Conn::new(opts(url)) {
                Ok(conn) => return conn,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("torture: cannot connect to the database: {e}"),
            }
        }
    }

    /// Every row of `sql`; panics on an error (the end checks run on a
    /// server left in peace).
    pub(super) fn query<T: FromRow>(conn: &mut mysql::Conn, sql: &str) -> Vec<T> {
        conn.query(sql)
            .unwrap_or_else(|e| panic!("torture: {sql}: {e}"))
    }

    /// Creates the audit tables; refuses a database that held a run
    /// already, whose jobs would count against this one.
    pub(super) fn create_audit(url: &str) {
        let mut conn = connect(url);
        let jobs: i64 = query(&mut conn, "SELECT count(*) FROM tickler_jobs")[0];
        assert_eq!(
            jobs, 0,
            "torture: the database already holds jobs; give it a fresh one"
        );
        for sql in AUDIT_SQL {
            conn.query_drop(sql).unwrap_or_else(|e| {
                panic!("torture: creating the audit tables (a fresh database is needed): {e}")
            });
        }
    }

    pub(super) fn probe(url: &str) -> Probe {
        Probe::Mysql(connect(url))
    }

    pub(super) fn version(conn: &mut mysql::Conn) -> String {
        conn.query_first::<String, _>("SELECT VERSION()")
            .ok()
            .flatten()
            .map(|v| {
                if v.contains("MariaDB") {
                    format!("MariaDB {}", v.trim_end_matches("-MariaDB"))
                } else {
                    format!("MySQL {v}")
                }
            })
            .unwrap_or_default()
    }

    /// The client's and the server's errors of a connection that is gone
    /// or cannot be had: an I/O error (the socket closed under a `KILL` or
    /// a shutdown), a connection refused or timed out, the server shutting
    /// down (1053), the session killed (1927), a network error on the
    /// server's side (1158 to 1161).
    pub(super) fn connection_lost(e: &mysql::Error) -> bool {
        use mysql::DriverError as D;
        match e {
            mysql::Error::IoError(_) | mysql::Error::CodecError(_) => true,
            mysql::Error::DriverError(d) => matches!(
                d,
                D::ConnectTimeout
                    | D::CouldNotConnect(_)
                    | D::PacketOutOfSync
                    | D::UnexpectedPacket
                    | D::Timeout
                    | D::SetupError
            ),
            mysql::Error::MySqlError(server) => {
                matches!(server.code, 1053 | 1927 | 4031 | 1158..=1161)
            }
            _ => false,
        }
    }

    pub(super) fn server(url: &str) -> Box<dyn Server> {
        let mut conn = connect(url);
        let uptime = uptime(&mut conn).unwrap_or_default();
        Box::new(My {
            url: url.to_owned(),
            conn,
            uptime,
        })
    }

    /// The disruptor's side of MySQL: one connection to the database, which
    /// watches the server's uptime and cuts the others.
    struct My {
        url: String,
        conn: mysql::Conn,
        uptime: u64,
    }

    /// The server's uptime in seconds, `None` if it cannot be asked.
    fn uptime(conn: &mut mysql::Conn) -> Option<u64> {
        conn.query_first::<String, _>(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
             WHERE VARIABLE_NAME = 'UPTIME'",
        )
        .ok()
        .flatten()
        .and_then(|v| v.parse().ok())
    }

    impl Server for My {
        fn restarted(&mut self) -> Option<bool> {
            let uptime = match uptime(&mut self.conn) {
                Some(uptime) => uptime,
                None => {
                    self.conn = connect(&self.url);
                    uptime(&mut self.conn)?
                }
            };
            let restarted = uptime < self.uptime;
            self.uptime = uptime;
            Some(restarted)
        }

        fn restarted_by_us(&mut self) {
            self.conn = connect(&self.url);
            self.uptime = uptime(&mut self.conn).unwrap_or_default();
        }

        fn cut(&mut self) -> Result<usize, String> {
            let ids: Vec<u64> = self
                .conn
                .query(
                    "SELECT ID FROM information_schema.PROCESSLIST
                     WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
                )
                .map_err(|e| e.to_string())?;
            let mut cut = 0;
            for id in ids {
                // Gone already (1094, unknown thread) counts for nothing.
                if self
                    .conn
                    .query_drop(format!("KILL CONNECTION {id}"))
                    .is_ok()
                {
                    cut += 1;
                }
            }
            Ok(cut)
        }
    }

    /// `CHECK TABLE … EXTENDED` on every table of the database: MySQL's
    /// counterpart of `PRAGMA integrity_check`. Each must end in `status
    /// OK` with no `error` or `warning` row.
    pub(super) fn check_tables(conn: &mut mysql::Conn) -> Result<String, String> {
        let tables: Vec<String> = query(
            conn,
            "SELECT TABLE_NAME FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE'
             ORDER BY TABLE_NAME",
        );
        let mut problems = Vec::new();
        for table in &tables {
            let sql = format!("CHECK TABLE `{table}` EXTENDED");
            let rows: Vec<(String, String, String, String)> = match conn.query(&sql) {
                Ok(rows) => rows,
                Err(e) => {
                    problems.push(format!("{sql}: {e}"));
                    continue;
                }
            };
            let ok = rows
                .iter()
                .any(|(_, _, kind, text)| kind.eq_ignore_ascii_case("status") && text == "OK");
            let bad: Vec<String> = rows
                .iter()
                .filter(|(_, _, kind, _)| {
                    kind.eq_ignore_ascii_case("error") || kind.eq_ignore_ascii_case("warning")
                })
                .map(|(_, _, kind, text)| format!("{kind}: {text}"))
                .collect();
            if !ok || !bad.is_empty() {
                problems.push(format!("{table}: {rows:?}"));
            }
        }
        if problems.is_empty() {
            Ok(format!("ok ({} tables)", tables.len()))
        } else {
            Err(format!("CHECK TABLE: {}", problems.join("; ")))
        }
    }

    /// Sizes of `tickler_jobs` at the end, after `ANALYZE TABLE` (InnoDB's
    /// figures in information_schema are its statistics').
    pub(super) fn sizes(conn: &mut mysql::Conn, report: &mut Report) {
        let _ = conn.query_drop("ANALYZE TABLE tickler_jobs");
        type Sizes = (Option<u64>, Option<u64>, Option<u64>, Option<u64>);
        let row: Vec<Sizes> = query(
            conn,
            "SELECT DATA_LENGTH, INDEX_LENGTH, DATA_FREE, TABLE_ROWS
             FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'tickler_jobs'",
        );
        if let Some((data, index, free, rows)) = row.first() {
            let int = |v: &Option<u64>| v.map_or(0, |v| v as i64);
            report.table_bytes = int(data);
            report.index_bytes = int(index);
            report.my_free_bytes = int(free);
            report.my_rows_estimate = int(rows);
        }
    }
}

/// Without the `mysql` feature there is no MySQL queue to torture.
#[cfg(not(feature = "mysql"))]
mod my {
    use super::{Probe, Server};

    const NEEDS: &str = "a MySQL torture run needs the `mysql` feature";

    pub(super) fn create_audit(_: &str) {
        panic!("{NEEDS}")
    }

    pub(super) fn probe(_: &str) -> Probe {
        panic!("{NEEDS}")
    }

    pub(super) fn server(_: &str) -> Box<dyn Server> {
        panic!("{NEEDS}")
    }
}
