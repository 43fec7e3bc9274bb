//! tickler's benchmarks: one JSON line per figure, each with its settings.
//!
//! ```text
//! cargo bench --bench tickler_bench               # everything (< 10 min on 2 cores)
//! cargo bench --bench tickler_bench -- --quick    # smaller sizes (< 1 min)
//! cargo bench --bench tickler_bench -- --only burn,depth
//! cargo bench --bench tickler_bench -- --only idle [--tickler-bin OLD_BINARY]
//! .ci/postgres cargo bench --features postgres --bench tickler_bench -- --only pg_raw
//! .ci/postgres cargo bench --features postgres --bench tickler_bench -- --only pg [--quick]
//!     (or one part: pg_burn, pg_enqueue, pg_wakeup, pg_depth)
//! .ci/postgres cargo bench --features postgres --bench tickler_bench -- --only pg_churn
//! .ci/postgres cargo bench --features postgres --bench tickler_bench -- --only pg_processes
//! .ci/postgres benches/peers/compare-pg.sh [--quick] [ROUNDS]   (against graphile-worker)
//! .ci/mariadb cargo bench --features mysql --bench tickler_bench -- --only mysql [--quick]
//! cargo bench --features tokio --bench tickler_bench -- --only async_burn,async_timers
//! cargo bench --bench tickler_bench -- --only events
//! cargo bench --bench tickler_bench -- --only progress
//! cargo bench --bench tickler_bench -- --only dashboard
//! .ci/postgres .ci/mariadb cargo bench --features postgres,mysql --bench tickler_bench -- --only waiting
//! ```
//!
//! Every scenario runs on a fresh file in a temporary directory, under
//! `Durability::Normal` and `Durability::Full`. Throughput figures are also
//! printed as a ratio to raw-SQLite baselines measured in the same run with
//! the same schema and pragmas, so they read the same on any machine: one job
//! per transaction (`ratio_to_raw_cycle`) and the raw limit, 32 jobs per
//! transaction (`ratio_to_raw_batched`). A pool built with no setting
//! changed carries `"settings": "default"`.
//!
//! `pg_raw` (feature `postgres`) measures the raw PostgreSQL loops on the
//! server of `TICKLER_BENCH_DATABASE_URL` (`.ci/postgres` starts a throwaway
//! one and sets it): claim and complete one job per transaction, 32 per
//! transaction with batched completion (4 threads), and single-row inserts
//! from 16 threads. Without the feature or the URL it is skipped with a note.

#[path = "../tests/support/dashboard_fill.rs"]
mod dashboard_fill;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, TransactionBehavior};
use serde_json::{json, Value};
use tickler::{
    Durability, JobContext, JobError, JobState, NewJob, Queue, Subscription, WorkerPool,
    DEFAULT_EVENT_BUFFER,
};

struct Sizes {
    raw_jobs: usize,
    raw_batched_jobs: usize,
    enqueue_single: usize,
    enqueue_batches: usize,
    burn_jobs: usize,
    steady_secs: u64,
    wakeup_jobs: usize,
    wakeup_secs: u64,
    depths: Vec<usize>,
    depth_measured: usize,
    fairness_jobs: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        if args.get(1).map(String::as_str) == Some("idle") {
            idle_child(&args[2..]);
        } else if args.get(1).map(String::as_str) == Some("pg_worker") {
            pg_processes::child(&args[2..]);
        } else {
            child(&args[1..]);
        }
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--sdcard-inner") {
        sdcard_inner(quick);
        return;
    }
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_owned).collect());
    let sizes = if quick {
        Sizes {
            raw_jobs: 500,
            raw_batched_jobs: 5_000,
            enqueue_single: 300,
            enqueue_batches: 5,
            burn_jobs: 5_000,
            steady_secs: 1,
            wakeup_jobs: 1_000,
            wakeup_secs: 1,
            depths: vec![1_000, 50_000],
            depth_measured: 1_000,
            fairness_jobs: 4_000,
        }
    } else {
        Sizes {
            raw_jobs: 5_000,
            raw_batched_jobs: 200_000,
            enqueue_single: 3_000,
            enqueue_batches: 50,
            burn_jobs: 200_000,
            steady_secs: 20,
            wakeup_jobs: 10_000,
            wakeup_secs: 10,
            depths: vec![1_000, 100_000, 1_000_000, 5_000_000],
            depth_measured: 10_000,
            fairness_jobs: 100_000,
        }
    };
    let wants = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let mode = if quick { "--quick" } else { "" };
    eprintln!(
        "# reproduce: cargo bench --bench tickler_bench -- {mode} (one JSON line per figure on stdout)"
    );
    let mut baselines: HashMap<(&str, &str), f64> = HashMap::new();
    let needs_baselines = ["enqueue", "burn", "steady", "wakeup"]
        .iter()
        .any(|s| wants(s));
    for durability in [Durability::Normal, Durability::Full] {
        if !needs_baselines {
            break;
        }
        let d = durability_name(durability);
        let insert = raw_insert(durability, sizes.raw_jobs);
        let cycle = raw_cycle(durability, sizes.raw_jobs);
        let batched = raw_cycle_batched(durability, sizes.raw_batched_jobs);
        baselines.insert(("insert", d), insert);
        baselines.insert(("cycle", d), cycle);
        baselines.insert(("batched", d), batched);
        emit(
            json!({"scenario": "raw_insert", "durability": d, "jobs": sizes.raw_jobs,
            "jobs_per_s": round(insert), "note": "one INSERT per transaction, single thread"}),
        );
        emit(
            json!({"scenario": "raw_claim_complete", "durability": d, "jobs": sizes.raw_jobs,
            "jobs_per_s": round(cycle),
            "note": "BEGIN IMMEDIATE; claiming UPDATE..RETURNING; COMMIT; then completing UPDATE in its own transaction; single thread"}),
        );
        emit(
            json!({"scenario": "raw_claim_complete_batched", "durability": d,
            "jobs": sizes.raw_batched_jobs, "batch": RAW_BATCH, "jobs_per_s": round(batched),
            "note": "one BEGIN IMMEDIATE..COMMIT per 32 jobs: completes the previous 32 (one prepared UPDATE each) and claims the next 32 (one UPDATE..RETURNING); single thread"}),
        );
    }
    for durability in [Durability::Normal, Durability::Full] {
        if !needs_baselines {
            break;
        }
        let d = durability_name(durability);
        let insert = baselines[&("insert", d)];
        let cycle = baselines[&("cycle", d)];
        let batched = baselines[&("batched", d)];
        if wants("enqueue") {
            enqueue(durability, &sizes, insert);
        }
        if wants("burn") {
            burn_down(durability, &sizes, Baselines { cycle, batched });
        }
        if wants("steady") {
            for rate in [1_000, 10_000] {
                steady(durability, rate, sizes.steady_secs);
            }
        }
        if wants("wakeup") {
            wakeup(durability, sizes.wakeup_jobs, sizes.wakeup_secs);
        }
    }
    if wants("depth") {
        for shape in ["same_priority", "future_higher_priority"] {
            for &n in &sizes.depths {
                depth(n, shape, sizes.depth_measured);
            }
        }
    }
    if wants("fairness") {
        fairness(sizes.fairness_jobs);
    }
    if wants("footprint") {
        footprint(sizes.burn_jobs.min(100_000));
    }
    if wants("sdcard") {
        sdcard(quick);
    }
    if wants("pg_raw") {
        pg_raw(quick);
    }
    // `pg` runs every part; `pg_burn`, `pg_enqueue`, `pg_wakeup` and
    // `pg_depth` run that part alone (with the raw loops it is divided by).
    let pg_parts: Vec<String> = only
        .iter()
        .flatten()
        .filter_map(|x| match x.as_str() {
            "pg" => Some("all".to_owned()),
            "pg_burn" | "pg_enqueue" | "pg_wakeup" | "pg_depth" => Some(x[3..].to_owned()),
            _ => None,
        })
        .collect();
    if !pg_parts.is_empty() {
        pg_engine(quick, &pg_parts);
    }
    if only
        .as_ref()
        .is_some_and(|o| o.iter().any(|x| x == "pg_churn"))
    {
        pg_churn(quick);
    }
    if only
        .as_ref()
        .is_some_and(|o| o.iter().any(|x| x == "pg_processes"))
    {
        pg_processes::run(quick);
    }
    if only
        .as_ref()
        .is_some_and(|o| o.iter().any(|x| x == "mysql"))
    {
        mysql_engine(quick);
    }
    if only
        .as_ref()
        .is_some_and(|o| o.iter().any(|x| x == "waiting"))
    {
        waiting::run();
    }
    if wants("events") {
        events(sizes.burn_jobs);
    }
    if wants("progress") {
        progress_cost(if quick { 100_000 } else { 1_000_000 });
    }
    if wants("limits") {
        limits_burn(0, if quick { 5_000 } else { 50_000 });
        limits_burn(2, if quick { 1_000 } else { 4_000 });
        limits_burn(10, if quick { 400 } else { 2_000 });
        limits_no_scan(if quick { 20_000 } else { 100_000 });
    }
    if wants("async_burn") {
        async_burn(if quick { 5_000 } else { 50_000 });
    }
    if wants("async_timers") {
        async_timers(if quick { 2_000 } else { 10_000 });
    }
    if wants("dashboard") {
        dashboard(if quick { 100_000 } else { 1_000_000 });
    }
    if wants("idle") {
        let other_bin = args
            .iter()
            .position(|a| a == "--tickler-bin")
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from);
        idle(
            if quick { 5 } else { 20 },
            if quick { 50 } else { 300 },
            other_bin,
        );
    }
}

// ------------------------------------------------------------------- idle

