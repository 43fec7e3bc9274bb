//! Pausing a queue: a persisted flag that every process's claims respect
//! (`Queue::pause_queue`, `resume_queue`, `paused_queues`; `tickler queue
//! pause|resume|list`). Runs on either engine (`contract!`, tests/support/engine.rs); the
//! two-process test re-executes this binary for its child pool.

use crate::support::cli;
use crate::support::pool;

use pool::{ms, open_queue, secs, temp_db, wait_until};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use tickler::{ClaimRequest, Error, JobContext, JobState, NewJob, OutcomeSync, Queue, WorkerPool};

fn claim(queue: &Queue, name: &str) -> usize {
    queue
        .manual()
        .claim(name, "test", 10, secs(30))
        .unwrap()
        .len()
}

contract! {
fn a_paused_queue_is_not_claimed_until_it_is_resumed() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
    queue.enqueue(NewJob::new("k").queue("other")).unwrap();

    queue.pause_queue("mail").unwrap();
    assert_eq!(queue.paused_queues().unwrap(), vec!["mail".to_owned()]);
    assert_eq!(claim(&queue, "mail"), 0, "a paused queue gave a job");
    assert_eq!(
        claim(&queue, "other"),
        1,
        "pausing one queue stopped another"
    );
    assert_eq!(queue.count(JobState::Pending).unwrap(), 1);

    queue.resume_queue("mail").unwrap();
    assert!(queue.paused_queues().unwrap().is_empty());
    assert_eq!(claim(&queue, "mail"), 1);
}
}

contract! {
fn a_claim_over_several_queues_skips_the_paused_one_and_gives_its_share_to_the_rest() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    for q in ["a", "b"] {
        queue
            .enqueue_batch((0..4).map(|_| NewJob::new("k").queue(q)).collect())
            .unwrap();
    }
    queue.pause_queue("a").unwrap();
    let queues = ["a", "b"];
    let request = ClaimRequest {
        queues: &queues,
        worker_id: "test",
        max: 4,
        lease: secs(30),
        kinds: None,
        oldest_first: 0,
    };
    let (_, leases) = queue
        .manual().record_and_claim(&[], Some(&request), OutcomeSync::Now)
        .unwrap();
    assert_eq!(leases.len(), 4, "the open queue gets the whole claim");
    for lease in &leases {
        assert_eq!(queue.get(lease.job_id).unwrap().queue, "b");
    }
}
}

contract! {
fn outcomes_of_jobs_of_a_paused_queue_are_still_recorded() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let id = queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
    let lease = queue.manual().claim("mail", "test", 1, secs(30)).unwrap().remove(0);
    queue.pause_queue("mail").unwrap();
    queue.manual().complete(&lease).unwrap();
    assert_eq!(queue.get(id).unwrap().state, JobState::Succeeded);
}
}

contract! {
fn next_due_sees_nothing_due_in_a_paused_queue() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
    assert!(queue.manual().next_due(&["mail"], None).unwrap().is_some());
    queue.pause_queue("mail").unwrap();
    assert_eq!(queue.manual().next_due(&["mail"], None).unwrap(), None);
    queue.resume_queue("mail").unwrap();
    assert!(queue.manual().next_due(&["mail"], None).unwrap().is_some());
}
}

contract! {
fn the_flag_is_persisted_and_seen_by_every_handle() {
    let (_dir, path) = temp_db();
    let first = open_queue(&path);
    let second = open_queue(&path);
    // A queue may be paused before it has any job.
    first.pause_queue("later").unwrap();
    first.pause_queue("mail").unwrap();
    assert_eq!(
        second.paused_queues().unwrap(),
        vec!["later".to_owned(), "mail".to_owned()]
    );
    drop(first);
    drop(second);
    let reopened = open_queue(&path);
    assert_eq!(reopened.paused_queues().unwrap().len(), 2);
    reopened.enqueue(NewJob::new("k").queue("mail")).unwrap();
    assert_eq!(claim(&reopened, "mail"), 0);
}
}

contract! {
fn pause_and_resume_are_idempotent_and_refuse_an_empty_name() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    queue.pause_queue("mail").unwrap();
    queue.pause_queue("mail").unwrap();
    assert_eq!(queue.paused_queues().unwrap(), vec!["mail".to_owned()]);
    queue.resume_queue("mail").unwrap();
    queue.resume_queue("mail").unwrap();
    queue.resume_queue("never-paused").unwrap();
    assert!(queue.paused_queues().unwrap().is_empty());
    assert!(matches!(queue.pause_queue(""), Err(Error::EmptyQueue)));
    assert!(matches!(queue.resume_queue(""), Err(Error::EmptyQueue)));
}
}

