//! A batch run for real: 10,000 members added from five processes while
//! four worker processes run them, one of them killed with SIGKILL (and
//! restarted) or stopped with SIGSTOP past its leases (its holders then
//! report late, stale), in turn, every ~0.4 s, at least twice each before
//! the seal. The callbacks run in this process,
//! whose pool is never killed, and record each start in an oracle beside
//! the queue: each callback the outcome calls for starts exactly once,
//! after the last member ended, and the others are cancelled; the
//! counters equal the members' states as read one by one.
//!
//! `TICKLER_BATCH_SOAK_MEMBERS` sets the batch's size (default 10,000).

use crate::support::common;
use crate::support::pool;
use crate::support::reliability::signal;

use common::{ms, secs, temp_db, wait_until};
use pool::no_backoff;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{
    BatchId, JobContext, JobError, JobId, JobState, NewBatch, NewJob, Queue, ReaperConfig,
    WorkerPool,
};

const PROCESSES: usize = 4;
const ENV_DB: &str = "TICKLER_BATCH_SOAK_DB";
const ENV_DIR: &str = "TICKLER_BATCH_SOAK_DIR";
const ENV_BATCH: &str = "TICKLER_BATCH_SOAK_BATCH";
const ENV_ADD: &str = "TICKLER_BATCH_SOAK_ADD";
const CHILD_TEST: &str = "batch_soak_worker_process";
/// Members each of the first worker processes adds before it works.
const ADDED_BY_EACH: usize = 500;

