//! `--only pg_processes`: more machines. For 1, 2, 4, 8 and 16 worker
//! processes of 4 threads each (this program re-executed as
//! `--child pg_worker URL INDEX THREADS`, each opening its own `Queue` on
//! one database made for that count and running a `WorkerPool` with default
//! settings and no-op handlers) against one PostgreSQL server
//! (`TICKLER_BENCH_DATABASE_URL`, as `--only pg`):
//!
//! 1. throughput: N no-op jobs are enqueued (not timed), the processes
//!    start their pools at one signal, and the parent times the drain by
//!    looking every 20 ms, on a connection of its own, whether an open job
//!    is left;
//! 2. lateness: with a fresh set of the same processes idle, a producer in
//!    the parent (its own `Queue`, 4 threads taking turns) enqueues jobs
//!    due at exact times 1 s ahead, at a steady rate, each carrying its due
//!    time and when it was sent; each handler records its start minus the
//!    due time (and minus the later of due and sent: what is left when the
//!    producer fell behind), and the parent merges the figures;
//! 3. connections: the server's connections of the workers (told apart from
//!    the parent's by their `application_name`), sampled during both phases.
//!
//! Due times are set from the producer's system clock and judged by the
//! server's clock: on one machine these are one clock.
//!
//! `TICKLER_BENCH_PROCESSES=1,16` runs only those counts.
//!
//! Also in the same run: the raw 32-per-transaction `SKIP LOCKED` loop of
//! `pg_raw` with 4 threads, the scaling baseline. Children end on a `stop`
//! line, on the end of their standard input (the parent is gone), or after
//! 30 minutes.

// Also recorded, for what limits the curve: what the workers' active
// sessions wait for (pg_stat_activity samples), how many entries of the
// claim's index each scan read, the machine's busy CPU share.

#[cfg(not(feature = "postgres"))]
pub fn run(_quick: bool) {
    eprintln!(
        "# pg_processes skipped: built without the `postgres` feature \
         (.ci/postgres cargo bench --features postgres --bench tickler_bench -- --only pg_processes)"
    );
}

#[cfg(not(feature = "postgres"))]
pub fn child(_args: &[String]) {
    panic!("pg_worker child: built without the `postgres` feature");
}

#[cfg(feature = "postgres")]
pub use imp::{child, run};

#[cfg(feature = "postgres")]
mod imp {
    use std::collections::{BTreeMap, HashMap};
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{Receiver, RecvTimeoutError};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use postgres::{Client, NoTls};
    use serde_json::{json, Value};
    use tickler::{JobContext, JobError, NewJob, Queue, WorkerPool};

    use crate::pg_bench;
    use crate::{cpu_time, emit, percentiles_ms, round};

    /// Worker processes per round.
    const PROCESSES: [usize; 5] = [1, 2, 4, 8, 16];
    /// Threads of each process's pool.
    const THREADS: usize = 4;
    /// The workers' connections carry this `application_name` and their
    /// index; the parent's do not.
    const APP: &str = "tickler_bench_worker_";
    /// How far ahead of its turn a lateness job is due.
    const LEAD_MS: i64 = 1_000;
    /// Threads enqueueing the lateness jobs, in turn.
    const PRODUCERS: usize = 4;
    /// The longest a child lives, whatever happens to its parent.
    const CHILD_LIMIT: Duration = Duration::from_secs(30 * 60);
    /// The longest the parent waits for a drain or for a child's line.
    const DRAIN_LIMIT: Duration = Duration::from_secs(600);
    const LINE_LIMIT: Duration = Duration::from_secs(60);

    struct Sizes {
        jobs: usize,
        rate: usize,
        secs: usize,
    }

