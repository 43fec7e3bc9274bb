//! Concurrency limits on SQLite: the stored limits, and the [`LimitTx`]
//! the rules of `crate::queue::limits` run on. A file has one writer at a
//! time, so the write transaction is the limits' lock: nothing more is
//! taken.

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
use rusqlite::{params, OptionalExtension};
use std::collections::{HashMap, HashSet};

/// The weight of the lease holders of one key (?1 name, ?2 key, ?3 now):
/// running jobs, and rows that keep the lease of a holder not yet stopped
/// (cancelled, dead past its timeout, or scheduled for a retry after it);
/// one term per state, each a range of the limit index.
const HELD_KEY_SQL: &str = "SELECT
      (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = ?1 AND status = 'running' AND limit_key = ?2)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = ?1 AND status = 'cancelled' AND limit_key = ?2
         AND lease_expires_at >= ?3)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = ?1 AND status = 'dead' AND limit_key = ?2
         AND lease_expires_at >= ?3)
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = ?1 AND status = 'scheduled' AND limit_key = ?2
         AND lease_expires_at >= ?3)";

/// HELD_KEY_SQL over all keys of a limit (?1 name, ?2 now).
const HELD_TOTAL_SQL: &str = "SELECT
      (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = ?1 AND status = 'running')
    + (SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
       WHERE limit_name = ?1 AND status IN ('scheduled', 'cancelled', 'dead')
         AND lease_expires_at >= ?2)";

/// Claimed runs pushed back for want of a slot: as before their claim,
/// blocked. ?1 a JSON object of `"id": "run_token"` members. One statement
/// for all of them: a single-row UPDATE that changes `status` builds the
/// ephemeral tables of the schema's `status IN (…)` lists anew each time
/// (see `complete_many`), and a claim may push back hundreds.
const BLOCK_SQL: &str = "UPDATE tickler_jobs
    SET status = 'blocked', attempts = attempts - 1, run_token = NULL,
        lease_expires_at = NULL, claimed_by = NULL, claimed_at = NULL, holder_id = NULL,
        started_at = NULL
    FROM (SELECT CAST(key AS INTEGER) AS id, value AS run_token FROM json_each(?1)) AS pushed
    WHERE tickler_jobs.id = pushed.id AND tickler_jobs.run_token = pushed.run_token
      AND tickler_jobs.status = 'running'";

/// A blocked job that can never fit its limit: dead, saying why. ?1 now,
/// ?2 error, ?3 id.
const DOOM_SQL: &str = "UPDATE tickler_jobs
    SET status = 'dead', finished_at = ?1, last_error = ?2
    WHERE id = ?3 AND status = 'blocked'";

/// A claimed run deferred over its rate (?1 the instant, ms; ?2 id; ?3
/// run_token): scheduled then, marked as deferred there, the claim's
/// attempt given back.
const DEFER_SQL: &str = "UPDATE tickler_jobs
    SET status = 'scheduled', run_at = ?1, rate_slot = ?1, rate_deferrals = rate_deferrals + 1,
        attempts = attempts - 1, run_token = NULL, lease_expires_at = NULL, claimed_by = NULL,
        claimed_at = NULL, holder_id = NULL, started_at = NULL
    WHERE id = ?2 AND run_token = ?3 AND status = 'running'";

/// A limit's columns, as [`limit_row`] reads them after its name.
const LIMIT_COLUMNS: &str = "name, max_per_key, max_total, rate_count, rate_period_ms, rate_burst";

/// A limit from a row of [`LIMIT_COLUMNS`].
fn limit_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Limit> {
    let rate = match (r.get::<_, Option<i64>>(3)?, r.get::<_, Option<i64>>(4)?) {
        (Some(count), Some(period_ms)) => Some(Rate {
            count: stored_count(count),
            period: std::time::Duration::from_millis(period_ms.max(1) as u64),
            burst: u32::try_from(r.get::<_, i64>(5)?.max(0)).unwrap_or(u32::MAX),
        }),
        _ => None,
    };
    Ok(Limit {
        max_per_key: r.get::<_, Option<i64>>(1)?.map(stored_count),
        max_total: r.get::<_, Option<i64>>(2)?.map(stored_count),
        rate,
    })
}