fn spawn_worker(db: &Path, dir: &Path, batch: BatchId, n: usize, add: bool) -> Child {
    crate::support::engine::child_case(module_path!(), CHILD_TEST)
        .env(ENV_DB, db)
        .env(ENV_DIR, dir)
        .env(ENV_BATCH, batch.0.to_string())
        .env(ENV_ADD, if add { "1" } else { "0" })
        .stdin(Stdio::null())
        .stdout(File::create(dir.join(format!("worker-{n}.out"))).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a worker process")
}

/// A member: every 40th fails each time (dead after its attempts), the
/// rest succeed with their number as output.
fn member(batch: BatchId, n: usize) -> NewJob {
    NewJob::new("member")
        .batch(batch)
        .payload(serde_json::json!({ "n": n }))
        .max_attempts(3)
}

/// A callback's start, as the oracle saw it.
#[derive(Debug, Clone)]
struct Start {
    kind: String,
    /// Members not ended when it started, read one by one.
    unfinished: usize,
}

contract! {
fn each_callback_of_a_batch_worked_by_killed_and_stopped_processes_starts_once() {
    let (dir, path) = temp_db();
    let dir = dir.path().to_path_buf();
    let queue = Queue::builder(crate::support::engine::target(&path))
        .sqlite(|o| o.durability(tickler::Durability::Normal))
        .retry_policy(no_backoff())
        .open()
        .unwrap();
    let total: usize = std::env::var("TICKLER_BATCH_SOAK_MEMBERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let batch = queue
        .open_batch(
            NewBatch::new()
                .description("soak")
                .on_success(NewJob::new("on_success"))
                .on_failure(NewJob::new("on_failure"))
                .on_finish(NewJob::new("on_finish")),
        )
        .unwrap();

    // The callbacks run here, in a pool never killed; members only in the
    // worker processes.
    let starts: Arc<Mutex<Vec<Start>>> = Arc::default();
    let mut pool = {
        let mut builder = WorkerPool::builder(&queue)
            .threads(2)
            .poll_interval(ms(50))
            .reaper(ReaperConfig { interval: ms(100), ..ReaperConfig::default() });
        for kind in ["on_success", "on_failure", "on_finish"] {
            let starts = starts.clone();
            builder = builder.handler(kind, move |ctx: &JobContext| -> Result<(), JobError> {
                let queue = ctx.queue();
                let batch = queue.get(ctx.job_id()).unwrap().batch.expect("a callback's batch");
                let mut unfinished = 0;
                let mut after = None;
                loop {
                    let page = queue.batch_members(batch, after, 1_000).unwrap();
                    let Some(last) = page.last() else { break };
                    after = Some(last.id);
                    unfinished += page.iter().filter(|j| !j.state.is_terminal()).count();
                }
                starts.lock().unwrap().push(Start { kind: ctx.kind().to_owned(), unfinished });
                Ok(())
            });
        }
        builder.start().unwrap()
    };

    let mut workers: Vec<Child> = (0..PROCESSES)
        .map(|n| spawn_worker(&path, &dir, batch.id, n, true))
        .collect();
    let mut next = PROCESSES;
    wait_until("each worker added its members", secs(60), || {
        (0..PROCESSES).all(|n| {
            std::fs::read_to_string(dir.join(format!("worker-{n}.out")))
                .unwrap_or_default()
                .contains("ADDED")
        })
    });
    // A thread of its own disturbs the workers: this one may wait on a
    // row a stopped worker holds (as any client would) until it goes on.
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let disturbed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let disturber = {
        let finished = finished.clone();
        let disturbed = disturbed.clone();
        let (path, dir) = (path.clone(), dir.clone());
        std::thread::spawn(move || {
            let (mut kills, mut stops) = (0, 0);
            while !finished.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(ms(400));
                let victim = workers.swap_remove(fastrand::usize(..workers.len()));
                // Kills and stops in turn.
                if disturbed.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 2 == 1 {
                    // Its holders stop past their 1 s leases: the reaper
                    // takes their jobs back, and their outcomes, once it
                    // goes on, are stale.
                    signal(&victim, libc::SIGSTOP);
                    stops += 1;
                    std::thread::sleep(ms(1_500));
                    signal(&victim, libc::SIGCONT);
                    workers.push(victim);
                } else {
                    let mut victim = victim;
                    victim.kill().unwrap();
                    victim.wait().unwrap();
                    kills += 1;
                    workers.push(spawn_worker(&path, &dir, batch.id, next, false));
                    next += 1;
                }
            }
            (workers, kills, stops)
        })
    };
    // This process adds the rest in chunks.
    let ours = total.saturating_sub(PROCESSES * ADDED_BY_EACH);
    let mut added = 0;
    let started = Instant::now();
    while added < ours {
        let n = 1_000.min(ours - added);
        queue
            .enqueue_batch(
                (0..n)
                    .map(|i| member(batch.id, PROCESSES * ADDED_BY_EACH + added + i))
                    .collect(),
            )
            .unwrap();
        added += n;
        std::thread::sleep(ms(200));
    }
    // At least two kills and two stops come while members run.
    wait_until("four disturbances", secs(60), || {
        disturbed.load(std::sync::atomic::Ordering::SeqCst) >= 4
    });
    let sealed = queue.seal_batch(batch.id).unwrap();
    assert_eq!(sealed.members as usize, total, "{sealed:?}");
    while queue.batch(batch.id).unwrap().finished_at.is_none() && started.elapsed() < secs(300) {
        std::thread::sleep(ms(200));
    }
    finished.store(true, std::sync::atomic::Ordering::SeqCst);
    let (workers, kills, stops) = disturber.join().unwrap();
    let done = queue.batch(batch.id).unwrap();
    assert!(done.finished_at.is_some(), "the batch never finished: {done:?}");
    wait_until("the callbacks ran", secs(30), || {
        [done.on_failure, done.on_finish]
            .iter()
            .all(|id| queue.get(id.unwrap()).unwrap().state == JobState::Succeeded)
    });
    // Late, stale outcomes of stopped holders come in now: none may move
    // a counter or release anything.
    std::thread::sleep(ms(500));
    File::create(dir.join("stop")).unwrap();
    for mut child in workers {
        child.wait().unwrap();
    }
    pool.shutdown(secs(10));

    let mut states: Vec<JobState> = Vec::new();
    let mut after: Option<JobId> = None;
    loop {
        let page = queue.batch_members(batch.id, after, 1_000).unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        states.extend(page.iter().map(|j| j.state));
    }
    let of = |s: JobState| states.iter().filter(|x| **x == s).count() as u64;
    let done = queue.batch(batch.id).unwrap();
    assert_eq!(states.len(), total);
    assert_eq!(
        (done.members, done.remaining, done.succeeded, done.dead, done.cancelled),
        (total as u64, 0, of(JobState::Succeeded), of(JobState::Dead), of(JobState::Cancelled)),
        "the counters differ from the members' states"
    );
    assert!(done.dead > 0, "every 40th member fails: {done:?}");
    let starts = starts.lock().unwrap().clone();
    let mut kinds: Vec<&str> = starts.iter().map(|s| s.kind.as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, vec!["on_failure", "on_finish"], "each callback once: {starts:?}");
    assert!(starts.iter().all(|s| s.unfinished == 0), "a callback ran before the last member ended: {starts:?}");
    let success = queue.get(done.on_success.unwrap()).unwrap();
    assert_eq!(success.state, JobState::Cancelled);
    assert!(kills >= 2 && stops >= 2, "only {kills} kills and {stops} stops");
    eprintln!(
        "{total} members: {} succeeded, {} dead; {kills} processes killed, {stops} stopped",
        done.succeeded, done.dead
    );
}
}

contract! {
/// The worker side: does nothing unless started by the test above. The
/// first ones add their share of members, then run members until told
/// to stop.
fn batch_soak_worker_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os(ENV_DIR).expect("the test's folder"));
    let batch = BatchId(std::env::var(ENV_BATCH).unwrap().parse().unwrap());
    let queue = Queue::builder(crate::support::engine::target(Path::new(&db)))
        .sqlite(|o| o.durability(tickler::Durability::Normal))
        .retry_policy(no_backoff())
        .open()
        .unwrap();
    if std::env::var(ENV_ADD).as_deref() == Ok("1") {
        let first = fastrand::usize(..1_000_000_000);
        queue
            .enqueue_batch((0..ADDED_BY_EACH).map(|i| member(batch, first + i)).collect())
            .unwrap();
        println!("ADDED");
    }
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .lease(secs(1))
        .poll_interval(ms(50))
        .handler("member", |ctx: &JobContext| -> Result<serde_json::Value, JobError> {
            let n = ctx.payload()["n"].as_u64().unwrap_or(0);
            std::thread::sleep(Duration::from_micros(200 + n % 800));
            if n.is_multiple_of(40) {
                return Err(JobError::permanent("every 40th member fails"));
            }
            Ok(serde_json::json!(n))
        })
        .start()
        .unwrap();
    wait_until("the test's stop", secs(600), || dir.join("stop").exists());
    pool.shutdown(secs(5));
}
}