/// CPU time (ns, from schedstat) and context switches (voluntary and not:
/// each is a wake-up of a thread) summed over a process's live threads.
fn process_wakeups_and_cpu(pid: u32) -> (u64, u64) {
    let mut switches = 0;
    let mut cpu_ns = 0;
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for task in tasks.flatten() {
        let dir = task.path();
        if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
            for line in status.lines() {
                if line.starts_with("voluntary_ctxt_switches")
                    || line.starts_with("nonvoluntary_ctxt_switches")
                {
                    switches += line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
        }
        if let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) {
            cpu_ns += stat
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (switches, cpu_ns)
}

/// Measures an idle process over `secs`: CPU % of one core, wake-ups/s,
/// threads.
fn idle_figures(pid: u32, secs: u64) -> Value {
    let (s0, c0) = process_wakeups_and_cpu(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let (s1, c1) = process_wakeups_and_cpu(pid);
    let elapsed = t0.elapsed().as_secs_f64();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
    json!({"cpu_percent": round((c1 - c0) as f64 / 1e9 / elapsed * 100.0 * 1000.0) / 1000.0,
           "wakeups_per_s": round((s1 - s0) as f64 / elapsed),
           "threads": threads, "window_s": secs})
}

/// An idle 4-thread pool (default settings) in a child process: its CPU
/// and wake-ups, then how soon it starts jobs enqueued one at a time, at
/// random intervals of 20-120 ms, by this process (another process) and by
/// itself; then the same idle figures for `tickler work` (this build's,
/// and another binary's if given, e.g. an older build).
fn idle(secs: u64, jobs: usize, other_bin: Option<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, queue) = fresh(&dir, Durability::Full);
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args(["--child", "idle", path.to_str().expect("utf-8 path")])
        .arg(jobs.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn idle child");
    // Let it start and settle.
    std::thread::sleep(Duration::from_secs(2));
    let pool_idle = idle_figures(child.id(), secs);
    for _ in 0..jobs {
        std::thread::sleep(Duration::from_millis(fastrand::u64(20..=120)));
        let sent = chrono::Utc::now().timestamp_micros();
        queue
            .enqueue(NewJob::new("ping").payload(json!({"sent_us": sent})))
            .expect("enqueue");
    }
    let mut stdout = child.stdout.take().expect("child stdout");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).expect("child output");
    assert!(child.wait().expect("wait").success(), "idle child failed");
    let starts: Value = serde_json::from_str(out.trim()).expect("child JSON");
    emit(
        json!({"scenario": "idle_pool", "threads": 4, "settings": "defaults",
        "idle": pool_idle,
        "enqueue_to_start_ms_other_process": starts["other_process"],
        "enqueue_to_start_ms_same_process": starts["same_process"],
        "jobs": jobs}),
    );

    let mut bins = vec![("this build", PathBuf::from(env!("CARGO_BIN_EXE_tickler")))];
    if let Some(other) = other_bin {
        bins.push(("other binary", other));
    }
    for (which, bin) in bins {
        let db = dir
            .path()
            .join(format!("work-{}.db", which.replace(' ', "-")));
        let mut work = Command::new(&bin)
            .args(["--db", db.to_str().expect("utf-8 path"), "work", "--quiet"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn tickler work");
        std::thread::sleep(Duration::from_secs(2));
        let figures = idle_figures(work.id(), secs);
        let _ = work.kill();
        let _ = work.wait();
        emit(json!({"scenario": "idle_tickler_work", "binary": which,
            "path": bin.file_name().map(|n| n.to_string_lossy().into_owned()),
            "threads": 4, "idle": figures}));
    }
}

/// `--child idle DB JOBS`: a default 4-thread pool; records how late each
/// `ping` starts after its `sent_us`; after `JOBS` pings from the parent,
/// enqueues `JOBS` more itself, then prints the percentiles.
fn idle_child(args: &[String]) {
    let [db, jobs] = args else {
        panic!("idle child: bad arguments {args:?}");
    };
    let jobs: usize = jobs.parse().expect("jobs");
    let queue = Queue::builder(db)
        .sqlite(|o| o.durability(Durability::Full))
        .open()
        .expect("child open");
    let late = Arc::new(Mutex::new(Vec::<f64>::new()));
    // Blocks instead of polling: this thread's wake-ups would be counted.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let done_tx = Mutex::new(done_tx);
    let mut pool = {
        let late = Arc::clone(&late);
        WorkerPool::builder(&queue)
            .threads(4)
            .handler("ping", move |ctx: &JobContext| {
                let now = chrono::Utc::now().timestamp_micros();
                let sent = ctx.payload()["sent_us"].as_i64().unwrap_or(now);
                late.lock().expect("late").push((now - sent) as f64 / 1e3);
                let _ = done_tx.lock().expect("done").send(());
                Ok::<(), JobError>(())
            })
            .start()
            .expect("start pool")
    };
    for _ in 0..jobs {
        done_rx.recv().expect("pings");
    }
    let other = std::mem::take(&mut *late.lock().expect("late"));
    for _ in 0..jobs {
        std::thread::sleep(Duration::from_millis(fastrand::u64(20..=120)));
        let sent = chrono::Utc::now().timestamp_micros();
        queue
            .enqueue(NewJob::new("ping").payload(json!({"sent_us": sent})))
            .expect("enqueue");
    }
    for _ in 0..jobs {
        done_rx.recv().expect("pings");
    }
    pool.shutdown(Duration::from_secs(5));
    let same = std::mem::take(&mut *late.lock().expect("late"));
    println!(
        "{}",
        json!({"other_process": percentiles_ms(other), "same_process": percentiles_ms(same)})
    );
}

// ----------------------------------------------------------------- sdcard

/// Builds `benches/slowfsync.c` (every fsync/fdatasync takes 5 ms, like an
/// SD card) and runs the `sdcard` figures in a copy of this program with
/// the shim preloaded.
fn sdcard(quick: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let shim = dir.path().join("slowfsync.so");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/slowfsync.c");
    let built = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&shim)
        .arg(&source)
        .arg("-ldl")
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("# sdcard: could not build the fsync shim with cc; skipped");
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.arg("--sdcard-inner")
        .env("LD_PRELOAD", &shim)
        .env("SLOWFSYNC_MS", "5");
    if quick {
        cmd.arg("--quick");
    }
    let status = cmd.status().expect("run sdcard scenario");
    assert!(status.success(), "sdcard scenario failed: {status}");
}

fn sdcard_inner(quick: bool) {
    let shim = json!({"fsync_ms": std::env::var("SLOWFSYNC_MS").unwrap_or_default()});
    let (raw_jobs, enqueue_jobs, burn_jobs, default_burn_jobs, wakeup_jobs, wakeup_secs) = if quick
    {
        (50, 200, 3_000, 500, 300, 1)
    } else {
        (300, 2_000, 30_000, 5_000, 2_000, 5)
    };
    let durability = Durability::Full;
    let insert = raw_insert(durability, raw_jobs);
    let cycle = raw_cycle(durability, raw_jobs);
    emit(
        json!({"scenario": "sdcard_raw_insert", "durability": "full", "shim": shim,
        "jobs": raw_jobs, "jobs_per_s": round(insert)}),
    );
    emit(
        json!({"scenario": "sdcard_raw_claim_complete", "durability": "full", "shim": shim,
        "jobs": raw_jobs, "jobs_per_s": round(cycle)}),
    );
    let sizes = Sizes {
        raw_jobs,
        raw_batched_jobs: burn_jobs,
        enqueue_single: enqueue_jobs,
        enqueue_batches: 5,
        burn_jobs,
        steady_secs: 0,
        wakeup_jobs,
        wakeup_secs,
        depths: Vec::new(),
        depth_measured: 0,
        fairness_jobs: 0,
    };
    println!("# sdcard (every fsync 5 ms):");
    enqueue(durability, &sizes, insert);
    for &(threads, prefetch, jobs) in &[(4, Some(64), burn_jobs), (4, None, default_burn_jobs)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, queue) = fresh(&dir, durability);
        fill(&queue, jobs);
        let done = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut pool = noop_pool(&queue, threads, prefetch, Arc::clone(&done));
        let finished = wait_for(&done, jobs, Duration::from_secs(600));
        let rate = jobs as f64 / started.elapsed().as_secs_f64();
        pool.shutdown(Duration::from_secs(5));
        emit(
            json!({"scenario": "sdcard_burn_down", "durability": "full", "shim": shim,
            "threads": threads, "settings": settings_name(prefetch), "jobs": jobs, "finished": finished,
            "jobs_per_s": round(rate), "ratio_to_raw_cycle": round(rate / cycle)}),
        );
    }
    wakeup(durability, wakeup_jobs, wakeup_secs);
}

// ------------------------------------------------------------------ output

fn emit(v: Value) {
    println!("{v}");
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Full => "full",
        Durability::Normal => "normal",
    }
}

fn parse_durability(s: &str) -> Durability {
    if s == "full" {
        Durability::Full
    } else {
        Durability::Normal
    }
}

fn percentiles_ms(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return json!(null);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[(((v.len() - 1) as f64) * q).round() as usize];
    json!({"p50": round(at(0.5)), "p99": round(at(0.99)), "max": round(v[v.len() - 1])})
}

fn cpu_time() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn peak_rss_kib() -> i64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss
}

// ------------------------------------------------------------------ set-up

fn fresh(dir: &tempfile::TempDir, durability: Durability) -> (PathBuf, Queue) {
    let path = dir.path().join("bench.db");
    let queue = Queue::builder(&path)
        .sqlite(|o| o.durability(durability))
        .open()
        .expect("open bench queue");
    (path, queue)
}

fn fill(queue: &Queue, n: usize) {
    let mut left = n;
    while left > 0 {
        let chunk = left.min(5_000);
        let jobs = (0..chunk).map(|_| NewJob::new("noop")).collect();
        queue.enqueue_batch(jobs).expect("fill");
        left -= chunk;
    }
}

/// A pool of no-op handlers; `prefetch: None` leaves the pool's default.
fn noop_pool(
    queue: &Queue,
    threads: usize,
    prefetch: Option<usize>,
    done: Arc<AtomicUsize>,
) -> WorkerPool {
    let mut builder = WorkerPool::builder(queue).threads(threads);
    if let Some(n) = prefetch {
        builder = builder.prefetch(n);
    }
    builder
        .handler("noop", move |_: &JobContext| {
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<(), JobError>(())
        })
        .start()
        .expect("start pool")
}

fn wait_for(counter: &AtomicUsize, n: usize, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while counter.load(Ordering::Relaxed) < n {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

fn open_jobs(queue: &Queue) -> u64 {
    [JobState::Scheduled, JobState::Pending, JobState::Running]
        .into_iter()
        .map(|s| queue.count(s).expect("count"))
        .sum()
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

// -------------------------------------------------------- raw baselines

fn raw_connection(dir: &tempfile::TempDir, durability: Durability) -> Connection {
    // The same schema and pragmas as tickler, written to directly.
    let (path, queue) = fresh(dir, durability);
    drop(queue);
    let conn = Connection::open(path).expect("raw open");
    let sync = if durability == Durability::Full {
        "FULL"
    } else {
        "NORMAL"
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};"
    ))
    .expect("raw pragmas");
    conn
}

const RAW_INSERT: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at, max_attempts, created_at)
     VALUES ('default', 'noop', 'null', 'pending', 0, ?1, 25, ?1)";

