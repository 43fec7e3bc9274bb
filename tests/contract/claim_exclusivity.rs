//! Guarantee 2, one holder at a time: however many threads and processes
//! claim from one file at once, every job is handed out exactly once, each
//! claim with its own run_token, and contention never reaches a caller as an
//! error (no `Error::Busy`, no lost lease).

use crate::support::common;
use crate::support::engine;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tickler::{Durability, JobId, JobState, NewJob, Outcome, Queue};

const JOBS: usize = 20_000;
const CHUNK: usize = 1_000;
const LEASE: Duration = Duration::from_secs(600);

/// Set (to the queue file) only in the child processes of
/// [`three_processes_never_share_a_job`].
const CHILD_DB_ENV: &str = "TICKLER_TEST_CHILD_DB";
/// A file whose appearance tells the children to start claiming together.
const CHILD_GO_ENV: &str = "TICKLER_TEST_CHILD_GO";
/// Prefix of the stdout lines in which a child reports a claim.
const CLAIM_LINE: &str = "TICKLER_CLAIMED ";
/// The name of the child test, as the harness knows it.
const CHILD_TEST: &str = "child_claimer";

/// One claim as seen by the claimer: job id, run_token and attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Claimed {
    id: i64,
    token: String,
    attempt: u32,
}

fn open_normal(path: &Path) -> Queue {
    Queue::builder(common::engine::target(path))
        .sqlite(|o| o.durability(Durability::Normal))
        .open()
        .expect("open queue")
}

/// Fills a fresh file with `JOBS` due jobs, in batches; returns their ids.
fn fill(path: &Path) -> Vec<JobId> {
    let queue = open_normal(path);
    let mut ids = Vec::with_capacity(JOBS);
    for chunk in 0..JOBS / CHUNK {
        let batch = (0..CHUNK)
            .map(|i| NewJob::new("work").payload(serde_json::json!({ "n": chunk * CHUNK + i })))
            .collect();
        ids.extend(queue.enqueue_batch(batch).expect("enqueue batch"));
    }
    assert_eq!(ids.len(), JOBS);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        JOBS,
        "enqueue returned duplicate ids"
    );
    ids
}

/// Claims batches of 1..=32 jobs and completes them (one by one or as one
/// group commit, at random) until a claim comes back empty. Every job is due
/// from the start and nothing is ever handed back, so an empty claim means
/// every job has been claimed by someone. Any error ends the loop and is
/// returned with what was claimed before it.
fn claim_until_empty(
    queue: &Queue,
    worker: &str,
    seed: u64,
    mut on_claim: impl FnMut(&Claimed),
) -> (Vec<Claimed>, Option<tickler::Error>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut got = Vec::new();
    loop {
        let max = rng.usize(1..=32);
        let leases = match queue.manual().claim("default", worker, max, LEASE) {
            Ok(leases) => leases,
            Err(e) => return (got, Some(e)),
        };
        if leases.is_empty() {
            return (got, None);
        }
        assert!(
            leases.len() <= max,
            "claim of at most {max} returned {}",
            leases.len()
        );
        for lease in &leases {
            let claimed = Claimed {
                id: lease.job_id.0,
                token: lease.run_token.0.clone(),
                attempt: lease.attempt,
            };
            on_claim(&claimed);
            got.push(claimed);
        }
        if rng.bool() {
            for lease in &leases {
                if let Err(e) = queue.manual().complete(lease) {
                    return (got, Some(e));
                }
            }
        } else {
            let outcomes: Vec<_> = leases.iter().map(|l| (l, Outcome::Complete)).collect();
            match queue.manual().record_outcomes(&outcomes) {
                Ok(results) => {
                    for result in results {
                        if let Err(e) = result {
                            return (got, Some(e));
                        }
                    }
                }
                Err(e) => return (got, Some(e)),
            }
        }
    }
}

/// Every enqueued job was claimed exactly once, on its first attempt, with
/// a distinct well-formed run_token, and the file shows all of them
/// succeeded after exactly one attempt.
fn check_exactly_once(path: &Path, ids: &[JobId], claims: &[Claimed]) {
    let mut times: HashMap<i64, usize> = HashMap::new();
    for c in claims {
        *times.entry(c.id).or_default() += 1;
    }
    let doubled: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "{} jobs were claimed more than once, e.g. {:?}",
        doubled.len(),
        &doubled[..doubled.len().min(10)]
    );
    let missing: Vec<_> = ids.iter().filter(|id| !times.contains_key(&id.0)).collect();
    assert!(
        missing.is_empty(),
        "{} jobs were never claimed, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(claims.len(), ids.len(), "claims besides the enqueued jobs");
    assert!(
        claims.iter().all(|c| c.attempt == 1),
        "a job was claimed on a later attempt"
    );
    let tokens: HashSet<&str> = claims.iter().map(|c| c.token.as_str()).collect();
    assert_eq!(tokens.len(), claims.len(), "two claims share a run_token");
    assert!(
        claims.iter().all(|c| common::is_uuid_v4(&c.token)),
        "a run_token is not a UUID v4"
    );

    let row = common::engine::query_row(
        path,
        "SELECT count(CASE WHEN status = 'succeeded' THEN 1 END),
                count(CASE WHEN attempts = 1 THEN 1 END), count(*) FROM tickler_jobs",
        &[],
    );
    let (succeeded, once, total) = (row[0].int(), row[1].int(), row[2].int());
    assert_eq!(total, JOBS as i64);
    assert_eq!(succeeded, JOBS as i64, "not every job succeeded");
    assert_eq!(once, JOBS as i64, "a job was attempted more than once");

    let stats = open_normal(path).stats().unwrap();
    assert_eq!(stats.total(JobState::Succeeded), JOBS as u64);
    for state in [JobState::Scheduled, JobState::Pending, JobState::Running] {
        assert_eq!(stats.total(state), 0, "jobs left {state}");
    }
}

