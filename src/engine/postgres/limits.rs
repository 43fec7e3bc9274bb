//! Concurrency limits on PostgreSQL: the stored limits, and the
//! [`LimitTx`] the rules of `crate::queue::limits` run on. A transaction
//! that claims or frees slots of a limit first locks the limit's row
//! (`FOR UPDATE`, in name order, in the lock order of [`LimitTx`]): the
//! transactions of one limit take turns there, and each counts the
//! holders after the previous one committed (READ COMMITTED: every
//! statement reads the latest commits).

use super::connection::Tx;
use super::outcome::DEAD_SQL;
use super::rows::{job_from_row, JOB_COLUMNS};
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::{LimitStore, LimitTx};
use crate::error::Result;
use crate::job::JobId;
use crate::lease::Lease;
use crate::limit::{Limit, LimitInfo, LimitKeyUsage, Rate};
use crate::queue::limits::{self, Blocked, RateState};
use postgres::types::ToSql;
use postgres::Row;
use std::collections::{HashMap, HashSet};

/// The weight of the lease holders of one key ($1 name, $2 key, $3 now),
/// as on SQLite: running jobs and rows that keep a lease; one term per
/// state, each a range of the limit index.
const HELD_KEY_SQL: &str = "SELECT (
      (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = $1 AND status = 'running' AND limit_key = $2)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = $1 AND status = 'cancelled' AND limit_key = $2
         AND lease_expires_at >= $3::bigint)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = $1 AND status = 'dead' AND limit_key = $2
         AND lease_expires_at >= $3::bigint)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = $1 AND status = 'scheduled' AND limit_key = $2
         AND lease_expires_at >= $3::bigint))::bigint";

/// HELD_KEY_SQL over all keys of a limit ($1 name, $2 now).
const HELD_TOTAL_SQL: &str = "SELECT (
      (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = $1 AND status = 'running')
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = $1 AND status IN ('scheduled', 'cancelled', 'dead')
         AND lease_expires_at >= $2::bigint))::bigint";

/// Claimed runs pushed back for want of a slot ($1 ids, $2 run_tokens):
/// as before their claim, blocked.
const BLOCK_SQL: &str = "UPDATE tickler_jobs AS job
    SET status = 'blocked', attempts = attempts - 1, run_token = NULL,
        lease_expires_at = NULL, claimed_by = NULL, claimed_at = NULL, holder_id = NULL,
        started_at = NULL, claim_id = NULL
    FROM unnest($1::bigint[], $2::text[]) AS pushed(id, run_token)
    WHERE job.id = pushed.id AND job.run_token = pushed.run_token AND job.status = 'running'";

/// Claimed runs deferred over their rate ($1 ids, $2 run_tokens, $3
/// instants in ms): scheduled then, marked as deferred there, the claim's
/// attempt given back.
const DEFER_SQL: &str = "UPDATE tickler_jobs AS job
    SET status = 'scheduled', run_at = deferred.at, rate_slot = deferred.at,
        rate_deferrals = rate_deferrals + 1, attempts = attempts - 1, run_token = NULL,
        lease_expires_at = NULL, claimed_by = NULL, claimed_at = NULL, holder_id = NULL,
        started_at = NULL, claim_id = NULL
    FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS deferred(id, run_token, at)
    WHERE job.id = deferred.id AND job.run_token = deferred.run_token
      AND job.status = 'running'";

/// A limit's columns, as [`limit_row`] reads them after its name.
const LIMIT_COLUMNS: &str = "name, max_per_key, max_total, rate_count, rate_period_ms, rate_burst";

/// A limit from a row of [`LIMIT_COLUMNS`].
fn limit_row(r: &Row) -> Limit {
    let rate = match (r.get::<_, Option<i64>>(3), r.get::<_, Option<i64>>(4)) {
        (Some(count), Some(period_ms)) => Some(Rate {
            count: stored_count(count),
            period: std::time::Duration::from_millis(period_ms.max(1) as u64),
            burst: u32::try_from(r.get::<_, i64>(5).max(0)).unwrap_or(u32::MAX),
        }),
        _ => None,
    };
    Limit {
        max_per_key: r.get::<_, Option<i64>>(1).map(stored_count),
        max_total: r.get::<_, Option<i64>>(2).map(stored_count),
        rate,
    }
}