fn raw_insert(durability: Durability, n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = raw_connection(&dir, durability);
    let started = Instant::now();
    for i in 0..n {
        let tx = conn.transaction().expect("tx");
        tx.execute(RAW_INSERT, params![i as i64]).expect("insert");
        tx.commit().expect("commit");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// A raw connection to a fresh file holding `n` pending jobs.
fn raw_filled(dir: &tempfile::TempDir, durability: Durability, n: usize) -> Connection {
    let mut conn = raw_connection(dir, durability);
    let tx = conn.transaction().expect("tx");
    for i in 0..n {
        tx.execute(RAW_INSERT, params![i as i64]).expect("insert");
    }
    tx.commit().expect("commit");
    conn
}

fn raw_cycle(durability: Durability, n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = raw_filled(&dir, durability, n);
    let started = Instant::now();
    for _ in 0..n {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        let id: i64 = tx
            .query_row(
                "UPDATE tickler_jobs SET status='running', run_token=lower(hex(randomblob(16))),
                     attempts=attempts+1, claimed_by='raw', claimed_at=1, lease_expires_at=2
                 WHERE id IN (SELECT id FROM tickler_jobs WHERE status='pending' AND queue='default'
                              AND run_at <= 9999999 ORDER BY priority DESC, run_at, id LIMIT 1)
                 RETURNING id",
                [],
                |r| r.get(0),
            )
            .expect("claim");
        tx.commit().expect("commit");
        conn.execute(
            "UPDATE tickler_jobs SET status='succeeded', finished_at=3 WHERE id=?1 AND status='running'",
            [id],
        )
        .expect("complete");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// Jobs per transaction of the batched raw baseline.
const RAW_BATCH: usize = 32;

/// The raw limit: what a hand-written claim/complete loop on the same schema
/// and pragmas does when it batches like tickler's pool does, one
/// transaction completing the previous batch and claiming the next.
fn raw_cycle_batched(durability: Durability, n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn = raw_filled(&dir, durability, n);
    let started = Instant::now();
    let mut claimed: Vec<i64> = Vec::with_capacity(RAW_BATCH);
    let mut done = 0;
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        {
            let mut complete = tx
                .prepare_cached(
                    "UPDATE tickler_jobs SET status='succeeded', finished_at=3 WHERE id=?1 AND status='running'",
                )
                .expect("prepare complete");
            for id in claimed.drain(..) {
                complete.execute([id]).expect("complete");
                done += 1;
            }
            let mut claim = tx
                .prepare_cached(
                    "UPDATE tickler_jobs SET status='running', run_token=lower(hex(randomblob(16))),
                         attempts=attempts+1, claimed_by='raw', claimed_at=1, lease_expires_at=2
                     WHERE id IN (SELECT id FROM tickler_jobs WHERE status='pending' AND queue='default'
                                  AND run_at <= 9999999 ORDER BY priority DESC, run_at, id LIMIT +?1)
                     RETURNING id",
                )
                .expect("prepare claim");
            let ids = claim
                .query_map([RAW_BATCH as i64], |r| r.get(0))
                .expect("claim");
            for id in ids {
                claimed.push(id.expect("claimed id"));
            }
        }
        tx.commit().expect("commit");
        if claimed.is_empty() {
            break;
        }
    }
    assert_eq!(done, n, "the batched raw loop completes every job");
    n as f64 / started.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------- enqueue

fn enqueue(durability: Durability, sizes: &Sizes, baseline: f64) {
    let d = durability_name(durability);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, queue) = fresh(&dir, durability);
    let started = Instant::now();
    for _ in 0..sizes.enqueue_single {
        queue.enqueue(NewJob::new("noop")).expect("enqueue");
    }
    let single = sizes.enqueue_single as f64 / started.elapsed().as_secs_f64();
    emit(
        json!({"scenario": "enqueue_single", "durability": d, "threads": 1,
        "jobs": sizes.enqueue_single, "jobs_per_s": round(single),
        "ratio_to_raw_insert": round(single / baseline)}),
    );
    let threads = 16;
    let per_thread = (sizes.enqueue_single / threads).max(10);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..per_thread {
                    queue.enqueue(NewJob::new("noop")).expect("enqueue");
                }
            });
        }
    });
    let n = threads * per_thread;
    let concurrent = n as f64 / started.elapsed().as_secs_f64();
    emit(
        json!({"scenario": "enqueue_single", "durability": d, "threads": threads, "jobs": n,
        "jobs_per_s": round(concurrent), "ratio_to_raw_insert": round(concurrent / baseline),
        "note": "each caller returns after the commit holding its job; concurrent callers share commits"}),
    );
    let started = Instant::now();
    for _ in 0..sizes.enqueue_batches {
        let jobs = (0..1_000).map(|_| NewJob::new("noop")).collect();
        queue.enqueue_batch(jobs).expect("enqueue_batch");
    }
    let n = sizes.enqueue_batches * 1_000;
    let batch = n as f64 / started.elapsed().as_secs_f64();
    emit(
        json!({"scenario": "enqueue_batch_1000", "durability": d, "jobs": n,
        "jobs_per_s": round(batch), "ratio_to_raw_insert": round(batch / baseline)}),
    );
}

// -------------------------------------------------------------- burn-down

/// The raw baselines a burn-down row is divided by: one job per transaction
/// (`raw_cycle`) and 32 per transaction (`raw_cycle_batched`), the latter
/// being about what SQLite can do at all with this schema.
#[derive(Clone, Copy)]
struct Baselines {
    cycle: f64,
    batched: f64,
}

/// A pool's settings as the benchmark names them: `None` is a pool built
/// with no setting changed (`"settings": "default"` in its JSON line).
fn settings_name(prefetch: Option<usize>) -> Value {
    match prefetch {
        None => json!("default"),
        Some(n) => json!(format!("prefetch({n})")),
    }
}

/// One burn-down timed on a fresh file: `jobs` no-op jobs enqueued, then
/// drained by the pool that `start` builds on the queue (its handlers
/// count into the counter it is given). Timed from the pool's start until
/// every handler ran; the CPU time also covers the pool's shutdown, after
/// which the succeeded jobs are counted.
fn timed_burn(
    durability: Durability,
    jobs: usize,
    start: impl FnOnce(&Queue, Arc<AtomicUsize>) -> WorkerPool,
) -> Burn {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, queue) = fresh(&dir, durability);
    fill(&queue, jobs);
    let done = Arc::new(AtomicUsize::new(0));
    let cpu = cpu_time();
    let started = Instant::now();
    let mut pool = start(&queue, Arc::clone(&done));
    let finished = wait_for(&done, jobs, Duration::from_secs(600));
    let elapsed = started.elapsed();
    pool.shutdown(Duration::from_secs(5));
    let cpu = cpu_time() - cpu;
    Burn {
        finished,
        jobs_per_s: jobs as f64 / elapsed.as_secs_f64(),
        cpu_ms_per_1000_jobs: cpu.as_secs_f64() * 1e6 / jobs as f64,
        succeeded: queue.count(JobState::Succeeded).expect("count"),
    }
}

/// `--only limits`, part 1: a burn-down of jobs whose handler sleeps
/// `job_ms` (0: no-op) by a pool of 4 threads, without a limit and with
/// every job under one key of a limit of 4 per key: every claim and every
/// outcome pays for the limit (the count of holders, the release), and a
/// job claimed ahead of a free thread holds a slot, so the pool can claim
/// no further ahead than the limit. Rounds alternate, three each, on fresh
/// files (Normal).
fn limits_burn(job_ms: u64, jobs: usize) {
    let threads = 4;
    for round_no in 0..3 {
        for limited in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (_, queue) = fresh(&dir, Durability::Normal);
            if limited {
                queue
                    .set_limit("bench", tickler::Limit::per_key(threads as u32))
                    .expect("set limit");
            }
            let mut left = jobs;
            while left > 0 {
                let chunk = left.min(5_000);
                let batch = (0..chunk)
                    .map(|_| {
                        let job = NewJob::new("noop");
                        if limited {
                            job.limit("bench", "one")
                        } else {
                            job
                        }
                    })
                    .collect();
                queue.enqueue_batch(batch).expect("fill");
                left -= chunk;
            }
            let done = Arc::new(AtomicUsize::new(0));
            let cpu = cpu_time();
            let started = Instant::now();
            let mut pool = {
                let done = Arc::clone(&done);
                WorkerPool::builder(&queue)
                    .threads(threads)
                    .handler("noop", move |_: &JobContext| {
                        if job_ms > 0 {
                            std::thread::sleep(Duration::from_millis(job_ms));
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                        Ok::<(), JobError>(())
                    })
                    .start()
                    .expect("pool")
            };
            let finished = wait_for(&done, jobs, Duration::from_secs(600));
            let elapsed = started.elapsed();
            pool.shutdown(Duration::from_secs(5));
            let cpu = cpu_time() - cpu;
            emit(
                json!({"scenario": "limits_burn", "round": round_no, "limited": limited,
                "job_ms": job_ms, "threads": threads, "jobs": jobs, "finished": finished,
                "jobs_per_s": round(jobs as f64 / elapsed.as_secs_f64()),
                "cpu_ms_per_1000_jobs": round(cpu.as_secs_f64() * 1e6 / jobs as f64)}),
            );
        }
    }
}

/// `--only limits`, part 2: does a claim read blocked jobs? 1,000 due jobs
/// without a limit are claimed 32 at a time and completed, beside
/// (`none`) nothing, (`blocked`) `waiting` jobs blocked on one full key,
/// and (`pending_over_limit`) the same jobs left pending at a higher
/// priority, as a queue without the blocked state would hold them: every
/// claim takes them first and pushes them back. The third shape is the
/// regression the figure must be able to see. Rows are written by SQL
/// (the blocked ones as a claim leaves them, with one holder of the key).
fn limits_no_scan(waiting: usize) {
    let others = 1_000usize;
    for round_no in 0..3 {
        for shape in ["none", "blocked", "pending_over_limit"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (path, queue) = fresh(&dir, Durability::Normal);
            queue
                .set_limit("full", tickler::Limit::per_key(1))
                .expect("set limit");
            if shape != "none" {
                let status = if shape == "blocked" {
                    "blocked"
                } else {
                    "pending"
                };
                let conn = Connection::open(&path).expect("open");
                conn.execute(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
                     INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
                         max_attempts, created_at, limit_name, limit_key)
                     SELECT 'default', 'noop', 'null', ?2, 1, 0, 25, 0, 'full', 'k' FROM n",
                    params![waiting as i64, status],
                )
                .expect("waiting jobs");
                conn.execute(
                    "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
                         max_attempts, attempts, run_token, claimed_at, lease_expires_at,
                         created_at, limit_name, limit_key)
                     VALUES ('default', 'noop', 'null', 'running', 1, 0, 25, 1, 'holder', 0,
                             9000000000000, 0, 'full', 'k')",
                    [],
                )
                .expect("the key's holder");
                conn.execute_batch("ANALYZE").expect("analyze");
            }
            queue
                .enqueue_batch((0..others).map(|_| NewJob::new("other")).collect())
                .expect("others");
            let started = Instant::now();
            let mut completed = 0;
            let mut claims = 0;
            while completed < others {
                let leases = queue
                    .manual()
                    .claim("default", "bench", 32, Duration::from_secs(60))
                    .expect("claim");
                claims += 1;
                let outcomes: Vec<(&tickler::Lease, tickler::Outcome)> = leases
                    .iter()
                    .map(|l| (l, tickler::Outcome::Complete))
                    .collect();
                queue.manual().record_outcomes(&outcomes).expect("complete");
                completed += leases.iter().filter(|l| l.kind == "other").count();
            }
            let elapsed = started.elapsed();
            emit(
                json!({"scenario": "limits_no_scan", "round": round_no, "shape": shape,
                "waiting": if shape == "none" { 0 } else { waiting }, "others": others,
                "claims": claims,
                "ms_per_claim": round(elapsed.as_secs_f64() * 1e3 / claims as f64),
                "jobs_per_s": round(others as f64 / elapsed.as_secs_f64())}),
            );
        }
    }
}

/// What [`timed_burn`] measured.
struct Burn {
    /// Every handler ran within the time limit (600 s).
    finished: bool,
    jobs_per_s: f64,
    cpu_ms_per_1000_jobs: f64,
    /// Jobs `succeeded` in the file after the pool's shutdown.
    succeeded: u64,
}

