//! The transactional outbox, on one SQLite file, under `kill -9`.
//!
//! ```text
//! cargo run --release --example outbox [-- DB_PATH] [--orders N] [--kills K] [--seed S]
//! ```
//!
//! A small shop keeps its own `orders` table in the same file as its jobs.
//!
//! - **Placing an order** inserts the order and enqueues its
//!   `confirm_order` job in one transaction (`Queue::enqueue_tx` on a
//!   connection from `Queue::open_connection`): an order never exists
//!   without its job, nor a job without its order.
//! - **Confirming an order** (the job's handler) marks the order confirmed,
//!   adds one to its `confirmations` counter and completes the job in one
//!   transaction (`JobContext::complete_with`): the handler checks nothing
//!   ("is it already confirmed?"), yet no order is confirmed twice, because
//!   a run whose completion did not commit left no write behind, and a run
//!   whose lease was lost gets `LeaseLost` and writes nothing.
//!
//! This program is the supervisor. It starts copies of itself: one producer
//! placing orders and two worker processes (pools of 4 threads) confirming
//! them, and SIGKILLs one of them, or all, at random moments, restarting each
//! one it killed. Then it lets everything drain and checks the file: no
//! order without its job, no job without its order, no confirmed order
//! whose job is not succeeded (nor the reverse), every order confirmed
//! exactly once (`confirmations = 1`) by the run that completed its job. It
//! prints a summary and exits non-zero on any violation.
//!
//! `--no-tx` runs the same shop the classic way, to show what the checks
//! catch: the order commits and then the job is enqueued, the handler's
//! update commits and then the pool records the completion. A kill in either
//! gap leaves an order without its job or confirms an order twice (how often
//! depends on where the kills land; raise `--kills`).
//!
//! With no DB_PATH it works in a temporary directory; a given DB_PATH must
//! not exist yet. Effects outside the file (an e-mail to the customer) would
//! still be at-least-once: key them by the job id or run_token.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use rusqlite::{params, OptionalExtension, TransactionBehavior};
use tickler::{Error, JobContext, JobError, NewJob, Queue, ReaperConfig, RetryPolicy, WorkerPool};

const CONFIRM: &str = "confirm_order";
const LEASE: Duration = Duration::from_millis(1000);
const WORKERS: usize = 2;
const THREADS: usize = 4;

const ORDERS_DDL: &str = "CREATE TABLE IF NOT EXISTS orders (
    id              INTEGER PRIMARY KEY,
    customer        TEXT    NOT NULL,
    amount_cents    INTEGER NOT NULL,
    job_id          INTEGER NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'placed' CHECK (status IN ('placed', 'confirmed')),
    confirmations   INTEGER NOT NULL DEFAULT 0,
    confirmed_by    TEXT,
    confirmed_token TEXT
)";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("--producer") => match (args.get(1), args.get(2).and_then(|n| n.parse().ok())) {
            (Some(db), Some(total)) => {
                run_producer(Path::new(db), total, transactional(&args)).map(|()| true)
            }
            _ => Err("usage: outbox --producer DB TOTAL [tx|no-tx]".into()),
        },
        Some("--worker") => match (args.get(1), args.get(2)) {
            (Some(db), Some(stop)) => {
                run_worker(Path::new(db), Path::new(stop), transactional(&args)).map(|()| true)
            }
            _ => Err("usage: outbox --worker DB STOP_FILE [tx|no-tx]".into()),
        },
        _ => parse_args(&args).and_then(|s| supervise(&s)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("outbox: {e}");
            ExitCode::from(2)
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A child's last argument: `no-tx` for the shop without shared transactions.
fn transactional(args: &[String]) -> bool {
    args.get(3).map(String::as_str) != Some("no-tx")
}

// ------------------------------------------------------------------ the app

/// Places orders `max(id) + 1 ..= total`, each with its job, in one
/// transaction each. Restarted after a kill, it goes on where the file says.
fn run_producer(db: &Path, total: i64, transactional: bool) -> AnyResult<()> {
    let queue = Queue::open(db)?;
    let mut conn = queue.open_connection()?;
    let mut next: i64 = conn.query_row("SELECT coalesce(max(id), 0) + 1 FROM orders", [], |r| {
        r.get(0)
    })?;
    while next <= total {
        if !transactional {
            place_without_tx(&queue, &conn, next)?;
            next += 1;
            std::thread::sleep(Duration::from_micros(fastrand::u64(0..1500)));
            continue;
        }
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let job = queue.enqueue_tx(
            &tx,
            NewJob::new(CONFIRM)
                .payload(serde_json::json!({ "order_id": next }))
                .max_attempts(1000),
        )?;
        tx.execute(
            "INSERT INTO orders (id, customer, amount_cents, job_id) VALUES (?1, ?2, ?3, ?4)",
            params![
                next,
                format!("customer-{}", next % 97),
                fastrand::i64(100..100_000),
                job.0
            ],
        )?;
        tx.commit()?;
        next += 1;
        // A shop takes orders over time, not all at once.
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..1500)));
    }
    Ok(())
}

