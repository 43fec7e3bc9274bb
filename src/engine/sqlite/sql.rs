//! The jobs table's statements for SQLite, and the functions that run them
//! inside a write transaction: inserting, claiming, recording outcomes.

use crate::engine::types::*;
use crate::error::{Error, Result};
use crate::job::{JobId, JobState};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use rusqlite::{params, OptionalExtension};
use std::collections::HashMap;

/// A fresh random UUID (v4) per row, from SQLite's own CSPRNG
/// (`random()`), so one claiming UPDATE can give each job its own
/// run_token: 122 random bits, the version nibble 4 and the variant bits
/// 10, in lowercase hex. One `printf` of six random numbers, rather than
/// the five `randomblob`s, five `hex` and `lower` and the `substr`s and
/// concatenations it used to take per claimed job.
pub(crate) const RUN_TOKEN_SQL: &str = "printf('%08x-%04x-4%03x-%x%03x-%012x', \
    random() & 0xffffffff, random() & 0xffff, random() & 0xfff, \
    8 | (random() & 3), random() & 0xfff, random() & 0xffffffffffff)";

/// Every `LIMIT` of a bound parameter in this file is written `LIMIT +?N`:
/// SQLite (3.47 and later) reads a bare `LIMIT ?N` as a constant when it
/// plans the statement, and then re-plans the whole statement (parse and
/// code generation, ~100 times the cost of running a claim of one job)
/// each time `?N` is bound again, i.e. on every execution. The unary plus
/// keeps the limit a run-time value; the plan is the same.
pub(crate) const PROMOTE_SQL: &str = "UPDATE tickler_jobs SET status = 'pending'
    WHERE id IN (SELECT id FROM tickler_jobs
                 WHERE status = 'scheduled' AND queue = ?1 AND run_at <= ?2
                 ORDER BY run_at LIMIT +?3)";

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
pub(crate) use fence;

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

/// Success ends the error story: `last_error` is cleared (the history in
/// `errors` stays). ?1 now, ?2 id, ?3 run_token.
pub(crate) const COMPLETE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = ?1, lease_expires_at = NULL, last_error = NULL ",
    fence!("?2", "?3")
);

/// `errors` with one more entry for the current attempt (at `$at`, error
/// `$error`), keeping the last `ERROR_HISTORY_MAX` (20) entries.
macro_rules! append_error {
    ($at:literal, $error:literal) => {
        concat!(
            // A damaged history (not a JSON array) starts over rather than
            // failing the outcome it belongs to.
            "errors = json_insert(
                 CASE WHEN json_valid(errors) AND json_type(errors) = 'array' THEN
                          CASE WHEN json_array_length(errors) >= 20
                               THEN json_remove(errors, '$[0]') ELSE errors END
                      ELSE '[]' END,
                 '$[#]',
                 json_object('attempt', attempts, 'at', ",
            $at,
            ", 'error', ",
            $error,
            ", 'worker', claimed_by))"
        )
    };
}

/// ?1 now, ?2 retry time, ?3 error, ?4 id, ?5 run_token. Dead when the
/// attempts are used up, else waiting for the retry time.
pub(crate) const FAIL_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("?1", "?2"),
    ", last_error = ?3, lease_expires_at = NULL, ",
    append_error!("?1", "?3"),
    " ",
    fence!("?4", "?5")
);

/// FAIL_SQL for a run whose handler is still running past its timeout: the
/// retry waits for the run's lease to run out, and a dead job keeps the
/// lease (so its unique_key stays held, see `unblocked`).
pub(crate) const TIMED_OUT_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("?1", "max(?2, lease_expires_at + 1)"),
    ", last_error = ?3,
        lease_expires_at = CASE WHEN attempts >= max_attempts THEN lease_expires_at END, ",
    append_error!("?1", "?3"),
    " ",
    fence!("?4", "?5")
);

/// The reaper's version of FAIL_SQL, also conditional on the lease having
/// run out (?6, the reaper's cutoff), so that a heartbeat that landed first
/// wins.
pub(crate) const REAP_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("?1", "?2"),
    ", last_error = ?3, lease_expires_at = NULL, ",
    append_error!("?1", "?3"),
    " ",
    fence!("?4", "?5"),
    " AND lease_expires_at < ?6"
);

/// ?1 now, ?2 margin (ms). See reap_look; leases granted before
/// lease_ms existed count from their claim.
pub(crate) const LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = ?1 + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status = 'running' AND lease_expires_at > ?1 + ?2
      AND lease_expires_at > ?1 + coalesce(lease_ms, lease_expires_at - claimed_at) + ?2";

