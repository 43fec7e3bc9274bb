//! A concurrency limit holds across OS processes that are killed with
//! SIGKILL and restarted: 3 processes × 8 handler threads run jobs of 20
//! keys with `max_per_key` 2, each 20–80 ms long, while the parent kills
//! one process every ~0.7 s and starts another. An oracle outside the
//! queue sees every handler: on entering, under the key's lock (`flock` of
//! a file per key), it adds an entry of its own to the key's folder and
//! counts the entries; on leaving, it removes its entry. The parent removes
//! a killed process's entries once it has reaped it. The oracle never
//! counts more than 2 per key, every job succeeds, and once all is quiet
//! the reaper's safety sweep finds no blocked job with a free slot.
//!
//! `TICKLER_LIMIT_SOAK_SECS` sets how long the killing lasts (default 6;
//! RELIABILITY.md reports minutes), with 300 jobs per second of it (at
//! least 600), about what the processes can run.

use crate::support::pool;

use pool::{open_queue, secs, temp_db, wait_until};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tickler::{JobContext, JobError, JobState, Limit, NewJob, Reaper, ReaperConfig, WorkerPool};

const KEYS: usize = 20;
const PER_KEY: u32 = 2;
const PROCESSES: usize = 3;
const ENV_DB: &str = "TICKLER_LIMIT_SOAK_DB";
const ENV_DIR: &str = "TICKLER_LIMIT_SOAK_DIR";
const CHILD_TEST: &str = "limit_soak_child_process";

/// Holds `flock(LOCK_EX)` on `path` while `f` runs.
fn locked<T>(path: &Path, f: impl FnOnce() -> T) -> T {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the key's lock file");
    // SAFETY: flock on a descriptor this function owns for its whole use.
    assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
    let out = f();
    drop(file);
    out
}

/// The key's folder of live entries, and its lock file.
fn key_paths(dir: &Path, key: &str) -> (PathBuf, PathBuf) {
    (
        dir.join("live").join(key),
        dir.join("live").join(format!("{key}.lock")),
    )
}

fn spawn_child(db: &Path, dir: &Path, n: usize) -> Child {
    crate::support::engine::child_case(module_path!(), CHILD_TEST)
        .env(ENV_DB, db)
        .env(ENV_DIR, dir)
        .stdin(Stdio::null())
        .stdout(File::create(dir.join(format!("child-{n}.out"))).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child test process")
}

contract! { poolers:
fn a_limit_holds_across_processes_killed_and_restarted() {
    let (dir, path) = temp_db();
    let dir = dir.path().to_path_buf();
    let queue = open_queue(&path);
    queue.set_limit("soak", Limit::per_key(PER_KEY)).unwrap();
    for key in 0..KEYS {
        std::fs::create_dir_all(dir.join("live").join(format!("k{key}"))).unwrap();
    }
    let soak: u64 = std::env::var("TICKLER_LIMIT_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let total = 600.max(soak as usize * 300);
    let jobs: Vec<NewJob> = (0..total)
        .map(|i| {
            NewJob::new("soak")
                .limit("soak", format!("k{}", i % KEYS))
                .payload(serde_json::json!({ "ms": 20 + (i * 37) % 61 }))
                .max_attempts(1_000)
        })
        .collect();
    for chunk in jobs.chunks(5_000) {
        queue.enqueue_batch(chunk.to_vec()).unwrap();
    }
    // The reaper of the parent, which is never killed.
    let mut reaper = Reaper::spawn(
        queue.clone(),
        ReaperConfig {
            interval: Duration::from_millis(200),
            ..ReaperConfig::default()
        },
    );

    let mut children: Vec<(Child, usize)> = Vec::new();
    let mut next = 0;
    for _ in 0..PROCESSES {
        children.push((spawn_child(&path, &dir, next), next));
        next += 1;
    }
    let started = Instant::now();
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(soak) {
        std::thread::sleep(Duration::from_millis(700));
        let victim = fastrand::usize(..children.len());
        let (mut child, _) = children.swap_remove(victim);
        let pid = child.id();
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        // Its handlers are gone: their entries leave the oracle.
        for key in 0..KEYS {
            let (live, lock) = key_paths(&dir, &format!("k{key}"));
            locked(&lock, || {
                for entry in std::fs::read_dir(&live).unwrap() {
                    let entry = entry.unwrap();
                    let name = entry.file_name().into_string().unwrap();
                    if name.starts_with(&format!("{pid}-")) {
                        std::fs::remove_file(entry.path()).unwrap();
                    }
                }
            });
        }
        children.push((spawn_child(&path, &dir, next), next));
        next += 1;
    }
    wait_until("every job succeeded", secs(120), || {
        queue.stats().unwrap().total(JobState::Succeeded) == total as u64
    });
    File::create(dir.join("stop")).unwrap();
    for (mut child, n) in children {
        let status = child.wait().unwrap();
        assert!(status.success(), "child {n}: {status}");
    }
    reaper.stop();
    let violations = std::fs::read_to_string(dir.join("violations")).unwrap_or_default();
    assert!(violations.is_empty(), "more than {PER_KEY} at once:\n{violations}");
    assert!(kills >= 3, "only {kills} kills");
    eprintln!("{total} jobs, {kills} processes killed, no key over {PER_KEY}");
    assert_eq!(queue.manual().sweep_limits().unwrap(), 0);
    assert_eq!(queue.ops().limit_sweep_unblocked(), 0, "the reaper's sweep found missed slots");
    let counts = queue.stats().unwrap();
    for state in [JobState::Blocked, JobState::Pending, JobState::Running, JobState::Dead] {
        assert_eq!(counts.total(state), 0, "{state}: {counts:?}");
    }
}
}

contract! { poolers:
/// The child side: does nothing unless started by the test above.
fn limit_soak_child_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let db = PathBuf::from(db);
    let dir = PathBuf::from(std::env::var_os(ENV_DIR).expect("child dir"));
    let queue = open_queue(&db);
    let handler_dir = dir.clone();
    let pid = std::process::id();
    let mut pool = WorkerPool::builder(&queue)
        .threads(8)
        .lease(secs(5))
        .handler("soak", move |ctx: &JobContext| -> Result<(), JobError> {
            let key = ctx.lease().limit.as_ref().expect("a limited job").key.clone();
            let (live, lock) = key_paths(&handler_dir, &key);
            let entry = live.join(format!("{pid}-{}-{}", ctx.job_id(), ctx.run_token()));
            let holders = locked(&lock, || {
                File::create(&entry).unwrap();
                std::fs::read_dir(&live).unwrap().count()
            });
            if holders > PER_KEY as usize {
                let mut violations = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(handler_dir.join("violations"))
                    .unwrap();
                writeln!(violations, "key {key}: {holders} holders at once").unwrap();
            }
            let ms = ctx.payload()["ms"].as_u64().unwrap_or(20);
            std::thread::sleep(Duration::from_millis(ms));
            locked(&lock, || std::fs::remove_file(&entry).unwrap());
            Ok(())
        })
        .start()
        .unwrap();
    wait_until("the parent's stop", secs(300), || dir.join("stop").exists());
    pool.shutdown(secs(10));
}
}