contract! {
fn a_pool_stops_claiming_a_paused_queue_and_resuming_wakes_it() {
    let (_dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut pool = WorkerPool::builder(&queue)
        .queue("mail")
        .threads(2)
        .handler("k", |_: &JobContext| Ok(()))
        .start()
        .unwrap();
    queue.pause_queue("mail").unwrap();
    queue
        .enqueue_batch((0..5).map(|_| NewJob::new("k").queue("mail")).collect())
        .unwrap();
    std::thread::sleep(ms(500));
    assert_eq!(queue.count(JobState::Succeeded).unwrap(), 0);
    assert_eq!(queue.count(JobState::Running).unwrap(), 0);

    queue.resume_queue("mail").unwrap();
    let took = wait_until("the resumed queue's jobs ran", secs(10), || {
        queue.count(JobState::Succeeded).unwrap() == 5
    });
    // Resuming wakes the pool: no wait for its idle poll.
    assert!(took < secs(2), "resumed jobs took {took:?}");
    pool.shutdown(secs(5));
}
}

// ------------------------------------------------------- two processes

const ENV_DB: &str = "TICKLER_PAUSE_CHILD_DB";
const ENV_DIR: &str = "TICKLER_PAUSE_CHILD_DIR";
const CHILD_TEST: &str = "pause_child_pool";

fn spawn_child(db: &Path, dir: &Path) -> Child {
    crate::support::engine::child_case(module_path!(), CHILD_TEST)
        .env(ENV_DB, db)
        .env(ENV_DIR, dir)
        .stdin(Stdio::null())
        .stdout(File::create(dir.join("child.stdout")).unwrap())
        .stderr(File::create(dir.join("child.stderr")).unwrap())
        .spawn()
        .expect("spawn child")
}

contract! {
fn a_pool_in_another_process_stops_claiming_a_paused_queue() {
    let (dir, path) = temp_db();
    let queue = open_queue(&path);
    let mut child = spawn_child(&path, dir.path());
    let output = || {
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
        format!("{}\n{}", read("child.stdout"), read("child.stderr"))
    };
    // The child's pool is running and claiming before the pause.
    queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
    wait_until("the child's pool ran a first job", secs(30), || {
        assert!(
            child.try_wait().unwrap().is_none(),
            "child exited: {}",
            output()
        );
        queue.count(JobState::Succeeded).unwrap() == 1
    });

    queue.pause_queue("mail").unwrap();
    queue
        .enqueue_batch((0..20).map(|_| NewJob::new("k").queue("mail")).collect())
        .unwrap();
    std::thread::sleep(ms(1500));
    assert_eq!(
        queue.count(JobState::Succeeded).unwrap(),
        1,
        "the other process claimed from a paused queue"
    );
    assert_eq!(queue.count(JobState::Pending).unwrap(), 20);

    queue.resume_queue("mail").unwrap();
    wait_until("the child ran the resumed queue", secs(30), || {
        queue.count(JobState::Succeeded).unwrap() == 21
    });
    File::create(dir.path().join("stop")).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {}", output());
    assert!(output().contains("1 passed"), "{}", output());
}
}

contract! {
/// The child side: does nothing unless started by the test above.
fn pause_child_pool() {
    let Some(db) = std::env::var_os(ENV_DB) else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os(ENV_DIR).unwrap());
    let queue = open_queue(Path::new(&db));
    let mut pool = WorkerPool::builder(&queue)
        .queue("mail")
        .threads(2)
        .handler("k", |_: &JobContext| Ok(()))
        .start()
        .unwrap();
    wait_until("the parent's stop", secs(60), || dir.join("stop").exists());
    pool.shutdown(secs(5));
}
}

// ----------------------------------------------------------------- CLI

contract! { sqlite_only:
/// SQLite only: the binary runs on a queue file.
fn the_cli_pauses_lists_and_resumes_queues() {
    let env = cli::Env::new();
    env.run(&["init"]).ok();
    assert_eq!(env.run(&["queue", "list"]).ok(), "");
    assert_eq!(
        env.run(&["queue", "pause", "mail"]).ok(),
        "paused queue mail: 0 pending job(s) wait until `tickler queue resume mail`; \
         0 running job(s) finish\n"
    );
    env.run(&["queue", "pause", "reports"]).ok();
    assert_eq!(env.run(&["queue", "list"]).ok(), "mail\nreports\n");
    assert_eq!(
        env.queue().paused_queues().unwrap(),
        vec!["mail".to_owned(), "reports".to_owned()]
    );
    env.run(&["queue", "resume", "mail"]).ok();
    assert_eq!(env.run(&["queue", "list"]).ok(), "reports\n");
    env.run(&["queue", "pause", ""])
        .fails(1, &["queue name is empty"]);
}
}

