//! The power-cut harness of RELIABILITY.md section 7: the simulated disk
//! (`powercut.c`, an `LD_PRELOAD` shim compiled here), the roles that run
//! in each round, the cut and the restore, and the oracle that judges what
//! a cut left.
//!
//! A round: producers, a worker and a checkpointer (this test binary run
//! again, as `tests/support/torture.rs` runs its roles) work on one SQLite
//! file with the shim loaded; the cutter waits for a chosen sync or a
//! random time, takes the shim's lock, freezes the images, SIGKILLs every
//! process and makes the images the files (drop) or the images plus some
//! of the unsynced sectors (torn). The oracle then reads the file with a
//! plain SQLite connection and the processes' ledgers.
#![allow(dead_code)]

use crate::torture::{install_logger, Ledger};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::rusqlite::{self, Connection};
use tickler::{
    Durability, Event, JobContext, JobError, JobEventKind, NewJob, Queue, WorkerPool,
    DEFAULT_EVENT_BUFFER,
};

/// The role of a child process: `producer`, `worker` or `checkpointer`.
pub const ENV_ROLE: &str = "TICKLER_POWER_CUT_ROLE";
const ENV_DB: &str = "TICKLER_POWER_CUT_ROLE_DB";
const ENV_LEDGERS: &str = "TICKLER_POWER_CUT_ROLE_LEDGERS";
const ENV_SLOT: &str = "TICKLER_POWER_CUT_ROLE_SLOT";
const ENV_ROUND: &str = "TICKLER_POWER_CUT_ROLE_ROUND";
const ENV_DURABILITY: &str = "TICKLER_POWER_CUT_ROLE_DURABILITY";
const ENV_AUTOCHECKPOINT: &str = "TICKLER_POWER_CUT_ROLE_AUTOCHECKPOINT";
const ENV_CHECKPOINT_MS: &str = "TICKLER_POWER_CUT_ROLE_CHECKPOINT_MS";

const DB_NAME: &str = "queue.db";
const SHIM_SOURCE: &str = include_str!("powercut.c");
/// Where the cutter stops waiting for a chosen sync and cuts anyway.
const SYNC_POINT_DEADLINE: Duration = Duration::from_secs(4);
const PRODUCERS: usize = 2;
const PRODUCER_THREADS: usize = 3;
const WORKER_THREADS: usize = 4;
/// Short, so that jobs a cut left `running` come back soon in the drain.
const LEASE: Duration = Duration::from_secs(1);
const SECTOR: usize = 512;

/// `CLOCK_MONOTONIC` in nanoseconds: the shim's clock, one for every
/// process of the machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// ------------------------------------------------------------------ settings

/// What a run's oracle holds the file to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promise {
    /// Every acknowledged enqueue and `complete_with` survives.
    Full,
    /// Only what was acknowledged before the last image of the WAL.
    Normal,
    /// A crash of the processes, no power cut: every acknowledgement
    /// survives, the pool's outcomes too.
    Crash,
}

impl Promise {
    fn of(durability: Durability) -> Promise {
        match durability {
            Durability::Full => Promise::Full,
            Durability::Normal => Promise::Normal,
        }
    }
}

/// Where a cut falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// This long after every process is ready.
    Timed(Duration),
    /// The Nth sync of any file of the folder.
    Any(u32),
    /// The Nth sync of the WAL.
    Wal(u32),
    /// The Nth sync of the main file (a checkpoint).
    Main(u32),
    /// The first sync of the WAL after a sync of the main file.
    WalAfterMain,
    /// The Nth `fdatasync` (`Queue::sync`).
    Fdatasync(u32),
    /// The Nth sync of the folder (a new `-wal` file).
    Dir(u32),
}

impl Point {
    fn label(self) -> &'static str {
        match self {
            Point::Timed(_) => "timed",
            Point::Any(_) => "any file's Nth sync",
            Point::Wal(_) => "the WAL's Nth sync",
            Point::Main(_) => "the main file's Nth sync (checkpoint)",
            Point::WalAfterMain => "first WAL sync after a checkpoint",
            Point::Fdatasync(_) => "Nth fdatasync (Queue::sync)",
            Point::Dir(_) => "the folder's sync (new WAL)",
        }
    }

    /// `POWERCUT_AT` without its `before`/`after`.
    fn shim(self) -> Option<String> {
        match self {
            Point::Timed(_) => None,
            Point::Any(n) => Some(format!("any {n}")),
            Point::Wal(n) => Some(format!("wal {n}")),
            Point::Main(n) => Some(format!("main {n}")),
            Point::WalAfterMain => Some("walaftermain 1".into()),
            Point::Fdatasync(n) => Some(format!("fdatasync {n}")),
            Point::Dir(n) => Some(format!("dir {n}")),
        }
    }
}

/// A run of cuts.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The run's folder (shim, files, kept failures).
    pub dir: PathBuf,
    /// The test that is the roles' entry (`power_cut::role`).
    pub role_test: &'static str,
    pub cuts: usize,
    pub cuts_per_file: usize,
    pub seed: u64,
    /// `None`: `Full` and `Normal` by turns, one file each.
    pub durability: Option<Durability>,
    /// `None`: the file's own durability's promise.
    pub promise: Option<Promise>,
    /// Every Nth cut torn (1: all; 0: none).
    pub torn_every: usize,
    pub timed_only: bool,
    /// Timed cuts fall in this range after every process is ready (ms).
    pub timed_ms: (u64, u64),
    /// The checkpointer's pause (ms); `None`: no checkpointer.
    pub checkpoint_ms: Option<(u64, u64)>,
    /// `wal_autocheckpoint` of each round, by turns.
    pub autocheckpoints: Vec<u32>,
    /// The shim logs syncs but takes no image.
    pub lying_disk: bool,
    /// No shim: each cut a SIGKILL of every process, the files as left.
    pub crash_only: bool,
    /// After each restore: checkpoint, then zero the second half of the
    /// main file.
    pub zero_main_half: bool,
    /// End the run at the first failing cut.
    pub stop_at_first_failure: bool,
}

impl Settings {
    pub fn new(dir: PathBuf, role_test: &'static str, cuts: usize) -> Settings {
        Settings {
            dir,
            role_test,
            cuts,
            cuts_per_file: 12,
            seed: fastrand::u64(..),
            durability: None,
            promise: None,
            torn_every: 3,
            timed_only: false,
            timed_ms: (150, 1_500),
            checkpoint_ms: Some((30, 300)),
            autocheckpoints: vec![1_000, 200, 30],
            lying_disk: false,
            crash_only: false,
            zero_main_half: false,
            stop_at_first_failure: false,
        }
    }