/// LEASE_STEP_SQL for cancelled jobs whose holder has not reported.
pub(crate) const CANCELLED_LEASE_STEP_SQL: &str = "UPDATE tickler_jobs
    SET lease_expires_at = ?1 + coalesce(lease_ms, lease_expires_at - claimed_at)
    WHERE status IN ('cancelled', 'dead') AND lease_expires_at IS NOT NULL
      AND lease_expires_at > ?1 + coalesce(lease_ms, lease_expires_at - claimed_at) + ?2";

/// ?1 now, ?2 error, ?3 id, ?4 run_token.
pub(crate) const DEAD_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'dead', finished_at = ?1, last_error = ?2, lease_expires_at = NULL, ",
    append_error!("?1", "?2"),
    " ",
    fence!("?3", "?4")
);

pub(crate) const SNOOZE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = CASE WHEN ?2 <= ?1 THEN 'pending' ELSE 'scheduled' END,
        run_at = ?2, attempts = attempts - 1, lease_expires_at = NULL ",
    fence!("?3", "?4")
);

pub(crate) const RELEASE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'pending', attempts = attempts - 1, lease_expires_at = NULL ",
    fence!("?1", "?2")
);

pub(crate) const LEASE_COLUMNS: &str =
    "id, queue, kind, payload, priority, run_at, attempts, max_attempts, run_token, lease_expires_at, timeout_ms";

pub(crate) const JOB_COLUMNS: &str =
    "id, queue, kind, payload, status, priority, run_at, attempts, max_attempts, \
    unique_key, timeout_ms, run_token, claimed_by, claimed_at, lease_expires_at, last_error, \
    created_at, finished_at, errors";

/// Inserts validated jobs in `tx`; a job whose unique_key is held by an
/// unfinished job inserts nothing and yields that job's id.
pub(crate) fn insert_valid(
    tx: &rusqlite::Transaction<'_>,
    rows: &[ValidJob],
    now: i64,
) -> Result<Vec<JobId>> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO tickler_jobs (queue, kind, payload, status, priority, run_at,
             max_attempts, unique_key, timeout_ms, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT DO NOTHING",
    )?;
    let mut held = tx.prepare_cached(
        "SELECT id FROM tickler_jobs WHERE unique_key = ?1
           AND status IN ('scheduled', 'pending', 'running')",
    )?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in rows {
        let job = &row.job;
        let run_at = row.due.resolve(now)?;
        let state = if run_at <= now {
            JobState::Pending
        } else {
            JobState::Scheduled
        };
        let inserted = insert.execute(params![
            job.queue,
            job.kind,
            row.payload,
            state.as_str(),
            job.priority,
            run_at,
            job.max_attempts,
            job.unique_key,
            row.timeout_ms,
            now
        ])?;
        if inserted == 1 {
            ids.push(JobId(tx.last_insert_rowid()));
        } else {
            ids.push(JobId(held.query_row([&job.unique_key], |r| r.get(0))?));
        }
    }
    Ok(ids)
}

/// `AND kind IN (?first, ?first+1, …)` for `kinds`, or nothing when all
/// kinds are wanted.
pub(crate) fn kind_filter(kinds: Option<&[&str]>, first: usize) -> String {
    match kinds {
        None => String::new(),
        Some(kinds) => {
            let marks: Vec<String> = (0..kinds.len())
                .map(|i| format!("?{}", first + i))
                .collect();
            format!("AND kind IN ({})", marks.join(", "))
        }
    }
}

/// The claiming UPDATE; ?1 worker_id, ?2 now, ?3 lease expiry, ?4 queue,
/// ?5 limit, ?6… kinds.
pub(crate) fn claim_sql(kinds: Option<&[&str]>, order: ClaimOrder) -> String {
    let order = order.sql();
    let kind_filter = kind_filter(kinds, 6);
    let unblocked = unblocked("?2");
    format!(
        "UPDATE tickler_jobs
         SET status = 'running', run_token = {RUN_TOKEN_SQL}, attempts = attempts + 1,
             claimed_by = ?1, claimed_at = ?2, lease_expires_at = ?3, lease_ms = ?3 - ?2
         WHERE id IN (SELECT id FROM tickler_jobs AS job
                      WHERE status = 'pending' AND queue = ?4 {kind_filter} AND {unblocked}
                      ORDER BY {order} LIMIT +?5)
         RETURNING {LEASE_COLUMNS}"
    )
}

/// A condition on `job` (a row aliased so): its unique_key is not held by
/// a cancelled job whose holder may still be running (its lease, kept by
/// the cancel, runs to `now` or later). A cancelled run keeps its key until
/// its holder reports (its refused outcome clears the lease) or its lease
/// runs out, so the next job with that key never runs beside it.
pub(crate) fn unblocked(now: &str) -> String {
    format!(
        "(job.unique_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM tickler_jobs AS stopping
             WHERE stopping.unique_key = job.unique_key
               AND stopping.status IN ('cancelled', 'dead')
               AND stopping.lease_expires_at >= {now}))"
    )
}

