//! The README's main job: a reminder service on a realistic load.
//!
//! ```text
//! cargo run --release --example reminders [-- DB_PATH [--count N] [--threads T] [--processes P]]
//! cargo run --release --features postgres --example reminders -- postgres://USER@HOST/DB [--processes 3]
//! cargo run --release --features mysql --example reminders -- mysql://USER:PASSWORD@HOST/DB [--processes 3]
//! ```
//!
//! With a `postgres://` URL (feature `postgres`) or a `mysql://` or
//! `mariadb://` one (feature `mysql`) the same service runs on that
//! server: the database's tickler tables are emptied first, the ledgers
//! are written to a temporary folder, and `--processes` worker processes
//! (default 2) share the work.
//!
//! Creates a fresh database (default `reminders.db` in a temporary folder,
//! removed at the end, so that a run from a checkout writes nothing into
//! it; with DB_PATH, the database and the ledgers beside it stay),
//! enqueues reminders due over the next few seconds (20,000 by default: spread
//! with jitter, a few hundred due at the same millisecond, a few poison ones
//! that always panic, a few slow ones that outlive the lease and survive only
//! through heartbeats), then delivers them with worker pools in two OS
//! processes (this program starts a second copy of itself). Every delivery is
//! appended to a ledger file before the handler returns. At the end it prints
//! what the ledger and the queue say, and exits non-zero if a reminder was
//! delivered twice or lost.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tickler::{
    JobContext, JobError, JobState, NewJob, Queue, ReaperConfig, RetryPolicy, WorkerPool,
};

const LEASE: Duration = Duration::from_millis(1500);
const POISON: usize = 5;
const SLOW: usize = 3;
const SAME_MILLISECOND: usize = 300;

#[derive(Serialize, Deserialize)]
struct Reminder {
    /// Due time, ms since the epoch (also the job's run_at).
    due_ms: i64,
    /// "deliver", "panic" or "slow".
    behaviour: String,
}

// pub(crate): tests/cli checks where the README's command writes.
pub(crate) struct Settings {
    pub(crate) db: PathBuf,
    /// Ledger files are this path with `.ledger-PROCESS` appended.
    pub(crate) ledgers: PathBuf,
    /// The folder of `db` and `ledgers` when no DB_PATH was given; removed
    /// with the settings.
    _temp: Option<tempfile::TempDir>,
    count: usize,
    threads: usize,
    /// Worker processes (this one and `processes - 1` children).
    processes: usize,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    quiet_poison_panics();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        let (Some(db), Some(ledgers), Some(process), Some(threads)) =
            (args.get(1), args.get(2), args.get(3), args.get(4))
        else {
            eprintln!("usage: reminders --worker DB LEDGERS PROCESS THREADS");
            return ExitCode::from(2);
        };
        let threads = threads.parse().unwrap_or(4);
        let ledger = ledger_path(Path::new(ledgers), process);
        return match run_worker(Path::new(db), &ledger, process, threads) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker {process}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let settings = match parse_args(&args) {
        Ok(s) => s,
        Err(message) => {
            eprintln!(
                "{message}\nusage: reminders [DB_PATH | postgres://… | mysql://…] [--count N] [--threads T] [--processes P]"
            );
            return ExitCode::from(2);
        }
    };
    match run(&settings) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("reminders: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The poison reminders panic on purpose, three attempts each: the pool
/// catches each panic and records it as the attempt's error. Rust's default
/// hook would still print every one of them (with a backtrace under
/// `RUST_BACKTRACE`), so they are left out here; any other panic is printed
/// as usual.
fn quiet_poison_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !message.starts_with("poison reminder") {
            default(info);
        }
    }));
}

pub(crate) fn parse_args(args: &[String]) -> Result<Settings, String> {
    let mut db = None;
    let mut settings = Settings {
        db: PathBuf::new(),
        ledgers: PathBuf::new(),
        _temp: None,
        count: 20_000,
        threads: 4,
        processes: 2,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--count" => settings.count = number("--count")?.max(POISON + SLOW + 1),
            "--threads" => settings.threads = number("--threads")?.max(1),
            "--processes" => settings.processes = number("--processes")?.clamp(1, 26),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            path => db = Some(PathBuf::from(path)),
        }
    }
    match db {
        Some(path) if !is_url(&path) => {
            settings.ledgers = path.clone();
            settings.db = path;
        }
        given => {
            // Not the working folder: run from a checkout, the README's
            // command would leave its files in the repository.
            let temp = tempfile::Builder::new()
                .prefix("tickler-reminders-")
                .tempdir()
                .map_err(|e| format!("cannot make a temporary folder: {e}"))?;
            settings.db = given.unwrap_or_else(|| temp.path().join("reminders.db"));
            settings.ledgers = temp.path().join("reminders");
            settings._temp = Some(temp);
        }
    }
    Ok(settings)
}

/// Process names: a, b, c, …
fn process_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| char::from(b'a' + i as u8).to_string())
        .collect()
}

fn is_url(db: &Path) -> bool {
    db.to_str().is_some_and(|db| !tickler::is_file_location(db))
}

