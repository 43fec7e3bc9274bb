//! Concurrency limits on MySQL/MariaDB: the stored limits, and the
//! [`LimitTx`] the rules of `crate::queue::limits` run on. As on
//! PostgreSQL, a transaction that claims or frees slots of a limit first
//! locks the limit's row (`FOR UPDATE`, by primary key in name order, in
//! the lock order of [`LimitTx`]): the transactions of one limit take
//! turns there, and under READ COMMITTED each reads the holders after the
//! previous one committed.

use super::connection::{args, marks, Tx};
use super::outcome::DEAD_SQL;
use super::rows::{get, job_from_row, JOB_COLUMNS};
use super::Store;
use crate::clock::ms_to_datetime;
use crate::engine::{LimitStore, LimitTx};
use crate::error::Result;
use crate::job::JobId;
use crate::lease::Lease;
use crate::limit::{Limit, LimitInfo, LimitKeyUsage, Rate};
use crate::queue::limits::{self, Blocked, RateState};
use mysql::prelude::Queryable;
use mysql::Value;
use std::collections::{HashMap, HashSet};

/// The weight of the lease holders of one key (name, key, now), as on
/// SQLite: running jobs and rows that keep a lease; one term per state,
/// each a range of the limit index.
const HELD_KEY_SQL: &str = "SELECT CAST(
      (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'running' AND limit_key = :key)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'cancelled' AND limit_key = :key
         AND lease_expires_at >= :now)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'dead' AND limit_key = :key
         AND lease_expires_at >= :now)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'scheduled' AND limit_key = :key
         AND lease_expires_at >= :now) AS SIGNED)";

/// HELD_KEY_SQL over all keys of a limit (name, now).
const HELD_TOTAL_SQL: &str = "SELECT CAST(
      (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'running')
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'cancelled' AND lease_expires_at >= :now)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'dead' AND lease_expires_at >= :now)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
       WHERE limit_name = :name AND status = 'scheduled' AND lease_expires_at >= :now)
     AS SIGNED)";

/// A claimed run pushed back for want of a slot (id, run_token): as
/// before its claim, blocked.
const BLOCK_SQL: &str = "UPDATE tickler_jobs
    SET status = 'blocked', attempts = attempts - 1, run_token = NULL,
        lease_expires_at = NULL, claimed_by = NULL, claimed_at = NULL, holder_id = NULL,
        started_at = NULL, claim_id = NULL
    WHERE id = ? AND run_token = ? AND status = 'running'";

/// Runs deferred per statement: three CASE arms and an IN mark each.
const DEFER_CHUNK: usize = 200;

/// A limit's columns, as [`limit_row`] reads them after its name.
const LIMIT_COLUMNS: &str = "name, max_per_key, max_total, rate_count, rate_period_ms, rate_burst";

/// A limit from a row of [`LIMIT_COLUMNS`].
fn limit_row(r: &mysql::Row) -> Result<Limit> {
    let rate = match (get::<Option<i64>>(r, 3)?, get::<Option<i64>>(r, 4)?) {
        (Some(count), Some(period_ms)) => Some(Rate {
            count: stored_count(count),
            period: std::time::Duration::from_millis(period_ms.max(1) as u64),
            burst: u32::try_from(get::<i64>(r, 5)?.max(0)).unwrap_or(u32::MAX),
        }),
        _ => None,
    };
    Ok(Limit {
        max_per_key: get::<Option<i64>>(r, 1)?.map(stored_count),
        max_total: get::<Option<i64>>(r, 2)?.map(stored_count),
        rate,
    })
}

/// The [`LimitTx`] of a transaction (tickler's, or the application's in
/// `complete_with`).
pub(crate) struct InTransaction<'a, 'b, Q: Queryable>(pub(crate) &'a mut Tx<'b, Q>);

impl<Q: Queryable> LimitTx for InTransaction<'_, '_, Q> {
    fn lock_limits(&mut self, names: &[String]) -> Result<HashMap<String, Limit>> {
        if names.is_empty() {
            return Ok(HashMap::new());
        }
        // Locked as the primary key is read, in name order.
        let rows = self.0.rows(
            &format!(
                "SELECT {LIMIT_COLUMNS} FROM tickler_limits
                 WHERE name IN ({}) ORDER BY name FOR UPDATE",
                marks(names.len())
            ),
            names.iter().map(|n| Value::from(n.as_str())).collect(),
        )?;
        rows.iter()
            .map(|r| Ok((get::<String>(r, 0)?, limit_row(r)?)))
            .collect()
    }