/// Failures reported against other job queues' dashboards, metrics
/// endpoints, job events and queue pauses, tried on tickler: they pass and
/// stay as regression tests, each naming the report it follows.
mod other_queues_reports {
    use crate::support::pool;
    use pool::{ms, open_queue, secs, temp_db, wait_until};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tickler::{JobContext, JobState, NewJob, WorkerPool};

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// bull #447 (jobs still processed after a local pause, fetched by a poll
    /// already under way) and sidekiq-limit_fetch #81 (a pause not effective
    /// at once): a busy pool that claims ahead stops starting a paused queue's
    /// jobs within its prefetch hold, and an idle pool never starts a job
    /// enqueued after the pause.
    fn a_pause_stops_a_busy_prefetching_pool_at_once() {
        let (_dir, path) = temp_db();
        let queue = open_queue(&path);
        let started = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&started);
        let mut pool = WorkerPool::builder(&queue)
            .queue("mail")
            .threads(2)
            .handler("k", move |_: &JobContext| {
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(ms(1));
                Ok(())
            })
            .start()
            .unwrap();
        queue
            .enqueue_batch((0..3000).map(|_| NewJob::new("k").queue("mail")).collect())
            .unwrap();
        // Short jobs: the pool claims ahead of its threads by now.
        wait_until("the pool is busy", secs(30), || {
            started.load(Ordering::SeqCst) >= 300
        });
        queue.pause_queue("mail").unwrap();
        let at_pause = started.load(Ordering::SeqCst);
        // Claimed before the pause, run or handed back within the hold.
        std::thread::sleep(ms(300));
        let settled = started.load(Ordering::SeqCst);
        std::thread::sleep(ms(700));
        assert_eq!(
            started.load(Ordering::SeqCst),
            settled,
            "started after pause"
        );
        assert!(
            settled - at_pause <= 64,
            "{} jobs started after the pause returned",
            settled - at_pause
        );
        let left = queue.count(JobState::Pending).unwrap();
        assert!(left >= 1000, "{left} pending");
        assert_eq!(queue.count(JobState::Running).unwrap(), 0);

        // Idle now: a job enqueued into the paused queue waits too.
        let late = queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
        std::thread::sleep(ms(500));
        assert_eq!(queue.get(late).unwrap().state, JobState::Pending);
        queue.resume_queue("mail").unwrap();
        wait_until("the rest ran", secs(60), || {
            queue.count(JobState::Succeeded).unwrap() == 3001
        });
        pool.shutdown(secs(5));
    }
    }

    contract! {
    /// The bug it guards (from a hunt through other queues' reports):
    /// lavinmq #446 (a paused queue resumed on restart), bull #247 (jobs
    /// recovered at start ran although the queue was paused) and bull #1087
    /// (a paused queue ran its delayed jobs once due): after a restart the
    /// pause holds, also for a job whose worker died (taken back by the
    /// reaper) and a delayed job that fell due.
    fn a_pause_holds_across_restarts_for_recovered_and_delayed_jobs() {
        let (_dir, path) = temp_db();
        let (crashed, delayed) = {
            let queue = open_queue(&path);
            queue.pause_queue("mail").unwrap();
            queue.enqueue(NewJob::new("k").queue("mail")).unwrap();
            queue.resume_queue("mail").unwrap();
            // A worker claims it and dies: its lease runs out unrenewed.
            let lease = queue.manual().claim("mail", "gone", 1, ms(200)).unwrap().remove(0);
            queue.pause_queue("mail").unwrap();
            let delayed = queue
                .enqueue(NewJob::new("k").queue("mail").delay(ms(300)))
                .unwrap();
            (lease.job_id, delayed)
        };
        // The process restarts.
        let queue = open_queue(&path);
        assert_eq!(queue.paused_queues().unwrap(), vec!["mail".to_owned()]);
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let mut pool = WorkerPool::builder(&queue)
            .queue("mail")
            .threads(2)
            .handler("k", move |_: &JobContext| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .start()
            .unwrap();
        wait_until(
            "the reaper took the dead worker's job back",
            secs(10),
            || queue.get(crashed).unwrap().state != JobState::Running,
        );
        // Past the retry delay of the taken-back job and the delayed job's
        // due time.
        std::thread::sleep(ms(1500));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        for id in [crashed, delayed] {
            let state = queue.get(id).unwrap().state;
            assert!(
                matches!(state, JobState::Pending | JobState::Scheduled),
                "{id}: {state:?}"
            );
        }
        queue.resume_queue("mail").unwrap();
        wait_until("both ran once resumed", secs(10), || {
            ran.load(Ordering::SeqCst) == 2
        });
        pool.shutdown(secs(5));
    }
    }
}
