//! Guarantee 10, a crash costs only the run it interrupted: an attempt
//! counts when its handler starts, so a job claimed ahead whose holder died
//! before it started gets its attempt back; and a holder known to be gone
//! (a process of this machine that ended, or one of an earlier boot) loses
//! its leases at once, when a queue opens or the reaper passes, rather
//! than when they run out. Leases of another machine, or of a live
//! process, wait for their expiry.
//!
//! The holders of other processes, boots and machines are played by
//! queues opened with another [`Holder`]; the restart after a SIGKILL is
//! a real child process.

use crate::support::common;
use crate::support::engine;

use common::{secs, t0};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tickler::holder::Holder;
use tickler::{ClaimRequest, JobId, JobState, ManualClock, NewJob, OutcomeSync, Queue};

/// Claims up to `max` jobs as a worker pool does: ahead of its handlers.
fn claim_ahead(queue: &Queue, max: usize, lease: Duration) -> Vec<tickler::Lease> {
    let request = ClaimRequest {
        queues: &["default"],
        worker_id: "w",
        max,
        lease,
        kinds: None,
        oldest_first: 0,
    };
    queue
        .manual()
        .record_and_claim_ahead(&[], Some(&request), OutcomeSync::Now)
        .unwrap()
        .1
}

/// A queue on `path` at [`t0`] on a manual clock, claiming as `holder`.
fn queue_as(path: &Path, holder: Holder) -> (Queue, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(t0()));
    let queue = Queue::builder(engine::target(path))
        .clock(clock.clone())
        .retry_policy(common::fixed_policy())
        .holder(holder)
        .open()
        .expect("open queue");
    (queue, clock)
}

contract! {
fn a_run_that_never_started_gives_its_attempt_back_when_its_lease_runs_out() {
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("once").max_attempts(1)).unwrap();

    // Claimed ahead, never started, the holder died: the lease runs out.
    let lease = claim_ahead(&queue, 1, secs(10)).remove(0);
    assert_eq!((lease.attempt, lease.given_back), (1, 0));
    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let job = queue.get(id).unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Pending, 0),
        "a run that never started used the job's only attempt: {job:?}"
    );
    assert_eq!(job.last_error, None, "nothing failed: {job:?}");
    assert_eq!(job.errors.len(), 1, "the history says what happened");
    assert!(job.errors[0].error.contains("not started"), "{:?}", job.errors);
    assert!(queue.manual().complete(&lease).unwrap_err().is_lease_lost());

    // Claimed again: the pool records the start (before the handler, as it
    // was given back once); now a lost lease counts the attempt.
    let lease = claim_ahead(&queue, 1, secs(10)).remove(0);
    assert_eq!((lease.attempt, lease.given_back), (1, 1));
    queue.manual().mark_started(&[&lease]).unwrap();
    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    let job = queue.get(id).unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Dead, 1), "{job:?}");
    assert!(job.last_error.unwrap().contains("lease expired"));
}
}

contract! {
fn a_claim_that_is_not_ahead_starts_its_run() {
    // `Manual::claim` hands out runs its caller starts at once: a lost
    // lease counts the attempt, as it always did.
    let (_dir, path) = common::temp_db();
    let (queue, clock) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let id = queue.enqueue(NewJob::new("once").max_attempts(1)).unwrap();
    queue.manual().claim("default", "w", 1, secs(10)).unwrap();
    clock.advance(secs(11));
    assert_eq!(queue.manual().reap().unwrap(), 1);
    assert_eq!(queue.get(id).unwrap().state, JobState::Dead);
}
}

