//! Outcomes on SQLite: the fenced statements a lease's holder ends its run
//! with (built from `fence!` and `retry_or_dead!`), recording one outcome
//! or a run of successes in one statement, and `complete_with`.

use super::connection::isolated;
use super::Store;
use crate::engine::types::*;
use crate::engine::{fence, retry_or_dead, OutcomeTx};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use rusqlite::params;
use std::collections::HashMap;

/// Success ends the error story: `last_error` is cleared (the history in
/// `errors` stays). ?1 now, ?2 id, ?3 run_token.
pub(crate) const COMPLETE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = ?1, lease_expires_at = NULL, last_error = NULL ",
    fence!("?2", "?3")
);

/// COMPLETE_SQL with the handler's output (JSON text, ?4), in the same
/// statement: never a success without its output, nor the reverse.
pub(crate) const COMPLETE_WITH_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = ?1, lease_expires_at = NULL, last_error = NULL,
        output = ?4 ",
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
/// retry waits for the run's lease to run out, and the job keeps the lease
/// until then (dead, its unique_key stays held, see `unblocked`; dead or
/// waiting for its retry, its limit's slot stays taken).
pub(crate) const TIMED_OUT_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("?1", "max(?2, lease_expires_at + 1)"),
    ", last_error = ?3, ",
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

/// The reaper's statement for a run that never started (see
/// `reap_statement`): pending again, in its place (its run_at is kept),
/// with the attempt given back and `?2` in its error history (not in
/// last_error: nothing failed). ?1 now, ?2 note, ?3 id, ?4 run_token, ?5
/// the reaper's cutoff.
pub(crate) const GIVE_BACK_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'pending', attempts = attempts - 1, given_back = given_back + 1,
        lease_expires_at = NULL, ",
    append_error!("?1", "?2"),
    " ",
    fence!("?3", "?4"),
    " AND lease_expires_at < ?5 AND started_at IS NULL"
);

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

/// One outcome, fenced by run_token, by the shared rules
/// (`crate::queue::outcome`). The outer error is the transaction's (it
/// failed as a whole); the inner one is this outcome's alone: `LeaseLost`
/// when the lease is no longer held, or a statement SQLite refused (see
/// [`isolated`]), which changed nothing for it.
pub(crate) fn record_in(
    tx: &rusqlite::Transaction<'_>,
    lease: &Lease,
    outcome: &Outcome,
    now: i64,
    policy: &RetryPolicy,
) -> Result<Result<()>> {
    crate::queue::outcome::record_isolated(
        &mut InTransaction(tx),
        lease,
        outcome,
        now,
        policy,
        Attempt::default(),
    )
}

/// The [`OutcomeTx`] of a write transaction on the file.
struct InTransaction<'a, 'b>(&'a rusqlite::Transaction<'b>);

impl OutcomeTx for InTransaction<'_, '_> {
    fn apply_outcome(
        &mut self,
        lease: &Lease,
        outcome: &Outcome,
        now: i64,
        policy: &RetryPolicy,
        note: Option<&str>,
    ) -> Result<u64> {
        Ok(apply_outcome(self.0, lease, outcome, now, policy, note)? as u64)
    }

    /// A commit on the file is never in doubt, so `attempt` says nothing.
    fn after_refused(&mut self, lease: &Lease, _attempt: Attempt) -> Result<Result<()>> {
        // A holder reporting after its job was cancelled has stopped: its
        // unique_key is free for the next job.
        self.0
            .prepare_cached(HOLDER_STOPPED_SQL)?
            .execute(params![lease.job_id.0, lease.run_token.0])?;
        Ok(fenced(0, lease))
    }

    /// SQLite undoes a refused statement alone: no savepoint is needed.
    fn isolated(
        &mut self,
        f: &mut dyn FnMut(&mut dyn OutcomeTx) -> Result<Result<()>>,
    ) -> Result<Result<Result<()>>> {
        let tx = self.0;
        isolated(tx, || f(&mut InTransaction(tx)))
    }
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

/// ?1 id, ?2 run_token: the holder of a cancelled, dead or retried job
/// has stopped.
pub(crate) const HOLDER_STOPPED_SQL: &str = "UPDATE tickler_jobs SET lease_expires_at = NULL
    WHERE id = ?1 AND run_token = ?2 AND status IN ('scheduled', 'pending', 'cancelled', 'dead')
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
        Outcome::CompleteWith(output) => tx.prepare_cached(COMPLETE_WITH_SQL)?.execute(params![
            now,
            id,
            token,
            output.as_str()
        ])?,
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

pub(crate) fn fenced(changed: usize, lease: &Lease) -> Result<()> {
    if changed == 1 {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            job_id: lease.job_id,
        })
    }
}

/// Completing a job inside the application's own transaction on the
/// same file (PostgreSQL's is in `postgres/outcome.rs`).
impl Store {
    /// See [`crate::Queue::complete_with`]. Only a busy BEGIN is retried,
    /// before `app_writes` ran; a busy error after it ran is the
    /// application's (or, not expected under BEGIN IMMEDIATE, the
    /// commit's): it rolls back and is returned as [`Error::Aborted`],
    /// never retried (the caller's `app_writes` refuses a second call).
    pub(crate) fn complete_with(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(&rusqlite::Transaction<'_>) -> Result<()>,
    ) -> Result<()> {
        let released = self.write(|tx| {
            app_writes(tx).map_err(|e| if e.is_busy() { Error::aborted(e) } else { e })?;
            let now = self.now_ms();
            let changed = tx.prepare_cached(COMPLETE_SQL)?.execute(params![
                now,
                lease.job_id.0,
                lease.run_token.0
            ])?;
            fenced(changed, lease)?;
            let released = super::deps::resolve(tx, &[lease.job_id], now)?;
            if let Some(slot) = &lease.limit {
                crate::queue::limits::settle(
                    &mut super::limits::InTransaction(tx),
                    &[slot],
                    Vec::new(),
                    now,
                )?;
            }
            Ok(!released.is_empty())
        })?;
        // Jobs that ran after this one are due now: this process's
        // fetchers look at once.
        if released {
            self.notify_watchers();
        }
        Ok(())
    }
}