    /// The long form's knobs from the environment (`TICKLER_POWER_CUT_*`).
    pub fn from_env(dir: PathBuf, role_test: &'static str) -> Settings {
        let var = |name: &str| std::env::var(format!("TICKLER_POWER_CUT{name}")).ok();
        let range = |text: String| -> (u64, u64) {
            let (a, b) = text.split_once('-').expect("MIN-MAX");
            (a.parse().expect("MIN"), b.parse().expect("MAX"))
        };
        let mut s = Settings::new(dir, role_test, 400);
        if let Some(n) = var("S") {
            s.cuts = n.parse().expect("TICKLER_POWER_CUTS");
        }
        if let Some(seed) = var("_SEED") {
            s.seed = seed.parse().expect("TICKLER_POWER_CUT_SEED");
        }
        s.durability = match var("_DURABILITY").as_deref() {
            None => None,
            Some("full") => Some(Durability::Full),
            Some("normal") => Some(Durability::Normal),
            Some(other) => panic!("TICKLER_POWER_CUT_DURABILITY: full or normal, not {other}"),
        };
        if let Some(n) = var("_TORN_EVERY") {
            s.torn_every = n.parse().expect("TICKLER_POWER_CUT_TORN_EVERY");
        }
        s.timed_only = var("_TIMED_ONLY").as_deref() == Some("1");
        s.crash_only = var("_CRASH_ONLY").as_deref() == Some("1");
        if let Some(ms) = var("_CHECKPOINT_MS") {
            s.checkpoint_ms = Some(range(ms));
        }
        s
    }
}

// ------------------------------------------------------------------ roles

fn role_queue() -> Queue {
    let db = std::env::var(ENV_DB).expect("db");
    let durability = match std::env::var(ENV_DURABILITY).as_deref() {
        Ok("normal") => Durability::Normal,
        _ => Durability::Full,
    };
    let autocheckpoint: u32 = std::env::var(ENV_AUTOCHECKPOINT)
        .expect("autocheckpoint")
        .parse()
        .expect("autocheckpoint");
    Queue::builder(db)
        .sqlite(|o| {
            o.durability(durability).on_connection(move |conn| {
                conn.pragma_update(None, "wal_autocheckpoint", autocheckpoint)
            })
        })
        .open()
        .expect("opening the queue")
}

/// Runs the role named by [`ENV_ROLE`] (it never returns: the cut kills it).
pub fn run_role() -> i32 {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let role = env(ENV_ROLE);
    // A test process that panics or is stopped leaves no role running.
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: as above; _exit skips destructors that a blocked thread
        // could hold up.
        if unsafe { libc::getppid() } != parent {
            unsafe { libc::_exit(0) };
        }
    });
    let slot: usize = env(ENV_SLOT).parse().expect("slot");
    let ledgers = PathBuf::from(env(ENV_LEDGERS));
    let ledger = Ledger::create(&ledgers.join(format!("{role}-{slot}.log")));
    install_logger(&ledger);
    let queue = role_queue();
    let ready = || {
        File::create(ledgers.join(format!("{role}-{slot}.ready"))).expect("ready file");
    };
    match role.as_str() {
        "producer" => producer(&queue, &ledger, slot, &env(ENV_ROUND), ready),
        "worker" => worker(&queue, &ledger, ready),
        "machine_down" => machine_down_role(&queue, &ledgers),
        "checkpointer" => {
            let (min, max) = env(ENV_CHECKPOINT_MS)
                .split_once('-')
                .map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap()))
                .expect("MIN-MAX");
            checkpointer(&queue, &ledger, (min, max), ready)
        }
        other => {
            eprintln!("unknown power-cut role {other:?}");
            2
        }
    }
}

/// Threads that enqueue without pause: single jobs and batches, each job
/// with a unique tag that names its batch and the batch's size.
fn producer(queue: &Queue, ledger: &Ledger, slot: usize, round: &str, ready: impl Fn()) -> i32 {
    let threads: Vec<_> = (0..PRODUCER_THREADS)
        .map(|thread| {
            let queue = queue.clone();
            let ledger = ledger.clone();
            let round = round.to_owned();
            std::thread::spawn(move || {
                for seq in 0u64.. {
                    let batch = format!("{round}.{slot}.{thread}.{seq}");
                    let size = if fastrand::u32(0..100) < 60 {
                        1
                    } else {
                        fastrand::usize(2..=16)
                    };
                    let jobs: Vec<NewJob> = (0..size)
                        .map(|i| {
                            let kind = if fastrand::bool() { "effect" } else { "plain" };
                            NewJob::new(kind).payload(serde_json::json!({
                                "tag": format!("{batch}/{i}"), "batch": batch, "size": size,
                            }))
                        })
                        .collect();
                    let t0 = mono_ns();
                    let done = if size == 1 {
                        queue
                            .enqueue(jobs.into_iter().next().unwrap())
                            .map(|id| vec![id])
                    } else {
                        queue.enqueue_batch(jobs)
                    };
                    let t1 = mono_ns();
                    match done {
                        Ok(ids) => {
                            let list: Vec<String> = ids
                                .iter()
                                .enumerate()
                                .map(|(i, id)| format!("{}:{batch}/{i}", id.0))
                                .collect();
                            ledger.line(&format!("enq {t0} {t1} {}", list.join(",")));
                        }
                        Err(e) => ledger.line(&format!("err enqueue {e}")),
                    }
                }
            })
        })
        .collect();
    ready();
    for t in threads {
        let _ = t.join();
    }
    0
}

/// A pool that completes `effect` jobs with `complete_with` (an effect row
/// in the same transaction) and `plain` jobs by returning `Ok`.
fn worker(queue: &Queue, ledger: &Ledger, ready: impl Fn()) -> i32 {
    let returned: Arc<Mutex<HashMap<i64, (u64, String)>>> = Arc::default();
    let effect = {
        let ledger = ledger.clone();
        move |ctx: &JobContext| {
            let id = ctx.job_id().0;
            let token = ctx.run_token().0.clone();
            let t0 = mono_ns();
            let done = ctx.complete_with(|tx: &rusqlite::Transaction| {
                tx.execute(
                    "INSERT INTO pc_effects (job_id, run_token) VALUES (?1, ?2)",
                    rusqlite::params![id, token],
                )?;
                Ok(())
            });
            let t1 = mono_ns();
            match done {
                Ok(()) => {
                    ledger.line(&format!("ok {t0} {t1} {id} {token}"));
                    Ok(())
                }
                Err(e) => {
                    ledger.line(&format!("err complete_with {id} {e}"));
                    Err(JobError::retry(e))
                }
            }
        }
    };
    let plain = {
        let returned = returned.clone();
        move |ctx: &JobContext| {
            let token = ctx.run_token().0.clone();
            returned
                .lock()
                .unwrap()
                .insert(ctx.job_id().0, (mono_ns(), token));
            Ok(())
        }
    };
    let pool = WorkerPool::builder(queue)
        .threads(WORKER_THREADS)
        .lease(LEASE)
        .heartbeat_interval(Duration::from_millis(250))
        .handler("effect", effect)
        .handler("plain", plain)
        .start()
        .expect("starting the pool");
    let events = pool.subscribe(DEFAULT_EVENT_BUFFER);
    ready();
    loop {
        let Some(Event::Job(e)) = events.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if matches!(e.what, JobEventKind::Succeeded) && e.kind == "plain" {
            // The pool's outcome is recorded (committed, its sync deferred).
            let t1 = mono_ns();
            if let Some((t0, token)) = returned.lock().unwrap().remove(&e.job_id.0) {
                ledger.line(&format!("pool {t0} {t1} {} {token}", e.job_id.0));
            }
        }
    }
}

