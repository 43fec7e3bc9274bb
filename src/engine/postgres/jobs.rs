//! The jobs table on PostgreSQL: the [`Engine`] operations and their SQL.
//!
//! Every statement that changes a claimed job is fenced the same way as on
//! SQLite: `id AND run_token AND status = 'running'`. Claims and the
//! reaper read with `FOR UPDATE SKIP LOCKED`, so concurrent claimers and
//! reapers on any number of machines take disjoint rows without waiting;
//! statements that lock several known rows lock them in id order, so two
//! transactions of one pool (heartbeats, outcomes) never deadlock.

use super::rows::*;
use super::{statement_level, storable, Attempt, Store, Tx};
use crate::clock::ms_to_datetime;
use crate::engine::types::*;
use crate::engine::{Claim, ClaimTx, Engine, FinishedSample, STATS_COUNTS_SQL};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use crate::lease::Lease;
use crate::retry::RetryPolicy;

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::time::Duration;

/// Outcomes from which [`Engine::record_and_claim`] records them in a
/// transaction of their own beside the claim's, rather than in one.
const PARALLEL_OUTCOMES: usize = 64;

/// Tries of an insert whose unique_key's holder finished between the
/// insert and the read of its id.
const UNIQUE_TRIES: u32 = 10;

const INSERT_SQL: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status, priority,
         run_at, max_attempts, unique_key, timeout_ms, created_at, enqueue_batch, enqueue_seq)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
     ON CONFLICT DO NOTHING RETURNING id";

/// Many jobs without a unique_key: $1 queues, $2 kinds, $3 payloads,
/// $4 states, $5 priorities, $6 run_ats, $7 max_attempts, $8 timeouts,
/// $9 now, $10 the batch's id, $11 each job's place in the batch. Rows are
/// produced in input order (`ORDER BY ord`), so their ids ascend in that
/// order.
const INSERT_MANY_SQL: &str = "INSERT INTO tickler_jobs (queue, kind, payload, status, priority,
         run_at, max_attempts, timeout_ms, created_at, enqueue_batch, enqueue_seq)
     SELECT queue, kind, payload, status, priority, run_at, max_attempts, timeout_ms, $9::bigint,
            $10::bigint, seq
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[],
                 $7::bigint[], $8::bigint[], $11::int[])
          WITH ORDINALITY AS t(queue, kind, payload, status, priority, run_at, max_attempts,
                               timeout_ms, seq, ord)
     ORDER BY ord
     RETURNING id";

const HELD_SQL: &str = "SELECT id FROM tickler_jobs WHERE unique_key = $1
       AND status IN ('scheduled', 'pending', 'running')";

const PROMOTE_SQL: &str = "UPDATE tickler_jobs SET status = 'pending'
    WHERE id = ANY(ARRAY(
        SELECT id FROM tickler_jobs
        WHERE status = 'scheduled' AND queue = $1 AND run_at <= $2::bigint
        ORDER BY run_at LIMIT $3 FOR UPDATE SKIP LOCKED))";

/// `errors` with one more entry for the current attempt (at `$at`, error
/// `$error`), keeping the last `ERROR_HISTORY_MAX` (20).
macro_rules! append_error {
    ($at:literal, $error:literal) => {
        concat!(
            "errors = (CASE WHEN jsonb_array_length(errors) >= 20 THEN errors - 0 ELSE errors END)
                 || jsonb_build_array(jsonb_build_object('attempt', attempts, 'at', ",
            $at,
            "::bigint, 'error', ",
            $error,
            "::text, 'worker', claimed_by))"
        )
    };
}

/// The fence every write of a lease's holder ends in: the row is still
/// that lease's (`id`, its `run_token`, still `running`). A lost lease
/// matches no row and changes nothing.
macro_rules! fence {
    ($id:literal, $run_token:literal) => {
        concat!(
            "WHERE id = ",
            $id,
            " AND run_token = ",
            $run_token,
            " AND status = 'running'"
        )
    };
}

/// The retry-or-dead rule of a failed attempt: dead (finished at `$now`)
/// once the attempts are used up, else waiting until `$retry_at`, pending
/// at once if that is already due.
macro_rules! retry_or_dead {
    ($now:literal, $retry_at:literal) => {
        concat!(
            "status = CASE WHEN attempts >= max_attempts THEN 'dead' WHEN ",
            $retry_at,
            " <= ",
            $now,
            " THEN 'pending' ELSE 'scheduled' END, run_at = CASE WHEN attempts >= max_attempts \
             THEN run_at ELSE ",
            $retry_at,
            " END, finished_at = CASE WHEN attempts >= max_attempts THEN ",
            $now,
            " END"
        )
    };
}

/// $1 now, $2 id, $3 run_token.
const COMPLETE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = $1, lease_expires_at = NULL, last_error = NULL ",
    fence!("$2", "$3")
);

/// Locks rows $1 in id order, so that two transactions updating several
/// of the same rows (a pool's heartbeats and its outcomes) take them in
/// the same order and never deadlock.
const LOCK_IN_ORDER_SQL: &str =
    "SELECT 1 FROM tickler_jobs WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE";

/// $1 now, $2 ids, $3 run_tokens (locked first, LOCK_IN_ORDER_SQL).
const COMPLETE_MANY_SQL: &str = "UPDATE tickler_jobs AS j
    SET status = 'succeeded', finished_at = $1, lease_expires_at = NULL, last_error = NULL
    FROM unnest($2::bigint[], $3::text[]) AS done(id, run_token)
    WHERE j.id = done.id AND j.run_token = done.run_token AND j.status = 'running'
    RETURNING j.id, j.run_token";

/// $1 now, $2 retry time, $3 error, $4 id, $5 run_token.
const FAIL_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("$1::bigint", "$2::bigint"),
    ", last_error = $3, lease_expires_at = NULL, ",
    append_error!("$1", "$3"),
    " ",
    fence!("$4", "$5")
);

/// FAIL_SQL for a run still going past its timeout; see the SQLite engine.
const TIMED_OUT_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("$1::bigint", "greatest($2::bigint, lease_expires_at + 1)"),
    ", last_error = $3,
        lease_expires_at = CASE WHEN attempts >= max_attempts THEN lease_expires_at END, ",
    append_error!("$1", "$3"),
    " ",
    fence!("$4", "$5")
);

