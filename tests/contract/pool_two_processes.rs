//! Worker pools in two OS processes on one file never deliver a job twice.
//!
//! The parent enqueues 5,000 jobs, then re-executes this test binary twice,
//! running only [`pool_child_process`]. Both children open the file, say they
//! are ready, wait for the parent's "go" (so their pools really overlap),
//! then run a pool whose handler appends `id,run_token` to the child's own
//! ledger file, one `write` per line on an `O_APPEND` file. A child exits
//! once no job is scheduled, pending or running. The parent checks that every
//! job appears exactly once across both ledgers, with the run_token the row
//! ended with. The same body runs with sync handlers and (feature `tokio`)
//! with async handlers in the children.

use crate::support::pool;

use pool::{flavored_tests, Flavor};
use pool::{ms, open_queue, secs, temp_db, wait_until};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Instant;
use tickler::{JobContext, JobError, JobFilter, JobId, JobState, NewJob, WorkerPool};

const JOBS: usize = 5_000;
const ENV_DB: &str = "TICKLER_POOL_CHILD_DB";
const ENV_DIR: &str = "TICKLER_POOL_CHILD_DIR";
const ENV_NAME: &str = "TICKLER_POOL_CHILD_NAME";
const ENV_FLAVOR: &str = "TICKLER_POOL_CHILD_FLAVOR";
const CHILD_TEST: &str = "pool_child_process";

fn flavor_name(flavor: &Flavor) -> &'static str {
    match flavor {
        Flavor::Sync => "sync",
        #[cfg(feature = "tokio")]
        Flavor::Tokio(_) => "tokio",
    }
}

fn spawn_child(db: &Path, dir: &Path, name: &str, flavor: &Flavor) -> Child {
    crate::support::engine::child_case(module_path!(), CHILD_TEST)
        .env(ENV_DB, db)
        .env(ENV_DIR, dir)
        .env(ENV_NAME, name)
        .env(ENV_FLAVOR, flavor_name(flavor))
        .stdin(Stdio::null())
        .stdout(File::create(dir.join(format!("{name}.stdout"))).unwrap())
        .stderr(File::create(dir.join(format!("{name}.stderr"))).unwrap())
        .spawn()
        .expect("spawn child test process")
}

fn child_output(dir: &Path, name: &str) -> String {
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{name}.{ext}")));
    format!(
        "--- {name} stdout ---\n{}\n--- {name} stderr ---\n{}",
        read("stdout").unwrap_or_default(),
        read("stderr").unwrap_or_default()
    )
}

/// `(job id, run_token)` per ledger line.
fn read_ledger(path: &Path) -> Vec<(i64, String)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading ledger {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let (id, token) = line
                .split_once(',')
                .unwrap_or_else(|| panic!("torn ledger line {line:?} in {}", path.display()));
            (id.parse().expect("job id"), token.to_owned())
        })
        .collect()
}