pub(crate) fn ledger_path(ledgers: &Path, process: &str) -> PathBuf {
    let mut name = ledgers.as_os_str().to_owned();
    name.push(format!(".ledger-{process}"));
    PathBuf::from(name)
}

fn open_queue(db: &Path) -> tickler::Result<Queue> {
    Queue::builder(db)
        .retry_policy(RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            jitter: true,
        })
        .open()
}

/// A fresh start: no jobs of an earlier run, no ledgers.
fn start_fresh(settings: &Settings) -> Result<(), Box<dyn std::error::Error>> {
    for process in process_names(26) {
        let _ = std::fs::remove_file(ledger_path(&settings.ledgers, &process));
    }
    if !is_url(&settings.db) {
        for suffix in ["", "-wal", "-shm"] {
            let mut name = settings.db.as_os_str().to_owned();
            name.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(name));
        }
        return Ok(());
    }
    empty_server_tables(&settings.db)
}

/// Empties the tickler tables of a server's database (creating them if
/// this database has none yet).
fn empty_server_tables(db: &Path) -> Result<(), Box<dyn std::error::Error>> {
    drop(open_queue(db)?);
    let url = db.to_str().ok_or("the URL is not UTF-8")?;
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        empty_mysql_tables(url)
    } else {
        empty_postgres_tables(url)
    }
}

#[cfg(feature = "postgres")]
fn empty_postgres_tables(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    client.batch_execute("TRUNCATE tickler_jobs, tickler_schedules")?;
    Ok(())
}

#[cfg(not(feature = "postgres"))]
fn empty_postgres_tables(_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err("a postgres:// URL needs the postgres feature: cargo run --release --features postgres --example reminders -- URL".into())
}

#[cfg(feature = "mysql")]
fn empty_mysql_tables(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    use tickler::mysql::prelude::Queryable;
    let url = url.replacen("mariadb://", "mysql://", 1);
    let mut conn = tickler::mysql::Conn::new(tickler::mysql::Opts::from_url(&url)?)?;
    conn.query_drop("DELETE FROM tickler_jobs")?;
    conn.query_drop("DELETE FROM tickler_schedules")?;
    Ok(())
}

#[cfg(not(feature = "mysql"))]
fn empty_mysql_tables(_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    Err("a mysql:// URL needs the mysql feature: cargo run --release --features mysql --example reminders -- URL".into())
}

fn run(settings: &Settings) -> Result<bool, Box<dyn std::error::Error>> {
    start_fresh(settings)?;
    let queue = open_queue(&settings.db)?;
    let enqueued = enqueue_reminders(&queue, settings.count)?;
    println!(
        "enqueued {} reminders into {} (due over the next ~5 s; {SAME_MILLISECOND} due in the same millisecond)",
        enqueued,
        queue.location()
    );
    println!(
        "{POISON} poison reminders panic on purpose on each of their 3 attempts and end dead (their panics are not printed); {SLOW} slow ones outlive the lease and are kept by heartbeats"
    );
    let processes = if std::env::var_os("REMINDERS_ONE_PROCESS").is_some() {
        1
    } else {
        settings.processes
    };
    println!(
        "delivering with {processes} worker processes of {} threads each…",
        settings.threads
    );

    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for name in process_names(processes).iter().skip(1) {
        children.push((
            name.clone(),
            Command::new(&exe)
                .arg("--worker")
                .arg(&settings.db)
                .arg(&settings.ledgers)
                .arg(name)
                .arg(settings.threads.to_string())
                .spawn()?,
        ));
    }
    let own = run_worker(
        &settings.db,
        &ledger_path(&settings.ledgers, "a"),
        "a",
        settings.threads,
    );
    for (name, child) in &mut children {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("worker process {name} failed: {status}").into());
        }
    }
    own?;
    let elapsed = started.elapsed();
    report(&queue, settings, enqueued, elapsed)
}

fn enqueue_reminders(queue: &Queue, count: usize) -> tickler::Result<usize> {
    let start_ms = Utc::now().timestamp_millis() + 500;
    let burst_ms = start_ms + 2_000;
    let mut jobs = Vec::with_capacity(count);
    for i in 0..count {
        let (behaviour, due_ms) = if i < POISON {
            ("panic", start_ms + fastrand::i64(0..5_000))
        } else if i < POISON + SLOW {
            ("slow", start_ms + fastrand::i64(0..1_000))
        } else if i < POISON + SLOW + SAME_MILLISECOND {
            ("deliver", burst_ms)
        } else {
            ("deliver", start_ms + fastrand::i64(0..5_000))
        };
        let reminder = Reminder {
            due_ms,
            behaviour: behaviour.to_owned(),
        };
        let due = chrono::DateTime::from_timestamp_millis(due_ms).expect("due time in range");
        jobs.push(
            NewJob::new("reminder")
                .payload(serde_json::to_value(&reminder)?)
                .run_at(due)
                .max_attempts(3),
        );
    }
    for chunk in jobs.chunks(1_000) {
        queue.enqueue_batch(chunk.to_vec())?;
    }
    Ok(count)
}