/// The reaper's FAIL_SQL, also conditional on the lease having run out
/// before $6.
const REAP_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("$1::bigint", "$2::bigint"),
    ", last_error = $3, lease_expires_at = NULL, ",
    append_error!("$1", "$3"),
    " ",
    fence!("$4", "$5"),
    " AND lease_expires_at < $6::bigint"
);

/// $1 now, $2 error, $3 id, $4 run_token.
const DEAD_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'dead', finished_at = $1, last_error = $2, lease_expires_at = NULL, ",
    append_error!("$1", "$2"),
    " ",
    fence!("$3", "$4")
);

/// $1 now, $2 until, $3 id, $4 run_token.
const SNOOZE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = CASE WHEN $2::bigint <= $1::bigint THEN 'pending' ELSE 'scheduled' END,
        run_at = $2::bigint, attempts = attempts - 1, lease_expires_at = NULL ",
    fence!("$3", "$4")
);

const RELEASE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'pending', attempts = attempts - 1, lease_expires_at = NULL ",
    fence!("$1", "$2")
);

/// $1 id, $2 run_token: the cancelled job's holder has stopped.
const HOLDER_STOPPED_SQL: &str = "UPDATE tickler_jobs SET lease_expires_at = NULL
    WHERE id = $1 AND run_token = $2 AND status IN ('cancelled', 'dead')
      AND lease_expires_at IS NOT NULL";

/// $1 now, $2 margin: leases granted "in the future" (a backward step of
/// the clock) expire one lease length from now; see the SQLite engine.
const LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status = 'running' AND lease_expires_at > $1::bigint + $2::bigint
      AND lease_expires_at > $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at) + $2::bigint";

const CANCELLED_LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status IN ('cancelled', 'dead') AND lease_expires_at IS NOT NULL
      AND lease_expires_at > $1::bigint + coalesce(lease_ms, lease_expires_at - claimed_at) + $2::bigint";

/// A condition on `job`: its unique_key is not held by a cancelled run
/// whose holder may still be running (see the SQLite engine's `unblocked`).
const UNBLOCKED: &str = "(job.unique_key IS NULL OR NOT EXISTS (
         SELECT 1 FROM tickler_jobs AS stopping
         WHERE stopping.unique_key = job.unique_key
           AND stopping.status IN ('cancelled', 'dead')
           AND stopping.lease_expires_at >= $2::bigint))";

/// The claiming UPDATE: $1 worker_id, $2 now, $3 lease expiry, $4 queue,
/// $5 limit, $6 the claim's id, $7 kinds (if filtered). The queue's pause
/// flag is read by the same statement, in its snapshot: read by an earlier
/// statement, a pause and an enqueue both committed in between would let
/// the claim take the new jobs of the paused queue. The outer update
/// repeats no condition on `status`: the rows are locked by the inner
/// select, and with one the planner may look the ids up through a partial
/// index rather than the primary key (seen: 200 ms for 512 rows of a table
/// not yet analyzed).
fn claim_sql(kinds: bool, order: ClaimOrder) -> String {
    let order = order.sql();
    let kind_filter = if kinds { "AND kind = ANY($7)" } else { "" };
    format!(
        "UPDATE tickler_jobs
         SET status = 'running', run_token = gen_random_uuid()::text, attempts = attempts + 1,
             claimed_by = $1, claimed_at = $2::bigint, lease_expires_at = $3::bigint,
             lease_ms = $3::bigint - $2::bigint, claim_id = $6::bigint
         WHERE id = ANY(ARRAY(
             SELECT id FROM tickler_jobs AS job
             WHERE status = 'pending' AND queue = $4 {kind_filter} AND {UNBLOCKED}
               AND NOT EXISTS (SELECT 1 FROM tickler_paused_queues AS paused
                               WHERE paused.queue = job.queue)
             ORDER BY {order} LIMIT $5 FOR UPDATE SKIP LOCKED))
         RETURNING {LEASE_COLUMNS}"
    )
}

fn i64_of(n: u32) -> i64 {
    i64::from(n)
}

/// Refuses text PostgreSQL cannot store in a name.
pub(crate) fn check_text(what: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "{what} contains a NUL character, which PostgreSQL cannot store"
        )));
    }
    Ok(())
}