/// The [`LimitTx`] of a write transaction on the file.
pub(crate) struct InTransaction<'a, 'c>(pub(crate) &'a rusqlite::Transaction<'c>);

impl LimitTx for InTransaction<'_, '_> {
    fn lock_limits(&mut self, names: &[String]) -> Result<HashMap<String, Limit>> {
        let names = serde_json::to_string(names)?;
        let rows = self
            .0
            .prepare_cached(&format!(
                "SELECT {LIMIT_COLUMNS} FROM tickler_limits
                 WHERE name IN (SELECT value FROM json_each(?1))"
            ))?
            .query_map([names], |r| Ok((r.get::<_, String>(0)?, limit_row(r)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn held(&mut self, name: &str, key: Option<&str>, now: i64) -> Result<i64> {
        Ok(match key {
            Some(key) => self
                .0
                .prepare_cached(HELD_KEY_SQL)?
                .query_row(params![name, key, now], |r| r.get(0))?,
            None => self
                .0
                .prepare_cached(HELD_TOTAL_SQL)?
                .query_row(params![name, now], |r| r.get(0))?,
        })
    }

    fn block(&mut self, leases: &[&Lease]) -> Result<()> {
        let pushed: serde_json::Map<String, serde_json::Value> = leases
            .iter()
            .map(|l| (l.job_id.0.to_string(), l.run_token.0.clone().into()))
            .collect();
        self.0
            .prepare_cached(BLOCK_SQL)?
            .execute([serde_json::Value::Object(pushed).to_string()])?;
        Ok(())
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        self.0
            .prepare_cached(DEAD_SQL)?
            .execute(params![now, error, job_id.0, run_token])?;
        super::deps::resolve(self.0, &[job_id], now)?;
        Ok(())
    }

    fn pending(&mut self, name: &str, key: Option<&str>) -> Result<i64> {
        Ok(self
            .0
            .prepare_cached(
                "SELECT coalesce(sum(limit_weight), 0) FROM tickler_jobs
                 WHERE limit_name = ?1 AND status = 'pending'
                   AND (?2 IS NULL OR limit_key = ?2)
                   AND queue NOT IN (SELECT queue FROM tickler_paused_queues)",
            )?
            .query_row(params![name, key], |r| r.get(0))?)
    }

    fn doom(&mut self, job_id: JobId, error: &str, now: i64) -> Result<()> {
        self.0
            .prepare_cached(DOOM_SQL)?
            .execute(params![now, error, job_id.0])?;
        super::deps::resolve(self.0, &[job_id], now)?;
        Ok(())
    }

    fn blocked(&mut self, name: &str, key: &str, n: i64) -> Result<Vec<Blocked>> {
        let rows = self
            .0
            .prepare_cached(
                "SELECT id, limit_weight, kind, queue FROM tickler_jobs
                 WHERE status = 'blocked' AND limit_name = ?1 AND limit_key = ?2
                   AND queue NOT IN (SELECT queue FROM tickler_paused_queues)
                 ORDER BY priority DESC, run_at, id LIMIT +?3",
            )?
            .query_map(params![name, key, n], |r| {
                // Names for an event: a row that is not UTF-8 (written by
                // hand) costs no release.
                let name = |i| -> rusqlite::Result<String> {
                    Ok(match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                            String::from_utf8_lossy(t).into_owned()
                        }
                        _ => String::new(),
                    })
                };
                Ok(Blocked {
                    id: JobId(r.get(0)?),
                    weight: r.get::<_, i64>(1)?,
                    kind: name(2)?,
                    queue: name(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn unblock(&mut self, ids: &[JobId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids = serde_json::to_string(&ids.iter().map(|id| id.0).collect::<Vec<_>>())?;
        self.0
            .prepare_cached(
                "UPDATE tickler_jobs SET status = 'pending'
                 WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'blocked'",
            )?
            .execute([ids])?;
        Ok(())
    }

    fn rate_state(&mut self, name: &str, key: &str) -> Result<Option<RateState>> {
        Ok(self
            .0
            .prepare_cached(
                "SELECT tat, horizon, seen FROM tickler_limit_rates WHERE name = ?1 AND key = ?2",
            )?
            .query_row(params![name, key], |r| {
                Ok(RateState {
                    tat: r.get(0)?,
                    horizon: r.get(1)?,
                    seen: r.get(2)?,
                })
            })
            .optional()?)
    }

    fn store_rate_state(&mut self, name: &str, key: &str, state: &RateState) -> Result<()> {
        self.0
            .prepare_cached(
                "INSERT INTO tickler_limit_rates (name, key, tat, horizon, seen)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (name, key) DO UPDATE SET tat = excluded.tat,
                     horizon = excluded.horizon, seen = excluded.seen",
            )?
            .execute(params![name, key, state.tat, state.horizon, state.seen])?;
        Ok(())
    }

    fn deferred_runs(&mut self, ids: &[JobId]) -> Result<HashSet<JobId>> {
        let ids = serde_json::to_string(&ids.iter().map(|id| id.0).collect::<Vec<_>>())?;
        let rows = self
            .0
            .prepare_cached(
                "SELECT id FROM tickler_jobs
                 WHERE id IN (SELECT value FROM json_each(?1)) AND rate_slot = run_at",
            )?
            .query_map([ids], |r| Ok(JobId(r.get(0)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn defer(&mut self, runs: &[(&Lease, i64)]) -> Result<()> {
        let mut stmt = self.0.prepare_cached(DEFER_SQL)?;
        for (lease, at) in runs {
            stmt.execute(params![at, lease.job_id.0, lease.run_token.0])?;
        }
        Ok(())
    }

    fn shift_deferred(&mut self, name: &str, key: &str, by: i64) -> Result<()> {
        self.0
            .prepare_cached(
                "UPDATE tickler_jobs SET run_at = run_at + ?3, rate_slot = rate_slot + ?3
                 WHERE limit_name = ?1 AND status = 'scheduled' AND limit_key = ?2
                   AND rate_slot = run_at",
            )?
            .execute(params![name, key, by])?;
        Ok(())
    }

    fn rates_seen_after(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>> {
        let rows = self
            .0
            .prepare_cached(
                "SELECT name, key FROM tickler_limit_rates WHERE seen > ?1 ORDER BY seen DESC
                 LIMIT ?2",
            )?
            .query_map(params![at, n], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn last_deferred(&mut self, name: &str, key: &str) -> Result<Option<i64>> {
        Ok(self
            .0
            .prepare_cached(
                "SELECT max(rate_slot) FROM tickler_jobs
                 WHERE limit_name = ?1 AND status = 'scheduled' AND limit_key = ?2
                   AND rate_slot = run_at",
            )?
            .query_row(params![name, key], |r| r.get(0))?)
    }

    fn reline_deferred(&mut self, name: &str, at: i64, rated: bool) -> Result<()> {
        self.0
            .prepare_cached(
                "UPDATE tickler_jobs SET run_at = ?2, rate_slot = CASE WHEN ?3 THEN ?2 END
                 WHERE limit_name = ?1 AND status = 'scheduled' AND rate_slot = run_at",
            )?
            .execute(params![name, at, rated])?;
        Ok(())
    }

    fn reset_rates(&mut self, name: &str, shift: Option<i64>) -> Result<()> {
        match shift {
            Some(shift) => self
                .0
                .prepare_cached(
                    "UPDATE tickler_limit_rates SET tat = tat + ?2, horizon = ?3 WHERE name = ?1",
                )?
                .execute(params![name, shift, limits::NEVER])?,
            None => self
                .0
                .prepare_cached("DELETE FROM tickler_limit_rates WHERE name = ?1")?
                .execute([name])?,
        };
        Ok(())
    }

    fn lock_run(&mut self, _: JobId, _: &str) -> Result<()> {
        Ok(())
    }

    fn mark_deferred(&mut self, job_id: JobId, run_token: &str, at: i64) -> Result<()> {
        self.0
            .prepare_cached(
                "UPDATE tickler_jobs SET rate_slot = ?3, rate_deferrals = rate_deferrals + 1
                 WHERE id = ?1 AND run_token = ?2 AND status = 'running'",
            )?
            .execute(params![job_id.0, run_token, at])?;
        Ok(())
    }

    fn rates_seen_before(&mut self, at: i64, n: i64) -> Result<Vec<(String, String)>> {
        let rows = self
            .0
            .prepare_cached(
                "SELECT name, key FROM tickler_limit_rates WHERE seen < ?1 ORDER BY seen LIMIT ?2",
            )?
            .query_map(params![at, n], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn forget_rate(&mut self, name: &str, key: &str) -> Result<()> {
        self.0
            .prepare_cached("DELETE FROM tickler_limit_rates WHERE name = ?1 AND key = ?2")?
            .execute(params![name, key])?;
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
        let mut stmt = self.0.prepare_cached(
            "SELECT limit_name, limit_key FROM tickler_jobs INDEXED BY tickler_jobs_blocked
             WHERE limit_name IS NOT NULL AND status = 'blocked'
               AND (limit_name, limit_key) > (?1, ?2)
               AND (?3 IS NULL OR limit_name = ?3)
             ORDER BY limit_name, limit_key LIMIT 1",
        )?;
        let mut keys = Vec::new();
        // By default before every key: no limit's name is empty.
        let mut from = after.cloned().unwrap_or_default();
        while (keys.len() as i64) < n {
            let next: Option<(String, String)> = stmt
                .query_row(params![from.0, from.1, only], |r| {
                    Ok((
                        r.get(0)?,
                        r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                    ))
                })
                .optional()?;
            match next {
                Some(key) => {
                    from = key.clone();
                    keys.push(key);
                }
                None => break,
            }
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
        self.write(|tx| {
            let now = self.now_ms();
            let old = InTransaction(tx)
                .lock_limits(&[name.to_owned()])?
                .remove(name);
            let (count, period_ms, burst) = limits::rate_columns(limit);
            tx.prepare_cached(
                "INSERT INTO tickler_limits (name, max_per_key, max_total, rate_count,
                     rate_period_ms, rate_burst, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (name) DO UPDATE SET max_per_key = excluded.max_per_key,
                     max_total = excluded.max_total, rate_count = excluded.rate_count,
                     rate_period_ms = excluded.rate_period_ms, rate_burst = excluded.rate_burst,
                     updated_at = excluded.updated_at",
            )?
            .execute(params![
                name,
                limit.max_per_key,
                limit.max_total,
                count,
                period_ms,
                burst,
                now
            ])?;
            limits::limit_set(&mut InTransaction(tx), name, old.as_ref(), Some(limit), now)
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn delete_limit(&self, name: &str) -> Result<bool> {
        let deleted = self.write(|tx| {
            let deleted = tx
                .prepare_cached("DELETE FROM tickler_limits WHERE name = ?1")?
                .execute([name])?;
            let limits = &mut InTransaction(tx);
            limits.reline_deferred(name, self.now_ms(), false)?;
            limits.reset_rates(name, None)?;
            // Nothing limits its jobs any more: every blocked one may run.
            tx.prepare_cached(
                "UPDATE tickler_jobs SET status = 'pending'
                 WHERE status = 'blocked' AND limit_name = ?1",
            )?
            .execute([name])?;
            Ok(deleted > 0)
        })?;
        self.notify_watchers();
        Ok(deleted)
    }

    fn limits(&self) -> Result<Vec<LimitInfo>> {
        self.read(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {LIMIT_COLUMNS}, updated_at FROM tickler_limits ORDER BY name"
                ))?
                .query_map([], |r| {
                    Ok(LimitInfo {
                        name: r.get(0)?,
                        limit: limit_row(r)?,
                        updated_at: ms_to_datetime(r.get(6)?),
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })
    }

    fn limit_usage(&self, name: Option<&str>) -> Result<Vec<LimitKeyUsage>> {
        let now = self.now_ms();
        self.read(|conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT limit_name, coalesce(limit_key, ''),
                         sum(CASE WHEN status = 'running' OR lease_expires_at >= ?2
                                  THEN limit_weight ELSE 0 END),
                         sum(CASE WHEN status = 'running' OR lease_expires_at >= ?2
                                  THEN 1 ELSE 0 END),
                         sum(status = 'blocked'), sum(status = 'pending'),
                         sum(CASE WHEN status = 'scheduled' AND rate_slot = run_at THEN 1 ELSE 0 END)
                     FROM tickler_jobs INDEXED BY tickler_jobs_limit
                     WHERE limit_name IS NOT NULL AND (?1 IS NULL OR limit_name = ?1)
                       AND (status IN ('pending', 'blocked', 'running')
                            OR (status IN ('scheduled', 'cancelled', 'dead')
                                AND lease_expires_at >= ?2)
                            OR (status = 'scheduled' AND rate_slot = run_at))
                     GROUP BY limit_name, limit_key
                     ORDER BY limit_name, limit_key",
                )?
                .query_map(params![name, now], |r| {
                    Ok(LimitKeyUsage {
                        name: r.get(0)?,
                        key: r.get(1)?,
                        held: r.get::<_, i64>(2)?.max(0) as u64,
                        holders: r.get::<_, i64>(3)?.max(0) as u64,
                        blocked: r.get::<_, i64>(4)?.max(0) as u64,
                        pending: r.get::<_, i64>(5)?.max(0) as u64,
                        deferred: r.get::<_, i64>(6)?.max(0) as u64,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })
    }

    fn release_limit_keys(&self, keys: Vec<(String, String)>) -> Result<u64> {
        let released = self.write(|tx| {
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
        let swept = self.write(|tx| limits::sweep(&mut InTransaction(tx), after, self.now_ms()))?;
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
        self.write(|tx| {
            limits::hold_rate(&mut InTransaction(tx), name, key, until, run, self.now_ms())
        })
    }

    fn limit_held(&self, name: &str) -> Result<Vec<(String, u64)>> {
        let now = self.now_ms();
        self.read(|conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT coalesce(limit_key, ''), sum(limit_weight)
                     FROM tickler_jobs INDEXED BY tickler_jobs_limit
                     WHERE limit_name = ?1
                       AND status IN ('running', 'scheduled', 'cancelled', 'dead')
                       AND (status = 'running' OR lease_expires_at >= ?2)
                     GROUP BY limit_key ORDER BY limit_key",
                )?
                .query_map(params![name, now], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
                })?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })
    }

    fn limit_holders(&self, name: &str, key: &str, n: i64) -> Result<Vec<crate::Job>> {
        let now = self.now_ms();
        self.read(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs INDEXED BY tickler_jobs_limit
                     WHERE limit_name = ?1 AND limit_key = ?2
                       AND status IN ('running', 'scheduled', 'cancelled', 'dead')
                       AND (status = 'running' OR lease_expires_at >= ?3)
                     ORDER BY lease_expires_at, id LIMIT ?4"
                ))?
                .query_map(params![name, key, now, n], job_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
        })
    }

    fn deferred_place(&self, id: JobId) -> Result<Option<u64>> {
        self.read(|conn| {
            let place: Option<i64> = conn
                .prepare_cached(
                    "SELECT (SELECT count(*) FROM tickler_jobs AS ahead
                             WHERE ahead.limit_name = job.limit_name
                               AND ahead.status = 'scheduled'
                               AND ahead.limit_key = job.limit_key
                               AND ahead.rate_slot = ahead.run_at
                               AND (ahead.run_at < job.run_at
                                    OR (ahead.run_at = job.run_at AND ahead.id <= job.id)))
                     FROM tickler_jobs AS job
                     WHERE job.id = ?1 AND job.status = 'scheduled'
                       AND job.rate_slot = job.run_at",
                )?
                .query_row([id.0], |r| r.get(0))
                .optional()?;
            Ok(place.map(|n| n.max(1) as u64))
        })
    }

    fn reline_rate_key(&self, name: &str, key: &str) -> Result<()> {
        self.write(|tx| limits::reline_key(&mut InTransaction(tx), name, key, self.now_ms()))
    }

    fn upkeep_rates(&self) -> Result<u64> {
        // Read first: the reaper asks every pass, and nearly always there
        // is nothing to do (a write would take the file's lock).
        let now = self.now_ms();
        let due: bool = self.read(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM tickler_limit_rates WHERE seen > ?1)
                         OR EXISTS (SELECT 1 FROM tickler_limit_rates WHERE seen < ?2)",
                )?
                .query_row(
                    params![now + limits::STEP_BACK_MS, now - limits::FORGET_MS],
                    |r| r.get(0),
                )?)
        })?;
        if !due {
            return Ok(0);
        }
        let changed =
            self.write(|tx| limits::upkeep_rates(&mut InTransaction(tx), self.now_ms()))?;
        if changed > 0 {
            self.notify_watchers();
        }
        Ok(changed)
    }
}
