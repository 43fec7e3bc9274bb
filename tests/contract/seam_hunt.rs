//! Regressions after failures other queues' users reported against their
//! storage abstractions and the rules that sit on them (a rule honoured on
//! one engine only, a batch loop that stops early, a transaction that rolls
//! back but leaves its job behind). tickler's rules now live once above the
//! engine seam (`queue/claim.rs`, `queue/reap.rs`, prune and retry_dead in
//! `queue/mod.rs`, `run_due_ticks`, `app_tx.rs`); each body here runs on
//! every engine, so that a rule an engine's primitive quietly bends shows.

use crate::support::common;
use crate::support::engine;

use chrono::Duration as ChronoDuration;
use common::{fixed_policy, manual_queue, manual_queue_with_policy, secs, temp_db};
use engine::Value;
use std::sync::Arc;
use tickler::{
    ClaimRequest, Error, JobId, JobState, ManualClock, NewJob, NewSchedule, OutcomeSync,
    OverlapPolicy, Queue,
};

/// One more than a promotion, prune or retry_dead transaction handles
/// (5,000 each), so that the second transaction is reached.
const PAST_ONE_BATCH: usize = 5_000 + 37;

fn now_ms(clock: &ManualClock) -> i64 {
    tickler::Clock::now(clock).timestamp_millis()
}

/// The clock's now, moved by `ms`.
fn plus_ms(clock: &ManualClock, ms: i64) -> chrono::DateTime<chrono::Utc> {
    tickler::Clock::now(clock) + ChronoDuration::milliseconds(ms)
}

fn claim_from(queue: &Queue, queues: &[&str], max: usize) -> Vec<tickler::Lease> {
    let request = ClaimRequest {
        queues,
        worker_id: "seam-hunt",
        max,
        lease: secs(30),
        kinds: None,
        oldest_first: 0,
    };
    queue
        .manual()
        .record_and_claim(&[], Some(&request), OutcomeSync::Now)
        .unwrap()
        .1
}

contract! {
/// The bug it guards: Bull OptimalBits/bull#1087 ("a paused queue should
/// not process delayed jobs"; also taskforcesh/bullmq#427): a job that was
/// scheduled when its queue was paused fell due, was promoted by the claim
/// and then taken, as if the pause only covered the jobs that were waiting
/// when it began.
fn a_scheduled_job_that_falls_due_in_a_paused_queue_waits_for_the_resume() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let later = queue
        .enqueue(NewJob::new("k").queue("mail").delay(secs(10)))
        .unwrap();
    for _ in 0..2 {
        queue.enqueue(NewJob::new("k").queue("other")).unwrap();
    }
    queue.pause_queue("mail").unwrap();
    clock.advance(secs(11));

    let leases = claim_from(&queue, &["mail", "other"], 2);
    assert_eq!(leases.len(), 2, "the open queue should get the whole claim");
    assert!(
        leases.iter().all(|l| l.queue == "other"),
        "a paused queue's job fell due and was claimed: {:?}",
        leases.iter().map(|l| (&l.queue, l.job_id)).collect::<Vec<_>>()
    );
    assert!(claim_from(&queue, &["mail"], 5).is_empty());
    assert_eq!(queue.manual().next_due(&["mail"], None).unwrap(), None);

    queue.resume_queue("mail").unwrap();
    let leases = claim_from(&queue, &["mail"], 5);
    assert_eq!(
        leases.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        vec![later],
        "after the resume the due job runs"
    );
}
}

contract! {
/// The bug it guards: River riverqueue/river#1013 (the scheduler moves
/// due jobs in batches of 10,000, then 1,000 when the database is slow)
/// and Solid Queue's dispatcher batches: with more due scheduled jobs than
/// one promotion moves, a claim taken before the whole backlog was
/// promoted ran a low-priority job while a higher one was still scheduled,
/// or came back empty although jobs were due.
fn a_backlog_bigger_than_one_promotion_is_claimed_in_priority_order() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    queue
        .enqueue_batch(
            (0..PAST_ONE_BATCH)
                .map(|_| NewJob::new("low").delay(secs(10)))
                .collect(),
        )
        .unwrap();
    // Due last, so that the first promotion (soonest due first) leaves it.
    let urgent = queue
        .enqueue(NewJob::new("urgent").priority(10).delay(secs(20)))
        .unwrap();
    clock.advance(secs(30));

    let leases = queue.manual().claim("default", "w", 1, secs(30)).unwrap();
    assert_eq!(
        leases.len(),
        1,
        "one claim must come back with a job while thousands are due"
    );
    assert_eq!(
        leases[0].job_id, urgent,
        "a low-priority job ran before the urgent one (kind {})",
        leases[0].kind
    );
    assert_eq!(queue.count(JobState::Scheduled).unwrap(), 0);
    assert_eq!(
        queue.count(JobState::Pending).unwrap(),
        PAST_ONE_BATCH as u64
    );
}
}