/// Runs a pool until no reminder is left to deliver.
fn run_worker(
    db: &Path,
    ledger: &Path,
    process: &str,
    threads: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let queue = open_queue(db)?;
    let ledger = Arc::new(Mutex::new(
        OpenOptions::new().create(true).append(true).open(ledger)?,
    ));
    let process_name = process.to_owned();
    let mut pool = WorkerPool::builder(&queue)
        .threads(threads)
        .lease(LEASE)
        .reaper(ReaperConfig {
            interval: Duration::from_millis(200),
            prune_finished_after: None,
            ..ReaperConfig::default()
        })
        .handler("reminder", move |ctx: &JobContext| {
            deliver(ctx, &ledger, &process_name)
        })
        .start()?;
    let mut last_progress = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let mut open = 0;
        for state in [JobState::Scheduled, JobState::Pending, JobState::Running] {
            open += queue.count(state)?;
        }
        if open == 0 {
            break;
        }
        // The first process reports for both, once a second.
        if process == "a" && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let finished = queue.count(JobState::Succeeded)? + queue.count(JobState::Dead)?;
            println!("  {finished} finished, {open} to go");
        }
    }
    pool.shutdown(Duration::from_secs(10));
    Ok(())
}

fn deliver(ctx: &JobContext, ledger: &Mutex<File>, process: &str) -> Result<(), JobError> {
    let reminder: Reminder = ctx.payload_as()?;
    match reminder.behaviour.as_str() {
        "panic" => panic!("poison reminder {}", ctx.job_id()),
        "slow" => {
            // Three leases long: only the pool's heartbeats keep the job.
            let until = Instant::now() + LEASE * 3;
            while Instant::now() < until && !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if ctx.is_cancelled() {
                return Err(JobError::retry("cancelled before delivery"));
            }
        }
        _ => {}
    }
    let line = format!(
        "{},{},{},{},{}\n",
        ctx.job_id(),
        ctx.run_token(),
        process,
        Utc::now().timestamp_millis(),
        reminder.due_ms
    );
    let mut file = ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    file.write_all(line.as_bytes())?;
    Ok(())
}

fn report(
    queue: &Queue,
    settings: &Settings,
    enqueued: usize,
    elapsed: Duration,
) -> Result<bool, Box<dyn std::error::Error>> {
    let mut deliveries: HashMap<i64, u32> = HashMap::new();
    let mut lateness: Vec<i64> = Vec::new();
    let mut per_process: HashMap<String, u64> = HashMap::new();
    for process in process_names(settings.processes) {
        let Ok(file) = File::open(ledger_path(&settings.ledgers, &process)) else {
            continue;
        };
        for line in BufReader::new(file).lines() {
            let line = line?;
            let fields: Vec<&str> = line.split(',').collect();
            let [id, _token, process, delivered, due] = fields[..] else {
                return Err(format!("bad ledger line {line:?}").into());
            };
            *deliveries.entry(id.parse()?).or_default() += 1;
            *per_process.entry(process.to_owned()).or_default() += 1;
            lateness.push(delivered.parse::<i64>()? - due.parse::<i64>()?);
        }
    }
    let stats = queue.stats()?;
    let dead = stats.total(JobState::Dead);
    let delivered = deliveries.len() as u64;
    let duplicates: u64 = deliveries.values().map(|n| u64::from(n - 1)).sum();
    let lost = (enqueued as u64).saturating_sub(delivered + dead);
    lateness.sort_unstable();
    let pct = |p: f64| -> i64 {
        if lateness.is_empty() {
            return 0;
        }
        let i = ((lateness.len() as f64 - 1.0) * p).round() as usize;
        lateness[i]
    };
    let mut processes: Vec<_> = per_process.into_iter().collect();
    processes.sort();
    let processes: Vec<String> = processes
        .iter()
        .map(|(p, n)| format!("{n} by process {p}"))
        .collect();
    println!();
    println!("enqueued:             {enqueued}");
    println!(
        "delivered:            {delivered} ({}), each one line in a ledger file",
        processes.join(", ")
    );
    println!(
        "duplicate deliveries: {duplicates} (reminders in the ledgers more than once; must be 0)"
    );
    println!("lost:                 {lost} (neither delivered nor dead; must be 0)");
    println!(
        "dead:                 {dead} (expected {POISON}: the poison reminders, after 3 attempts)"
    );
    println!(
        "lateness (ms):        p50 {} / p99 {} / max {} (how long after its due time a reminder was delivered: half were within p50, 99 % within p99, the latest at max: the slow ones, about three leases late on purpose)",
        pct(0.5),
        pct(0.99),
        lateness.last().copied().unwrap_or(0)
    );
    println!(
        "throughput:           {:.0} jobs/s over {:.2} s wall time (bounded by the due times: jobs are due over ~5 s)",
        delivered as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    let ok = duplicates == 0 && lost == 0 && dead == POISON as u64;
    println!("{}", if ok { "OK" } else { "FAILED" });
    Ok(ok)
}