fn burn_down(durability: Durability, sizes: &Sizes, baselines: Baselines) {
    let d = durability_name(durability);
    let runs: &[(usize, Option<usize>)] = &[
        (1, None),
        (4, None),
        (8, None),
        (1, Some(64)),
        (4, Some(64)),
        (4, Some(512)),
    ];
    for &(threads, prefetch) in runs {
        let jobs = sizes.burn_jobs;
        let burn = timed_burn(durability, jobs, |queue, done| {
            noop_pool(queue, threads, prefetch, done)
        });
        let rate = burn.jobs_per_s;
        emit(
            json!({"scenario": "burn_down", "durability": d, "processes": 1, "threads": threads,
            "settings": settings_name(prefetch), "jobs": jobs, "finished": burn.finished,
            "jobs_per_s": round(rate), "ratio_to_raw_batched": round(rate / baselines.batched),
            "ratio_to_raw_cycle": round(rate / baselines.cycle),
            "cpu_ms_per_1000_jobs": round(burn.cpu_ms_per_1000_jobs)}),
        );
    }
    for prefetch in [None, Some(64)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, queue) = fresh(&dir, durability);
        fill(&queue, sizes.burn_jobs);
        let prefetch_arg = prefetch.map_or("default".to_owned(), |n| n.to_string());
        let started = Instant::now();
        let children: Vec<_> = (0..2)
            .map(|_| {
                spawn_child(&[
                    "drain",
                    path.to_str().expect("utf-8 path"),
                    "4",
                    &prefetch_arg,
                    d,
                ])
            })
            .collect();
        let reports: Vec<Value> = children.into_iter().map(child_report).collect();
        let elapsed = started.elapsed();
        let rate = sizes.burn_jobs as f64 / elapsed.as_secs_f64();
        let shares: Vec<&Value> = reports.iter().map(|r| &r["jobs"]).collect();
        emit(
            json!({"scenario": "burn_down", "durability": d, "processes": 2, "threads": 4,
            "settings": settings_name(prefetch), "jobs": sizes.burn_jobs, "per_process": shares,
            "jobs_per_s": round(rate), "ratio_to_raw_batched": round(rate / baselines.batched),
            "ratio_to_raw_cycle": round(rate / baselines.cycle),
            "note": "includes starting the two processes"}),
        );
    }
}

/// `--only progress`: what `JobContext::progress` costs a handler that
/// calls it in a tight loop. One job's handler runs `reports` steps of a
/// little work each (hashing 64 bytes), alone and then with a report per
/// step, on a pool with default settings; the rounds alternate, three
/// each. Also counts the progress writes the pool made, with a trigger on
/// the file (SQLite), per second of the reporting run.
fn progress_cost(reports: usize) {
    use std::hash::{Hash, Hasher};
    fn step(i: usize) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        [i as u64; 8].hash(&mut h);
        h.finish()
    }
    for round_no in 0..3 {
        for report in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (path, queue) = fresh(&dir, Durability::Normal);
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(
                "CREATE TABLE progress_writes (n INTEGER);
                 CREATE TRIGGER count_progress AFTER UPDATE OF progress ON tickler_jobs
                 BEGIN INSERT INTO progress_writes VALUES (1); END;",
            )
            .expect("trigger");
            let took = Arc::new(Mutex::new(Duration::ZERO));
            let mut pool = {
                let took = Arc::clone(&took);
                WorkerPool::builder(&queue)
                    .handler("noop", move |ctx: &JobContext| {
                        let started = Instant::now();
                        let mut sum = 0u64;
                        for i in 0..reports {
                            sum = sum.wrapping_add(step(i));
                            if report {
                                ctx.progress(i as f64 / reports as f64, "hashing")?;
                            }
                        }
                        *took.lock().expect("lock") = started.elapsed();
                        // Then 2 s of reports, for the writes they cost.
                        let mut i = 0;
                        while report && started.elapsed() < Duration::from_secs(2) {
                            sum = sum.wrapping_add(step(i));
                            ctx.progress(0.5, "hashing on")?;
                            i += 1;
                        }
                        std::hint::black_box(sum);
                        Ok::<(), JobError>(())
                    })
                    .start()
                    .expect("pool")
            };
            queue.enqueue(NewJob::new("noop")).expect("enqueue");
            while queue.count(JobState::Succeeded).expect("count") < 1 {
                std::thread::sleep(Duration::from_millis(5));
            }
            pool.shutdown(Duration::from_secs(5));
            let took = *took.lock().expect("lock");
            let writes: i64 = conn
                .query_row("SELECT count(*) FROM progress_writes", [], |r| r.get(0))
                .expect("count writes");
            emit(
                json!({"scenario": "progress", "round": round_no + 1, "reports": report,
                "steps": reports, "run_ms": round(took.as_secs_f64() * 1e3),
                "ns_per_step": round(took.as_secs_f64() * 1e9 / reports as f64),
                "progress_writes_in_2_s": writes,
                "note": "steps of hashing 64 bytes, with or without a progress report each; then, with reports, 2 s of reports in a loop, whose stored writes are counted by a trigger"}),
            );
        }
    }
}

/// `--only events`: what job events cost a pool whose subscribers never
/// read (at most 5 %). The 4-thread burn-down of `burn` (default
/// settings, no-op handlers), alternated in one run: round A with no
/// subscriber, round B with a `WorkerPool::subscribe` and a
/// `Queue::subscribe` of `DEFAULT_EVENT_BUFFER` each, held and never read,
/// so that past their first 4,096 events every event is counted as dropped.
/// Seven pairs under each durability, in the order A B, B A, A B … so that
/// a drift of the machine's speed favours neither; then a summary line per
/// durability with the median of the seven ratios B/A (each pair's) and
/// the median CPU time per 1,000 jobs of each.
fn events(jobs: usize) {
    const PAIRS: usize = 7;
    for durability in [Durability::Normal, Durability::Full] {
        let d = durability_name(durability);
        let mut ratios = Vec::new();
        let mut rates: [Vec<f64>; 2] = Default::default();
        let mut cpu: [Vec<f64>; 2] = Default::default();
        for round_no in 0..PAIRS {
            let order = if round_no % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for subscribed in order {
                let mut held: Vec<Subscription> = Vec::new();
                let burn = timed_burn(durability, jobs, |queue, done| {
                    if subscribed {
                        held.push(queue.subscribe(DEFAULT_EVENT_BUFFER));
                    }
                    let pool = noop_pool(queue, 4, None, done);
                    if subscribed {
                        held.push(pool.subscribe(DEFAULT_EVENT_BUFFER));
                    }
                    pool
                });
                let dropped: Vec<u64> = held.iter().map(Subscription::dropped).collect();
                let rate = burn.jobs_per_s;
                emit(
                    json!({"scenario": "events", "durability": d, "round": round_no + 1,
                    "subscribers": if subscribed { "pool+queue, never read" } else { "none" },
                    "threads": 4, "settings": "default", "jobs": jobs, "finished": burn.finished,
                    "succeeded": burn.succeeded, "jobs_per_s": round(rate),
                    "cpu_ms_per_1000_jobs": round(burn.cpu_ms_per_1000_jobs),
                    "dropped": if subscribed { json!({"queue": dropped[0], "pool": dropped[1]}) } else { json!(null) }}),
                );
                assert_eq!(
                    burn.succeeded,
                    jobs as u64,
                    "events round {}: succeeded jobs",
                    round_no + 1
                );
                assert!(
                    dropped.iter().all(|&n| n > 0),
                    "events round {}: a subscriber that never reads was not full: dropped {dropped:?}",
                    round_no + 1
                );
                rates[usize::from(subscribed)].push(rate);
                cpu[usize::from(subscribed)].push(burn.cpu_ms_per_1000_jobs);
            }
            ratios.push(rates[1][round_no] / rates[0][round_no]);
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let [none, never_read] = rates;
        let [cpu_none, cpu_never_read] = cpu;
        emit(
            json!({"scenario": "events_summary", "durability": d, "rounds": PAIRS, "jobs": jobs,
            "median_jobs_per_s": {"none": round(median(none)), "never_read": round(median(never_read))},
            "median_cpu_ms_per_1000_jobs": {"none": round(median(cpu_none)), "never_read": round(median(cpu_never_read))},
            "median_ratio_b_to_a": (median(ratios) * 1000.0).round() / 1000.0, "target": ">= 0.95",
            "note": "B: a pool and a queue subscription of DEFAULT_EVENT_BUFFER, never read; A: none; each ratio is a pair's B round over its A round"}),
        );
    }
}

fn spawn_child(args: &[&str]) -> std::process::Child {
    Command::new(std::env::current_exe().expect("current exe"))
        .arg("--child")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child")
}

fn child_report(child: std::process::Child) -> Value {
    let out = child.wait_with_output().expect("child output");
    assert!(
        out.status.success(),
        "benchmark child failed: {}",
        out.status
    );
    serde_json::from_slice(&out.stdout).expect("child prints one JSON object")
}

/// `--child drain DB THREADS PREFETCH|default DURABILITY`: runs a no-op pool until
/// no open job is left, prints what it did.
fn child(args: &[String]) {
    let [what, db, threads, prefetch, durability] = args else {
        panic!("child: bad arguments {args:?}");
    };
    assert_eq!(what, "drain");
    let queue = Queue::builder(db)
        .sqlite(|o| o.durability(parse_durability(durability)))
        .open()
        .expect("child open");
    let done = Arc::new(AtomicUsize::new(0));
    let mut pool = noop_pool(
        &queue,
        threads.parse().expect("threads"),
        (prefetch != "default").then(|| prefetch.parse().expect("prefetch")),
        Arc::clone(&done),
    );
    while open_jobs(&queue) > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    pool.shutdown(Duration::from_secs(5));
    let waits = queue.ops().write_lock_waits();
    println!(
        "{}",
        json!({"jobs": done.load(Ordering::Relaxed),
            "write_waits": waits.count(),
            "lock_wait_ms": {"p50": ms(waits.percentile(0.5)), "p99.9": ms(waits.percentile(0.999)),
                             "max": ms(waits.max())},
            "peak_rss_kib": peak_rss_kib()})
    );
}

fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1e3 * 10.0) / 10.0
}

// ----------------------------------------------------------- steady state

#[derive(Default)]
struct Lateness {
    from_enqueue_ms: Vec<f64>,
    from_due_ms: Vec<f64>,
}

/// A pool that records lateness, built with no setting changed but its
/// thread count: the lateness users get.
fn timing_pool(queue: &Queue, threads: usize, late: Arc<Mutex<Lateness>>) -> WorkerPool {
    WorkerPool::builder(queue)
        .threads(threads)
        .handler("timed", move |ctx: &JobContext| {
            let now = chrono::Utc::now().timestamp_millis() as f64;
            let enqueued = ctx.payload()["enqueued_ms"].as_f64().unwrap_or(now);
            let due = ctx.lease().run_at.timestamp_millis() as f64;
            let mut late = late.lock().expect("lateness lock");
            if ctx.payload()["delayed"].as_bool() == Some(true) {
                late.from_due_ms.push(now - due);
            } else {
                late.from_enqueue_ms.push(now - enqueued);
            }
            Ok::<(), JobError>(())
        })
        .start()
        .expect("start pool")
}