    pub fn run(quick: bool) {
        let Some(server) = pg_bench::server_url("pg_processes") else {
            return;
        };
        let sizes = if quick {
            Sizes {
                jobs: 20_000,
                rate: 500,
                secs: 2,
            }
        } else {
            Sizes {
                jobs: 100_000,
                rate: 500,
                secs: 10,
            }
        };
        let mut admin = connect(&server);
        let version: String = admin
            .query_one("SELECT current_setting('server_version')", &[])
            .expect("server version")
            .get(0);
        let max_connections: String = admin
            .query_one("SELECT current_setting('max_connections')", &[])
            .expect("max_connections")
            .get(0);

        // The raw baseline: pg_raw's batched loop, 4 threads, one process.
        pg_bench::fresh_table(&mut admin, sizes.jobs);
        let raw = pg_bench::claim_complete_batched(&server, sizes.jobs);
        pg_bench::check_done(&mut admin, sizes.jobs);
        admin
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", pg_bench::TABLE))
            .expect("drop table");
        emit(
            json!({"scenario": "pg_processes_raw_baseline", "jobs": sizes.jobs,
            "threads": THREADS, "batch": 32, "jobs_per_s": round(raw),
            "server_version": version,
            "note": "pg_raw's claim_complete_batched: one transaction per 32 jobs (complete the previous 32, claim the next 32 with FOR UPDATE SKIP LOCKED), one connection per thread, one process"}),
        );

        // TICKLER_BENCH_PROCESSES=16 (or 1,4): only those counts.
        let counts: Vec<usize> = std::env::var("TICKLER_BENCH_PROCESSES")
            .ok()
            .map(|v| {
                v.split(',')
                    .map(|n| n.trim().parse().expect("TICKLER_BENCH_PROCESSES: counts"))
                    .collect()
            })
            .unwrap_or_else(|| PROCESSES.to_vec());
        for p in counts {
            one_count(&server, p, &sizes, raw, &version, &max_connections);
        }
    }

