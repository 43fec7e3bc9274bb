//! A real standby taking over: a primary and a streaming standby of their
//! own (`.ci/pg-standby`), a URL that names both with
//! `target_session_attrs=read-write`, and the primary stopped at once (as a
//! crash does) with the standby promoted in the middle of work. PostgreSQL
//! alone: the other engines have no standby to promote here.

use crate::support::pg::StandbyPair;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tickler::{Error, JobContext, JobError, JobId, JobState, NewJob, Queue, WorkerPool};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Jobs enqueued one by one from a thread until told to stop: each
/// acknowledged id with when its enqueue returned, and every error that
/// reached the caller.
struct Producer {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(JobId, Instant)>>>,
    errors: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Producer {
    fn start(queue: &Queue) -> Producer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (queue, stop, acked, errors) =
                (queue.clone(), stop.clone(), acked.clone(), errors.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match queue.enqueue(NewJob::new("work")) {
                        Ok(id) => acked.lock().unwrap().push((id, Instant::now())),
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Producer {
            stop,
            acked,
            errors,
            thread: Some(thread),
        }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn wait_for(&self, n: usize, what: &str) {
        let deadline = Instant::now() + secs(90);
        while self.acked() < n {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {n} acknowledged; errors: {:?}",
                self.acked(),
                self.errors.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn finish(mut self) -> (Vec<(JobId, Instant)>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().expect("producer");
        let acked = self.acked.lock().unwrap().clone();
        let errors = self.errors.lock().unwrap().clone();
        (acked, errors)
    }
}

/// Waits until the standby has replayed everything the primary wrote so far.
fn caught_up(pair: &StandbyPair) {
    let lsn: String = pair
        .connect(false)
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .unwrap()
        .get(0);
    let mut standby = pair.connect(true);
    let deadline = Instant::now() + secs(60);
    while !standby
        .query_one(
            "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
            &[&lsn],
        )
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the standby did not catch up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With synchronous replication every commit tickler acknowledged is on
/// the standby before the acknowledgement, so a failover in the middle of
/// enqueues, claims and completions loses no job, every job still runs to
/// success, and no error reaches the application: the pool's connections
/// and the listener find the promoted standby through the URL's second
/// host within the retry window.
#[test]
fn with_synchronous_replication_a_failover_loses_no_acknowledged_job() {
    let Some(pair) = StandbyPair::start("sync", true) else {
        return;
    };
    let queue = Queue::open(pair.url()).expect("open");
    let runs: Arc<Mutex<HashMap<JobId, usize>>> = Arc::default();
    let counted = runs.clone();
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        // A job whose lease went with the primary comes back soon.
        .lease(secs(5))
        .handler("work", move |ctx: &JobContext| -> Result<(), JobError> {
            std::thread::sleep(Duration::from_millis(2));
            *counted.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
            Ok(())
        })
        .start()
        .expect("start pool");
    let producer = Producer::start(&queue);
    producer.wait_for(200, "before the failover");
    let before = producer.acked();
    pair.failover();
    let promoted = Instant::now();
    producer.wait_for(before + 200, "after the failover");
    let (acked, errors) = producer.finish();
    assert!(errors.is_empty(), "errors reached the caller: {errors:?}");
    let first_after = acked
        .iter()
        .find(|(_, at)| *at > promoted)
        .map(|(_, at)| at.duration_since(promoted))
        .expect("an enqueue after the promotion");
    eprintln!("the first enqueue acknowledged after the promotion: {first_after:?} after it");

    // Every acknowledged job is on the promoted standby and runs.
    let deadline = Instant::now() + secs(90);
    let mut lost = Vec::new();
    for (id, _) in &acked {
        loop {
            match queue.get(*id) {
                Ok(job) if job.state == JobState::Succeeded => break,
                Ok(job) => {
                    assert!(
                        Instant::now() < deadline,
                        "job {id:?} is {:?} long after the failover",
                        job.state
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(Error::NotFound(_)) => {
                    lost.push(*id);
                    break;
                }
                Err(e) => panic!("get {id:?}: {e}"),
            }
        }
    }
    assert!(
        lost.is_empty(),
        "acknowledged jobs lost in the failover: {lost:?}"
    );
    let report = pool.shutdown(secs(10));
    let runs = runs.lock().unwrap();
    let twice = runs.values().filter(|n| **n > 1).count();
    eprintln!(
        "{} jobs, {twice} run more than once (a lease or outcome in flight at the crash); pool: {report:?}",
        acked.len()
    );
    assert!(acked.iter().all(|(id, _)| runs.contains_key(id)));
    // The queue's connections are on the promoted standby: the primary is down.
    let mut standby = pair.connect(true);
    let stored: i64 = standby
        .query_one("SELECT count(*) FROM tickler_jobs", &[])
        .unwrap()
        .get(0);
    assert_eq!(stored, acked.len() as i64);
}

/// With asynchronous replication the primary acknowledges a commit before
/// the standby has it, so a failover loses exactly what the standby had not
/// received: jobs enqueued are gone (their ids were returned, and are
/// given again to new jobs), outcomes
/// are undone (the job runs again once its lease runs out), and claims are
/// undone (the job can be claimed again while its first worker still runs
/// it, whose outcome is then refused as a lost lease). Everything the
/// standby had received is kept. Here the standby stops receiving at a
/// known point (`cut`), so each group is known exactly.
#[test]
fn with_asynchronous_replication_a_failover_loses_what_the_standby_had_not_received() {
    let Some(pair) = StandbyPair::start("async", false) else {
        return;
    };
    let queue = Queue::open(pair.url()).expect("open");
    let manual = queue.manual();
    let lease = secs(600);

    // Received by the standby: 100 jobs, 50 of them completed, 20 claimed.
    let kept: Vec<JobId> = (0..100)
        .map(|_| queue.enqueue(NewJob::new("work")).expect("enqueue"))
        .collect();
    let completed = manual.claim("default", "w1", 50, lease).expect("claim");
    for l in &completed {
        manual.complete(l).expect("complete");
    }
    let claimed_before = manual.claim("default", "w1", 20, lease).expect("claim");
    caught_up(&pair);
    pair.cut();

    // Acknowledged by the primary alone.
    // More than the 32 ids the server's sequence writes ahead of use.
    let gone: Vec<JobId> = (0..70)
        .map(|_| queue.enqueue(NewJob::new("work")).expect("enqueue"))
        .collect();
    for l in &claimed_before {
        manual.complete(l).expect("complete");
    }
    let claimed_after = manual.claim("default", "w1", 10, lease).expect("claim");
    assert_eq!(claimed_after.len(), 10);

    pair.failover();

    for id in &gone {
        assert!(
            matches!(queue.get(*id), Err(Error::NotFound(_))),
            "job {id:?}, enqueued after the standby stopped receiving, survived"
        );
    }
    let state = |id: JobId| queue.get(id).expect("a job the standby had").state;
    for l in &completed {
        assert_eq!(state(l.job_id), JobState::Succeeded);
    }
    for l in &claimed_before {
        assert_eq!(
            state(l.job_id),
            JobState::Running,
            "a completion the standby never received is undone"
        );
    }
    for l in &claimed_after {
        assert_eq!(
            state(l.job_id),
            JobState::Pending,
            "a claim the standby never received is undone"
        );
    }
    assert_eq!(
        kept.iter().filter(|id| queue.get(**id).is_ok()).count(),
        100
    );
    // The undone claim's jobs go to the next worker; the first worker's
    // outcome is then refused.
    let again = manual.claim("default", "w2", 100, lease).expect("claim");
    let again_ids: Vec<JobId> = again.iter().map(|l| l.job_id).collect();
    for l in &claimed_after {
        assert!(again_ids.contains(&l.job_id));
        assert!(
            matches!(manual.complete(l), Err(Error::LeaseLost { .. })),
            "the outcome of a claim the failover undid is refused"
        );
    }
    // A completion the failover undid is simply sent again.
    for l in &claimed_before {
        manual.complete(l).expect("the same completion again");
        assert_eq!(state(l.job_id), JobState::Succeeded);
    }
    // The sequence the standby had went on from what it had received: a
    // new job is given the id of a lost one (what the docs warn of).
    let next = queue.enqueue(NewJob::new("work")).expect("enqueue");
    assert!(
        gone.contains(&next),
        "the first id after the failover, {next:?}, is none of the lost {:?}..={:?}",
        gone[0],
        gone[gone.len() - 1]
    );
}

/// Due times and leases are counted on the database server's clock; after
/// a failover that is the new primary's, which here runs an hour ahead of
/// the old one's. The queue reads it within seconds of reaching the new
/// primary (not at its next periodic sample, up to 30 s later): a job
/// delayed by 30 minutes is then due, and a lease of 10 minutes taken
/// before the switch has run out and is reaped.
#[test]
fn after_a_failover_due_times_and_leases_follow_the_new_primarys_clock() {
    let ahead = secs(3600);
    let Some(pair) = StandbyPair::start_with_standby_ahead("clock", false, Some(ahead)) else {
        return;
    };
    let standby_ms = |pair: &StandbyPair| -> i64 {
        pair.connect(true)
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let queue = Queue::open(pair.url()).expect("open");
    let manual = queue.manual();
    let old_ms = queue.clock().now_ms();
    let shift = standby_ms(&pair) - old_ms;
    assert!(
        (3_590_000..3_610_000).contains(&shift),
        "the standby's clock is {shift} ms ahead: the test cannot see a switch"
    );
    let delayed = queue
        .enqueue(NewJob::new("work").delay(secs(1800)))
        .expect("enqueue");
    let leased = queue.enqueue(NewJob::new("work")).expect("enqueue");
    let lease = manual
        .claim("default", "w1", 10, secs(600))
        .expect("claim")
        .remove(0);
    assert_eq!(lease.job_id, leased);
    caught_up(&pair);
    pair.failover();
    // One statement reaches the new primary; the clock follows.
    queue.get(delayed).expect("get after the failover");
    let deadline = Instant::now() + secs(10);
    while queue.clock().now_ms() < standby_ms(&pair) - 5_000 {
        assert!(
            Instant::now() < deadline,
            "the queue's clock is still the old primary's: {} vs the new primary's {}",
            queue.clock().now_ms(),
            standby_ms(&pair)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let claimed = manual.claim("default", "w2", 10, secs(600)).expect("claim");
    assert_eq!(
        claimed.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        [delayed],
        "the delayed job is due by the new primary's clock"
    );
    manual.reap_at(queue.clock().now()).expect("reap");
    assert_ne!(
        queue.get(leased).expect("get").state,
        JobState::Running,
        "a lease that ran out by the new primary's clock is reaped"
    );
    assert!(matches!(
        manual.complete(&lease),
        Err(Error::LeaseLost { .. })
    ));
}

/// A session ended while its `COMMIT` waits for the synchronous standby
/// (`pg_terminate_backend`, a pooler's or a supervisor's timeout) leaves
/// the commit on the primary alone: visible there, and lost at the next
/// failover. tickler's retry finds the job it stored there, but must not
/// acknowledge it on that sight alone: only once a standby has it, or by
/// storing it again on the promoted standby. Without that, the job whose
/// id the caller got is gone after the failover.
#[test]
fn an_enqueue_whose_commit_stayed_on_the_primary_alone_is_acknowledged_only_once_it_survives_a_failover(
) {
    let Some(pair) = StandbyPair::start("local-commit", true) else {
        return;
    };
    let queue = Queue::open(pair.url()).expect("open");
    queue.enqueue(NewJob::new("before")).expect("enqueue");
    // From here each commit on the primary waits for a standby that
    // receives nothing.
    pair.cut();
    let (sent, answer) = std::sync::mpsc::channel();
    let enqueuer = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let _ = sent.send(queue.enqueue(NewJob::new("local")));
        })
    };
    let mut primary = pair.connect(false);
    let deadline = Instant::now() + secs(30);
    let waiter: i32 = loop {
        let rows = primary
            .query(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                &[],
            )
            .unwrap();
        if let Some(row) = rows.first() {
            break row.get(0);
        }
        assert!(Instant::now() < deadline, "no commit waits for the standby");
        std::thread::sleep(Duration::from_millis(10));
    };
    primary
        .execute("SELECT pg_terminate_backend($1)", &[&waiter])
        .unwrap();
    // The ended session's commit is there, on the primary alone.
    let deadline = Instant::now() + secs(10);
    while primary
        .query_one(
            "SELECT count(*) FROM tickler_jobs WHERE kind = 'local'",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the ended session's commit is not on the primary"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Time for a retry that trusts what it reads to answer.
    let early = answer.recv_timeout(secs(3));
    drop(primary);
    pair.failover();
    let result = match early {
        Ok(result) => result,
        Err(_) => answer
            .recv_timeout(secs(90))
            .expect("the enqueue answered after the failover"),
    };
    enqueuer.join().unwrap();
    let id = result.expect("the enqueue is acknowledged");
    let job = queue
        .get(id)
        .unwrap_or_else(|e| panic!("acknowledged job {id:?} after the failover: {e}"));
    assert_eq!(job.kind, "local");
    let stored: i64 = pair
        .connect(true)
        .query_one(
            "SELECT count(*) FROM tickler_jobs WHERE kind = 'local'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "the job is stored once on the promoted standby");
}

/// A primary that goes silent (a host that lost power, a partition: no
/// reset, no answer) while its standby is promoted: every connection of
/// the queue was waiting for an answer, or sent data that nothing
/// acknowledges, and TCP alone would wait about 15 minutes before giving
/// up on it. tickler's connections give up within seconds, and the work
/// goes on on the promoted standby with no error reaching the caller and
/// no acknowledged job lost.
#[test]
fn a_primary_gone_silent_is_left_for_the_promoted_standby_within_the_retry_window() {
    let Some(pair) = StandbyPair::start("silent", true) else {
        return;
    };
    let queue = Queue::open(pair.url()).expect("open");
    let mut pool = WorkerPool::builder(&queue)
        .threads(4)
        .lease(secs(5))
        .handler("work", |_: &JobContext| -> Result<(), JobError> {
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        })
        .start()
        .expect("start pool");
    let producer = Producer::start(&queue);
    producer.wait_for(100, "before the primary went silent");
    let before = producer.acked();
    pair.silence();
    pair.failover();
    let promoted = Instant::now();
    producer.wait_for(before + 100, "after the primary went silent");
    let (acked, errors) = producer.finish();
    assert!(errors.is_empty(), "errors reached the caller: {errors:?}");
    let first_after = acked
        .iter()
        .find(|(_, at)| *at > promoted)
        .map(|(_, at)| at.duration_since(promoted))
        .expect("an enqueue after the promotion");
    eprintln!("the first enqueue acknowledged after the promotion: {first_after:?} after it");
    let deadline = Instant::now() + secs(90);
    for (id, _) in &acked {
        loop {
            match queue.get(*id) {
                Ok(job) if job.state == JobState::Succeeded => break,
                Ok(job) => {
                    assert!(
                        Instant::now() < deadline,
                        "job {id:?} is {:?} long after the failover",
                        job.state
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("acknowledged job {id:?} after the failover: {e}"),
            }
        }
    }
    let report = pool.shutdown(secs(10));
    eprintln!("{} jobs; pool: {report:?}", acked.len());
}