fn steady(durability: Durability, rate: usize, secs: u64) {
    let d = durability_name(durability);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, queue) = fresh(&dir, durability);
    let late = Arc::new(Mutex::new(Lateness::default()));
    let cpu = cpu_time();
    let mut pool = timing_pool(&queue, 4, Arc::clone(&late));
    // Producers enqueue every 10 ms; half the jobs due at once, half 100 ms later.
    let per_tick = (rate / 100).max(1);
    let started = Instant::now();
    let mut tick = 0u64;
    let mut enqueued = 0usize;
    while started.elapsed() < Duration::from_secs(secs) {
        let now = chrono::Utc::now();
        let jobs: Vec<NewJob> = (0..per_tick)
            .map(|i| {
                let delayed = i % 2 == 1;
                let job = NewJob::new("timed")
                    .payload(json!({"enqueued_ms": now.timestamp_millis(), "delayed": delayed}));
                if delayed {
                    job.run_at(now + chrono::Duration::milliseconds(100))
                } else {
                    job
                }
            })
            .collect();
        enqueued += jobs.len();
        queue.enqueue_batch(jobs).expect("enqueue");
        tick += 1;
        let next = started + Duration::from_millis(10 * tick);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let until = Instant::now() + Duration::from_secs(60);
    while open_jobs(&queue) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    pool.shutdown(Duration::from_secs(5));
    let cpu = cpu_time() - cpu;
    let late = std::mem::take(&mut *late.lock().expect("lateness lock"));
    emit(
        json!({"scenario": "steady_state", "durability": d, "rate_per_s": rate, "seconds": secs,
        "threads": 4, "settings": "default", "jobs": enqueued,
        "enqueue_to_start_ms": percentiles_ms(late.from_enqueue_ms),
        "due_to_start_ms": percentiles_ms(late.from_due_ms),
        "cpu_ms_per_1000_jobs": round(cpu.as_secs_f64() * 1e6 / enqueued as f64),
        "note": "producer batches every 10 ms in the same process; half the jobs due 100 ms after enqueue"}),
    );
}

// ---------------------------------------------------------- reminder wake-up

fn wakeup(durability: Durability, n: usize, secs: u64) {
    let d = durability_name(durability);
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, queue) = fresh(&dir, durability);
    let start = chrono::Utc::now() + chrono::Duration::milliseconds(500);
    let span_ms = (secs * 1_000) as i64;
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            let at = start + chrono::Duration::milliseconds(i as i64 * span_ms / n as i64);
            NewJob::new("timed")
                .payload(json!({"delayed": true}))
                .run_at(at)
        })
        .collect();
    for chunk in jobs.chunks(1_000) {
        queue.enqueue_batch(chunk.to_vec()).expect("enqueue");
    }
    let late = Arc::new(Mutex::new(Lateness::default()));
    let mut pool = timing_pool(&queue, 4, Arc::clone(&late));
    let until = Instant::now() + Duration::from_secs(secs + 30);
    while open_jobs(&queue) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    pool.shutdown(Duration::from_secs(5));
    let late = std::mem::take(&mut *late.lock().expect("lateness lock"));
    emit(
        json!({"scenario": "reminder_wakeup", "durability": d, "jobs": n, "spread_s": secs,
        "threads": 4, "due_to_start_ms": percentiles_ms(late.from_due_ms)}),
    );
}

// ------------------------------------------------------------------ depth

/// `n` waiting jobs, 99 % of them due in the future, plus due jobs that
/// are claimed and completed one at a time: `measured` under `Normal`, then
/// `measured` more under `Full`, on the same file.
fn depth(n: usize, shape: &str, measured: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bench.db");
    drop(Queue::open(&path).expect("create"));
    let future = n * 99 / 100;
    let future_priority = if shape == "future_higher_priority" {
        10
    } else {
        0
    };
    {
        // Bulk load with SQL (the benchmark measures claims, not loading).
        let conn = Connection::open(&path).expect("open for load");
        conn.execute_batch("PRAGMA synchronous=OFF")
            .expect("pragma");
        let now = chrono::Utc::now().timestamp_millis();
        conn.execute(
            "WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?1)
             INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at, max_attempts, created_at)
             SELECT 'default', 'noop', 'null', 'scheduled', ?2, ?3 + 3600000 + i, 25, ?3 FROM seq",
            params![future as i64, future_priority, now],
        )
        .expect("load future jobs");
        conn.execute(
            "WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?1)
             INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at, max_attempts, created_at)
             SELECT 'default', 'noop', 'null', 'pending', 0, ?2 - i, 25, ?2 FROM seq",
            params![(2 * measured) as i64, now],
        )
        .expect("load due jobs");
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .expect("checkpoint");
    }
    for durability in [Durability::Normal, Durability::Full] {
        let queue = Queue::builder(&path)
            .sqlite(|o| o.durability(durability))
            .open()
            .expect("open");
        let started = Instant::now();
        let mut done = 0;
        while done < measured {
            let leases = queue
                .manual()
                .claim("default", "bench", 1, Duration::from_secs(60))
                .expect("claim");
            let Some(lease) = leases.first() else {
                break;
            };
            queue.manual().complete(lease).expect("complete");
            done += 1;
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / done.max(1) as f64;
        emit(
            json!({"scenario": "depth", "durability": durability_name(durability), "shape": shape,
            "waiting_jobs": n, "future_jobs": future, "claimed": done,
            "us_per_claim_complete": round(us),
            "note": "one claim (max 1) and one complete per job, single thread"}),
        );
    }
}

// --------------------------------------------------------------- fairness

fn fairness(n: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, queue) = fresh(&dir, Durability::Normal);
    fill(&queue, n);
    let started = Instant::now();
    let children: Vec<_> = (0..4)
        .map(|_| {
            spawn_child(&[
                "drain",
                path.to_str().expect("utf-8 path"),
                "2",
                "0",
                "normal",
            ])
        })
        .collect();
    let reports: Vec<Value> = children.into_iter().map(child_report).collect();
    let elapsed = started.elapsed();
    let shares: Vec<&Value> = reports.iter().map(|r| &r["jobs"]).collect();
    let waits: Vec<&Value> = reports.iter().map(|r| &r["lock_wait_ms"]).collect();
    emit(
        json!({"scenario": "fairness", "durability": "normal", "processes": 4, "threads": 2,
        "jobs": n, "per_process": shares, "even_share": n / 4,
        "write_lock_wait_ms_per_process": waits,
        "jobs_per_s": round(n as f64 / elapsed.as_secs_f64())}),
    );
}

// -------------------------------------------------------------- footprint

fn footprint(n: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, queue) = fresh(&dir, Durability::Normal);
    let empty = file_size(&path) + file_size(&wal_path(&path));
    fill(&queue, n);
    queue.ops().checkpoint().expect("checkpoint");
    let pending_bytes = file_size(&path).saturating_sub(empty) as f64 / n as f64;
    let child = spawn_child(&[
        "drain",
        path.to_str().expect("utf-8 path"),
        "4",
        "0",
        "normal",
    ]);
    let report = child_report(child);
    let wal_after = file_size(&wal_path(&path));
    queue.ops().checkpoint().expect("checkpoint");
    let finished_bytes = file_size(&path).saturating_sub(empty) as f64 / n as f64;
    emit(
        json!({"scenario": "footprint", "durability": "normal", "jobs": n,
        "bytes_per_pending_job": round(pending_bytes),
        "bytes_per_finished_job": round(finished_bytes),
        "peak_rss_mib_4_thread_pool": round(report["peak_rss_kib"].as_f64().unwrap_or(0.0) / 1024.0),
        "wal_bytes_after_burn_down": wal_after}),
    );
}

// ------------------------------------------------ PostgreSQL raw baselines

/// `--only async_burn`: the same 4-thread pool (default settings, no-op
/// handlers) burning down the same number of jobs with sync handlers and
/// with async handlers (each a task on a 2-worker tokio runtime while a
/// pool thread waits for it), alternated three times in one run, under
/// both durabilities. Needs `--features tokio`.
#[cfg(not(feature = "tokio"))]
fn async_burn(_jobs: usize) {
    eprintln!("# async_burn skipped: built without the `tokio` feature (cargo bench --features tokio --bench tickler_bench -- --only async_burn)");
}

#[cfg(feature = "tokio")]
fn async_burn(jobs: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("tokio runtime");
    for durability in [Durability::Normal, Durability::Full] {
        let d = durability_name(durability);
        for round_no in 0..3 {
            for handlers in ["sync", "async"] {
                let burn = timed_burn(durability, jobs, |queue, done| {
                    if handlers == "sync" {
                        return noop_pool(queue, 4, None, done);
                    }
                    WorkerPool::builder(queue)
                        .runtime(runtime.handle().clone())
                        .async_handler("noop", move |_: JobContext| {
                            let done = Arc::clone(&done);
                            async move {
                                done.fetch_add(1, Ordering::Relaxed);
                                Ok::<(), JobError>(())
                            }
                        })
                        .start()
                        .expect("start pool")
                });
                emit(
                    json!({"scenario": "async_burn", "durability": d, "round": round_no + 1,
                    "handlers": handlers, "settings": "default", "jobs": jobs, "finished": burn.finished,
                    "jobs_per_s": round(burn.jobs_per_s),
                    "cpu_ms_per_1000_jobs": round(burn.cpu_ms_per_1000_jobs)}),
                );
            }
        }
    }
}

#[cfg(not(feature = "tokio"))]
fn async_timers(_jobs: usize) {
    eprintln!("# async_timers skipped: built without the `tokio` feature (cargo bench --features tokio --bench tickler_bench -- --only async_timers)");
}

#[cfg(feature = "tokio")]
/// The OS threads of this process now (Linux), from /proc/self/status.
fn os_threads() -> Option<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// `--only async_timers`: `jobs` async jobs each awaiting a 1 s timer, on a
/// pool with default settings, against the same timers as plain tokio
/// tasks on the same runtime (the raw baseline: no queue at all), with the
/// most OS threads the process had beyond those it had before the pool
/// started (the runtime's own, the main thread).
#[cfg(feature = "tokio")]
fn async_timers(jobs: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("tokio runtime");
    let started = Instant::now();
    runtime.block_on(async {
        let timers: Vec<_> = (0..jobs)
            .map(|_| tokio::spawn(tokio::time::sleep(Duration::from_secs(1))))
            .collect();
        for timer in timers {
            timer.await.expect("a timer task");
        }
    });
    let raw = started.elapsed();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, queue) = fresh(&dir, Durability::Normal);
    fill(&queue, jobs);
    let before = os_threads();
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut pool = {
        let done = Arc::clone(&done);
        WorkerPool::builder(&queue)
            .runtime(runtime.handle().clone())
            .async_handler("noop", move |_: JobContext| {
                let done = Arc::clone(&done);
                async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), JobError>(())
                }
            })
            .start()
            .expect("start pool")
    };
    let mut most = before;
    let deadline = Instant::now() + Duration::from_secs(600);
    while done.load(Ordering::Relaxed) < jobs && Instant::now() < deadline {
        most = most.max(os_threads());
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed();
    let finished = done.load(Ordering::Relaxed) >= jobs;
    pool.shutdown(Duration::from_secs(5));
    emit(
        json!({"scenario": "async_timers", "settings": "default", "jobs": jobs,
        "timer_s": 1, "finished": finished,
        "seconds": round(elapsed.as_secs_f64()),
        "raw_tasks_seconds": round(raw.as_secs_f64()),
        "ratio_to_raw_tasks": round(elapsed.as_secs_f64() / raw.as_secs_f64()),
        "pool_os_threads": most.zip(before).map(|(m, b)| m - b),
        "note": "each job awaits a 1 s tokio timer; raw: the same timers as plain tasks on the same runtime; pool_os_threads: the most OS threads beyond those before the pool started"}),
    );
}