/// Inserts validated jobs in `tx`; a job whose unique_key is held by an
/// unfinished job inserts nothing and yields that job's id. Concurrent
/// inserts of one key on several machines: the unique index makes one of
/// them wait for the other's commit and then insert nothing.
pub(crate) fn insert_valid(
    tx: &mut Tx<'_>,
    rows: &[ValidJob],
    now: i64,
    batch: i64,
) -> Result<Vec<JobId>> {
    let mut ids: Vec<Option<JobId>> = vec![None; rows.len()];
    // Jobs without a unique_key go in with one statement per batch (one
    // round trip, not one per job); a keyed one may meet its key's holder
    // and is inserted on its own.
    let mut bulk = Vec::new();
    lock_keys_in_order(tx, rows)?;
    for (i, row) in rows.iter().enumerate() {
        let job = &row.job;
        check_text("queue", &job.queue)?;
        check_text("kind", &job.kind)?;
        if let Some(key) = &job.unique_key {
            check_text("unique_key", key)?;
        }
        let run_at = row.due.resolve(now)?;
        if job.unique_key.is_none() && rows.len() > 1 {
            bulk.push((i, run_at));
            continue;
        }
        ids[i] = Some(insert_one(tx, row, run_at, now, (batch, i))?);
    }
    if !bulk.is_empty() {
        let column = |f: &dyn Fn(&ValidJob, i64) -> String| -> Vec<String> {
            bulk.iter().map(|&(i, at)| f(&rows[i], at)).collect()
        };
        let queues = column(&|r, _| r.job.queue.clone());
        let kinds = column(&|r, _| r.job.kind.clone());
        let payloads = column(&|r, _| r.payload.clone());
        let states = column(&|_, at| state_for(at, now).as_str().to_owned());
        let priorities: Vec<i32> = bulk.iter().map(|&(i, _)| rows[i].job.priority).collect();
        let run_ats: Vec<i64> = bulk.iter().map(|&(_, at)| at).collect();
        let max_attempts: Vec<i64> = bulk
            .iter()
            .map(|&(i, _)| i64_of(rows[i].job.max_attempts))
            .collect();
        let timeouts: Vec<Option<i64>> = bulk.iter().map(|&(i, _)| rows[i].timeout_ms).collect();
        let seqs: Vec<i32> = bulk.iter().map(|&(i, _)| seq_of(i)).collect();
        let mut inserted: Vec<i64> = tx
            .query(
                INSERT_MANY_SQL,
                &[
                    &queues,
                    &kinds,
                    &payloads,
                    &states,
                    &priorities,
                    &run_ats,
                    &max_attempts,
                    &timeouts,
                    &now,
                    &batch,
                    &seqs,
                ],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if inserted.len() != bulk.len() {
            return Err(Error::Config(format!(
                "inserted {} of {} jobs",
                inserted.len(),
                bulk.len()
            )));
        }
        // The identity values are drawn as the rows come, in input order.
        inserted.sort_unstable();
        for ((i, _), id) in bulk.iter().zip(inserted) {
            ids[*i] = Some(JobId(id));
        }
    }
    Ok(ids.into_iter().map(|id| id.unwrap_or(JobId(0))).collect())
}

/// The ids of a batch whose earlier try committed after all (found by its
/// mark; a job that try did not insert because its unique_key was held is
/// looked up, or inserted, again), or `None` if it did not commit. Only
/// after a lost COMMIT: the mark has no index, so this reads the table.
fn committed_before(
    tx: &mut Tx<'_>,
    rows: &[ValidJob],
    now: i64,
    batch: i64,
) -> Result<Option<Vec<JobId>>> {
    let found = tx.query(
        "SELECT enqueue_seq, id FROM tickler_jobs WHERE enqueue_batch = $1::bigint",
        &[&batch],
    )?;
    if found.is_empty() {
        return Ok(None);
    }
    let mut ids: Vec<Option<JobId>> = vec![None; rows.len()];
    for r in &found {
        let seq: i32 = r.get(0);
        if let Some(slot) = usize::try_from(seq).ok().and_then(|i| ids.get_mut(i)) {
            *slot = Some(JobId(r.get(1)));
        }
    }
    let mut out = Vec::with_capacity(rows.len());
    for (i, id) in ids.into_iter().enumerate() {
        out.push(match id {
            Some(id) => id,
            None => insert_one(tx, &rows[i], rows[i].due.resolve(now)?, now, (batch, i))?,
        });
    }
    Ok(Some(out))
}

/// Before a batch inserts several unique keys: takes a lock per key in key
/// order. Each insert of a key waits for another transaction's
/// uncommitted insert of it, so two batches holding keys in opposite
/// orders would each wait for the other (a deadlock, broken only after
/// `deadlock_timeout`); with the keys locked in one order, the second
/// waits before it holds any. The jobs still go in in input order, so
/// their ids ascend as given.
fn lock_keys_in_order(tx: &mut Tx<'_>, rows: &[ValidJob]) -> Result<()> {
    let mut keys: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.job.unique_key.as_deref())
        .filter(|k| !k.contains('\0'))
        .collect();
    if keys.len() < 2 {
        return Ok(());
    }
    keys.sort_unstable();
    keys.dedup();
    tx.execute(
        "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 7369401254420385313)))
         FROM unnest($1::text[]) AS k",
        &[&keys],
    )?;
    Ok(())
}

/// Scheduled if due after `now`, else pending.
fn state_for(run_at: i64, now: i64) -> JobState {
    if run_at <= now {
        JobState::Pending
    } else {
        JobState::Scheduled
    }
}

