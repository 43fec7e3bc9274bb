//! Outcomes on PostgreSQL: the fenced statements a lease's holder ends its
//! run with (built from `fence!` and `retry_or_dead!`), recording them in
//! id order (successes in one statement, each outcome in a savepoint once
//! the server refused one), telling a lost lease from an outcome already
//! recorded by a try whose COMMIT answer was lost, and `complete_with`.

use super::connection::{storable, Attempt, Tx, RETRIES};
use super::Store;
use crate::engine::types::*;
use crate::engine::{fence, retry_or_dead, OutcomeTx};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use postgres::types::Type;
use std::collections::HashMap;

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

/// $1 now, $2 id, $3 run_token.
const COMPLETE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = $1, lease_expires_at = NULL, last_error = NULL ",
    fence!("$2", "$3")
);

/// COMPLETE_SQL with the handler's output (JSON text, $4), in the same
/// statement: never a success without its output, nor the reverse.
const COMPLETE_WITH_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = $1, lease_expires_at = NULL, last_error = NULL,
        output = $4 ",
    fence!("$2", "$3")
);

/// Locks rows $1 in id order, so that two transactions updating several
/// of the same rows (a pool's heartbeats and its outcomes) take them in
/// the same order and never deadlock.
pub(super) const LOCK_IN_ORDER_SQL: &str =
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
    ", last_error = $3, ",
    append_error!("$1", "$3"),
    " ",
    fence!("$4", "$5")
);

/// The reaper's FAIL_SQL, also conditional on the lease having run out
/// before $6.
pub(super) const REAP_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!("$1::bigint", "$2::bigint"),
    ", last_error = $3, lease_expires_at = NULL, ",
    append_error!("$1", "$3"),
    " ",
    fence!("$4", "$5"),
    " AND lease_expires_at < $6::bigint"
);

/// The reaper's statement for a run that never started; see the SQLite
/// engine. $1 now, $2 note, $3 id, $4 run_token, $5 cutoff.
pub(super) const GIVE_BACK_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'pending', attempts = attempts - 1, given_back = given_back + 1,
        lease_expires_at = NULL, ",
    append_error!("$1", "$2"),
    " ",
    fence!("$3", "$4"),
    " AND lease_expires_at < $5::bigint AND started_at IS NULL"
);

/// $1 now, $2 error, $3 id, $4 run_token.
pub(super) const DEAD_SQL: &str = concat!(
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

/// $1 id, $2 run_token: the holder of a cancelled, dead or retried job
/// has stopped.
const HOLDER_STOPPED_SQL: &str = "UPDATE tickler_jobs SET lease_expires_at = NULL
    WHERE id = $1 AND run_token = $2 AND status IN ('scheduled', 'pending', 'cancelled', 'dead')
      AND lease_expires_at IS NOT NULL";

impl OutcomeTx for Tx<'_> {
    /// The fenced statement of one outcome; returns the rows changed (0: the
    /// lease is lost). `note`, if given, is stored instead of a failure's
    /// error text.
    fn apply_outcome(
        &mut self,
        lease: &Lease,
        outcome: &Outcome,
        now: i64,
        policy: &RetryPolicy,
        note: Option<&str>,
    ) -> Result<u64> {
        let tx = self;
        let id = lease.job_id.0;
        let token = &lease.run_token.0;
        let error_of = |error: &str| storable(&cut_error(note.unwrap_or(error))).into_owned();
        match outcome {
            Outcome::Complete => tx.execute(COMPLETE_SQL, &[&now, &id, token]),
            Outcome::CompleteWith(output) => {
                tx.execute(COMPLETE_WITH_SQL, &[&now, &id, token, &output.as_str()])
            }
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
    fn after_refused(&mut self, lease: &Lease, attempt: Attempt) -> Result<Result<()>> {
        let tx = self;
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

    fn isolated(
        &mut self,
        f: &mut dyn FnMut(&mut dyn OutcomeTx) -> Result<Result<()>>,
    ) -> Result<Result<Result<()>>> {
        Tx::isolated(self, |tx| f(tx))
    }
}

/// Many successes in one statement.
pub(super) fn complete_many(
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
            recorded.push(tx.after_refused(lease, attempt)?);
        }
    }
    Ok(recorded)
}

/// Completing a job inside the application's own PostgreSQL transaction.
impl Store {
    /// See [`crate::Queue::complete_with`]. Tried again within the retry
    /// window only while `app_writes` has not run: a deadlock or lock wait
    /// on the job's row, or a connection lost before it; once the
    /// application's writes ran, any error is the caller's.
    pub(crate) fn complete_with(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(&mut postgres::Transaction<'_>) -> Result<()>,
    ) -> Result<()> {
        RETRIES.run_until_handed(self.retry_window, |handed| {
            self.complete_with_once(lease, app_writes, handed)
        })
    }

    fn complete_with_once(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(&mut postgres::Transaction<'_>) -> Result<()>,
        handed: &mut bool,
    ) -> Result<()> {
        let mut pooled = self.pooled()?;
        let conn = &mut *pooled;
        let result = (|| {
            let mut app = conn.client.transaction()?;
            // The fenced completion first: the job's row is locked before
            // any row of the application's, the order of tickler's other
            // transactions, and a lost lease is known before the
            // application's writes run.
            // Unnamed, with its types: one round trip, and nothing left
            // on a pooler's server connection.
            let changed = app.execute_typed(
                COMPLETE_SQL,
                &[
                    (&self.now_ms(), Type::INT8),
                    (&lease.job_id.0, Type::INT8),
                    (&lease.run_token.0, Type::TEXT),
                ],
            )?;
            if changed != 1 {
                return Err(Error::LeaseLost {
                    job_id: lease.job_id,
                });
            }
            *handed = true;
            let released = super::deps::resolve(&mut app, &[lease.job_id], self.now_ms())?;
            // An error here drops `app`, which rolls the completion back.
            app_writes(&mut app)?;
            // The freed slot is handed on last: the limit's lock is not
            // held while the application's writes run.
            if let Some(slot) = &lease.limit {
                super::limits::settle(&mut app, &[slot], Vec::new(), self.now_ms())?;
            }
            app.commit()?;
            Ok(!released.is_empty())
        })();
        if let Err(e) = &result {
            conn.mark_broken_by(e);
        }
        conn.restore_session();
        if self.pooling.transaction_mode() {
            // The client library keeps, per connection, statements of its
            // own that the application's writes may have made it prepare
            // (to look up a type of the database's): behind a pooler in
            // transaction mode they are on a server connection that is
            // now anyone's.
            conn.drop_after_use();
        }
        // Jobs that ran after this one are due now: the pools of every
        // process look at once, not at their next poll.
        if result? {
            self.notify_watchers();
        }
        Ok(())
    }
}