/// `--only pg_raw`: the raw PostgreSQL loops that the future engine's
/// figures are set against, on the server of
/// `TICKLER_BENCH_DATABASE_URL` (`.ci/postgres` starts a throwaway one).
/// Needs `--features postgres`.
#[cfg(not(feature = "postgres"))]
fn pg_raw(_quick: bool) {
    eprintln!("# pg_raw skipped: built without the `postgres` feature (cargo bench --features postgres --bench tickler_bench -- --only pg_raw)");
}

#[cfg(feature = "postgres")]
fn pg_raw(quick: bool) {
    pg_bench::raw(quick);
}

/// `--only pg`: tickler's PostgreSQL engine against the raw loops, in the
/// same run. Needs `--features postgres`.
#[cfg(not(feature = "postgres"))]
fn pg_engine(_quick: bool, _parts: &[String]) {
    eprintln!("# pg skipped: built without the `postgres` feature (cargo bench --features postgres --bench tickler_bench -- --only pg)");
}

#[cfg(feature = "postgres")]
fn pg_engine(quick: bool, parts: &[String]) {
    pg_bench::engine(quick, parts);
}

/// `--only pg_churn`: table and index size and burn-down over a long churn
/// with pruning. Needs `--features postgres`.
#[cfg(not(feature = "postgres"))]
fn pg_churn(_quick: bool) {
    eprintln!("# pg_churn skipped: built without the `postgres` feature");
}

#[cfg(feature = "postgres")]
fn pg_churn(quick: bool) {
    pg_bench::churn(quick);
}

/// A server URL (`postgres://…`, `mysql://…`) with its database name
/// replaced by `dbname`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn with_dbname(url: &str, dbname: &str) -> String {
    let scheme_end = url.find("://").expect("a server URL") + 3;
    let rest = &url[scheme_end..];
    let query_at = rest.find('?').unwrap_or(rest.len());
    let authority_end = rest[..query_at].find('/').unwrap_or(query_at);
    format!(
        "{}{}/{}{}",
        &url[..scheme_end],
        &rest[..authority_end],
        dbname,
        &rest[query_at..]
    )
}

/// `--only mysql`: tickler's MySQL engine against raw loops in the same
/// run. Needs `--features mysql`.
#[cfg(not(feature = "mysql"))]
fn mysql_engine(_quick: bool) {
    eprintln!("# mysql skipped: built without the `mysql` feature (cargo bench --features mysql --bench tickler_bench -- --only mysql)");
}

#[cfg(feature = "mysql")]
fn mysql_engine(quick: bool) {
    mysql_bench::engine(quick);
}

#[cfg(feature = "mysql")]
#[path = "engines/mysql.rs"]
mod mysql_bench;

#[path = "engines/pg_processes.rs"]
mod pg_processes;

#[path = "engines/waiting.rs"]
mod waiting;

#[cfg(feature = "postgres")]
mod pg_bench {
    use std::sync::{Arc, Barrier};
    use std::time::Instant;

    use postgres::{Client, NoTls};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;
    use tickler::{JobContext, JobError, NewJob, Queue, WorkerPool};

    use super::{emit, percentiles_ms, round, with_dbname};

    /// A table shaped like the engine's will be, with the partial index
    /// that a claim reads.
    pub(super) const TABLE: &str = "tickler_bench_pg_raw";

    const THREADS: usize = 4;
    const INSERT_THREADS: usize = 16;
    const BATCH: usize = 32;

    pub fn raw(quick: bool) {
        let Some(url) = server_url("pg_raw") else {
            return;
        };
        let (single, batched, inserts) = if quick {
            (2_000, 20_000, 4_000)
        } else {
            (20_000, 200_000, 40_000)
        };
        let mut client = connect(&url);
        let version: String = client
            .query_one("SELECT current_setting('server_version')", &[])
            .expect("server version")
            .get(0);
        let settings = "default";

        fresh_table(&mut client, single);
        let rate = claim_complete(&url, single);
        check_done(&mut client, single);
        emit(
            json!({"scenario": "pg_raw_claim_complete", "jobs": single, "threads": THREADS,
            "jobs_per_s": round(rate), "server_version": version, "server_settings": settings,
            "note": "per job: BEGIN; SELECT id .. FOR UPDATE SKIP LOCKED LIMIT 1; UPDATE .. SET status='running', run_token=..; COMMIT; then the completing UPDATE in its own transaction; one connection per thread"}),
        );

        fresh_table(&mut client, batched);
        let rate = claim_complete_batched(&url, batched);
        check_done(&mut client, batched);
        emit(
            json!({"scenario": "pg_raw_claim_complete_batched", "jobs": batched,
            "threads": THREADS, "batch": BATCH, "jobs_per_s": round(rate),
            "server_version": version, "server_settings": settings,
            "note": "one transaction per 32 jobs: completes the previous 32 (UPDATE .. WHERE id = ANY($1)) and claims the next 32 (UPDATE .. WHERE id = ANY(ARRAY(SELECT id .. FOR UPDATE SKIP LOCKED LIMIT 32)) RETURNING id); one connection per thread"}),
        );

        fresh_table(&mut client, 0);
        let rate = insert(&url, inserts);
        let n: i64 = client
            .query_one(&format!("SELECT count(*) FROM {TABLE}"), &[])
            .expect("count")
            .get(0);
        assert_eq!(n as usize, inserts, "inserted rows");
        emit(
            json!({"scenario": "pg_raw_insert_16_threads", "jobs": inserts,
            "threads": INSERT_THREADS, "jobs_per_s": round(rate),
            "server_version": version, "server_settings": settings,
            "note": "one single-row INSERT per transaction (autocommit); one connection per thread"}),
        );

        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {TABLE}"))
            .expect("drop table");
    }

    /// The server of the PostgreSQL scenarios, or `None` (said on stderr)
    /// when `TICKLER_BENCH_DATABASE_URL` is not set.
    pub(super) fn server_url(scenario: &str) -> Option<String> {
        let url = std::env::var("TICKLER_BENCH_DATABASE_URL")
            .ok()
            .filter(|u| !u.trim().is_empty());
        if url.is_none() {
            eprintln!(
                "# {scenario} skipped: TICKLER_BENCH_DATABASE_URL is not set \
                 (.ci/postgres cargo bench --features postgres --bench tickler_bench -- --only {scenario})"
            );
        }
        url
    }

    /// A fresh, empty database for one scenario; returns its URL.
    fn fresh_database(server: &str) -> String {
        fresh_database_named(server, "tickler_bench_engine")
    }

    /// A fresh, empty database `name`; returns its URL.
    pub(super) fn fresh_database_named(server: &str, name: &str) -> String {
        let mut admin = connect(server);
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .expect("drop database");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        with_dbname(server, name)
    }

    pub(super) fn fill(queue: &Queue, n: usize) {
        let mut left = n;
        while left > 0 {
            let chunk = left.min(5_000);
            queue
                .enqueue_batch((0..chunk).map(|_| NewJob::new("noop")).collect())
                .expect("fill");
            left -= chunk;
        }
    }

    fn noop_pool(queue: &Queue, threads: usize, done: &Arc<AtomicUsize>) -> WorkerPool {
        let done = Arc::clone(done);
        WorkerPool::builder(queue)
            .threads(threads)
            .handler("noop", move |_: &JobContext| {
                done.fetch_add(1, Ordering::Relaxed);
                Ok::<(), JobError>(())
            })
            .start()
            .expect("start pool")
    }

