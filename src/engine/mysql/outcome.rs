//! Outcomes on MySQL: the fenced statements a lease's holder ends its run
//! with (built from `fence!` and `retry_or_dead!`, with named markers),
//! recording them in id order (successes: the rows locked in id order and
//! completed in one statement; each outcome in a savepoint once the server
//! refused one), telling a lost lease from an outcome already recorded by
//! a try whose COMMIT answer was lost, and `complete_with`.

use super::connection::{args, marks, Attempt, Tx, RETRIES};
use super::rows::get;
use super::Store;
use crate::engine::types::*;
use crate::engine::{fence, retry_or_dead, OutcomeTx};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::retry::RetryPolicy;
use mysql::prelude::Queryable;
use mysql::Value;
use std::collections::HashMap;

/// `errors` with one more entry for the current attempt (at `:now`, error
/// `:error`), keeping the last `ERROR_HISTORY_MAX` (20).
macro_rules! append_error {
    () => {
        "errors = JSON_ARRAY_APPEND(
             CASE WHEN JSON_LENGTH(errors) >= 20 THEN JSON_REMOVE(errors, '$[0]') ELSE errors END,
             '$', JSON_OBJECT('attempt', attempts, 'at', :now, 'error', :error,
                              'worker', claimed_by))"
    };
}

/// :now, :id, :token.
pub(super) const COMPLETE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = :now, lease_expires_at = NULL, last_error = NULL ",
    fence!(":id", ":token")
);

/// COMPLETE_SQL with the handler's output (JSON text, :output), in the
/// same statement: never a success without its output, nor the reverse.
const COMPLETE_WITH_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'succeeded', finished_at = :now, lease_expires_at = NULL, last_error = NULL,
        output = :output ",
    fence!(":id", ":token")
);

/// :now, :retry_at, :error, :id, :token.
const FAIL_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!(":now", ":retry_at"),
    ", last_error = :error, lease_expires_at = NULL, ",
    append_error!(),
    " ",
    fence!(":id", ":token")
);

/// FAIL_SQL for a run still going past its timeout; see the SQLite engine.
/// `lease_expires_at` is assigned after the assignments that read it.
const TIMED_OUT_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!(":now", "greatest(:retry_at, lease_expires_at + 1)"),
    ", last_error = :error, ",
    append_error!(),
    " ",
    fence!(":id", ":token")
);

/// The reaper's FAIL_SQL, also conditional on the lease having run out
/// before :cutoff.
pub(super) const REAP_SQL: &str = concat!(
    "UPDATE tickler_jobs SET ",
    retry_or_dead!(":now", ":retry_at"),
    ", last_error = :error, ",
    append_error!(),
    ", lease_expires_at = NULL ",
    fence!(":id", ":token"),
    " AND lease_expires_at < :cutoff"
);

/// The reaper's statement for a run that never started; see the SQLite
/// engine. The error history is written before `attempts` changes (MySQL
/// assigns left to right, each seeing the ones before). :now, :error (the
/// note), :id, :token, :cutoff.
pub(super) const GIVE_BACK_SQL: &str = concat!(
    "UPDATE tickler_jobs SET status = 'pending', ",
    append_error!(),
    ", attempts = attempts - 1, given_back = given_back + 1, lease_expires_at = NULL ",
    fence!(":id", ":token"),
    " AND lease_expires_at < :cutoff AND started_at IS NULL"
);

/// :now, :error, :id, :token.
pub(super) const DEAD_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'dead', finished_at = :now, last_error = :error, lease_expires_at = NULL, ",
    append_error!(),
    " ",
    fence!(":id", ":token")
);

/// :now, :until, :id, :token.
const SNOOZE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = CASE WHEN :until <= :now THEN 'pending' ELSE 'scheduled' END,
        run_at = :until, attempts = attempts - 1, lease_expires_at = NULL ",
    fence!(":id", ":token")
);

const RELEASE_SQL: &str = concat!(
    "UPDATE tickler_jobs
    SET status = 'pending', attempts = attempts - 1, lease_expires_at = NULL ",
    fence!(":id", ":token")
);