    /// One round: `p` processes on a database of their own.
    fn one_count(
        server: &str,
        p: usize,
        sizes: &Sizes,
        raw: f64,
        version: &str,
        max_connections: &str,
    ) {
        let name = format!("tickler_bench_processes_{p}");
        let url = pg_bench::fresh_database_named(server, &name);
        let producer = Queue::open(&url).expect("open");
        let mut watch = connect(&url);

        // 1. Throughput.
        pg_bench::fill(&producer, sizes.jobs);
        let mut workers = Workers::start(&url, p);
        phase(p, "drain");
        let mut conns = Connections::default();
        let mut waits: BTreeMap<String, u64> = BTreeMap::new();
        let cpu_before = machine_cpu();
        workers.go();
        let started = Instant::now();
        let mut polls = 0u64;
        while open_jobs(&mut watch) {
            assert!(started.elapsed() < DRAIN_LIMIT, "the drain did not end");
            if polls.is_multiple_of(5) {
                conns.sample(&mut watch, Some(&mut waits));
            }
            polls += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        let drain = started.elapsed().as_secs_f64();
        let cpu_busy = machine_cpu().busy_since(&cpu_before);
        let reports = workers.stop();
        let noop: u64 = reports
            .iter()
            .map(|r| r["noop"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(noop as usize, sizes.jobs, "each no-op job ran once");
        let worker_cpu_s: f64 = reports
            .iter()
            .map(|r| r["cpu_s"].as_f64().unwrap_or(0.0))
            .sum();
        // The workers' sessions flush their statistics as they end.
        wait_gone(&mut watch);
        let index = pending_index_reads(&mut watch);
        let rate = sizes.jobs as f64 / drain;

        // 2. Lateness, on a fresh set of the same processes, idle.
        let mut workers = Workers::start(&url, p);
        workers.go();
        std::thread::sleep(Duration::from_millis(500));
        phase(p, "lateness");
        let total = sizes.rate * sizes.secs;
        let cpu_before = machine_cpu();
        let (behind, calls) = produce(&producer, sizes, &mut || {
            conns.sample(&mut watch, None);
        });
        let until = Instant::now() + Duration::from_secs(60);
        while open_jobs(&mut watch) {
            assert!(Instant::now() < until, "the due jobs did not all run");
            conns.sample(&mut watch, None);
            std::thread::sleep(Duration::from_millis(100));
        }
        let late_cpu_busy = machine_cpu().busy_since(&cpu_before);
        let enqueue_ms = percentiles_ms(calls);
        let reports = workers.stop();
        let merged = |field: &str| -> Vec<f64> {
            reports
                .iter()
                .flat_map(|r| r[field].as_array().cloned().unwrap_or_default())
                .filter_map(|v| v.as_f64())
                .collect()
        };
        let late = merged("late_ms");
        let late_sent = merged("late_after_send_ms");
        assert_eq!(late.len(), total, "each due job ran once");
        let row = watch
            .query_one(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FROM tickler_jobs",
                &[],
            )
            .expect("count");
        let (succeeded, all): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(
            (succeeded as usize, all as usize),
            (sizes.jobs + total, sizes.jobs + total),
            "every job succeeded"
        );

        emit(json!({"scenario": "pg_processes", "processes": p,
            "threads_per_process": THREADS, "settings": "default", "jobs": sizes.jobs,
            "jobs_per_s": round(rate), "ratio_to_raw_batched": (rate / raw * 100.0).round() / 100.0,
            "lateness_jobs": total, "lateness_rate_per_s": sizes.rate, "lead_ms": LEAD_MS,
            "producer_threads": PRODUCERS,
            "lateness_ms": percentiles_ms(late), "enqueued_at_or_after_due": behind,
            "lateness_after_due_and_enqueue_ms": percentiles_ms(late_sent),
            "connections_total": conns.total_peak,
            "connections_per_process": conns.per_process_peak(),
            "server_max_connections": max_connections,
            "drain_s": round(drain), "machine_cpu_busy_during_drain": (cpu_busy * 100.0).round() / 100.0,
            "machine_cpu_busy_during_lateness": (late_cpu_busy * 100.0).round() / 100.0,
            "enqueue_call_ms": enqueue_ms,
            "worker_cpu_s_during_drain": round(worker_cpu_s),
            "drain_active_wait_samples": waits,
            "pending_index_during_drain": index,
            "server_version": version,
            "note": "children of this program, each a Queue and a default 4-thread WorkerPool; drain timed by the parent (20 ms looks); lateness: handler start minus due time, due times set by the producer's clock and judged by the server's, one machine; connections: the workers' sessions in pg_stat_activity (application_name), peak over samples"}));

        drop(producer);
        drop(watch);
        connect(server)
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .expect("drop database");
    }

    /// Enqueues `rate × secs` jobs due at exact times, `LEAD_MS` after their
    /// turn, from [`PRODUCERS`] threads in turn (so that one slow enqueue
    /// does not hold back the next); `meanwhile` runs about every 100 ms.
    /// Returns how many were enqueued at or after their due time, and each
    /// enqueue call's milliseconds.
    fn produce(producer: &Queue, sizes: &Sizes, meanwhile: &mut dyn FnMut()) -> (usize, Vec<f64>) {
        let total = sizes.rate * sizes.secs;
        let begin = Instant::now();
        let begin_ms = chrono::Utc::now().timestamp_millis();
        let rate = sizes.rate as u64;
        let threads: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                let producer = producer.clone();
                std::thread::spawn(move || {
                    let mut behind = 0usize;
                    let mut calls = Vec::new();
                    for i in (t..total).step_by(PRODUCERS) {
                        let offset_us = (i as u64) * 1_000_000 / rate;
                        let send_at = begin + Duration::from_micros(offset_us);
                        let now = Instant::now();
                        if send_at > now {
                            std::thread::sleep(send_at - now);
                        }
                        let due_ms = begin_ms + (offset_us / 1_000) as i64 + LEAD_MS;
                        let sent_ms = chrono::Utc::now().timestamp_micros() as f64 / 1e3;
                        if sent_ms >= due_ms as f64 {
                            behind += 1;
                        }
                        let due = chrono::DateTime::from_timestamp_millis(due_ms).expect("due");
                        let call = Instant::now();
                        producer
                            .enqueue(
                                NewJob::new("due")
                                    .run_at(due)
                                    .payload(json!({"due_ms": due_ms, "sent_ms": sent_ms})),
                            )
                            .expect("enqueue");
                        calls.push(call.elapsed().as_secs_f64() * 1e3);
                    }
                    (behind, calls)
                })
            })
            .collect();
        while !threads.iter().all(|t| t.is_finished()) {
            meanwhile();
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut behind = 0;
        let mut calls = Vec::with_capacity(total);
        for t in threads {
            let (b, c) = t.join().expect("producer thread");
            behind += b;
            calls.extend(c);
        }
        (behind, calls)
    }

    /// A progress line on stderr, with the time (to line up with what the
    /// server records).
    fn phase(p: usize, what: &str) {
        let at = chrono::Utc::now().format("%H:%M:%S%.3f");
        eprintln!("# pg_processes: {p} processes, {what} from {at}");
    }

    fn connect(url: &str) -> Client {
        Client::connect(url, NoTls).unwrap_or_else(|e| panic!("connect to {url}: {e}"))
    }

    /// Whether a job is still to run (cheap: a look at the head of the
    /// partial indexes).
    fn open_jobs(client: &mut Client) -> bool {
        client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM tickler_jobs WHERE status = 'pending')
                     OR EXISTS (SELECT 1 FROM tickler_jobs WHERE status = 'running')
                     OR EXISTS (SELECT 1 FROM tickler_jobs WHERE status = 'scheduled')",
                &[],
            )
            .expect("open jobs")
            .get(0)
    }