    fn wait_for(counter: &AtomicUsize, n: usize) {
        let until = Instant::now() + Duration::from_secs(600);
        while counter.load(Ordering::Relaxed) < n {
            assert!(Instant::now() < until, "bench did not finish");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn engine(quick: bool, parts: &[String]) {
        let want = |part: &str| parts.iter().any(|p| p == "all" || p == part);
        let Some(server) = server_url("pg") else {
            return;
        };
        let (burn, inserts, wakeups) = if quick {
            (20_000, 4_000, 100)
        } else {
            (200_000, 40_000, 500)
        };
        let depths: &[usize] = if quick {
            &[1_000, 100_000]
        } else {
            &[1_000, 100_000, 1_000_000]
        };
        let mut client = connect(&server);
        let version: String = client
            .query_one("SELECT current_setting('server_version')", &[])
            .expect("server version")
            .get(0);

        // The raw baselines, in this run.
        let (mut raw_batched, mut raw_insert) = (f64::NAN, f64::NAN);
        if want("burn") {
            fresh_table(&mut client, burn);
            raw_batched = claim_complete_batched(&server, burn);
            check_done(&mut client, burn);
        }
        if want("enqueue") {
            fresh_table(&mut client, 0);
            raw_insert = insert(&server, inserts);
        }
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {TABLE}"))
            .expect("drop table");
        emit(
            json!({"scenario": "pg_raw_baselines", "server_version": version,
            "claim_complete_batched_4_threads": round(raw_batched),
            "insert_16_threads": round(raw_insert)}),
        );

        // Burn-down of no-op jobs, 4 threads, default settings.
        if want("burn") {
            let url = fresh_database(&server);
            let queue = Queue::open(&url).expect("open");
            fill(&queue, burn);
            let done = Arc::new(AtomicUsize::new(0));
            let started = Instant::now();
            let mut pool = noop_pool(&queue, THREADS, &done);
            wait_for(&done, burn);
            let rate = burn as f64 / started.elapsed().as_secs_f64();
            pool.shutdown(Duration::from_secs(5));
            emit(
                json!({"scenario": "pg_burn_down", "threads": THREADS, "settings": "default",
            "jobs": burn, "jobs_per_s": round(rate),
            "ratio_to_raw_batched": round(rate / raw_batched), "target": 0.7}),
            );
            drop(queue);
        }
        // Single enqueues from 16 threads, on a pool of as many
        // connections as the raw loop has (the default pool is 10).
        if want("enqueue") {
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
                        let mine =
                            inserts / INSERT_THREADS + usize::from(t < inserts % INSERT_THREADS);
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
            emit(json!({"scenario": "pg_enqueue_16_threads", "jobs": inserts,
            "jobs_per_s": round(rate), "ratio_to_raw_insert": round(rate / raw_insert),
            "target": 0.8, "settings": "max_connections(17)"}));
            drop(queue);
        }
        // Wake-up: a job enqueued through another Queue (its own
        // connections, no in-process wake-up: as another process) starts
        // on an idle pool.
        if want("wakeup") {
            let url = fresh_database(&server);
            let worker = Queue::builder(&url)
                .postgres(|o| o.fallback_poll(Duration::from_secs(30)))
                .open()
                .expect("open");
            let started_at: Arc<Mutex<Vec<Instant>>> = Arc::default();
            let seen = Arc::clone(&started_at);
            let mut pool = WorkerPool::builder(&worker)
                .threads(1)
                .max_idle(Duration::from_secs(30))
                .handler("tick", move |_: &JobContext| {
                    seen.lock().unwrap().push(Instant::now());
                    Ok::<(), JobError>(())
                })
                .start()
                .expect("start pool");
            std::thread::sleep(Duration::from_millis(500));
            let producer = Queue::open(&url).expect("open");
            let mut latencies = Vec::new();
            for i in 0..wakeups {
                let asked = Instant::now();
                producer.enqueue(NewJob::new("tick")).expect("enqueue");
                let until = Instant::now() + Duration::from_secs(10);
                while started_at.lock().unwrap().len() <= i {
                    assert!(Instant::now() < until, "wake-up never came");
                    std::thread::sleep(Duration::from_micros(200));
                }
                let start = started_at.lock().unwrap()[i];
                latencies.push((start - asked).as_secs_f64() * 1e3);
                std::thread::sleep(Duration::from_millis(20));
            }
            pool.shutdown(Duration::from_secs(5));
            emit(json!({"scenario": "pg_wakeup_other_queue", "jobs": wakeups,
            "enqueue_to_start_ms": percentiles_ms(latencies), "target_p99_ms": 10,
            "note": "enqueue call (commit included) to handler start; producer and pool on separate Queue handles (separate connections, wake-up by NOTIFY), same process"}));
            drop((worker, producer));
        }
        if !want("depth") {
            return;
        }
        // Claim cost by depth, also with 99 % of the jobs in the future at
        // a higher priority, also under generic plans.
        let jit = jit_settings(&mut client);
        emit(
            json!({"scenario": "pg_jit", "jit_available": jit.available, "jit": jit.on,
            "jit_above_cost": jit.above_cost,
            "note": "the server's JIT as a new session sees it; tickler's sessions set jit = off"}),
        );
        for generic in [false, true] {
            for shape in ["due", "future_99"] {
                for &n in depths {
                    let url = fresh_database(&server);
                    let url = if generic {
                        let join = if url.contains('?') { '&' } else { '?' };
                        format!("{url}{join}options=-c%20plan_cache_mode%3Dforce_generic_plan")
                    } else {
                        url
                    };
                    let queue = Queue::open(&url).expect("open");
                    let mut c = connect(&url);
                    let (due, future) = if shape == "due" {
                        (n, 0)
                    } else {
                        (n / 100, n - n / 100)
                    };
                    c.execute(
                        "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
                             max_attempts, created_at)
                         SELECT 'default', 'noop', 'null', 'pending', 0, i, 25, 0
                         FROM generate_series(1, $1::bigint) AS i",
                        &[&(due as i64)],
                    )
                    .expect("fill due");
                    c.execute(
                        "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
                             max_attempts, created_at)
                         SELECT 'default', 'noop', 'null', 'scheduled', 10,
                                253402300000000 - i, 25, 0
                         FROM generate_series(1, $1::bigint) AS i",
                        &[&(future as i64)],
                    )
                    .expect("fill future");
                    c.batch_execute("VACUUM ANALYZE tickler_jobs")
                        .expect("vacuum");
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
                    // The claim's estimated cost, as tickler prepared it:
                    // a cost that grows with the table is what crossed
                    // the JIT thresholds (the timing above would not show
                    // it, since tickler's sessions turn JIT off).
                    let claim_costs = claim_plan_costs(&queue, &mut c);
                    // The same shape of claim as tickler's before its pause
                    // check named the queue (a correlated NOT EXISTS), on
                    // a session with the server's JIT settings: this row
                    // must grow with the depth, or the run could not see a
                    // plan that does.
                    let (old_ms, old_cost) = if generic {
                        (None, None)
                    } else {
                        let (ms, cost) = correlated_claim(&mut c);
                        (Some(round(ms)), Some(round(cost)))
                    };
                    emit(json!({"scenario": "pg_depth", "shape": shape, "waiting": n,
                        "generic_plans": generic, "claim_and_complete_us": round(us),
                        "claim_generic_plan_cost_by_limit": claim_costs,
                        "jit_above_cost": jit.above_cost,
                        "sensitivity_correlated_claim_ms": old_ms,
                        "sensitivity_correlated_claim_cost": old_cost}));
                }
            }
        }
    }

    /// What the server does with JIT, as a new session sees it.
    struct Jit {
        available: bool,
        on: String,
        above_cost: f64,
    }

    fn jit_settings(c: &mut Client) -> Jit {
        let r = c
            .query_one(
                "SELECT pg_jit_available(), current_setting('jit'),
                        current_setting('jit_above_cost')::float8",
                &[],
            )
            .expect("jit settings");
        Jit {
            available: r.get(0),
            on: r.get(1),
            above_cost: r.get(2),
        }
    }

