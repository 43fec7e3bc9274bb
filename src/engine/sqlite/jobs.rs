//! The jobs table on SQLite: the [`Engine`] operations.

use super::rows::*;
use super::sql::*;
use super::{Commit, Store};
use crate::clock::ms_to_datetime;
use crate::engine::types::*;
use crate::engine::{Claim, ClaimTx, Engine, FinishedSample, STATS_COUNTS_SQL};
use crate::error::{Error, Result};
use crate::job::{Job, JobId, JobState};
use crate::lease::Lease;
use chrono::{DateTime, Utc};
use rusqlite::{params, OptionalExtension};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A reaper look that got the write lock within this got it "without
/// waiting" (in-process writers are short; another connection's hold is
/// seen by the busy handler being called at all).
const REAP_CLEAN_WAIT: Duration = Duration::from_millis(2);

impl Engine for Store {
    fn enqueue(&self, rows: Vec<ValidJob>) -> Result<Vec<JobId>> {
        let ids = self.commit_grouped(rows, |tx, group| {
            let now = self.now_ms();
            group
                .iter()
                .map(|rows| insert_valid(tx, rows, now))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(ids)
    }

    fn next_due(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<Option<DateTime<Utc>>> {
        let kind_filter = kind_filter(kinds, 2);
        let now = self.now_ms();
        let now_mark = format!("?{}", kinds.map_or(0, <[&str]>::len) + 2);
        let earliest = self.read(|conn| {
            let mut earliest: Option<i64> = None;
            let paused = paused_in(conn)?;
            for queue in queues.iter().filter(|q| !paused.contains(**q)) {
                let mut values: Vec<&dyn rusqlite::ToSql> = vec![queue];
                if let Some(kinds) = kinds {
                    values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
                }
                values.push(&now);
                let unblocked = unblocked(&now_mark);
                // A pending job is due whatever its run_at: it was due when
                // it became pending, and a run_at ahead of now only means
                // the wall clock was stepped back since (waiting for it to
                // catch up could take hours). Pending jobs whose unique_key
                // waits for a cancelled holder to stop are left out: they
                // are due when it stops (a commit, which wakes fetchers) or
                // its lease runs out (below).
                let pending: bool = conn
                    .prepare_cached(&format!(
                        "SELECT EXISTS (SELECT 1 FROM tickler_jobs AS job
                         WHERE status = 'pending' AND queue = ?1 {kind_filter} AND {unblocked})"
                    ))?
                    .query_row(values.as_slice(), |r| r.get(0))?;
                if pending {
                    return Ok(Some(now));
                }
                let scheduled: Option<i64> = conn
                    .prepare_cached(&format!(
                        "SELECT run_at FROM tickler_jobs WHERE status = 'scheduled' AND queue = ?1
                         {kind_filter} ORDER BY run_at LIMIT 1"
                    ))?
                    .query_row(&values[..values.len() - 1], |r| r.get(0))
                    .optional()?;
                if let Some(at) = scheduled {
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
            }
            // When the first cancelled holder's lease runs out, a job
            // waiting for its unique_key may start (an over-estimate at
            // worst: one claim that finds nothing).
            let stopping: Option<i64> = conn
                .prepare_cached(
                    "SELECT min(lease_expires_at) + 1 FROM tickler_jobs
                     WHERE status IN ('cancelled', 'dead') AND lease_expires_at >= ?1
                       AND unique_key IS NOT NULL",
                )?
                .query_row([now], |r| r.get(0))?;
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
        self.write_with(Commit::Lazy, |tx| {
            let now = self.now_ms();
            let expires = now.saturating_add(extend_ms).min(MAX_TIMESTAMP_MS);
            // lease_ms: the length granted, for the reaper's backward-step rule.
            let mut stmt = tx.prepare_cached(concat!(
                "UPDATE tickler_jobs SET lease_expires_at = ?1, lease_ms = ?1 - ?4 ",
                fence!("?2", "?3")
            ))?;
            leases
                .iter()
                .map(|lease| {
                    let renewed = isolated(tx, || {
                        Ok(stmt.execute(params![
                            expires,
                            lease.job_id.0,
                            lease.run_token.0,
                            now
                        ])?)
                    })?;
                    Ok(renewed.and_then(|changed| {
                        fenced(changed, lease).map(|()| ms_to_datetime(expires))
                    }))
                })
                .collect()
        })
    }

    fn leases_held(&self, leases: &[&Lease]) -> Result<Vec<bool>> {
        let ids = serde_json::to_string(&leases.iter().map(|l| l.job_id.0).collect::<Vec<_>>())?;
        // One statement, so one read transaction, for all of them: a pool
        // asks this ten times a second while it works.
        let running: HashMap<i64, String> = self.read(|conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT id, run_token FROM tickler_jobs
                     WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'running'",
                )?
                .query_map([ids], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            Ok(rows)
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
        sync: OutcomeSync,
    ) -> Result<(Vec<Result<()>>, Vec<Lease>)> {
        let claim = match claim {
            Some(claim @ Claim { request: c, .. })
                if c.max > 0 && !c.kinds.is_some_and(|k| k.is_empty()) =>
            {
                let sql = (
                    claim_sql(c.kinds, ClaimOrder::Priority),
                    claim_sql(c.kinds, ClaimOrder::Oldest),
                );
                Some((claim, duration_ms(c.lease, "lease")?, sql))
            }
            _ => None,
        };
        if outcomes.is_empty() && claim.is_none() {
            return Ok((Vec::new(), Vec::new()));
        }
        let policy = self.retry_policy;
        let commit = if outcomes.is_empty() || sync == OutcomeSync::Deferred {
            Commit::Lazy
        } else {
            Commit::Durable
        };
        let mut pending_outcomes = outcomes;
        let mut commit = commit;
        let mut results = Vec::with_capacity(outcomes.len());
        let leases = loop {
            let (recorded, claimed) = self.write_with(commit, |tx| {
                let now = self.now_ms();
                let mut recorded = Vec::with_capacity(pending_outcomes.len());
                let mut rest = pending_outcomes;
                while let Some(((lease, outcome), after)) = rest.split_first() {
                    // A run of successes is one statement (see complete_many).
                    let run = rest
                        .iter()
                        .take_while(|(_, o)| *o == Outcome::Complete)
                        .count();
                    if run > 1 {
                        complete_many(tx, &rest[..run], now, &policy, &mut recorded)?;
                        rest = &rest[run..];
                    } else {
                        recorded.push(record_in(tx, lease, outcome, now, &policy)?);
                        rest = after;
                    }
                }
                let Some((claim, lease_ms, sql)) = &claim else {
                    return Ok((recorded, Some(Vec::new())));
                };
                let expires = now.saturating_add(*lease_ms).min(MAX_TIMESTAMP_MS);
                let mut claim_tx = InTransaction { tx, sql };
                let claimed = (claim.rules)(&mut claim_tx, claim.request, now, expires)?;
                Ok((recorded, claimed))
            })?;
            results.extend(recorded);
            pending_outcomes = &[];
            commit = Commit::Lazy;
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
        let asked = Instant::now();
        let busy_before = crate::engine::sqlite::busy_waits();
        self.write_with(Commit::Lazy, |tx| {
            let waited = crate::engine::sqlite::busy_waits() != busy_before
                || asked.elapsed() > REAP_CLEAN_WAIT;
            // A backward step of the wall clock leaves leases that were
            // granted "in the future": one whose expiry lies further ahead
            // than its length (lease_ms, plus a margin for noise) is set to
            // expire one length from now, so an abandoned job is taken back
            // on time while a live holder's next heartbeat renews it as
            // usual. Judged against the time inside this transaction: every
            // lease committed before it was granted at or before then.
            let stepped_now = self.now_ms();
            let margin = crate::engine::types::BACKWARD_STEP_MARGIN.as_millis() as i64;
            tx.prepare_cached(LEASE_STEP_SQL)?
                .execute(params![stepped_now, margin])?;
            // The same for a cancelled job's kept lease, which holds its
            // unique_key (a separate statement: each uses its own index).
            tx.prepare_cached(CANCELLED_LEASE_STEP_SQL)?
                .execute(params![stepped_now, margin])?;
            let now = cutoff.map_or(stepped_now, |c| c.min(stepped_now));
            let expired: Vec<(ExpiredLease, u32, String)> = tx
                .prepare_cached(
                    "SELECT id, run_token, lease_expires_at, attempts, coalesce(claimed_by, '?')
                     FROM tickler_jobs
                     WHERE status = 'running' AND lease_expires_at < ?1
                     ORDER BY lease_expires_at LIMIT +?2",
                )?
                .query_map(params![now, REAP_BATCH], |r| {
                    Ok((
                        ExpiredLease {
                            id: r.get(0)?,
                            run_token: r.get(1)?,
                            expires_at: r.get(2)?,
                        },
                        r.get(3)?,
                        r.get(4)?,
                    ))
                })?
                .collect::<rusqlite::Result<_>>()?;
            // A cancelled job's holder that never reported is gone once its
            // lease ran out: its unique_key no longer waits for it.
            tx.prepare_cached(
                "UPDATE tickler_jobs SET lease_expires_at = NULL
                 WHERE status IN ('cancelled', 'dead') AND lease_expires_at < ?1",
            )?
            .execute([now])?;
            let batch_full = expired.len() as i64 >= REAP_BATCH;
            let mut taken = 0u64;
            let mut left = Vec::new();
            let mut reap = tx.prepare_cached(REAP_SQL)?;
            for (lease, attempts, worker) in expired {
                if !take(&lease, waited) {
                    left.push(lease);
                    continue;
                }
                let retry_at = retry_time(now, &policy, attempts);
                let error = lease_expired_error(&worker, attempts);
                // One row SQLite refuses (a trigger, damage) must not keep
                // every other expired lease from being taken back.
                match isolated(tx, || {
                    Ok(reap.execute(params![
                        now,
                        retry_at,
                        cut_error(&error),
                        lease.id,
                        lease.run_token,
                        now
                    ])?)
                })? {
                    Ok(n) => taken += n as u64,
                    Err(e) => log::error!("reaper could not take back job {}: {e}", lease.id),
                }
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

    fn cancel(&self, id: JobId) -> Result<()> {
        self.write(|tx| {
            let state = state_of(tx, id)?;
            if state.is_terminal() {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "cancel",
                });
            }
            // A running job keeps its run_token and lease: until its holder
            // has stopped (its outcome, refused, clears the lease) or the
            // lease runs out, no other job with its unique_key starts.
            tx.prepare_cached(
                "UPDATE tickler_jobs SET status = 'cancelled', finished_at = ?1,
                     lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at END
                 WHERE id = ?2",
            )?
            .execute(params![self.now_ms(), id.0])?;
            Ok(())
        })
    }

    fn retry(&self, id: JobId) -> Result<()> {
        self.write(|tx| {
            let state = state_of(tx, id)?;
            if !matches!(state, JobState::Dead | JobState::Cancelled) {
                return Err(Error::InvalidState {
                    job_id: id,
                    state,
                    action: "retry",
                });
            }
            let holder: Option<(String, i64)> = tx
                .prepare_cached(
                    "SELECT held.unique_key, held.id FROM tickler_jobs AS job
                     JOIN tickler_jobs AS held ON held.unique_key = job.unique_key
                     WHERE job.id = ?1 AND held.status IN ('scheduled', 'pending', 'running')",
                )?
                .query_row([id.0], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((unique_key, held_by)) = holder {
                return Err(Error::UniqueKeyHeld {
                    job_id: id,
                    unique_key,
                    held_by: JobId(held_by),
                });
            }
            // A cancelled job whose holder may still be running waits for
            // its lease to run out, so the retry never runs beside it.
            tx.prepare_cached(
                "UPDATE tickler_jobs
                 SET status = CASE WHEN lease_expires_at >= ?1 THEN 'scheduled' ELSE 'pending' END,
                     run_at = CASE WHEN lease_expires_at >= ?1 THEN lease_expires_at + 1 ELSE ?1 END,
                     attempts = 0, finished_at = NULL, lease_expires_at = NULL
                 WHERE id = ?2",
            )?
            .execute(params![self.now_ms(), id.0])?;
            Ok(())
        })?;
        self.notify_watchers();
        Ok(())
    }

    fn get(&self, id: JobId) -> Result<Job> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE id = ?1"
            ))?
            .query_row([id.0], job_from_row)
            .optional()?
            .ok_or(Error::NotFound(id))
        })
    }

    fn list(&self, filter: &JobFilter) -> Result<Vec<Job>> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs
                     WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR queue = ?2)
                       AND (?3 IS NULL OR kind = ?3)
                     ORDER BY id LIMIT +?4"
                ))?
                .query_map(
                    params![
                        filter.state.map(JobState::as_str),
                        filter.queue,
                        filter.kind,
                        limit
                    ],
                    job_from_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    fn count(&self, state: JobState) -> Result<u64> {
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM tickler_jobs WHERE status = '{}'",
                    state.as_str()
                ))?
                .query_row([], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn stats(&self) -> Result<Stats> {
        let now = self.now_ms();
        self.read(|conn| {
            let mut stats = Stats::default();
            let mut stmt = conn.prepare_cached(STATS_COUNTS_SQL)?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (queue, status, count) = row?;
                stats
                    .counts
                    .insert((queue, status.parse()?), u64::try_from(count).unwrap_or(0));
            }
            let mut stmt = conn.prepare_cached(
                "SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'pending' GROUP BY queue, priority
                 UNION ALL
                 SELECT queue, priority, min(run_at) FROM tickler_jobs
                 WHERE status = 'scheduled' AND run_at <= ?1 GROUP BY queue, priority",
            )?;
            let rows = stmt.query_map([now], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i32>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (queue, priority, at) = row?;
                let at = ms_to_datetime(at);
                let e = stats
                    .oldest_due_by_priority
                    .entry((queue, priority))
                    .or_insert(at);
                *e = (*e).min(at);
            }
            stats.oldest_due = stats.oldest_due_by_priority.values().min().copied();
            Ok(stats)
        })
    }

    fn next_queue_in_state(&self, state: JobState, after: &str) -> Result<Option<String>> {
        let (cond, _) = crate::engine::state_index(state);
        self.read(|conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT min(queue) FROM tickler_jobs WHERE {cond} AND queue > ?1"
                ))?
                .query_row([after], |r| r.get(0))?)
        })
    }

    fn count_in_queue(&self, state: JobState, queue: &str, cap: u64) -> Result<u64> {
        let (cond, _) = crate::engine::state_index(state);
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM
                       (SELECT 1 FROM tickler_jobs WHERE {cond} AND queue = ?1 LIMIT ?2)"
                ))?
                .query_row(params![queue, cap], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn list_in_queue(&self, state: JobState, queue: &str, limit: usize) -> Result<Vec<Job>> {
        let (cond, order) = crate::engine::state_index(state);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(|conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM tickler_jobs WHERE {cond} AND queue = ?1
                     ORDER BY {order} LIMIT ?2"
                ))?
                .query_map(params![queue, limit], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
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
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM
                       (SELECT 1 FROM tickler_jobs
                        WHERE finished_at >= ?1 AND finished_at < ?2 LIMIT ?3)",
                )?
                .query_row(params![from_ms, to_ms, cap], |r| r.get(0))?;
            let rows = conn
                .prepare_cached(
                    "SELECT status, run_at, claimed_at, finished_at FROM tickler_jobs
                     WHERE finished_at >= ?1 AND finished_at < ?2
                     ORDER BY finished_at DESC LIMIT ?3",
                )?
                .query_map(params![from_ms, to_ms, sample], |r| {
                    Ok(FinishedSample {
                        state: r.get::<_, String>(0)?.parse().ok(),
                        run_at_ms: r.get(1)?,
                        claimed_at_ms: r.get(2)?,
                        finished_at_ms: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((u64::try_from(n).unwrap_or(0), rows))
        })
    }

    fn retry_dead_batch(
        &self,
        queue: Option<&str>,
        after_id: i64,
        limit: i64,
    ) -> Result<RetryDeadBatch> {
        self.write(|tx| {
            let dead: Vec<(i64, Option<String>)> = tx
                .prepare_cached(
                    "SELECT id, unique_key FROM tickler_jobs
                     WHERE status = 'dead' AND (?1 IS NULL OR queue = ?1) AND id > ?2
                     ORDER BY id LIMIT +?3",
                )?
                .query_map(params![queue, after_id, limit], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut held = tx.prepare_cached(
                "SELECT 1 FROM tickler_jobs WHERE unique_key = ?1
                   AND status IN ('scheduled', 'pending', 'running')",
            )?;
            let mut revive = tx.prepare_cached(
                "UPDATE tickler_jobs SET status = 'pending', attempts = 0, run_at = ?1,
                     finished_at = NULL, lease_expires_at = NULL
                 WHERE id = ?2 AND status = 'dead'",
            )?;
            let now = self.now_ms();
            let (mut retried, mut left_dead) = (0u64, 0u64);
            for (id, key) in &dead {
                if let Some(key) = key {
                    if held.exists([key])? {
                        left_dead += 1;
                        continue;
                    }
                }
                retried += revive.execute(params![now, id])? as u64;
            }
            Ok(RetryDeadBatch {
                retried,
                left_dead,
                last_id: dead.last().map(|(id, _)| *id),
                seen: dead.len(),
            })
        })
    }

    fn prune_batch(&self, before: i64, state: Option<JobState>, limit: i64) -> Result<u64> {
        let deleted = self.write(|tx| {
            // Two statements, so that each keeps the plan of its index.
            Ok(match state {
                None => tx
                    .prepare_cached(
                        "DELETE FROM tickler_jobs WHERE id IN (
                             SELECT id FROM tickler_jobs WHERE finished_at IS NOT NULL AND finished_at < ?1
                             LIMIT +?2)",
                    )?
                    .execute(params![before, limit])?,
                Some(state) => tx
                    .prepare_cached(
                        "DELETE FROM tickler_jobs WHERE id IN (
                             SELECT id FROM tickler_jobs
                             WHERE finished_at IS NOT NULL AND finished_at < ?1 AND status = ?2
                             LIMIT +?3)",
                    )?
                    .execute(params![before, state.as_str(), limit])?,
            })
        })?;
        Ok(deleted as u64)
    }

    fn finished_since(&self, since: DateTime<Utc>) -> Result<u64> {
        self.read(|conn| {
            let n: i64 = conn
                .prepare_cached("SELECT count(*) FROM tickler_jobs WHERE finished_at >= ?1")?
                .query_row([since.timestamp_millis()], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn unfinished(&self, queues: &[&str], kinds: Option<&[&str]>) -> Result<u64> {
        if queues.is_empty() || kinds.is_some_and(|k| k.is_empty()) {
            return Ok(0);
        }
        let queue_marks: Vec<String> = (1..=queues.len()).map(|i| format!("?{i}")).collect();
        let kind_filter = kind_filter(kinds, queues.len() + 1);
        // One subquery per state, so each can use that state's partial index.
        let count = |status: &str| {
            format!(
                "(SELECT count(*) FROM tickler_jobs WHERE status = '{status}'
                  AND queue IN ({}) {kind_filter})",
                queue_marks.join(", ")
            )
        };
        let sql = format!(
            "SELECT {} + {} + {}",
            count("scheduled"),
            count("pending"),
            count("running")
        );
        self.read(|conn| {
            let mut values: Vec<&dyn rusqlite::ToSql> =
                queues.iter().map(|q| q as &dyn rusqlite::ToSql).collect();
            if let Some(kinds) = kinds {
                values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
            }
            let n: i64 = conn
                .prepare_cached(&sql)?
                .query_row(values.as_slice(), |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<()> {
        let now = self.now_ms();
        self.write(|tx| {
            if paused {
                tx.prepare_cached(
                    "INSERT INTO tickler_paused_queues (queue, paused_at) VALUES (?1, ?2)
                     ON CONFLICT (queue) DO NOTHING",
                )?
                .execute(params![queue, now])?;
            } else {
                tx.prepare_cached("DELETE FROM tickler_paused_queues WHERE queue = ?1")?
                    .execute([queue])?;
            }
            Ok(())
        })?;
        // Other processes see the commit (a change of the -wal file); this
        // process's fetchers are woken here.
        self.notify_watchers();
        Ok(())
    }

    fn paused_queues(&self) -> Result<Vec<String>> {
        self.read(|conn| Ok(paused_in(conn)?.into_iter().collect()))
    }
}

/// The paused queues, in byte order: a read of a table of a few rows at
/// most, cheap enough for every claim.
fn paused_in(conn: &rusqlite::Connection) -> Result<std::collections::BTreeSet<String>> {
    let mut stmt = conn.prepare_cached("SELECT queue FROM tickler_paused_queues")?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The SQLite-only parts of the `Queue` API: jobs written and completed
/// inside the application's own transactions on the same file.
impl Store {
    /// See [`crate::Queue::enqueue_batch_tx`].
    pub(crate) fn enqueue_tx(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rows: &[ValidJob],
        now: i64,
    ) -> Result<Vec<JobId>> {
        let ids = insert_valid(tx, rows, now)?;
        // Wakes this process's fetchers; they find the job once the caller
        // commits (the commit also changes data_version for every watcher).
        self.notify_watchers();
        Ok(ids)
    }

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
        self.write(|tx| {
            app_writes(tx).map_err(|e| if e.is_busy() { Error::aborted(e) } else { e })?;
            let changed = tx.prepare_cached(COMPLETE_SQL)?.execute(params![
                self.now_ms(),
                lease.job_id.0,
                lease.run_token.0
            ])?;
            fenced(changed, lease)
        })
    }
}

/// A [`ClaimTx`] on an open SQLite write transaction, with the claiming
/// statements of this claim's kinds in either order.
struct InTransaction<'a, 'c> {
    tx: &'a rusqlite::Transaction<'c>,
    /// The claiming UPDATE by priority, and by age.
    sql: &'a (String, String),
}

impl ClaimTx for InTransaction<'_, '_> {
    fn paused_queues(&mut self) -> Result<std::collections::BTreeSet<String>> {
        paused_in(self.tx)
    }

    fn promote_due(&mut self, queue: &str, now: i64, limit: i64) -> Result<u64> {
        let promoted = self
            .tx
            .prepare_cached(PROMOTE_SQL)?
            .execute(params![queue, now, limit])?;
        Ok(promoted as u64)
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
        let mut values: Vec<&dyn rusqlite::ToSql> =
            vec![&request.worker_id, &now, &expires, &queue, &want];
        if let Some(kinds) = request.kinds {
            values.extend(kinds.iter().map(|k| k as &dyn rusqlite::ToSql));
        }
        let sql = match order {
            ClaimOrder::Priority => &self.sql.0,
            ClaimOrder::Oldest => &self.sql.1,
        };
        let mut stmt = self.tx.prepare_cached(sql)?;
        let rows = stmt
            .query_map(values.as_slice(), claimed_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    fn bury(&mut self, job_id: JobId, run_token: &str, error: &str, now: i64) -> Result<()> {
        let tx = self.tx;
        let dead = isolated(tx, || {
            Ok(tx
                .prepare_cached(DEAD_SQL)?
                .execute(params![now, error, job_id.0, run_token])?)
        })?;
        if let Err(e) = dead {
            // Left running: its lease runs out and the reaper tries again.
            log::error!("job {job_id}: could not be made dead either: {e}");
        }
        Ok(())
    }
}