    fn held(&mut self, name: &str, key: Option<&str>, now: i64) -> Result<i64> {
        let rows = match key {
            Some(key) => self.0.rows_named(
                HELD_KEY_SQL,
                &[
                    ("name", Value::from(name)),
                    ("key", Value::from(key)),
                    ("now", Value::from(now)),
                ],
            )?,
            None => self.0.rows_named(
                HELD_TOTAL_SQL,
                &[("name", Value::from(name)), ("now", Value::from(now))],
            )?,
        };
        rows.first().map_or(Ok(0), |r| get(r, 0))
    }

    fn block(&mut self, leases: &[&Lease]) -> Result<()> {
        for lease in leases {
            self.0
                .exec(BLOCK_SQL, args![lease.job_id.0, lease.run_token.0.as_str()])?;
        }
        Ok(())
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        self.0.exec_named(
            DEAD_SQL,
            &[
                ("now", Value::from(now)),
                ("error", Value::from(error)),
                ("id", Value::from(job_id.0)),
                ("token", Value::from(run_token)),
            ],
        )?;
        super::deps::resolve(self.0, &[job_id], now)?;
        Ok(())
    }

    fn pending(&mut self, name: &str, key: Option<&str>) -> Result<i64> {
        let rows = match key {
            Some(key) => self.0.rows(
                "SELECT CAST(coalesce(sum(limit_weight), 0) AS SIGNED) FROM tickler_jobs
                     FORCE INDEX (tickler_jobs_limit)
                 WHERE limit_name = ? AND status = 'pending' AND limit_key = ?
                   AND queue NOT IN (SELECT queue FROM tickler_paused_queues)",
                args![name, key],
            )?,
            None => self.0.rows(
                "SELECT CAST(coalesce(sum(limit_weight), 0) AS SIGNED) FROM tickler_jobs
                     FORCE INDEX (tickler_jobs_limit)
                 WHERE limit_name = ? AND status = 'pending'
                   AND queue NOT IN (SELECT queue FROM tickler_paused_queues)",
                args![name],
            )?,
        };
        rows.first().map_or(Ok(0), |r| get(r, 0))
    }

    fn doom(&mut self, job_id: JobId, error: &str, now: i64) -> Result<()> {
        self.0.exec(
            "UPDATE tickler_jobs SET status = 'dead', finished_at = ?, last_error = ?
             WHERE id = ? AND status = 'blocked'",
            args![now, error, job_id.0],
        )?;
        super::deps::resolve(self.0, &[job_id], now)?;
        Ok(())
    }

    fn blocked(&mut self, name: &str, key: &str, n: i64) -> Result<Vec<Blocked>> {
        // The index's range is one key's exactly: the locking scan stops at
        // its end without a lock past it (READ COMMITTED takes no gap).
        let rows = self.0.rows(
            "SELECT id, limit_weight, kind, queue FROM tickler_jobs
                 FORCE INDEX (tickler_jobs_blocked)
             WHERE status = 'blocked' AND limit_name = ? AND limit_key = ?
               AND queue NOT IN (SELECT queue FROM tickler_paused_queues)
             ORDER BY priority DESC, run_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
            args![name, key, n],
        )?;
        rows.iter()
            .map(|r| {
                // Names for an event: a byte that is not UTF-8 costs no
                // release.
                let name = |i| -> Result<String> {
                    Ok(String::from_utf8_lossy(&get::<Vec<u8>>(r, i)?).into_owned())
                };
                Ok(Blocked {
                    id: JobId(get(r, 0)?),
                    weight: get::<i64>(r, 1)?,
                    kind: name(2)?,
                    queue: name(3)?,
                })
            })
            .collect()
    }