fn checkpointer(queue: &Queue, ledger: &Ledger, (min, max): (u64, u64), ready: impl Fn()) -> i32 {
    ready();
    loop {
        std::thread::sleep(Duration::from_millis(fastrand::u64(min..=max)));
        let t0 = mono_ns();
        let done = queue.ops().checkpoint();
        let t1 = mono_ns();
        match done {
            Ok(c) => ledger.line(&format!("ckpt {t0} {t1} complete={}", c.complete)),
            Err(e) => ledger.line(&format!("err checkpoint {e}")),
        }
    }
}

// ------------------------------------------------------------------ oracle

/// An acknowledged enqueue: the times its call began and returned, and
/// each job's id and tag.
#[derive(Debug, Clone)]
pub struct Enqueued {
    pub t0: u64,
    pub t1: u64,
    pub jobs: Vec<(i64, String)>,
}

/// An acknowledged outcome: `complete_with` returned `Ok` (`by_pool`
/// false), or the pool reported the `Succeeded` of a `plain` job (`t0`:
/// its handler returned).
#[derive(Debug, Clone)]
pub struct Completed {
    pub t0: u64,
    pub t1: u64,
    pub id: i64,
    pub token: String,
    pub by_pool: bool,
}

/// What the processes of a round were told.
#[derive(Debug, Clone, Default)]
pub struct Acks {
    pub enqueued: Vec<Enqueued>,
    pub completed: Vec<Completed>,
    /// `err` and `log` lines.
    pub notes: Vec<String>,
}

impl Acks {
    /// Reads every ledger of a round's folder.
    pub fn read(dir: &Path) -> Acks {
        let mut acks = Acks::default();
        let Ok(entries) = fs::read_dir(dir) else {
            return acks;
        };
        for entry in entries.flatten() {
            if entry.path().extension().is_none_or(|e| e != "log") {
                continue;
            }
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines() {
                // After the ledger's wall-clock time.
                let words: Vec<&str> = line.split(' ').skip(1).collect();
                let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
                match words.first().copied() {
                    Some("enq") if words.len() == 4 => {
                        let jobs = words[3]
                            .split(',')
                            .filter_map(|j| j.split_once(':'))
                            .map(|(id, tag)| (id.parse().expect("job id"), tag.to_owned()))
                            .collect();
                        acks.enqueued.push(Enqueued {
                            t0: num(1).unwrap(),
                            t1: num(2).unwrap(),
                            jobs,
                        });
                    }
                    Some(what @ ("ok" | "pool")) if words.len() == 5 => {
                        acks.completed.push(Completed {
                            t0: num(1).unwrap(),
                            t1: num(2).unwrap(),
                            id: words[3].parse().expect("job id"),
                            token: words[4].to_owned(),
                            by_pool: what == "pool",
                        })
                    }
                    Some("err" | "log") => acks.notes.push(words.join(" ")),
                    _ => {}
                }
            }
        }
        acks
    }
}

/// A job as the file holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundJob {
    pub kind: String,
    pub tag: Option<String>,
    pub batch: Option<String>,
    pub size: usize,
    pub status: String,
    pub token: Option<String>,
}

/// What a plain SQLite connection reads from a file.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// `PRAGMA integrity_check`'s rows (`["ok"]` when intact).
    pub integrity: Vec<String>,
    /// The file could not be read.
    pub error: Option<String>,
    pub jobs: HashMap<i64, FoundJob>,
    /// `(job_id, run_token)` rows of `pc_effects`.
    pub effects: Vec<(i64, String)>,
}

impl Found {
    /// Reads `db` as any first opener does: SQLite recovers the WAL.
    pub fn read(db: &Path) -> Found {
        let mut found = Found::default();
        if let Err(e) = found.read_into(db) {
            found.error = Some(e.to_string());
        }
        found
    }

    fn read_into(&mut self, db: &Path) -> rusqlite::Result<()> {
        let conn = Connection::open(db)?;
        let mut stmt = conn.prepare("PRAGMA integrity_check")?;
        self.integrity = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<_>>()?;
        drop(stmt);
        let mut stmt =
            conn.prepare("SELECT id, kind, payload, status, run_token FROM tickler_jobs")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })?;
        for row in rows {
            let (id, kind, payload, status, token) = row?;
            let payload: serde_json::Value = serde_json::from_str(&payload).unwrap_or_default();
            let text = |k: &str| payload.get(k).and_then(|v| v.as_str()).map(str::to_owned);
            let size = payload.get("size").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
            self.jobs.insert(
                id,
                FoundJob {
                    kind,
                    tag: text("tag"),
                    batch: text("batch"),
                    size,
                    status,
                    token,
                },
            );
        }
        drop(stmt);
        let mut stmt = conn.prepare("SELECT job_id, run_token FROM pc_effects")?;
        self.effects = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(())
    }

    fn succeeded_by(&self, id: i64, token: &str) -> bool {
        self.jobs
            .get(&id)
            .is_some_and(|j| j.status == "succeeded" && j.token.as_deref() == Some(token))
    }
}

/// What earlier cuts of a file found: each tag's job, each success's run.
#[derive(Debug, Clone, Default)]
pub struct Known {
    pub tags: HashMap<String, i64>,
    pub succeeded: HashMap<i64, String>,
}

impl Known {
    pub fn learn(&mut self, found: &Found) {
        for (id, job) in &found.jobs {
            if let Some(tag) = &job.tag {
                self.tags.insert(tag.clone(), *id);
            }
            if job.status == "succeeded" {
                if let Some(token) = &job.token {
                    self.succeeded.insert(*id, token.clone());
                }
            }
        }
    }
}

/// The oracle's judgement of one cut.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub enqueues: u64,
    pub enqueued_jobs: u64,
    pub completes: u64,
    pub pool_outcomes: u64,
    pub lost_enqueues: u64,
    pub lost_jobs: u64,
    pub lost_completes: u64,
    pub lost_pool_outcomes: u64,
    /// The longest a lost acknowledgement came before the cut (ns).
    pub oldest_loss_ns: u64,
}