    /// Waits (at most 10 s) until no worker session is left.
    fn wait_gone(client: &mut Client) {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name LIKE $1",
                    &[&format!("{APP}%")],
                )
                .expect("sessions")
                .get(0);
            if n == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Scans of the claim's partial indexes and the entries they read per
    /// scan (dead and locked ones included): how far past the head of the
    /// index each poller had to go. Includes the pollers' `next_due` looks
    /// and the parent's 20 ms ones.
    fn pending_index_reads(client: &mut Client) -> Value {
        let row = client
            .query_one(
                "SELECT coalesce(sum(idx_scan), 0)::bigint, coalesce(sum(idx_tup_read), 0)::bigint
                 FROM pg_stat_user_indexes
                 WHERE indexrelname IN ('tickler_jobs_pending', 'tickler_jobs_pending_age')",
                &[],
            )
            .expect("index statistics");
        let (scans, read): (i64, i64) = (row.get(0), row.get(1));
        json!({"scans": scans, "entries_read": read,
            "entries_read_per_scan": round(read as f64 / scans.max(1) as f64)})
    }

    /// Peaks of the workers' server sessions.
    #[derive(Default)]
    struct Connections {
        total_peak: i64,
        per_process: HashMap<String, i64>,
    }

    impl Connections {
        /// One look at `pg_stat_activity`; with `waits`, also tallies what
        /// the workers' active sessions wait for (`CPU` when nothing).
        fn sample(&mut self, client: &mut Client, waits: Option<&mut BTreeMap<String, u64>>) {
            let rows = client
                .query(
                    "SELECT application_name, state,
                            coalesce(wait_event_type || ':' || wait_event, 'CPU')
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name LIKE $1",
                    &[&format!("{APP}%")],
                )
                .expect("pg_stat_activity");
            self.total_peak = self.total_peak.max(rows.len() as i64);
            let mut now: HashMap<String, i64> = HashMap::new();
            for r in &rows {
                *now.entry(r.get(0)).or_default() += 1;
            }
            for (app, n) in now {
                let peak = self.per_process.entry(app).or_default();
                *peak = (*peak).max(n);
            }
            if let Some(waits) = waits {
                for r in &rows {
                    let state: Option<String> = r.get(1);
                    if state.as_deref() == Some("active") {
                        *waits.entry(r.get(2)).or_default() += 1;
                    }
                }
            }
        }

        fn per_process_peak(&self) -> Value {
            let peaks = self.per_process.values();
            json!({"min": peaks.clone().min(), "max": peaks.max()})
        }
    }

    /// The machine's CPU counters (/proc/stat): busy and all jiffies.
    struct MachineCpu(u64, u64);