contract! {
/// The bug it guards: Hangfire HangfireIO/Hangfire#1674 and
/// wanlitao/HangfireExtension PR #19 (the SQLite storage's fetch took
/// jobs whose invisibility timeout had not passed for a live worker, so
/// every worker ran the job) and Oban's Lifeline rescuing executing jobs:
/// the rescuer of one storage took a live job on its first look. The
/// reaper's two looks hold on every engine: a heartbeat between them keeps
/// the job, a holder that is gone loses it in the same call.
fn the_reaper_spares_a_heartbeat_between_its_looks_and_takes_the_gone_holder() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue_with_policy(&path, fixed_policy());
    let ids = queue
        .enqueue_batch(vec![NewJob::new("live"), NewJob::new("gone")])
        .unwrap();
    let mut leases = queue.manual().claim("default", "w", 2, secs(10)).unwrap();
    leases.sort_by_key(|l| l.job_id.0);
    let (live, gone) = (leases.remove(0), leases.remove(0));
    assert_eq!((live.job_id, gone.job_id), (ids[0], ids[1]));
    clock.advance(secs(11));
    let now = tickler::Clock::now(&*clock);

    let reaper = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.manual().reap_at(now))
    };
    std::thread::sleep(std::time::Duration::from_millis(30));
    queue.manual().heartbeat(&live, secs(30)).unwrap();
    assert_eq!(reaper.join().unwrap().unwrap(), 1, "only the gone holder's job");

    let kept = queue.get(live.job_id).unwrap();
    assert_eq!(kept.state, JobState::Running, "a live holder lost its job");
    assert_eq!(kept.run_token.as_ref(), Some(&live.run_token));
    queue.manual().complete(&live).unwrap();
    let taken = queue.get(gone.job_id).unwrap();
    assert_ne!(taken.state, JobState::Running, "a gone holder kept its job");
    assert!(queue.manual().complete(&gone).unwrap_err().is_lease_lost());
}
}

/// Makes every job with an id in `ids` dead, finished at `finished_ms`.
fn make_dead(path: &std::path::Path, ids: &[JobId], finished_ms: i64) {
    let (first, last) = (ids[0].0, ids[ids.len() - 1].0);
    let changed = engine::execute(
        path,
        "UPDATE tickler_jobs SET status = 'dead', finished_at = ?1, last_error = 'seam hunt'
         WHERE id >= ?2 AND id <= ?3",
        &[Value::Int(finished_ms), Value::Int(first), Value::Int(last)],
    );
    assert_eq!(changed, ids.len() as u64);
}

contract! {
/// The bug it guards: cleanup and reconciliation loops that page through
/// the rows they change (param20h/PDF-Assistant-RAG#792, novuhq/novu PR
/// #12125: each batch's rows leave the result set while the cursor moves
/// on as if they stayed, and whole batches are skipped), the shape of a
/// retry-all-discarded action: a first batch with dead jobs that must stay
/// dead (their unique_key is held again) ended the loop, or moved the
/// cursor past jobs it never looked at.
fn retry_dead_over_several_batches_leaves_no_dead_job_behind() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    const HELD: usize = 25;
    for i in 0..HELD {
        queue
            .enqueue(NewJob::new("holder").unique_key(format!("k{i}")))
            .unwrap();
    }
    let ids = queue
        .enqueue_batch(
            (0..PAST_ONE_BATCH)
                .map(|_| NewJob::new("d").queue("q"))
                .collect(),
        )
        .unwrap();
    make_dead(&path, &ids, now_ms(&clock));
    // The lowest ids, in the first batch, have keys that are held again.
    for (i, id) in ids.iter().take(HELD).enumerate() {
        engine::execute(
            &path,
            "UPDATE tickler_jobs SET unique_key = ?1 WHERE id = ?2",
            &[Value::Text(format!("k{i}")), Value::Int(id.0)],
        );
    }

    let (retried, left_dead) = queue.retry_dead(Some("q")).unwrap();
    assert_eq!(
        (retried, left_dead),
        ((PAST_ONE_BATCH - HELD) as u64, HELD as u64)
    );
    assert_eq!(queue.count(JobState::Dead).unwrap(), HELD as u64);
    assert_eq!(
        queue.count(JobState::Pending).unwrap(),
        PAST_ONE_BATCH as u64,
        "the retried jobs and the key holders are pending"
    );
    let last = queue.get(ids[ids.len() - 1]).unwrap();
    assert_eq!((last.state, last.attempts), (JobState::Pending, 0));
}
}