/// One job; with a unique_key held by an unfinished job, that job's id.
/// A job's place in its batch, as stored (`enqueue_seq`).
fn seq_of(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

fn insert_one(
    tx: &mut Tx<'_>,
    row: &ValidJob,
    run_at: i64,
    now: i64,
    (batch, i): (i64, usize),
) -> Result<JobId> {
    let job = &row.job;
    let state = state_for(run_at, now);
    let max_attempts = i64_of(job.max_attempts);
    for _ in 0..UNIQUE_TRIES {
        let inserted = tx.query_opt(
            INSERT_SQL,
            &[
                &job.queue,
                &job.kind,
                &row.payload,
                &state.as_str(),
                &job.priority,
                &run_at,
                &max_attempts,
                &job.unique_key,
                &row.timeout_ms,
                &now,
                &batch,
                &seq_of(i),
            ],
        )?;
        if let Some(r) = inserted {
            return Ok(JobId(r.get(0)));
        }
        if let Some(r) = tx.query_opt(HELD_SQL, &[&job.unique_key])? {
            return Ok(JobId(r.get(0)));
        }
    }
    Err(Error::Config(format!(
        "unique_key {:?} kept changing hands while a job with it was inserted",
        job.unique_key
    )))
}

/// The fenced statement of one outcome; returns the rows changed (0: the
/// lease is lost). `note`, if given, is stored instead of a failure's
/// error text.
fn apply_outcome(
    tx: &mut Tx<'_>,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
    note: Option<&str>,
) -> Result<u64> {
    let id = lease.job_id.0;
    let token = &lease.run_token.0;
    let error_of = |error: &str| storable(&cut_error(note.unwrap_or(error))).into_owned();
    match outcome {
        Outcome::Complete => tx.execute(COMPLETE_SQL, &[&now, &id, token]),
        Outcome::Fail(error) => {
            let retry_at = retry_time(now, policy, lease.attempt);
            tx.execute(FAIL_SQL, &[&now, &retry_at, &error_of(error), &id, token])
        }
        Outcome::FailRetryAfter(error, delay) => {
            let retry_at =
                add_ms(now, *delay).map_or(MAX_TIMESTAMP_MS, |t| t.min(MAX_TIMESTAMP_MS));
            tx.execute(FAIL_SQL, &[&now, &retry_at, &error_of(error), &id, token])
        }
        Outcome::FailPermanently(error) => {
            tx.execute(DEAD_SQL, &[&now, &error_of(error), &id, token])
        }
        Outcome::TimedOut(error) => {
            let retry_at = retry_time(now, policy, lease.attempt);
            tx.execute(
                TIMED_OUT_SQL,
                &[&now, &retry_at, &error_of(error), &id, token],
            )
        }
        Outcome::Snooze(until) => {
            let until = match until.timestamp_millis() {
                before_1970 if before_1970 < 0 => now,
                until => until,
            };
            tx.execute(SNOOZE_SQL, &[&now, &until, &id, token])
        }
        Outcome::Release => tx.execute(RELEASE_SQL, &[&id, token]),
    }
}

/// After a fenced statement changed nothing: a cancelled job's holder
/// has stopped; and if an earlier try of this transaction may have
/// committed, a row this lease already moved on counts as recorded.
fn after_refused(tx: &mut Tx<'_>, lease: &Lease, attempt: Attempt) -> Result<Result<()>> {
    let id = lease.job_id.0;
    let token = &lease.run_token.0;
    if attempt.after_unknown_commit
        && tx
            .query_opt(
                "SELECT 1 FROM tickler_jobs WHERE id = $1 AND run_token = $2
                   AND status <> 'running'",
                &[&id, token],
            )?
            .is_some()
    {
        return Ok(Ok(()));
    }
    tx.execute(HOLDER_STOPPED_SQL, &[&id, token])?;
    Ok(Err(Error::LeaseLost {
        job_id: lease.job_id,
    }))
}

/// One outcome, fenced by run_token.
fn record_in(
    tx: &mut Tx<'_>,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
    attempt: Attempt,
) -> Result<Result<()>> {
    if let Outcome::Snooze(until) = outcome {
        if until.timestamp_millis() > MAX_TIMESTAMP_MS {
            return Ok(Err(Error::TimeOutOfRange {
                what: "snooze time",
            }));
        }
    }
    if apply_outcome(tx, lease, outcome, now, policy, None)? == 1 {
        Ok(Ok(()))
    } else {
        after_refused(tx, lease, attempt)
    }
}

/// After the server refused an outcome's statement (`refused`): a
/// failure is recorded again with a short note instead of its error text,
/// which may be what was refused (a trigger's condition on it), so that
/// the job is not left running until its lease runs out, as on SQLite.
/// Anything else, or a note refused too, is `refused` for this outcome.
fn record_noted(
    tx: &mut Tx<'_>,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
    refused: Error,
) -> Result<Result<()>> {
    let (Outcome::Fail(error) | Outcome::FailPermanently(error) | Outcome::TimedOut(error)) =
        outcome
    else {
        return Ok(Err(refused));
    };
    let note = format!(
        "the handler's error ({} bytes) could not be stored: {refused}",
        error.len()
    );
    let noted = tx.isolated(|tx| apply_outcome(tx, lease, outcome, now, policy, Some(&note)))?;
    match noted {
        Ok(1) => Ok(Ok(())),
        Ok(_) => Ok(Err(Error::LeaseLost {
            job_id: lease.job_id,
        })),
        Err(_) => Ok(Err(refused)),
    }
}

/// Many successes in one statement.
fn complete_many(
    tx: &mut Tx<'_>,
    leases: &[&Lease],
    now: i64,
    attempt: Attempt,
) -> Result<Vec<Result<()>>> {
    let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
    let tokens: Vec<&str> = leases.iter().map(|l| l.run_token.0.as_str()).collect();
    tx.execute(LOCK_IN_ORDER_SQL, &[&ids])?;
    let mut done: HashMap<i64, String> = tx
        .query(COMPLETE_MANY_SQL, &[&now, &ids, &tokens])?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut recorded = Vec::with_capacity(leases.len());
    for lease in leases {
        // A lease given twice completes once, as with two COMPLETE_SQL.
        if done.get(&lease.job_id.0) == Some(&lease.run_token.0) {
            done.remove(&lease.job_id.0);
            recorded.push(Ok(()));
        } else {
            recorded.push(after_refused(tx, lease, attempt)?);
        }
    }
    Ok(recorded)
}

/// Records every outcome (in id order, so that two transactions locking
/// the same rows take them in the same order). With `isolate`, each in a
/// savepoint of its own: a statement the server refuses costs that
/// outcome alone.
fn record_all(
    tx: &mut Tx<'_>,
    outcomes: &[(&Lease, Outcome)],
    now: i64,
    policy: &RetryPolicy,
    attempt: Attempt,
    isolate: bool,
) -> Result<Vec<Result<()>>> {
    let mut results: Vec<Option<Result<()>>> = (0..outcomes.len()).map(|_| None).collect();
    let mut order: Vec<usize> = (0..outcomes.len()).collect();
    order.sort_by_key(|&i| outcomes[i].0.job_id.0);
    if !isolate {
        let completes: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| outcomes[i].1 == Outcome::Complete)
            .collect();
        if completes.len() > 1 {
            let leases: Vec<&Lease> = completes.iter().map(|&i| outcomes[i].0).collect();
            for (i, r) in completes
                .iter()
                .zip(complete_many(tx, &leases, now, attempt)?)
            {
                results[*i] = Some(r);
            }
        }
    }
    for i in order {
        if results[i].is_some() {
            continue;
        }
        let (lease, outcome) = &outcomes[i];
        results[i] = Some(if isolate {
            match tx.isolated(|tx| record_in(tx, lease, outcome, now, policy, attempt))? {
                Ok(recorded) => recorded,
                Err(refused) => record_noted(tx, lease, outcome, now, policy, refused)?,
            }
        } else {
            record_in(tx, lease, outcome, now, policy, attempt)?
        });
    }
    Ok(results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect())
}

/// A [`ClaimTx`] on an open PostgreSQL transaction: the claiming
/// statements of this claim's kinds, and the id marking its rows (for a
/// commit whose acknowledgement was lost).
struct InTransaction<'a, 'b> {
    tx: &'a mut Tx<'b>,
    sql: &'a (String, String),
    claim_id: i64,
}

impl ClaimTx for InTransaction<'_, '_> {
    fn paused_queues(&mut self) -> Result<std::collections::BTreeSet<String>> {
        paused_in(self.tx)
    }

    fn promote_due(&mut self, queue: &str, now: i64, limit: i64) -> Result<u64> {
        self.tx.execute(PROMOTE_SQL, &[&queue, &now, &limit])
    }