/// Judges what a cut left (`found`) against what the processes were told
/// (`acks`), the time the last image of the WAL began to be taken, the
/// time of the cut, and what earlier cuts found.
pub fn judge(
    promise: Promise,
    acks: &Acks,
    last_wal_image: Option<u64>,
    cut_at: u64,
    found: &Found,
    known: &Known,
) -> Verdict {
    let mut v = Verdict::default();
    if let Some(e) = &found.error {
        v.violations.push(format!("the file cannot be read: {e}"));
        return v;
    }
    if found.integrity != ["ok"] {
        let first: Vec<_> = found.integrity.iter().take(5).cloned().collect();
        v.violations
            .push(format!("integrity_check is not ok: {}", first.join("; ")));
    }
    // (t0, t1, what, lost)
    let mut calls: Vec<(u64, u64, String, bool)> = Vec::new();
    let mut lost_promised = Vec::new();
    for e in &acks.enqueued {
        let missing = e
            .jobs
            .iter()
            .filter(|(id, tag)| found.jobs.get(id).and_then(|j| j.tag.as_ref()) != Some(tag))
            .count();
        v.enqueues += 1;
        v.enqueued_jobs += e.jobs.len() as u64;
        let what = format!(
            "the enqueue of {} jobs from id {} ({missing} missing)",
            e.jobs.len(),
            e.jobs[0].0
        );
        if missing > 0 {
            v.lost_enqueues += 1;
            v.lost_jobs += e.jobs.len() as u64;
            if promise != Promise::Normal {
                lost_promised.push(format!("acknowledged {what}"));
            }
        }
        calls.push((e.t0, e.t1, what, missing > 0));
    }
    for c in &acks.completed {
        let lost = !found.succeeded_by(c.id, &c.token);
        let what = if c.by_pool {
            v.pool_outcomes += 1;
            v.lost_pool_outcomes += u64::from(lost);
            format!("the pool's outcome of job {} (run {})", c.id, c.token)
        } else {
            v.completes += 1;
            v.lost_completes += u64::from(lost);
            format!("complete_with of job {} (run {})", c.id, c.token)
        };
        let promised = match promise {
            Promise::Full => !c.by_pool,
            Promise::Crash => true,
            Promise::Normal => false,
        };
        if lost && promised {
            lost_promised.push(format!("acknowledged {what}"));
        }
        calls.push((c.t0, c.t1, what, lost));
    }
    summarize(
        &mut v.violations,
        &format!("acknowledgements lost, which {promise:?} promises to keep"),
        lost_promised,
    );
    let mut lost_before_image = Vec::new();
    for (_, t1, what, lost) in &calls {
        if !lost {
            continue;
        }
        v.oldest_loss_ns = v.oldest_loss_ns.max(cut_at.saturating_sub(*t1));
        if let Some(image) = last_wal_image {
            if *t1 < image {
                lost_before_image
                    .push(format!("{what}, {} ms before it", (image - t1) / 1_000_000));
            }
        }
    }
    summarize(
        &mut v.violations,
        "acknowledgements lost though made before the last image of the WAL was taken",
        lost_before_image,
    );
    // A loss is a suffix: nothing survives that began after a lost call
    // had returned.
    if let Some((_, lost_t1, lost_what, _)) = calls.iter().filter(|c| c.3).min_by_key(|c| c.1) {
        if let Some((_, _, what, _)) = calls.iter().find(|c| !c.3 && c.0 > *lost_t1) {
            v.violations.push(format!(
                "{what} survived, though it began after {lost_what}, which is lost, had returned"
            ));
        }
    }
    let mut batches: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut tags: HashMap<&str, usize> = HashMap::new();
    for job in found.jobs.values() {
        if let Some(batch) = &job.batch {
            let entry = batches.entry(batch).or_insert((0, job.size));
            entry.0 += 1;
        }
        if let Some(tag) = &job.tag {
            *tags.entry(tag).or_default() += 1;
        }
    }
    let mut partial: Vec<_> = batches
        .iter()
        .filter(|(_, (n, size))| n != size)
        .map(|(b, (n, size))| format!("{b} ({n} of {size})"))
        .collect();
    partial.sort();
    if !partial.is_empty() {
        v.violations.push(format!(
            "{} batches are in the file in part: {}",
            partial.len(),
            partial
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some((tag, n)) = tags.iter().find(|(_, n)| **n > 1) {
        v.violations.push(format!(
            "{n} jobs carry the tag {tag} (an enqueue done twice)"
        ));
    }
    let mut effects: HashMap<i64, Vec<&str>> = HashMap::new();
    for (id, token) in &found.effects {
        effects.entry(*id).or_default().push(token);
    }
    for (id, tokens) in &effects {
        let ok = tokens.len() == 1 && found.succeeded_by(*id, tokens[0]);
        if !ok {
            v.violations.push(format!(
                "job {id} has effect rows of runs {tokens:?} but is {:?}",
                found.jobs.get(id).map(|j| (&j.status, &j.token))
            ));
        }
    }
    for (id, job) in &found.jobs {
        if job.kind == "effect" && job.status == "succeeded" && !effects.contains_key(id) {
            v.violations.push(format!(
                "job {id} succeeded (run {:?}) without its effect row",
                job.token
            ));
        }
    }
    for (tag, id) in &known.tags {
        if found.jobs.get(id).and_then(|j| j.tag.as_ref()) != Some(tag) {
            v.violations.push(format!(
                "job {id} ({tag}), found by an earlier cut, is gone"
            ));
        }
    }
    for (id, token) in &known.succeeded {
        if !found.succeeded_by(*id, token) {
            v.violations.push(format!(
                "job {id}, found succeeded by run {token} by an earlier cut, is {:?} now",
                found.jobs.get(id).map(|j| (&j.status, &j.token))
            ));
        }
    }
    v
}

// ------------------------------------------------------------------ figures

/// Acknowledgements and losses of one durability.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub cuts: u64,
    pub enqueues: u64,
    pub enqueued_jobs: u64,
    pub completes: u64,
    pub pool_outcomes: u64,
    pub lost_enqueues: u64,
    pub lost_jobs: u64,
    pub lost_completes: u64,
    pub lost_pool_outcomes: u64,
    pub oldest_loss_ms: u64,
}

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub cuts: u64,
    pub files: u64,
    pub points: BTreeMap<&'static str, u64>,
    /// Sync cuts that the chosen sync did not reach in time (cut then).
    pub points_missed: u64,
    /// Whose sync a sync cut came at: role, file, call.
    pub whose: BTreeMap<String, u64>,
    pub drops: u64,
    pub torn: u64,
    pub torn_sectors: u64,
    pub syncs: BTreeMap<String, u64>,
    pub full: Tally,
    pub normal: Tally,
    pub integrity_ok: u64,
    pub probes_ok: u64,
    pub drains_ok: u64,
    pub notes: u64,
    /// Each failing cut, with where its files are.
    pub failures: Vec<String>,
    pub seconds: f64,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "power cuts: {} in {} files, {:.0} s",
            self.cuts, self.files, self.seconds
        )?;
        writeln!(
            f,
            "  cut points: {:?}; sync points not reached in time (cut then): {}",
            self.points, self.points_missed
        )?;
        writeln!(f, "  whose sync: {:?}", self.whose)?;
        writeln!(
            f,
            "  restore: {} drop, {} torn ({} unsynced sectors kept)",
            self.drops, self.torn, self.torn_sectors
        )?;
        writeln!(f, "  syncs (file call): {:?}", self.syncs)?;
        for (name, t) in [("Full", &self.full), ("Normal", &self.normal)] {
            writeln!(
                f,
                "  {name}, {} cuts: acknowledged {} enqueues ({} jobs), {} complete_with, {} pool outcomes; \
                 lost {} enqueues ({} jobs), {} complete_with, {} pool outcomes, at most {} ms before the cut",
                t.cuts, t.enqueues, t.enqueued_jobs, t.completes, t.pool_outcomes, t.lost_enqueues,
                t.lost_jobs, t.lost_completes, t.lost_pool_outcomes, t.oldest_loss_ms
            )?;
        }
        writeln!(
            f,
            "  integrity_check ok after {} of {} cuts; probe job ran after {}; drains ok {} of {} files; err/log lines {}",
            self.integrity_ok, self.cuts, self.probes_ok, self.drains_ok, self.files, self.notes
        )?;
        if self.failures.is_empty() {
            write!(f, "RESULT: PASS")
        } else {
            for failure in &self.failures {
                writeln!(f, "  FAILED: {failure}")?;
            }
            write!(f, "RESULT: FAIL ({} cuts)", self.failures.len())
        }
    }
}