contract! {
/// The bug it guards: Oban oban-bg/oban#844 (the Pruner plugin failed on
/// the SQLite engine: pruning written for one engine) and oban#19 (prune
/// in limited batches): pruning in batches stopped after the first batch,
/// or the state guard that keeps prune_state to finished states was lost
/// with the move above the seam.
fn prune_over_several_batches_deletes_every_old_finished_job_and_nothing_else() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let old = queue
        .enqueue_batch((0..PAST_ONE_BATCH).map(|_| NewJob::new("old")).collect())
        .unwrap();
    let old_ms = now_ms(&clock);
    engine::execute(
        &path,
        "UPDATE tickler_jobs SET status = 'succeeded', finished_at = ?1
         WHERE id >= ?2 AND id <= ?3",
        &[
            Value::Int(old_ms),
            Value::Int(old[0].0),
            Value::Int(old[old.len() - 1].0),
        ],
    );
    clock.advance(secs(3600));
    let pending = queue.enqueue(NewJob::new("pending")).unwrap();
    let scheduled = queue.enqueue(NewJob::new("later").delay(secs(600))).unwrap();
    let running = queue.enqueue(NewJob::new("running").priority(5)).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    assert_eq!(lease.job_id, running);

    for state in [JobState::Pending, JobState::Scheduled, JobState::Running] {
        assert!(
            matches!(
                queue.prune_state(plus_ms(&clock, 1), state),
                Err(Error::InvalidArgument(_))
            ),
            "prune_state accepted the unfinished state {state}"
        );
    }
    let deleted = queue.prune(plus_ms(&clock, -1_000)).unwrap();
    assert_eq!(deleted, PAST_ONE_BATCH as u64, "prune stopped early");
    assert_eq!(engine::row_count(&path), 3);
    for id in [pending, scheduled, running] {
        assert!(!queue.get(id).unwrap().state.is_terminal());
    }
    queue.manual().complete(&lease).unwrap();
}
}

contract! {
/// The bug it guards: River riverqueue/river PR #390 (JobDelete refuses
/// running jobs) and sktime/sktime-mcp PR #330 (a cancelled job's record
/// was deleted while its work still ran): pruning the cancelled row of a
/// job whose handler still runs dropped the only record that kept its
/// unique_key, and a new job with that key started beside the old run.
fn pruning_a_cancelled_job_whose_holder_still_runs_keeps_its_key_held() {
    let (_dir, path) = temp_db();
    let (queue, clock) = manual_queue(&path);
    let first = queue
        .enqueue(NewJob::new("k").unique_key("report"))
        .unwrap();
    let old = queue.manual().claim("default", "w", 1, secs(60)).unwrap().remove(0);
    assert_eq!(old.job_id, first);
    queue.cancel(first).unwrap();
    let second = queue
        .enqueue(NewJob::new("k").unique_key("report"))
        .unwrap();
    assert_ne!(second, first);
    assert!(
        queue.manual().claim("default", "w", 1, secs(60)).unwrap().is_empty(),
        "the new run started while the cancelled holder still runs"
    );
    clock.advance(secs(1));

    queue.prune(plus_ms(&clock, 0)).unwrap();
    let started = queue.manual().claim("default", "w", 1, secs(60)).unwrap();
    assert!(
        started.is_empty(),
        "after prune, job {second} with the key of cancelled job {first} started \
         while that job's holder still held its lease"
    );
    // Once the old lease runs out, the new run starts.
    clock.advance(secs(61));
    let started = queue.manual().claim("default", "w", 1, secs(60)).unwrap();
    assert_eq!(
        started.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        vec![second]
    );
}
}

fn schedules_queue(
    path: &std::path::Path,
    at: chrono::DateTime<chrono::Utc>,
) -> (Queue, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(at));
    let queue = Queue::builder(engine::target(path))
        .clock(clock.clone())
        .sqlite(|o| o.durability(tickler::Durability::Normal))
        .open()
        .expect("open queue");
    (queue, clock)
}