/// The holder of a cancelled, dead or retried job has stopped.
const HOLDER_STOPPED_SQL: &str = "UPDATE tickler_jobs SET lease_expires_at = NULL
    WHERE id = ? AND run_token = ? AND status IN ('scheduled', 'pending', 'cancelled', 'dead')
      AND lease_expires_at IS NOT NULL";

/// The running rows among `n` ids, locked in id order, so that two
/// transactions updating several of the same rows (a pool's heartbeats
/// and its outcomes) take them in the same order and never deadlock. By
/// primary key: on a small table the optimizer may walk the index of
/// running jobs instead, locking every running row in lease order.
pub(super) fn lock_running_in_order<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    ids: &[i64],
) -> Result<HashMap<i64, String>> {
    let sql = format!(
        "SELECT id, run_token FROM tickler_jobs FORCE INDEX (PRIMARY)
         WHERE id IN ({}) AND status = 'running' ORDER BY id FOR UPDATE",
        marks(ids.len())
    );
    let values = ids.iter().map(|id| Value::from(*id)).collect();
    tx.rows(&sql, values)?
        .iter()
        .map(|r| Ok((get(r, 0)?, get(r, 1)?)))
        .collect()
}

fn v(x: impl Into<Value>) -> Value {
    x.into()
}

impl OutcomeTx for Tx<'_> {
    /// The fenced statement of one outcome; returns the rows matched (0: the
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
        let id = ("id", v(lease.job_id.0));
        let token = ("token", v(lease.run_token.0.as_str()));
        let at = ("now", v(now));
        let error_of = |error: &str| ("error", v(cut_error(note.unwrap_or(error)).as_ref()));
        match outcome {
            Outcome::Complete => tx.exec_named(COMPLETE_SQL, &[at, id, token]),
            Outcome::CompleteWith(output) => tx.exec_named(
                COMPLETE_WITH_SQL,
                &[at, id, token, ("output", v(output.as_str().as_bytes()))],
            ),
            Outcome::Fail(error) => {
                let retry_at = ("retry_at", v(retry_time(now, policy, lease.attempt)));
                tx.exec_named(FAIL_SQL, &[at, retry_at, error_of(error), id, token])
            }
            Outcome::FailRetryAfter(error, delay) => {
                let retry_at =
                    add_ms(now, *delay).map_or(MAX_TIMESTAMP_MS, |t| t.min(MAX_TIMESTAMP_MS));
                let retry_at = ("retry_at", v(retry_at));
                tx.exec_named(FAIL_SQL, &[at, retry_at, error_of(error), id, token])
            }
            Outcome::FailPermanently(error) => {
                tx.exec_named(DEAD_SQL, &[at, error_of(error), id, token])
            }
            Outcome::TimedOut(error) => {
                let retry_at = ("retry_at", v(retry_time(now, policy, lease.attempt)));
                tx.exec_named(TIMED_OUT_SQL, &[at, retry_at, error_of(error), id, token])
            }
            Outcome::Snooze(until) => {
                let until = match until.timestamp_millis() {
                    before_1970 if before_1970 < 0 => now,
                    until => until,
                };
                tx.exec_named(SNOOZE_SQL, &[at, ("until", v(until)), id, token])
            }
            Outcome::Release => tx.exec_named(RELEASE_SQL, &[id, token]),
        }
    }

    /// After a fenced statement changed nothing: a cancelled job's holder
    /// has stopped; and if an earlier try of this transaction may have
    /// committed, a row this lease already moved on counts as recorded.
    fn after_refused(&mut self, lease: &Lease, attempt: Attempt) -> Result<Result<()>> {
        let tx = self;
        let id = lease.job_id.0;
        let token = lease.run_token.0.as_str();
        if attempt.after_unknown_commit
            && tx
                .first(
                    "SELECT 1 FROM tickler_jobs WHERE id = ? AND run_token = ?
                       AND status <> 'running'",
                    args![id, token],
                )?
                .is_some()
        {
            return Ok(Ok(()));
        }
        tx.exec(HOLDER_STOPPED_SQL, args![id, token])?;
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

/// Many successes: the rows locked in id order, those still held by these
/// leases completed in one statement.
pub(super) fn complete_many(
    tx: &mut Tx<'_>,
    leases: &[&Lease],
    now: i64,
    attempt: Attempt,
) -> Result<Vec<Result<()>>> {
    let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
    let running = lock_running_in_order(tx, &ids)?;
    let mut held: Vec<i64> = leases
        .iter()
        .filter(|l| running.get(&l.job_id.0) == Some(&l.run_token.0))
        .map(|l| l.job_id.0)
        .collect();
    held.sort_unstable();
    held.dedup();
    if !held.is_empty() {
        let mut values = vec![Value::from(now)];
        values.extend(held.iter().map(|id| Value::from(*id)));
        tx.exec(
            &format!(
                "UPDATE tickler_jobs
                 SET status = 'succeeded', finished_at = ?, lease_expires_at = NULL,
                     last_error = NULL
                 WHERE id IN ({}) AND status = 'running'",
                marks(held.len())
            ),
            values,
        )?;
    }
    let mut done: HashMap<i64, &String> = running
        .iter()
        .filter(|(id, _)| held.binary_search(id).is_ok())
        .map(|(id, token)| (*id, token))
        .collect();
    let mut recorded = Vec::with_capacity(leases.len());
    for lease in leases {
        // A lease given twice completes once, as with two COMPLETE_SQL.
        if done.get(&lease.job_id.0) == Some(&&lease.run_token.0) {
            done.remove(&lease.job_id.0);
            recorded.push(Ok(()));
        } else {
            recorded.push(tx.after_refused(lease, attempt)?);
        }
    }
    Ok(recorded)
}

/// Completing a job inside the application's own MySQL transaction.
impl Store {
    /// See [`crate::Queue::complete_with`]. Tried again within the retry
    /// window only while `app_writes` has not run: a deadlock or lock wait
    /// on the job's row, or a connection lost before it; once the
    /// application's writes ran, any error is the caller's.
    pub(crate) fn complete_with(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(&mut mysql::Transaction<'_>) -> Result<()>,
    ) -> Result<()> {
        RETRIES.run_until_handed(self.retry_window, |handed| {
            self.complete_with_once(lease, app_writes, handed)
        })
    }

    fn complete_with_once(
        &self,
        lease: &Lease,
        app_writes: &mut dyn FnMut(&mut mysql::Transaction<'_>) -> Result<()>,
        handed: &mut bool,
    ) -> Result<()> {
        let mut pooled = self.pooled()?;
        let result = (|| {
            let mut app = pooled.conn.start_transaction(mysql::TxOpts::default())?;
            // The fenced completion first: the job's row is locked before
            // any row of the application's, the order of tickler's other
            // transactions, and a lost lease is known before the
            // application's writes run.
            let changed = Tx::inside(&mut app).exec_named(
                COMPLETE_SQL,
                &[
                    ("now", v(self.now_ms())),
                    ("id", v(lease.job_id.0)),
                    ("token", v(lease.run_token.0.as_str())),
                ],
            )?;
            if changed != 1 {
                return Err(Error::LeaseLost {
                    job_id: lease.job_id,
                });
            }
            *handed = true;
            let released =
                super::deps::resolve(&mut Tx::inside(&mut app), &[lease.job_id], self.now_ms())?;
            // An error here drops `app`, which rolls the completion back.
            app_writes(&mut app)?;
            // The freed slot is handed on last: the limit's lock is not
            // held while the application's writes run.
            if let Some(slot) = &lease.limit {
                super::limits::settle(
                    &mut Tx::inside(&mut app),
                    &[slot],
                    Vec::new(),
                    self.now_ms(),
                )?;
            }
            app.commit()?;
            Ok(!released.is_empty())
        })();
        if let Err(e) = &result {
            pooled.mark_broken_by(e);
        }
        pooled.restore_session();
        // Jobs that ran after this one are due now: this process's pools
        // look at once, not at their next poll.
        if result? {
            self.notify_watchers();
        }
        Ok(())
    }
}
