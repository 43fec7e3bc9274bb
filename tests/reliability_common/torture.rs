//! The kill -9 torture run of issue 7, shared by `examples/torture.rs` (long
//! runs) and `tests/torture_short.rs` (CI).
//!
//! A supervisor starts `workers` worker processes (each a [`WorkerPool`] of
//! `threads` threads) and one producer process on one file, all copies of
//! the running executable told their role by environment variables. Every
//! 0.5–3 s it kills a random worker with SIGKILL and starts a new one. The
//! producer enqueues without pause (single jobs and batches, some with
//! unique keys, some delayed, some that always fail with a small
//! `max_attempts`, some that outlive the lease and live on heartbeats).
//!
//! What each side records, so that the end can be checked:
//!
//! - every process appends to its own ledger (`ledger/<role>-<slot>-<pid>.log`),
//!   one `write(2)` per line on an `O_APPEND` file, which survives SIGKILL:
//!   handlers write `start` before running and `ok` only after
//!   `JobContext::complete_with` returned `Ok` (the completion was accepted),
//!   `lost` after it returned `LeaseLost`; the producer writes every id it
//!   was told was enqueued; every `Err` that reached this code is an `err`
//!   line, and every warning or error tickler logged is a `log` line;
//! - the database records, inside tickler's own transactions: a completion
//!   inserts one row into `torture_effects` (no unique constraint, so a
//!   double completion would show), and two triggers on `tickler_jobs` append
//!   every claim and every transition out of `running` (an accepted outcome
//!   or a take-back by the reaper) to `torture_audit`.
//!
//! At the end (producer stopped, no more kills, workers drain the queue and
//! stop, one last reaper pass) [`supervise`] checks: no acknowledged enqueue
//! is missing (lost = 0); every job is terminal; no run_token has two
//! accepted outcomes, no job two `succeeded`, no job two effects; every `ok`
//! in a ledger is a committed effect; no run_token was started twice;
//! duplicate executions ≤ kills that hit a running handler; no error
//! (`Busy` or other) reached user code; no process died unless killed; the
//! WAL stayed under its bound; `PRAGMA integrity_check` is `ok`.
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
/// The run's folder (database, ledgers, stop files).
pub const ENV_DIR: &str = "TICKLER_TORTURE_DIR";
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
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.join("torture.db")
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
    fn create(path: &Path) -> Ledger {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("opening ledger {}: {e}", path.display()));
        Ledger(Arc::new(file))
    }

    fn line(&self, text: &str) {
        let mut line = text.replace('\n', " ");
        line.push('\n');
        let written = (&*self.0)
            .write(line.as_bytes())
            .unwrap_or_else(|e| panic!("writing ledger: {e}"));
        assert_eq!(written, line.len(), "short ledger write");
    }
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

fn install_logger(ledger: &Ledger) {
    if log::set_boxed_logger(Box::new(LedgerLogger(ledger.clone()))).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
}

// ------------------------------------------------------------------ roles