contract! {
/// The bug it guards: Oban oban-bg/oban#1250 (on MySQL every node thought
/// it was the leader and each cron job ran once per node),
/// oban-bg/oban-py#32 and knifecake/steady-queue#52 (a recurring task ran
/// once per instance): firing that is safe on one engine fired twice on
/// another, or a round stopped after its first batch of schedules (100).
fn more_due_schedules_than_one_batch_fire_once_each_from_two_handles() {
    const SCHEDULES: usize = 150;
    let (_dir, path) = temp_db();
    let noon = common::t0();
    let (first, first_clock) = schedules_queue(&path, noon);
    let (second, second_clock) = schedules_queue(&path, noon);
    for i in 0..SCHEDULES {
        first
            .upsert_schedule(
                NewSchedule::new(format!("s{i:03}"), "0 0 13 * * *", "tick")
                    .overlap(OverlapPolicy::Allow),
            )
            .unwrap();
    }

    // One call fires every due schedule, batch after batch.
    first_clock.set(noon + ChronoDuration::minutes(60) + ChronoDuration::milliseconds(500));
    let run = first.manual().run_due_ticks().unwrap();
    assert_eq!(run.jobs.len(), SCHEDULES, "one round left schedules unfired");

    // The next day's tick, raced by two handles: each schedule fires once.
    let next_day = noon + ChronoDuration::hours(25) + ChronoDuration::milliseconds(500);
    first_clock.set(next_day);
    second_clock.set(next_day);
    let racers: Vec<_> = [first.clone(), second.clone()]
        .into_iter()
        .map(|queue| std::thread::spawn(move || queue.manual().run_due_ticks().unwrap().jobs.len()))
        .collect();
    let fired: usize = racers.into_iter().map(|r| r.join().unwrap()).sum();
    assert_eq!(fired, SCHEDULES, "two handles fired one day's ticks {fired} times");
    assert_eq!(engine::row_count(&path), 2 * SCHEDULES as i64);
    assert_eq!(
        engine::query_int(
            &path,
            "SELECT count(DISTINCT unique_key) FROM tickler_jobs",
            &[]
        ),
        2 * SCHEDULES as i64
    );
}
}

/// An application's table beside tickler's, on either engine.
fn create_effects(path: &std::path::Path) {
    engine::execute_batch(
        path,
        "CREATE TABLE IF NOT EXISTS seam_effects (job_id BIGINT, note TEXT NOT NULL)",
    );
}

fn effects(path: &std::path::Path) -> i64 {
    engine::query_int(path, "SELECT count(*) FROM seam_effects", &[])
}

/// Enqueues `job` in an application transaction of the queue's engine,
/// writes an effect beside it, and rolls the transaction back.
fn enqueue_and_roll_back(queue: &Queue, path: &std::path::Path, job: NewJob) -> JobId {
    if engine::on_postgres() {
        return pg_enqueue_and_roll_back(queue, path, job);
    }
    if engine::on_mysql() {
        return my_enqueue_and_roll_back(queue, path, job);
    }
    let mut conn = queue.open_connection().unwrap();
    let tx = conn.transaction().unwrap();
    let id = queue.enqueue_tx(&tx, job).unwrap();
    tx.execute(
        "INSERT INTO seam_effects (job_id, note) VALUES (?1, 'app')",
        [id.0],
    )
    .unwrap();
    tx.rollback().unwrap();
    id
}

#[cfg(feature = "postgres")]
fn pg_enqueue_and_roll_back(queue: &Queue, path: &std::path::Path, job: NewJob) -> JobId {
    let url = engine::target(path);
    let mut client = postgres::Client::connect(url.to_str().unwrap(), postgres::NoTls).unwrap();
    let mut tx = client.transaction().unwrap();
    let id = queue.enqueue_tx(&mut tx, job).unwrap();
    tx.execute(
        "INSERT INTO seam_effects (job_id, note) VALUES ($1, 'app')",
        &[&id.0],
    )
    .unwrap();
    tx.rollback().unwrap();
    id
}

#[cfg(not(feature = "postgres"))]
fn pg_enqueue_and_roll_back(_: &Queue, _: &std::path::Path, _: NewJob) -> JobId {
    unreachable!("a PostgreSQL case needs the `postgres` feature")
}

#[cfg(feature = "mysql")]
fn my_enqueue_and_roll_back(queue: &Queue, path: &std::path::Path, job: NewJob) -> JobId {
    use tickler::mysql::prelude::Queryable;
    let mut conn = engine::mysql_connect(path);
    let mut tx = conn
        .start_transaction(tickler::mysql::TxOpts::default())
        .unwrap();
    let id = queue.enqueue_tx(&mut tx, job).unwrap();
    tx.exec_drop(
        "INSERT INTO seam_effects (job_id, note) VALUES (?, 'app')",
        (id.0,),
    )
    .unwrap();
    tx.rollback().unwrap();
    id
}