// ------------------------------------------------------------------ the run

/// Compiles the shim into `dir` with the system's C compiler.
pub fn compile_shim(dir: &Path) -> PathBuf {
    let source = dir.join("powercut.c");
    let lib = dir.join("powercut.so");
    fs::write(&source, SHIM_SOURCE).expect("writing the shim's source");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-ldl")
        .status()
        .expect("running cc (the power-cut test needs a C compiler)");
    assert!(status.success(), "compiling the shim failed");
    lib
}

/// The kind whose handler takes the machine down (see [`machine_down`]).
const DOWN_KIND: &str = "down";

/// A pool whose one handler takes the machine down at once: it writes a
/// mark for the cutter and waits for the cut.
fn machine_down_role(queue: &Queue, ledgers: &Path) -> i32 {
    let mark = ledgers.join("down.started");
    let _pool = tickler::WorkerPool::builder(queue)
        .threads(1)
        .handler(
            DOWN_KIND,
            move |ctx: &tickler::JobContext| -> Result<(), tickler::JobError> {
                fs::write(&mark, ctx.attempt().to_string()).expect("the handler's mark");
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            },
        )
        .start()
        .expect("starting the pool");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A handler that takes the machine down as soon as it starts, boot after
/// boot, under `Full`: each boot starts a pool in a process of its own,
/// and the power is cut (every unsynced write lost) the moment the handler
/// runs. Returns, per boot, the job's state and attempts as the disk held
/// them after the cut; it ends at the first `dead` or after `boots`.
pub fn machine_down(dir: &Path, max_attempts: u32, boots: usize) -> Vec<(String, i64)> {
    let s = Settings::new(dir.to_path_buf(), "power_cut::role", 0);
    let shim = compile_shim(dir);
    let file = FileRun::create(&s, &shim, 1, Durability::Full);
    {
        let queue = Queue::open(&file.db).expect("opening the queue");
        queue
            .enqueue(NewJob::new(DOWN_KIND).max_attempts(max_attempts))
            .expect("enqueueing the job");
    }
    let mut history = Vec::new();
    for boot in 1..=boots {
        file.settle();
        let round = file.root.join(format!("boot-{boot}"));
        fs::create_dir_all(round.join("ledger")).expect("boot folder");
        fs::create_dir_all(round.join("out")).expect("boot folder");
        let mut child = file.spawn(&round, boot, "machine_down", 0, "", 1000);
        let mark = round.join("ledger").join("down.started");
        // A job that does not start within this is not running this boot.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !mark.exists() && Instant::now() < deadline {
            assert!(
                child.try_wait().expect("the pool's process").is_none(),
                "boot {boot}: the pool's process ended: {}",
                fs::read_to_string(round.join("out/machine_down-0.txt")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // The cut, as in a round: no sync completes after this instant.
        let lock = file.freeze();
        let _ = child.kill();
        let _ = child.wait();
        drop(lock);
        file.restore(false, &mut fastrand::Rng::with_seed(0));
        let conn = rusqlite::Connection::open(&file.db).expect("reading the file");
        let (state, attempts): (String, i64) = conn
            .query_row(
                "SELECT status, attempts FROM tickler_jobs WHERE kind = ?1",
                [DOWN_KIND],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("the job");
        drop(conn);
        let dead = state == "dead";
        history.push((state, attempts));
        if dead {
            break;
        }
    }
    history
}

/// Runs `s.cuts` cuts, file after file, and returns the figures.
pub fn run(s: &Settings) -> Figures {
    let started = Instant::now();
    fs::create_dir_all(&s.dir).expect("run folder");
    let shim = compile_shim(&s.dir);
    let mut rng = fastrand::Rng::with_seed(s.seed);
    let mut figures = Figures::default();
    let mut cut = 0;
    while cut < s.cuts {
        figures.files += 1;
        let durability = s.durability.unwrap_or(if figures.files % 2 == 1 {
            Durability::Full
        } else {
            Durability::Normal
        });
        let mut file = FileRun::create(s, &shim, figures.files, durability);
        let mut failed = false;
        for _ in 0..s.cuts_per_file.min(s.cuts - cut) {
            cut += 1;
            if !file.round(cut, &mut rng, &mut figures) {
                failed = true;
                break;
            }
        }
        if !failed {
            match file.drain() {
                Ok(()) => figures.drains_ok += 1,
                Err(e) => {
                    figures
                        .failures
                        .push(format!("drain of {}: {e}", file.root.display()));
                    failed = true;
                }
            }
        }
        println!(
            "file {} ({durability:?}): {cut} cuts so far, {} failed, {:.0} s",
            figures.files,
            figures.failures.len(),
            started.elapsed().as_secs_f64()
        );
        if !failed {
            let _ = fs::remove_dir_all(&file.root);
        } else if s.stop_at_first_failure {
            break;
        }
    }
    figures.seconds = started.elapsed().as_secs_f64();
    figures
}

/// One file and its cuts.
struct FileRun<'a> {
    s: &'a Settings,
    shim: &'a Path,
    root: PathBuf,
    /// The queue's folder (canonical: the shim compares paths).
    folder: PathBuf,
    db: PathBuf,
    images: PathBuf,
    lock: PathBuf,
    durability: Durability,
    known: Known,
}

impl<'a> FileRun<'a> {
    fn create(s: &'a Settings, shim: &'a Path, n: u64, durability: Durability) -> FileRun<'a> {
        let root = s.dir.join(format!("file-{n}"));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("q")).expect("queue folder");
        fs::create_dir_all(root.join("images")).expect("images folder");
        let folder = fs::canonicalize(root.join("q")).expect("canonical folder");
        let db = folder.join(DB_NAME);
        {
            let queue = Queue::builder(&db)
                .sqlite(|o| o.durability(durability))
                .open()
                .expect("creating the queue");
            queue
                .open_connection()
                .expect("a connection")
                .execute_batch(
                    "CREATE TABLE pc_effects (job_id INTEGER NOT NULL, run_token TEXT NOT NULL)",
                )
                .expect("creating pc_effects");
        }
        FileRun {
            s,
            shim,
            images: root.join("images"),
            lock: root.join("lock"),
            root,
            folder,
            db,
            durability,
            known: Known::default(),
        }
    }

    fn promise(&self) -> Promise {
        if self.s.crash_only {
            return Promise::Crash;
        }
        self.s.promise.unwrap_or(Promise::of(self.durability))
    }

    /// The files as they are now are what the disk holds: the start of a
    /// round, after a restore and the oracle's clean close.
    fn settle(&self) {
        self.wait_closed();
        let _ = fs::remove_dir_all(&self.images);
        fs::create_dir_all(&self.images).expect("images folder");
        let _ = fs::remove_file(&self.lock);
        for entry in fs::read_dir(&self.folder).expect("queue folder").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with("-shm") {
                fs::copy(entry.path(), self.images.join(&name)).expect("taking an image");
            }
        }
    }

    /// Waits until this process has no file of the queue's folder open
    /// and SQLite's last close removed the `-wal` and `-shm` files. A
    /// connection of this process still open in a round would be a writer
    /// that no cut kills: tickler's read pool opens its connections in
    /// background threads, which can finish after the `Queue` is dropped,
    /// and whose close then checkpoints and deletes the log under the
    /// round's processes.
    fn wait_closed(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut quiet_since: Option<Instant> = None;
        loop {
            let open = fs::read_dir("/proc/self/fd")
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| fs::read_link(e.path()).ok())
                        .any(|p| p.starts_with(&self.folder))
                })
                .unwrap_or(false);
            let leftovers = ["-wal", "-shm"]
                .iter()
                .any(|suffix| self.folder.join(format!("{DB_NAME}{suffix}")).exists());
            if open || leftovers {
                quiet_since = None;
                assert!(
                    Instant::now() < deadline,
                    "a connection of the test process to {} outlived its round",
                    self.db.display()
                );
            } else if quiet_since.get_or_insert_with(Instant::now).elapsed()
                >= Duration::from_millis(50)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn plan(&self, cut: usize, rng: &mut fastrand::Rng) -> Point {
        if self.s.timed_only || self.s.crash_only {
            return self.timed(rng);
        }
        match cut % 7 {
            0 => self.timed(rng),
            1 => Point::Any(rng.u32(1..=40)),
            2 => Point::Wal(rng.u32(1..=20)),
            3 => Point::Main(rng.u32(1..=3)),
            4 => Point::WalAfterMain,
            5 if self.durability == Durability::Full => Point::Fdatasync(rng.u32(1..=5)),
            5 => self.timed(rng),
            _ => Point::Dir(1),
        }
    }

    fn timed(&self, rng: &mut fastrand::Rng) -> Point {
        Point::Timed(Duration::from_millis(
            rng.u64(self.s.timed_ms.0..=self.s.timed_ms.1),
        ))
    }

    fn spawn(
        &self,
        round: &Path,
        n: usize,
        role: &str,
        slot: usize,
        at: &str,
        autockpt: u32,
    ) -> Child {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            self.s.role_test,
            "--nocapture",
            "--test-threads=1",
        ]);
        if !self.s.crash_only {
            cmd.env("LD_PRELOAD", self.shim)
                .env("POWERCUT_DIR", &self.folder)
                .env("POWERCUT_DB", DB_NAME)
                .env("POWERCUT_IMAGES", &self.images)
                .env("POWERCUT_LOCK", &self.lock)
                .env("POWERCUT_LOG", round.join("syncs.log"))
                .env("POWERCUT_ROLE", format!("{role}-{slot}"))
                .env("POWERCUT_AT", at)
                .env("POWERCUT_LIE", if self.s.lying_disk { "1" } else { "0" });
        }
        let durability = match self.durability {
            Durability::Full => "full",
            Durability::Normal => "normal",
        };
        let (min, max) = self.s.checkpoint_ms.unwrap_or((30, 300));
        let out = File::create(round.join(format!("out/{role}-{slot}.txt"))).expect("output file");
        cmd.env(ENV_ROLE, role)
            .env(ENV_SLOT, slot.to_string())
            .env(ENV_ROUND, n.to_string())
            .env(ENV_DB, &self.db)
            .env(ENV_LEDGERS, round.join("ledger"))
            .env(ENV_DURABILITY, durability)
            .env(ENV_AUTOCHECKPOINT, autockpt.to_string())
            .env(ENV_CHECKPOINT_MS, format!("{min}-{max}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("output file"))
            .stderr(out)
            .spawn()
            .expect("spawning a power-cut role")
    }

    /// One round and its cut; false if the oracle found a violation (the
    /// round's folder is then kept).
    fn round(&mut self, n: usize, rng: &mut fastrand::Rng, figures: &mut Figures) -> bool {
        let round = self.root.join(format!("round-{n}"));
        fs::create_dir_all(round.join("ledger")).expect("round folder");
        fs::create_dir_all(round.join("out")).expect("round folder");
        self.settle();
        let point = self.plan(n, rng);
        let after = rng.bool();
        let torn =
            !self.s.crash_only && self.s.torn_every > 0 && n.is_multiple_of(self.s.torn_every);
        let autockpt = self.s.autocheckpoints[n % self.s.autocheckpoints.len()];
        let at = point
            .shim()
            .map(|p| format!("{p} {}", if after { "after" } else { "before" }))
            .unwrap_or_default();
        let mut roles = vec![("worker", 0)];
        roles.extend((0..PRODUCERS).map(|slot| ("producer", slot)));
        if self.s.checkpoint_ms.is_some() {
            roles.push(("checkpointer", 0));
        }
        let mut children: Vec<(String, Child)> = roles
            .iter()
            .map(|(role, slot)| {
                (
                    format!("{role}-{slot}"),
                    self.spawn(&round, n, role, *slot, &at, autockpt),
                )
            })
            .collect();

        // Wait for the chosen sync, the time, or the deadline.
        let spawned = Instant::now();
        let mut ready_at: Option<Instant> = None;
        let trigger = self.images.join("trigger");
        let mut reached = None;
        loop {
            if ready_at.is_none() {
                let ready = fs::read_dir(round.join("ledger"))
                    .map(|d| {
                        d.flatten()
                            .filter(|e| e.path().extension().is_some_and(|x| x == "ready"))
                            .count()
                    })
                    .unwrap_or(0);
                if ready == roles.len() {
                    ready_at = Some(Instant::now());
                }
            }
            if let Ok(text) = fs::read_to_string(&trigger) {
                reached = Some(text.trim().to_owned());
                break;
            }
            let since = ready_at.map(|t| t.elapsed());
            match (point, since) {
                (Point::Timed(after), Some(since)) if since >= after => break,
                (_, Some(since)) if since >= SYNC_POINT_DEADLINE => break,
                _ if spawned.elapsed() > Duration::from_secs(30) => break,
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }

        // The cut: no sync completes after this instant.
        let mut problems = Vec::new();
        let lock = self.freeze();
        let cut_at = mono_ns();
        for (name, child) in &mut children {
            if let Ok(Some(status)) = child.try_wait() {
                let out =
                    fs::read_to_string(round.join(format!("out/{name}.txt"))).unwrap_or_default();
                let tail: String = out
                    .chars()
                    .rev()
                    .take(2_000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                problems.push(format!("{name} exited on its own ({status}): {tail}"));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(lock);

        // What the processes left, kept for a look if the cut fails.
        copy_dir(&self.folder, &round.join("written"));
        let mut torn_sectors = 0;
        if !self.s.crash_only {
            copy_dir(&self.images, &round.join("images"));
            torn_sectors = self.restore(torn, rng);
        }
        if self.s.zero_main_half {
            zero_main_half(&self.db);
        }

        // The oracle.
        let acks = Acks::read(&round.join("ledger"));
        let (last_wal_image, syncs) = read_syncs(&round.join("syncs.log"));
        for (k, count) in syncs {
            *figures.syncs.entry(k).or_default() += count;
        }
        let found = Found::read(&self.db);
        let promise = self.promise();
        let mut verdict = judge(promise, &acks, last_wal_image, cut_at, &found, &self.known);
        verdict.violations.extend(problems);
        if found.integrity == ["ok"] {
            figures.integrity_ok += 1;
        }
        match self.probe() {
            Ok(()) => figures.probes_ok += 1,
            Err(e) => verdict.violations.push(format!("the probe job: {e}")),
        }
        self.known.learn(&found);

        figures.cuts += 1;
        *figures.points.entry(point.label()).or_default() += 1;
        if point.shim().is_some() && reached.is_none() {
            figures.points_missed += 1;
        }
        if let Some(r) = &reached {
            let mut w = r.split(' ');
            let key = format!(
                "{} {} {}",
                w.next().unwrap_or(""),
                w.next().unwrap_or(""),
                w.next().unwrap_or("")
            );
            *figures.whose.entry(key).or_default() += 1;
        }
        if !self.s.crash_only {
            if torn {
                figures.torn += 1;
            } else {
                figures.drops += 1;
            }
        }
        figures.torn_sectors += torn_sectors;
        figures.notes += acks.notes.len() as u64;
        let tally = match self.durability {
            Durability::Full => &mut figures.full,
            Durability::Normal => &mut figures.normal,
        };
        tally.cuts += 1;
        tally.enqueues += verdict.enqueues;
        tally.enqueued_jobs += verdict.enqueued_jobs;
        tally.completes += verdict.completes;
        tally.pool_outcomes += verdict.pool_outcomes;
        tally.lost_enqueues += verdict.lost_enqueues;
        tally.lost_jobs += verdict.lost_jobs;
        tally.lost_completes += verdict.lost_completes;
        tally.lost_pool_outcomes += verdict.lost_pool_outcomes;
        tally.oldest_loss_ms = tally.oldest_loss_ms.max(verdict.oldest_loss_ns / 1_000_000);

        if verdict.violations.is_empty() {
            let _ = fs::remove_dir_all(&round);
            return true;
        }
        // Was the loss in the files as the processes left them already?
        let written = Found::read(&round.join("written").join(DB_NAME));
        let as_left = judge(
            Promise::Crash,
            &acks,
            None,
            cut_at,
            &written,
            &Known::default(),
        );
        let mut text = String::new();
        let _ = write!(
            text,
            "cut {n} ({:?} file judged as {promise:?}; {} {}; {}; wal_autocheckpoint {autockpt}; seed {}; files in {}): {}",
            self.durability,
            point.label(),
            if point.shim().is_some() { if after { "after its image" } else { "before its image" } } else { "" },
            if self.s.crash_only { "crash only" } else if torn { "torn" } else { "drop" },
            self.s.seed,
            round.display(),
            verdict.violations.iter().take(8).cloned().collect::<Vec<_>>().join(" | "),
        );
        let _ = write!(
            text,
            " || the files as the processes left them, judged as a crash: {}",
            if as_left.violations.is_empty() {
                "nothing lost".to_owned()
            } else {
                as_left
                    .violations
                    .iter()
                    .take(8)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            }
        );
        figures.failures.push(text);
        false
    }

    /// The cut's first step: takes the shim's lock, so that no sync
    /// completes after this instant, and freezes the images (a sync that
    /// comes later blocks for ever). Kill the processes, then drop the lock.
    fn freeze(&self) -> File {
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.lock)
            .expect("the shim's lock file");
        // SAFETY: flock on a descriptor this process owns.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock");
        File::create(self.images.join("frozen")).expect("freezing the images");
        lock
    }

    /// Makes the images the files: each file its image (drop), or its image
    /// plus a random half of the sectors where the file as written differs
    /// (torn), at either length. A file never synced is removed, and so is
    /// the `-shm` file. Returns how many unsynced sectors were kept.
    fn restore(&self, torn: bool, rng: &mut fastrand::Rng) -> u64 {
        let mut kept = 0;
        for entry in fs::read_dir(&self.folder).expect("queue folder").flatten() {
            let name = entry.file_name();
            if !self.images.join(&name).exists() {
                fs::remove_file(entry.path()).expect("removing a file never synced");
            }
        }
        for entry in fs::read_dir(&self.images).expect("images").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.')
                || name == "frozen"
                || name == "trigger"
                || name.ends_with("-shm")
            {
                continue;
            }
            let image = fs::read(entry.path()).expect("reading an image");
            let target = self.folder.join(&name);
            let content = if torn {
                let written = fs::read(&target).unwrap_or_default();
                let (content, n) = tear(&image, &written, rng);
                kept += n;
                content
            } else {
                image
            };
            fs::write(&target, content).expect("restoring a file");
        }
        kept
    }

    /// tickler opens the restored file and puts a job through it.
    fn probe(&self) -> Result<(), String> {
        let queue = Queue::builder(&self.db)
            .sqlite(|o| o.durability(self.durability))
            .open()
            .map_err(|e| format!("open: {e}"))?;
        let id = queue
            .enqueue(NewJob::new("probe").queue("probe"))
            .map_err(|e| format!("enqueue: {e}"))?;
        let leases = queue
            .manual()
            .claim("probe", "oracle", 1, Duration::from_secs(60))
            .map_err(|e| format!("claim: {e}"))?;
        let lease = leases.first().ok_or("nothing to claim")?;
        queue
            .manual()
            .complete(lease)
            .map_err(|e| format!("complete: {e}"))?;
        drop(queue);
        // Read back without tickler's read pool (see `wait_closed`).
        let conn = Connection::open(&self.db).map_err(|e| format!("read back: {e}"))?;
        let status: String = conn
            .query_row(
                "SELECT status FROM tickler_jobs WHERE id = ?1",
                [id.0],
                |r| r.get(0),
            )
            .map_err(|e| format!("read back: {e}"))?;
        if status != "succeeded" {
            return Err(format!("the probe job is {status}"));
        }
        Ok(())
    }

    /// A pool in this process runs every unfinished job; then each job has
    /// succeeded once, each `effect` job with its one effect row.
    fn drain(&self) -> Result<(), String> {
        let queue = Queue::builder(&self.db)
            .sqlite(|o| o.durability(self.durability))
            .open()
            .map_err(|e| format!("open: {e}"))?;
        let effect = |ctx: &JobContext| {
            let id = ctx.job_id().0;
            let token = ctx.run_token().0.clone();
            ctx.complete_with(|tx: &rusqlite::Transaction| {
                tx.execute(
                    "INSERT INTO pc_effects (job_id, run_token) VALUES (?1, ?2)",
                    rusqlite::params![id, token],
                )?;
                Ok(())
            })
            .map_err(JobError::retry)
        };
        let mut pool = WorkerPool::builder(&queue)
            .threads(WORKER_THREADS)
            .lease(LEASE)
            .handler("effect", effect)
            .handler("plain", |_: &JobContext| Ok(()))
            .start()
            .map_err(|e| format!("pool: {e}"))?;
        let conn = Connection::open(&self.db).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let left: i64 = conn
                .query_row(
                    "SELECT count(*) FROM tickler_jobs WHERE queue <> 'probe' AND status <> 'succeeded'",
                    [],
                    |r| r.get(0),
                )
                .map_err(|e| e.to_string())?;
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{left} jobs still unfinished after 180 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        pool.shutdown(Duration::from_secs(10));
        drop(conn);
        drop(queue);
        let found = Found::read(&self.db);
        let v = judge(
            Promise::Crash,
            &Acks::default(),
            None,
            0,
            &found,
            &self.known,
        );
        if !v.violations.is_empty() {
            return Err(v.violations.join(" | "));
        }
        Ok(())
    }
}

/// One violation line for `items`, if any: how many, and the first few.
fn summarize(violations: &mut Vec<String>, what: &str, items: Vec<String>) {
    if !items.is_empty() {
        let first: Vec<_> = items.iter().take(3).cloned().collect();
        violations.push(format!("{} {what}: {}", items.len(), first.join("; ")));
    }
}

/// The image plus a random half of the sectors where `written` differs
/// from it, at the image's length or the written one (past the end of
/// either, a sector reads as zeros).
pub fn tear(image: &[u8], written: &[u8], rng: &mut fastrand::Rng) -> (Vec<u8>, u64) {
    let len = if rng.bool() {
        image.len()
    } else {
        written.len()
    };
    let mut out = vec![0u8; len];
    let mut kept = 0;
    let sector = |data: &[u8], at: usize, end: usize| -> Vec<u8> {
        let mut s = vec![0u8; end - at];
        if at < data.len() {
            let n = data.len().min(end) - at;
            s[..n].copy_from_slice(&data[at..at + n]);
        }
        s
    };
    for at in (0..len).step_by(SECTOR) {
        let end = (at + SECTOR).min(len);
        let old = sector(image, at, end);
        let new = sector(written, at, end);
        let take_new = old != new && rng.bool();
        kept += u64::from(take_new);
        out[at..end].copy_from_slice(if take_new { &new } else { &old });
    }
    (out, kept)
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("creating a folder");
    for entry in fs::read_dir(from).expect("reading a folder").flatten() {
        let _ = fs::copy(entry.path(), to.join(entry.file_name()));
    }
}

/// The broken harness of a test: the main file checkpointed, then its
/// second half zeroed.
fn zero_main_half(db: &Path) {
    if let Ok(conn) = Connection::open(db) {
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
    let len = fs::metadata(db).map(|m| m.len()).unwrap_or(0) as usize;
    let mut data = fs::read(db).expect("reading the main file");
    let half = (len / 2 / 4096) * 4096;
    data[half..].fill(0);
    fs::write(db, data).expect("zeroing the main file");
}

/// From the shim's log: when the last image of the WAL began to be taken,
/// and counts of syncs by file and call.
fn read_syncs(path: &Path) -> (Option<u64>, BTreeMap<String, u64>) {
    let text = fs::read_to_string(path).unwrap_or_default();
    let wal = format!("{DB_NAME}-wal");
    let mut last = None;
    let mut counts = BTreeMap::new();
    let mut main_since_wal = false;
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        if words.len() < 6 {
            continue;
        }
        let at: u64 = words[0].parse().unwrap_or(0);
        let (name, how) = (words[3], words[4]);
        let file = if name == DB_NAME {
            main_since_wal = true;
            "main"
        } else if name == wal {
            if main_since_wal {
                main_since_wal = false;
                *counts
                    .entry("wal, first after a checkpoint".to_owned())
                    .or_default() += 1;
            }
            last = last.max(Some(at));
            "wal"
        } else if name == "." {
            "folder"
        } else {
            "other"
        };
        *counts.entry(format!("{file} {how}")).or_default() += 1;
    }
    (last, counts)
}