/// Runs the role named by [`ENV_ROLE`] and returns the exit code.
pub fn run_role() -> i32 {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let dir = PathBuf::from(env(ENV_DIR));
    let db = dir.join("torture.db");
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
    let handler = |kind: Kind| {
        let ledger = ledger.clone();
        move |ctx: &JobContext| handle(&ledger, ctx, kind)
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
fn handle(ledger: &Ledger, ctx: &JobContext, kind: Kind) -> Result<(), JobError> {
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
    let done = ctx.complete_with(|tx| {
        tx.execute(
            "INSERT INTO torture_effects (job_id, run_token, pid) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, token, pid],
        )?;
        Ok(())
    });
    match done {
        Ok(()) => {
            ledger.line(&format!("ok {id} {token}"));
            Ok(())
        }
        Err(e) if e.is_lease_lost() => {
            ledger.line(&format!("lost {id} {token}"));
            Err(JobError::retry(e))
        }
        Err(e) => {
            ledger.line(&format!("err complete_with {id} {token} {}", describe(&e)));
            Err(JobError::retry(e))
        }
    }
}

fn describe(e: &Error) -> String {
    let busy = if e.is_busy() { "BUSY " } else { "" };
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
                match queue.unfinished(&[DEFAULT_QUEUE], None) {
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
        writeln!(
            f,
            "torture: {:.0} s of kills, {} worker processes x {} threads, 1 producer",
            self.seconds, self.workers, self.threads
        )?;
        writeln!(
            f,
            "  enqueues acknowledged:      {} jobs ({} rows in the file)",
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
            "  duplicate executions:       {} (bound: {} runs interrupted by kills; {} runs of live workers did not count)",
            self.duplicate_executions, self.kills_hit_running, self.live_runs_not_counted
        )?;
        writeln!(
            f,
            "  errors reaching user code:  {} (Busy: {})",
            self.user_errors, self.busy_errors
        )?;
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
        writeln!(
            f,
            "  drain at the end:           {:.1} s",
            self.drain_seconds
        )?;
        writeln!(f, "  PRAGMA integrity_check:     {}", self.integrity)?;
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
    let db = settings.db();
    let queue = Queue::open(&db).expect("supervisor: open the queue");
    queue
        .open_connection()
        .and_then(|c| Ok(c.execute_batch(AUDIT_SQL)?))
        .expect("supervisor: create the audit tables");

    // The WAL sampler.
    let sampling = Arc::new(AtomicBool::new(true));
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
        match queue.unfinished(&[DEFAULT_QUEUE], None) {
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
    match queue.reap() {
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
            lines.push(Line {
                pid,
                words: line.split_whitespace().map(str::to_owned).collect(),
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

fn check(settings: &Settings, queue: &Queue, killed: &HashSet<u32>, report: &mut Report) {
    let conn = queue.open_connection().expect("supervisor: connection");
    let lines = read_ledgers(&settings.dir, report);

    // Lost: every acknowledged id is in the file.
    let in_file: HashSet<i64> = {
        let mut stmt = conn.prepare("SELECT id FROM tickler_jobs").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    };
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
            "{} acknowledged job(s) are not in the file, e.g. {sample:?}",
            lost.len()
        ));
    }

    // Every job terminal; attempts within max_attempts; failing jobs dead.
    let mut stmt = conn
        .prepare("SELECT status, count(*) FROM tickler_jobs GROUP BY status")
        .unwrap();
    report.by_state = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
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
    let over: i64 = conn
        .query_row(
            "SELECT count(*) FROM tickler_jobs WHERE attempts > max_attempts",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if over > 0 {
        report.violations.push(format!(
            "{over} job(s) have more attempts than max_attempts"
        ));
    }
    let wrong_failing: i64 = conn
        .query_row(
            "SELECT count(*) FROM tickler_jobs WHERE kind = 'failing' AND status <> 'dead'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if wrong_failing > 0 {
        report.violations.push(format!(
            "{wrong_failing} always-failing job(s) did not end dead"
        ));
    }

    // The audit: claims and accepted outcomes, per run_token.
    let mut claims: HashMap<String, i64> = HashMap::new();
    let mut ends: HashMap<String, Vec<End>> = HashMap::new();
    {
        let mut stmt = conn
            .prepare(
                "SELECT event, job_id, run_token, old_attempts, new_attempts, new_status,
                        old_error, new_error FROM torture_audit ORDER BY rowid",
            )
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let event: String = r.get(0).unwrap();
            let job_id: i64 = r.get(1).unwrap();
            let token: String = r.get(2).unwrap();
            if event == "claim" {
                if claims.insert(token.clone(), job_id).is_some() {
                    report
                        .violations
                        .push(format!("run_token {token} was handed out by two claims"));
                }
                continue;
            }
            let (old_attempts, new_attempts): (i64, i64) = (r.get(3).unwrap(), r.get(4).unwrap());
            let status: String = r.get(5).unwrap();
            let old_error: Option<String> = r.get(6).unwrap();
            let new_error: Option<String> = r.get(7).unwrap();
            let how = if new_attempts < old_attempts {
                EndedBy::Release
            } else if status != "succeeded"
                && new_error != old_error
                && new_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("lease expired"))
            {
                EndedBy::Reaper
            } else {
                EndedBy::Outcome
            };
            ends.entry(token).or_default().push(End {
                job_id,
                status,
                how,
            });
        }
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
    {
        let mut stmt = conn
            .prepare("SELECT job_id, run_token FROM torture_effects")
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .unwrap();
        for row in rows {
            let (job, token) = row.unwrap();
            effects_per_job.entry(job).or_default().push(token);
        }
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
    let succeeded_rows: i64 = conn
        .query_row(
            "SELECT count(*) FROM tickler_jobs WHERE status = 'succeeded'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if succeeded_rows as usize != effects_per_job.len() {
        report.violations.push(format!(
            "{succeeded_rows} succeeded job(s) but {} with an effect",
            effects_per_job.len()
        ));
    }

    // Ledgers against the file.
    let mut started_by: HashMap<&str, u32> = HashMap::new();
    for line in &lines {
        let w = &line.words;
        let tag = w.first().map(String::as_str).unwrap_or("");
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
                    "pid {} was told job {} completed (run {}) but no effect is in the file",
                    line.pid, w[1], w[2]
                ));
            }
            "lost" if effect_tokens.contains(w[2].as_str()) => {
                report.violations.push(format!(
                    "pid {} got LeaseLost for job {} (run {}) but its effect committed",
                    line.pid, w[1], w[2]
                ));
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
                if w.get(1).map(String::as_str) == Some("ERROR") {
                    report.tickler_errors_logged += 1;
                } else {
                    report.tickler_warnings_logged += 1;
                }
                let lower = text.to_lowercase();
                if lower.contains("locked") || lower.contains("busy") {
                    report.busy_logged += 1;
                    if w.get(1).map(String::as_str) == Some("ERROR") {
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

    // Duplicate executions: handler runs whose result did not count (the
    // job was taken back and ran again, or went dead), against the runs a
    // kill interrupted: started by a process that was then killed, with no
    // outcome accepted for that run. Only kills may cost an execution.
    let mut interrupted_pids: HashSet<u32> = HashSet::new();
    for (token, pid) in &started_by {
        let accepted = ends
            .get(*token)
            .is_some_and(|list| list.iter().any(|e| e.how == EndedBy::Outcome));
        if accepted {
            continue;
        }
        report.duplicate_executions += 1;
        if killed.contains(pid) {
            report.kills_hit_running += 1;
            interrupted_pids.insert(*pid);
        } else {
            report.live_runs_not_counted += 1;
        }
    }
    report.kills_that_hit = interrupted_pids.len();
    if report.duplicate_executions > report.kills_hit_running {
        report.violations.push(format!(
            "{} duplicate executions but only {} runs were interrupted by kills \
             ({} runs of live workers did not count)",
            report.duplicate_executions, report.kills_hit_running, report.live_runs_not_counted
        ));
    }

    if report.max_wal_bytes >= report.wal_bound {
        report.violations.push(format!(
            "the WAL reached {} bytes (bound {})",
            report.max_wal_bytes, report.wal_bound
        ));
    }
    report.integrity = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap_or_else(|e| format!("integrity_check failed: {e}"));
    if report.integrity != "ok" {
        report
            .violations
            .push(format!("PRAGMA integrity_check: {}", report.integrity));
    }
}