#[cfg(not(feature = "mysql"))]
fn my_enqueue_and_roll_back(_: &Queue, _: &std::path::Path, _: NewJob) -> JobId {
    unreachable!("a MySQL case needs the `mysql` feature")
}

contract! {
/// The bug it guards: River's InsertTx and riverqueue/river#1364 (a
/// transaction of another client type than the driver's), and Oban
/// oban-bg/oban#1087 (unique jobs inserted in transactions that rolled
/// back): a job written "in the caller's transaction" went through the
/// queue's own connection, so it stayed, ran, and kept its unique_key
/// after the caller rolled back.
fn a_job_enqueued_in_a_rolled_back_application_transaction_leaves_nothing() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    create_effects(&path);
    let ghost = enqueue_and_roll_back(&queue, &path, NewJob::new("k").unique_key("once"));

    assert_eq!(effects(&path), 0);
    assert_eq!(engine::row_count(&path), 0, "the rolled-back job is stored");
    assert!(matches!(queue.get(ghost), Err(Error::NotFound(_))));
    assert!(queue.manual().claim("default", "w", 1, secs(30)).unwrap().is_empty());
    let real = queue.enqueue(NewJob::new("k").unique_key("once")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);
    assert_eq!(lease.job_id, real, "the rolled-back job's key was still held");
}
}

/// Completes `lease` with application writes that fail after writing.
fn complete_with_failing_writes(queue: &Queue, lease: &tickler::Lease) -> Error {
    if engine::on_postgres() {
        return pg_complete_with_failing_writes(queue, lease);
    }
    if engine::on_mysql() {
        return my_complete_with_failing_writes(queue, lease);
    }
    queue
        .complete_with(lease, |tx: &tickler::rusqlite::Transaction| {
            tx.execute(
                "INSERT INTO seam_effects (job_id, note) VALUES (?1, 'done')",
                [lease.job_id.0],
            )?;
            Err::<(), _>(Error::aborted("the application refused"))
        })
        .unwrap_err()
}

#[cfg(feature = "postgres")]
fn pg_complete_with_failing_writes(queue: &Queue, lease: &tickler::Lease) -> Error {
    queue
        .complete_with(lease, |tx: &mut tickler::postgres::Transaction| {
            tx.execute(
                "INSERT INTO seam_effects (job_id, note) VALUES ($1, 'done')",
                &[&lease.job_id.0],
            )?;
            Err::<(), _>(Error::aborted("the application refused"))
        })
        .unwrap_err()
}

#[cfg(not(feature = "postgres"))]
fn pg_complete_with_failing_writes(_: &Queue, _: &tickler::Lease) -> Error {
    unreachable!("a PostgreSQL case needs the `postgres` feature")
}

#[cfg(feature = "mysql")]
fn my_complete_with_failing_writes(queue: &Queue, lease: &tickler::Lease) -> Error {
    use tickler::mysql::prelude::Queryable;
    queue
        .complete_with(lease, |tx: &mut tickler::mysql::Transaction| {
            tx.exec_drop(
                "INSERT INTO seam_effects (job_id, note) VALUES (?, 'done')",
                (lease.job_id.0,),
            )?;
            Err::<(), _>(Error::aborted("the application refused"))
        })
        .unwrap_err()
}

#[cfg(not(feature = "mysql"))]
fn my_complete_with_failing_writes(_: &Queue, _: &tickler::Lease) -> Error {
    unreachable!("a MySQL case needs the `mysql` feature")
}

contract! {
/// The bug it guards: River's JobCompleteTx (riverqueue/river#1364: the
/// completion in the application's transaction) completed the job even
/// though the application's transaction rolled back: the job was marked
/// done with none of its effects, and was never run again.
fn a_completion_whose_application_writes_fail_rolls_back_and_keeps_the_lease() {
    let (_dir, path) = temp_db();
    let (queue, _clock) = manual_queue(&path);
    create_effects(&path);
    let id = queue.enqueue(NewJob::new("k")).unwrap();
    let lease = queue.manual().claim("default", "w", 1, secs(30)).unwrap().remove(0);

    let err = complete_with_failing_writes(&queue, &lease);
    assert!(matches!(err, Error::Aborted(_)), "{err:?}");
    assert_eq!(effects(&path), 0, "the application's writes stayed");
    let job = queue.get(id).unwrap();
    assert_eq!(job.state, JobState::Running, "completed without its effects");
    assert_eq!(job.run_token.as_ref(), Some(&lease.run_token));
    queue.manual().complete(&lease).unwrap();
}
}