/// One outcome, fenced by run_token. The outer error is the
/// transaction's (it failed as a whole); the inner one is this outcome's
/// alone: `LeaseLost` when the lease is no longer held, or a statement
/// SQLite refused (see [`isolated`]), which changed nothing for it.
pub(crate) fn record_in(
    tx: &rusqlite::Transaction<'_>,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
) -> Result<Result<()>> {
    if let Outcome::Snooze(until) = outcome {
        // Refused for this outcome only; the rest of the batch goes on. A
        // time before 1970 is past, so due now, like a run_at.
        if until.timestamp_millis() > MAX_TIMESTAMP_MS {
            return Ok(Err(Error::TimeOutOfRange {
                what: "snooze time",
            }));
        }
    }
    let changed = match isolated(tx, || apply_outcome(tx, lease, outcome, now, policy, None))? {
        Err(refused) => match outcome {
            // The error text may be what SQLite refused (over a lowered
            // length limit, or refused by a trigger): record the failure
            // with a short note instead, so the job is not left running
            // until its lease runs out.
            Outcome::Fail(error)
            | Outcome::FailRetryAfter(error, _)
            | Outcome::FailPermanently(error)
            | Outcome::TimedOut(error) => {
                let note = format!(
                    "the handler's error ({} bytes) could not be stored: {refused}",
                    error.len()
                );
                match isolated(tx, || {
                    apply_outcome(tx, lease, outcome, now, policy, Some(&note))
                })? {
                    Ok(changed) => changed,
                    Err(_) => return Ok(Err(refused)),
                }
            }
            _ => return Ok(Err(refused)),
        },
        Ok(changed) => changed,
    };
    if changed == 0 {
        // A holder reporting after its job was cancelled has stopped: its
        // unique_key is free for the next job.
        tx.prepare_cached(HOLDER_STOPPED_SQL)?
            .execute(params![lease.job_id.0, lease.run_token.0])?;
    }
    Ok(fenced(changed, lease))
}

/// COMPLETE_SQL for many leases at once: ?1 now, ?2 a JSON object of
/// `"id": "run_token"` members (an object rather than `[id, token]`
/// pairs, so that SQLite reads each member once rather than once per
/// `->>`). Returns the `id, run_token` of each job it completed.
pub(crate) const COMPLETE_MANY_SQL: &str = "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = ?1, lease_expires_at = NULL, last_error = NULL
    FROM (SELECT CAST(key AS INTEGER) AS id, value AS run_token FROM json_each(?2)) AS done
    WHERE tickler_jobs.id = done.id AND tickler_jobs.run_token = done.run_token
      AND tickler_jobs.status = 'running'
    RETURNING tickler_jobs.id, tickler_jobs.run_token";

/// Records `Outcome::Complete` for each of `leases` (in order) into
/// `recorded`, as [`record_in`] would one by one, but with one statement
/// for all of them: each single-row UPDATE that changes `status` builds
/// SQLite's ephemeral tables for the `status IN (…)` lists of the schema's
/// CHECK constraints and partial indexes (four of them) anew, which cost
/// more than the update itself. A lease it did not complete is lost
/// (`LeaseLost`, and its cancelled job's holder has stopped), as with
/// COMPLETE_SQL. If SQLite refuses the statement (a trigger or
/// constraint), nothing of it was done and each lease is recorded on its
/// own, so that the refusal stays with its own job.
pub(crate) fn complete_many(
    tx: &rusqlite::Transaction<'_>,
    leases: &[(&Lease, Outcome)],
    now: i64,
    policy: &RetryPolicy,
    recorded: &mut Vec<Result<()>>,
) -> Result<()> {
    /// `{"id": "run_token", …}`, in order (a lease given twice, twice).
    struct Members<'a>(&'a [(&'a Lease, Outcome)]);
    impl serde::Serialize for Members<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            s.collect_map(
                self.0
                    .iter()
                    .map(|(lease, _)| (lease.job_id.0, lease.run_token.0.as_str())),
            )
        }
    }
    let pairs = serde_json::to_string(&Members(leases))?;
    let done = isolated(tx, || {
        let mut stmt = tx.prepare_cached(COMPLETE_MANY_SQL)?;
        let rows = stmt.query_map(params![now, pairs], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<HashMap<i64, String>>>()?)
    })?;
    let mut done = match done {
        Ok(done) => done,
        Err(_) => {
            for (lease, outcome) in leases {
                recorded.push(record_in(tx, lease, outcome, now, policy)?);
            }
            return Ok(());
        }
    };
    for (lease, _) in leases {
        // A lease given twice completes once, like two COMPLETE_SQL.
        let changed = done.get(&lease.job_id.0) == Some(&lease.run_token.0);
        if changed {
            done.remove(&lease.job_id.0);
        } else {
            tx.prepare_cached(HOLDER_STOPPED_SQL)?
                .execute(params![lease.job_id.0, lease.run_token.0])?;
        }
        recorded.push(fenced(usize::from(changed), lease));
    }
    Ok(())
}