/// `--no-tx`: the classic gap. The order commits, then the job is
/// enqueued; a crash in between leaves an order without its job.
fn place_without_tx(queue: &Queue, conn: &rusqlite::Connection, id: i64) -> AnyResult<()> {
    conn.execute(
        "INSERT INTO orders (id, customer, amount_cents, job_id) VALUES (?1, ?2, ?3, 0)",
        params![
            id,
            format!("customer-{}", id % 97),
            fastrand::i64(100..100_000)
        ],
    )?;
    let job = queue.enqueue(
        NewJob::new(CONFIRM)
            .payload(serde_json::json!({ "order_id": id }))
            .max_attempts(1000),
    )?;
    conn.execute("UPDATE orders SET job_id = ?1 WHERE id = ?2", [job.0, id])?;
    Ok(())
}

/// A worker pool confirming orders, until the stop file appears.
fn run_worker(db: &Path, stop: &Path, transactional: bool) -> AnyResult<()> {
    let queue = Queue::builder(db)
        .retry_policy(RetryPolicy {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(500),
            jitter: true,
        })
        .open()?;
    let worker = format!("pid{}", std::process::id());
    let mut pool = WorkerPool::builder(&queue)
        .threads(THREADS)
        .lease(LEASE)
        .reaper(ReaperConfig {
            interval: Duration::from_millis(200),
            ..ReaperConfig::default()
        })
        .handler(CONFIRM, move |ctx: &JobContext| {
            if transactional {
                confirm(ctx, &worker)
            } else {
                confirm_without_tx(ctx, &worker)
            }
        })
        .start()?;
    while !stop.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    pool.shutdown(Duration::from_secs(5));
    Ok(())
}

/// The handler: marks the order confirmed and completes the job, together.
/// Deliberately not idempotent on its own (`confirmations + 1`, no check of
/// the current status): exactly-once comes from the shared transaction.
fn confirm(ctx: &JobContext, worker: &str) -> Result<(), JobError> {
    let order_id = ctx.payload()["order_id"]
        .as_i64()
        .ok_or_else(|| JobError::permanent(format!("bad payload {}", ctx.payload())))?;
    // Some work before the transaction (asking the payment service, say).
    std::thread::sleep(Duration::from_millis(fastrand::u64(2..20)));
    ctx.complete_with(|tx: &tickler::rusqlite::Transaction| {
        let changed = tx.execute(
            "UPDATE orders SET status = 'confirmed', confirmations = confirmations + 1,
                 confirmed_by = ?1, confirmed_token = ?2
             WHERE id = ?3",
            params![worker, ctx.run_token().0, order_id],
        )?;
        if changed != 1 {
            return Err(Error::aborted(format!("order {order_id} does not exist")));
        }
        // Now and then some more work inside the transaction, so that some
        // kills land while it is open.
        if fastrand::u8(..5) == 0 {
            std::thread::sleep(Duration::from_micros(fastrand::u64(0..1000)));
        }
        Ok(())
    })?;
    Ok(())
}

/// `--no-tx`: the other gap. The order update commits on its own, the pool
/// records the completion afterwards; a crash in between runs the job
/// again and confirms the order twice.
fn confirm_without_tx(ctx: &JobContext, worker: &str) -> Result<(), JobError> {
    thread_local! {
        static CONN: std::cell::RefCell<Option<rusqlite::Connection>> = const {
            std::cell::RefCell::new(None)
        };
    }
    let order_id = ctx.payload()["order_id"]
        .as_i64()
        .ok_or_else(|| JobError::permanent(format!("bad payload {}", ctx.payload())))?;
    std::thread::sleep(Duration::from_millis(fastrand::u64(2..20)));
    CONN.with(|cell| -> Result<(), JobError> {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(ctx.queue().open_connection()?);
        }
        let conn = cell.as_ref().expect("connection just opened");
        conn.execute(
            "UPDATE orders SET status = 'confirmed', confirmations = confirmations + 1,
                 confirmed_by = ?1, confirmed_token = ?2
             WHERE id = ?3",
            params![worker, ctx.run_token().0, order_id],
        )?;
        Ok(())
    })
}