    fn claim_batch(
        &mut self,
        request: &ClaimRequest<'_>,
        queue: &str,
        want: i64,
        order: ClaimOrder,
        now: i64,
        expires: i64,
    ) -> Result<Vec<ClaimedRow>> {
        let sql = match order {
            ClaimOrder::Priority => &self.sql.0,
            ClaimOrder::Oldest => &self.sql.1,
        };
        let worker = storable(request.worker_id);
        let claim_id = self.claim_id;
        let rows = match request.kinds {
            Some(kinds) => self.tx.query(
                sql,
                &[&worker, &now, &expires, &queue, &want, &claim_id, &kinds],
            )?,
            None => self
                .tx
                .query(sql, &[&worker, &now, &expires, &queue, &want, &claim_id])?,
        };
        rows.iter().map(claimed_from_row).collect()
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        self.tx
            .execute(DEAD_SQL, &[&now, &error, &job_id.0, &run_token])?;
        Ok(())
    }
}

/// The jobs the claim `claim_id` took, whose commit was not acknowledged
/// (the connection was lost during COMMIT).
fn adopt_claimed(tx: &mut Tx<'_>, claim_id: i64) -> Result<Vec<Lease>> {
    let rows = tx.query(
        &format!(
            "SELECT {LEASE_COLUMNS} FROM tickler_jobs
             WHERE status = 'running' AND claim_id = $1::bigint
             ORDER BY priority DESC, run_at, id"
        ),
        &[&claim_id],
    )?;
    let mut leases = Vec::with_capacity(rows.len());
    for row in &rows {
        // Unreadable rows were made dead by the claim that committed.
        if let ClaimedRow::Readable(lease) = claimed_from_row(row)? {
            leases.push(lease);
        }
    }
    if !leases.is_empty() {
        log::warn!(
            "took up {} jobs claimed by a transaction whose commit was not acknowledged",
            leases.len()
        );
    }
    Ok(leases)
}