fn two_pools_in_two_processes_never_deliver_a_job_twice(flavor: &Flavor) {
    let (dir, path) = temp_db();
    let queue = open_queue(&path);
    let ids: Vec<JobId> = queue
        .enqueue_batch((0..JOBS).map(|_| NewJob::new("ledger")).collect())
        .unwrap();
    assert_eq!(ids.len(), JOBS);

    let names = ["a", "b"];
    let mut children: Vec<(String, Child)> = names
        .iter()
        .map(|n| (n.to_string(), spawn_child(&path, dir.path(), n, flavor)))
        .collect();

    // Both children ready before either starts its pool.
    let started = Instant::now();
    while !names
        .iter()
        .all(|n| dir.path().join(format!("{n}.ready")).exists())
    {
        for (name, child) in &mut children {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "child {name} exited early with {status}\n{}",
                    child_output(dir.path(), name)
                );
            }
        }
        assert!(
            started.elapsed() < secs(30),
            "children did not get ready in 30 s"
        );
        std::thread::sleep(ms(5));
    }
    File::create(dir.path().join("go")).unwrap();

    for (name, child) in &mut children {
        let deadline = Instant::now() + secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "child {name} still running after 60 s\n{}",
                    child_output(dir.path(), name)
                );
            }
            std::thread::sleep(ms(10));
        };
        assert!(
            status.success(),
            "child {name} failed: {status}\n{}",
            child_output(dir.path(), name)
        );
        let out = child_output(dir.path(), name);
        assert!(
            out.contains("1 passed"),
            "child {name} did not run {CHILD_TEST}:\n{out}"
        );
    }

    // Every job exactly once across both ledgers.
    let mut seen: HashMap<i64, Vec<(String, String)>> = HashMap::new();
    let mut per_child = Vec::new();
    for name in names {
        let lines = read_ledger(&dir.path().join(format!("{name}.ledger")));
        per_child.push((name, lines.len()));
        for (id, token) in lines {
            seen.entry(id).or_default().push((name.to_owned(), token));
        }
    }
    let total: usize = per_child.iter().map(|(_, n)| n).sum();
    let duplicates: Vec<_> = seen.iter().filter(|(_, v)| v.len() > 1).take(10).collect();
    assert!(
        duplicates.is_empty(),
        "jobs delivered more than once (per child counts {per_child:?}): {duplicates:?}"
    );
    assert_eq!(total, JOBS, "deliveries per child: {per_child:?}");
    for id in &ids {
        assert!(seen.contains_key(&id.0), "job {id} was never delivered");
    }
    eprintln!("deliveries per child: {per_child:?}");

    // The file agrees: all succeeded after one claim, each with the
    // run_token of the run in the ledger.
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), JOBS as u64);
    let rows = queue
        .list(&JobFilter {
            limit: JOBS + 10,
            ..JobFilter::default()
        })
        .unwrap();
    assert_eq!(rows.len(), JOBS);
    for row in rows {
        assert_eq!(row.state, JobState::Succeeded, "job {}", row.id);
        assert_eq!(row.attempts, 1, "job {} was claimed more than once", row.id);
        let token = &seen[&row.id.0][0].1;
        assert_eq!(
            row.run_token.as_ref().map(|t| t.0.as_str()),
            Some(token.as_str()),
            "job {}: row's run_token is not the delivered one",
            row.id
        );
    }
}

flavored_tests!(poolers: two_pools_in_two_processes_never_deliver_a_job_twice,);

/// One ledger line per delivery: one write(2) per line on an O_APPEND
/// file, so lines never interleave.
fn append(ledger: &File, ctx: &JobContext) -> Result<(), JobError> {
    let line = format!("{},{}\n", ctx.job_id(), ctx.run_token());
    let written = (&*ledger).write(line.as_bytes()).map_err(JobError::retry)?;
    assert_eq!(written, line.len(), "short ledger write");
    Ok(())
}

contract! { poolers:
/// The child side: does nothing unless started by the test above.
fn pool_child_process() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let db = PathBuf::from(db);
    let dir = PathBuf::from(std::env::var_os(ENV_DIR).expect("child dir"));
    let name = std::env::var(ENV_NAME).expect("child name");

    let queue = open_queue(&db);
    let ledger = Arc::new(
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join(format!("{name}.ledger")))
            .expect("open ledger"),
    );
    File::create(dir.join(format!("{name}.ready"))).unwrap();
    wait_until("the parent's go", secs(30), || dir.join("go").exists());

    let handler_ledger = Arc::clone(&ledger);
    let builder = WorkerPool::builder(&queue)
        .threads(4)
        .shutdown_grace(secs(10));
    // Kept alive until the pool is shut down.
    let flavor = match std::env::var(ENV_FLAVOR).as_deref() {
        #[cfg(feature = "tokio")]
        Ok("tokio") => Flavor::tokio(),
        _ => Flavor::sync(),
    };
    let builder = match &flavor {
        Flavor::Sync => builder.handler("ledger", move |ctx: &JobContext| {
            append(&handler_ledger, ctx)
        }),
        #[cfg(feature = "tokio")]
        Flavor::Tokio(runtime) => builder.runtime(runtime.handle().clone()).async_handler(
            "ledger",
            move |ctx: JobContext| {
                let ledger = Arc::clone(&handler_ledger);
                async move { append(&ledger, &ctx) }
            },
        ),
    };
    let mut pool = builder.start().unwrap();

    wait_until("no job scheduled, pending or running", secs(50), || {
        [JobState::Scheduled, JobState::Pending, JobState::Running]
            .into_iter()
            .all(|s| queue.count(s).unwrap() == 0)
    });
    let report = pool.shutdown(secs(10));
    assert_eq!(report.still_running, 0, "{report:?}");
    ledger.sync_all().unwrap();
    println!("child {name}: done, {report:?}");
}
}