/// Runs 8 claiming threads, each given its queue handle by `handle`.
fn eight_threads(path: &Path, handle: impl Fn(usize) -> Queue) -> Vec<Claimed> {
    const THREADS: usize = 8;
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let queue = handle(t);
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                claim_until_empty(&queue, &format!("thread-{t}"), 1000 + t as u64, |_| {})
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = Vec::new();
    let mut claimers = 0;
    for (t, thread) in threads.into_iter().enumerate() {
        let (claims, error) = thread.join().expect("claimer thread panicked");
        if let Some(e) = error {
            errors.push(format!(
                "thread {t}: {e} (busy: {}, lease lost: {})",
                e.is_busy(),
                e.is_lease_lost()
            ));
        }
        claimers += usize::from(!claims.is_empty());
        all.extend(claims);
    }
    assert!(errors.is_empty(), "errors reached callers: {errors:?}");
    assert!(
        claimers >= 2,
        "only {claimers} thread got jobs: the claims did not race (file {})",
        path.display()
    );
    all
}

contract! { poolers:
fn eight_threads_with_own_handles_never_share_a_job() {
    let (_dir, path) = common::temp_db();
    let ids = fill(&path);
    let claims = eight_threads(&path, |_| open_normal(&path));
    check_exactly_once(&path, &ids, &claims);
}
}

contract! { poolers:
fn eight_threads_sharing_one_handle_never_share_a_job() {
    let (_dir, path) = common::temp_db();
    let ids = fill(&path);
    let shared = open_normal(&path);
    let claims = eight_threads(&path, |_| shared.clone());
    check_exactly_once(&path, &ids, &claims);
}
}

contract! { poolers:
/// The child side of [`three_processes_never_share_a_job`]: a no-op unless
/// the parent set `TICKLER_TEST_CHILD_DB`.
fn child_claimer() {
    let Some(db) = std::env::var_os(CHILD_DB_ENV) else {
        return;
    };
    let go = PathBuf::from(std::env::var_os(CHILD_GO_ENV).expect("go file env"));
    let queue = open_normal(Path::new(&db));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        assert!(Instant::now() < deadline, "parent never said go");
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = std::process::id();
    let (_, error) = claim_until_empty(&queue, &format!("process-{pid}"), u64::from(pid), |c| {
        println!("{CLAIM_LINE}{} {} {}", c.id, c.token, c.attempt);
    });
    if let Some(e) = error {
        eprintln!(
            "child {pid}: error reached caller: {e} (busy: {})",
            e.is_busy()
        );
        std::process::exit(3);
    }
}
}

contract! { poolers:
fn three_processes_never_share_a_job() {
    const CHILDREN: usize = 3;
    let (dir, path) = common::temp_db();
    let ids = fill(&path);
    let go = dir.path().join("go");

    // The same case of the child body as this one (its engine's).
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            let child = engine::child_case(module_path!(), CHILD_TEST)
                .env(CHILD_DB_ENV, &path)
                .env(CHILD_GO_ENV, &go)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn child");
            // Drain the pipes while the child runs, or it blocks on a full pipe.
            std::thread::spawn(move || child.wait_with_output().expect("wait child"))
        })
        .collect();

    // The parent claims too, in-process, once the children may start.
    let queue = open_normal(&path);
    std::fs::write(&go, b"go").unwrap();
    let (mut claims, error) = claim_until_empty(&queue, "parent", 7, |_| {});
    assert!(error.is_none(), "parent: error reached caller: {error:?}");
    let mut claimers = usize::from(!claims.is_empty());

    for (n, child) in children.into_iter().enumerate() {
        let output = child.join().expect("child waiter panicked");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "child {n} failed ({}): {stderr}",
            output.status
        );
        let before = claims.len();
        for line in BufReader::new(output.stdout.as_slice()).lines() {
            let line = line.unwrap();
            // The harness may print "test child_claimer ... " before the
            // child's first line, so the prefix need not start the line.
            let Some(at) = line.find(CLAIM_LINE) else {
                continue;
            };
            let rest = &line[at + CLAIM_LINE.len()..];
            let mut parts = rest.split(' ');
            let claimed = Claimed {
                id: parts.next().unwrap().parse().unwrap(),
                token: parts.next().unwrap().to_owned(),
                attempt: parts.next().unwrap().parse().unwrap(),
            };
            claims.push(claimed);
        }
        claimers += usize::from(claims.len() > before);
    }
    assert!(
        claimers >= 2,
        "only {claimers} process got jobs: the claims did not race"
    );
    check_exactly_once(&path, &ids, &claims);
}
}