impl Engine for Store {
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>> {
        // Marks this call's rows, so that a retry after a COMMIT whose
        // answer was lost with the connection finds them instead of
        // storing the jobs twice.
        let batch = fastrand::i64(..);
        let insert = |tx: &mut Tx<'_>, attempt: Attempt| {
            let now = self.now_ms();
            if attempt.after_unknown_commit {
                if let Some(ids) = committed_before(tx, &rows, now, batch)? {
                    return Ok(ids);
                }
            }
            insert_valid(tx, &rows, now, batch)
        };
        // One job is one INSERT (and, if its key is held, one read of the
        // holder's id): no transaction of its own needed.
        let ids = if rows.len() == 1 {
            self.write_autocommit(insert)?
        } else {
            self.write(insert)?
        };
        self.notify_watchers();
        Ok(ids)
    }

    fn next_due(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<Option<DateTime<Utc>>> {
        let now = self.now_ms();
        let kinds: Option<Vec<&str>> = kinds.map(<[&str]>::to_vec);
        let kind_filter = if kinds.is_some() {
            "AND kind = ANY($3)"
        } else {
            ""
        };
        let pending_sql = format!(
            "SELECT EXISTS (SELECT 1 FROM tickler_jobs AS job
             WHERE status = 'pending' AND queue = $1 AND $2::bigint IS NOT NULL
               {kind_filter} AND {UNBLOCKED})"
        );
        let scheduled_sql = format!(
            "SELECT run_at FROM tickler_jobs WHERE status = 'scheduled' AND queue = $1
               AND $2::bigint IS NOT NULL {kind_filter} ORDER BY run_at LIMIT 1"
        );
        let earliest = self.read(|tx| {
            let mut earliest: Option<i64> = None;
            let paused = paused_in(tx)?;
            for queue in queues.iter().filter(|q| !paused.contains(**q)) {
                let pending: bool = match &kinds {
                    Some(k) => tx.query_one(&pending_sql, &[queue, &now, k])?,
                    None => tx.query_one(&pending_sql, &[queue, &now])?,
                }
                .get(0);
                if pending {
                    return Ok(Some(now));
                }
                let scheduled = match &kinds {
                    Some(k) => tx.query_opt(&scheduled_sql, &[queue, &now, k])?,
                    None => tx.query_opt(&scheduled_sql, &[queue, &now])?,
                };
                if let Some(r) = scheduled {
                    let at: i64 = r.get(0);
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            let stopping: Option<i64> = tx
                .query_one(
                    "SELECT min(lease_expires_at) + 1 FROM tickler_jobs
                     WHERE status IN ('cancelled', 'dead') AND lease_expires_at >= $1::bigint
                       AND unique_key IS NOT NULL",
                    &[&now],
                )?
                .get(0);
            if let Some(at) = stopping {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
            Ok(earliest)
        })?;
        Ok(earliest.map(ms_to_datetime))
    }

    fn heartbeat_many(
        &self,
        leases: &[&Lease],
        extend_by: Duration,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        let extend_ms = duration_ms(extend_by, "lease extension")?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
        let tokens: Vec<&str> = leases.iter().map(|l| l.run_token.0.as_str()).collect();
        let batch = self.write(|tx, _| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            tx.execute(LOCK_IN_ORDER_SQL, &[&ids])?;
            let renewed: HashMap<i64, String> = tx
                .query(
                    "UPDATE tickler_jobs AS j
                     SET lease_expires_at = $1::bigint, lease_ms = $1::bigint - $2::bigint
                     FROM unnest($3::bigint[], $4::text[]) AS h(id, run_token)
                     WHERE j.id = h.id AND j.run_token = h.run_token AND j.status = 'running'
                     RETURNING j.id, j.run_token",
                    &[&expires, &now, &ids, &tokens],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            Ok((renewed, expires))
        });
        let (renewed, expires) = match batch {
            Err(e) if statement_level(&e) => return self.heartbeat_each(leases, extend_ms),
            other => other?,
        };
        Ok(leases
            .iter()
            .map(|l| {
                if renewed.get(&l.job_id.0) == Some(&l.run_token.0) {
                    Ok(ms_to_datetime(expires))
                } else {
                    Err(Error::LeaseLost { job_id: l.job_id })
                }
            })
            .collect())
    }

    fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
        let running: HashMap<i64, String> = self.read(|tx| {
            Ok(tx
                .query(
                    "SELECT id, run_token FROM tickler_jobs
                     WHERE id = ANY($1::bigint[]) AND status = 'running'",
                    &[&ids],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })?;
        Ok(leases
            .iter()
            .map(|l| running.get(&l.job_id.0) == Some(&l.run_token.0))
            .collect())
    }

    fn record_and_claim(
        &self,
        outcomes: &[(&Lease, Outcome)],
        claim: Option<&Claim<'_>>,
        _sync: OutcomeSync,
    ) -> Result<(Vec<Result<()>>, Vec<Lease>)> {
        if let Some(Claim { request: c, .. }) = claim {
            for queue in c.queues {
                check_text("queue", queue)?;
            }
            for kind in c.kinds.unwrap_or_default() {
                check_text("kind", kind)?;
            }
        }
        let claim = match claim {
            Some(claim @ Claim { request: c, .. })
                if c.max > 0 && !c.kinds.is_some_and(|k| k.is_empty()) =>
            {
                let sql = (
                    claim_sql(c.kinds.is_some(), ClaimOrder::Priority),
                    claim_sql(c.kinds.is_some(), ClaimOrder::Oldest),
                );
                Some((claim, duration_ms(c.lease, "lease")?, sql))
            }
            _ => None,
        };
        if outcomes.is_empty() && claim.is_none() {
            return Ok((Vec::new(), Vec::new()));
        }
        if let (Some((request, _, _)), true) = (&claim, outcomes.len() >= PARALLEL_OUTCOMES) {
            // A pool finishing a large batch and taking the next: the
            // outcomes and the claim touch different rows, so they go in
            // two transactions at once on two connections (PostgreSQL
            // works on both in parallel) rather than one after the other
            // in one.
            return std::thread::scope(|scope| {
                // Every commit is durable here: `sync` changes nothing.
                let recording =
                    scope.spawn(|| self.record_and_claim(outcomes, None, OutcomeSync::Now));
                let claimed = self.record_and_claim(&[], Some(request), OutcomeSync::Now);
                let recorded = recording
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                Ok((recorded?.0, claimed?.1))
            });
        }
        let policy = self.retry_policy;
        let mut isolate = false;
        let mut pending_outcomes = outcomes;
        let mut results = Vec::with_capacity(outcomes.len());
        // The id of the last try's claim: if its COMMIT was lost with the
        // connection, the jobs it claimed may be ours already, and are
        // taken up rather than left to run out their lease.
        let last_claim = std::cell::Cell::new(None::<i64>);
        let leases = loop {
            let step = self.write(|tx, attempt| {
                let now = self.now_ms();
                let recorded = record_all(tx, pending_outcomes, now, &policy, attempt, isolate)?;
                let claimed = match (&claim, last_claim.get()) {
                    (Some(_), Some(claim_id)) if attempt.after_unknown_commit => {
                        last_claim.set(None);
                        Some(adopt_claimed(tx, claim_id)?)
                    }
                    (Some((claim, lease_ms, sql)), _) => {
                        let claim_id = fastrand::i64(..);
                        last_claim.set(Some(claim_id));
                        let expires = now.saturating_add(*lease_ms).min(MAX_TIMESTAMP_MS);
                        let mut claim_tx = InTransaction { tx, sql, claim_id };
                        (claim.rules)(&mut claim_tx, claim.request, now, expires)?
                    }
                    (None, _) => Some(Vec::new()),
                };
                Ok((recorded, claimed))
            });
            let (recorded, claimed) = match step {
                Err(e) if !isolate && statement_level(&e) && !pending_outcomes.is_empty() => {
                    // A statement the server refused rolled back the whole
                    // transaction: again, each outcome in a savepoint, so
                    // that the refusal stays with its own job.
                    isolate = true;
                    continue;
                }
                other => other?,
            };
            results.extend(recorded);
            pending_outcomes = &[];
            if let Some(claimed) = claimed {
                break claimed;
            }
        };
        if outcomes
            .iter()
            .any(|(_, o)| !matches!(o, Outcome::Complete | Outcome::FailPermanently(_)))
        {
            self.notify_watchers();
        }
        Ok((results, leases))
    }

    fn reap_look(
        &self,
        cutoff: Option<i64>,
        take: &mut dyn FnMut(&ExpiredLease, bool) -> bool,
    ) -> Result<ReapLook> {
        let policy = self.retry_policy;
        self.write(|tx, _| {
            let stepped_now = self.now_ms();
            let margin = crate::engine::types::BACKWARD_STEP_MARGIN.as_millis() as i64;
            tx.execute(LEASE_STEP_SQL, &[&stepped_now, &margin])?;
            tx.execute(CANCELLED_LEASE_STEP_SQL, &[&stepped_now, &margin])?;
            let now = cutoff.map_or(stepped_now, |c| c.min(stepped_now));
            let expired = tx.query(
                "SELECT id, run_token, attempts, coalesce(claimed_by, '?'), lease_expires_at
                 FROM tickler_jobs
                 WHERE status = 'running' AND lease_expires_at < $1::bigint
                 ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
                &[&now, &REAP_BATCH],
            )?;
            tx.execute(
                "UPDATE tickler_jobs SET lease_expires_at = NULL
                 WHERE id = ANY(ARRAY(
                     SELECT id FROM tickler_jobs
                     WHERE status IN ('cancelled', 'dead') AND lease_expires_at < $1::bigint
                     FOR UPDATE SKIP LOCKED))",
                &[&now],
            )?;
            let batch_full = expired.len() as i64 >= REAP_BATCH;
            let mut taken = 0u64;
            let mut left = Vec::new();
            for row in expired {
                let lease = ExpiredLease {
                    id: row.get(0),
                    run_token: row.get(1),
                    expires_at: row.get(4),
                };
                // No look waits for a lock on the whole database here.
                if !take(&lease, false) {
                    left.push(lease);
                    continue;
                }
                let attempts: i64 = row.get(2);
                let worker: String = row.get(3);
                let attempt = u32::try_from(attempts.max(0)).unwrap_or(u32::MAX);
                let retry_at = retry_time(now, &policy, attempt);
                let error = lease_expired_error(&worker, attempts);
                let error = storable(&cut_error(&error)).into_owned();
                taken += tx.execute(
                    REAP_SQL,
                    &[&now, &retry_at, &error, &lease.id, &lease.run_token, &now],
                )?;
            }
            Ok(ReapLook {
                taken,
                left,
                batch_full,
            })
        })
    }

    fn wake_watchers(&self) {
        self.notify_watchers();
    }

    fn upkeep(&self) {
        self.maybe_vacuum();
    }

    fn cancel(&self, id: JobId) -> Result<()> {
        self.write(|tx, _| {
            let state = state_of(tx, id)?;
            if state.is_terminal() {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "cancel",
                });
            }
            let now = self.now_ms();
            tx.execute(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = $1,
                     lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at END
                 WHERE id = $2",
                &[&now, &id.0],
            )?;
            Ok(())
        })?;
        // A holder in another process notices at its next look.
        self.notify_watchers();
        Ok(())
    }

    fn retry(&self, id: JobId) -> Result<()> {
        self.write(|tx, _| {
            let state = state_of(tx, id)?;
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "retry",
                });
            }
            let holder = tx.query_opt(
                "SELECT held.unique_key, held.id FROM tickler_jobs AS job
                 JOIN tickler_jobs AS held ON held.unique_key = job.unique_key
                 WHERE job.id = $1 AND held.status IN ('scheduled', 'pending', 'running')",
                &[&id.0],
            )?;
            if let Some(r) = holder {
                return Err(Error::UniqueKeyHeld {
                    job_id: id,
                    unique_key: r.get(0),
                    held_by: JobId(r.get(1)),
                });
            }
            let now = self.now_ms();
            tx.execute(
                "UPDATE tickler_jobs
                 SET status = CASE WHEN lease_expires_at >= $1::bigint THEN 'scheduled' ELSE 'pending' END,
                     run_at = CASE WHEN lease_expires_at >= $1::bigint THEN lease_expires_at + 1
                                   ELSE $1::bigint END,
                     attempts = 0, finished_at = NULL, lease_expires_at = NULL
                 WHERE id = $2",
                &[&now, &id.0],
            )?;
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn prune_batch(&self, before: i64, state: Option<JobState>, limit: i64) -> Result<u64> {
        let state = state.map(JobState::as_str);
        self.write(|tx, _| {
            tx.execute(
                "DELETE FROM tickler_jobs WHERE id = ANY(ARRAY(
                     SELECT id FROM tickler_jobs
                     WHERE finished_at IS NOT NULL AND finished_at < $1::bigint
                       AND ($2::text IS NULL OR status = $2)
                     LIMIT $3 FOR UPDATE SKIP LOCKED))",
                &[&before, &state, &limit],
            )
        })
    }

    fn get(&self, id: JobId) -> Result<Job> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE id = $1");
        self.read(|tx| match tx.query_opt(&sql, &[&id.0])? {
            Some(r) => job_from_row(&r),
            None => Err(Error::NotFound(id)),
        })
    }

    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        for (what, value) in [("queue", &filter.queue), ("kind", &filter.kind)] {
            if let Some(value) = value {
                check_text(what, value)?;
            }
        }
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs
             WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR queue = $2)
               AND ($3::text IS NULL OR kind = $3)
             ORDER BY id LIMIT $4"
        );
        let state = filter.state.map(JobState::as_str);
        self.read(|tx| {
            tx.query(&sql, &[&state, &filter.queue, &filter.kind, &limit])?
                .iter()
                .map(job_from_row)
                .collect()
        })
    }

    fn count(&self, state: JobState) -> Result<u64> {
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tickler_jobs WHERE status = $1",
                    &[&state.as_str()],
                )?
                .get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn stats(&self) -> Result<Stats> {
        let now = self.now_ms();
        self.read(|tx| {
            let mut stats = Stats::default();
            for r in tx.query(STATS_COUNTS_SQL, &[])? {
                let status: String = r.get(1);
                stats.counts.insert(
                    (r.get(0), status.parse()?),
                    r.get::<_, i64>(2).unsigned_abs(),
                );
            }
            for r in tx.query(
                "SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'pending' GROUP BY queue, priority
                 UNION ALL
                 SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'scheduled' AND run_at <= $1::bigint GROUP BY queue, priority",
                &[&now],
            )? {
                let at = ms_to_datetime(r.get(2));
                let e = stats
                    .oldest_due_by_priority
                    .entry((r.get(0), r.get(1)))
                    .or_insert(at);
                *e = (*e).min(at);
            }
            stats.oldest_due = stats.oldest_due_by_priority.values().min().copied();
            Ok(stats)
        })
    }

    fn retry_dead_batch(
        &self,
        queue: Option<&str>,
        after_id: i64,
        limit: i64,
    ) -> Result<RetryDeadBatch> {
        self.write(|tx, _| {
            let dead = tx.query(
                "SELECT id, unique_key FROM tickler_jobs
                 WHERE status = 'dead' AND ($1::text IS NULL OR queue = $1) AND id > $2
                 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
                &[&queue, &after_id, &limit],
            )?;
            let now = self.now_ms();
            let (mut retried, mut left_dead) = (0u64, 0u64);
            let mut last_id = None;
            for r in &dead {
                let id: i64 = r.get(0);
                let key: Option<String> = r.get(1);
                last_id = Some(id);
                if let Some(key) = &key {
                    if tx.query_opt(HELD_SQL, &[key])?.is_some() {
                        left_dead += 1;
                        continue;
                    }
                }
                retried += tx.execute(
                    "UPDATE tickler_jobs SET status = 'pending', attempts = 0,
                         run_at = $1::bigint, finished_at = NULL, lease_expires_at = NULL
                     WHERE id = $2 AND status = 'dead'",
                    &[&now, &id],
                )?;
            }
            Ok(RetryDeadBatch {
                retried,
                left_dead,
                last_id,
                seen: dead.len(),
            })
        })
    }

    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tickler_jobs WHERE finished_at >= $1::bigint",
                    &[&since.timestamp_millis()],
                )?
                .get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        if queues.is_empty() || kinds.is_some_and(|k| k.is_empty()) {
            return Ok(0);
        }
        let queues: Vec<&str> = queues.to_vec();
        let kinds: Option<Vec<&str>> = kinds.map(<[&str]>::to_vec);
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tickler_jobs
                     WHERE status IN ('scheduled', 'pending', 'running')
                       AND queue = ANY($1) AND ($2::text[] IS NULL OR kind = ANY($2))",
                    &[&queues, &kinds],
                )?
                .get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.write(|tx, _| {
            let now = self.now_ms();
            if paused {
                tx.execute(
                    "INSERT INTO tickler_paused_queues (queue, paused_at) VALUES ($1, $2)
                     ON CONFLICT (queue) DO NOTHING",
                    &[&queue, &now],
                )?;
            } else {
                tx.execute(
                    "DELETE FROM tickler_paused_queues WHERE queue = $1",
                    &[&queue],
                )?;
            }
            Ok(())
        })?;
        // NOTIFY: the pools of other processes wake up and look again.
        self.notify_watchers();
        Ok(())
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(|tx| Ok(paused_in(tx)?.into_iter().collect()))
    }

    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>> {
        let (cond, _) = crate::engine::state_index(state);
        let sql = format!("SELECT min(queue) FROM tickler_jobs WHERE {cond} AND queue > $1");
        self.read(|tx| Ok(tx.query_one(&sql, &[&after])?.get(0)))
    }

    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64> {
        let (cond, _) = crate::engine::state_index(state);
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = $1 LIMIT $2) AS capped"
        );
        self.read(|tx| {
            let n: i64 = tx.query_one(&sql, &[&queue, &cap])?.get(0);
            Ok(n.unsigned_abs())
        })
    }

    fn finished_between(
        &self,
        from_ms: i64,
        to_ms: i64,
        cap: u64,
        sample: usize,
    ) -> Result<(u64, Vec<FinishedSample>)> {
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let sample = i64::try_from(sample).unwrap_or(i64::MAX);
        self.read(|tx| {
            let n: i64 = tx
                .query_one(
                    "SELECT count(*) FROM
                       (SELECT 1 FROM tickler_jobs
                        WHERE finished_at >= $1 AND finished_at < $2 LIMIT $3) AS capped",
                    &[&from_ms, &to_ms, &cap],
                )?
                .get(0);
            let rows = tx
                .query(
                    "SELECT status, run_at, claimed_at, finished_at FROM tickler_jobs
                     WHERE finished_at >= $1 AND finished_at < $2
                     ORDER BY finished_at DESC LIMIT $3",
                    &[&from_ms, &to_ms, &sample],
                )?
                .iter()
                .map(|r| FinishedSample {
                    state: r.get::<_, &str>(0).parse().ok(),
                    run_at_ms: r.get(1),
                    claimed_at_ms: r.get(2),
                    finished_at_ms: r.get(3),
                })
                .collect();
            Ok((n.unsigned_abs(), rows))
        })
    }

    fn list_in_queue(&self, state: JobState, queue: &str, limit: usize) -> Result<Vec<Job>> {
        let (cond, order) = crate::engine::state_index(state);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE {cond} AND queue = $1
             ORDER BY {order} LIMIT $2"
        );
        self.read(|tx| {
            tx.query(&sql, &[&queue, &limit])?
                .iter()
                .map(job_from_row)
                .collect()
        })
    }
}