/// What the limits' statements are sent on: tickler's own transaction, or
/// the application's (`complete_with`), where each statement goes unnamed
/// with its types, leaving nothing on a pooler's server connection.
pub(crate) trait Exec {
    fn rows(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>>;
}

impl Exec for Tx<'_> {
    fn rows(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        self.query(sql, params)
    }
}

impl Exec for postgres::Transaction<'_> {
    fn rows(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let types = super::pooler::parameter_types(sql, params)?;
        let typed: Vec<_> = params.iter().copied().zip(types).collect();
        Ok(self.query_typed(sql, &typed)?)
    }
}

/// The [`LimitTx`] of a transaction.
pub(crate) struct InTransaction<'a, E: Exec>(pub(crate) &'a mut E);

impl<E: Exec> LimitTx for InTransaction<'_, E> {
    fn lock_limits(&mut self, names: &[String]) -> Result<HashMap<String, Limit>> {
        // Locked as the rows come, in name order (byte order: "C").
        let rows = self.0.rows(
            &format!(
                "SELECT {LIMIT_COLUMNS} FROM tickler_limits
                 WHERE name = ANY($1) ORDER BY name FOR UPDATE"
            ),
            &[&names],
        )?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), limit_row(r)))
            .collect())
    }

    fn held(&mut self, name: &str, key: Option<&str>, now: i64) -> Result<i64> {
        let rows = match key {
            Some(key) => self.0.rows(HELD_KEY_SQL, &[&name, &key, &now])?,
            None => self.0.rows(HELD_TOTAL_SQL, &[&name, &now])?,
        };
        Ok(rows.first().map_or(0, |r| r.get(0)))
    }

    fn block(&mut self, leases: &[&Lease]) -> Result<()> {
        let ids: Vec<i64> = leases.iter().map(|l| l.job_id.0).collect();
        let tokens: Vec<&str> = leases.iter().map(|l| l.run_token.0.as_str()).collect();
        self.0.rows(BLOCK_SQL, &[&ids, &tokens])?;
        Ok(())
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        self.0
            .rows(DEAD_SQL, &[&now, &error, &job_id.0, &run_token])?;
        super::deps::resolve(self.0, &[job_id], now)?;
        Ok(())
    }

    fn pending(&mut self, name: &str, key: Option<&str>) -> Result<i64> {
        let rows = self.0.rows(
            "SELECT coalesce(sum(limit_weight), 0)::bigint FROM tickler_jobs
             WHERE limit_name = $1 AND status = 'pending'
               AND ($2::text IS NULL OR limit_key = $2)
               AND queue NOT IN (SELECT queue FROM tickler_paused_queues)",
            &[&name, &key],
        )?;
        Ok(rows.first().map_or(0, |r| r.get(0)))
    }

    fn doom(&mut self, job_id: JobId, error: &str, now: i64) -> Result<()> {
        self.0.rows(
            "UPDATE tickler_jobs SET status = 'dead', finished_at = $1::bigint, last_error = $2
             WHERE id = $3 AND status = 'blocked'",
            &[&now, &error, &job_id.0],
        )?;
        super::deps::resolve(self.0, &[job_id], now)?;
        Ok(())
    }

    fn blocked(&mut self, name: &str, key: &str, n: i64) -> Result<Vec<Blocked>> {
        let rows = self.0.rows(
            "SELECT id, limit_weight, kind, queue FROM tickler_jobs
             WHERE status = 'blocked' AND limit_name = $1 AND limit_key = $2
               AND queue NOT IN (SELECT queue FROM tickler_paused_queues)
             ORDER BY priority DESC, run_at, id LIMIT $3
             FOR UPDATE OF tickler_jobs SKIP LOCKED",
            &[&name, &key, &n],
        )?;
        Ok(rows
            .iter()
            .map(|r| Blocked {
                id: JobId(r.get(0)),
                weight: r.get::<_, i64>(1),
                kind: r.get(2),
                queue: r.get(3),
            })
            .collect())
    }

    fn unblock(&mut self, ids: &[JobId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = ids.iter().map(|id| id.0).collect();
        self.0.rows(
            "UPDATE tickler_jobs SET status = 'pending'
             WHERE id = ANY($1) AND status = 'blocked'",
            &[&ids],
        )?;
        Ok(())
    }

    fn rate_state(&mut self, name: &str, key: &str) -> Result<Option<RateState>> {
        let rows = self.0.rows(
            "SELECT tat, horizon, seen FROM tickler_limit_rates WHERE name = $1 AND key = $2",
            &[&name, &key],
        )?;
        Ok(rows.first().map(|r| RateState {
            tat: r.get(0),
            horizon: r.get(1),
            seen: r.get(2),
        }))
    }

    fn store_rate_state(&mut self, name: &str, key: &str, state: &RateState) -> Result<()> {
        self.0.rows(
            "INSERT INTO tickler_limit_rates (name, key, tat, horizon, seen)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name, key) DO UPDATE SET tat = excluded.tat,
                 horizon = excluded.horizon, seen = excluded.seen",
            &[&name, &key, &state.tat, &state.horizon, &state.seen],
        )?;
        Ok(())
    }

    fn deferred_runs(&mut self, ids: &[JobId]) -> Result<HashSet<JobId>> {
        let ids: Vec<i64> = ids.iter().map(|id| id.0).collect();
        let rows = self.0.rows(
            "SELECT id FROM tickler_jobs WHERE id = ANY($1) AND rate_slot = run_at",
            &[&ids],
        )?;
        Ok(rows.iter().map(|r| JobId(r.get(0))).collect())
    }

    fn defer(&mut self, runs: &[(&Lease, i64)]) -> Result<()> {
        let ids: Vec<i64> = runs.iter().map(|(l, _)| l.job_id.0).collect();
        let tokens: Vec<&str> = runs.iter().map(|(l, _)| l.run_token.0.as_str()).collect();
        let at: Vec<i64> = runs.iter().map(|(_, at)| *at).collect();
        self.0.rows(DEFER_SQL, &[&ids, &tokens, &at])?;
        Ok(())
    }

    fn shift_deferred(&mut self, name: &str, key: &str, by: i64) -> Result<()> {
        self.0.rows(
            "UPDATE tickler_jobs SET run_at = run_at + $3::bigint,
                 rate_slot = rate_slot + $3::bigint
             WHERE id = ANY(ARRAY(
                 SELECT id FROM tickler_jobs
                 WHERE limit_name = $1 AND status = 'scheduled' AND limit_key = $2
                   AND rate_slot = run_at
                 FOR UPDATE SKIP LOCKED))",
            &[&name, &key, &by],
        )?;
        Ok(())
    }

    fn rates_seen_after(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>> {
        let rows = self.0.rows(
            "SELECT name, key FROM tickler_limit_rates WHERE seen > $1::bigint
             ORDER BY seen DESC LIMIT $2",
            &[&at, &n],
        )?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn last_deferred(&mut self, name: &str, key: &str) -> Result<Option<i64>> {
        let rows = self.0.rows(
            "SELECT max(rate_slot) FROM tickler_jobs
             WHERE limit_name = $1 AND status = 'scheduled' AND limit_key = $2
               AND rate_slot = run_at",
            &[&name, &key],
        )?;
        Ok(rows.first().and_then(|r| r.get(0)))
    }

    fn reline_deferred(&mut self, name: &str, at: i64, rated: bool) -> Result<()> {
        self.0.rows(
            "UPDATE tickler_jobs
             SET run_at = $2::bigint, rate_slot = CASE WHEN $3 THEN $2::bigint END
             WHERE id = ANY(ARRAY(
                 SELECT id FROM tickler_jobs
                 WHERE limit_name = $1 AND status = 'scheduled' AND rate_slot = run_at
                 FOR UPDATE SKIP LOCKED))",
            &[&name, &at, &rated],
        )?;
        Ok(())
    }

    fn reset_rates(&mut self, name: &str, shift: Option<i64>) -> Result<()> {
        match shift {
            Some(shift) => self.0.rows(
                "UPDATE tickler_limit_rates SET tat = tat + $2::bigint, horizon = $3::bigint
                 WHERE name = $1",
                &[&name, &shift, &(limits::NEVER)],
            )?,
            None => self
                .0
                .rows("DELETE FROM tickler_limit_rates WHERE name = $1", &[&name])?,
        };
        Ok(())
    }

    fn lock_run(&mut self, job_id: JobId, run_token: &str) -> Result<()> {
        self.0.rows(
            "SELECT id FROM tickler_jobs
             WHERE id = $1 AND run_token = $2 AND status = 'running' FOR UPDATE",
            &[&job_id.0, &run_token],
        )?;
        Ok(())
    }

    fn mark_deferred(&mut self, job_id: JobId, run_token: &str, at: i64) -> Result<()> {
        self.0.rows(
            "UPDATE tickler_jobs SET rate_slot = $3::bigint, rate_deferrals = rate_deferrals + 1
             WHERE id = $1 AND run_token = $2 AND status = 'running'",
            &[&job_id.0, &run_token, &at],
        )?;
        Ok(())
    }

    fn rates_seen_before(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>> {
        let rows = self.0.rows(
            "SELECT name, key FROM tickler_limit_rates WHERE seen < $1::bigint
             ORDER BY seen LIMIT $2",
            &[&at, &n],
        )?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    fn forget_rate(&mut self, name: &str, key: &str) -> Result<()> {
        self.0.rows(
            "DELETE FROM tickler_limit_rates WHERE name = $1 AND key = $2",
            &[&name, &key],
        )?;
        Ok(())
    }

    fn blocked_keys(
        &mut self,
        after: Option<&(String, String)>,
        only: Option<&str>,
        n: i64,
    ) -> Result<Vec<(String, String)>> {
        // One seek of the blocked index per key: a key with many blocked
        // jobs is stepped over, not read.
        let mut keys = Vec::new();
        // By default before every key: no limit's name is empty.
        let mut from = after.cloned().unwrap_or_default();
        while (keys.len() as i64) < n {
            let rows = self.0.rows(
                "SELECT limit_name, limit_key FROM tickler_jobs
                 WHERE status = 'blocked' AND (limit_name, limit_key) > ($1, $2)
                   AND ($3::text IS NULL OR limit_name = $3)
                 ORDER BY limit_name, limit_key LIMIT 1",
                &[&from.0, &from.1, &only],
            )?;
            let Some(row) = rows.first() else {
                break;
            };
            let key: (String, String) = (
                row.get(0),
                row.get::<_, Option<String>>(1).unwrap_or_default(),
            );
            from = key.clone();
            keys.push(key);
        }
        Ok(keys)
    }
}

/// A count stored as at least 1 (the schema's CHECK), as a `u32`.
fn stored_count(n: i64) -> u32 {
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

impl LimitStore for Store {
    fn set_limit(&self, name: &str, limit: &Limit) -> Result<()> {
        super::enqueue::check_text("limit name", name)?;
        let per_key = limit.max_per_key.map(i64::from);
        let total = limit.max_total.map(i64::from);
        let (count, period_ms, burst) = limits::rate_columns(limit);
        self.write(|tx, _| {
            let now = self.now_ms();
            let old = InTransaction(tx)
                .lock_limits(&[name.to_owned()])?
                .remove(name);
            tx.execute(
                "INSERT INTO tickler_limits (name, max_per_key, max_total, rate_count,
                     rate_period_ms, rate_burst, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (name) DO UPDATE SET max_per_key = excluded.max_per_key,
                     max_total = excluded.max_total, rate_count = excluded.rate_count,
                     rate_period_ms = excluded.rate_period_ms, rate_burst = excluded.rate_burst,
                     updated_at = excluded.updated_at",
                &[&name, &per_key, &total, &count, &period_ms, &burst, &now],
            )?;
            // The row is this transaction's now: the releases below run
            // under its lock, as every claim's and release's do.
            let limits = &mut InTransaction(tx);
            limits.lock_limits(&[name.to_owned()])?;
            limits::limit_set(limits, name, old.as_ref(), Some(limit), now)
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn delete_limit(&self, name: &str) -> Result<bool> {
        super::enqueue::check_text("limit name", name)?;
        let deleted = self.write(|tx, _| {
            let deleted = tx.execute("DELETE FROM tickler_limits WHERE name = $1", &[&name])?;
            let limits = &mut InTransaction(tx);
            limits.reline_deferred(name, self.now_ms(), false)?;
            limits.reset_rates(name, None)?;
            // Nothing limits its jobs any more: every blocked one may run.
            // Those another transaction holds are left to the reaper's
            // sweep (see the lock order of `LimitTx`).
            tx.execute(
                "UPDATE tickler_jobs SET status = 'pending'
                 WHERE id = ANY(ARRAY(
                     SELECT id FROM tickler_jobs
                     WHERE status = 'blocked' AND limit_name = $1
                     FOR UPDATE SKIP LOCKED))",
                &[&name],
            )?;
            Ok(deleted > 0)
        })?;
        self.notify_watchers();
        Ok(deleted)
    }

    fn limits(&self) -> Result<Vec<LimitInfo>> {
        self.read(|tx| {
            Ok(tx
                .query(
                    &format!(
                        "SELECT {LIMIT_COLUMNS}, updated_at FROM tickler_limits ORDER BY name"
                    ),
                    &[],
                )?
                .iter()
                .map(|r| LimitInfo {
                    name: r.get(0),
                    limit: limit_row(r),
                    updated_at: ms_to_datetime(r.get(6)),
                })
                .collect())
        })
    }

    fn limit_usage(&self, name: Option<&str>) -> Result<Vec<LimitKeyUsage>> {
        let now = self.now_ms();
        self.read(|tx| {
            Ok(tx
                .query(
                    "SELECT limit_name, coalesce(limit_key, ''),
                         sum(CASE WHEN status = 'running' OR lease_expires_at >= $2::bigint
                                  THEN limit_weight ELSE 0 END)::bigint,
                         count(*) FILTER (WHERE status = 'running'
                                          OR lease_expires_at >= $2::bigint),
                         count(*) FILTER (WHERE status = 'blocked'),
                         count(*) FILTER (WHERE status = 'pending'),
                         count(*) FILTER (WHERE status = 'scheduled' AND rate_slot = run_at)
                     FROM tickler_jobs
                     WHERE limit_name IS NOT NULL AND ($1::text IS NULL OR limit_name = $1)
                       AND (status IN ('pending', 'blocked', 'running')
                            OR (status IN ('scheduled', 'cancelled', 'dead')
                                AND lease_expires_at >= $2::bigint)
                            OR (status = 'scheduled' AND rate_slot = run_at))
                     GROUP BY limit_name, limit_key
                     ORDER BY limit_name, limit_key",
                    &[&name, &now],
                )?
                .iter()
                .map(|r| LimitKeyUsage {
                    name: r.get(0),
                    key: r.get(1),
                    held: r.get::<_, i64>(2).max(0) as u64,
                    holders: r.get::<_, i64>(3).max(0) as u64,
                    blocked: r.get::<_, i64>(4).max(0) as u64,
                    pending: r.get::<_, i64>(5).max(0) as u64,
                    deferred: r.get::<_, i64>(6).max(0) as u64,
                })
                .collect())
        })
    }

    fn release_limit_keys(&self, keys: Vec<(String, String)>) -> Result<u64> {
        let released = self.write(|tx, _| {
            limits::release_keys(&mut InTransaction(tx), keys.clone(), self.now_ms())
        })?;
        if released > 0 {
            self.notify_watchers();
        }
        Ok(released)
    }

    fn sweep_limits(
        &self,
        after: Option<&(String, String)>,
    ) -> Result<(u64, Option<(String, String)>)> {
        let swept =
            self.write(|tx, _| limits::sweep(&mut InTransaction(tx), after, self.now_ms()))?;
        if swept.0 > 0 {
            self.notify_watchers();
        }
        Ok(swept)
    }

    fn hold_rate(
        &self,
        name: &str,
        key: &str,
        until: i64,
        run: Option<(JobId, &str)>,
    ) -> Result<bool> {
        super::enqueue::check_text("limit name", name)?;
        super::enqueue::check_text("limit key", key)?;
        self.write(|tx, _| {
            limits::hold_rate(&mut InTransaction(tx), name, key, until, run, self.now_ms())
        })
    }

    fn limit_held(&self, name: &str) -> Result<Vec<(String, u64)>> {
        let now = self.now_ms();
        self.read(|tx| {
            Ok(tx
                .query(
                    "SELECT coalesce(limit_key, ''), sum(limit_weight)::bigint
                     FROM tickler_jobs
                     WHERE limit_name = $1
                       AND status IN ('running', 'scheduled', 'cancelled', 'dead')
                       AND (status = 'running' OR lease_expires_at >= $2::bigint)
                     GROUP BY limit_key ORDER BY limit_key",
                    &[&name, &now],
                )?
                .iter()
                .map(|r| (r.get(0), r.get::<_, i64>(1).max(0) as u64))
                .collect())
        })
    }

    fn limit_holders(&self, name: &str, key: &str, n: i64) -> Result<Vec<crate::Job>> {
        let now = self.now_ms();
        self.read(|tx| {
            tx.query(
                &format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs
                     WHERE limit_name = $1 AND limit_key = $2
                       AND status IN ('running', 'scheduled', 'cancelled', 'dead')
                       AND (status = 'running' OR lease_expires_at >= $3::bigint)
                     ORDER BY lease_expires_at, id LIMIT $4"
                ),
                &[&name, &key, &now, &n],
            )?
            .iter()
            .map(job_from_row)
            .collect()
        })
    }

    fn deferred_place(&self, id: JobId) -> Result<Option<u64>> {
        self.read(|tx| {
            let rows = tx.query(
                "SELECT (SELECT count(*) FROM tickler_jobs AS ahead
                         WHERE ahead.limit_name = job.limit_name
                           AND ahead.status = 'scheduled'
                           AND ahead.limit_key = job.limit_key
                           AND ahead.rate_slot = ahead.run_at
                           AND (ahead.run_at < job.run_at
                                OR (ahead.run_at = job.run_at AND ahead.id <= job.id)))
                 FROM tickler_jobs AS job
                 WHERE job.id = $1 AND job.status = 'scheduled'
                   AND job.rate_slot = job.run_at",
                &[&id.0],
            )?;
            Ok(rows.first().map(|r| r.get::<_, i64>(0).max(1) as u64))
        })
    }

    fn reline_rate_key(&self, name: &str, key: &str) -> Result<()> {
        self.write(|tx, _| limits::reline_key(&mut InTransaction(tx), name, key, self.now_ms()))
    }

    fn upkeep_rates(&self) -> Result<u64> {
        // Read first: the reaper asks every pass, and nearly always there
        // is nothing to do.
        let now = self.now_ms();
        let due = self.read(|tx| {
            Ok(!tx
                .query(
                    "SELECT 1 FROM tickler_limit_rates
                     WHERE seen > $1::bigint OR seen < $2::bigint LIMIT 1",
                    &[&(now + limits::STEP_BACK_MS), &(now - limits::FORGET_MS)],
                )?
                .is_empty())
        })?;
        if !due {
            return Ok(0);
        }
        let changed =
            self.write(|tx, _| limits::upkeep_rates(&mut InTransaction(tx), self.now_ms()))?;
        if changed > 0 {
            self.notify_watchers();
        }
        Ok(changed)
    }
}

/// Hands the slots `freed` gave up (and checks `claimed`) in `tx`; see
/// [`limits::settle`].
pub(crate) fn settle<E: Exec>(
    tx: &mut E,
    freed: &[&crate::job::LimitSlot],
    claimed: Vec<Lease>,
    now: i64,
) -> Result<(Vec<Lease>, limits::Settled)> {
    limits::settle(&mut InTransaction(tx), freed, claimed, now)
}