    fn machine_cpu() -> MachineCpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let all: u64 = fields.iter().sum();
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        MachineCpu(all - idle, all)
    }

    impl MachineCpu {
        /// The busy share of all CPUs since `before`.
        fn busy_since(&self, before: &MachineCpu) -> f64 {
            let all = self.1.saturating_sub(before.1).max(1);
            self.0.saturating_sub(before.0) as f64 / all as f64
        }
    }

    /// The worker processes of one phase. Dropped, it kills and reaps any
    /// still running.
    struct Workers {
        children: Vec<Child>,
        stdins: Vec<ChildStdin>,
        lines: Vec<Receiver<String>>,
    }

    impl Workers {
        /// Starts `p` children and waits until each has opened its queue.
        fn start(url: &str, p: usize) -> Workers {
            let exe = std::env::current_exe().expect("current exe");
            let mut workers = Workers {
                children: Vec::new(),
                stdins: Vec::new(),
                lines: Vec::new(),
            };
            for i in 0..p {
                let mut child = Command::new(&exe)
                    .args([
                        "--child",
                        "pg_worker",
                        url,
                        &i.to_string(),
                        &THREADS.to_string(),
                    ])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn worker");
                let stdin = child.stdin.take().expect("stdin");
                let stdout = child.stdout.take().expect("stdout");
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                });
                workers.children.push(child);
                workers.stdins.push(stdin);
                workers.lines.push(rx);
            }
            for i in 0..p {
                let line = workers.line(i);
                assert_eq!(line, "ready", "worker {i}");
            }
            workers
        }

        fn line(&self, i: usize) -> String {
            match self.lines[i].recv_timeout(LINE_LIMIT) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("worker {i} said nothing for {LINE_LIMIT:?}")
                }
                Err(RecvTimeoutError::Disconnected) => panic!("worker {i} ended early"),
            }
        }

        fn say(&mut self, what: &str) {
            for stdin in &mut self.stdins {
                writeln!(stdin, "{what}").expect("tell worker");
                stdin.flush().expect("tell worker");
            }
        }

        fn go(&mut self) {
            self.say("go");
        }

        /// Stops every pool; returns each child's report.
        fn stop(mut self) -> Vec<Value> {
            self.say("stop");
            let reports = (0..self.children.len())
                .map(|i| serde_json::from_str(&self.line(i)).expect("a worker's JSON report"))
                .collect();
            let until = Instant::now() + Duration::from_secs(10);
            for child in &mut self.children {
                loop {
                    match child.try_wait().expect("wait worker") {
                        Some(status) => {
                            assert!(status.success(), "worker failed: {status}");
                            break;
                        }
                        None if Instant::now() > until => {
                            let _ = child.kill();
                            panic!("a worker did not end after its report");
                        }
                        None => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            }
            reports
        }
    }

    impl Drop for Workers {
        fn drop(&mut self) {
            self.stdins.clear();
            for child in &mut self.children {
                if let Ok(None) = child.try_wait() {
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
        }
    }

    /// `--child pg_worker URL INDEX THREADS`: opens a `Queue`, says `ready`,
    /// starts a default pool (`noop` counts, `due` records its lateness) on
    /// `go`, and on `stop` shuts it down and prints one JSON report. Ends at
    /// once when its standard input ends (the parent is gone).
    pub fn child(args: &[String]) {
        let [url, index, threads] = args else {
            panic!("pg_worker child: bad arguments {args:?}");
        };
        std::thread::spawn(|| {
            std::thread::sleep(CHILD_LIMIT);
            eprintln!("pg_worker child: still running after {CHILD_LIMIT:?}, ending");
            std::process::exit(4);
        });
        let join = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{join}application_name={APP}{index}");
        let queue = Queue::open(&url).expect("worker open");
        // Connected before the start line.
        queue.count(tickler::JobState::Pending).expect("count");
        let done = Arc::new(AtomicUsize::new(0));
        let late = Arc::new(Mutex::new(Vec::<(f64, f64)>::new()));
        let mut stdin = std::io::stdin().lock().lines();
        let mut next_line = move || match stdin.next() {
            Some(Ok(line)) => line,
            _ => std::process::exit(3),
        };
        println!("ready");
        std::io::stdout().flush().expect("stdout");
        assert_eq!(next_line(), "go");
        let cpu_at_go = cpu_time();
        let mut pool = {
            let (done, late) = (Arc::clone(&done), Arc::clone(&late));
            WorkerPool::builder(&queue)
                .threads(threads.parse().expect("threads"))
                .handler("noop", move |_: &JobContext| {
                    done.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), JobError>(())
                })
                .handler("due", move |ctx: &JobContext| {
                    let now = chrono::Utc::now().timestamp_micros() as f64 / 1e3;
                    let due = ctx.payload()["due_ms"].as_f64().unwrap_or(now);
                    let sent = ctx.payload()["sent_ms"].as_f64().unwrap_or(due);
                    late.lock()
                        .expect("lateness")
                        .push((now - due, now - due.max(sent)));
                    Ok::<(), JobError>(())
                })
                .start()
                .expect("start pool")
        };
        assert_eq!(next_line(), "stop");
        pool.shutdown(Duration::from_secs(5));
        let cpu_s = (cpu_time() - cpu_at_go).as_secs_f64();
        let late = std::mem::take(&mut *late.lock().expect("lateness"));
        let (from_due, after_send): (Vec<f64>, Vec<f64>) = late.into_iter().unzip();
        println!(
            "{}",
            json!({"noop": done.load(Ordering::Relaxed), "late_ms": from_due,
                "late_after_send_ms": after_send, "cpu_s": cpu_s})
        );
        std::io::stdout().flush().expect("stdout");
    }
}