/// The paused queues, in byte order (a table of a few rows at most).
fn paused_in(tx: &mut Tx<'_>) -> Result<std::collections::BTreeSet<String>> {
    Ok(tx
        .query("SELECT queue FROM tickler_paused_queues", &[])?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

impl Store {
    /// [`Engine::heartbeat_many`] after the server refused the statement
    /// that renews them all (a trigger, a damaged row): each lease in a
    /// savepoint of its own (in id order, as the batch locks them), so the
    /// refusal costs that lease alone.
    fn heartbeat_each(
        &self,
        leases: &[&Lease],
        extend_ms: i64,
    ) -> Result<Vec<Result<DateTime<Utc>>>> {
        let mut order: Vec<usize> = (0..leases.len()).collect();
        order.sort_by_key(|&i| leases[i].job_id.0);
        self.write(|tx, _| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            let mut results: Vec<Result<DateTime<Utc>>> = leases
                .iter()
                .map(|l| Err(Error::LeaseLost { job_id: l.job_id }))
                .collect();
            for &i in &order {
                let lease = leases[i];
                let renewed = tx.isolated(|tx| {
                    tx.execute(
                        concat!(
                            "UPDATE tickler_jobs
                             SET lease_expires_at = $1::bigint, lease_ms = $1::bigint - $2::bigint ",
                            fence!("$3", "$4")
                        ),
                        &[&expires, &now, &lease.job_id.0, &lease.run_token.0],
                    )
                })?;
                results[i] = match renewed {
                    Ok(1) => Ok(ms_to_datetime(expires)),
                    Ok(_) => Err(Error::LeaseLost {
                        job_id: lease.job_id,
                    }),
                    Err(refused) => Err(refused),
                };
            }
            Ok(results)
        })
    }
}

fn state_of(tx: &mut Tx<'_>, id: JobId) -> Result<JobState> {
    let row = tx.query_opt(
        "SELECT status FROM tickler_jobs WHERE id = $1 FOR UPDATE",
        &[&id.0],
    )?;
    row.ok_or(Error::NotFound(id))?.get::<_, String>(0).parse()
}

/// The parts of the `Queue` API that run inside the application's own
/// PostgreSQL transactions.
impl Store {
    /// See [`crate::Queue::enqueue_batch_pg_tx`]. In a savepoint of the
    /// caller's transaction, so that a refused job leaves the caller's
    /// transaction usable; with a `NOTIFY` in it, which PostgreSQL delivers
    /// when (and only if) the caller commits.
    pub(crate) fn enqueue_in(
        &self,
        app: &mut postgres::Transaction<'_>,
        rows: &[ValidJob],
    ) -> Result<Vec<JobId>> {
        let mut statements = HashMap::new();
        let mut tx = Tx {
            tx: super::Session::Transaction(app.savepoint("tickler_enqueue")?),
            statements: &mut statements,
        };
        let now = self.now_ms();
        let ids = insert_valid(&mut tx, rows, now, fastrand::i64(..))?;
        tx.batch_execute(&format!("NOTIFY {}", super::listen::CHANNEL))?;
        tx.commit()?;
        // This process's fetchers look once the caller commits (the
        // notification wakes them again then).
        self.notify_local();
        Ok(ids)
    }

    /// See [`crate::Queue::complete_with_pg`]: one try, as `app_writes` runs
    /// once.
    pub(crate) fn complete_with(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(&mut postgres::Transaction<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut conn = self.pooled()?;
        let conn = &mut *conn;
        let mut app = conn.client.transaction()?;
        app_writes(&mut app)?;
        let changed = app.execute(
            COMPLETE_SQL,
            &[&self.now_ms(), &lease.job_id.0, &lease.run_token.0],
        )?;
        if changed != 1 {
            // Dropping `app` rolls the application's writes back too.
            return Err(Error::LeaseLost {
                job_id: lease.job_id,
            });
        }
        app.commit()?;
        Ok(())
    }
}