    /// The estimated costs of the generic plans of tickler's claiming
    /// statements, by their `LIMIT` (a size up to 64 is written into the
    /// statement, a larger one is `$5`), read as tickler sent them from
    /// `pg_prepared_statements` on its own connections (through
    /// `complete_with`, a few times to reach each of the pool's), and
    /// planned on `c`.
    fn claim_plan_costs(
        queue: &Queue,
        c: &mut Client,
    ) -> serde_json::Map<String, serde_json::Value> {
        // Due jobs for claims of the sizes a pool asks for (a size up to
        // 64 is written into its statement, a larger one is a parameter).
        fill(queue, 3 * (1 + 32 + 512) + 64);
        let mut found = std::collections::BTreeMap::new();
        for size in [1, 32, 512].repeat(3) {
            let mut leases = queue
                .manual()
                .claim("default", "bench", size, Duration::from_secs(60))
                .expect("claim");
            let Some(lease) = leases.pop() else { break };
            for other in &leases {
                queue.manual().complete(other).expect("complete");
            }
            let rows = queue
                .complete_with(&lease, |tx: &mut tickler::postgres::Transaction| {
                    Ok(tx.query(
                        "SELECT statement, parameter_types::text[] FROM pg_prepared_statements
                         WHERE NOT from_sql AND statement LIKE '%SKIP LOCKED%'
                           AND statement LIKE '%SET status = ''running''%'",
                        &[],
                    )?)
                })
                .expect("complete_with");
            for row in rows {
                found.insert(row.get::<_, String>(0), row.get::<_, Vec<String>>(1));
            }
        }
        c.batch_execute("SET plan_cache_mode = force_generic_plan")
            .expect("set");
        let mut costs = serde_json::Map::new();
        for (sql, types) in found {
            let limit = sql
                .split("LIMIT ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_owned();
            c.batch_execute(&format!(
                "PREPARE tickler_claim ({}) AS {sql}",
                types.join(", ")
            ))
            .expect("prepare");
            let cost = plan_cost(
                c,
                &format!(
                    "EXECUTE tickler_claim({})",
                    vec!["NULL"; types.len()].join(", ")
                ),
            );
            c.batch_execute("DEALLOCATE tickler_claim")
                .expect("deallocate");
            costs.insert(limit, json!(round(cost)));
        }
        c.batch_execute("RESET plan_cache_mode").expect("reset");
        costs
    }

    /// The estimated total cost of `sql`'s plan on `c`.
    fn plan_cost(c: &mut impl postgres::GenericClient, sql: &str) -> f64 {
        // As text: the column is of type json.
        let text = c
            .simple_query(&format!("EXPLAIN (FORMAT JSON) {sql}"))
            .expect("explain")
            .into_iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            })
            .expect("a plan");
        let plan: serde_json::Value = serde_json::from_str(&text).expect("json");
        plan[0]["Plan"]["Total Cost"].as_f64().expect("cost")
    }

    /// One run of the locking read of tickler's claim as it was before its
    /// pause check named the queue (correlated with each row, which the
    /// planner took to leave one row in a thousand), for 32 jobs, on `c`
    /// with the server's JIT settings, rolled back: its time in ms and its
    /// estimated cost.
    fn correlated_claim(c: &mut Client) -> (f64, f64) {
        const SQL: &str = "SELECT id FROM tickler_jobs AS job
             WHERE status = 'pending' AND queue = 'default'
               AND (job.unique_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM tickler_jobs AS stopping
                    WHERE stopping.unique_key = job.unique_key
                      AND stopping.status IN ('cancelled', 'dead')
                      AND stopping.lease_expires_at >= 0))
               AND NOT EXISTS (SELECT 1 FROM tickler_paused_queues AS paused
                               WHERE paused.queue = job.queue)
             ORDER BY priority, run_at, id LIMIT 32 FOR UPDATE SKIP LOCKED";
        let mut tx = c.transaction().expect("begin");
        let cost = plan_cost(&mut tx, SQL);
        let started = Instant::now();
        let rows = tx.query(SQL, &[]).expect("correlated claim");
        let ms = started.elapsed().as_secs_f64() * 1e3;
        assert!(!rows.is_empty(), "the correlated claim found due jobs");
        tx.rollback().expect("rollback");
        (ms, cost)
    }

    /// Table plus index bytes of the jobs table, and its dead tuples.
    fn jobs_size(client: &mut Client) -> (i64, i64) {
        let r = client
            .query_one(
                "SELECT pg_total_relation_size('tickler_jobs'),
                        coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                                  WHERE relname = 'tickler_jobs'), 0)",
                &[],
            )
            .expect("size");
        (r.get(0), r.get(1))
    }

    /// Burns `total` no-op jobs through a 4-thread pool while a producer
    /// keeps about 10,000 waiting and finished jobs are pruned once a
    /// second; reports size and rate at the first `window` jobs and at the
    /// last.
    pub fn churn(quick: bool) {
        let Some(server) = server_url("pg_churn") else {
            return;
        };
        let (total, window) = if quick {
            (200_000, 20_000)
        } else {
            (2_000_000, 100_000)
        };
        let url = fresh_database(&server);
        let queue = Queue::open(&url).expect("open");
        let mut client = connect(&url);
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let producer = {
            let (queue, done, stop) = (queue.clone(), Arc::clone(&done), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut enqueued = 0usize;
                while enqueued < total && !stop.load(Ordering::Relaxed) {
                    if enqueued - done.load(Ordering::Relaxed) > 10_000 {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    let n = 1_000.min(total - enqueued);
                    queue
                        .enqueue_batch((0..n).map(|_| NewJob::new("noop")).collect())
                        .expect("enqueue");
                    enqueued += n;
                }
            })
        };
        let pruner = {
            let (queue, stop) = (queue.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    let cutoff = queue.clock().now() - chrono::Duration::seconds(1);
                    queue.prune(cutoff).expect("prune");
                }
            })
        };
        let mut pool = noop_pool(&queue, THREADS, &done);
        let started = Instant::now();
        wait_for(&done, window);
        let first_rate = window as f64 / started.elapsed().as_secs_f64();
        let (first_size, first_dead) = jobs_size(&mut client);
        let mut samples =
            vec![json!({"done": window, "bytes": first_size, "dead_tuples": first_dead})];
        let mut next = window * 5;
        let mut last_mark = (Instant::now(), window);
        let mut last_rate = first_rate;
        while next <= total {
            wait_for(&done, next);
            let (bytes, dead) = jobs_size(&mut client);
            samples.push(json!({"done": next, "bytes": bytes, "dead_tuples": dead}));
            let elapsed = last_mark.0.elapsed().as_secs_f64();
            last_rate = (next - last_mark.1) as f64 / elapsed;
            last_mark = (Instant::now(), next);
            next += window * 5;
        }
        wait_for(&done, total);
        stop.store(true, Ordering::Relaxed);
        producer.join().expect("producer");
        pruner.join().expect("pruner");
        pool.shutdown(Duration::from_secs(5));
        let (end_size, end_dead) = jobs_size(&mut client);
        let autovacuums: i64 = client
            .query_one(
                "SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'tickler_jobs'",
                &[],
            )
            .map(|r| r.get(0))
            .unwrap_or(-1);
        emit(
            json!({"scenario": "pg_churn", "jobs": total, "threads": THREADS,
            "first_window_jobs": window, "bytes_after_first_window": first_size,
            "bytes_at_end": end_size, "dead_tuples_at_end": end_dead,
            "size_ratio": round(end_size as f64 / first_size as f64), "target_size_ratio": 2,
            "jobs_per_s_first_window": round(first_rate), "jobs_per_s_last_window": round(last_rate),
            "rate_ratio": round(last_rate / first_rate), "target_rate_ratio": 0.8,
            "autovacuum_runs": autovacuums, "samples": samples,
            "note": "a producer keeps ~10,000 jobs waiting; finished jobs pruned once a second (those finished over 1 s before); server defaults but the table's own autovacuum settings (schema.sql)"}),
        );
    }

    fn connect(url: &str) -> Client {
        Client::connect(url, NoTls).unwrap_or_else(|e| panic!("connect to {url}: {e}"))
    }

    /// A new table holding `n` due pending jobs, vacuumed and analyzed.
    pub(super) fn fresh_table(client: &mut Client, n: usize) {
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {TABLE};
                 CREATE TABLE {TABLE} (
                     id bigserial PRIMARY KEY,
                     queue text NOT NULL,
                     kind text NOT NULL,
                     payload jsonb NOT NULL,
                     status text NOT NULL,
                     priority integer NOT NULL DEFAULT 0,
                     run_at timestamptz NOT NULL,
                     attempts integer NOT NULL DEFAULT 0,
                     max_attempts integer NOT NULL DEFAULT 25,
                     run_token uuid,
                     claimed_by text,
                     lease_expires_at timestamptz,
                     finished_at timestamptz
                 );
                 CREATE INDEX {TABLE}_pending ON {TABLE} (queue, priority DESC, run_at, id)
                     WHERE status = 'pending';"
            ))
            .expect("create table");
        client
            .execute(
                &format!(
                    "INSERT INTO {TABLE} (queue, kind, payload, status, priority, run_at)
                     SELECT 'default', 'noop', 'null', 'pending', 0,
                            now() - interval '1 hour' + i * interval '1 millisecond'
                     FROM generate_series(1, $1::bigint) AS i"
                ),
                &[&(n as i64)],
            )
            .expect("load jobs");
        client
            .batch_execute(&format!("VACUUM ANALYZE {TABLE}"))
            .expect("vacuum");
    }

    pub(super) fn check_done(client: &mut Client, n: usize) {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FROM {TABLE}"
                ),
                &[],
            )
            .expect("count");
        let (done, all): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(
            (done as usize, all as usize),
            (n, n),
            "every job completed once"
        );
    }

    /// Runs `work` on `threads` threads, each with its own connection,
    /// from one start line; returns the seconds from start to the last end.
    fn on_threads<F>(url: &str, threads: usize, work: F) -> f64
    where
        F: Fn(usize, &mut Client) + Send + Sync + 'static,
    {
        let work = Arc::new(work);
        let start = Arc::new(Barrier::new(threads + 1));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mut client = connect(url);
                let (work, start) = (Arc::clone(&work), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    work(t, &mut client);
                })
            })
            .collect();
        start.wait();
        let started = Instant::now();
        for h in handles {
            h.join().expect("bench thread");
        }
        started.elapsed().as_secs_f64()
    }

    fn claim_complete(url: &str, n: usize) -> f64 {
        let secs = on_threads(url, THREADS, |t, client| {
            let select = client
                .prepare(&format!(
                    "SELECT id FROM {TABLE}
                     WHERE status = 'pending' AND queue = $1 AND run_at <= now()
                     ORDER BY priority DESC, run_at, id
                     LIMIT 1 FOR UPDATE SKIP LOCKED"
                ))
                .expect("prepare");
            let claim = client
                .prepare(&format!(
                    "UPDATE {TABLE} SET status = 'running', run_token = gen_random_uuid(),
                         attempts = attempts + 1, claimed_by = $2,
                         lease_expires_at = now() + interval '60 seconds'
                     WHERE id = $1"
                ))
                .expect("prepare");
            let complete = client
                .prepare(&format!(
                    "UPDATE {TABLE} SET status = 'succeeded', finished_at = now()
                     WHERE id = $1 AND status = 'running'"
                ))
                .expect("prepare");
            let me = format!("raw-{t}");
            loop {
                let mut tx = client.transaction().expect("begin");
                let Some(row) = tx.query_opt(&select, &[&"default"]).expect("select") else {
                    tx.commit().expect("commit");
                    break;
                };
                let id: i64 = row.get(0);
                tx.execute(&claim, &[&id, &me]).expect("claim");
                tx.commit().expect("commit");
                let done = client.execute(&complete, &[&id]).expect("complete");
                assert_eq!(done, 1, "completed job {id}");
            }
        });
        n as f64 / secs
    }

    pub(super) fn claim_complete_batched(url: &str, n: usize) -> f64 {
        let secs = on_threads(url, THREADS, |t, client| {
            let claim = client
                .prepare(&format!(
                    "UPDATE {TABLE} SET status = 'running', run_token = gen_random_uuid(),
                         attempts = attempts + 1, claimed_by = $2,
                         lease_expires_at = now() + interval '60 seconds'
                     WHERE id = ANY(ARRAY(
                         SELECT id FROM {TABLE}
                         WHERE status = 'pending' AND queue = $1 AND run_at <= now()
                         ORDER BY priority DESC, run_at, id
                         LIMIT {BATCH} FOR UPDATE SKIP LOCKED))
                     RETURNING id"
                ))
                .expect("prepare");
            let complete = client
                .prepare(&format!(
                    "UPDATE {TABLE} SET status = 'succeeded', finished_at = now()
                     WHERE id = ANY($1) AND status = 'running'"
                ))
                .expect("prepare");
            let me = format!("raw-{t}");
            let mut claimed: Vec<i64> = Vec::with_capacity(BATCH);
            loop {
                let mut tx = client.transaction().expect("begin");
                if !claimed.is_empty() {
                    let done = tx.execute(&complete, &[&claimed]).expect("complete");
                    assert_eq!(done as usize, claimed.len(), "completed batch");
                }
                claimed = tx
                    .query(&claim, &[&"default", &me])
                    .expect("claim")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                tx.commit().expect("commit");
                if claimed.is_empty() {
                    break;
                }
            }
        });
        n as f64 / secs
    }

    fn insert(url: &str, n: usize) -> f64 {
        let secs = on_threads(url, INSERT_THREADS, move |t, client| {
            let insert = client
                .prepare(&format!(
                    "INSERT INTO {TABLE} (queue, kind, payload, status, priority, run_at)
                     VALUES ($1, 'noop', 'null', 'pending', 0, now())"
                ))
                .expect("prepare");
            let mine = n / INSERT_THREADS + usize::from(t < n % INSERT_THREADS);
            for _ in 0..mine {
                client.execute(&insert, &[&"default"]).expect("insert");
            }
        });
        n as f64 / secs
    }
}

/// `--only dashboard`: how long `tickler serve` takes to answer `GET /` (the
/// dashboard page), `GET /metrics` and `GET /api/summary` (the live
/// refresh's read) for a file of `jobs` jobs in every state (mostly
/// succeeded, three queues), filled with one INSERT … SELECT. Median of 11
/// requests of each after one warm-up, measured by the client on loopback.
fn dashboard(jobs: u64) {
    use std::io::{BufRead, BufReader, Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dash.db");
    drop(Queue::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    let started = Instant::now();
    dashboard_fill::fill(&conn, jobs).unwrap();
    let fill_s = started.elapsed().as_secs_f64();
    drop(conn);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tickler"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("TICKLER_DB", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    let fetch = |path: &str| {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        body
    };
    let get = |path: &str| {
        let t = Instant::now();
        let body = fetch(path);
        (t.elapsed().as_secs_f64() * 1000.0, body.len())
    };
    let timed = |path: &str| {
        get(path);
        let mut times: Vec<f64> = Vec::new();
        let mut bytes = 0;
        for _ in 0..11 {
            let (ms, b) = get(path);
            times.push(ms);
            bytes = b;
        }
        times.sort_by(f64::total_cmp);
        (times[times.len() / 2], times[times.len() - 1], bytes)
    };
    let (page_median, page_max, page_bytes) = timed("/");
    let (metrics_median, metrics_max, _) = timed("/metrics");
    // The pages of /jobs: a filtered list's first page, one half-way
    // through its state (past the cursor of a job in the middle of the
    // file), and the page of one dead job.
    let queue = Queue::open(&path).unwrap();
    let middle = queue.get(tickler::JobId(jobs as i64 / 2 + 50)).unwrap();
    let dead = queue.get(tickler::JobId(jobs as i64 / 2)).unwrap();
    assert_eq!(
        (middle.state, dead.state),
        (tickler::JobState::Succeeded, tickler::JobState::Dead)
    );
    let filtered = format!(
        "/jobs?state=succeeded&queue={}&kind={}",
        middle.queue, middle.kind
    );
    // Full pages: the filters leave 1 job in 21 of the state's index.
    let rows = |path: &str| fetch(path).matches("<tr data-id=").count();
    let (list_median, list_max, _) = timed(&filtered);
    let deep = format!("{filtered}&after={}", tickler::JobCursor::after(&middle));
    let (deep_median, deep_max, _) = timed(&deep);
    let (job_median, job_max, _) = timed(&format!("/jobs/{}", dead.id));
    assert_eq!((rows(&filtered), rows(&deep)), (50, 50));
    // What the live refresh reads every 2 s (counts, marks and the plot).
    let (summary_median, summary_max, _) = timed("/api/summary");
    let _ = child.kill();
    let _ = child.wait();
    emit(
        json!({"scenario": "dashboard", "jobs": jobs, "fill_s": round(fill_s),
        "page_ms_median": round(page_median), "page_ms_max": round(page_max),
        "page_bytes": page_bytes, "target_ms": 200,
        "metrics_ms_median": round(metrics_median), "metrics_ms_max": round(metrics_max),
        "list_ms_median": round(list_median), "list_ms_max": round(list_max),
        "deep_list_ms_median": round(deep_median), "deep_list_ms_max": round(deep_max),
        "job_ms_median": round(job_median), "job_ms_max": round(job_max),
        "summary_ms_median": round(summary_median), "summary_ms_max": round(summary_max),
        "note": "GET /, /metrics, /api/summary, /jobs filtered by state, queue and kind (first page, and a page past the cursor of a job half-way through the file), /jobs/ID of a dead job; tickler serve, median of 11 each after a warm-up, timed by a client on loopback"}),
    );
}