/// ?1 id, ?2 run_token: the cancelled job's holder has stopped.
pub(crate) const HOLDER_STOPPED_SQL: &str = "UPDATE tickler_jobs SET lease_expires_at = NULL
    WHERE id = ?1 AND run_token = ?2 AND status IN ('cancelled', 'dead')
      AND lease_expires_at IS NOT NULL";

/// The fenced statement of one outcome; returns the rows changed (0: lease
/// lost). `error_note` replaces the outcome's error text.
pub(crate) fn apply_outcome(
    tx: &rusqlite::Transaction<'_>,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
    error_note: Option<&str>,
) -> Result<usize> {
    let id = lease.job_id.0;
    let token = &lease.run_token.0;
    let error_of = |error: &str| cut_error(error_note.unwrap_or(error)).into_owned();
    Ok(match outcome {
        Outcome::Complete => tx
            .prepare_cached(COMPLETE_SQL)?
            .execute(params![now, id, token])?,
        Outcome::Fail(error) => {
            let retry_at = retry_time(now, policy, lease.attempt);
            tx.prepare_cached(FAIL_SQL)?.execute(params![
                now,
                retry_at,
                error_of(error),
                id,
                token
            ])?
        }
        Outcome::FailRetryAfter(error, delay) => {
            let retry_at =
                add_ms(now, *delay).map_or(MAX_TIMESTAMP_MS, |t| t.min(MAX_TIMESTAMP_MS));
            tx.prepare_cached(FAIL_SQL)?.execute(params![
                now,
                retry_at,
                error_of(error),
                id,
                token
            ])?
        }
        Outcome::FailPermanently(error) => {
            tx.prepare_cached(DEAD_SQL)?
                .execute(params![now, error_of(error), id, token])?
        }
        Outcome::TimedOut(error) => {
            let retry_at = retry_time(now, policy, lease.attempt);
            tx.prepare_cached(TIMED_OUT_SQL)?.execute(params![
                now,
                retry_at,
                error_of(error),
                id,
                token
            ])?
        }
        Outcome::Snooze(until) => {
            let until = match until.timestamp_millis() {
                before_1970 if before_1970 < 0 => now,
                until => until,
            };
            tx.prepare_cached(SNOOZE_SQL)?
                .execute(params![now, until, id, token])?
        }
        Outcome::Release => tx
            .prepare_cached(RELEASE_SQL)?
            .execute(params![id, token])?,
    })
}

/// Runs one statement of a batch (one outcome, one heartbeat). An error
/// SQLite confined to that statement (a constraint or trigger, a value over
/// its length limit) is that item's own, `Ok(Err(_))`: SQLite has undone
/// the statement alone and the transaction goes on with the rest of the
/// batch. Any other error, or one after which SQLite ended the
/// transaction (disk full, I/O), fails the batch: `Err(_)`.
pub(crate) fn isolated<T>(
    tx: &rusqlite::Transaction<'_>,
    statement: impl FnOnce() -> Result<T>,
) -> Result<Result<T>> {
    match statement() {
        Ok(value) => Ok(Ok(value)),
        Err(e) if statement_level(&e) && !tx.is_autocommit() => Ok(Err(e)),
        Err(e) => Err(e),
    }
}

pub(crate) fn statement_level(e: &Error) -> bool {
    match e {
        Error::ConstraintViolated { .. } => true,
        Error::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => matches!(
            f.code,
            rusqlite::ErrorCode::TooBig
                // SQLITE_ERROR from a statement, e.g. a JSON function on a
                // damaged value; `isolated` also checks the transaction is
                // still open.
                | rusqlite::ErrorCode::Unknown
                | rusqlite::ErrorCode::ConstraintViolation
                | rusqlite::ErrorCode::TypeMismatch
                | rusqlite::ErrorCode::ParameterOutOfRange
        ),
        _ => false,
    }
}

pub(crate) fn state_of(tx: &rusqlite::Transaction<'_>, id: JobId) -> Result<JobState> {
    let status: Option<String> = tx
        .prepare_cached("SELECT status FROM tickler_jobs WHERE id = ?1")?
        .query_row([id.0], |r| r.get(0))
        .optional()?;
    status.ok_or(Error::NotFound(id))?.parse()
}

pub(crate) fn fenced(changed: usize, lease: &Lease) -> Result<()> {
    if changed == 1 {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            job_id: lease.job_id,
        })
    }
}