contract! {
fn an_earlier_boots_leases_are_taken_back_at_once_and_another_machines_wait() {
    let (_dir, path) = common::temp_db();
    let me = Holder::this_process();
    // The machine rebooted 10 minutes after t0; its processes of before
    // are gone. A holder with the same machine and another boot that was
    // seen alive after that is another machine with a copied identity.
    let rebooted = Holder {
        boot: "this-boot".into(),
        booted_at_ms: (t0() + chrono::Duration::minutes(10)).timestamp_millis(),
        ..me.clone()
    };
    let earlier_boot = Holder {
        boot: "an-earlier-boot".into(),
        ..me.clone()
    };
    let other_machine = Holder {
        machine: "another-machine".into(),
        ..me.clone()
    };
    let twin = Holder {
        boot: "the-twins-boot".into(),
        ..earlier_boot.clone()
    };
    let (before, _) = queue_as(&path, earlier_boot);
    let (twin, twin_clock) = queue_as(&path, twin);
    let (elsewhere, _) = queue_as(&path, other_machine);
    let ids: Vec<JobId> = (0..3)
        .map(|_| before.enqueue(NewJob::new("k")).unwrap())
        .collect();
    let hour = secs(3600);
    let lost = claim_ahead(&before, 1, hour).remove(0);
    before.manual().mark_started(&[&lost]).unwrap();
    twin_clock.advance(secs(20 * 60));
    let twins = twin.manual().claim("default", "w", 1, hour).unwrap().remove(0);
    let remote = elsewhere.manual().claim("default", "w", 1, hour).unwrap().remove(0);

    let (after, _) = queue_as(&path, rebooted);
    let job = after.get(lost.job_id).unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Scheduled, 1),
        "the earlier boot's started run was not taken back at open, its attempt counted: {job:?}"
    );
    assert!(job.last_error.unwrap().contains("worker gone"));
    assert!(before.manual().complete(&lost).unwrap_err().is_lease_lost());
    for kept in [&twins, &remote] {
        assert_eq!(
            after.get(kept.job_id).unwrap().state,
            JobState::Running,
            "a lease of another machine was taken back early"
        );
        assert_eq!(after.manual().reap().unwrap(), 0);
    }
    assert_eq!(ids.len(), 3);
}
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/PID/stat`).
#[cfg(target_os = "linux")]
fn process_start(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 1..];
    after_name
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

#[cfg(target_os = "linux")]
contract! {
fn a_process_id_reused_by_another_process_is_not_taken_for_the_holder() {
    let (_dir, path) = common::temp_db();
    let me = Holder::this_process();
    let mut unrelated = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = unrelated.id();
    // The holder had the id `pid`, but started at another time: the
    // process now with that id is not it.
    let gone = Holder {
        pid,
        start: process_start(pid) + 1,
        ..me.clone()
    };
    // The process with that id and start time is alive: its lease stays.
    let alive = Holder {
        pid,
        start: process_start(pid),
        ..me.clone()
    };
    // Opened first: the reaper's pass finds the gone holder (not only
    // an open).
    let (queue, _) = common::manual_queue_with_policy(&path, common::fixed_policy());
    let (gone_queue, _) = queue_as(&path, gone);
    let (alive_queue, _) = queue_as(&path, alive);
    for _ in 0..2 {
        gone_queue.enqueue(NewJob::new("k")).unwrap();
    }
    let hour = secs(3600);
    let lost = claim_ahead(&gone_queue, 1, hour).remove(0);
    let kept = claim_ahead(&alive_queue, 1, hour).remove(0);
    let taken = queue.manual().reap_at(t0()).unwrap();
    let _ = unrelated.kill();
    let _ = unrelated.wait();
    let job = queue.get(lost.job_id).unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Pending, 0),
        "a gone holder's unstarted run was not given back at once: {job:?}"
    );
    assert_eq!(taken, 1);
    assert_eq!(queue.get(kept.job_id).unwrap().state, JobState::Running);
}
}

const ENV_DB: &str = "TICKLER_CRASH_CHILD_DB";
const ENV_READY: &str = "TICKLER_CRASH_CHILD_READY";

contract! {
/// The child of [`a_restarted_process_takes_back_its_predecessors_jobs_at_once`]
/// (does nothing unless started by it): claims both jobs ahead with an
/// hour's lease, records the start of the first, says so, and waits to be
/// killed.
fn crash_child_process() {
    let (Ok(db), Ok(ready)) = (std::env::var(ENV_DB), std::env::var(ENV_READY)) else {
        return;
    };
    let queue = Queue::open(&db).expect("child: open");
    let leases = claim_ahead(&queue, 2, secs(3600));
    assert_eq!(leases.len(), 2, "child: claimed {leases:?}");
    queue.manual().mark_started(&[&leases[0]]).unwrap();
    std::fs::write(&ready, format!("{}", leases[0].job_id)).unwrap();
    std::thread::sleep(secs(600));
}
}

contract! {
fn a_restarted_process_takes_back_its_predecessors_jobs_at_once() {
    let (dir, path) = common::temp_db();
    let queue = Queue::open(engine::target(&path)).unwrap();
    let ids: Vec<JobId> = (0..2)
        .map(|_| queue.enqueue(NewJob::new("k").max_attempts(1)).unwrap())
        .collect();
    drop(queue);
    let ready = dir.path().join("ready");
    let mut child = engine::child_case(module_path!(), "crash_child_process")
        .env(ENV_DB, engine::target(&path))
        .env(ENV_READY, &ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("child.stderr")).unwrap())
        .spawn()
        .unwrap();
    common::wait_until("the child claimed", secs(60), || {
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "the child exited: {}",
            std::fs::read_to_string(dir.path().join("child.stderr")).unwrap_or_default()
        );
        ready.exists()
    });
    let started: i64 = std::fs::read_to_string(&ready).unwrap().parse().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let reopened = Instant::now();
    let queue = Queue::open(engine::target(&path)).unwrap();
    let took = reopened.elapsed();
    for id in ids {
        let job = queue.get(id).unwrap();
        if id.0 == started {
            // Its one attempt was used by the run the kill interrupted.
            assert_eq!(job.state, JobState::Dead, "{job:?}");
            assert!(job.last_error.unwrap().contains("worker gone"));
        } else {
            assert_eq!(
                (job.state, job.attempts),
                (JobState::Pending, 0),
                "the killed holder's unstarted job was not given back at the restart: {job:?}"
            );
        }
    }
    assert!(took < secs(30), "open took {took:?}");
}
}

contract! { poolers:
fn a_pool_records_each_start_so_that_a_crash_during_the_run_counts_it() {
    use crate::support::pool::{one_blocked_job, Recorder};
    let (_dir, path) = common::temp_db();
    // The pool's process plays one that is gone by the time it is judged.
    let vanished = Holder {
        pid: 1 << 30,
        ..Holder::this_process()
    };
    let pool_queue = Queue::builder(engine::target(&path))
        .retry_policy(common::fixed_policy())
        .holder(vanished)
        .open()
        .unwrap();
    let rec = Recorder::new();
    let (mut pool, id) = one_blocked_job(&pool_queue, &rec, secs(3600));
    common::wait_until("the pool recorded the start", secs(30), || {
        engine::query_int(
            &path,
            "SELECT count(*) FROM tickler_jobs WHERE started_at IS NOT NULL",
            &[],
        ) == 1
    });
    let queue = Queue::open(engine::target(&path)).unwrap();
    let job = queue.get(id).unwrap();
    assert_eq!(
        (job.state, job.attempts),
        (JobState::Scheduled, 1),
        "a run whose start was recorded did not count when its holder was gone: {job:?}"
    );
    rec.gate.open();
    pool.shutdown(secs(30));
}
}