    fn unblock(&mut self, ids: &[JobId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.0.exec(
            &format!(
                "UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET status = 'pending'
                 WHERE id IN ({}) AND status = 'blocked'",
                marks(ids.len())
            ),
            ids.iter().map(|id| Value::from(id.0)).collect(),
        )?;
        Ok(())
    }

    fn rate_state(&mut self, name: &str, key: &str) -> Result<Option<RateState>> {
        let row = self.0.first(
            "SELECT tat, horizon, seen FROM tickler_limit_rates WHERE name = ? AND `key` = ?",
            args![name, key],
        )?;
        row.map(|r| {
            Ok(RateState {
                tat: get(&r, 0)?,
                horizon: get(&r, 1)?,
                seen: get(&r, 2)?,
            })
        })
        .transpose()
    }

    fn store_rate_state(&mut self, name: &str, key: &str, state: &RateState) -> Result<()> {
        self.0.exec(
            "INSERT INTO tickler_limit_rates (name, `key`, tat, horizon, seen)
             VALUES (?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE tat = VALUES(tat), horizon = VALUES(horizon),
                 seen = VALUES(seen)",
            args![name, key, state.tat, state.horizon, state.seen],
        )?;
        Ok(())
    }

    fn deferred_runs(&mut self, ids: &[JobId]) -> Result<HashSet<JobId>> {
        let rows = self.0.rows(
            &format!(
                "SELECT id FROM tickler_jobs FORCE INDEX (PRIMARY)
                 WHERE id IN ({}) AND rate_slot = run_at",
                marks(ids.len())
            ),
            ids.iter().map(|id| Value::from(id.0)).collect(),
        )?;
        rows.iter().map(|r| Ok(JobId(get(r, 0)?))).collect()
    }

    fn defer(&mut self, runs: &[(&Lease, i64)]) -> Result<()> {
        // One statement per chunk: a claim may defer hundreds of runs, and
        // a round trip each would hold the limit's lock that much longer.
        for chunk in runs.chunks(DEFER_CHUNK) {
            let when = vec!["WHEN ? THEN ?"; chunk.len()].join(" ");
            let sql = format!(
                "UPDATE tickler_jobs FORCE INDEX (PRIMARY)
                 SET status = 'scheduled', run_at = CASE id {when} END,
                     rate_slot = CASE id {when} END, rate_deferrals = rate_deferrals + 1,
                     attempts = attempts - 1, run_token = NULL, lease_expires_at = NULL,
                     claimed_by = NULL, claimed_at = NULL, holder_id = NULL,
                     started_at = NULL, claim_id = NULL
                 WHERE id IN ({}) AND run_token = CASE id {when} END
                   AND status = 'running'",
                marks(chunk.len())
            );
            let at: Vec<Value> = chunk
                .iter()
                .flat_map(|(l, at)| [Value::from(l.job_id.0), Value::from(*at)])
                .collect();
            let mut values = at.clone();
            values.extend(at);
            values.extend(chunk.iter().map(|(l, _)| Value::from(l.job_id.0)));
            values.extend(
                chunk.iter().flat_map(|(l, _)| {
                    [Value::from(l.job_id.0), Value::from(l.run_token.0.as_str())]
                }),
            );
            self.0.exec(&sql, values)?;
        }
        Ok(())
    }

    fn shift_deferred(&mut self, name: &str, key: &str, by: i64) -> Result<()> {
        update_free(
            self.0,
            "tickler_jobs_limit",
            "limit_name = ? AND status = 'scheduled' AND limit_key = ? AND rate_slot = run_at",
            args![name, key],
            "run_at = run_at + ?, rate_slot = rate_slot + ?",
            args![by, by],
        )
    }

    fn rates_seen_after(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>> {
        let rows = self.0.rows(
            "SELECT name, `key` FROM tickler_limit_rates WHERE seen > ?
             ORDER BY seen DESC LIMIT ?",
            args![at, n],
        )?;
        rows.iter().map(|r| Ok((get(r, 0)?, get(r, 1)?))).collect()
    }

    fn last_deferred(&mut self, name: &str, key: &str) -> Result<Option<i64>> {
        let row = self.0.first(
            "SELECT max(rate_slot) FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
             WHERE limit_name = ? AND status = 'scheduled' AND limit_key = ?
               AND rate_slot = run_at",
            args![name, key],
        )?;
        Ok(match row {
            Some(r) => get::<Option<i64>>(&r, 0)?,
            None => None,
        })
    }

    fn reline_deferred(&mut self, name: &str, at: i64, rated: bool) -> Result<()> {
        update_free(
            self.0,
            "tickler_jobs_limit",
            "limit_name = ? AND status = 'scheduled' AND rate_slot = run_at",
            args![name],
            "run_at = ?, rate_slot = CASE WHEN ? THEN ? END",
            args![at, rated, at],
        )
    }

    fn reset_rates(&mut self, name: &str, shift: Option<i64>) -> Result<()> {
        match shift {
            Some(shift) => self.0.exec(
                "UPDATE tickler_limit_rates SET tat = tat + ?, horizon = ? WHERE name = ?",
                args![shift, limits::NEVER, name],
            )?,
            None => self.0.exec(
                "DELETE FROM tickler_limit_rates WHERE name = ?",
                args![name],
            )?,
        };
        Ok(())
    }

    fn lock_run(&mut self, job_id: JobId, run_token: &str) -> Result<()> {
        self.0.rows(
            "SELECT id FROM tickler_jobs
             WHERE id = ? AND run_token = ? AND status = 'running' FOR UPDATE",
            args![job_id.0, run_token],
        )?;
        Ok(())
    }

    fn mark_deferred(&mut self, job_id: JobId, run_token: &str, at: i64) -> Result<()> {
        self.0.exec(
            "UPDATE tickler_jobs SET rate_slot = ?, rate_deferrals = rate_deferrals + 1
             WHERE id = ? AND run_token = ? AND status = 'running'",
            args![at, job_id.0, run_token],
        )?;
        Ok(())
    }

    fn rates_seen_before(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>> {
        let rows = self.0.rows(
            "SELECT name, `key` FROM tickler_limit_rates WHERE seen < ? ORDER BY seen LIMIT ?",
            args![at, n],
        )?;
        rows.iter().map(|r| Ok((get(r, 0)?, get(r, 1)?))).collect()
    }

    fn forget_rate(&mut self, name: &str, key: &str) -> Result<()> {
        self.0.exec(
            "DELETE FROM tickler_limit_rates WHERE name = ? AND `key` = ?",
            args![name, key],
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
        // jobs is stepped over, not read. Written without a row
        // comparison, which not every server reads as a range.
        let mut keys = Vec::new();
        // By default before every key: no limit's name is empty.
        let mut from = after.cloned().unwrap_or_default();
        while (keys.len() as i64) < n {
            let row = match only {
                None => self.0.first(
                    "SELECT limit_name, limit_key FROM tickler_jobs
                         FORCE INDEX (tickler_jobs_blocked)
                     WHERE status = 'blocked'
                       AND (limit_name > ? OR (limit_name = ? AND limit_key > ?))
                     ORDER BY limit_name, limit_key LIMIT 1",
                    args![from.0.as_str(), from.0.as_str(), from.1.as_str()],
                )?,
                // Within the name: after the last key seen, or from its
                // first (which may be the empty key).
                Some(name) if from.0.as_str() == name => self.0.first(
                    "SELECT limit_name, limit_key FROM tickler_jobs
                         FORCE INDEX (tickler_jobs_blocked)
                     WHERE status = 'blocked' AND limit_name = ? AND limit_key > ?
                     ORDER BY limit_key LIMIT 1",
                    args![name, from.1.as_str()],
                )?,
                Some(name) => self.0.first(
                    "SELECT limit_name, limit_key FROM tickler_jobs
                         FORCE INDEX (tickler_jobs_blocked)
                     WHERE status = 'blocked' AND limit_name = ?
                     ORDER BY limit_key LIMIT 1",
                    args![name],
                )?,
            };
            let Some(row) = row else {
                break;
            };
            let key: (String, String) = (
                get(&row, 0)?,
                get::<Option<String>>(&row, 1)?.unwrap_or_default(),
            );
            from = key.clone();
            keys.push(key);
        }
        Ok(keys)
    }
}

/// Jobs [`update_free`] writes per statement.
const FREE_CHUNK: usize = 500;

/// Sets `set` (its markers take `set_values`) on the jobs that match
/// `condition` (its markers take `values`), passing over those another
/// transaction holds (the lock order of `LimitTx`): found by a plain read
/// through `index`, a chunk at a time in id order, then locked and written
/// by primary key. A locking scan of the index would wait for rows others
/// hold, and it locks index entries before rows, the other way round from
/// the claim's writes by primary key.
fn update_free<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    index: &str,
    condition: &str,
    values: Vec<Value>,
    set: &str,
    set_values: Vec<Value>,
) -> Result<()> {
    let mut after = i64::MIN;
    loop {
        let mut found_values = values.clone();
        found_values.extend(args![after, FREE_CHUNK as i64]);
        let found = tx
            .rows(
                &format!(
                    "SELECT id FROM tickler_jobs FORCE INDEX ({index})
                     WHERE {condition} AND id > ? ORDER BY id LIMIT ?"
                ),
                found_values,
            )?
            .iter()
            .map(|r| get::<i64>(r, 0))
            .collect::<Result<Vec<i64>>>()?;
        let Some(&last) = found.last() else {
            return Ok(());
        };
        let mut lock_values: Vec<Value> = found.iter().map(|id| Value::from(*id)).collect();
        lock_values.extend(values.iter().cloned());
        let locked = tx
            .rows(
                &format!(
                    "SELECT id FROM tickler_jobs FORCE INDEX (PRIMARY)
                     WHERE id IN ({}) AND {condition} FOR UPDATE SKIP LOCKED",
                    marks(found.len())
                ),
                lock_values,
            )?
            .iter()
            .map(|r| get::<i64>(r, 0).map(Value::from))
            .collect::<Result<Vec<Value>>>()?;
        if !locked.is_empty() {
            let n = locked.len();
            let mut update_values = set_values.clone();
            update_values.extend(locked);
            tx.exec(
                &format!(
                    "UPDATE tickler_jobs FORCE INDEX (PRIMARY) SET {set} WHERE id IN ({})",
                    marks(n)
                ),
                update_values,
            )?;
        }
        if found.len() < FREE_CHUNK {
            return Ok(());
        }
        after = last;
    }
}

/// A count stored as at least 1 (the schema's CHECK), as a `u32`.
fn stored_count(n: i64) -> u32 {
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

impl LimitStore for Store {
    fn set_limit(&self, name: &str, limit: &Limit) -> Result<()> {
        super::enqueue::check_name("limit name", name)?;
        self.write(|tx, _| {
            let now = self.now_ms();
            let old = InTransaction(tx)
                .lock_limits(&[name.to_owned()])?
                .remove(name);
            let (count, period_ms, burst) = limits::rate_columns(limit);
            tx.exec(
                "INSERT INTO tickler_limits (name, max_per_key, max_total, rate_count,
                     rate_period_ms, rate_burst, updated_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?)
                 ON DUPLICATE KEY UPDATE max_per_key = VALUES(max_per_key),
                     max_total = VALUES(max_total), rate_count = VALUES(rate_count),
                     rate_period_ms = VALUES(rate_period_ms), rate_burst = VALUES(rate_burst),
                     updated_at = VALUES(updated_at)",
                args![
                    name,
                    limit.max_per_key,
                    limit.max_total,
                    count,
                    period_ms,
                    burst,
                    now
                ],
            )?;
            let limits = &mut InTransaction(tx);
            limits.lock_limits(&[name.to_owned()])?;
            limits::limit_set(limits, name, old.as_ref(), Some(limit), now)
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn delete_limit(&self, name: &str) -> Result<bool> {
        super::enqueue::check_name("limit name", name)?;
        let deleted = self.write(|tx, _| {
            let deleted = tx.exec("DELETE FROM tickler_limits WHERE name = ?", args![name])?;
            let limits = &mut InTransaction(tx);
            limits.reline_deferred(name, self.now_ms(), false)?;
            limits.reset_rates(name, None)?;
            // Nothing limits its jobs any more: every blocked one may run.
            // Those another transaction holds are left to the reaper's
            // sweep (see the lock order of `LimitTx`).
            update_free(
                tx,
                "tickler_jobs_blocked",
                "status = 'blocked' AND limit_name = ?",
                args![name],
                "status = 'pending'",
                Vec::new(),
            )?;
            Ok(deleted > 0)
        })?;
        self.notify_watchers();
        Ok(deleted)
    }

    fn limits(&self) -> Result<Vec<LimitInfo>> {
        self.read(|tx| {
            tx.rows(
                &format!("SELECT {LIMIT_COLUMNS}, updated_at FROM tickler_limits ORDER BY name"),
                Vec::new(),
            )?
            .iter()
            .map(|r| {
                Ok(LimitInfo {
                    name: get(r, 0)?,
                    limit: limit_row(r)?,
                    updated_at: ms_to_datetime(get(r, 6)?),
                })
            })
            .collect()
        })
    }

    fn limit_usage(&self, name: Option<&str>) -> Result<Vec<LimitKeyUsage>> {
        let now = self.now_ms();
        self.read(|tx| {
            tx.rows_named(
                "SELECT limit_name, coalesce(limit_key, ''),
                     CAST(sum(CASE WHEN status = 'running' OR lease_expires_at >= :now
                              THEN limit_weight ELSE 0 END) AS SIGNED),
                     CAST(sum(CASE WHEN status = 'running' OR lease_expires_at >= :now
                              THEN 1 ELSE 0 END) AS SIGNED),
                     CAST(sum(status = 'blocked') AS SIGNED),
                     CAST(sum(status = 'pending') AS SIGNED),
                     CAST(sum(CASE WHEN status = 'scheduled' AND rate_slot = run_at THEN 1 ELSE 0 END)
                          AS SIGNED)
                 FROM tickler_jobs
                 WHERE limit_name IS NOT NULL AND (:name IS NULL OR limit_name = :name)
                   AND (status IN ('pending', 'blocked', 'running')
                        OR (status IN ('scheduled', 'cancelled', 'dead')
                            AND lease_expires_at >= :now)
                        OR (status = 'scheduled' AND rate_slot = run_at))
                 GROUP BY limit_name, limit_key
                 ORDER BY limit_name, limit_key",
                &[("name", Value::from(name)), ("now", Value::from(now))],
            )?
            .iter()
            .map(|r| {
                Ok(LimitKeyUsage {
                    name: get(r, 0)?,
                    key: get(r, 1)?,
                    held: get::<i64>(r, 2)?.max(0) as u64,
                    holders: get::<i64>(r, 3)?.max(0) as u64,
                    blocked: get::<i64>(r, 4)?.max(0) as u64,
                    pending: get::<i64>(r, 5)?.max(0) as u64,
                    deferred: get::<i64>(r, 6)?.max(0) as u64,
                })
            })
            .collect()
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
        super::enqueue::check_name("limit name", name)?;
        self.write(|tx, _| {
            limits::hold_rate(&mut InTransaction(tx), name, key, until, run, self.now_ms())
        })
    }

    fn limit_held(&self, name: &str) -> Result<Vec<(String, u64)>> {
        let now = self.now_ms();
        self.read(|tx| {
            tx.rows_named(
                "SELECT coalesce(limit_key, ''), CAST(sum(limit_weight) AS SIGNED)
                 FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
                 WHERE limit_name = :name
                   AND status IN ('running', 'scheduled', 'cancelled', 'dead')
                   AND (status = 'running' OR lease_expires_at >= :now)
                 GROUP BY limit_key ORDER BY limit_key",
                &[("name", Value::from(name)), ("now", Value::from(now))],
            )?
            .iter()
            .map(|r| Ok((get::<String>(r, 0)?, get::<i64>(r, 1)?.max(0) as u64)))
            .collect()
        })
    }

    fn limit_holders(&self, name: &str, key: &str, n: i64) -> Result<Vec<crate::Job>> {
        let now = self.now_ms();
        self.read(|tx| {
            tx.rows(
                &format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs FORCE INDEX (tickler_jobs_limit)
                     WHERE limit_name = ? AND limit_key = ?
                       AND status IN ('running', 'scheduled', 'cancelled', 'dead')
                       AND (status = 'running' OR lease_expires_at >= ?)
                     ORDER BY lease_expires_at, id LIMIT ?"
                ),
                args![name, key, now, n],
            )?
            .iter()
            .map(job_from_row)
            .collect()
        })
    }

    fn deferred_place(&self, id: JobId) -> Result<Option<u64>> {
        self.read(|tx| {
            let row = tx.first(
                "SELECT (SELECT count(*) FROM tickler_jobs AS ahead
                         WHERE ahead.limit_name = job.limit_name
                           AND ahead.status = 'scheduled'
                           AND ahead.limit_key = job.limit_key
                           AND ahead.rate_slot = ahead.run_at
                           AND (ahead.run_at < job.run_at
                                OR (ahead.run_at = job.run_at AND ahead.id <= job.id)))
                 FROM tickler_jobs AS job
                 WHERE job.id = ? AND job.status = 'scheduled'
                   AND job.rate_slot = job.run_at",
                args![id.0],
            )?;
            Ok(match row {
                Some(r) => Some(get::<i64>(&r, 0)?.max(1) as u64),
                None => None,
            })
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
            Ok(tx
                .first(
                    "SELECT 1 FROM tickler_limit_rates WHERE seen > ? OR seen < ? LIMIT 1",
                    args![now + limits::STEP_BACK_MS, now - limits::FORGET_MS],
                )?
                .is_some())
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
pub(crate) fn settle<Q: Queryable>(
    tx: &mut Tx<'_, Q>,
    freed: &[&crate::job::LimitSlot],
    claimed: Vec<Lease>,
    now: i64,
) -> Result<(Vec<Lease>, limits::Settled)> {
    limits::settle(&mut InTransaction(tx), freed, claimed, now)
}