// --------------------------------------------------------------- supervisor

struct Settings {
    db: Option<PathBuf>,
    orders: i64,
    kills: usize,
    seed: u64,
    transactional: bool,
}

fn parse_args(args: &[String]) -> AnyResult<Settings> {
    let mut settings = Settings {
        db: None,
        orders: 2000,
        kills: 10,
        seed: fastrand::u64(..),
        transactional: true,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .cloned()
        };
        match arg.as_str() {
            "--orders" => settings.orders = value("--orders")?.parse()?,
            "--kills" => settings.kills = value("--kills")?.parse()?,
            "--seed" => settings.seed = value("--seed")?.parse()?,
            "--no-tx" => settings.transactional = false,
            flag if flag.starts_with("--") => {
                return Err(format!(
                    "unknown option {flag}\nusage: outbox [DB_PATH] [--orders N] [--kills K] [--seed S] [--no-tx]"
                )
                .into())
            }
            path => settings.db = Some(PathBuf::from(path)),
        }
    }
    if settings.orders < 1 {
        return Err("--orders must be at least 1".into());
    }
    Ok(settings)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Producer,
    Worker(usize),
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Producer => write!(f, "producer"),
            Role::Worker(i) => write!(f, "worker-{i}"),
        }
    }
}

struct Fleet {
    exe: PathBuf,
    db: PathBuf,
    stop: PathBuf,
    orders: i64,
    transactional: bool,
    producer: Option<Child>,
    producer_done: bool,
    workers: Vec<Child>,
    started: Instant,
    /// Jobs the killed workers were running when they died.
    killed_holding: i64,
}

impl Fleet {
    fn spawn(&self, role: Role) -> AnyResult<Child> {
        let mut cmd = Command::new(&self.exe);
        match role {
            Role::Producer => cmd
                .arg("--producer")
                .arg(&self.db)
                .arg(self.orders.to_string()),
            Role::Worker(_) => cmd.arg("--worker").arg(&self.db).arg(&self.stop),
        };
        cmd.arg(if self.transactional { "tx" } else { "no-tx" });
        Ok(cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn()?)
    }

    fn child(&mut self, role: Role) -> Option<&mut Child> {
        match role {
            Role::Producer => self.producer.as_mut(),
            Role::Worker(i) => self.workers.get_mut(i),
        }
    }

    /// Notes a producer that finished; fails on any child that exited on
    /// its own with an error.
    fn check_exits(&mut self) -> AnyResult<()> {
        if let Some(p) = self.producer.as_mut() {
            if let Some(status) = p.try_wait()? {
                if !status.success() {
                    return Err(format!("the producer failed: {status}").into());
                }
                self.producer = None;
                self.producer_done = true;
                self.say(format_args!("producer placed all {} orders", self.orders));
            }
        }
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(status) = w.try_wait()? {
                return Err(format!("worker-{i} exited on its own: {status}").into());
            }
        }
        Ok(())
    }

    fn kill_and_restart(&mut self, role: Role) -> AnyResult<bool> {
        let Some(child) = self.child(role) else {
            return Ok(false);
        };
        let pid = child.id();
        child.kill()?;
        let status = child.wait()?;
        if status.success() {
            // It finished just before the signal: nothing was killed.
            if role == Role::Producer {
                self.producer = None;
                self.producer_done = true;
            }
            return Ok(false);
        }
        // Its running jobs stay claimed by it until their leases run out.
        let held: i64 = rusqlite::Connection::open(&self.db)?.query_row(
            "SELECT count(*) FROM tickler_jobs WHERE status = 'running' AND claimed_by LIKE ?1",
            [format!("pid{pid}-%")],
            |r| r.get(0),
        )?;
        self.killed_holding += held;
        match role {
            Role::Producer => self.say(format_args!("kill -9 {role} (pid {pid})")),
            Role::Worker(_) => self.say(format_args!(
                "kill -9 {role} (pid {pid}) while it ran {held} job(s)"
            )),
        }
        let fresh = self.spawn(role)?;
        match role {
            Role::Producer => self.producer = Some(fresh),
            Role::Worker(i) => self.workers[i] = fresh,
        }
        Ok(true)
    }

    fn say(&self, what: std::fmt::Arguments<'_>) {
        println!("  {:>6.2} s  {what}", self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in self.producer.iter_mut().chain(self.workers.iter_mut()) {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn supervise(settings: &Settings) -> AnyResult<bool> {
    let temp;
    let db = match &settings.db {
        Some(path) => {
            if path.exists() {
                return Err(format!(
                    "{} exists; give a path that does not exist yet",
                    path.display()
                )
                .into());
            }
            path.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().join("outbox.db")
        }
    };
    let stop = PathBuf::from(format!("{}.stop", db.display()));
    let _ = std::fs::remove_file(&stop);
    fastrand::seed(settings.seed);
    println!(
        "outbox: {} orders, {} kills, seed {}, file {}{}",
        settings.orders,
        settings.kills,
        settings.seed,
        db.display(),
        if settings.transactional {
            ""
        } else {
            "\n        --no-tx: order and job in separate transactions, on purpose"
        }
    );

    let queue = Queue::open(&db)?;
    queue.open_connection()?.execute_batch(ORDERS_DDL)?;

    let mut fleet = Fleet {
        exe: std::env::current_exe()?,
        db: db.clone(),
        stop: stop.clone(),
        orders: settings.orders,
        transactional: settings.transactional,
        producer: None,
        producer_done: false,
        workers: Vec::new(),
        started: Instant::now(),
        killed_holding: 0,
    };
    fleet.producer = Some(fleet.spawn(Role::Producer)?);
    for i in 0..WORKERS {
        let w = fleet.spawn(Role::Worker(i))?;
        fleet.workers.push(w);
    }
    fleet.say(format_args!(
        "started the producer and {WORKERS} worker processes ({THREADS} threads each)"
    ));

    // Kill at random moments: one process, or every one at once.
    let (mut producer_kills, mut worker_kills, mut total_kills) = (0usize, 0usize, 0usize);
    for _ in 0..settings.kills {
        let pause = Instant::now() + Duration::from_millis(fastrand::u64(150..900));
        while Instant::now() < pause {
            fleet.check_exits()?;
            std::thread::sleep(Duration::from_millis(5));
        }
        let victims: Vec<Role> = match fastrand::usize(..5) {
            0 => std::iter::once(Role::Producer)
                .chain((0..WORKERS).map(Role::Worker))
                .collect(),
            1 => vec![Role::Producer],
            _ => vec![Role::Worker(fastrand::usize(..WORKERS))],
        };
        for role in victims {
            if fleet.kill_and_restart(role)? {
                total_kills += 1;
                match role {
                    Role::Producer => producer_kills += 1,
                    Role::Worker(_) => worker_kills += 1,
                }
            }
        }
    }

    // Drain: the producer finishes, the workers confirm the rest.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        fleet.check_exits()?;
        let left: i64 = queue.open_connection()?.query_row(
            "SELECT (SELECT count(*) FROM orders WHERE status <> 'confirmed')
                  + (SELECT ? - count(*) FROM orders)",
            [settings.orders],
            |r| r.get(0),
        )?;
        // Every job finished (with --no-tx, orders without a job stay
        // unconfirmed; the checks below report them).
        if fleet.producer_done && queue.ops().unfinished(&["default"], None)? == 0 {
            break;
        }
        if Instant::now() > deadline {
            println!("drain did not finish within 120 s ({left} orders left)");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    fleet.say(format_args!("drained; stopping the workers"));
    std::fs::File::create(&stop)?;
    let stop_deadline = Instant::now() + Duration::from_secs(15);
    for (i, w) in fleet.workers.iter_mut().enumerate() {
        loop {
            if let Some(status) = w.try_wait()? {
                if !status.success() {
                    return Err(format!("worker-{i} failed on shutdown: {status}").into());
                }
                break;
            }
            if Instant::now() > stop_deadline {
                return Err(format!("worker-{i} did not stop").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let elapsed = fleet.started.elapsed();
    let killed_holding = fleet.killed_holding;
    drop(fleet);
    let _ = std::fs::remove_file(&stop);

    let report = check(&queue, settings.orders)?;
    println!();
    println!("summary");
    println!("  orders placed                     {}", report.orders);
    println!(
        "  kill -9                           {total_kills} ({producer_kills} producer, {worker_kills} worker)"
    );
    println!("  jobs running in killed workers    {killed_holding}");
    println!(
        "  jobs run again after a kill       {} (most attempts on one job: {})",
        report.rerun, report.max_attempts
    );
    println!(
        "  elapsed                           {:.1} s",
        elapsed.as_secs_f64()
    );
    println!();
    let mut ok = true;
    for (what, n, examples) in &report.checks {
        let mark = if *n == 0 { "ok  " } else { "FAIL" };
        if *n == 0 {
            println!("  {mark} {what}");
        } else {
            ok = false;
            println!("  {mark} {what}: {n} violation(s), e.g. orders/jobs {examples:?}");
        }
    }
    println!();
    println!(
        "{}",
        if ok {
            "outbox: every order has its job and was confirmed exactly once"
        } else {
            "outbox: VIOLATIONS FOUND"
        }
    );
    Ok(ok)
}

struct Report {
    orders: i64,
    rerun: i64,
    max_attempts: i64,
    /// (what is checked, violations, a few example ids)
    checks: Vec<(&'static str, i64, Vec<i64>)>,
}

fn check(queue: &Queue, expected: i64) -> AnyResult<Report> {
    let conn = queue.open_connection()?;
    let ids = |sql: &str| -> AnyResult<(i64, Vec<i64>)> {
        let found: Vec<i64> = conn
            .prepare(sql)?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok((found.len() as i64, found.into_iter().take(5).collect()))
    };
    let mut checks = Vec::new();
    let mut add = |what, sql: &str| -> AnyResult<()> {
        let (n, examples) = ids(sql)?;
        checks.push((what, n, examples));
        Ok(())
    };
    add(
        "no order without its job",
        "SELECT o.id FROM orders o LEFT JOIN tickler_jobs j ON j.id = o.job_id
         WHERE j.id IS NULL OR j.kind <> 'confirm_order'
            OR json_extract(j.payload, '$.order_id') <> o.id",
    )?;
    add(
        "no job without its order",
        "SELECT j.id FROM tickler_jobs j
         WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.job_id = j.id)",
    )?;
    add(
        "no confirmed order whose job is not succeeded",
        "SELECT o.id FROM orders o JOIN tickler_jobs j ON j.id = o.job_id
         WHERE o.status = 'confirmed' AND j.status <> 'succeeded'",
    )?;
    add(
        "no succeeded job whose order is not confirmed",
        "SELECT o.id FROM orders o JOIN tickler_jobs j ON j.id = o.job_id
         WHERE j.status = 'succeeded' AND o.status <> 'confirmed'",
    )?;
    add(
        "no order confirmed twice (confirmations = 1 for every confirmed order)",
        "SELECT id FROM orders WHERE status = 'confirmed' AND confirmations <> 1",
    )?;
    add(
        "each order confirmed by the run that completed its job (same run_token)",
        "SELECT o.id FROM orders o JOIN tickler_jobs j ON j.id = o.job_id
         WHERE o.status = 'confirmed' AND o.confirmed_token IS NOT j.run_token",
    )?;
    add(
        "every order confirmed at the end",
        "SELECT id FROM orders WHERE status <> 'confirmed' OR confirmations <> 1",
    )?;
    add(
        "no job left unfinished, dead or cancelled",
        "SELECT id FROM tickler_jobs WHERE status <> 'succeeded'",
    )?;
    let (orders, max_id): (i64, Option<i64>) =
        conn.query_row("SELECT count(*), max(id) FROM orders", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let missing = if orders == expected && max_id == Some(expected) {
        0
    } else {
        (expected - orders).abs().max(1)
    };
    checks.push((
        "all orders placed, ids 1..=N without gaps",
        missing,
        Vec::new(),
    ));
    let (rerun, max_attempts): (i64, Option<i64>) = conn.query_row(
        "SELECT count(*) FILTER (WHERE attempts > 1), max(attempts) FROM tickler_jobs",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let integrity: Option<String> = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .optional()?;
    checks.push((
        "integrity_check ok",
        i64::from(integrity.as_deref() != Some("ok")),
        Vec::new(),
    ));
    Ok(Report {
        orders,
        rerun,
        max_attempts: max_attempts.unwrap_or(0),
        checks,
    })
}
